//! The runtime state shared by every connection: the registered `connector_id` and its lease,
//! channels, routes, auth sessions, shared consumers; the author's [`ConnectorHandle`]; lease
//! expiry and maintenance ([`ConnectorServer::tick`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use xagent_protocol_types::{
    AuthSessionId, AuthStatus, Clock, Connection, ConnectionDescriptor, ConnectionStatus,
    ConnectorChannelId, ConnectorId, DescriptorPush, DescriptorTarget, DescriptorTool, ErrorCode,
    FlowId, Packet, PermissionState, ProfileId, Secret, SystemClock, TargetType, ToolProgressPush,
    ToolStatus,
};
use xagent_protocol_validate::AdmissionWindow;

use crate::author::{AuthContext, Binding, ChannelContext};
use crate::connector::Connector;
use crate::consumers::{Consumers, StopFn};
use crate::ids;
use crate::storage::{ChannelRecord, SqliteStorage, Storage, StorageError};

/// Tunables of the runtime. Every default is documented and can be changed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RuntimeConfig {
    /// Offline lease of a `connector_id` after its last authenticated socket closed
    /// (default one hour).
    pub lease: Duration,
    /// Largest accepted data-plane text frame (default 1 MiB); larger closes with 1009.
    pub max_packet_bytes: usize,
    /// Outgoing packets buffered per socket before producers wait (default 256). When a peer
    /// stops reading, the socket buffers fill, then this queue; from then on every producer
    /// waits for space: author calls such as [`ConnectorHandle::push_descriptor`] do not
    /// return, and the connection's reader stops reading the peer as soon as it needs to
    /// answer. Nothing is dropped and the socket is not closed; all of it resumes when the peer
    /// reads again (`tests/backpressure.rs`). The IM outbox never waits on a socket: a
    /// message for a peer whose queue is full stays pending and is retried after backoff, while
    /// other sockets' channels keep flowing.
    pub write_queue: usize,
    /// How long a `tool.invoke` result is kept for repeated calls (default 24 hours).
    pub tool_call_window: Duration,
    /// How long an auth session is kept (default 30 minutes).
    pub auth_session_ttl: Duration,
    /// How often the background maintenance runs [`ConnectorServer::tick`] (default 30 s).
    pub maintenance_interval: Duration,
    /// Path prefix of the Base URL (e.g. `/connectors/echo`; default none).
    pub base_path: String,
    /// Versions admitted in `connector.hello` (default `[3.0, 3.0]`, same-major rule).
    pub admission: AdmissionWindow,
    /// How long in-flight work may take to finish on shutdown (default 10 s). A connection
    /// whose peer stopped reading cannot write its last acks; [`ConnectorServer::serve`]
    /// returns after this grace period anyway.
    pub shutdown_grace: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(3600),
            max_packet_bytes: 1024 * 1024,
            write_queue: 256,
            tool_call_window: Duration::from_secs(24 * 3600),
            auth_session_ttl: Duration::from_secs(30 * 60),
            maintenance_interval: Duration::from_secs(30),
            base_path: String::new(),
            admission: AdmissionWindow::default(),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl RuntimeConfig {
    /// Sets the Base URL path prefix (e.g. `/connectors/echo`).
    #[must_use]
    pub fn with_base_path(mut self, base_path: impl Into<String>) -> Self {
        self.base_path = base_path.into();
        self
    }

    /// Sets the offline lease.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets how many outgoing packets a socket buffers before producers wait.
    #[must_use]
    pub fn with_write_queue(mut self, packets: usize) -> Self {
        self.write_queue = packets;
        self
    }

    /// Sets the data-plane packet size limit.
    #[must_use]
    pub fn with_max_packet_bytes(mut self, limit: usize) -> Self {
        self.max_packet_bytes = limit;
        self
    }
}

/// Why the runtime could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Binding or serving the socket failed.
    #[error("I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// The configuration is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Why a [`ConnectorHandle`] call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError {
    /// No such channel.
    #[error("channel {0} is not known to this Connector")]
    UnknownChannel(ConnectorChannelId),
    /// The channel is not signed in.
    #[error("channel {0} is not authenticated; sign in first")]
    NotAuthenticated(ConnectorChannelId),
    /// The channel does not enable the Profile this call needs.
    #[error("the Card does not declare {0}")]
    ProfileNotDeclared(&'static str),
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The IM outbox is full for the channel (`capacity_exceeded`): retry later.
    #[error("the outbox refused the message: {0}")]
    Outbox(String),
    /// The IM outbox refused the message itself: it breaks a Profile rule (`invalid_packet`)
    /// or reuses a pending `message_id` with other content (`message_conflict`).
    #[error("the outbox refused the message: {message}")]
    Rejected {
        /// The stable code.
        code: ErrorCode,
        /// What is wrong (no message content).
        message: String,
    },
    /// The Transfer Plane refused the file.
    #[error("the file store refused the file: {0}")]
    File(String),
}

