//! The one module that talks to `xagent-client-runtime`: admission, the data plane, the
//! bridge's channel (opened once, remembered in the state directory, signed in with the given
//! flow), Tool invocation on the resolved channel, uploads and downloads, and the runtime's
//! events turned into [`Notice`]s for the MCP side. Everything MCP-specific lives elsewhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use xagent_client_runtime::{
    Admitted, BaseUrl, ClientConfig, ClientError, ClientEvent, ControlPlane, DataPlane,
    InboundMessage, admit,
};
use xagent_protocol_types::{
    AckStatus, AuthFlowType, AuthInput, AuthProgress, AuthStart, AuthStartAck, AuthStatus,
    AuthStatusAck, AuthStatusRequest, ChatMessage, ChatMessageAck, ConnectionDescriptor,
    ConnectionStatus, ConnectorCard, ConnectorChannelId, ConnectorId, ErrorCode, Secret,
    ToolInvoke, ToolInvokeContext, ToolProgressPush, ToolStatus, WireError,
};
use xagent_protocol_validate::AdmissionWindow;

use crate::files::{AllowedDirs, FileSource, MAX_UPLOAD_BYTES, safe_filename};
use crate::inbox::{Inbox, NewMessage, StoredFile};
use crate::projection::{CHANNEL_ARG, upload_args};

/// Largest inbound file the bridge downloads (32 MiB); larger ones are refused retryably.
pub const MAX_DOWNLOAD_BYTES: usize = 32 * 1024 * 1024;

const META_CHANNEL: &str = "channel";

/// Messages the inbox holds for the agent before it refuses more (retryably: the Connector
/// keeps them and delivers them later).
pub const MAX_PENDING_MESSAGES: u64 = 10_000;

/// How long a message stays in the inbox after it was handed to the agent (7 days).
pub const KEEP_HANDED_MILLIS: u64 = 7 * 24 * 3600 * 1000;

const META_CONNECTOR_ID: &str = "connector_id";

/// A failure shown to the agent as an MCP tool error: the protocol's stable code and a
/// sentence saying what to do.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolFailure {
    /// Stable code (the Connector's wire code when it answered with one).
    pub code: ErrorCode,
    /// What happened.
    pub message: String,
}

impl ToolFailure {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}

impl From<ClientError> for ToolFailure {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::Remote(WireError { code, message, .. }) => Self {
                message: message.unwrap_or_else(|| format!("the Connector answered {code}")),
                code,
            },
            other => Self { code: other.code(), message: other.to_string() },
        }
    }
}

/// Something the MCP side must tell its clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The set of callable Tools changed.
    ToolsChanged,
    /// A resource's content changed (its URI).
    ResourceUpdated(String),
    /// Resources appeared or disappeared.
    ResourcesChanged,
}

/// How the bridge starts.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// The Connector's Base URL.
    pub base_url: String,
    /// The system API key.
    pub api_key: Option<Secret>,
    /// The sign-in flow to run when the channel is not signed in.
    pub flow: Option<String>,
    /// The flow's form values (may hold secrets: never logged).
    pub inputs: AuthInput,
    /// Directories the agent may send files from.
    pub allowed: AllowedDirs,
}

/// The sign-in state of the bridge's channel, as the agent may see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SignIn {
    /// Last auth status.
    pub status: Option<AuthStatus>,
    /// The flow.
    pub flow: Option<String>,
    /// A QR flow's link, to show the user.
    pub qr_code_text: Option<String>,
    /// A QR flow's image (data URL), to show the user.
    pub qr_code_image: Option<String>,
    /// The Connector's message.
    pub message: Option<String>,
}

struct ChannelState {
    /// The id persisted in the state directory.
    persisted: ConnectorChannelId,
    descriptor: Option<ConnectionDescriptor>,
    sign_in: SignIn,
}

type ProgressSink = mpsc::UnboundedSender<ToolProgressPush>;

