//! The front door of the xAgent side: [`Xagent`] assembles what every embedder otherwise
//! wires by hand, in one order: admission (or durable admission, with the stored Card
//! snapshot), the store opened for the admitted Card, the client configuration, the data plane
//! with its reconnect loop and the health monitor.
//!
//! ```no_run
//! use xagent_client_runtime::prelude::*;
//!
//! # async fn run() -> Result<(), ClientError> {
//! let Running { plane, mut events, .. } = Xagent::connect("https://connector.example/im", Secret::new("key"))
//!     .profiles(["xagent.im.v2"])
//!     .store(Store::Sqlite("./state".into()))
//!     .start()
//!     .await?;
//! plane.connected().await?;
//! while let Some(event) = events.recv().await {
//!     if let ClientEvent::ChatMessage(inbound) = event {
//!         inbound.accept();
//!     }
//! }
//! # Ok(())
//! # }
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use xagent_protocol_types::{ProfileId, Secret};
use xagent_protocol_validate::AdmissionWindow;

use crate::connection::{ClientConfig, DEFAULT_WRITE_QUEUE, DataPlane, Events, PacketTap};
use crate::download::DownloadPolicy;
use crate::health::HealthMonitor;
use crate::http::ControlPlane;
use crate::lease::HolderLease;
use crate::store::{MemoryXagentStore, SqliteXagentStore, XagentStore};
use crate::tls::TlsTrust;
use crate::{BaseUrl, ClientError, DurableAdmission, admit, admit_durably};

/// Where the xAgent side keeps its durable state (remembered channels, outbox, idempotency,
/// the Card snapshot).
#[derive(Clone, Default)]
#[non_exhaustive]
#[allow(clippy::large_enum_variant, reason = "built once per process and moved into start()")]
pub enum Store {
    /// In memory: a restart forgets everything (the default).
    #[default]
    Memory,
    /// SQLite in this state directory.
    Sqlite(PathBuf),
    /// A store the embedder opened itself.
    Open(Arc<dyn XagentStore>),
    /// PostgreSQL over this pool, the state kept under the admitted Card's id (several xAgent
    /// processes of one Card may share it; pair with [`Xagent::holder_lease`]).
    #[cfg(feature = "postgres")]
    Postgres(xagent_storage_postgres::Pool),
}

impl Store {
    /// Opens the store; `scope` is the Card id a shared database keeps the state under.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    async fn open(self, scope: Option<&str>) -> Result<Arc<dyn XagentStore>, ClientError> {
        Ok(match self {
            Self::Memory => Arc::new(MemoryXagentStore::new()),
            Self::Sqlite(dir) => Arc::new(SqliteXagentStore::open(dir)?),
            Self::Open(store) => store,
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                let scope = scope.ok_or_else(|| {
                    ClientError::NotAdmissible(
                        "durable admission on PostgreSQL needs the Card id first (Xagent::expect_card)"
                            .into(),
                    )
                })?;
                Arc::new(crate::store::PostgresXagentStore::open(pool, scope).await?)
            }
        })
    }
}

/// A started xAgent side: the data plane, its events, where the admitted Card came from and
/// the health monitor when one was asked for.
#[non_exhaustive]
pub struct Running {
    /// The data plane (connecting, then reconnecting by itself until closed).
    pub plane: DataPlane,
    /// What the Connector did, in order.
    pub events: Events,
    /// The admitted Card and Skill ([`DurableAdmission::Fresh`] unless the stored snapshot was
    /// served).
    pub admission: DurableAdmission,
    /// The health monitor ([`Xagent::health_every`]).
    pub health: Option<HealthMonitor>,
}

/// Builds the xAgent side of one Connector: [`Xagent::connect`], the settings, then
/// [`Xagent::start`].
#[must_use]
pub struct Xagent {
    base_url: String,
    api_key: Option<Secret>,
    profiles: Vec<ProfileId>,
    expected_card: Option<String>,
    store: Store,
    lease: Option<HolderLease>,
    durable: bool,
    tls: TlsTrust,
    download: DownloadPolicy,
    tap: Option<PacketTap>,
    request_timeout: Option<Duration>,
    write_queue: usize,
    health_every: Option<Duration>,
}

