//! [`ConnectorHandle`]: the author's handle on the running Connector, in one place: channel
//! facts, Descriptor and status changes, Tool progress, shared consumers; inbound IM messages
//! and files in `messages`.
//!
//! The handle is type-erased: it holds the runtime as an `Arc<dyn HandleOps>`, the trait of
//! what the handle asks of the runtime, defined here and implemented by the runtime state
//! (`state::ops`). The author's code (which receives the handle) therefore does not depend on
//! the state that holds it, and the crate's modules form no import circle.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use xagent_file_transfer::FileStore;
use xagent_profile_im::{OutboundPayload, OutboxEvent};
use xagent_protocol_types::{
    ConnectionDescriptor, ConnectionStatus, ConnectorChannelId, ConnectorId, DescriptorTarget,
    DescriptorTool, MessageId, ToolId, ToolProgressPush,
};

pub(crate) mod consumers;
mod detached;
mod messages;

pub(crate) use consumers::Consumers;

use crate::binding::Binding;
use crate::error::HandleError;

/// How to stop a shared consumer.
pub type StopFn = Box<dyn FnOnce() + Send>;

/// How to start a replicated consumer, as often as its lease moves to this replica.
pub type StartFn = Arc<dyn Fn() -> StopFn + Send + Sync>;

/// What the author knows about a channel's device right now (Device Profile v1): returned by
/// `DeviceTarget::check`, reported with [`ConnectorHandle::device_status`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceStatus {
    /// The device answered and takes commands.
    Online,
    /// The device does not answer (lost, asleep, switched off, its broker or bridge is down).
    Offline,
    /// The device or its platform withdrew the permission to operate it.
    PermissionLost,
}

/// An author broadcast as a replica hears it ([`ConnectorHandle::subscribe_broadcast`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Broadcast {
    /// The topic it was sent on.
    pub topic: String,
    /// Its message.
    pub message: String,
}