/// The bridge's connection to one Connector.
pub struct Link {
    control: ControlPlane,
    plane: DataPlane,
    admitted: Admitted,
    inbox: Arc<Inbox>,
    allowed: AllowedDirs,
    channel: Mutex<Option<ChannelState>>,
    notices: broadcast::Sender<Notice>,
    arrivals: watch::Sender<u64>,
    progress: Mutex<HashMap<(String, String), ProgressSink>>,
    sends: Mutex<HashMap<String, oneshot::Sender<ChatMessageAck>>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("card", &self.admitted.card.connector_card_id).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn mint(prefix: &str) -> String {
    format!("{prefix}{:032x}", rand::random::<u128>())
}

fn is_signed_in(descriptor: &ConnectionDescriptor) -> bool {
    !matches!(
        descriptor.connection.status,
        ConnectionStatus::Created
            | ConnectionStatus::Authenticating
            | ConnectionStatus::Expired
            | ConnectionStatus::Revoked
    )
}

/// Startup errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// The runtime refused or failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The inbox failed.
    #[error(transparent)]
    Inbox(#[from] crate::inbox::InboxError),
    /// Bad configuration.
    #[error("{0}")]
    Config(String),
}

impl Link {
    /// Admits the Connector, connects, opens (or reopens) the bridge's channel and signs in.
    /// A QR flow continues in the background; its link is offered through [`Link::sign_in`].
    pub async fn start(config: LinkConfig, inbox: Arc<Inbox>) -> Result<Arc<Self>, LinkError> {
        let base = BaseUrl::parse(&config.base_url).map_err(ClientError::from)?;
        let control = ControlPlane::new(base.clone(), config.api_key.clone());
        let admitted = admit(&control, &AdmissionWindow::default(), None).await?;
        let card = &admitted.card;
        tracing::info!(
            card = %card.connector_card_id,
            version = %card.connector.version,
            tools = card.tools.len(),
            "Connector admitted"
        );
        let mut client =
            ClientConfig::new(base, card.connector_card_id.clone(), card.supports.profiles.clone());
        client.api_key = config.api_key.clone();
        client.backoff.max_failures = None;
        client.request_timeout = Duration::from_secs(30);
        client.connector_id = inbox.meta(META_CONNECTOR_ID)?.map(ConnectorId::new);
        let (plane, events) = DataPlane::start(client);
        let connector_id =
            tokio::time::timeout(Duration::from_secs(30), plane.connected()).await.map_err(
                |_| ClientError::Timeout { expected: "connector.hello.ack", millis: 30_000 },
            )??;
        inbox.set_meta(META_CONNECTOR_ID, connector_id.as_str())?;
        let (notices, _) = broadcast::channel(256);
        let (arrivals, _) = watch::channel(0);
        let link = Arc::new(Self {
            control,
            plane,
            admitted,
            inbox,
            allowed: config.allowed.clone(),
            channel: Mutex::new(None),
            notices,
            arrivals,
            progress: Mutex::new(HashMap::new()),
            sends: Mutex::new(HashMap::new()),
        });
        let (inbound_tx, inbound_rx) = mpsc::channel(64);
        tokio::spawn(Arc::clone(&link).run_events(events, inbound_tx));
        tokio::spawn(Arc::clone(&link).run_inbound(inbound_rx));
        link.open_channel(&config).await?;
        Ok(link)
    }

    /// The admitted Card.
    pub fn card(&self) -> &ConnectorCard {
        &self.admitted.card
    }

    /// The Connector's primary Skill, if it has one.
    pub fn skill(&self) -> Option<&str> {
        self.admitted.skill.as_deref()
    }