impl HandleError {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::UnknownChannel(_) => ErrorCode::ConnectionNotFound,
            Self::NotAuthenticated(_) => ErrorCode::ConnectionNotAuthenticated,
            Self::ProfileNotDeclared(_) => ErrorCode::UnsupportedPacket,
            Self::Storage(_) | Self::File(_) => ErrorCode::InternalError,
            Self::Outbox(_) => ErrorCode::CapacityExceeded,
            Self::Rejected { code, .. } => code.clone(),
        }
    }
}

/// Something to write on a socket.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// A packet.
    Packet(Packet),
    /// A packet whose successful write is reported.
    Tracked(Packet, tokio::sync::oneshot::Sender<bool>),
    /// Close the socket with a code and reason.
    Close(u16, String),
}

/// The outcome of [`Shared::try_queue_tracked`].
pub(crate) enum TryQueue {
    /// Queued; the receiver says whether the write succeeded.
    Queued(tokio::sync::oneshot::Receiver<bool>),
    /// The route's write queue is full.
    Full,
    /// The channel has no route.
    NotRouted,
}

/// Where a channel's packets go right now.
#[derive(Clone, Debug)]
pub(crate) struct Route {
    pub(crate) socket: u64,
    pub(crate) tx: mpsc::Sender<Outgoing>,
    pub(crate) profiles: Vec<ProfileId>,
}

/// One open auth session.
#[derive(Clone, Debug)]
pub(crate) struct AuthSession {
    pub(crate) channel: ConnectorChannelId,
    pub(crate) flow_id: FlowId,
    pub(crate) status: AuthStatus,
    pub(crate) created_at: u64,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) connector_id: Option<ConnectorId>,
    pub(crate) live_sockets: HashSet<u64>,
    pub(crate) offline_since: Option<u64>,
    pub(crate) channels: HashMap<ConnectorChannelId, ChannelRecord>,
    pub(crate) routes: HashMap<ConnectorChannelId, Route>,
    pub(crate) auth_sessions: HashMap<AuthSessionId, AuthSession>,
    pub(crate) consumers: Consumers,
    pub(crate) next_socket: u64,
}

pub(crate) struct Shared {
    pub(crate) def: Connector,
    pub(crate) config: RuntimeConfig,
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) api_key: Option<Secret>,
    pub(crate) state: Mutex<State>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) tasks: TaskTracker,
    pub(crate) im: Option<crate::im::ImState>,
    pub(crate) inflight_tools: crate::session::InflightTools,
    pub(crate) files: Option<xagent_file_transfer::FileStore>,
    pub(crate) files_upload_limit: u64,
}

impl Shared {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    pub(crate) fn handle(self: &Arc<Self>) -> ConnectorHandle {
        ConnectorHandle(Arc::clone(self))
    }

    pub(crate) fn target_type(&self) -> TargetType {
        self.def.card.supports.target_types.first().cloned().unwrap_or(TargetType::Im)
    }

    /// The Descriptor of a channel as seen with `profiles` enabled.
    pub(crate) fn descriptor_for(
        &self,
        record: &ChannelRecord,
        profiles: &[ProfileId],
    ) -> ConnectionDescriptor {
        let signed_in = record.binding.is_some();
        let usable = signed_in
            && matches!(record.status, ConnectionStatus::Connected | ConnectionStatus::Degraded);
        let target = record
            .binding
            .as_ref()
            .map_or_else(|| self.def.unbound_target.clone(), |b| b.target.clone());
        let profiles = if profiles.is_empty() {
            self.def.card.supports.profiles.clone()
        } else {
            profiles.to_vec()
        };
        let connection = Connection::new(
            self.def.card.connector_card_id.clone(),
            record.connector_id.clone(),
            record.id.clone(),
            self.target_type(),
            profiles,
            record.status.clone(),
        );
        let tools = self
            .def
            .card
            .tools
            .iter()
            .map(|tool| {
                if !usable {
                    let reason = if signed_in {
                        "the channel is not connected"
                    } else {
                        "sign in to the target system first"
                    };
                    let permission = if signed_in {
                        PermissionState::Unknown
                    } else {
                        PermissionState::RequiresReauth
                    };
                    return DescriptorTool::new(tool.tool_id.clone(), ToolStatus::Unavailable)
                        .with_permission(permission)
                        .with_reason(reason);
                }
                record
                    .tool_overrides
                    .get(&tool.tool_id)
                    .cloned()
                    .unwrap_or_else(|| DescriptorTool::available(tool.tool_id.clone()))
            })
            .collect();
        ConnectionDescriptor::new(connection, target).with_tools(tools)
    }