/// What the handle asks of the running Connector: the runtime state implements it. Object
/// safe; its async operations return boxed futures. The handle keeps the author-facing
/// rules (argument checks, panic containment of a consumer start, file store calls) and
/// leaves the state's data to this trait.
pub(crate) trait HandleOps: Send + Sync + 'static {
    /// The Card (what a push may cite); `None` on a detached handle.
    fn card(&self) -> Option<&xagent_protocol_types::ConnectorCard>;
    /// The registered `connector_id`.
    fn connector_id(&self) -> Option<ConnectorId>;
    /// True while a socket that completed hello is connected.
    fn is_online(&self) -> bool;
    /// Every known channel, sorted.
    fn channels(&self) -> Vec<ConnectorChannelId>;
    /// True for a known channel.
    fn has_channel(&self, channel: &ConnectorChannelId) -> bool;
    /// True when the channel is routed to a live socket.
    fn is_routed(&self, channel: &ConnectorChannelId) -> bool;
    /// The channel's binding.
    fn binding(&self, channel: &ConnectorChannelId) -> Option<Binding>;
    /// The channel's current Descriptor.
    fn descriptor(&self, channel: &ConnectorChannelId) -> Option<ConnectionDescriptor>;
    /// The runtime's shutdown signal.
    fn shutdown_signal(&self) -> tokio_util::sync::CancellationToken;
    /// Now, from the injected clock.
    fn now_millis(&self) -> u64;
    /// Sets a channel's status, persists it and pushes the Descriptor.
    fn set_status(
        &self,
        channel: &ConnectorChannelId,
        status: ConnectionStatus,
    ) -> BoxFuture<'_, Result<(), HandleError>>;
    /// Applies a device status report (Device Profile v1).
    fn device_status(
        &self,
        channel: &ConnectorChannelId,
        status: DeviceStatus,
    ) -> BoxFuture<'_, Result<bool, HandleError>>;
    /// Grants one confirmation of a high-risk device Tool call with these arguments.
    fn grant_confirmation(
        &self,
        channel: &ConnectorChannelId,
        tool: &ToolId,
        arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), HandleError>;
    /// Overrides one declared Tool's availability and pushes the Descriptor.
    fn set_tool_status(
        &self,
        channel: &ConnectorChannelId,
        tool: DescriptorTool,
    ) -> BoxFuture<'_, Result<(), HandleError>>;
    /// Replaces a signed-in channel's target facts and pushes the Descriptor.
    fn set_target(
        &self,
        channel: &ConnectorChannelId,
        target: DescriptorTarget,
    ) -> BoxFuture<'_, Result<(), HandleError>>;
    /// Pushes the channel's Descriptor when routed.
    fn push_descriptor(&self, channel: &ConnectorChannelId) -> BoxFuture<'_, bool>;
    /// Sends a `tool.progress.push` on the channel's route.
    fn push_tool_progress(
        &self,
        channel: &ConnectorChannelId,
        push: ToolProgressPush,
    ) -> BoxFuture<'_, ()>;
    /// Joins the running consumer `key` (true) or reports that none runs (false).
    fn consumer_join(&self, key: &str, channel: &ConnectorChannelId) -> bool;
    /// Registers a started consumer; returns the surplus `stop` when another start won.
    fn consumer_insert(
        &self,
        key: &str,
        channel: &ConnectorChannelId,
        stop: StopFn,
    ) -> Option<StopFn>;
    /// Releases a channel's use of `key`; returns `stop` when it was the last user.
    fn consumer_detach(&self, key: &str, channel: &ConnectorChannelId) -> Option<StopFn>;
    /// Number of channels using the consumer `key`.
    fn consumer_users(&self, key: &str) -> usize;
    /// On replicas: adds `channel` as a user of the replicated consumer `key` (true when newly
    /// wanted here), run anywhere or only beside the data plane; `None` when this runtime runs
    /// alone.
    fn consumer_want(
        &self,
        key: &str,
        channel: &ConnectorChannelId,
        start: StartFn,
        with_data_plane: bool,
    ) -> Option<bool>;
    /// Lease expiry and maintenance now.
    fn tick(self: Arc<Self>) -> BoxFuture<'static, ()>;
    /// Hands a message to the IM outbox when the Card declares `profile`.
    fn enqueue_message(
        self: Arc<Self>,
        profile: &'static str,
        channel: ConnectorChannelId,
        payload: OutboundPayload,
        extra: Vec<crate::storage::WriteOp>,
    ) -> BoxFuture<'static, Result<(), HandleError>>;
    /// The IM outbox's facts, when the Card declares an IM Profile.
    fn outbox_events(&self) -> Option<tokio::sync::broadcast::Receiver<OutboxEvent>>;
    /// Message ids still pending towards xAgent on a channel.
    fn pending_messages(&self, channel: &ConnectorChannelId) -> Vec<MessageId>;
    /// The Transfer Plane's store, or why there is none.
    fn files(&self) -> Result<&FileStore, HandleError>;
    /// The author store over the runtime's storage.
    fn author_store(&self) -> crate::AuthorStore;
    /// Sends an author broadcast to every replica (this one included).
    fn broadcast(&self, topic: &str, message: &str) -> BoxFuture<'_, Result<(), HandleError>>;
    /// Hears author broadcasts from now on.
    fn subscribe_broadcast(&self) -> tokio::sync::broadcast::Receiver<Broadcast>;
}

/// The author's handle on the running Connector: report Descriptor changes, hand inbound
/// messages and files to xAgent, manage shared target consumers. Cheap to clone.
#[derive(Clone)]
pub struct ConnectorHandle(Arc<dyn HandleOps>);

impl std::fmt::Debug for ConnectorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let card_id = self.0.card().map(|card| &card.connector_card_id);
        f.debug_struct("ConnectorHandle").field("card_id", &card_id).finish_non_exhaustive()
    }
}

impl ConnectorHandle {
    /// The handle on a runtime.
    pub(crate) fn new(ops: Arc<dyn HandleOps>) -> Self {
        Self(ops)
    }

    /// The registered `connector_id`, if a hello registered one and its lease has not expired.
    pub fn connector_id(&self) -> Option<ConnectorId> {
        self.0.connector_id()
    }

    /// True while at least one socket that completed hello is connected.
    pub fn is_online(&self) -> bool {
        self.0.is_online()
    }

    /// Every known channel.
    pub fn channels(&self) -> Vec<ConnectorChannelId> {
        self.0.channels()
    }

    /// True when the channel is routed to a live socket.
    pub fn is_routed(&self, channel: &ConnectorChannelId) -> bool {
        self.0.is_routed(channel)
    }

