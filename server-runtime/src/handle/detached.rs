//! [`ConnectorHandle::detached`]: a handle with no runtime behind it, for unit tests of
//! author code. What it can do for real it does (an author store in an in-memory SQLite
//! database, shared consumers, broadcasts heard by this process, the clock, a shutdown
//! signal); what needs a runtime connected to xAgent (a channel's status, Descriptor or
//! Tools, messages to xAgent, files, confirmations) answers [`HandleError::Detached`]. It
//! knows no channel: no runtime signed one in.

use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use xagent_file_transfer::FileStore;
use xagent_profile_im::{OutboundPayload, OutboxEvent};
use xagent_protocol_types::{
    Clock, ConnectionDescriptor, ConnectionStatus, ConnectorCard, ConnectorChannelId, ConnectorId,
    DescriptorTarget, DescriptorTool, MessageId, SystemClock, ToolId, ToolProgressPush,
};

use super::{Broadcast, ConnectorHandle, Consumers, DeviceStatus, HandleOps, StartFn, StopFn};
use crate::binding::Binding;
use crate::error::HandleError;
use crate::storage::{SqliteStorage, Storage, WriteOp};

/// How many author broadcasts a slow subscriber may fall behind (as in the runtime).
const BROADCAST_BACKLOG: usize = 1024;

/// The runtime side of a detached handle.
struct Detached {
    storage: Arc<dyn Storage>,
    consumers: Mutex<Consumers>,
    broadcasts: tokio::sync::broadcast::Sender<Broadcast>,
    shutdown: tokio_util::sync::CancellationToken,
}

impl Detached {
    fn consumers(&self) -> MutexGuard<'_, Consumers> {
        self.consumers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ConnectorHandle {
    /// A handle with no socket, no xAgent and no runtime behind it, for unit tests of
    /// handlers (see `ToolContext::for_test`). Its author store is a fresh in-memory
    /// database, shared consumers and broadcasts work within the process, and
    /// [`ConnectorHandle::now_millis`] is the system clock. It knows no channel, and every
    /// call that needs a Connector connected to xAgent (statuses, Descriptors, messages,
    /// files, confirmations) returns [`HandleError::Detached`]; pushes are not sent.
    pub fn detached() -> Result<Self, HandleError> {
        let storage = SqliteStorage::in_memory()?;
        let (broadcasts, _) = tokio::sync::broadcast::channel(BROADCAST_BACKLOG);
        Ok(Self::new(Arc::new(Detached {
            storage: Arc::new(storage),
            consumers: Mutex::default(),
            broadcasts,
            shutdown: tokio_util::sync::CancellationToken::new(),
        })))
    }
}

/// The refusal of everything that needs a connected runtime.
fn detached<T: Send + 'static>(what: &'static str) -> BoxFuture<'static, Result<T, HandleError>> {
    async move { Err(HandleError::Detached(what)) }.boxed()
}

