//! The data-plane client: the xAgent side's frame driver.
//!
//! It mirrors `server-runtime`'s loop: a [`Transport`] yields one `Stream`/`Sink` of
//! [`Frame`]s per connection; `protocol-validate`'s [`Session`] (xAgent side) judges every
//! packet read and every packet about to be written; requests of every type go through one
//! request/ack path keyed by `request_id`; writes go through one bounded queue and a writer task
//! that holds no lock while it writes; events reach the application through a bounded channel.
//! Nothing but `connector.hello` leaves before `connector.hello.ack`, and nothing
//! channel-scoped before that channel's `channel.open.ack` on the current connection (the
//! session withholds it). Reconnecting never stops: the delay grows to a cap and the state says
//! what is going on ([`ConnectionState`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::{Mutex, mpsc, oneshot, watch};
use xagent_protocol_types::{
    ChannelOpen, ChannelOpenAck, ChatMessage, ChatMessageAck, Clock, ConnectionDescriptor,
    ConnectorCard, ConnectorCardId, ConnectorChannelId, ConnectorHello, ConnectorHelloAck,
    ConnectorId, MessagePush, Packet, PacketBody, Payload, Pong, ProfileId, Request, RequestId,
    Role, Secret, Side, SystemClock, ToolProgressPush, WireError,
};
use xagent_protocol_validate::{
    Accepted, AdmissionWindow, CardFacts, PacketContext, Permission, RejectAction, Session,
};

use crate::directory::ChannelDirectory;
use crate::im::ImState;
use crate::store::XagentStore;
use crate::transport::{Frame, FrameSink, FrameStream, Transport, WsTransport};
use crate::{Backoff, BaseUrl, ClientError, ids};

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
    /// Events buffered for the application before the reader waits for it.
    pub event_capacity: usize,
    /// Sees every text frame in both directions (for tools that print the traffic).
    pub tap: Option<PacketTap>,
    /// The clock every timestamp comes from (a `ManualClock` in tests).
    pub clock: Arc<dyn Clock>,
    /// Durable xAgent-side state (remembered channels, idempotency, outbox); in memory when
    /// `None`.
    pub store: Option<Arc<dyn XagentStore>>,
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

    fn see(&self, direction: TapDirection, text: &str) {
        (self.0)(direction, text);
    }
}

impl std::fmt::Debug for PacketTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PacketTap")
    }
}

impl ClientConfig {
    /// Defaults for a Connector: 10 s request timeout, default backoff, 1 MiB frames, 1024
    /// buffered events, the system clock, state in memory.
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
            event_capacity: 1024,
            tap: None,
            clock: Arc::new(SystemClock),
            store: None,
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

    /// Keeps xAgent-side state in a durable store.
    #[must_use]
    pub fn with_store(mut self, store: Arc<dyn XagentStore>) -> Self {
        self.store = Some(store);
        self
    }
}

/// The connection's state, observable through [`DataPlane::state`]. Every state but
/// `Stopped` is followed by another attempt: the client never gives up by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionState {
    /// Connecting (first attempt, or again after a connection that had been online ended).
    Connecting {
        /// Failed attempts in a row so far.
        failures: u32,
    },
    /// Hello completed; remembered channels are open or reopening.
    Online {
        /// The runtime id the Connector issued.
        connector_id: ConnectorId,
    },
    /// One or a few attempts in a row failed; retrying.
    Degraded {
        /// Failed attempts in a row.
        failures: u32,
        /// The last failure.
        reason: String,
    },
    /// Many attempts in a row failed (at least [`Backoff::max_failures`]); still retrying at
    /// the capped delay.
    Offline {
        /// Failed attempts in a row.
        failures: u32,
        /// The last failure.
        reason: String,
    },
    /// The Connector refused the system API key (401/403); still retrying at the capped
    /// delay, since the key may be fixed on the Connector's side.
    AuthFailed {
        /// The refusal.
        reason: String,
    },
    /// The Connector answered hello with another `connector_id`: its runtime state was
    /// rebuilt; the remembered channels are being reopened, then the state becomes `Online`.
    Replaced {
        /// The earlier id.
        previous: ConnectorId,
        /// The new id.
        current: ConnectorId,
    },
    /// Closed by the application.
    Stopped {
        /// Why.
        reason: String,
    },
}

impl ConnectionState {
    /// The state's name: `connecting`, `online`, `degraded`, `offline`, `auth_failed`,
    /// `replaced` or `stopped`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Connecting { .. } => "connecting",
            Self::Online { .. } => "online",
            Self::Degraded { .. } => "degraded",
            Self::Offline { .. } => "offline",
            Self::AuthFailed { .. } => "auth_failed",
            Self::Replaced { .. } => "replaced",
            Self::Stopped { .. } => "stopped",
        }
    }
}

