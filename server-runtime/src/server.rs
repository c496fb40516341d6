//! [`ServerBuilder`] and [`ConnectorServer`]: loading persisted state, serving HTTP and
//! WebSocket with the author's extra routes and background tasks, maintenance, shutdown.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use xagent_protocol_types::{Clock, Secret, SystemClock};

use crate::author::call::BoxFut;
use crate::config::RuntimeConfig;
use crate::connector::Connector;
use crate::error::ServerError;
use crate::handle::ConnectorHandle;
use crate::state::Shared;
use crate::storage::{SqliteStorage, Storage};

mod build;

/// Builder of a [`ConnectorServer`].
pub struct ServerBuilder {
    connector: Connector,
    config: RuntimeConfig,
    storage: Option<Arc<dyn Storage>>,
    clock: Arc<dyn Clock>,
    api_key: Option<Secret>,
    files: Option<crate::files::FilesConfig>,
    state_dir: Option<std::path::PathBuf>,
    /// This process's hold on `state_dir`, moved into the running server.
    state_lock: Option<crate::state_lock::StateDirLock>,
    /// PostgreSQL to connect to in [`ServerBuilder::build`] (feature `postgres`).
    #[cfg(feature = "postgres")]
    database: Option<(xagent_storage_postgres::DatabaseUrl, crate::storage::PostgresOptions)>,
    routes: Vec<RouteFn>,
    tasks: Vec<TaskFn>,
}

/// Builds extra routes from the handle.
type RouteFn = Box<dyn FnOnce(ConnectorHandle) -> axum::Router + Send>;
/// A background task: gets the handle and the runtime's shutdown signal.
type TaskFn = Box<dyn FnOnce(ConnectorHandle, CancellationToken) -> BoxFut<'static, ()> + Send>;

/// The environment variable holding the system API key.
pub const ENV_API_KEY: &str = "XAGENT_CONNECTOR_API_KEY";
/// The environment variable holding the listen address (default `127.0.0.1:8080`).
pub const ENV_LISTEN: &str = "XAGENT_CONNECTOR_LISTEN";
/// The environment variable holding the state directory (default: in memory, no files).
pub const ENV_STATE_DIR: &str = "XAGENT_CONNECTOR_STATE_DIR";
/// The environment variable holding the metrics listener's address (default: none).
pub const ENV_METRICS_LISTEN: &str = "XAGENT_CONNECTOR_METRICS_LISTEN";
/// The listen address when [`ENV_LISTEN`] is not set.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

impl ServerBuilder {
    /// Adds routes of the author's own (a web page, a webhook) built with the handle; they
    /// are served next to the protocol's routes, under the same Base URL prefix, without the
    /// system API key check (protect them as they need).
    #[must_use]
    pub fn routes(
        mut self,
        routes: impl FnOnce(ConnectorHandle) -> axum::Router + Send + 'static,
    ) -> Self {
        self.routes.push(Box::new(routes));
        self
    }

    /// Adds a background task run by [`ConnectorServer::serve`]: it gets the handle and the
    /// runtime's shutdown signal, and should return soon after the signal fires (it is
    /// aborted after the shutdown grace period).
    #[must_use]
    pub fn task<F, Fut>(mut self, task: F) -> Self
    where
        F: FnOnce(ConnectorHandle, CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tasks.push(Box::new(move |handle, shutdown| Box::pin(task(handle, shutdown))));
        self
    }

    /// Reads the deployment settings from the environment: the system API key from
    /// `XAGENT_CONNECTOR_API_KEY` (when set and not empty) and the state directory from
    /// `XAGENT_CONNECTOR_STATE_DIR` (when set).
    pub fn from_env(mut self) -> Result<Self, ServerError> {
        if let Some(key) = std::env::var(ENV_API_KEY).ok().filter(|k| !k.is_empty()) {
            self = self.api_key(Secret::new(key));
        }
        if let Some(dir) = std::env::var_os(ENV_STATE_DIR).filter(|d| !d.is_empty()) {
            self = self.state_dir(std::path::PathBuf::from(dir))?;
        }
        Ok(self)
    }

