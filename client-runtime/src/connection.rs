//! The data-plane client: one WebSocket to a Connector, hello first, requests correlated with
//! their acks by `request_id`, automatic reconnect with jittered backoff, persisted channels
//! reopened after every reconnect, and everything the Connector pushes delivered as
//! [`ClientEvent`]s.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::{Mutex, mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use xagent_protocol_types::{
    ChannelOpen, ChannelOpenAck, ChatMessage, ChatMessageAck, ConnectionDescriptor,
    ConnectorCardId, ConnectorChannelId, ConnectorHello, ConnectorHelloAck, ConnectorId,
    MessagePush, Packet, PacketBody, Payload, Pong, ProfileId, Request, RequestId, Role,
    SUBPROTOCOL, Secret, ToolProgressPush, WireError,
};

use crate::im::ImState;
use crate::{Backoff, BaseUrl, ClientError, ids};

/// How to reach and greet a Connector.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The Connector's Base URL.
    pub base_url: BaseUrl,
    /// The system API key, sent on the upgrade as `Authorization: Bearer`.
    pub api_key: Option<Secret>,
    /// The Card id the Connector must have.
    pub connector_card_id: ConnectorCardId,
    /// Profiles this xAgent supports (sent in every hello).
    pub supported_profiles: Vec<ProfileId>,
    /// The `connector_id` of an earlier session, to resume its runtime state.
    pub connector_id: Option<ConnectorId>,
    /// How long to wait for an ack.
    pub request_timeout: Duration,
    /// Reconnect policy.
    pub backoff: Backoff,
    /// Largest text frame accepted from the Connector.
    pub max_frame_bytes: usize,
    /// Sees every text frame in both directions (for tools that print the traffic).
    pub tap: Option<PacketTap>,
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
pub struct PacketTap(std::sync::Arc<TapFn>);

impl PacketTap {
    /// Wraps a callback.
    pub fn new(tap: impl Fn(TapDirection, &str) + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(tap))
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
    /// Defaults for a Connector: 10 s request timeout, default backoff, 1 MiB frames.
    pub fn new(
        base_url: BaseUrl,
        connector_card_id: impl Into<ConnectorCardId>,
        supported_profiles: Vec<ProfileId>,
    ) -> Self {
        Self {
            base_url,
            api_key: None,
            connector_card_id: connector_card_id.into(),
            supported_profiles,
            connector_id: None,
            request_timeout: Duration::from_secs(10),
            backoff: Backoff::default(),
            max_frame_bytes: 1 << 20,
            tap: None,
        }
    }

    /// Sets the system API key.
    #[must_use]
    pub fn with_api_key(mut self, key: Secret) -> Self {
        self.api_key = Some(key);
        self
    }
}

