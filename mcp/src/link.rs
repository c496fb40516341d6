//! The one module that talks to `xagent-client-runtime`: admission, the data plane with the
//! runtime's durable store, the bridge's channel (opened for the bridge's one xAgent user,
//! remembered by the runtime, signed in with the runtime's sign-in driver), Tool calls through
//! the runtime's section 10.1 resolution and upload-reference substitution, the built-in
//! channel Tools, the file source and sink the runtime calls, and the runtime's events turned
//! into [`Notice`]s for the MCP side. Everything MCP-specific lives elsewhere.
//!
//! The bridge keeps none of the runtime's facts: the admitted Card is the data plane's
//! ([`DataPlane::card`], re-admitted by [`DataPlane::monitor_health`]), a QR sign-in is
//! followed by [`DataPlane::sign_in`], and a sent message's ack is asked of
//! [`DataPlane::settled_ack`].
//!
//! **Which channel a Card Tool runs on**: the one section 10.1 resolves for the bridge's user
//! (no session binding: the first channel of the user where the Tool is available now). The
//! model's `connector_channel_id` argument selects nothing; a value the model gives is passed
//! on unchanged, and a missing one is filled with the resolved channel (as a model following
//! the Card's schema would pass it). To act on a channel the agent chose, it calls
//! `connector_message_send`, which checks the explicit channel.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, mpsc, watch};
use xagent_client_runtime::prelude::*;
use xagent_client_runtime::{FunctionDeclaration, HealthMonitor, SignIn as Flow, builtin_tools};
use xagent_protocol_types::{
    AckStatus, AuthProgress, AuthStatus, ChatMessageAck, ConnectorCard, MessageId,
    PROFILE_DEVICE_V1, PROFILE_IM_V2, ToolProgressPush, WireError,
};
use xagent_storage_postgres::{DatabaseUrl, Pool, PoolOptions};

use crate::bridge_files::BridgeFiles;
use crate::files::{AllowedDirs, safe_filename};
use crate::inbox::{Inbox, NewMessage, SQLITE_FILE, StoredFile};
use crate::uris::{SIGN_IN_URI, channel_uri};

pub use crate::bridge_files::MAX_DOWNLOAD_BYTES;

/// Messages the inbox holds for the agent before it refuses more (retryably: the Connector
/// keeps them and delivers them later).
pub const MAX_PENDING_MESSAGES: u64 = 10_000;

/// How long a message stays in the inbox after it was handed to the agent (7 days).
pub const KEEP_HANDED_MILLIS: u64 = 7 * 24 * 3600 * 1000;

/// The Profiles the bridge handles (announced in hello): IM v2 messages into the inbox and
/// out with `connector_message_send`, and the Tools of device Connectors.
pub const BRIDGE_PROFILES: [&str; 2] = [PROFILE_IM_V2, PROFILE_DEVICE_V1];

/// The xAgent user the bridge acts as: one bridge, one user, its channels.
pub const OWNER: &str = "mcp-bridge";

/// A failure shown to the agent as an MCP tool error: the protocol's stable code and a
/// sentence saying what to do.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolFailure {
    /// Stable code (the Connector's or the runtime's).
    pub code: ErrorCode,
    /// What happened.
    pub message: String,
}

impl ToolFailure {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}

impl From<WireError> for ToolFailure {
    fn from(WireError { code, message, .. }: WireError) -> Self {
        Self { message: message.unwrap_or_else(|| format!("the Connector answered {code}")), code }
    }
}