    /// [`ConnectorServer::serve_from_env`] for this builder, with whatever routes, tasks,
    /// clock or configuration were added to it: logging set up from `RUST_LOG` and
    /// `XAGENT_CONNECTOR_LOG_FORMAT`, the API key and state directory from the environment,
    /// `XAGENT_CONNECTOR_LISTEN` (default `127.0.0.1:8080`) and, when set,
    /// `XAGENT_CONNECTOR_METRICS_LISTEN` for `/metrics` and `/readyz`. Serves until Ctrl-C or
    /// SIGTERM; prints `<card id> listening on http://<address>` once it accepts connections.
    pub async fn serve_from_env(self) -> Result<(), ServerError> {
        let format = match std::env::var(crate::logging::ENV_LOG_FORMAT) {
            Ok(text) => text.parse().map_err(|e: String| {
                ServerError::Config(format!("{}: {e}", crate::logging::ENV_LOG_FORMAT))
            })?,
            Err(_) => crate::logging::LogFormat::Text,
        };
        crate::logging::init_logging(crate::logging::DEFAULT_LOG_FILTER, format);
        let server = self.from_env()?.build().await?;
        let listen = std::env::var(ENV_LISTEN).unwrap_or_else(|_| DEFAULT_LISTEN.to_owned());
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        if let Some(metrics) = std::env::var(ENV_METRICS_LISTEN).ok().filter(|m| !m.is_empty()) {
            let local = server.start_metrics(&metrics).await?;
            println!("metrics listening on http://{local}/metrics");
        }
        let stop = crate::listen::stop_signal();
        // One plain line on stdout that scripts (CI) can wait for.
        println!(
            "{} listening on http://{}",
            server.card().connector_card_id,
            listener.local_addr()?
        );
        server.serve(listener, stop).await
    }

    /// Enables the Transfer Plane with this configuration (a state directory enables it by
    /// default under `<state dir>/files`).
    #[must_use]
    pub fn files(mut self, files: crate::files::FilesConfig) -> Self {
        self.files = Some(files);
        self
    }

    /// Sets the configuration.
    #[must_use]
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// Uses this storage (default: in-memory SQLite; use [`ServerBuilder::state_dir`] for a
    /// file).
    #[must_use]
    pub fn storage(mut self, storage: impl Storage) -> Self {
        self.storage = Some(Arc::new(storage));
        self
    }

    /// Uses `<dir>/connector.sqlite3` (WAL) as storage, and `<dir>/files` for the Transfer
    /// Plane. After [`ServerBuilder::database_url`] the directory holds only its lock: the
    /// runtime's state and the Transfer Plane's files are in PostgreSQL.
    ///
    /// The directory belongs to this process from here on: a second process given the same
    /// directory is refused ([`crate::ops::StateLockError::InUse`], naming this one's pid).
    pub fn state_dir(mut self, dir: impl AsRef<std::path::Path>) -> Result<Self, ServerError> {
        self.state_lock = None;
        self.state_lock = Some(crate::state_lock::StateDirLock::acquire(dir.as_ref())?);
        if !self.uses_database() {
            self.storage = Some(Arc::new(SqliteStorage::open(&dir)?));
        }
        self.state_dir = Some(dir.as_ref().to_path_buf());
        Ok(self)
    }

    /// Keeps the runtime's state (connector id, channels and bindings, tool calls, the IM
    /// outbox and receiver idempotency, meta) in the PostgreSQL database at `url` instead of
    /// SQLite (feature `postgres`): [`ServerBuilder::build`] connects, applies the schema
    /// migrations and refuses a database whose schema is newer than this binary knows.
    #[cfg(feature = "postgres")]
    #[must_use]
    pub fn database_url(self, url: xagent_storage_postgres::DatabaseUrl) -> Self {
        self.database_with(url, crate::storage::PostgresOptions::default())
    }