/// The connection's state, observable through [`DataPlane::state`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionState {
    /// Connecting or waiting to reconnect.
    Connecting {
        /// Failed attempts in a row so far.
        failures: u32,
    },
    /// Hello completed.
    Connected {
        /// The runtime id the Connector issued.
        connector_id: ConnectorId,
    },
    /// The reconnect policy is exhausted or the client was closed.
    Stopped {
        /// Why.
        reason: String,
    },
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
    /// The Connector returned a different `connector_id` than before: its runtime state was
    /// rebuilt, and this client replaced its view of it (pending requests failed, channels
    /// reopened).
    ConnectorReplaced {
        /// The earlier id.
        previous: ConnectorId,
        /// The new id.
        current: ConnectorId,
    },
    /// The socket closed; a reconnect follows unless the policy is exhausted.
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
    /// `connection.descriptor.push`.
    DescriptorPushed {
        /// The channel.
        channel: ConnectorChannelId,
        /// The new Descriptor.
        descriptor: Box<ConnectionDescriptor>,
    },
    /// An IM v2 user message, not seen before on this channel. Answer it with
    /// [`InboundMessage::accept`] once its effect is done, or reject it.
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
    /// The reconnect policy gave up.
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
    ) -> Self {
        Self { channel, message, responder: Some(responder) }
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

type Writer = mpsc::Sender<Message>;

pub(crate) struct Shared {
    pub(crate) config: ClientConfig,
    writer: Mutex<Option<Writer>>,
    pending: Mutex<HashMap<RequestId, oneshot::Sender<Packet>>>,
    /// Remembered channels: the id xAgent persisted -> the id currently open.
    channels: Mutex<BTreeMap<ConnectorChannelId, ConnectorChannelId>>,
    state: watch::Sender<ConnectionState>,
    pub(crate) events: mpsc::UnboundedSender<ClientEvent>,
    pub(crate) im: Mutex<ImState>,
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

impl DataPlane {
    /// Starts connecting in the background and returns the handle and the event stream.
    /// Wait for [`ConnectionState::Connected`] with [`DataPlane::connected`].
    pub fn start(config: ClientConfig) -> (Self, mpsc::UnboundedReceiver<ClientEvent>) {
        let (events, receiver) = mpsc::unbounded_channel();
        let (state_sender, state) = watch::channel(ConnectionState::Connecting { failures: 0 });
        let shared = Arc::new(Shared {
            im: Mutex::new(ImState::new()),
            config,
            writer: Mutex::new(None),
            pending: Mutex::new(HashMap::new()),
            channels: Mutex::new(BTreeMap::new()),
            state: state_sender,
            events,
        });
        let pump = tokio::spawn(crate::im::run_pump(shared.clone()));
        let supervisor = shared.clone();
        let task = tokio::spawn(async move {
            supervise(supervisor).await;
            pump.abort();
        });
        (Self { shared, state, task: Arc::new(task) }, receiver)
    }

    /// The current connection state.
    pub fn state(&self) -> ConnectionState {
        self.state.borrow().clone()
    }

    /// Waits until hello has completed (or the client stopped) and returns the connector id.
    pub async fn connected(&self) -> Result<ConnectorId, ClientError> {
        let mut state = self.state.clone();
        loop {
            match &*state.borrow_and_update() {
                ConnectionState::Connected { connector_id } => return Ok(connector_id.clone()),
                ConnectionState::Stopped { .. } => return Err(ClientError::Closed),
                ConnectionState::Connecting { .. } => {}
            }
            state.changed().await.map_err(|_| ClientError::Closed)?;
        }
    }

    /// Sends a request and waits for its ack, returning the ack payload. An ack that carries
    /// an `error`, or an `error` packet answering the request, becomes [`ClientError::Remote`].
    pub async fn request<R: Request>(
        &self,
        channel: Option<&ConnectorChannelId>,
        payload: R,
    ) -> Result<R::Ack, ClientError>
    where
        R::Ack: Clone,
    {
        let packet = self.request_packet(channel, payload.into_body()).await?;
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

    /// Sends a request body and returns the answering packet as it arrived.
    pub async fn request_packet(
        &self,
        channel: Option<&ConnectorChannelId>,
        body: PacketBody,
    ) -> Result<Packet, ClientError> {
        let request_id = RequestId::new(ids::mint("req_"));
        let expected = match body.packet_type().spec().map(|s| s.role) {
            Some(Role::Request { ack }) => ack,
            _ => {
                return Err(ClientError::Protocol(format!("{} is not a request", body.type_str())));
            }
        };
        let packet = Packet::new(ids::mint("pkt_"), body)
            .request_id(request_id.clone())
            .maybe_channel(channel.cloned())
            .time(now_millis());
        let (sender, receiver) = oneshot::channel();
        self.shared.pending.lock().await.insert(request_id.clone(), sender);
        if let Err(error) = self.send(&packet).await {
            self.shared.pending.lock().await.remove(&request_id);
            return Err(error);
        }
        let timeout = self.shared.config.request_timeout;
        match tokio::time::timeout(timeout, receiver).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(ClientError::NotConnected),
            Err(_) => {
                self.shared.pending.lock().await.remove(&request_id);
                Err(ClientError::Timeout { expected, millis: timeout.as_millis() as u64 })
            }
        }
    }

    /// Sends one packet as it is.
    pub async fn send(&self, packet: &Packet) -> Result<(), ClientError> {
        send_on(&self.shared, packet).await
    }

    /// Sends raw text (for conformance probes that need malformed input).
    pub async fn send_raw(&self, text: String) -> Result<(), ClientError> {
        if let Some(tap) = &self.shared.config.tap {
            tap.see(TapDirection::Sent, &text);
        }
        let writer = self.shared.writer.lock().await.clone().ok_or(ClientError::NotConnected)?;
        writer.send(Message::Text(text.into())).await.map_err(|_| ClientError::NotConnected)
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

    /// Remembers a channel so it is reopened after every reconnect.
    pub async fn remember_channel(&self, channel: ConnectorChannelId) {
        self.shared.channels.lock().await.insert(channel.clone(), channel);
    }

    /// Forgets a channel.
    pub async fn forget_channel(&self, channel: &ConnectorChannelId) {
        self.shared
            .channels
            .lock()
            .await
            .retain(|persisted, current| persisted != channel && current != channel);
    }

    /// The current id of a remembered channel (it changes when the Connector did not
    /// recognise the old one on reopen).
    pub async fn current_channel(
        &self,
        persisted: &ConnectorChannelId,
    ) -> Option<ConnectorChannelId> {
        self.shared.channels.lock().await.get(persisted).cloned()
    }

    /// Remembered channels as (persisted id, current id).
    pub async fn channels(&self) -> Vec<(ConnectorChannelId, ConnectorChannelId)> {
        self.shared.channels.lock().await.iter().map(|(a, b)| (a.clone(), b.clone())).collect()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Stops the client: closes the socket and ends reconnecting.
    pub async fn close(&self) {
        self.task.abort();
        if let Some(writer) = self.shared.writer.lock().await.take() {
            let _ = writer.send(Message::Close(None)).await;
        }
        let _ = self.shared.state.send(ConnectionState::Stopped { reason: "closed".into() });
        fail_pending(&self.shared).await;
    }
}

/// Reads events until one satisfies `want`, skipping the others; `None` when `within` passes
/// first or the client stopped. For callers that wait for one kind of event (a reconnect, an
/// ack) on the stream [`DataPlane::start`] returns.
pub async fn next_event_matching(
    events: &mut mpsc::UnboundedReceiver<ClientEvent>,
    within: Duration,
    mut want: impl FnMut(&ClientEvent) -> bool,
) -> Option<ClientEvent> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Some(event)) if want(&event) => return Some(event),
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => return None,
        }
    }
}