impl From<ClientError> for ToolFailure {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::Remote(wire)
            | ClientError::Refused(wire)
            | ClientError::Withheld(wire) => wire.into(),
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
    /// The prompt (the Connector's Skill) changed.
    PromptsChanged,
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
    /// How often `/health` is probed (a changed Card or Skill is refetched and re-admitted).
    pub health_interval: Duration,
    /// Where inbound files may be downloaded from and how large they may be (default: the
    /// Connector's own origin, [`MAX_DOWNLOAD_BYTES`]).
    pub download: DownloadPolicy,
    /// The certificate authorities trusted for an `https` Base URL (default: the system's).
    pub tls: TlsTrust,
    /// Keep the runtime's state (remembered channel, outbox, idempotency) in this PostgreSQL
    /// database instead of SQLite in the state directory; several bridges of one Card may
    /// share it, and only the holder of the Card's holder lease connects (the others wait).
    /// The bridge's inbox (messages and file bytes) is in the same database, under the Card,
    /// so the bridge that takes over finds every message the one before it accepted.
    pub database_url: Option<DatabaseUrl>,
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

type ProgressSink = mpsc::UnboundedSender<ToolProgressPush>;

/// The bridge's connection to one Connector.
pub struct Link {
    plane: DataPlane,
    /// The Connector's primary Skill; replaced when the health monitor re-admits a changed
    /// Connector (the Card itself is the data plane's).
    skill: std::sync::RwLock<Option<String>>,
    /// Re-admits a changed Connector (always started by [`Link::start`]).
    health: Option<HealthMonitor>,
    inbox: Arc<Inbox>,
    /// The persisted id of the bridge's channel.
    channel: Mutex<Option<ConnectorChannelId>>,
    sign_in: Mutex<SignIn>,
    notices: broadcast::Sender<Notice>,
    arrivals: watch::Sender<u64>,
    /// Progress sinks of running Tool calls, by `tool_id` (a push names its Tool, and the
    /// bridge's user signs in one channel).
    progress: Mutex<HashMap<String, ProgressSink>>,
    /// The Tool names last announced to MCP clients.
    announced: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let card = self.card().map(|card| card.connector_card_id.clone());
        f.debug_struct("Link").field("card", &card).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// One pool for the runtime's store and the inbox, in the database of
/// [`LinkConfig::database_url`].
async fn shared_pool(url: &DatabaseUrl, state_dir: &Path) -> Result<Pool, LinkError> {
    tracing::info!(database = %url, "the runtime's state and the inbox are in PostgreSQL");
    if state_dir.join(SQLITE_FILE).is_file() {
        tracing::warn!(
            state_dir = %state_dir.display(),
            "the state directory holds an inbox of its own, which a bridge on PostgreSQL does not read: move it with xagent-connector migrate-state"
        );
    }
    let options = PoolOptions::default().with_application_name("xagent-mcp");
    let pool = xagent_storage_postgres::connect(url, options)
        .await
        .map_err(crate::inbox::InboxError::from)?;
    Ok(pool)
}

impl Link {
    /// Admits the Connector, opens the runtime's durable store and the inbox (in `state_dir`,
    /// or in the database of [`LinkConfig::database_url`] under the admitted Card), connects,
    /// opens (or finds the remembered) channel and signs in. A QR flow continues in the
    /// background; its link is offered through [`Link::sign_in`].
    pub async fn start(config: LinkConfig, state_dir: &Path) -> Result<Arc<Self>, LinkError> {
        let mut xagent = Xagent::connect(config.base_url.as_str(), config.api_key.clone())
            .profiles(BRIDGE_PROFILES)
            .tls(config.tls.clone())
            .download(config.download.clone())
            .request_timeout(Duration::from_secs(30))
            .health_every(config.health_interval);
        let pool = match &config.database_url {
            Some(url) => Some(shared_pool(url, state_dir).await?),
            None => None,
        };
        xagent = match &pool {
            Some(pool) => {
                xagent.store(Store::Postgres(pool.clone())).holder_lease(HolderLease::random())
            }
            None => xagent.store(Store::Sqlite(state_dir.to_owned())),
        };
        let Running { plane, events, admission, health, .. } = xagent.start().await?;
        let card = admission.card();
        tracing::info!(
            card = %card.connector_card_id,
            version = %card.connector.version,
            tools = card.tools.len(),
            "Connector admitted"
        );
        let max_file_bytes = config.download.max_bytes;
        let inbox = Arc::new(match pool {
            Some(pool) => {
                Inbox::open_postgres(pool, card.connector_card_id.as_str(), max_file_bytes).await?
            }
            None => Inbox::open(state_dir, max_file_bytes)?,
        });
        let files = Arc::new(BridgeFiles { allowed: config.allowed.clone(), inbox: inbox.clone() });
        plane.set_file_source(files.clone());
        plane.set_file_sink(files);
        // A bridge sharing a database may stand by until the holder of the lease stops: it
        // waits for as long as that takes.
        let wait =
            if config.database_url.is_some() { Duration::MAX } else { Duration::from_secs(30) };
        // The runtime's store keeps the connector_id of the hello (one home for it).
        let connector_id =
            tokio::time::timeout(wait, plane.connected()).await.map_err(|_| {
                ClientError::Timeout { expected: "connector.hello.ack", millis: 30_000 }
            })??;
        tracing::debug!(%connector_id, "holding the data plane");
        let (notices, _) = broadcast::channel(256);
        let (arrivals, _) = watch::channel(0);
        let link = Arc::new(Self {
            plane,
            skill: std::sync::RwLock::new(admission.skill().map(str::to_owned)),
            health,
            inbox,
            channel: Mutex::new(None),
            sign_in: Mutex::new(SignIn::default()),
            notices,
            arrivals,
            progress: Mutex::new(HashMap::new()),
            announced: Mutex::new(Vec::new()),
        });
        let (inbound_tx, inbound_rx) = mpsc::channel(64);
        tokio::spawn(Arc::clone(&link).run_events(events, inbound_tx));
        tokio::spawn(Arc::clone(&link).run_inbound(inbound_rx));
        tokio::spawn(Arc::clone(&link).run_health());
        link.open_channel(&config).await?;
        Ok(link)
    }

