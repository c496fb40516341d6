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

use rmcp::model::ToolAnnotations;
use tokio::sync::{broadcast, mpsc, watch};
use xagent_client_runtime::prelude::*;
use xagent_client_runtime::{HealthMonitor, HealthStatus};
use xagent_protocol_types::{
    AuthStatus, ConnectorCard, PROFILE_DEVICE_V1, PROFILE_IM_V1, PROFILE_IM_V2, ToolProgressPush,
    WireError,
};
use xagent_storage_postgres::{DatabaseUrl, Pool, PoolOptions};

mod calls;
mod channel;
mod inbound;

use crate::annotations::{self, AnnotationOverrides};
use crate::bridge_files::BridgeFiles;
use crate::files::AllowedDirs;
use crate::inbox::{Inbox, SQLITE_FILE};

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
    /// The operator's MCP tool annotations, over the derived ones (`--tool-annotations`).
    pub tool_annotations: AnnotationOverrides,
}

impl LinkConfig {
    /// A bridge to `base_url` with no API key, no sign-in, no allowed directories, `/health`
    /// every 30 s, downloads from the Connector's own origin, the system's trust store, state
    /// in the state directory and no tool annotations of the operator's.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            flow: None,
            inputs: AuthInput::default(),
            allowed: AllowedDirs::default(),
            health_interval: Duration::from_secs(30),
            download: DownloadPolicy::default(),
            tls: TlsTrust::default(),
            database_url: None,
            tool_annotations: AnnotationOverrides::default(),
        }
    }
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
    /// The operator's tool annotations.
    annotations: AnnotationOverrides,
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

/// What the bridge cannot do for this Connector, said at start and in the instructions: a
/// Connector that speaks only the legacy IM v1 pushes its messages with `message.push`, which
/// has no ack, and the bridge (which announces IM v2 only) does not take them.
pub fn unhandled_messages(card: &ConnectorCard) -> Option<String> {
    let declares = |profile: &str| card.supports.profiles.iter().any(|p| p.as_str() == profile);
    (declares(PROFILE_IM_V1) && !declares(PROFILE_IM_V2)).then(|| {
        format!(
            "the Connector {} speaks the legacy IM Profile {PROFILE_IM_V1} only: its inbound messages (message.push, which has no ack) are not handed to the agent, since this bridge takes IM messages with {PROFILE_IM_V2} only",
            card.connector_card_id
        )
    })
}

/// The operator's annotations must name Tools there are: the Card's and the bridge's own.
fn check_annotations(
    overrides: &AnnotationOverrides,
    card: &ConnectorCard,
) -> Result<(), annotations::AnnotationsError> {
    let card_tools = card.tools.iter().map(|tool| tool.tool_id.as_str());
    overrides.check_tools(card_tools.chain(annotations::BRIDGE_TOOLS))
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
        if let Some(limit) = unhandled_messages(card) {
            let shared = BRIDGE_PROFILES
                .iter()
                .any(|ours| card.supports.profiles.iter().any(|p| p.as_str() == *ours));
            if !shared {
                return Err(LinkError::Config(format!(
                    "{limit}; it declares no other Profile this bridge handles, so there is nothing to serve: use a Connector with {PROFILE_IM_V2}"
                )));
            }
            tracing::warn!("{limit}");
        }
        check_annotations(&config.tool_annotations, card)
            .map_err(|e| LinkError::Config(e.to_string()))?;
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
            annotations: config.tool_annotations.clone(),
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

    /// The annotations MCP clients see on the Tool `name`: `derived` (from
    /// [`annotations::connector_tool`] or [`annotations::bridge_tool`]) with the operator's over it.
    pub fn annotations(&self, name: &str, derived: ToolAnnotations) -> ToolAnnotations {
        self.annotations.apply(name, derived)
    }

    /// Why the Connector's Tools are withdrawn, when they are: the health monitor finds it
    /// offline (unreachable, or changed into something this bridge cannot admit) or refusing
    /// the API key.
    pub fn withdrawn(&self) -> Option<String> {
        match self.health.as_ref()?.status() {
            HealthStatus::Offline { reason, .. } => Some(format!("it is offline ({reason})")),
            HealthStatus::AuthenticationFailed => Some("it refuses the API key".to_owned()),
            _ => None,
        }
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
                    if let Some(card) = self.card()
                        && let Err(error) = check_annotations(&self.annotations, &card)
                    {
                        tracing::warn!(%error, "the re-admitted Card no longer has every Tool the annotations file names");
                    }
                    self.notify(Notice::PromptsChanged);
                    self.notify(Notice::ToolsChanged);
                }
                changed = status.changed() => {
                    // The monitor logs each change itself; here an offline or refusing
                    // Connector's Tools leave the list, and come back with it.
                    if changed.is_err() {
                        return;
                    }
                    status.borrow_and_update();
                    self.tools_maybe_changed();
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
}