    /// The channel's binding, if signed in.
    pub fn binding(&self, channel: &ConnectorChannelId) -> Option<Binding> {
        self.0.binding(channel)
    }

    /// A gauge of this Connector's own on the metrics listener (`xagent_connector_<name>`,
    /// e.g. `webchat_rooms`, `homie_devices_online`): registered on first use, the same gauge
    /// for the same name. `None` when `name` is not lower-case letters and `_`, or beyond 64
    /// such gauges. Never put a channel id, an address or anything secret in a name.
    pub fn gauge(&self, name: &str, help: &str) -> Option<crate::AuthorGauge> {
        crate::metrics::author_gauge(name, help)
    }

    /// The channel's current Descriptor.
    pub fn descriptor(&self, channel: &ConnectorChannelId) -> Option<ConnectionDescriptor> {
        self.0.descriptor(channel)
    }

    /// The runtime's shutdown signal: cancelled when the server starts shutting down, so the
    /// author's long-running work (a poller, a page's event stream) can end with it.
    pub fn shutdown_signal(&self) -> tokio_util::sync::CancellationToken {
        self.0.shutdown_signal()
    }

    /// The Connector's own durable records, in the runtime's storage (see
    /// [`crate::AuthorStore`]): they ride its group commit and, on PostgreSQL, every replica
    /// sees them.
    pub fn author_store(&self) -> crate::AuthorStore {
        self.0.author_store()
    }

    /// Now, from the injected clock (Unix ms).
    pub fn now_millis(&self) -> u64 {
        self.0.now_millis()
    }

    /// Sets the channel's status (e.g. `degraded`, `offline`, `expired`, `revoked`) and pushes
    /// the new Descriptor.
    pub async fn set_status(
        &self,
        channel: &ConnectorChannelId,
        status: ConnectionStatus,
    ) -> Result<(), HandleError> {
        self.0.set_status(channel, status).await
    }

    /// Reports the state of a channel's device (Device Profile v1): the runtime corrects the
    /// channel's `connection.status` and every device Tool's availability, answers calls
    /// still queued for a device that can no longer take them, and pushes the Descriptor
    /// when it changed. Returns true when the Descriptor changed.
    pub async fn device_status(
        &self,
        channel: &ConnectorChannelId,
        status: DeviceStatus,
    ) -> Result<bool, HandleError> {
        self.0.device_status(channel, status).await
    }

    /// The user confirmed a call of a high-risk device Tool on the channel with exactly these
    /// `arguments` (through the Connector's own means: a prompt on the device showing what
    /// will be done, an approval page). The grant is used by the next call with those same
    /// arguments (compared as canonical JSON), confirms no other call, and expires after the
    /// configured time.
    pub fn grant_confirmation(
        &self,
        channel: &ConnectorChannelId,
        tool: &ToolId,
        arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), HandleError> {
        self.0.grant_confirmation(channel, tool, arguments)
    }

    /// Overrides one Tool's availability on the channel and pushes the new Descriptor. Only
    /// Tools declared in the Card are accepted (others are ignored).
    pub async fn set_tool_status(
        &self,
        channel: &ConnectorChannelId,
        tool: DescriptorTool,
    ) -> Result<(), HandleError> {
        self.0.set_tool_status(channel, tool).await
    }

    /// Replaces the display-level target facts of a signed-in channel and pushes the
    /// Descriptor.
    pub async fn set_target(
        &self,
        channel: &ConnectorChannelId,
        target: DescriptorTarget,
    ) -> Result<(), HandleError> {
        self.0.set_target(channel, target).await
    }

    /// Pushes the channel's current Descriptor (when routed). Returns whether it was queued.
    pub async fn push_descriptor(&self, channel: &ConnectorChannelId) -> bool {
        self.0.push_descriptor(channel).await
    }

    /// Sends a `tool.progress.push` on the channel (when routed).
    pub async fn push_tool_progress(&self, channel: &ConnectorChannelId, push: ToolProgressPush) {
        self.0.push_tool_progress(channel, push).await;
    }