pub(crate) async fn send_on(shared: &Shared, packet: &Packet) -> Result<(), ClientError> {
    let text = packet.to_json().map_err(|e| ClientError::Protocol(e.to_string()))?;
    if let Some(tap) = &shared.config.tap {
        tap.see(TapDirection::Sent, &text);
    }
    let writer = shared.writer.lock().await.clone().ok_or(ClientError::NotConnected)?;
    writer.send(Message::Text(text.into())).await.map_err(|_| ClientError::NotConnected)
}

pub(crate) fn now_millis() -> u64 {
    use xagent_protocol_types::Clock;
    xagent_protocol_types::SystemClock.now_millis()
}

async fn fail_pending(shared: &Shared) {
    // Dropping the senders wakes every waiter with NotConnected.
    shared.pending.lock().await.clear();
}

fn emit(shared: &Shared, event: ClientEvent) {
    let _ = shared.events.send(event);
}

/// The reconnect loop.
async fn supervise(shared: Arc<Shared>) {
    let mut failures = 0u32;
    let mut known_connector: Option<ConnectorId> = shared.config.connector_id.clone();
    loop {
        let _ = shared.state.send(ConnectionState::Connecting { failures });
        match run_connection(&shared, &mut known_connector).await {
            Ok(reason) => {
                failures = 0;
                emit(&shared, ClientEvent::Disconnected { reason });
            }
            Err(error) => {
                failures += 1;
                tracing::warn!(failures, error = %error, "data-plane connection failed");
                emit(&shared, ClientEvent::Disconnected { reason: error.to_string() });
            }
        }
        *shared.writer.lock().await = None;
        fail_pending(&shared).await;
        shared.im.lock().await.on_disconnect(now_millis());
        if shared.config.backoff.exhausted(failures) {
            let reason = format!("gave up after {failures} failed attempts");
            let _ = shared.state.send(ConnectionState::Stopped { reason: reason.clone() });
            emit(&shared, ClientEvent::Stopped { reason });
            return;
        }
        let delay = shared.config.backoff.delay(failures.max(1));
        tokio::time::sleep(delay).await;
    }
}