    /// The durable inbox.
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// Subscribes to notices.
    pub fn notices(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    /// A counter that changes whenever a new message was stored.
    pub fn arrivals(&self) -> watch::Receiver<u64> {
        self.arrivals.subscribe()
    }

    /// The persisted id of the bridge's channel, once opened.
    pub fn channel_id(&self) -> Option<ConnectorChannelId> {
        lock(&self.channel).as_ref().map(|c| c.persisted.clone())
    }

    /// The sign-in state.
    pub fn sign_in(&self) -> SignIn {
        lock(&self.channel).as_ref().map(|c| c.sign_in.clone()).unwrap_or_default()
    }

    fn notify(&self, notice: Notice) {
        let _ = self.notices.send(notice);
    }

    async fn open_channel(self: &Arc<Self>, config: &LinkConfig) -> Result<(), LinkError> {
        let remembered = self.inbox.meta(META_CHANNEL)?.map(ConnectorChannelId::new);
        let opened = match &remembered {
            Some(id) => match self.plane.open_channel(Some(id)).await {
                Ok(ack) => ack,
                Err(error) => {
                    tracing::warn!(%error, "the remembered channel did not reopen; opening a new one");
                    self.plane.open_channel(None).await?
                }
            },
            None => self.plane.open_channel(None).await?,
        };
        // The channel keeps the id first persisted, even if the Connector issued a new one.
        let persisted = remembered
            .filter(|id| id == &opened.connector_channel_id)
            .unwrap_or_else(|| opened.connector_channel_id.clone());
        self.inbox.set_meta(META_CHANNEL, persisted.as_str())?;
        let signed_in = is_signed_in(&opened.connection_descriptor);
        *lock(&self.channel) = Some(ChannelState {
            persisted: persisted.clone(),
            descriptor: Some(opened.connection_descriptor),
            sign_in: SignIn {
                status: signed_in.then_some(AuthStatus::Authenticated),
                ..SignIn::default()
            },
        });
        self.plane.remember_channel(persisted.clone()).await;
        tracing::info!(channel = %persisted, signed_in, "channel open");
        if !signed_in {
            match &config.flow {
                Some(flow) => self.run_flow(&persisted, flow, &config.inputs).await?,
                None => tracing::warn!(
                    "the channel is not signed in and no --flow was given: the Connector's Tools stay unavailable"
                ),
            }
        }
        self.notify(Notice::ToolsChanged);
        Ok(())
    }

    async fn run_flow(
        self: &Arc<Self>,
        channel: &ConnectorChannelId,
        flow: &str,
        inputs: &AuthInput,
    ) -> Result<(), LinkError> {
        let Some(declared) = self.card().auth_flow(flow) else {
            let known: Vec<&str> = self.card().auth_flows.iter().map(|f| f.id.as_str()).collect();
            return Err(LinkError::Config(format!(
                "the Card has no auth flow {flow:?}; it declares {known:?}"
            )));
        };
        let qr = declared.flow_type == AuthFlowType::QrLogin;
        let mut start = AuthStart::new(flow);
        if !inputs.0.is_empty() {
            start = start.with_input(inputs.clone());
        }
        let AuthStartAck(progress) = self.plane.request(Some(channel), start).await?;
        self.apply_auth(flow, &progress);
        match progress.status {
            AuthStatus::Authenticated => Ok(()),
            AuthStatus::Pending | AuthStatus::Scanned if qr => {
                if let Some(link) = &progress.qr_code_text {
                    tracing::info!(%link, "open this link (or scan the QR code) to finish signing in; MCP clients find it in the sign-in resource and in connector_channels_list");
                }
                tokio::spawn(Arc::clone(self).poll_auth(
                    channel.clone(),
                    flow.to_owned(),
                    progress,
                ));
                Ok(())
            }
            other => Err(LinkError::Config(format!(
                "sign-in with {flow:?} ended {other}: {}",
                progress.message.as_deref().unwrap_or("no reason given")
            ))),
        }
    }

    fn apply_auth(&self, flow: &str, progress: &AuthProgress) {
        {
            let mut channel = lock(&self.channel);
            if let Some(channel) = channel.as_mut() {
                channel.sign_in = SignIn {
                    status: Some(progress.status.clone()),
                    flow: Some(flow.to_owned()),
                    qr_code_text: progress.qr_code_text.clone(),
                    qr_code_image: progress.qr_code_image.clone(),
                    message: progress.message.clone(),
                };
                if let Some(descriptor) = &progress.connection_descriptor {
                    channel.descriptor = Some(descriptor.clone());
                }
            }
        }
        self.notify(Notice::ResourcesChanged);
        self.notify(Notice::ResourceUpdated(crate::server::SIGN_IN_URI.to_owned()));
        self.notify(Notice::ToolsChanged);
    }

    /// Polls a QR flow until it ends (refreshing an expired code), as the Connector's
    /// `poll_interval_millis` asks.
    async fn poll_auth(
        self: Arc<Self>,
        channel: ConnectorChannelId,
        flow: String,
        mut progress: AuthProgress,
    ) {
        let Some(session) = progress.auth_session_id.clone() else {
            tracing::warn!("the QR flow returned no auth_session_id; cannot follow it");
            return;
        };
        loop {
            let wait = progress.poll_interval_millis.unwrap_or(2_000).clamp(500, 10_000);
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let mut request = AuthStatusRequest::new(session.clone()).with_flow_id(flow.as_str());
            if progress.status == AuthStatus::QrRefreshRequired {
                request = request.refresh();
            }
            match self.plane.request(Some(&channel), request).await {
                Ok(AuthStatusAck(next)) => {
                    let changed = next.status != progress.status
                        || next.qr_code_text != progress.qr_code_text;
                    progress = next;
                    if changed {
                        self.apply_auth(&flow, &progress);
                        tracing::info!(status = %progress.status, "sign-in progressed");
                    }
                    if progress.status.is_final() {
                        return;
                    }
                }
                Err(error) => tracing::warn!(%error, "auth.status failed; trying again"),
            }
        }
    }

    /// The Tools callable now: Card Tools the Descriptor lists as available, in Card order.
    pub fn available_tools(&self) -> Vec<&xagent_protocol_types::CardTool> {
        let channel = lock(&self.channel);
        let Some(descriptor) = channel.as_ref().and_then(|c| c.descriptor.as_ref()) else {
            return Vec::new();
        };
        xagent_client_runtime::project_tools(&self.admitted.card, descriptor)
            .into_iter()
            .filter_map(|f| self.admitted.card.tool(f.name.as_str()))
            .collect()
    }

    /// `connector_channels_list`: the bridge's channels as the agent may see them.
    pub fn channels_list(&self) -> Value {
        let channel = lock(&self.channel);
        let Some(channel) = channel.as_ref() else { return json!({ "channels": [] }) };
        let pending = self.inbox.pending(Some(channel.persisted.as_str())).unwrap_or(0);
        let descriptor = channel.descriptor.as_ref();
        let tools: Vec<Value> = descriptor
            .map(|d| {
                d.tools
                    .iter()
                    .map(
                        |t| json!({ "tool_id": t.tool_id, "status": t.status, "reason": t.reason }),
                    )
                    .collect()
            })
            .unwrap_or_default();
        let sign_in = &channel.sign_in;
        json!({ "channels": [{
            "connector_channel_id": channel.persisted,
            "connector_card_id": self.admitted.card.connector_card_id,
            "status": descriptor.map(|d| d.connection.status.clone()),
            "target": descriptor.map(|d| &d.target),
            "tools": tools,
            "pending_messages": pending,
            "messages_resource": crate::server::channel_uri(channel.persisted.as_str()),
            "sign_in": {
                "status": sign_in.status,
                "flow": sign_in.flow,
                "link": sign_in.qr_code_text,
                "message": sign_in.message,
            }
        }]})
    }

    /// Resolves the channel for a call: an explicit one must be the bridge's own; otherwise
    /// the bridge's channel when the Tool is available there.
    fn resolve(
        &self,
        tool_id: &str,
        explicit: Option<&str>,
    ) -> Result<ConnectorChannelId, ToolFailure> {
        let channel = lock(&self.channel);
        let Some(channel) = channel.as_ref() else {
            return Err(ToolFailure::new(
                ErrorCode::ConnectionNotFound,
                "the bridge has no open channel yet; try again in a moment",
            ));
        };
        if let Some(explicit) = explicit
            && explicit != channel.persisted.as_str()
        {
            return Err(ToolFailure::new(
                ErrorCode::ConnectorChannelNotOwned,
                format!(
                    "channel {explicit:?} is not one of this bridge's channels; see connector_channels_list"
                ),
            ));
        }
        let available = channel
            .descriptor
            .as_ref()
            .and_then(|d| d.tool(tool_id))
            .map(|t| (t.status == ToolStatus::Available, t.reason.clone()));
        match available {
            Some((true, _)) => Ok(channel.persisted.clone()),
            Some((false, reason)) => Err(ToolFailure::new(
                ErrorCode::ConnectorChannelUnavailable,
                format!(
                    "{tool_id} is not available now{}",
                    reason.map(|r| format!(": {r}")).unwrap_or_default()
                ),
            )),
            None => Err(ToolFailure::new(
                ErrorCode::ConnectorChannelUnavailable,
                format!("{tool_id} is not available on this channel"),
            )),
        }
    }

    async fn current(&self, persisted: &ConnectorChannelId) -> ConnectorChannelId {
        self.plane.current_channel(persisted).await.unwrap_or_else(|| persisted.clone())
    }

    /// Invokes a Card Tool with the model's arguments: resolves the channel, uploads every
    /// file reference argument on that channel, and returns the Tool's result. Progress pushes
    /// go to `progress` while the call runs.
    pub async fn invoke(
        &self,
        tool_id: &str,
        mut arguments: Map<String, Value>,
        progress: Option<ProgressSink>,
    ) -> Result<Value, ToolFailure> {
        let Some(tool) = self.admitted.card.tool(tool_id) else {
            return Err(ToolFailure::new(
                ErrorCode::ToolNotFound,
                format!("{tool_id} is not a Tool of this Connector; see tools/list"),
            ));
        };
        let explicit = arguments.get(CHANNEL_ARG).and_then(Value::as_str).map(str::to_owned);
        let persisted = self.resolve(tool_id, explicit.as_deref())?;
        let current = self.current(&persisted).await;
        for upload in upload_args(&tool.input_schema) {
            let Some(value) = arguments.get_mut(&upload.name) else { continue };
            if upload.array {
                let Some(items) = value.as_array_mut() else {
                    return Err(ToolFailure::new(
                        ErrorCode::InvalidArguments,
                        format!("{} must be an array of file references", upload.name),
                    ));
                };
                for item in items {
                    *item = Value::String(self.upload(&current, item, &upload.name).await?);
                }
            } else {
                *value = Value::String(self.upload(&current, value, &upload.name).await?);
            }
        }
        arguments.insert(CHANNEL_ARG.into(), Value::String(current.to_string()));
        let call_id = mint("call_mcp_");
        let key = (current.to_string(), tool_id.to_owned());
        if let Some(sink) = progress {
            lock(&self.progress).insert(key.clone(), sink);
        }
        let invoke = ToolInvoke::new(tool_id, arguments)
            .with_context(ToolInvokeContext::with_call_id(call_id.as_str()));
        let result = self.plane.request(Some(&current), invoke).await;
        lock(&self.progress).remove(&key);
        let ack = result?;
        Ok(ack.result.unwrap_or(Value::Null))
    }

    /// Uploads the file a reference names on `channel` and returns the Connector's `file_ref`.
    async fn upload(
        &self,
        channel: &ConnectorChannelId,
        reference: &Value,
        argument: &str,
    ) -> Result<String, ToolFailure> {
        let Some(reference) = reference.as_str() else {
            return Err(ToolFailure::new(
                ErrorCode::InvalidArguments,
                format!("{argument} must be a file reference (a string)"),
            ));
        };
        let invalid = |e: crate::files::FileRefError| ToolFailure::new(e.code(), e.to_string());
        let (filename, mime_type, path) = match self.allowed.resolve(reference).map_err(invalid)? {
            FileSource::Inbox(id) => {
                let file = self.inbox.file(&id).ok().flatten().ok_or_else(|| {
                    ToolFailure::new(
                        ErrorCode::FileNotFound,
                        format!("no file resource {reference:?}; see resources/list"),
                    )
                })?;
                let path = self.inbox.file_path(&file.id);
                (file.filename, file.mime_type, path)
            }
            FileSource::Disk(path) => {
                let name = path
                    .file_name()
                    .map(|n| safe_filename(&n.to_string_lossy()))
                    .unwrap_or_else(|| "file".into());
                let mime = mime_guess::from_path(&path).first_or_octet_stream().to_string();
                (name, mime, path)
            }
        };
        let bytes = tokio::fs::read(&path).await.map_err(|_| {
            ToolFailure::new(ErrorCode::FileNotFound, format!("{reference:?} cannot be read"))
        })?;
        if bytes.len() as u64 > MAX_UPLOAD_BYTES {
            return Err(ToolFailure::new(
                ErrorCode::PayloadTooLarge,
                format!("{reference:?} is larger than {MAX_UPLOAD_BYTES} bytes"),
            ));
        }
        let uploaded = self.control.upload(channel, &filename, &mime_type, bytes).await?;
        tracing::info!(%channel, file_ref = %uploaded.file_ref, "uploaded a file for a Tool call");
        Ok(uploaded.file_ref.to_string())
    }

    /// `connector_message_send`: queues an assistant message on an explicit channel of this
    /// bridge and waits (up to `wait`) for the Connector's ack.
    pub async fn send_message(
        &self,
        channel: &str,
        text: &str,
        wait: Duration,
    ) -> Result<Value, ToolFailure> {
        let persisted = {
            let state = lock(&self.channel);
            match state.as_ref() {
                Some(c) if c.persisted.as_str() == channel => {
                    if !c.descriptor.as_ref().is_some_and(is_signed_in) {
                        return Err(ToolFailure::new(
                            ErrorCode::ConnectionNotAuthenticated,
                            "the channel is not signed in; finish the sign-in first",
                        ));
                    }
                    c.persisted.clone()
                }
                _ => {
                    return Err(ToolFailure::new(
                        ErrorCode::ConnectorChannelNotOwned,
                        format!(
                            "channel {channel:?} is not one of this bridge's channels; see connector_channels_list"
                        ),
                    ));
                }
            }
        };
        if text.trim().is_empty() {
            return Err(ToolFailure::new(ErrorCode::InvalidArguments, "text must not be empty"));
        }
        let message_id = mint("msg_mcp_");
        let (sender, receiver) = oneshot::channel();
        lock(&self.sends).insert(message_id.clone(), sender);
        let message = ChatMessage::text(message_id.as_str(), text).created_at(now_millis());
        let current = self.current(&persisted).await;
        if let Err(error) = self.plane.send_chat_message(&current, message).await {
            lock(&self.sends).remove(&message_id);
            return Err(error.into());
        }
        match tokio::time::timeout(wait, receiver).await {
            Ok(Ok(ack)) => match ack.status {
                AckStatus::Accepted | AckStatus::Duplicate => {
                    Ok(json!({ "status": "accepted", "message_id": message_id }))
                }
                _ => Err(ToolFailure::new(
                    ack.code.unwrap_or(ErrorCode::TargetDeliveryFailed),
                    ack.message.unwrap_or_else(|| "the Connector rejected the message".into()),
                )),
            },
            _ => {
                lock(&self.sends).remove(&message_id);
                Ok(json!({ "status": "queued", "message_id": message_id,
                           "note": "not acknowledged yet; it is redelivered until the Connector accepts it" }))
            }
        }
    }

    async fn run_events(
        self: Arc<Self>,
        mut events: mpsc::UnboundedReceiver<ClientEvent>,
        inbound: mpsc::Sender<InboundMessage>,
    ) {
        while let Some(event) = events.recv().await {
            match event {
                ClientEvent::DescriptorPushed { channel, descriptor }
                | ClientEvent::ChannelReopened { current: channel, descriptor, .. } => {
                    self.on_descriptor(&channel, *descriptor).await;
                }
                ClientEvent::ChatMessage(message) => {
                    // The inbound task is gone only when the link is shutting down.
                    let Ok(()) = inbound.send(message).await else { return };
                }
                ClientEvent::ChatMessageAcked { ack, .. } => {
                    if let Some(waiter) = lock(&self.sends).remove(ack.message_id.as_str()) {
                        let _ = waiter.send(ack);
                    }
                }
                ClientEvent::ToolProgress { channel, progress } => {
                    let Some(channel) = channel else { continue };
                    let key = (channel.to_string(), progress.tool_id.to_string());
                    if let Some(sink) = lock(&self.progress).get(&key) {
                        let _ = sink.send(progress);
                    }
                }
                ClientEvent::Connected { connector_id } => {
                    tracing::info!(%connector_id, "connected to the Connector");
                    let _ = self.inbox.set_meta(META_CONNECTOR_ID, connector_id.as_str());
                }
                ClientEvent::Disconnected { reason } => {
                    tracing::warn!(%reason, "disconnected from the Connector; reconnecting");
                }
                ClientEvent::ChannelReopenFailed { channel, error } => {
                    tracing::warn!(%channel, %error, "the channel did not reopen");
                }
                ClientEvent::Error(error) => {
                    tracing::warn!(code = %error.code, message = ?error.message, "error from the Connector");
                }
                _ => {}
            }
        }
    }

    async fn on_descriptor(&self, channel: &ConnectorChannelId, descriptor: ConnectionDescriptor) {
        let persisted = self.channel_id();
        let ours = match &persisted {
            Some(p) => p == channel || self.current(p).await == *channel,
            None => false,
        };
        if !ours {
            return;
        }
        let before: Vec<String> =
            self.available_tools().iter().map(|t| t.tool_id.to_string()).collect();
        if let Some(state) = lock(&self.channel).as_mut() {
            tracing::info!(
                %channel,
                status = %descriptor.connection.status,
                "Descriptor updated"
            );
            state.descriptor = Some(descriptor);
        }
        let after: Vec<String> =
            self.available_tools().iter().map(|t| t.tool_id.to_string()).collect();
        if before != after {
            self.notify(Notice::ToolsChanged);
        }
    }

    async fn run_inbound(self: Arc<Self>, mut inbound: mpsc::Receiver<InboundMessage>) {
        let mut prune = tokio::time::interval(Duration::from_secs(3600));
        loop {
            tokio::select! {
                message = inbound.recv() => match message {
                    Some(message) => self.on_inbound(message).await,
                    None => return,
                },
                _ = prune.tick() => {
                    let cutoff = now_millis().saturating_sub(KEEP_HANDED_MILLIS);
                    match self.inbox.prune_taken(cutoff) {
                        Ok(0) => {}
                        Ok(pruned) => tracing::info!(pruned, "forgot messages handed more than 7 days ago"),
                        Err(error) => tracing::warn!(%error, "inbox pruning failed"),
                    }
                }
            }
        }
    }

    /// Stores an inbound message (files first) and only then accepts it.
    async fn on_inbound(&self, inbound: InboundMessage) {
        let Some(persisted) = self.channel_id() else {
            inbound.reject(ErrorCode::ChannelBusy, "the bridge is still starting", true);
            return;
        };
        let channel = persisted.to_string();
        let message_id = inbound.message.message_id.to_string();
        if self.inbox.pending(None).unwrap_or(0) >= MAX_PENDING_MESSAGES {
            inbound.reject(
                ErrorCode::CapacityExceeded,
                "the agent has not taken the messages waiting for it yet",
                true,
            );
            return;
        }
        match self.inbox.contains(&channel, &message_id) {
            Ok(true) => {
                tracing::debug!(%message_id, "redelivered message already stored");
                inbound.accept();
                return;
            }
            Ok(false) => {}
            Err(error) => {
                tracing::error!(%error, "inbox lookup failed");
                inbound.reject(
                    ErrorCode::ChannelBusy,
                    "the bridge cannot store messages now",
                    true,
                );
                return;
            }
        }
        let mut files = Vec::new();
        for (index, file) in inbound.message.files.iter().enumerate() {
            match self.download(&channel, &message_id, index, file).await {
                Ok(stored) => files.push(stored),
                Err(reason) => {
                    tracing::warn!(%message_id, %reason, "an inbound file could not be downloaded");
                    inbound.reject(ErrorCode::ChannelBusy, reason, true);
                    return;
                }
            }
        }
        let stored = self.inbox.store(&NewMessage {
            channel: &channel,
            message_id: &message_id,
            text: inbound.message.text.as_deref(),
            files: &files,
            created_at: inbound.message.created_at,
            received_at: now_millis(),
        });
        match stored {
            Ok(_) => {
                inbound.accept();
                tracing::info!(%message_id, files = files.len(), "inbound message stored");
                self.arrivals.send_modify(|n| *n += 1);
                self.notify(Notice::ResourceUpdated(crate::server::channel_uri(&channel)));
                if !files.is_empty() {
                    self.notify(Notice::ResourcesChanged);
                }
            }
            Err(error) => {
                tracing::error!(%error, "could not store an inbound message");
                inbound.reject(ErrorCode::ChannelBusy, "the bridge could not store it", true);
            }
        }
    }

    async fn download(
        &self,
        channel: &str,
        message_id: &str,
        index: usize,
        file: &xagent_protocol_types::ChatFile,
    ) -> Result<StoredFile, String> {
        use sha2::{Digest, Sha256};
        let Some(url) = file.download_url.as_deref() else {
            return Err(format!("file {} has no download_url", file.file_ref));
        };
        if file.byte_size.is_some_and(|size| size > MAX_DOWNLOAD_BYTES as u64) {
            return Err(format!("file {} is larger than the bridge takes", file.file_ref));
        }
        let downloaded = tokio::time::timeout(Duration::from_secs(60), self.control.download(url))
            .await
            .map_err(|_| "the download timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        if downloaded.bytes.len() > MAX_DOWNLOAD_BYTES {
            return Err(format!("file {} is larger than the bridge takes", file.file_ref));
        }
        let digest = Sha256::digest(format!("{channel}\n{message_id}\n{index}"));
        let id = format!("f_{}", hex::encode(&digest[..12]));
        let path = self.inbox.file_path(&id);
        let bytes = downloaded.bytes;
        let byte_size = bytes.len() as u64;
        let write_path = path.clone();
        tokio::task::spawn_blocking(move || write_durably(&write_path, &bytes))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("could not write the file: {e}"))?;
        let mime_type = file
            .mime_type
            .clone()
            .or(downloaded.content_type)
            .unwrap_or_else(|| "application/octet-stream".into());
        let filename =
            safe_filename(file.filename.as_deref().unwrap_or_else(|| file.file_ref.as_str()));
        Ok(StoredFile { id, filename, mime_type, byte_size })
    }
}

/// Writes a file and syncs it (and its directory) before returning.
fn write_durably(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let temporary = path.with_extension("partial");
    {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn now_millis() -> u64 {
    use xagent_protocol_types::Clock;
    xagent_protocol_types::SystemClock.now_millis()
}