/// What the Connector did, in order.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientEvent {
    /// Hello completed on a new socket.
    Connected {
        /// The runtime id.
        connector_id: ConnectorId,
    },
    /// The connection state changed.
    State(ConnectionState),
    /// The Connector returned a different `connector_id` than before: its runtime state was
    /// rebuilt, and this client replaced its view of it (pending requests failed, channels
    /// reopened).
    ConnectorReplaced {
        /// The earlier id.
        previous: ConnectorId,
        /// The new id.
        current: ConnectorId,
    },
    /// The socket closed; a reconnect follows.
    Disconnected {
        /// Why.
        reason: String,
    },
    /// A remembered channel was reopened after a reconnect, possibly under a new id.
    ChannelReopened {
        /// The id that was remembered.
        previous: ConnectorChannelId,
        /// The id the Connector returned.
        current: ConnectorChannelId,
        /// Its Descriptor.
        descriptor: Box<ConnectionDescriptor>,
    },
    /// A remembered channel could not be reopened.
    ChannelReopenFailed {
        /// The channel.
        channel: ConnectorChannelId,
        /// Why.
        error: String,
    },
    /// `connection.descriptor.push` that passed the Descriptor rules (it is already applied
    /// to the channel directory).
    DescriptorPushed {
        /// The channel.
        channel: ConnectorChannelId,
        /// The new Descriptor.
        descriptor: Box<ConnectionDescriptor>,
    },
    /// An IM v2 user message that passed the inbound rules and was not seen before on this
    /// channel. Answer it with [`InboundMessage::accept`] once its effect is done, or reject it.
    ChatMessage(InboundMessage),
    /// An ack for an assistant message this client sent (already applied to the outbox).
    ChatMessageAcked {
        /// The channel.
        channel: ConnectorChannelId,
        /// The ack.
        ack: ChatMessageAck,
    },
    /// `message.push` (IM v1).
    MessagePush {
        /// The channel.
        channel: Option<ConnectorChannelId>,
        /// The payload.
        message: Box<MessagePush>,
    },
    /// `tool.progress.push`.
    ToolProgress {
        /// The channel.
        channel: Option<ConnectorChannelId>,
        /// The payload.
        progress: ToolProgressPush,
    },
    /// An `error` packet not tied to a pending request.
    Error(WireError),
    /// The client was closed.
    Stopped {
        /// Why.
        reason: String,
    },
}

/// An inbound `chat.message` awaiting the application's verdict. Dropping it unanswered
/// rejects it as retryable (`channel_busy`), so the Connector redelivers it.
#[derive(Debug)]
pub struct InboundMessage {
    /// The channel it arrived on.
    pub channel: ConnectorChannelId,
    /// The message.
    pub message: ChatMessage,
    /// The application's references of the message's files, in order, when a
    /// [`crate::FileSink`] is set (the files were downloaded and saved before this event).
    pub saved_files: Vec<String>,
    responder: Option<oneshot::Sender<Verdict>>,
}

/// The application's answer to an inbound message.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Accepted: its effect is done.
    Accept,
    /// Rejected with a stable code; `retryable` says whether redelivery may succeed.
    Reject {
        /// Stable code.
        code: xagent_protocol_types::ErrorCode,
        /// Short reason.
        message: String,
        /// Whether the same message may succeed later.
        retryable: bool,
    },
}

impl InboundMessage {
    pub(crate) fn with_responder(
        channel: ConnectorChannelId,
        message: ChatMessage,
        responder: oneshot::Sender<Verdict>,
        saved_files: Vec<String>,
    ) -> Self {
        Self { channel, message, saved_files, responder: Some(responder) }
    }

    /// Accepts the message (call after its effect is done).
    pub fn accept(mut self) {
        if let Some(responder) = self.responder.take() {
            let _ = responder.send(Verdict::Accept);
        }
    }

    /// Rejects the message.
    pub fn reject(
        mut self,
        code: xagent_protocol_types::ErrorCode,
        message: impl Into<String>,
        retryable: bool,
    ) {
        if let Some(responder) = self.responder.take() {
            let _ = responder.send(Verdict::Reject { code, message: message.into(), retryable });
        }
    }
}

impl Drop for InboundMessage {
    fn drop(&mut self) {
        if let Some(responder) = self.responder.take() {
            let _ = responder.send(Verdict::Reject {
                code: xagent_protocol_types::ErrorCode::ChannelBusy,
                message: "the message was not handled".into(),
                retryable: true,
            });
        }
    }
}

/// What the writer task writes.
enum Outgoing {
    /// A packet, judged by the session first; `done` learns whether it was written.
    Packet(Box<Packet>, Option<oneshot::Sender<Result<(), ClientError>>>),
    /// Raw text (conformance probes), written as it is.
    Raw(String),
    /// A close frame; the writer stops after it.
    Close(u16, String),
}

/// The current connection: its write queue and its sequencing session.
#[derive(Clone)]
struct Link {
    tx: mpsc::Sender<Outgoing>,
    session: Arc<StdMutex<Session>>,
}

type Waiter = oneshot::Sender<Result<Packet, ClientError>>;

pub(crate) struct Shared {
    pub(crate) config: ClientConfig,
    link: StdMutex<Option<Link>>,
    pending: StdMutex<HashMap<RequestId, Waiter>>,
    /// Remembered channels: the id xAgent persisted -> the id currently open.
    channels: StdMutex<BTreeMap<ConnectorChannelId, ConnectorChannelId>>,
    pub(crate) directory: StdMutex<ChannelDirectory>,
    state: watch::Sender<ConnectionState>,
    pub(crate) events: mpsc::Sender<ClientEvent>,
    pub(crate) im: Mutex<ImState>,
    pub(crate) files: StdMutex<Option<Arc<dyn crate::FileSource>>>,
    pub(crate) sink: StdMutex<Option<Arc<dyn crate::FileSink>>>,
    /// The HTTP client of the control and transfer planes, made once per data plane (on first
    /// use) and shared by every download and upload: a `reqwest::Client` holds a connection
    /// pool, so one per file would open a new connection each time.
    control: std::sync::OnceLock<crate::ControlPlane>,
    validator: xagent_protocol_validate::Validator,
}