    /// Starts (first user) or joins the shared consumer `key` for `channel`. `start` runs only
    /// when no channel uses the consumer yet and returns how to stop it; the runtime stops it
    /// when the last channel signs out or is unregistered. Returns true when started. `start`
    /// runs without any runtime lock held (it may call this handle) and is panic-contained.
    pub fn attach_consumer(
        &self,
        key: &str,
        channel: &ConnectorChannelId,
        start: impl FnOnce() -> StopFn,
    ) -> bool {
        if self.0.consumer_join(key, channel) {
            return false;
        }
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(start));
        let Ok(stop) = started else {
            tracing::error!(consumer = key, "starting a shared consumer panicked; contained");
            return false;
        };
        // Another channel may have started the same consumer meanwhile: keep theirs.
        match self.0.consumer_insert(key, channel, stop) {
            Some(stop) => {
                stop();
                false
            }
            None => true,
        }
    }

    /// Like [`ConnectorHandle::attach_consumer`] for a consumer of the target system that must
    /// run on exactly one replica when several share a database (an MQTT subscription, a
    /// poller): every replica that needs it calls this, the one that wins the consumer's lease
    /// runs it, and when that replica dies (or cannot renew for 5 s) another one starts it
    /// with `start` again. Alone, it is `attach_consumer`: returns true when started. On
    /// replicas, true when newly wanted here (it starts within about a second wherever its
    /// lease is won).
    pub fn attach_replicated_consumer(
        &self,
        key: &str,
        channel: &ConnectorChannelId,
        start: impl Fn() -> StopFn + Send + Sync + 'static,
    ) -> bool {
        self.want_consumer(key, channel, Arc::new(start), false)
    }

    /// Like [`ConnectorHandle::attach_replicated_consumer`] for a consumer whose state the
    /// Tool calls read (a device's retained values): it runs on the replica holding xAgent's
    /// data plane, and moves with it (stopped where the data plane left, started where it
    /// arrived, within about a second; after a killed holder, once its lease ran out).
    pub fn attach_data_plane_consumer(
        &self,
        key: &str,
        channel: &ConnectorChannelId,
        start: impl Fn() -> StopFn + Send + Sync + 'static,
    ) -> bool {
        self.want_consumer(key, channel, Arc::new(start), true)
    }

    fn want_consumer(
        &self,
        key: &str,
        channel: &ConnectorChannelId,
        start: StartFn,
        with_data_plane: bool,
    ) -> bool {
        match self.0.consumer_want(key, channel, Arc::clone(&start), with_data_plane) {
            Some(wanted) => wanted,
            None => self.attach_consumer(key, channel, || start()),
        }
    }

    /// Releases `channel`'s use of the consumer `key`, stopping it if it was the last user.
    pub fn detach_consumer(&self, key: &str, channel: &ConnectorChannelId) {
        if let Some(stop) = self.0.consumer_detach(key, channel) {
            stop();
        }
    }

    /// Number of channels using the consumer `key`.
    pub fn consumer_users(&self, key: &str) -> usize {
        self.0.consumer_users(key)
    }

    /// Tells every replica of this Connector (this one included) that something happened, as
    /// a short hint: `topic` at most [`crate::storage::MAX_BROADCAST_TOPIC_BYTES`], `message` at most
    /// [`crate::storage::MAX_BROADCAST_MESSAGE_BYTES`]. Delivered at most once to each replica's
    /// subscribers, and lost for a replica that is restarting: send what changed as a pointer
    /// into durable state (the author store), never as the state itself. On a storage only one
    /// process uses, only this process hears it.
    pub async fn broadcast(&self, topic: &str, message: &str) -> Result<(), HandleError> {
        use crate::storage::{MAX_BROADCAST_MESSAGE_BYTES, MAX_BROADCAST_TOPIC_BYTES};
        for (what, text, limit) in [
            ("topic", topic, MAX_BROADCAST_TOPIC_BYTES),
            ("message", message, MAX_BROADCAST_MESSAGE_BYTES),
        ] {
            if text.len() > limit {
                return Err(HandleError::BroadcastTooLarge { what, size: text.len(), limit });
            }
        }
        self.0.broadcast(topic, message).await
    }

    /// Hears the author broadcasts of every replica from now on (a receiver that falls more
    /// than 1,024 behind skips ahead and is told how many it missed).
    pub fn subscribe_broadcast(&self) -> tokio::sync::broadcast::Receiver<Broadcast> {
        self.0.subscribe_broadcast()
    }

    /// Runs lease expiry and maintenance now (the background task does it periodically).
    pub async fn tick(&self) {
        Arc::clone(&self.0).tick().await;
    }
}