impl HandleOps for Detached {
    fn card(&self) -> Option<&ConnectorCard> {
        None
    }
    fn connector_id(&self) -> Option<ConnectorId> {
        None
    }
    fn is_online(&self) -> bool {
        false
    }
    fn channels(&self) -> Vec<ConnectorChannelId> {
        Vec::new()
    }
    fn has_channel(&self, _channel: &ConnectorChannelId) -> bool {
        false
    }
    fn is_routed(&self, _channel: &ConnectorChannelId) -> bool {
        false
    }
    fn binding(&self, _channel: &ConnectorChannelId) -> Option<Binding> {
        None
    }
    fn descriptor(&self, _channel: &ConnectorChannelId) -> Option<ConnectionDescriptor> {
        None
    }
    fn shutdown_signal(&self) -> tokio_util::sync::CancellationToken {
        self.shutdown.clone()
    }
    fn now_millis(&self) -> u64 {
        SystemClock.now_millis()
    }
    fn set_status(
        &self,
        _channel: &ConnectorChannelId,
        _status: ConnectionStatus,
    ) -> BoxFuture<'_, Result<(), HandleError>> {
        detached("set_status")
    }
    fn device_status(
        &self,
        _channel: &ConnectorChannelId,
        _status: DeviceStatus,
    ) -> BoxFuture<'_, Result<bool, HandleError>> {
        detached("device_status")
    }
    fn grant_confirmation(
        &self,
        _channel: &ConnectorChannelId,
        _tool: &ToolId,
        _arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), HandleError> {
        Err(HandleError::Detached("grant_confirmation"))
    }
    fn set_tool_status(
        &self,
        _channel: &ConnectorChannelId,
        _tool: DescriptorTool,
    ) -> BoxFuture<'_, Result<(), HandleError>> {
        detached("set_tool_status")
    }
    fn set_target(
        &self,
        _channel: &ConnectorChannelId,
        _target: DescriptorTarget,
    ) -> BoxFuture<'_, Result<(), HandleError>> {
        detached("set_target")
    }
    fn push_descriptor(&self, _channel: &ConnectorChannelId) -> BoxFuture<'_, bool> {
        async { false }.boxed()
    }
    fn push_tool_progress(
        &self,
        _channel: &ConnectorChannelId,
        _push: ToolProgressPush,
    ) -> BoxFuture<'_, ()> {
        async {}.boxed()
    }
    fn consumer_join(&self, key: &str, channel: &ConnectorChannelId) -> bool {
        self.consumers().join(key, channel)
    }
    fn consumer_insert(
        &self,
        key: &str,
        channel: &ConnectorChannelId,
        stop: StopFn,
    ) -> Option<StopFn> {
        self.consumers().insert(key, channel, stop)
    }
    fn consumer_detach(&self, key: &str, channel: &ConnectorChannelId) -> Option<StopFn> {
        self.consumers().detach(key, channel)
    }
    fn consumer_users(&self, key: &str) -> usize {
        self.consumers().users(key)
    }
    fn consumer_want(
        &self,
        _key: &str,
        _channel: &ConnectorChannelId,
        _start: StartFn,
        _with_data_plane: bool,
    ) -> Option<bool> {
        // Alone: a replicated consumer is a shared one here.
        None
    }
    fn tick(self: Arc<Self>) -> BoxFuture<'static, ()> {
        // No lease and no channel to expire.
        async {}.boxed()
    }
    fn enqueue_message(
        self: Arc<Self>,
        _profile: &'static str,
        _channel: ConnectorChannelId,
        _payload: OutboundPayload,
        _extra: Vec<WriteOp>,
    ) -> BoxFuture<'static, Result<(), HandleError>> {
        detached("sending a message to xAgent")
    }
    fn outbox_events(&self) -> Option<tokio::sync::broadcast::Receiver<OutboxEvent>> {
        None
    }
    fn pending_messages(&self, _channel: &ConnectorChannelId) -> Vec<MessageId> {
        Vec::new()
    }
    fn files(&self) -> Result<&FileStore, HandleError> {
        Err(HandleError::Detached("the Transfer Plane"))
    }
    fn author_store(&self) -> crate::AuthorStore {
        crate::AuthorStore::new(Arc::clone(&self.storage))
    }
    fn broadcast(&self, topic: &str, message: &str) -> BoxFuture<'_, Result<(), HandleError>> {
        let broadcast = Broadcast { topic: topic.to_owned(), message: message.to_owned() };
        // No subscriber is not a failure: nobody listens.
        let _ = self.broadcasts.send(broadcast);
        async { Ok(()) }.boxed()
    }
    fn subscribe_broadcast(&self) -> tokio::sync::broadcast::Receiver<Broadcast> {
        self.broadcasts.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::{ChatMessage, ErrorCode};

    fn channel() -> ConnectorChannelId {
        ConnectorChannelId::new("ch_test")
    }

    #[tokio::test]
    async fn a_detached_handle_refuses_what_needs_xagent_with_a_typed_error() {
        let handle = ConnectorHandle::detached().unwrap();
        let sent = handle.send_message(&channel(), ChatMessage::text("m1", "hello")).await;
        let Err(HandleError::Detached(what)) = sent else { panic!("{sent:?}") };
        assert!(what.contains("message"), "{what}");
        let status = handle.set_status(&channel(), ConnectionStatus::Degraded).await;
        let error = status.unwrap_err();
        assert_eq!(error.code(), ErrorCode::ChannelNotOpen);
        assert!(error.to_string().contains("detached"), "{error}");
        let file = handle.register_file(&channel(), "a.txt", None, b"x").await;
        assert!(matches!(file, Err(HandleError::Detached(_))), "{file:?}");
        assert!(!handle.push_descriptor(&channel()).await);
        assert!(handle.channels().is_empty() && !handle.is_online());
    }

    #[tokio::test]
    async fn a_detached_handle_keeps_author_records_in_memory() {
        let handle = ConnectorHandle::detached().unwrap();
        let store = handle.author_store();
        store.put("notes", "a", b"one".to_vec()).await.unwrap();
        assert_eq!(store.get("notes", "a").await.unwrap().as_deref(), Some(&b"one"[..]));
        // Each detached handle has its own database.
        let other = ConnectorHandle::detached().unwrap().author_store();
        assert_eq!(other.get("notes", "a").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_detached_handle_runs_shared_consumers_and_broadcasts() {
        let handle = ConnectorHandle::detached().unwrap();
        let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&stopped);
        let started = handle.attach_consumer("poller", &channel(), move || {
            Box::new(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
        });
        assert!(started);
        assert_eq!(handle.consumer_users("poller"), 1);
        handle.detach_consumer("poller", &channel());
        assert!(stopped.load(std::sync::atomic::Ordering::SeqCst));
        let mut heard = handle.subscribe_broadcast();
        handle.broadcast("rooms", "r1").await.unwrap();
        assert_eq!(heard.recv().await.unwrap().message, "r1");
    }
}