pub(crate) fn lock<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn now(&self) -> u64 {
        self.config.clock.now_millis()
    }

    /// The control and transfer planes of this Connector (one client per data plane).
    pub(crate) fn control(&self) -> crate::ControlPlane {
        self.control
            .get_or_init(|| {
                crate::ControlPlane::new(self.config.base_url.clone(), self.config.api_key.clone())
            })
            .clone()
    }

    /// The admitted Card's facts the packet rules judge by (the current Card after a refetch):
    /// the directory's copy, so the packet rules and the Descriptor rules share one.
    pub(crate) fn card_facts(&self) -> Option<Arc<CardFacts>> {
        lock(&self.directory).card_facts()
    }

    /// Replaces the admitted Card everywhere it is judged: the packet rules and the directory.
    pub(crate) fn set_card(&self, card: xagent_protocol_types::ConnectorCard) {
        lock(&self.directory).set_card(card);
    }

    fn link(&self) -> Option<Link> {
        lock(&self.link).clone()
    }

    fn set_state(&self, state: ConnectionState) {
        self.state.send_replace(state.clone());
        // State changes are advisory: never block the driver on a slow reader.
        let _ = self.events.try_send(ClientEvent::State(state));
    }
}

/// A handle to the data plane; clones share one connection.
#[derive(Clone)]
pub struct DataPlane {
    shared: Arc<Shared>,
    state: watch::Receiver<ConnectionState>,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for DataPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPlane").field("state", &*self.state.borrow()).finish()
    }
}

/// The application's end of the bounded event channel.
pub type Events = mpsc::Receiver<ClientEvent>;

/// Something events can be read from (the bounded [`Events`], or the unbounded relay
/// [`DataPlane::start`] returns).
pub trait EventSource {
    /// The next event; `None` once the client is gone.
    fn next_event(&mut self) -> impl std::future::Future<Output = Option<ClientEvent>> + Send;
}

impl EventSource for mpsc::Receiver<ClientEvent> {
    fn next_event(&mut self) -> impl std::future::Future<Output = Option<ClientEvent>> + Send {
        self.recv()
    }
}

impl EventSource for mpsc::UnboundedReceiver<ClientEvent> {
    fn next_event(&mut self) -> impl std::future::Future<Output = Option<ClientEvent>> + Send {
        self.recv()
    }
}

impl DataPlane {
    /// Starts connecting over WebSocket in the background and returns the handle and the
    /// bounded event stream. Wait for `online` with [`DataPlane::connected`].
    pub fn connect(config: ClientConfig) -> Result<(Self, Events), ClientError> {
        let transport = WsTransport::new(
            config.base_url.clone(),
            config.api_key.clone(),
            config.max_frame_bytes,
        );
        Self::connect_with(config, transport)
    }

    /// Like [`DataPlane::connect`] over any transport (in-memory in tests). Fails only when the
    /// durable store cannot be read.
    pub fn connect_with(
        config: ClientConfig,
        transport: impl Transport,
    ) -> Result<(Self, Events), ClientError> {
        let (events, receiver) = mpsc::channel(config.event_capacity.max(1));
        let (state_sender, state) = watch::channel(ConnectionState::Connecting { failures: 0 });
        let now = config.clock.now_millis();
        let im = ImState::open(config.store.clone(), now)?;
        let mut channels = BTreeMap::new();
        let mut directory = ChannelDirectory::new(config.card.clone());
        if let Some(store) = &config.store {
            for remembered in store.load_channels().map_err(ClientError::Store)? {
                channels.insert(remembered.channel.clone(), remembered.channel.clone());
                directory.remember(remembered.channel, remembered.owner);
            }
        }
        let config_window = config.window;
        let shared = Arc::new(Shared {
            im: Mutex::new(im),
            config,
            link: StdMutex::new(None),
            pending: StdMutex::new(HashMap::new()),
            channels: StdMutex::new(channels),
            directory: StdMutex::new(directory),
            state: state_sender,
            events,
            files: StdMutex::new(None),
            sink: StdMutex::new(None),
            control: std::sync::OnceLock::new(),
            validator: xagent_protocol_validate::Validator::new().with_window(config_window),
        });
        let pump = tokio::spawn(crate::im::run_pump(shared.clone()));
        let supervisor = shared.clone();
        let task = tokio::spawn(async move {
            supervise(supervisor, Box::new(transport)).await;
            pump.abort();
        });
        Ok((Self { shared, state, task: Arc::new(task) }, receiver))
    }

    /// Starts connecting with an in-memory store and returns the handle and an unbounded relay
    /// of the bounded event stream (kept for callers written before [`DataPlane::connect`]).
    pub fn start(config: ClientConfig) -> (Self, mpsc::UnboundedReceiver<ClientEvent>) {
        let config = ClientConfig { store: None, ..config };
        let transport = WsTransport::new(
            config.base_url.clone(),
            config.api_key.clone(),
            config.max_frame_bytes,
        );
        let (relay, receiver) = mpsc::unbounded_channel();
        match Self::connect_with(config, transport) {
            Ok((plane, mut events)) => {
                tokio::spawn(async move {
                    while let Some(event) = events.recv().await {
                        if relay.send(event).is_err() {
                            break;
                        }
                    }
                });
                (plane, receiver)
            }
            // Unreachable: without a store there is nothing to read.
            Err(error) => unreachable!("an in-memory data plane cannot fail to start: {error}"),
        }
    }

    /// The current connection state.
    pub fn state(&self) -> ConnectionState {
        self.state.borrow().clone()
    }

    /// A receiver that sees every state change.
    pub fn watch_state(&self) -> watch::Receiver<ConnectionState> {
        self.state.clone()
    }

