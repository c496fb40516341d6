//! [`ServerBuilder::build`]: the storage (a replica's fenced on a shared database), the
//! persisted state, the IM state and the Transfer Plane's store, then the restored channels.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{ConnectorServer, ServerBuilder};
use crate::author::{BoundReason, ChannelContext};
use crate::error::{DefinitionError, ServerError};
use crate::state::{ClusterRuntime, Shared, State};
use crate::storage::{SqliteStorage, Storage};

impl ServerBuilder {
    /// Loads persisted state and starts the runtime (restored signed-in channels get the
    /// author's `on_bound` with [`BoundReason::Restored`]; the lease of restored channels
    /// starts now).
    pub async fn build(mut self) -> Result<ConnectorServer, ServerError> {
        let key_required =
            self.connector.card.security.as_ref().is_some_and(|s| s.api_key_required == Some(true));
        if key_required && self.api_key.is_none() {
            return Err(DefinitionError::ApiKeyMissing.into());
        }
        let (storage, cluster) = self.open_storage().await?;
        let state = load_state(storage.as_ref(), self.clock.now_millis()).await?;
        let im = crate::im::ImState::new(
            &self.connector,
            storage.as_ref(),
            &self.clock,
            self.config.outbox_window,
            cluster.is_some(),
        )
        .await?;
        let (files, files_upload_limit) = self.open_files(storage.as_ref()).await?;
        let mut connector = self.connector;
        let device = match connector.device.take() {
            Some(def) => {
                Some(crate::device::DeviceRuntime::new(def).map_err(DefinitionError::from)?)
            }
            None => None,
        };
        let admission =
            xagent_connection::Admission::for_card(connector.card.clone(), self.config.admission);
        let shared = Arc::new(Shared {
            admission,
            def: connector,
            device,
            config: self.config,
            storage,
            clock: self.clock,
            api_key: self.api_key,
            state: Mutex::new(state),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            im,
            tool_calls: Default::default(),
            files,
            files_upload_limit,
            cluster,
            broadcasts: tokio::sync::broadcast::channel(1024).0,
            _state_lock: self.state_lock,
            accepting: std::sync::atomic::AtomicBool::new(false),
        });
        restore_bound(&shared).await;
        let handle = shared.handle();
        let extra = self
            .routes
            .into_iter()
            .fold(axum::Router::new(), |router, routes| router.merge(routes(handle.clone())));
        let tasks = Arc::new(Mutex::new(self.tasks));
        Ok(ConnectorServer { shared, extra, tasks })
    }

    /// The storage: PostgreSQL when a database URL was given (feature `postgres`), else the
    /// one set, else SQLite in memory. On a database several replicas share, the runtime's
    /// writes carry its fence and wake the other replicas.
    async fn open_storage(
        &mut self,
    ) -> Result<(Arc<dyn Storage>, Option<ClusterRuntime>), ServerError> {
        #[cfg(feature = "postgres")]
        let connected: Option<Arc<dyn Storage>> = match &self.database {
            Some((url, options)) => {
                let storage =
                    crate::storage::PostgresStorage::connect(url, options.clone()).await?;
                // The URL's Display redacts the password.
                tracing::info!(database = %url, "runtime state in PostgreSQL");
                Some(Arc::new(storage))
            }
            None => None,
        };
        #[cfg(not(feature = "postgres"))]
        let connected: Option<Arc<dyn Storage>> = None;
        let storage = match connected.or(self.storage.take()) {
            Some(storage) => storage,
            None => Arc::new(SqliteStorage::in_memory()?),
        };
        let Some(cluster) = storage.cluster() else { return Ok((storage, None)) };
        let fenced = Arc::new(crate::storage::ClusterStorage::new(storage, cluster.replica()));
        tracing::info!(replica = cluster.replica(), "serving as a replica on a shared database");
        let runtime = ClusterRuntime::new(cluster, Arc::clone(&fenced));
        Ok((fenced, Some(runtime)))
    }

    /// The Transfer Plane's store and upload limit: under the state directory, or in the
    /// database when the state is in PostgreSQL (no directory needed), or none.
    async fn open_files(
        &mut self,
        storage: &dyn Storage,
    ) -> Result<(Option<xagent_file_transfer::FileStore>, u64), ServerError> {
        let uses_database = self.uses_database();
        let files_config = self.files.take().or_else(|| match &self.state_dir {
            Some(dir) => Some(crate::files::FilesConfig::new(dir.join("files"))),
            None if uses_database => Some(crate::files::FilesConfig::new("")),
            None => None,
        });
        let files_upload_limit = files_config.as_ref().map_or(0, |f| f.max_upload_bytes);
        #[cfg(feature = "postgres")]
        let files_database = self.database.as_ref().map(|(url, _)| url);
        #[cfg(not(feature = "postgres"))]
        let files_database: Option<std::convert::Infallible> = None;
        let files = match (&files_config, files_database) {
            (Some(config), None) => Some(
                crate::files::open_store(
                    config,
                    &self.config.url_path(),
                    storage,
                    Arc::clone(&self.clock),
                )
                .await?,
            ),
            #[cfg(feature = "postgres")]
            (Some(config), Some(url)) => Some(
                crate::files::open_database_store(
                    config,
                    url,
                    &self.config.url_path(),
                    Arc::clone(&self.clock),
                )
                .await?,
            ),
            #[cfg(not(feature = "postgres"))]
            (Some(_), Some(never)) => match never {},
            (None, _) => None,
        };
        Ok((files, files_upload_limit))
    }
}

/// The persisted `connector_id` and channels. Nobody holds a restored runtime yet: its lease
/// runs from startup.
async fn load_state(storage: &dyn Storage, now: u64) -> Result<State, ServerError> {
    let connector_id = storage.load_connector_id().await?;
    let channels = storage.load_channels().await?;
    let mut state = State::default();
    state.connector_id = connector_id;
    if state.connector_id.is_some() || !channels.is_empty() {
        state.offline_since = Some(now);
    }
    for record in channels {
        state.insert_channel(record);
    }
    Ok(state)
}

/// The restored signed-in channels: their devices (not connected until they answer; on
/// replicas only the data plane's holder asks them, when it takes it), then the author's
/// `on_bound` with [`BoundReason::Restored`].
async fn restore_bound(shared: &Arc<Shared>) {
    let restored: Vec<ChannelContext> = shared
        .state()
        .channels
        .values()
        .filter_map(|r| {
            r.binding.clone().map(|binding| ChannelContext {
                channel: r.id.clone(),
                binding,
                handle: shared.handle(),
                state: (),
            })
        })
        .collect();
    shared.restore_devices(shared.cluster.is_none());
    for ctx in restored {
        shared.def.auth.bound(ctx, BoundReason::Restored).await;
    }
}
