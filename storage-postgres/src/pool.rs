//! A bounded connection pool (deadpool-postgres) with connect, wait and statement timeouts.

use std::time::Duration;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod, Runtime};
use futures_util::Stream;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres::AsyncMessage;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::PgError;
use crate::url::{DatabaseUrl, Tls};

/// Pool settings. The defaults suit one replica of a Connector: 16 connections, 5 s to
/// connect or to wait for a free connection, 30 s per statement.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolOptions {
    /// Most connections open at once (1 to 1,000).
    pub max_size: usize,
    /// Longest time to open one connection (TCP, startup and authentication).
    pub connect_timeout: Duration,
    /// Longest time a caller waits for a free connection before [`PgError::PoolTimeout`].
    pub wait_timeout: Duration,
    /// PostgreSQL's `statement_timeout` for every session of the pool: a statement running
    /// longer is cancelled ([`PgError::StatementTimeout`]). Migrations run without it.
    pub statement_timeout: Duration,
    /// `application_name` shown in `pg_stat_activity`.
    pub application_name: String,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            max_size: 16,
            connect_timeout: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
            application_name: "xagent-connector".to_owned(),
        }
    }
}

impl PoolOptions {
    /// Largest pool accepted (PostgreSQL's own default limit is 100 connections per server).
    pub const MAX_SIZE: usize = 1000;

    /// Sets [`PoolOptions::max_size`].
    #[must_use]
    pub fn with_max_size(mut self, max_size: usize) -> Self {
        self.max_size = max_size;
        self
    }

    /// Sets [`PoolOptions::connect_timeout`].
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`PoolOptions::wait_timeout`].
    #[must_use]
    pub fn with_wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = timeout;
        self
    }

    /// Sets [`PoolOptions::statement_timeout`].
    #[must_use]
    pub fn with_statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// Sets [`PoolOptions::application_name`].
    #[must_use]
    pub fn with_application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    fn validate(&self) -> Result<(), PgError> {
        let invalid = |reason: String| Err(PgError::InvalidOptions { reason });
        if self.max_size == 0 || self.max_size > Self::MAX_SIZE {
            return invalid(format!(
                "max_size is {}, it must be 1 to {}",
                self.max_size,
                Self::MAX_SIZE
            ));
        }
        for (name, value) in [
            ("connect_timeout", self.connect_timeout),
            ("wait_timeout", self.wait_timeout),
            ("statement_timeout", self.statement_timeout),
        ] {
            // PostgreSQL reads a statement_timeout of 0 as "none": refuse it rather than
            // turn the limit off by accident.
            if value < Duration::from_millis(1) || value > Duration::from_secs(24 * 3600) {
                return invalid(format!("{name} is {value:?}, it must be 1 ms to 24 h"));
            }
        }
        let plain_name = self.application_name.len() <= 63
            && self.application_name.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
        if !plain_name {
            return invalid("application_name must be at most 63 printable ASCII bytes".into());
        }
        Ok(())
    }

    /// The driver settings for one session: the URL's, plus these timeouts and name.
    fn session_config(&self, url: &DatabaseUrl) -> tokio_postgres::Config {
        let mut config = url.config().clone();
        config.connect_timeout(self.connect_timeout);
        config.application_name(self.application_name.clone());
        let timeout = format!("-c statement_timeout={}", self.statement_timeout.as_millis());
        let options = match config.get_options() {
            Some(existing) if !existing.trim().is_empty() => format!("{existing} {timeout}"),
            _ => timeout,
        };
        config.options(options);
        config
    }
}

/// A bounded pool of connections to one database. Cheap to clone (shared).
#[derive(Clone)]
pub struct Pool {
    inner: deadpool_postgres::Pool,
    url: DatabaseUrl,
    options: PoolOptions,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.inner.status();
        f.debug_struct("Pool")
            .field("url", &self.url)
            .field("max_size", &status.max_size)
            .field("open", &status.size)
            .field("idle", &status.available)
            .finish()
    }
}

/// Opens a pool on `url` and checks that the database answers (one connection is opened
/// now), so a wrong URL, an unreachable server or a certificate that does not verify is
/// reported at start, not at first use.
///
/// Encrypted when the URL says `sslmode=require` or `verify-full` (rustls; the certificate
/// and the server name are always verified, against `sslrootcert=FILE` or the system's roots).
pub async fn connect(url: &DatabaseUrl, options: PoolOptions) -> Result<Pool, PgError> {
    options.validate()?;
    let manager = Manager::from_connect(
        options.session_config(url),
        Driver { tls: tls_connector(url)? },
        // Fast: a connection is checked with `is_closed` only; a broken one is found by its
        // first statement, whose error is reported (and the connection then dropped).
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    let inner = deadpool_postgres::Pool::builder(manager)
        .max_size(options.max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(options.wait_timeout))
        .create_timeout(Some(options.connect_timeout))
        .recycle_timeout(Some(options.connect_timeout))
        .build()
        .map_err(|e| PgError::InvalidOptions { reason: e.to_string() })?;
    let pool = Pool { inner, url: url.clone(), options };
    let client = pool.get().await?;
    client.simple_query("SELECT 1").await.map_err(|e| pool.error("the first query", &e))?;
    Ok(pool)
}

/// Opens the pool's connections and drives each in a task of its own, reading the server's
/// messages itself: a notice (such as the migrations' "already exists, skipping") is logged at
/// debug and a server warning at warn, under this crate's name. Left to tokio-postgres, every
/// notice was logged at info with the driver's source path.
struct Driver {
    tls: MakeRustlsConnect,
}

impl deadpool_postgres::Connect for Driver {
    fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        let tls = self.tls.clone();
        let config = config.clone();
        Box::pin(async move {
            let (client, mut connection) = config.connect(tls).await?;
            let driver = tokio::spawn(async move {
                loop {
                    match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                        Some(Ok(AsyncMessage::Notice(notice))) => log_notice(&notice),
                        Some(Ok(_)) => {}
                        Some(Err(error)) => {
                            tracing::warn!(%error, "a PostgreSQL connection broke; the pool opens another");
                            break;
                        }
                        None => break,
                    }
                }
            });
            Ok((client, driver))
        })
    }
}