    /// [`ServerBuilder::database_url`] with explicit pool and group-commit options.
    #[cfg(feature = "postgres")]
    #[must_use]
    pub fn database_with(
        mut self,
        url: xagent_storage_postgres::DatabaseUrl,
        options: crate::storage::PostgresOptions,
    ) -> Self {
        self.storage = None;
        self.database = Some((url, options));
        self
    }

    /// Whether the state goes to PostgreSQL ([`ServerBuilder::database_url`]).
    fn uses_database(&self) -> bool {
        #[cfg(feature = "postgres")]
        {
            self.database.is_some()
        }
        #[cfg(not(feature = "postgres"))]
        {
            false
        }
    }

    /// Injects the clock (tests use `ManualClock`).
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Requires this system API key on `/health`, `/ws` and `/files/uploads`.
    #[must_use]
    pub fn api_key(mut self, key: Secret) -> Self {
        self.api_key = Some(key);
        self
    }
}

/// A running Connector Server: serve it with [`ConnectorServer::serve`] or mount
/// [`ConnectorServer::router`] yourself.
#[derive(Clone)]
pub struct ConnectorServer {
    pub(crate) shared: Arc<Shared>,
    /// The author's routes, merged into [`ConnectorServer::router`].
    pub(crate) extra: axum::Router,
    /// The author's background tasks, started once by [`ConnectorServer::serve`].
    tasks: Arc<Mutex<Vec<TaskFn>>>,
}

impl std::fmt::Debug for ConnectorServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorServer")
            .field("card_id", &self.shared.def.card.connector_card_id)
            .finish_non_exhaustive()
    }
}

impl ConnectorServer {
    /// Starts building a server for a Connector definition.
    pub fn builder(connector: Connector) -> ServerBuilder {
        ServerBuilder {
            connector,
            config: RuntimeConfig::default(),
            storage: None,
            clock: Arc::new(SystemClock),
            api_key: None,
            files: None,
            state_dir: None,
            state_lock: None,
            #[cfg(feature = "postgres")]
            database: None,
            routes: Vec::new(),
            tasks: Vec::new(),
        }
    }

    /// Serves `connector` as configured by the environment until Ctrl-C or SIGTERM: listens on
    /// `XAGENT_CONNECTOR_LISTEN` (default `127.0.0.1:8080`), requires
    /// `XAGENT_CONNECTOR_API_KEY` when set, keeps state in `XAGENT_CONNECTOR_STATE_DIR` when
    /// set, and logs to stderr filtered by `RUST_LOG` (default `info`), as text or, with
    /// `XAGENT_CONNECTOR_LOG_FORMAT=json`, one JSON object a line. Prints
    /// `<card id> listening on http://<address>` on stdout once it accepts connections.
    pub async fn serve_from_env(connector: Connector) -> Result<(), ServerError> {
        Self::builder(connector).serve_from_env().await
    }

    /// The author's handle.
    pub fn handle(&self) -> ConnectorHandle {
        self.shared.handle()
    }

    /// Starts the Transfer Plane's periodic cleanup (expired files), for authors who serve
    /// [`ConnectorServer::router`] with routes of their own instead of calling
    /// [`ConnectorServer::serve`] (which starts it itself). `None` without a file store.
    pub fn spawn_file_cleanup(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.shared.files.as_ref().map(|files| files.spawn_cleanup())
    }

    /// The Connector Card served at `/connector-card.json`.
    pub fn card(&self) -> &xagent_protocol_types::ConnectorCard {
        &self.shared.def.card
    }

    /// Lease expiry and maintenance, once (driven by the injected clock).
    pub async fn tick(&self) {
        self.shared.tick().await;
    }

    /// Asks every connection to finish: no new packets are read, in-flight acks are written,
    /// then sockets close with 1001.
    pub fn shutdown(&self) {
        self.shared.shutdown.cancel();
    }