/// One socket's life: connect, hello, reopen channels, read until it closes. Returns `Ok` with
/// the close reason when hello had completed (a healthy session that ended), `Err` otherwise.
async fn run_connection(
    shared: &Arc<Shared>,
    known_connector: &mut Option<ConnectorId>,
) -> Result<String, ClientError> {
    let config = &shared.config;
    let url = config.base_url.ws_url();
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| ClientError::Protocol(format!("bad WebSocket URL: {e}")))?;
    request.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_static(SUBPROTOCOL));
    if let Some(key) = &config.api_key {
        let value = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
            .map_err(|_| ClientError::Protocol("the API key is not a valid header value".into()))?;
        request.headers_mut().insert("Authorization", value);
    }
    let ws_config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(config.max_frame_bytes))
        .max_frame_size(Some(config.max_frame_bytes));
    let (socket, response) =
        tokio_tungstenite::connect_async_with_config(request, Some(ws_config), false)
            .await
            .map_err(|e| match e {
                tokio_tungstenite::tungstenite::Error::Http(response)
                    if matches!(response.status().as_u16(), 401 | 403) =>
                {
                    ClientError::Unauthorized {
                        endpoint: url.clone(),
                        status: response.status().as_u16(),
                    }
                }
                other => {
                    ClientError::Transport { endpoint: url.clone(), reason: other.to_string() }
                }
            })?;
    let echoed = response.headers().get("Sec-WebSocket-Protocol").and_then(|v| v.to_str().ok());
    if echoed != Some(SUBPROTOCOL) {
        return Err(ClientError::Protocol(format!(
            "the Connector did not select subprotocol {SUBPROTOCOL} (got {echoed:?})"
        )));
    }
    let (mut sink, mut stream) = socket.split();
    let (writer, mut outgoing) = mpsc::channel::<Message>(256);
    let write_task = tokio::spawn(async move {
        while let Some(message) = outgoing.recv().await {
            if sink.send(message).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    *shared.writer.lock().await = Some(writer.clone());

    // Hello.
    let mut hello =
        ConnectorHello::new(config.connector_card_id.clone(), config.supported_profiles.clone());
    if let Some(id) = known_connector.as_ref() {
        hello = hello.with_connector_id(id.clone());
    }
    let hello_request = RequestId::new(ids::mint("req_"));
    let hello_packet = Packet::with_payload(ids::mint("pkt_"), hello)
        .request_id(hello_request.clone())
        .time(now_millis());
    send_on(shared, &hello_packet).await?;
    let ack = tokio::time::timeout(config.request_timeout, async {
        while let Some(frame) = stream.next().await {
            let frame = frame.map_err(|e| ClientError::Transport {
                endpoint: url.clone(),
                reason: e.to_string(),
            })?;
            let Message::Text(text) = frame else { continue };
            if let Some(tap) = &config.tap {
                tap.see(TapDirection::Received, text.as_str());
            }
            let packet = Packet::decode_str(text.as_str())
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
            if packet.request_id.as_ref() == Some(&hello_request) || packet.type_str() == "error" {
                return Ok(packet);
            }
        }
        Err(ClientError::NotConnected)
    })
    .await
    .map_err(|_| ClientError::Timeout {
        expected: "connector.hello.ack",
        millis: config.request_timeout.as_millis() as u64,
    })??;
    if let Some(error) = ack.error {
        write_task.abort();
        return Err(ClientError::Remote(error));
    }
    let Some(hello_ack) = ack.payload::<ConnectorHelloAck>().cloned() else {
        write_task.abort();
        return Err(ClientError::Protocol(format!(
            "expected connector.hello.ack, got {}",
            ack.type_str()
        )));
    };
    if hello_ack.connector_card_id != config.connector_card_id {
        write_task.abort();
        return Err(ClientError::NotAdmissible(format!(
            "hello.ack names card {}, expected {}",
            hello_ack.connector_card_id, config.connector_card_id
        )));
    }
    if let Err(error) = xagent_protocol_validate::AdmissionWindow::default()
        .admit(hello_ack.protocol_version.as_deref())
    {
        write_task.abort();
        return Err(ClientError::NotAdmissible(error.to_string()));
    }
    let connector_id = hello_ack.connector_id.clone();
    if let Some(previous) = known_connector.replace(connector_id.clone())
        && previous != connector_id
    {
        emit(shared, ClientEvent::ConnectorReplaced { previous, current: connector_id.clone() });
    }
    let _ = shared.state.send(ConnectionState::Connected { connector_id: connector_id.clone() });
    emit(shared, ClientEvent::Connected { connector_id });

    // Reopen remembered channels while the reader runs.
    let reopen = tokio::spawn(reopen_channels(shared.clone()));

    let reason = loop {
        let Some(frame) = stream.next().await else {
            break "the Connector closed the socket".to_owned();
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => break format!("socket error: {error}"),
        };
        match frame {
            Message::Text(text) => handle_text(shared, text.as_str()).await,
            Message::Close(close) => {
                break match close {
                    Some(frame) => format!(
                        "closed by the Connector ({}: {})",
                        u16::from(frame.code),
                        frame.reason
                    ),
                    None => "closed by the Connector".to_owned(),
                };
            }
            Message::Binary(_) => tracing::warn!("ignoring a binary frame from the Connector"),
            _ => {}
        }
    };
    reopen.abort();
    write_task.abort();
    Ok(reason)
}

async fn reopen_channels(shared: Arc<Shared>) {
    let remembered: Vec<(ConnectorChannelId, ConnectorChannelId)> =
        shared.channels.lock().await.iter().map(|(a, b)| (a.clone(), b.clone())).collect();
    let plane = RequestOnly { shared: shared.clone() };
    for (persisted, current) in remembered {
        match plane.open(&current).await {
            Ok(ack) => {
                let new_id = ack.connector_channel_id.clone();
                shared.channels.lock().await.insert(persisted.clone(), new_id.clone());
                shared.im.lock().await.on_channel_reopened(&current, &new_id, now_millis());
                emit(
                    &shared,
                    ClientEvent::ChannelReopened {
                        previous: current,
                        current: new_id,
                        descriptor: Box::new(ack.connection_descriptor),
                    },
                );
            }
            Err(error) => emit(
                &shared,
                ClientEvent::ChannelReopenFailed { channel: current, error: error.to_string() },
            ),
        }
    }
    crate::im::pump(&shared).await;
}

/// Request helper usable from inside the connection task.
struct RequestOnly {
    shared: Arc<Shared>,
}

impl RequestOnly {
    async fn open(&self, channel: &ConnectorChannelId) -> Result<ChannelOpenAck, ClientError> {
        let request_id = RequestId::new(ids::mint("req_"));
        let packet = Packet::with_payload(ids::mint("pkt_"), ChannelOpen::default())
            .request_id(request_id.clone())
            .channel(channel.clone())
            .time(now_millis());
        let (sender, receiver) = oneshot::channel();
        self.shared.pending.lock().await.insert(request_id.clone(), sender);
        send_on(&self.shared, &packet).await?;
        let timeout = self.shared.config.request_timeout;
        let answer = tokio::time::timeout(timeout, receiver)
            .await
            .map_err(|_| ClientError::Timeout {
                expected: "channel.open.ack",
                millis: timeout.as_millis() as u64,
            })?
            .map_err(|_| ClientError::NotConnected)?;
        if let Some(error) = answer.error {
            return Err(ClientError::Remote(error));
        }
        answer
            .payload::<ChannelOpenAck>()
            .cloned()
            .ok_or_else(|| ClientError::Protocol("channel.open.ack without payload".into()))
    }
}

async fn handle_text(shared: &Arc<Shared>, text: &str) {
    if let Some(tap) = &shared.config.tap {
        tap.see(TapDirection::Received, text);
    }
    let packet = match Packet::decode_str(text) {
        Ok(packet) => packet,
        Err(error) => {
            tracing::warn!(error = %error, "invalid packet from the Connector");
            let reply = Packet::error(ids::mint("pkt_"), error.to_wire())
                .maybe_channel(error.ids.connector_channel_id.clone())
                .time(now_millis());
            let reply = match &error.ids.request_id {
                Some(id) => reply.request_id(id.clone()),
                None => reply,
            };
            let _ = send_on(shared, &reply).await;
            return;
        }
    };
    // Acks (and error packets) answering a pending request.
    let answers_request =
        matches!(packet.packet_type().spec().map(|s| s.role), Some(Role::Ack { .. }))
            || packet.type_str() == "error";
    if answers_request
        && let Some(request_id) = &packet.request_id
        && let Some(waiter) = shared.pending.lock().await.remove(request_id)
    {
        let _ = waiter.send(packet);
        return;
    }
    let channel = packet.connector_channel_id.clone();
    match &packet.body {
        PacketBody::Ping(_) => {
            let pong = Packet::with_payload(ids::mint("pkt_"), Pong::default())
                .answering(&packet)
                .time(now_millis());
            let _ = send_on(shared, &pong).await;
        }
        PacketBody::DescriptorPush(push) => {
            if let Some(channel) = channel {
                if push.connection_descriptor.connection.connector_channel_id != channel {
                    tracing::warn!(%channel, "ignoring a Descriptor push whose identity does not match its channel");
                    return;
                }
                emit(
                    shared,
                    ClientEvent::DescriptorPushed {
                        channel,
                        descriptor: Box::new(push.connection_descriptor.clone()),
                    },
                );
            }
        }
        PacketBody::ChatMessage(_) => crate::im::on_chat_message(shared, packet).await,
        PacketBody::ChatMessageAck(_) => crate::im::on_chat_message_ack(shared, packet).await,
        PacketBody::MessagePush(message) => {
            emit(shared, ClientEvent::MessagePush { channel, message: Box::new(message.clone()) })
        }
        PacketBody::ToolProgressPush(progress) => {
            emit(shared, ClientEvent::ToolProgress { channel, progress: progress.clone() })
        }
        PacketBody::Error(_) => {
            if let Some(error) = packet.error {
                emit(shared, ClientEvent::Error(error));
            }
        }
        PacketBody::Unknown { packet_type, .. } => {
            let reply = Packet::error(
                ids::mint("pkt_"),
                WireError::unsupported_packet(format!("xAgent does not handle {packet_type}")),
            )
            .answering(&packet)
            .time(now_millis());
            let _ = send_on(shared, &reply).await;
        }
        _ => {
            // A late ack whose request timed out, or a packet the Connector must not send.
            tracing::debug!(packet_type = packet.type_str(), "ignoring packet");
        }
    }
}

impl DataPlane {
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

#[allow(dead_code)]
fn assert_send() {
    fn is_send<T: Send>() {}
    is_send::<DataPlane>();
    is_send::<MessagePush>();
}