    /// The Descriptor of a channel with the Profiles of its current route (or the Card's).
    pub(crate) fn current_descriptor(
        &self,
        channel: &ConnectorChannelId,
    ) -> Option<ConnectionDescriptor> {
        let state = self.state();
        let record = state.channels.get(channel)?;
        let profiles = state.routes.get(channel).map(|r| r.profiles.clone()).unwrap_or_default();
        Some(self.descriptor_for(record, &profiles))
    }

    /// Sends a packet on the channel's route, if it has one. Returns false when not routed.
    pub(crate) async fn send_on_route(&self, channel: &ConnectorChannelId, packet: Packet) -> bool {
        let tx = self.state().routes.get(channel).map(|r| r.tx.clone());
        match tx {
            Some(tx) => tx.send(Outgoing::Packet(packet)).await.is_ok(),
            None => false,
        }
    }

    /// Sends a packet on the route and waits until it was written (or refused).
    /// Queues a packet on a channel's route without waiting: a full write queue (a peer that
    /// stopped reading) is reported instead of waited on, so one stalled socket cannot hold up
    /// delivery to the others. The receiver reports whether the write succeeded.
    pub(crate) fn try_queue_tracked(
        &self,
        channel: &ConnectorChannelId,
        packet: Packet,
    ) -> TryQueue {
        let tx = self.state().routes.get(channel).map(|r| r.tx.clone());
        let Some(tx) = tx else { return TryQueue::NotRouted };
        let (done, written) = tokio::sync::oneshot::channel();
        match tx.try_send(Outgoing::Tracked(packet, done)) {
            Ok(()) => TryQueue::Queued(written),
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => TryQueue::Full,
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => TryQueue::NotRouted,
        }
    }

    pub(crate) fn packet(&self, packet: Packet) -> Packet {
        packet.time(self.now())
    }

    /// Pushes the channel's Descriptor when it is routed.
    pub(crate) async fn push_descriptor(&self, channel: &ConnectorChannelId) -> bool {
        let Some(descriptor) = self.current_descriptor(channel) else { return false };
        let packet = self
            .packet(Packet::with_payload(ids::packet_id(), DescriptorPush::new(descriptor)))
            .channel(channel.clone());
        self.send_on_route(channel, packet).await
    }

    pub(crate) fn save_channel(&self, record: &ChannelRecord) -> Result<(), StorageError> {
        self.storage.save_channel(record)
    }

    /// Unregisters one channel: the author's sign-out cleanup, shared consumers, storage, IM
    /// state, open auth sessions.
    pub(crate) async fn unregister_channel(self: &Arc<Self>, record: ChannelRecord) {
        let channel = record.id.clone();
        let (stops, sessions): (Vec<StopFn>, Vec<(AuthSessionId, AuthSession)>) = {
            let mut state = self.state();
            state.channels.remove(&channel);
            state.routes.remove(&channel);
            let sessions: Vec<_> = state
                .auth_sessions
                .iter()
                .filter(|(_, s)| s.channel == channel)
                .map(|(id, s)| (id.clone(), s.clone()))
                .collect();
            for (id, _) in &sessions {
                state.auth_sessions.remove(id);
            }
            (state.consumers.release_channel(&channel), sessions)
        };
        for (auth_session_id, session) in sessions {
            if !session.status.is_final() {
                let ctx = AuthContext {
                    channel: channel.clone(),
                    flow_id: session.flow_id,
                    auth_session_id,
                    handle: self.handle(),
                };
                self.def.auth.cancel(ctx).await;
            }
        }
        if let Some(binding) = record.binding {
            let ctx = ChannelContext { channel: channel.clone(), binding, handle: self.handle() };
            self.def.auth.unregister(ctx).await;
        }
        for stop in stops {
            stop();
        }
        if let Some(im) = &self.im {
            im.forget_channel(&channel);
        }
        if let Some(files) = &self.files {
            files.remove_channel(&channel).await;
        }
        if let Err(error) = self.storage.delete_channel(&channel) {
            tracing::error!(%error, %channel, "could not delete an unregistered channel");
        }
        tracing::info!(%channel, "channel unregistered");
    }