    /// Waits until hello has completed and returns the connector id. Fails when the client
    /// was closed or the Connector refused the API key.
    pub async fn connected(&self) -> Result<ConnectorId, ClientError> {
        let mut state = self.state.clone();
        loop {
            match &*state.borrow_and_update() {
                ConnectionState::Online { connector_id } => return Ok(connector_id.clone()),
                ConnectionState::Stopped { .. } => return Err(ClientError::Closed),
                ConnectionState::AuthFailed { reason } => {
                    return Err(ClientError::Unauthorized {
                        endpoint: format!("{} ({reason})", self.shared.config.base_url.ws_url()),
                        status: 401,
                    });
                }
                _ => {}
            }
            state.changed().await.map_err(|_| ClientError::Closed)?;
        }
    }

    /// Sends a request and waits for its ack, returning the typed ack payload. An ack that
    /// carries an `error`, or an `error` packet answering the request, becomes
    /// [`ClientError::Remote`].
    pub async fn request<R: Request>(
        &self,
        channel: Option<&ConnectorChannelId>,
        payload: R,
    ) -> Result<R::Ack, ClientError>
    where
        R::Ack: Clone,
    {
        request_typed(&self.shared, channel, payload).await
    }

    /// Sends a request body and returns the answering packet as it arrived.
    pub async fn request_packet(
        &self,
        channel: Option<&ConnectorChannelId>,
        body: PacketBody,
    ) -> Result<Packet, ClientError> {
        request_on(&self.shared, channel, body).await
    }

    /// Sends one packet as it is (after the session allowed it).
    pub async fn send(&self, packet: &Packet) -> Result<(), ClientError> {
        send_on(&self.shared, packet).await
    }

    /// Sends raw text, past the session (for conformance probes that need malformed input).
    pub async fn send_raw(&self, text: String) -> Result<(), ClientError> {
        let link = self.shared.link().ok_or(ClientError::NotConnected)?;
        link.tx.send(Outgoing::Raw(text)).await.map_err(|_| ClientError::NotConnected)
    }

    /// Opens a channel (`existing` restores a persisted one) and returns its ack. The channel
    /// is not remembered until [`DataPlane::remember_channel`] is called (xAgent persists a
    /// channel only after authentication succeeded).
    pub async fn open_channel(
        &self,
        existing: Option<&ConnectorChannelId>,
    ) -> Result<ChannelOpenAck, ClientError> {
        self.request(existing, ChannelOpen::default()).await
    }

    /// Opens a channel for an xAgent user, who then owns it in the channel directory.
    pub async fn open_channel_for(
        &self,
        owner: &str,
        existing: Option<&ConnectorChannelId>,
    ) -> Result<ChannelOpenAck, ClientError> {
        let ack = self.open_channel(existing).await?;
        lock(&self.shared.directory).set_owner(&ack.connector_channel_id, owner);
        Ok(ack)
    }

    /// Remembers a channel so it is reopened after every reconnect (and, with a durable store,
    /// after a restart).
    pub async fn remember_channel(&self, channel: ConnectorChannelId) {
        let owner = lock(&self.shared.directory).owner(&channel);
        if let Some(store) = &self.shared.config.store
            && let Err(error) = store.save_channel(&channel, owner.as_deref())
        {
            tracing::warn!(%error, "could not persist a remembered channel");
        }
        lock(&self.shared.channels).insert(channel.clone(), channel);
    }

    /// Forgets a channel.
    pub async fn forget_channel(&self, channel: &ConnectorChannelId) {
        if let Some(store) = &self.shared.config.store
            && let Err(error) = store.delete_channel(channel)
        {
            tracing::warn!(%error, "could not forget a remembered channel");
        }
        lock(&self.shared.channels)
            .retain(|persisted, current| persisted != channel && current != channel);
        lock(&self.shared.directory).forget(channel);
    }

    /// The current id of a remembered channel (it changes when the Connector did not
    /// recognise the old one on reopen).
    pub async fn current_channel(
        &self,
        persisted: &ConnectorChannelId,
    ) -> Option<ConnectorChannelId> {
        lock(&self.shared.channels).get(persisted).cloned()
    }

    /// Remembered channels as (persisted id, current id).
    pub async fn channels(&self) -> Vec<(ConnectorChannelId, ConnectorChannelId)> {
        lock(&self.shared.channels).iter().map(|(a, b)| (a.clone(), b.clone())).collect()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Stops the client: closes the socket and ends reconnecting.
    pub async fn close(&self) {
        self.task.abort();
        let link = lock(&self.shared.link).take();
        if let Some(link) = link {
            let _ = link.tx.send(Outgoing::Close(1000, "closed".into())).await;
        }
        self.shared.set_state(ConnectionState::Stopped { reason: "closed".into() });
        let _ = self.shared.events.try_send(ClientEvent::Stopped { reason: "closed".into() });
        fail_pending(&self.shared);
    }

    /// Sends a `ping` and waits for the `pong`.
    pub async fn ping(&self) -> Result<(), ClientError> {
        let answer =
            self.request_packet(None, xagent_protocol_types::Ping::default().into_body()).await?;
        match (answer.error.clone(), answer.type_str()) {
            (Some(error), _) => Err(ClientError::Remote(error)),
            (None, "pong") => Ok(()),
            (None, other) => Err(ClientError::Protocol(format!("expected pong, got {other}"))),
        }
    }
}

/// Reads events until one satisfies `want`, skipping the others; `None` when `within` passes
/// first or the client stopped. For callers that wait for one kind of event (a reconnect, an
/// ack) on the stream [`DataPlane::connect`] or [`DataPlane::start`] returns.
pub async fn next_event_matching<E: EventSource>(
    events: &mut E,
    within: Duration,
    mut want: impl FnMut(&ClientEvent) -> bool,
) -> Option<ClientEvent> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, events.next_event()).await {
            Ok(Some(event)) if want(&event) => return Some(event),
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => return None,
        }
    }
}