/// A notice of the server's: warnings at warn, the rest (notices, info) at debug.
fn log_notice(notice: &tokio_postgres::error::DbError) {
    if notice.severity() == "WARNING" {
        tracing::warn!(code = notice.code().code(), "PostgreSQL: {}", notice.message());
    } else {
        tracing::debug!(
            severity = notice.severity(),
            code = notice.code().code(),
            "PostgreSQL: {}",
            notice.message()
        );
    }
}

/// The TLS connector for `url`'s settings (unused when TLS is off: the driver then never
/// starts a handshake).
fn tls_connector(url: &DatabaseUrl) -> Result<MakeRustlsConnect, PgError> {
    let tls_error = |reason: String| PgError::InvalidUrl { reason };
    let mut roots = rustls::RootCertStore::empty();
    match url.tls() {
        Tls::Disabled => {}
        Tls::Verified { root_cert: Some(path) } => {
            let certs = CertificateDer::pem_file_iter(path).map_err(|e| {
                tls_error(format!("cannot read sslrootcert {}: {e}", path.display()))
            })?;
            for cert in certs {
                let cert = cert.map_err(|e| {
                    tls_error(format!("sslrootcert {} is not PEM: {e}", path.display()))
                })?;
                roots.add(cert).map_err(|e| {
                    tls_error(format!(
                        "sslrootcert {} holds a bad certificate: {e}",
                        path.display()
                    ))
                })?;
            }
            if roots.is_empty() {
                return Err(tls_error(format!(
                    "sslrootcert {} holds no certificate",
                    path.display()
                )));
            }
        }
        Tls::Verified { root_cert: None } => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(tls_error(
                    "sslmode asks for TLS but the system has no root certificates: give \
                     sslrootcert=FILE (the PEM of the CA that signed the server's certificate)"
                        .into(),
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(format!("TLS setup: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// The messages of a connection opened by [`connect_unpooled`]: polling it drives the
/// connection (nothing is sent or received otherwise), and it yields what the server sends
/// unasked (`NOTIFY` payloads, notices). It ends when the connection closes.
pub struct Connection {
    messages: Pin<Box<dyn Stream<Item = Result<AsyncMessage, PgError>> + Send>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

impl Stream for Connection {
    type Item = Result<AsyncMessage, PgError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.messages.as_mut().poll_next(cx)
    }
}

impl Connection {
    /// Drives the connection until it closes, dropping unasked messages: spawn it when only
    /// the client is of use.
    pub async fn run(mut self) {
        use futures_util::StreamExt;
        while let Some(message) = self.next().await {
            if message.is_err() {
                break;
            }
        }
    }
}

/// Opens one connection outside any pool (for `LISTEN`, whose notifications arrive on the
/// returned [`Connection`]'s stream), with the pool's settings: the caller polls the stream,
/// e.g. in a task, for as long as it uses the client.
pub async fn connect_unpooled(
    url: &DatabaseUrl,
    options: &PoolOptions,
) -> Result<(tokio_postgres::Client, Connection), PgError> {
    options.validate()?;
    let (client, mut connection) = options
        .session_config(url)
        .connect(tls_connector(url)?)
        .await
        .map_err(|e| url.connect_error(&e))?;
    let scrub = url.clone();
    let messages = futures_util::stream::poll_fn(move |cx| {
        connection
            .poll_message(cx)
            .map(|message| message.map(|m| m.map_err(|e| scrub.error("the connection", &e))))
    });
    Ok((client, Connection { messages: Box::pin(messages) }))
}

impl Pool {
    /// A connection from the pool (waits up to the wait timeout for a free one).
    pub async fn get(&self) -> Result<deadpool_postgres::Object, PgError> {
        use deadpool_postgres::PoolError;
        self.inner.get().await.map_err(|e| match e {
            PoolError::Timeout(deadpool_postgres::TimeoutType::Wait) => PgError::PoolTimeout {
                waited: self.options.wait_timeout,
                max_size: self.options.max_size,
            },
            PoolError::Timeout(_) => PgError::Connect {
                target: self.url.target(),
                detail: format!(
                    "no connection was established within {:?}",
                    self.options.connect_timeout
                ),
                code: None,
            },
            PoolError::Backend(e) => self.url.connect_error(&e),
            PoolError::Closed => PgError::PoolClosed,
            other => PgError::Connect {
                target: self.url.target(),
                detail: self.url.scrub(&other.to_string()),
                code: None,
            },
        })
    }

    /// Maps a driver error met while doing `context`, scrubbed of this pool's URL secrets.
    pub fn error(&self, context: impl Into<String>, err: &tokio_postgres::Error) -> PgError {
        self.url.error(context, err)
    }

    /// The database URL (a secret: print it redacted).
    pub fn url(&self) -> &DatabaseUrl {
        &self.url
    }

    /// The settings the pool was opened with.
    pub fn options(&self) -> &PoolOptions {
        &self.options
    }

    /// Open and idle connections now.
    pub fn status(&self) -> deadpool_postgres::Status {
        self.inner.status()
    }

    /// Closes the pool: waiting and later callers get [`PgError::PoolClosed`].
    pub fn close(&self) {
        self.inner.close();
    }
}
