//! How to reach and greet a Connector, and the packet tap.

use std::sync::Arc;
use std::time::Duration;

use xagent_protocol_types::{
    Clock, ConnectorCard, ConnectorCardId, ConnectorId, ProfileId, Secret, SystemClock,
};
use xagent_protocol_validate::AdmissionWindow;

use crate::store::XagentStore;
use crate::{Backoff, BaseUrl, DownloadPolicy, HolderLease, TlsTrust};

/// Packets a connection's writer holds before a sender waits ([`ClientConfig::write_queue`]).
pub const DEFAULT_WRITE_QUEUE: usize = 256;

/// How to reach and greet a Connector.
#[derive(Clone)]
pub struct ClientConfig {
    /// The Connector's Base URL.
    pub base_url: BaseUrl,
    /// The system API key, sent on the upgrade as `Authorization: Bearer`.
    pub api_key: Option<Secret>,
    /// The Card id the Connector must have.
    pub connector_card_id: ConnectorCardId,
    /// The admitted Card. With it, `hello.ack`, Descriptors and Tool calls are checked against
    /// the Card; without it only against the Card id and `supported_profiles`.
    pub card: Option<ConnectorCard>,
    /// Profiles this xAgent supports (sent in every hello).
    pub supported_profiles: Vec<ProfileId>,
    /// The `connector_id` of an earlier session, to resume its runtime state.
    pub connector_id: Option<ConnectorId>,
    /// The protocol versions this xAgent admits (`hello.ack` is checked against it).
    pub window: AdmissionWindow,
    /// How long to wait for an ack.
    pub request_timeout: Duration,
    /// Reconnect policy.
    pub backoff: Backoff,
    /// Largest text frame accepted from the Connector.
    pub max_frame_bytes: usize,
    /// Largest packet sent to the Connector (its packet limit; the outbound size rule): a
    /// larger one is refused locally with [`crate::ClientError::TooLarge`].
    pub max_packet_bytes: usize,
    /// Events buffered for the application before the reader waits for it.
    pub event_capacity: usize,
    /// Packets queued for the connection's writer before a sender waits for room (default
    /// [`DEFAULT_WRITE_QUEUE`]).
    pub write_queue: usize,
    /// Sees every text frame in both directions (for tools that print the traffic).
    pub tap: Option<PacketTap>,
    /// The clock every timestamp comes from (a `ManualClock` in tests).
    pub clock: Arc<dyn Clock>,
    /// Durable xAgent-side state (remembered channels, idempotency, outbox); in memory when
    /// `None`.
    pub store: Option<Arc<dyn XagentStore>>,
    /// The holder lease, when several xAgent processes share the store: only the process
    /// holding the Card's lease connects `/ws` (see [`ClientConfig::with_holder_lease`]).
    pub lease: Option<HolderLease>,
    /// Where inbound files may be downloaded from, how large they may be and how many at a
    /// time (default: the Connector's own origin only, 32 MiB, 4 at a time).
    pub download: DownloadPolicy,
    /// The certificate authorities trusted for an `https` Base URL (default: the system's).
    pub tls: TlsTrust,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key)
            .field("connector_card_id", &self.connector_card_id)
            .field("supported_profiles", &self.supported_profiles)
            .field("connector_id", &self.connector_id)
            .field("request_timeout", &self.request_timeout)
            .field("backoff", &self.backoff)
            .field("durable", &self.store.is_some())
            .field("lease", &self.lease)
            .field("download", &self.download)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// Which way a tapped frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapDirection {
    /// xAgent -> Connector.
    Sent,
    /// Connector -> xAgent.
    Received,
}

type TapFn = dyn Fn(TapDirection, &str) + Send + Sync;

/// A callback that sees every text frame; cheap to clone.
#[derive(Clone)]
pub struct PacketTap(Arc<TapFn>);

impl PacketTap {
    /// Wraps a callback.
    pub fn new(tap: impl Fn(TapDirection, &str) + Send + Sync + 'static) -> Self {
        Self(Arc::new(tap))
    }

    pub(crate) fn see(&self, direction: TapDirection, text: &str) {
        (self.0)(direction, text);
    }
}

impl std::fmt::Debug for PacketTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PacketTap")
    }
}

impl ClientConfig {
    /// Defaults for a Connector: 10 s request timeout, default backoff, 1 MiB frames both ways, 1024
    /// buffered events, 256 queued writes, the system clock, state in memory, the default
    /// [`DownloadPolicy`].
    pub fn new(
        base_url: BaseUrl,
        connector_card_id: impl Into<ConnectorCardId>,
        supported_profiles: Vec<ProfileId>,
    ) -> Self {
        Self {
            base_url,
            api_key: None,
            connector_card_id: connector_card_id.into(),
            card: None,
            supported_profiles,
            connector_id: None,
            window: AdmissionWindow::default(),
            request_timeout: Duration::from_secs(10),
            backoff: Backoff::default(),
            max_frame_bytes: 1 << 20,
            max_packet_bytes: 1 << 20,
            event_capacity: 1024,
            write_queue: DEFAULT_WRITE_QUEUE,
            tap: None,
            clock: Arc::new(SystemClock),
            store: None,
            lease: None,
            download: DownloadPolicy::default(),
            tls: TlsTrust::system(),
        }
    }

    /// A configuration for an admitted Connector: its Card id and Profiles, checks against the
    /// Card.
    pub fn for_card(base_url: BaseUrl, card: &ConnectorCard) -> Self {
        let mut config =
            Self::new(base_url, card.connector_card_id.clone(), card.supports.profiles.clone());
        config.card = Some(card.clone());
        config
    }

    /// Sets the system API key.
    #[must_use]
    pub fn with_api_key(mut self, key: Secret) -> Self {
        self.api_key = Some(key);
        self
    }

    /// Sets the clock.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets the download policy of inbound files.
    #[must_use]
    pub fn with_download_policy(mut self, policy: DownloadPolicy) -> Self {
        self.download = policy;
        self
    }

    /// Trusts these certificate authorities on every socket to the Connector (the data plane,
    /// the control and transfer planes, downloads).
    #[must_use]
    pub fn with_tls(mut self, tls: TlsTrust) -> Self {
        self.tls = tls;
        self
    }

    /// Keeps xAgent-side state in a durable store.
    #[must_use]
    pub fn with_store(mut self, store: Arc<dyn XagentStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Shares the store with other xAgent processes of the same Card: the data plane connects
    /// only while this process holds the Card's holder lease in the store, and stands by
    /// otherwise (taking over, with the channels and the outbox, when the holder stops
    /// renewing). Needs a store (the lease lives there).
    #[must_use]
    pub fn with_holder_lease(mut self, lease: HolderLease) -> Self {
        self.lease = Some(lease);
        self
    }
}