/// The one request/ack path: every request type (hello included) is registered by
/// `request_id`, written through the session, and answered by the reader.
pub(crate) async fn request_on(
    shared: &Shared,
    channel: Option<&ConnectorChannelId>,
    body: PacketBody,
) -> Result<Packet, ClientError> {
    let expected = match body.packet_type().spec().map(|s| s.role) {
        Some(Role::Request { ack }) => ack,
        _ => return Err(ClientError::Protocol(format!("{} is not a request", body.type_str()))),
    };
    let request_id = RequestId::new(ids::mint("req_"));
    let packet = Packet::new(ids::mint("pkt_"), body)
        .request_id(request_id.clone())
        .maybe_channel(channel.cloned());
    let (sender, receiver) = oneshot::channel();
    lock(&shared.pending).insert(request_id.clone(), sender);
    if let Err(error) = send_on(shared, &packet).await {
        lock(&shared.pending).remove(&request_id);
        return Err(error);
    }
    let timeout = shared.config.request_timeout;
    match tokio::time::timeout(timeout, receiver).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(ClientError::NotConnected),
        Err(_) => {
            lock(&shared.pending).remove(&request_id);
            if let Some(link) = shared.link() {
                lock(&link.session).forget_request(Side::Xagent, &request_id);
            }
            Err(ClientError::Timeout { expected, millis: timeout.as_millis() as u64 })
        }
    }
}

/// [`request_on`] with the ack decoded into the request's ack type.
pub(crate) async fn request_typed<R: Request>(
    shared: &Shared,
    channel: Option<&ConnectorChannelId>,
    payload: R,
) -> Result<R::Ack, ClientError>
where
    R::Ack: Clone,
{
    let packet = request_on(shared, channel, payload.into_body()).await?;
    if let Some(error) = packet.error {
        return Err(ClientError::Remote(error));
    }
    match R::Ack::from_body(&packet.body) {
        Some(ack) => Ok(ack.clone()),
        None => Err(ClientError::Protocol(format!(
            "expected {} with a payload, got {}",
            R::Ack::TYPE,
            packet.type_str()
        ))),
    }
}

/// Queues a packet and waits until the writer wrote it, or the session withheld it.
pub(crate) async fn send_on(shared: &Shared, packet: &Packet) -> Result<(), ClientError> {
    let link = shared.link().ok_or(ClientError::NotConnected)?;
    let packet = packet.clone().time(shared.now());
    let (done, written) = oneshot::channel();
    link.tx
        .send(Outgoing::Packet(Box::new(packet), Some(done)))
        .await
        .map_err(|_| ClientError::NotConnected)?;
    written.await.unwrap_or(Err(ClientError::NotConnected))
}

/// Queues a packet without waiting for the write (replies from the reader).
async fn send_quietly(shared: &Shared, packet: Packet) {
    if let Some(link) = shared.link() {
        let _ = link.tx.send(Outgoing::Packet(Box::new(packet.time(shared.now())), None)).await;
    }
}

fn fail_pending(shared: &Shared) {
    // Dropping the senders wakes every waiter with NotConnected.
    lock(&shared.pending).clear();
}

pub(crate) async fn emit(shared: &Shared, event: ClientEvent) {
    let _ = shared.events.send(event).await;
}

/// The reconnect loop: never gives up; the delay grows to the cap.
async fn supervise(shared: Arc<Shared>, transport: Box<dyn Transport>) {
    let mut failures = 0u32;
    let mut known_connector: Option<ConnectorId> = shared.config.connector_id.clone();
    loop {
        if failures == 0 {
            shared.set_state(ConnectionState::Connecting { failures });
        }
        let outcome = run_connection(&shared, transport.as_ref(), &mut known_connector).await;
        *lock(&shared.link) = None;
        fail_pending(&shared);
        shared.im.lock().await.on_disconnect(shared.now());
        match outcome {
            Ok(reason) => {
                failures = 0;
                emit(&shared, ClientEvent::Disconnected { reason }).await;
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::warn!(failures, error = %error, "data-plane connection failed");
                let reason = error.to_string();
                let state = match &error {
                    ClientError::Unauthorized { .. } => {
                        ConnectionState::AuthFailed { reason: reason.clone() }
                    }
                    _ if shared.config.backoff.exhausted(failures) => {
                        ConnectionState::Offline { failures, reason: reason.clone() }
                    }
                    _ => ConnectionState::Degraded { failures, reason: reason.clone() },
                };
                shared.set_state(state);
                emit(&shared, ClientEvent::Disconnected { reason }).await;
            }
        }
        let delay = shared.config.backoff.delay(failures.max(1));
        tokio::time::sleep(delay).await;
    }
}