    /// Lease expiry and periodic maintenance.
    pub(crate) async fn tick(self: &Arc<Self>) {
        let now = self.now();
        let lease = u64::try_from(self.config.lease.as_millis()).unwrap_or(u64::MAX);
        let expired = {
            let mut state = self.state();
            let due = state.live_sockets.is_empty()
                && state.offline_since.is_some_and(|since| now >= since.saturating_add(lease));
            if due {
                state.offline_since = None;
                let connector_id = state.connector_id.take();
                let channels: Vec<ChannelRecord> = state.channels.values().cloned().collect();
                Some((connector_id, channels))
            } else {
                None
            }
        };
        if let Some((connector_id, channels)) = expired {
            tracing::info!(
                connector_id = connector_id.as_ref().map(ConnectorId::as_str),
                channels = channels.len(),
                "offline lease expired; unregistering the runtime instance"
            );
            if let Err(error) = self.storage.save_connector_id(None) {
                tracing::error!(%error, "could not clear the connector_id");
            }
            for record in channels {
                self.unregister_channel(record).await;
            }
        }
        // Tool-call idempotency window.
        let window = u64::try_from(self.config.tool_call_window.as_millis()).unwrap_or(u64::MAX);
        if let Err(error) = self.storage.prune_tool_calls(now.saturating_sub(window)) {
            tracing::warn!(%error, "could not prune tool calls");
        }
        // Old auth sessions.
        let ttl = u64::try_from(self.config.auth_session_ttl.as_millis()).unwrap_or(u64::MAX);
        let stale: Vec<(AuthSessionId, AuthSession)> = {
            let mut state = self.state();
            let ids: Vec<AuthSessionId> = state
                .auth_sessions
                .iter()
                .filter(|(_, s)| now >= s.created_at.saturating_add(ttl))
                .map(|(id, _)| id.clone())
                .collect();
            let stale: Vec<(AuthSessionId, AuthSession)> = ids
                .into_iter()
                .filter_map(|id| state.auth_sessions.remove(&id).map(|s| (id, s)))
                .collect();
            // A channel whose only sign-in attempt timed out is no longer authenticating.
            for (_, session) in &stale {
                crate::session::revert_authenticating(&mut state, &session.channel);
            }
            stale
        };
        for (auth_session_id, session) in stale {
            if !session.status.is_final() {
                let ctx = AuthContext {
                    channel: session.channel,
                    flow_id: session.flow_id,
                    auth_session_id,
                    handle: self.handle(),
                };
                self.def.auth.cancel(ctx).await;
            }
        }
        if let Some(im) = &self.im {
            im.maintain(self).await;
        }
    }
}

/// The author's handle on the running Connector: report Descriptor changes, hand inbound
/// messages and files to xAgent, manage shared target consumers. Cheap to clone.
#[derive(Clone)]
pub struct ConnectorHandle(pub(crate) Arc<Shared>);

impl std::fmt::Debug for ConnectorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorHandle")
            .field("card_id", &self.0.def.card.connector_card_id)
            .finish_non_exhaustive()
    }
}

impl ConnectorHandle {
    /// The registered `connector_id`, if a hello registered one and its lease has not expired.
    pub fn connector_id(&self) -> Option<ConnectorId> {
        self.0.state().connector_id.clone()
    }

    /// True while at least one socket that completed hello is connected.
    pub fn is_online(&self) -> bool {
        !self.0.state().live_sockets.is_empty()
    }