    /// Waits until every connection task finished after [`ConnectorServer::shutdown`].
    pub async fn wait_finished(&self) {
        self.shared.tasks.close();
        let _ =
            tokio::time::timeout(self.shared.config.shutdown_grace, self.shared.tasks.wait()).await;
    }

    /// Serves HTTP and WebSocket (with the author's routes) on `listener` until `shutdown`
    /// completes, then shuts down gracefully. Runs meanwhile: maintenance every
    /// [`RuntimeConfig::maintenance_interval`], the Transfer Plane's cleanup, and the author's
    /// background tasks (each gets the shutdown signal).
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let router = self.router();
        let token = self.shared.shutdown.clone();
        let maintenance = {
            let shared = Arc::clone(&self.shared);
            let token = token.clone();
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(shared.config.maintenance_interval);
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = token.cancelled() => break,
                        _ = interval.tick() => shared.tick().await,
                    }
                }
            })
        };
        // The outbox's own timers (retries after their backoff, ack deadlines), on time.
        let outbox_timers = self.shared.im.is_some().then(|| {
            let shared = Arc::clone(&self.shared);
            let token = token.clone();
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(crate::im::DUE_CHECK_EVERY);
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = token.cancelled() => break,
                        _ = interval.tick() => {
                            if let Some(im) = &shared.im {
                                im.run_due(&shared).await;
                            }
                        }
                    }
                }
            })
        });
        // On a shared database: the data-plane lease's renewals and the other replicas' news.
        let replica_tasks = self.shared.cluster.is_some().then(|| {
            [
                tokio::spawn(Arc::clone(&self.shared).keep_lease()),
                tokio::spawn(Arc::clone(&self.shared).follow_cluster()),
            ]
        });
        let cleanup = self.shared.files.as_ref().map(|files| files.spawn_cleanup());
        let author_tasks: Vec<_> = std::mem::take(
            &mut *self.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_iter()
        .map(|task| {
            let run = task(self.handle(), token.clone());
            tokio::spawn(async move {
                let _ = crate::author::call::contain("background task", run).await;
            })
        })
        .collect();
        let server_token = token.clone();
        tokio::spawn(async move {
            shutdown.await;
            server_token.cancel();
        });
        let card_id = self.card().connector_card_id.clone();
        let graceful = token.clone();
        let accepting = Arc::clone(&self.shared);
        accepting.accepting.store(true, std::sync::atomic::Ordering::SeqCst);
        let served = crate::listen::serve(
            listener,
            router,
            self.shared.config.listener.clone(),
            async move {
                graceful.cancelled().await;
                // Draining from here on: `/readyz` says so, so the balancer stops sending.
                accepting.accepting.store(false, std::sync::atomic::Ordering::SeqCst);
            },
        )
        .await;
        self.shared.accepting.store(false, std::sync::atomic::Ordering::SeqCst);
        served?;
        maintenance.abort();
        if let Some(timers) = outbox_timers {
            timers.abort();
        }
        for task in replica_tasks.into_iter().flatten() {
            task.abort();
        }
        if let Some(cleanup) = cleanup {
            cleanup.abort();
        }
        self.wait_finished().await;
        for task in author_tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout(self.shared.config.shutdown_grace, task).await.is_err() {
                tracing::warn!("a background task did not stop within the shutdown grace period");
                abort.abort();
            }
        }
        tracing::info!(connector = %card_id, "stopped: open connections drained");
        Ok(())
    }

    /// Runs the data-plane loop of one connection over any frame stream and sink (the axum
    /// WebSocket in production, in-memory channels in tests). Returns when the connection ends.
    pub async fn serve_connection<St, Si>(&self, stream: St, sink: Si)
    where
        St: futures_util::Stream<
                Item = Result<crate::connection::Frame, crate::connection::FrameError>,
            > + Send
            + Unpin
            + 'static,
        Si: futures_util::Sink<crate::connection::Frame> + Send + Unpin + 'static,
    {
        let shared = Arc::clone(&self.shared);
        let task = self.shared.tasks.spawn(crate::connection::run(shared, stream, sink));
        let _ = task.await;
    }
}