/// One connection's life: connect, hello, reopen channels, read until it closes. Returns `Ok`
/// with the close reason when hello had completed, `Err` otherwise.
async fn run_connection(
    shared: &Arc<Shared>,
    transport: &dyn Transport,
    known_connector: &mut Option<ConnectorId>,
) -> Result<String, ClientError> {
    let config = &shared.config;
    let (sink, stream) = transport.connect().await?;
    let session = match &config.card {
        Some(card) => Session::new(Side::Xagent, card, config.window),
        None => Session::from_parts(
            Side::Xagent,
            config.connector_card_id.clone(),
            config.supported_profiles.clone(),
            config.window,
        ),
    };
    let session = Arc::new(StdMutex::new(session));
    let (tx, rx) = mpsc::channel(256);
    let writer = tokio::spawn(write_loop(sink, rx, session.clone(), config.tap.clone()));
    *lock(&shared.link) = Some(Link { tx, session: session.clone() });
    let mut reader = Box::pin(read_loop(shared.clone(), session.clone(), stream));

    // Hello, through the same request path as every other request.
    let mut hello =
        ConnectorHello::new(config.connector_card_id.clone(), config.supported_profiles.clone());
    if let Some(id) = known_connector.as_ref() {
        hello = hello.with_connector_id(id.clone());
    }
    let hello_answer = tokio::select! {
        biased;
        answer = request_on(shared, None, hello.into_body()) => answer,
        reason = &mut reader => {
            writer.abort();
            return Err(ClientError::Transport {
                endpoint: config.base_url.ws_url(),
                reason: format!("closed before connector.hello.ack: {reason}"),
            });
        }
    };
    let hello_ack = match hello_answer.and_then(|packet| check_hello_ack(shared, &packet)) {
        Ok(ack) => ack,
        Err(error) => {
            if let Some(link) = shared.link() {
                let _ =
                    link.tx.send(Outgoing::Close(1008, "connector.hello.ack refused".into())).await;
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
            return Err(error);
        }
    };
    let connector_id = hello_ack.connector_id.clone();
    let replaced = match known_connector.replace(connector_id.clone()) {
        Some(previous) if previous != connector_id => Some(previous),
        _ => None,
    };
    match replaced {
        Some(previous) => {
            shared.set_state(ConnectionState::Replaced {
                previous: previous.clone(),
                current: connector_id.clone(),
            });
            emit(
                shared,
                ClientEvent::ConnectorReplaced { previous, current: connector_id.clone() },
            )
            .await;
        }
        None => shared.set_state(ConnectionState::Online { connector_id: connector_id.clone() }),
    }
    emit(shared, ClientEvent::Connected { connector_id: connector_id.clone() }).await;

    // Reopen remembered channels while the reader runs.
    let reopen = tokio::spawn(reopen_channels(shared.clone(), connector_id));
    let reason = reader.await;
    reopen.abort();
    writer.abort();
    Ok(reason)
}

/// The checks on `connector.hello.ack` beyond the session's (which already checked the Card
/// id, the version window and the pairing): the schema rules of the validator, and the Card.
fn check_hello_ack(shared: &Shared, packet: &Packet) -> Result<ConnectorHelloAck, ClientError> {
    if let Some(error) = &packet.error {
        return Err(ClientError::Remote(error.clone()));
    }
    let value = packet.to_value().map_err(|e| ClientError::Protocol(e.to_string()))?;
    let facts = shared.card_facts();
    let context = PacketContext { card: facts.as_deref(), sender: Some(Side::Connector) };
    let report = xagent_protocol_validate::validate_packet(&value, context);
    let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
    if !errors.is_empty() {
        return Err(ClientError::NotAdmissible(format!(
            "connector.hello.ack refused: {}",
            errors.join("; ")
        )));
    }
    let Some(ack) = packet.payload::<ConnectorHelloAck>().cloned() else {
        return Err(ClientError::Protocol(format!(
            "expected connector.hello.ack, got {}",
            packet.type_str()
        )));
    };
    if ack.connector_card_id != shared.config.connector_card_id {
        return Err(ClientError::NotAdmissible(format!(
            "[hello_ack.card_id] connector.hello.ack names card {}, expected {}",
            ack.connector_card_id, shared.config.connector_card_id
        )));
    }
    shared
        .config
        .window
        .admit(ack.protocol_version.as_deref())
        .map_err(|e| ClientError::NotAdmissible(format!("[hello_ack.protocol_version] {e}")))?;
    if let Some(card) = &shared.config.card
        && ack.protocol_version.as_deref() != Some(card.protocol_version.as_str())
    {
        return Err(ClientError::NotAdmissible(format!(
            "[hello_ack.protocol_version] connector.hello.ack says protocol {:?}, the admitted Card says {}",
            ack.protocol_version, card.protocol_version
        )));
    }
    Ok(ack)
}

async fn reopen_channels(shared: Arc<Shared>, connector_id: ConnectorId) {
    let remembered: Vec<(ConnectorChannelId, ConnectorChannelId)> =
        lock(&shared.channels).iter().map(|(a, b)| (a.clone(), b.clone())).collect();
    for (persisted, current) in remembered {
        match request_typed(&shared, Some(&current), ChannelOpen::default()).await {
            Ok(ack) => {
                let new_id = ack.connector_channel_id.clone();
                lock(&shared.channels).insert(persisted.clone(), new_id.clone());
                lock(&shared.directory).rename(&current, &new_id);
                shared.im.lock().await.on_channel_reopened(&current, &new_id, shared.now());
                emit(
                    &shared,
                    ClientEvent::ChannelReopened {
                        previous: current,
                        current: new_id,
                        descriptor: Box::new(ack.connection_descriptor),
                    },
                )
                .await;
            }
            Err(error) => {
                emit(
                    &shared,
                    ClientEvent::ChannelReopenFailed { channel: current, error: error.to_string() },
                )
                .await;
            }
        }
    }
    if matches!(*shared.state.borrow(), ConnectionState::Replaced { .. }) {
        shared.set_state(ConnectionState::Online { connector_id });
    }
    crate::im::pump(&shared).await;
}

/// The writer: judges each packet with the session (no lock held while writing), then writes.
async fn write_loop(
    mut sink: FrameSink,
    mut rx: mpsc::Receiver<Outgoing>,
    session: Arc<StdMutex<Session>>,
    tap: Option<PacketTap>,
) {
    while let Some(item) = rx.recv().await {
        let (text, done) = match item {
            Outgoing::Close(code, reason) => {
                let _ = sink.send(Frame::Close(Some((code, reason)))).await;
                let _ = sink.close().await;
                return;
            }
            Outgoing::Raw(text) => (text, None),
            Outgoing::Packet(packet, done) => {
                let verdict = lock(&session).on_sent(&packet);
                if let Err(rejection) = verdict {
                    tracing::debug!(packet_type = packet.type_str(), code = %rejection.error.code, "outgoing packet withheld");
                    if let Some(done) = done {
                        let _ = done.send(Err(ClientError::Withheld(rejection.error)));
                    }
                    continue;
                }
                match packet.to_json() {
                    Ok(text) => (text, done),
                    Err(error) => {
                        if let Some(done) = done {
                            let _ = done.send(Err(ClientError::Protocol(error.to_string())));
                        }
                        continue;
                    }
                }
            }
        };
        if let Some(tap) = &tap {
            tap.see(TapDirection::Sent, &text);
        }
        let written = sink.send(Frame::Text(text)).await;
        let ok = written.is_ok();
        if let Some(done) = done {
            let _ = done.send(written);
        }
        if !ok {
            break;
        }
    }
    let _ = sink.close().await;
}

/// The reader: every frame through the session, then to its handler. Returns why it ended.
async fn read_loop(
    shared: Arc<Shared>,
    session: Arc<StdMutex<Session>>,
    mut stream: FrameStream,
) -> String {
    loop {
        let Some(frame) = stream.next().await else {
            return "the Connector closed the socket".to_owned();
        };
        match frame {
            Err(error) => return format!("socket error: {error}"),
            Ok(Frame::Close(close)) => {
                return match close {
                    Some((code, reason)) => format!("closed by the Connector ({code}: {reason})"),
                    None => "closed by the Connector".to_owned(),
                };
            }
            Ok(Frame::Binary(_)) => tracing::warn!("ignoring a binary frame from the Connector"),
            Ok(Frame::Text(text)) => {
                if let Some(reason) = on_text(&shared, &session, &text).await {
                    if let Some(link) = shared.link() {
                        let _ = link.tx.send(Outgoing::Close(1008, reason.clone())).await;
                    }
                    return reason;
                }
            }
        }
    }
}

/// Handles one text frame; `Some(reason)` closes the connection.
async fn on_text(shared: &Arc<Shared>, session: &StdMutex<Session>, text: &str) -> Option<String> {
    if let Some(tap) = &shared.config.tap {
        tap.see(TapDirection::Received, text);
    }
    if text.len() > shared.config.max_frame_bytes {
        return Some("packet larger than the size limit".into());
    }
    let packet = match Packet::decode_str(text) {
        Ok(packet) => packet,
        Err(error) => {
            tracing::warn!(error = %error, "invalid packet from the Connector");
            let rejection = xagent_protocol_validate::Rejection::from_decode(&error);
            // A malformed answer to a pending request fails that request now.
            if let Some(request_id) = &error.ids.request_id
                && let Some(waiter) = lock(&shared.pending).remove(request_id)
            {
                let _ = waiter.send(Err(ClientError::Protocol(error.to_string())));
            }
            send_quietly(shared, rejection.error_packet_for(ids::mint("pkt_"), &error.ids)).await;
            return None;
        }
    };
    // Nothing the validator rejects is accepted. A `chat.message` it refuses is answered with
    // a `rejected` ack once the session has paired it, as the Profile says.
    let is_message = matches!(packet.body, PacketBody::ChatMessage(_));
    let refused_message = if is_message { validation_errors(shared, &packet, text) } else { None };
    if !is_message
        && let Some(problems) = validation_errors(shared, &packet, text)
    {
        tracing::warn!(packet_type = packet.type_str(), %problems, "packet breaks the protocol");
        let error =
            WireError::invalid_packet(format!("the packet breaks the protocol: {problems}"));
        let role = packet.packet_type().spec().map(|s| s.role);
        let answering = matches!(role, Some(Role::Ack { .. }) | Some(Role::Error))
            || matches!(packet.body, PacketBody::Error(_));
        if answering {
            if let Some(request_id) = &packet.request_id
                && let Some(waiter) = lock(&shared.pending).remove(request_id)
            {
                lock(session).forget_request(Side::Xagent, request_id);
                let _ = waiter.send(Err(ClientError::Refused(error)));
            }
            return None;
        }
        // A pushed Descriptor that breaks the rules is dropped without an answer (as the
        // session does for one of another channel); everything else gets `invalid_packet`.
        if matches!(packet.body, PacketBody::DescriptorPush(_)) {
            return None;
        }
        let reply = Packet::error(ids::mint("pkt_"), error).answering(&packet);
        send_quietly(shared, reply).await;
        return None;
    }
    // Profile packets outside what was negotiated or what the channel enables are dropped
    // without an answer; the catalog decides.
    {
        let session = lock(session);
        if let Some(negotiated) = session.negotiated() {
            // Borrowed from the session (no copy per packet).
            let channel_profiles =
                packet.connector_channel_id.as_ref().and_then(|c| session.channel_profiles(c));
            if let Permission::ProfileNotNegotiated { profile }
            | Permission::ProfileNotOnChannel { profile } =
                negotiated.decide(packet.type_str(), Side::Connector, channel_profiles)
            {
                tracing::debug!(
                    packet_type = packet.type_str(),
                    profile,
                    "dropped a packet of a Profile not in effect"
                );
                return None;
            }
        }
    }
    let verdict = lock(session).on_received(&packet);
    let accepted = match verdict {
        Ok(accepted) => accepted,
        Err(rejection) => {
            tracing::debug!(packet_type = packet.type_str(), code = %rejection.error.code, "packet refused");
            // A refused hello.ack is reported with the validator's rule ids where it has them.
            let error = match &packet.body {
                PacketBody::ConnectorHelloAck(_) => check_hello_ack(shared, &packet)
                    .err()
                    .unwrap_or_else(|| ClientError::Refused(rejection.error.clone())),
                _ => ClientError::Refused(rejection.error.clone()),
            };
            let reason = error.to_string();
            if let Some(request_id) = &packet.request_id
                && let Some(waiter) = lock(&shared.pending).remove(request_id)
            {
                let _ = waiter.send(Err(error));
            }
            return match rejection.action {
                RejectAction::Ignore => None,
                RejectAction::ReplyAndClose => {
                    send_quietly(shared, rejection.error_packet(ids::mint("pkt_"), &packet)).await;
                    Some(reason)
                }
                _ => {
                    send_quietly(shared, rejection.error_packet(ids::mint("pkt_"), &packet)).await;
                    None
                }
            };
        }
    };
    if let Some(problems) = refused_message {
        tracing::warn!(%problems, "chat.message breaks the protocol");
        crate::im::refuse_chat_message(shared, &packet, &problems).await;
        return None;
    }
    dispatch(shared, packet, accepted).await;
    None
}

/// The validator's errors for a packet from the Connector (`packet`, decoded from `text`),
/// rule ids first, or `None`. The hot-path verdict runs first, on the packet already decoded
/// (no second decode, no `Value`); only a refused packet is parsed again for the report that
/// names its rules.
fn validation_errors(shared: &Shared, packet: &Packet, text: &str) -> Option<String> {
    let facts = shared.card_facts();
    let context = PacketContext { card: facts.as_deref(), sender: Some(Side::Connector) };
    let report = shared.validator.check_decoded(packet, text.as_bytes(), context).err()?;
    let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
    (!errors.is_empty()).then(|| errors.join("; "))
}

async fn dispatch(shared: &Arc<Shared>, packet: Packet, accepted: Accepted) {
    let answers = matches!(
        accepted,
        Accepted::Established(_)
            | Accepted::Reply(Some(_))
            | Accepted::ChannelOpened { .. }
            | Accepted::Error(Some(_))
    );
    // Every ack that carries a Descriptor updates the directory (after the Descriptor rules).
    let carried = match &packet.body {
        PacketBody::ChannelOpenAck(Some(ack)) => Some(&ack.connection_descriptor),
        PacketBody::AuthStartAck(Some(ack)) => ack.0.connection_descriptor.as_ref(),
        PacketBody::AuthStatusAck(Some(ack)) => ack.0.connection_descriptor.as_ref(),
        PacketBody::AuthLogoutAck(Some(ack)) => ack.connection_descriptor.as_ref(),
        PacketBody::DescriptorGetAck(Some(ack)) => Some(&ack.connection_descriptor),
        _ => None,
    };
    if packet.error.is_none()
        && let (Some(descriptor), Some(channel)) = (carried, &packet.connector_channel_id)
    {
        let outcome = lock(&shared.directory).apply_descriptor(channel, descriptor);
        if let Err(error) = outcome {
            tracing::warn!(%channel, %error, "a Descriptor in an ack was refused");
        }
    }
    if answers {
        if let Some(request_id) = &packet.request_id
            && let Some(waiter) = lock(&shared.pending).remove(request_id)
        {
            let _ = waiter.send(Ok(packet));
        }
        return;
    }
    let channel = packet.connector_channel_id.clone();
    match &packet.body {
        PacketBody::Ping(_) => {
            let pong = Packet::with_payload(ids::mint("pkt_"), Pong::default()).answering(&packet);
            send_quietly(shared, pong).await;
        }
        PacketBody::DescriptorPush(push) => {
            let Some(channel) = channel else { return };
            let outcome =
                lock(&shared.directory).apply_descriptor(&channel, &push.connection_descriptor);
            match outcome {
                Ok(()) => {
                    emit(
                        shared,
                        ClientEvent::DescriptorPushed {
                            channel,
                            descriptor: Box::new(push.connection_descriptor.clone()),
                        },
                    )
                    .await;
                }
                Err(error) => {
                    // The texts have a pushed Descriptor that breaks the rules dropped.
                    tracing::warn!(%channel, %error, "ignoring a Descriptor push that breaks the Descriptor rules");
                }
            }
        }
        PacketBody::ChatMessage(_) => crate::im::on_chat_message(shared, packet).await,
        PacketBody::ChatMessageAck(_) => crate::im::on_chat_message_ack(shared, packet).await,
        PacketBody::MessagePush(message) => {
            let message = message.clone();
            emit(shared, ClientEvent::MessagePush { channel, message }).await;
        }
        PacketBody::ToolProgressPush(progress) => {
            let progress = (**progress).clone();
            crate::invoke::on_progress(shared, &progress);
            emit(shared, ClientEvent::ToolProgress { channel, progress }).await;
        }
        PacketBody::Error(_) => {
            if let Some(error) = packet.error {
                emit(shared, ClientEvent::Error(error)).await;
            }
        }
        _ => {
            // A late ack whose request timed out: the session already paired or ignored it.
            tracing::debug!(packet_type = packet.type_str(), "ignoring packet");
        }
    }
}

#[allow(dead_code)]
fn assert_send() {
    fn is_send<T: Send>() {}
    is_send::<DataPlane>();
    is_send::<MessagePush>();
}