    /// Every known channel.
    pub fn channels(&self) -> Vec<ConnectorChannelId> {
        let mut ids: Vec<_> = self.0.state().channels.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// True when the channel is routed to a live socket.
    pub fn is_routed(&self, channel: &ConnectorChannelId) -> bool {
        self.0.state().routes.contains_key(channel)
    }

    /// The channel's binding, if signed in.
    pub fn binding(&self, channel: &ConnectorChannelId) -> Option<Binding> {
        self.0.state().channels.get(channel).and_then(|r| r.binding.clone())
    }

    /// The channel's current Descriptor.
    pub fn descriptor(&self, channel: &ConnectorChannelId) -> Option<ConnectionDescriptor> {
        self.0.current_descriptor(channel)
    }

    /// Now, from the injected clock (Unix ms).
    pub fn now_millis(&self) -> u64 {
        self.0.now()
    }

    fn update_channel(
        &self,
        channel: &ConnectorChannelId,
        change: impl FnOnce(&mut ChannelRecord),
    ) -> Result<(), HandleError> {
        let record = {
            let mut state = self.0.state();
            let record = state
                .channels
                .get_mut(channel)
                .ok_or_else(|| HandleError::UnknownChannel(channel.clone()))?;
            change(record);
            record.clone()
        };
        self.0.save_channel(&record)?;
        Ok(())
    }

    /// Sets the channel's status (e.g. `degraded`, `offline`, `expired`, `revoked`) and pushes
    /// the new Descriptor.
    pub async fn set_status(
        &self,
        channel: &ConnectorChannelId,
        status: ConnectionStatus,
    ) -> Result<(), HandleError> {
        self.update_channel(channel, |record| record.status = status)?;
        self.0.push_descriptor(channel).await;
        Ok(())
    }

    /// Overrides one Tool's availability on the channel and pushes the new Descriptor. Only
    /// Tools declared in the Card are accepted (others are ignored).
    pub async fn set_tool_status(
        &self,
        channel: &ConnectorChannelId,
        tool: DescriptorTool,
    ) -> Result<(), HandleError> {
        if self.0.def.card.tool(tool.tool_id.as_str()).is_none() {
            tracing::warn!(tool_id = %tool.tool_id, "ignoring availability of an undeclared tool");
            return Ok(());
        }
        self.update_channel(channel, |record| {
            record.tool_overrides.insert(tool.tool_id.clone(), tool);
        })?;
        self.0.push_descriptor(channel).await;
        Ok(())
    }

    /// Replaces the display-level target facts of a signed-in channel and pushes the
    /// Descriptor.
    pub async fn set_target(
        &self,
        channel: &ConnectorChannelId,
        target: DescriptorTarget,
    ) -> Result<(), HandleError> {
        let mut authenticated = true;
        self.update_channel(channel, |record| match &mut record.binding {
            Some(binding) => binding.target = target,
            None => authenticated = false,
        })?;
        if !authenticated {
            return Err(HandleError::NotAuthenticated(channel.clone()));
        }
        self.0.push_descriptor(channel).await;
        Ok(())
    }

    /// Pushes the channel's current Descriptor (when routed). Returns whether it was queued.
    pub async fn push_descriptor(&self, channel: &ConnectorChannelId) -> bool {
        self.0.push_descriptor(channel).await
    }

    /// Sends a `tool.progress.push` on the channel (when routed).
    pub async fn push_tool_progress(&self, channel: &ConnectorChannelId, push: ToolProgressPush) {
        let packet =
            self.0.packet(Packet::with_payload(ids::packet_id(), push)).channel(channel.clone());
        self.0.send_on_route(channel, packet).await;
    }

    /// Starts (first user) or joins the shared consumer `key` for `channel`. `start` runs only
    /// when no channel uses the consumer yet and returns how to stop it; the runtime stops it
    /// when the last channel signs out or is unregistered. Returns true when started.
    pub fn attach_consumer(
        &self,
        key: &str,
        channel: &ConnectorChannelId,
        start: impl FnOnce() -> StopFn,
    ) -> bool {
        self.0.state().consumers.attach(key, channel, start)
    }

    /// Releases `channel`'s use of the consumer `key`, stopping it if it was the last user.
    pub fn detach_consumer(&self, key: &str, channel: &ConnectorChannelId) {
        let stop = self.0.state().consumers.detach(key, channel);
        if let Some(stop) = stop {
            stop();
        }
    }

    /// Number of channels using the consumer `key`.
    pub fn consumer_users(&self, key: &str) -> usize {
        self.0.state().consumers.users(key)
    }

    /// Runs lease expiry and maintenance now (the background task does it periodically).
    pub async fn tick(&self) {
        self.0.tick().await;
    }
}

/// Builder of a [`ConnectorServer`].
pub struct ServerBuilder {
    connector: Connector,
    config: RuntimeConfig,
    storage: Option<Arc<dyn Storage>>,
    clock: Arc<dyn Clock>,
    api_key: Option<Secret>,
    files: Option<crate::files::FilesConfig>,
    state_dir: Option<std::path::PathBuf>,
}

impl ServerBuilder {
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