    /// The admitted Card: the data plane's (the latest one the health monitor re-admitted).
    /// `None` only if the runtime lost it, which a bridge started by [`Link::start`] never does.
    pub fn card(&self) -> Option<Arc<ConnectorCard>> {
        self.plane.card()
    }

    /// The Connector's primary Skill, if it has one.
    pub fn skill(&self) -> Option<String> {
        self.skill.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Follows the health monitor: when it re-admitted a changed Card (already in the data
    /// plane) and Skill, MCP clients hear that the Tools and the prompt changed.
    async fn run_health(self: Arc<Self>) {
        let Some(health) = &self.health else { return };
        let mut refreshed = health.refreshed();
        let mut status = health.subscribe();
        loop {
            tokio::select! {
                changed = refreshed.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let skill = health.refetched_skill().await;
                    let version = self.card().map(|card| card.connector.version.clone());
                    tracing::info!(?version, "the Connector changed; its Card and Skill were re-admitted");
                    *self.skill.write().unwrap_or_else(std::sync::PoisonError::into_inner) = skill;
                    // A Descriptor that arrived before the new Card was judged against the old
                    // one (a new Tool is not in it): read the channel's Descriptor again.
                    if let Some(persisted) = self.channel_id() {
                        let current = self.plane.current_channel(&persisted).await.unwrap_or(persisted);
                        if let Err(error) = self.plane.open_channel_for(OWNER, Some(&current)).await {
                            tracing::warn!(%error, "could not refresh the channel's Descriptor");
                        }
                    }
                    self.notify(Notice::PromptsChanged);
                    self.notify(Notice::ToolsChanged);
                }
                changed = status.changed() => {
                    // The monitor logs each change itself; this only notices its end.
                    if changed.is_err() {
                        return;
                    }
                    status.borrow_and_update();
                }
            }
        }
    }

    /// The durable inbox.
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// Stops the bridge's connection to the Connector: the data plane closes and a holder
    /// lease it holds is given up, so a bridge standing by on the same database takes over at
    /// once. MCP sessions still read the inbox; Tool calls fail from now on.
    pub async fn close(&self) {
        self.plane.close().await;
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
        lock(&self.channel).clone()
    }

    /// The sign-in state.
    pub fn sign_in(&self) -> SignIn {
        lock(&self.sign_in).clone()
    }

    fn notify(&self, notice: Notice) {
        let _ = self.notices.send(notice);
    }

    /// Sends [`Notice::ToolsChanged`] when the callable Tools differ from the last announced.
    fn tools_maybe_changed(&self) {
        let now: Vec<String> = self.model_tools().iter().map(|t| t.name.to_string()).collect();
        let changed = {
            let mut announced = lock(&self.announced);
            let changed = *announced != now;
            *announced = now;
            changed
        };
        if changed {
            self.notify(Notice::ToolsChanged);
        }
    }

    /// The id the runtime persisted for a channel it now knows as `current` (they differ when
    /// the Connector reopened it under a new id).
    async fn persisted_of(&self, current: &ConnectorChannelId) -> ConnectorChannelId {
        self.plane
            .channels()
            .await
            .into_iter()
            .find(|(_, now)| now == current)
            .map_or_else(|| current.clone(), |(persisted, _)| persisted)
    }

    /// Finds the channel the runtime remembered for the bridge's user (reopened after hello)
    /// or opens a new one, then signs in when needed.
    async fn open_channel(self: &Arc<Self>, config: &LinkConfig) -> Result<(), LinkError> {
        let remembered = self.plane.directory().owned_by(OWNER).next().cloned();
        if let Some(entry) = remembered {
            let id = entry.connector_channel_id.clone();
            // The runtime reopens remembered channels itself after hello: wait for the Descriptor.
            let reopened = tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    let directory = self.plane.directory();
                    if let Some(entry) = directory.owned_by(OWNER).next()
                        && entry.descriptor.is_some()
                    {
                        return entry.clone();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await;
            match reopened {
                Ok(entry) if entry.is_authenticated() => {
                    tracing::info!(channel = %entry.connector_channel_id, "remembered channel reopened, signed in");
                    let persisted = self.persisted_of(&entry.connector_channel_id).await;
                    *lock(&self.channel) = Some(persisted);
                    lock(&self.sign_in).status = Some(AuthStatus::Authenticated);
                    self.tools_maybe_changed();
                    return Ok(());
                }
                Ok(entry) => {
                    tracing::info!(channel = %entry.connector_channel_id, "remembered channel is not signed in any more");
                    let persisted = self.persisted_of(&entry.connector_channel_id).await;
                    *lock(&self.channel) = Some(persisted);
                    return self.sign_in_with(config, &entry.connector_channel_id).await;
                }
                Err(_) => {
                    tracing::warn!(%id, "the remembered channel did not reopen; opening a new one");
                    self.plane.forget_channel(&id).await;
                }
            }
        }
        let opened = self.plane.open_channel_for(OWNER, None).await?;
        let channel = opened.connector_channel_id.clone();
        *lock(&self.channel) = Some(channel.clone());
        tracing::info!(%channel, "channel open");
        self.sign_in_with(config, &channel).await
    }

    async fn sign_in_with(
        self: &Arc<Self>,
        config: &LinkConfig,
        channel: &ConnectorChannelId,
    ) -> Result<(), LinkError> {
        match &config.flow {
            Some(flow) => self.run_flow(channel, flow, &config.inputs).await,
            None => {
                tracing::warn!(
                    "the channel is not signed in and no --flow was given: the Connector's Tools stay unavailable"
                );
                Ok(())
            }
        }
    }

    /// Signs the channel in with the runtime's driver. A flow the Connector leaves pending (a
    /// QR code to scan) is followed in the background: each step updates [`Link::sign_in`]
    /// and the resources; the Tools are announced once it is authenticated.
    async fn run_flow(
        self: &Arc<Self>,
        channel: &ConnectorChannelId,
        flow: &str,
        inputs: &AuthInput,
    ) -> Result<(), LinkError> {
        let driver = self.plane.sign_in(channel, flow, inputs.clone()).await?;
        let progress = driver.progress();
        self.apply_auth(flow, &progress);
        match progress.status {
            AuthStatus::Authenticated => Ok(()),
            _ if driver.is_following() => {
                if let Some(link) = &progress.qr_code_text {
                    tracing::info!(%link, "open this link (or scan the QR code) to finish signing in; MCP clients find it in the sign-in resource and in connector_channels_list");
                }
                tokio::spawn(Arc::clone(self).follow_flow(driver));
                Ok(())
            }
            other => Err(LinkError::Config(format!(
                "sign-in with {flow:?} ended {other}: {}",
                progress.message.as_deref().unwrap_or("no reason given")
            ))),
        }
    }

    /// Shows each step of a followed sign-in until it ends.
    async fn follow_flow(self: Arc<Self>, driver: Flow) {
        let flow = driver.flow_id().to_owned();
        let mut steps = driver.watch();
        let ended = async {
            while steps.changed().await.is_ok() {
                let progress = steps.borrow_and_update().clone();
                self.apply_auth(&flow, &progress);
            }
        };
        // The watch ends when the driver does; its outcome says how.
        let (outcome, ()) = tokio::join!(driver.finished(), ended);
        match outcome {
            Ok(progress) => {
                self.apply_auth(&flow, &progress);
                tracing::info!(status = %progress.status, "sign-in ended");
            }
            Err(error) => tracing::warn!(%error, "the sign-in could not be followed to its end"),
        }
    }

    fn apply_auth(&self, flow: &str, progress: &AuthProgress) {
        let shown = SignIn {
            status: Some(progress.status.clone()),
            flow: Some(flow.to_owned()),
            qr_code_text: progress.qr_code_text.clone(),
            qr_code_image: progress.qr_code_image.clone(),
            message: progress.message.clone(),
        };
        {
            let mut current = lock(&self.sign_in);
            if *current == shown {
                return;
            }
            *current = shown;
        }
        self.notify(Notice::ResourcesChanged);
        self.notify(Notice::ResourceUpdated(SIGN_IN_URI.to_owned()));
        self.tools_maybe_changed();
    }

    /// The Card Tools the bridge's user can call now, as the runtime projects them for a
    /// model (upload references shown as file references).
    pub fn model_tools(&self) -> Vec<FunctionDeclaration> {
        self.plane.model_tools(OWNER)
    }

    /// The runtime's built-in model Tools (`connector_channels_list`, `connector_message_send`).
    pub fn builtin_tools(&self) -> Vec<FunctionDeclaration> {
        builtin_tools()
    }

    /// `connector_channels_list`: the runtime's answer, with what an MCP client also needs per
    /// channel (the messages resource, pending messages, the target's account and the sign-in).
    pub async fn channels_list(&self) -> Result<Value, ToolFailure> {
        let mut listed =
            self.plane.call_builtin(OWNER, "connector_channels_list", &Map::new()).await?;
        let directory = self.plane.directory();
        let sign_in = self.sign_in();
        if let Some(channels) = listed.get_mut("channels").and_then(Value::as_array_mut) {
            for channel in channels {
                let Some(object) = channel.as_object_mut() else { continue };
                let Some(id) = object.get("connector_channel_id").and_then(Value::as_str) else {
                    continue;
                };
                let id = id.to_owned();
                let account = directory
                    .get(&ConnectorChannelId::new(id.as_str()))
                    .and_then(|e| e.descriptor.as_ref())
                    .and_then(|d| d.target.account_hint.clone());
                if let (Some(account), Some(target)) =
                    (account, object.get_mut("target").and_then(Value::as_object_mut))
                {
                    target.insert("account_hint".into(), Value::String(account));
                }
                object.insert(
                    "pending_messages".into(),
                    json!(self.inbox.pending(Some(&id)).await.unwrap_or(0)),
                );
                object.insert("messages_resource".into(), json!(channel_uri(&id)));
                object.insert(
                    "sign_in".into(),
                    json!({
                        "status": sign_in.status,
                        "flow": sign_in.flow,
                        "link": sign_in.qr_code_text,
                        "message": sign_in.message,
                    }),
                );
            }
        }
        Ok(listed)
    }

    /// Calls a Card Tool with the model's arguments through the runtime, which resolves the
    /// channel by section 10.1 (the bridge's user has no session binding: the first of its
    /// channels where the Tool is available), uploads file references on it and returns the
    /// result. The model's `connector_channel_id` selects nothing: a value given is passed on
    /// unchanged, a missing one is filled with the resolved channel, since the Card's schema
    /// asks for it. Progress pushes go to `progress` while the call runs.
    pub async fn invoke(
        &self,
        tool_id: &str,
        arguments: Map<String, Value>,
        progress: Option<ProgressSink>,
    ) -> Result<Value, ToolFailure> {
        if let Some(sink) = progress {
            lock(&self.progress).insert(tool_id.to_owned(), sink);
        }
        let options = ToolCallOptions {
            tool_call_id: Some(xagent_protocol_types::mint_prefixed("call_mcp_", rand::random())),
            fill_channel_argument: true,
            ..ToolCallOptions::default()
        };
        let outcome = self.plane.invoke_tool_with(OWNER, None, tool_id, arguments, options).await;
        lock(&self.progress).remove(tool_id);
        let outcome = outcome?;
        tracing::debug!(tool = tool_id, channel = %outcome.channel, "tool call answered");
        Ok(outcome.ack.result.unwrap_or(Value::Null))
    }

    /// `connector_message_send` through the runtime (ownership checked there, outbox until
    /// acked), then up to `wait` for the ack that settles it.
    pub async fn send_message(
        &self,
        arguments: &Map<String, Value>,
        wait: Duration,
    ) -> Result<Value, ToolFailure> {
        let mut queued =
            self.plane.call_builtin(OWNER, "connector_message_send", arguments).await?;
        let channel = arguments.get("connector_channel_id").and_then(Value::as_str);
        let message_id = queued.get("message_id").and_then(Value::as_str);
        let (Some(channel), Some(message_id)) = (channel, message_id) else {
            return Ok(queued);
        };
        let channel = ConnectorChannelId::new(channel);
        let message_id = MessageId::new(message_id);
        match self.plane.settled_ack(&channel, &message_id, wait).await {
            Some(ack) => ack_result(ack, queued),
            None => {
                if let Some(object) = queued.as_object_mut() {
                    object.insert(
                        "note".into(),
                        json!(
                            "not acknowledged yet; it is redelivered until the Connector accepts it"
                        ),
                    );
                }
                Ok(queued)
            }
        }
    }

    async fn run_events(
        self: Arc<Self>,
        mut events: Events,
        inbound: mpsc::Sender<InboundMessage>,
    ) {
        while let Some(event) = events.recv().await {
            match event {
                ClientEvent::DescriptorPushed { channel, descriptor } => {
                    tracing::info!(%channel, status = %descriptor.connection.status, "Descriptor updated");
                    self.tools_maybe_changed();
                }
                ClientEvent::ChannelReopened { previous, current, .. } => {
                    tracing::info!(%previous, %current, "channel reopened");
                    self.tools_maybe_changed();
                }
                ClientEvent::ChatMessage(message) => {
                    // The inbound task is gone only when the link is shutting down.
                    let Ok(()) = inbound.send(message).await else { return };
                }
                ClientEvent::ToolProgress { channel, progress } => {
                    let owned = channel.as_ref().is_some_and(|channel| {
                        self.plane.directory().owner(channel).as_deref() == Some(OWNER)
                    });
                    if !owned {
                        continue;
                    }
                    if let Some(sink) = lock(&self.progress).get(progress.tool_id.as_str()) {
                        let _ = sink.send(progress);
                    }
                }
                ClientEvent::Connected { connector_id } => {
                    tracing::info!(%connector_id, "connected to the Connector");
                }
                ClientEvent::State(state) => {
                    tracing::info!(state = state.as_str(), "connection state");
                    self.tools_maybe_changed();
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
                    match self.inbox.prune_taken(cutoff).await {
                        Ok(0) => {}
                        Ok(pruned) => tracing::info!(pruned, "forgot messages handed more than 7 days ago"),
                        Err(error) => tracing::warn!(%error, "inbox pruning failed"),
                    }
                }
            }
        }
    }

    /// Stores an inbound message (its files are already saved) and only then accepts it.
    async fn on_inbound(&self, inbound: InboundMessage) {
        // Keyed by the id the runtime persisted (a reopened channel may carry a new one).
        let channel = self.persisted_of(&inbound.channel).await.to_string();
        let message_id = inbound.message.message_id.to_string();
        if self.inbox.pending(None).await.unwrap_or(0) >= MAX_PENDING_MESSAGES {
            inbound.reject(
                ErrorCode::CapacityExceeded,
                "the agent has not taken the messages waiting for it yet",
                true,
            );
            return;
        }
        match self.inbox.contains(&channel, &message_id).await {
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
        if inbound.saved_files.len() != inbound.message.files.len() {
            inbound.reject(ErrorCode::ChannelBusy, "the message's files were not saved", true);
            return;
        }
        let mut files: Vec<StoredFile> = Vec::with_capacity(inbound.saved_files.len());
        for (file, id) in inbound.message.files.iter().zip(&inbound.saved_files) {
            let Ok(Some(byte_size)) = self.inbox.saved_size(id).await else {
                inbound.reject(ErrorCode::ChannelBusy, "the message's files were not kept", true);
                return;
            };
            files.push(StoredFile {
                id: id.clone(),
                filename: safe_filename(
                    file.filename.as_deref().unwrap_or_else(|| file.file_ref.as_str()),
                ),
                mime_type: file
                    .mime_type
                    .clone()
                    .unwrap_or_else(|| "application/octet-stream".into()),
                byte_size,
            });
        }
        let stored = self
            .inbox
            .store(&NewMessage {
                channel: &channel,
                message_id: &message_id,
                text: inbound.message.text.as_deref(),
                files: &files,
                created_at: inbound.message.created_at,
                received_at: now_millis(),
            })
            .await;
        match stored {
            Ok(_) => {
                inbound.accept();
                tracing::info!(%message_id, files = files.len(), "inbound message stored");
                self.arrivals.send_modify(|n| *n += 1);
                self.notify(Notice::ResourceUpdated(channel_uri(&channel)));
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
}

fn ack_result(ack: ChatMessageAck, queued: Value) -> Result<Value, ToolFailure> {
    match ack.status {
        AckStatus::Accepted | AckStatus::Duplicate => {
            Ok(json!({ "status": "accepted", "message_id": queued.get("message_id") }))
        }
        _ => Err(ToolFailure::new(
            ack.code.unwrap_or(ErrorCode::TargetDeliveryFailed),
            ack.message.unwrap_or_else(|| "the Connector rejected the message".into()),
        )),
    }
}

fn now_millis() -> u64 {
    use xagent_protocol_types::Clock;
    xagent_protocol_types::SystemClock.now_millis()
}