impl Xagent {
    /// The Connector at `base_url`, reached with the system API key when there is one. No
    /// Profile is announced until [`Xagent::profiles`] states the ones this xAgent handles.
    pub fn connect(base_url: impl Into<String>, api_key: impl Into<Option<Secret>>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: api_key.into(),
            profiles: Vec::new(),
            expected_card: None,
            store: Store::Memory,
            lease: None,
            durable: false,
            tls: TlsTrust::system(),
            download: DownloadPolicy::default(),
            tap: None,
            request_timeout: None,
            write_queue: DEFAULT_WRITE_QUEUE,
            health_every: None,
        }
    }

    /// The Profiles this xAgent handles (sent in every hello).
    pub fn profiles<P: Into<ProfileId>>(mut self, profiles: impl IntoIterator<Item = P>) -> Self {
        self.profiles = profiles.into_iter().map(Into::into).collect();
        self
    }

    /// Admits only the Connector whose Card has this id.
    pub fn expect_card(mut self, card_id: impl Into<String>) -> Self {
        self.expected_card = Some(card_id.into());
        self
    }

    /// Where the durable state lives (default: memory).
    pub fn store(mut self, store: Store) -> Self {
        self.store = store;
        self
    }

    /// Shares the store with other processes of the Card: only the holder of the Card's lease
    /// connects ([`ClientConfig::with_holder_lease`]).
    pub fn holder_lease(mut self, lease: HolderLease) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Admits with [`admit_durably`]: a Connector that cannot be reached is served from the
    /// stored Card snapshot and Skill cache.
    pub fn durable_admission(mut self) -> Self {
        self.durable = true;
        self
    }

    /// The certificate authorities trusted on every plane (default: the system's).
    pub fn tls(mut self, tls: TlsTrust) -> Self {
        self.tls = tls;
        self
    }

    /// Where inbound files may be downloaded from and how large they may be.
    pub fn download(mut self, policy: DownloadPolicy) -> Self {
        self.download = policy;
        self
    }

    /// Sees every text frame in both directions.
    pub fn tap(mut self, tap: PacketTap) -> Self {
        self.tap = Some(tap);
        self
    }

    /// How long to wait for an ack (default 10 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Packets queued for the connection's writer before a sender waits (default
    /// [`DEFAULT_WRITE_QUEUE`]).
    pub fn write_queue(mut self, packets: usize) -> Self {
        self.write_queue = packets;
        self
    }

    /// Probes `/health` this often and re-admits a changed Card ([`DataPlane::monitor_health`]).
    pub fn health_every(mut self, interval: Duration) -> Self {
        self.health_every = Some(interval);
        self
    }

    /// Admits the Connector, opens the store, starts the data plane (hello, then reconnecting
    /// by itself) and the health monitor. Wait for hello with [`DataPlane::connected`].
    pub async fn start(self) -> Result<Running, ClientError> {
        let base = BaseUrl::parse(&self.base_url)?;
        let control = ControlPlane::new(base.clone(), self.api_key.clone()).with_tls(&self.tls);
        let (expected, window) = (self.expected_card.as_deref(), AdmissionWindow::default());
        let (admission, store) = if self.durable {
            let store = self.store.open(expected).await?;
            (admit_durably(&control, &window, expected, store.as_ref()).await?, store)
        } else {
            let admitted = admit(&control, &window, expected).await?;
            let store = self.store.open(Some(admitted.card.connector_card_id.as_str())).await?;
            (DurableAdmission::Fresh(Box::new(admitted)), store)
        };
        let card = admission.card();
        let mut config = ClientConfig::new(base, card.connector_card_id.clone(), self.profiles)
            .with_tls(self.tls)
            .with_download_policy(self.download)
            .with_store(store);
        config.card = Some(card.clone());
        config.api_key = self.api_key;
        config.lease = self.lease;
        config.tap = self.tap;
        config.write_queue = self.write_queue;
        if let Some(timeout) = self.request_timeout {
            config.request_timeout = timeout;
        }
        let (plane, events) = DataPlane::connect(config).await?;
        let health = self.health_every.map(|every| plane.monitor_health(every)).transpose()?;
        Ok(Running { plane, events, admission, health })
    }
}