    /// Uses `<dir>/connector.sqlite3` (WAL) as storage.
    pub fn state_dir(mut self, dir: impl AsRef<std::path::Path>) -> Result<Self, ServerError> {
        self.storage = Some(Arc::new(SqliteStorage::open(&dir)?));
        self.state_dir = Some(dir.as_ref().to_path_buf());
        Ok(self)
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

    /// Loads persisted state and starts the runtime (restored signed-in channels get the
    /// author's `restore`; the lease of restored channels starts now).
    pub async fn build(self) -> Result<ConnectorServer, ServerError> {
        let storage = match self.storage {
            Some(storage) => storage,
            None => Arc::new(SqliteStorage::in_memory()?),
        };
        let connector_id = storage.load_connector_id()?;
        let channels = storage.load_channels()?;
        let now = self.clock.now_millis();
        let mut state = State { connector_id, ..State::default() };
        if state.connector_id.is_some() || !channels.is_empty() {
            // Nobody holds the restored runtime yet: the lease runs from startup.
            state.offline_since = Some(now);
        }
        for record in channels {
            state.channels.insert(record.id.clone(), record);
        }
        let im = crate::im::ImState::new(&self.connector, storage.as_ref(), &self.clock)?;
        let files_config = self
            .files
            .or_else(|| self.state_dir.map(|d| crate::files::FilesConfig::new(d.join("files"))));
        let files_upload_limit = files_config.as_ref().map_or(0, |f| f.max_upload_bytes);
        let files = match &files_config {
            Some(config) => Some(
                crate::files::open_store(
                    config,
                    &self.config.base_path,
                    storage.as_ref(),
                    Arc::clone(&self.clock),
                )
                .await?,
            ),
            None => None,
        };
        let shared = Arc::new(Shared {
            def: self.connector,
            config: self.config,
            storage,
            clock: self.clock,
            api_key: self.api_key,
            state: Mutex::new(state),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            im,
            inflight_tools: Default::default(),
            files,
            files_upload_limit,
        });
        let restored: Vec<ChannelContext> = shared
            .state()
            .channels
            .values()
            .filter_map(|r| {
                r.binding.clone().map(|binding| ChannelContext {
                    channel: r.id.clone(),
                    binding,
                    handle: shared.handle(),
                })
            })
            .collect();
        for ctx in restored {
            shared.def.auth.restore(ctx).await;
        }
        Ok(ConnectorServer { shared })
    }
}

/// A running Connector Server: serve it with [`ConnectorServer::serve`] or mount
/// [`ConnectorServer::router`] yourself.
#[derive(Clone)]
pub struct ConnectorServer {
    pub(crate) shared: Arc<Shared>,
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
        }
    }

    /// The author's handle.
    pub fn handle(&self) -> ConnectorHandle {
        self.shared.handle()
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

    /// Serves HTTP and WebSocket on `listener` until `shutdown` completes, then shuts down
    /// gracefully. Runs the maintenance task meanwhile.
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
        let cleanup = self.shared.files.as_ref().map(|files| files.spawn_cleanup());
        let server_token = token.clone();
        tokio::spawn(async move {
            shutdown.await;
            server_token.cancel();
        });
        let graceful = token.clone();
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { graceful.cancelled().await })
            .await?;
        maintenance.abort();
        if let Some(cleanup) = cleanup {
            cleanup.abort();
        }
        self.wait_finished().await;
        Ok(())
    }

    /// Runs the data-plane loop of one connection over any frame stream and sink (the axum
    /// WebSocket in production, in-memory channels in tests). Returns when the connection ends.
    pub async fn serve_connection<St, Si>(&self, stream: St, sink: Si)
    where
        St: futures_util::Stream<Item = Result<crate::session::Frame, crate::session::FrameError>>
            + Send
            + Unpin
            + 'static,
        Si: futures_util::Sink<crate::session::Frame> + Send + Unpin + 'static,
    {
        let shared = Arc::clone(&self.shared);
        let task = self.shared.tasks.spawn(crate::session::run(shared, stream, sink));
        let _ = task.await;
    }
}
