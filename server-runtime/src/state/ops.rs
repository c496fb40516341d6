//! What the author's [`ConnectorHandle`] asks of the runtime ([`HandleOps`]), answered from
//! the shared state: channel facts, Descriptor and status changes, consumers, the IM outbox,
//! the file store.

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use xagent_file_transfer::FileStore;
use xagent_profile_im::{OutboundPayload, OutboxEvent};
use xagent_protocol_types::{
    ConnectionDescriptor, ConnectionStatus, ConnectorChannelId, ConnectorId, DescriptorTarget,
    DescriptorTool, MessageId, Packet, ToolId, ToolProgressPush,
};

use super::Shared;
use crate::binding::Binding;
use crate::error::HandleError;
use crate::handle::{Broadcast, ConnectorHandle, DeviceStatus, HandleOps, StartFn, StopFn};
use crate::ids;
use crate::im::ImState;
use crate::storage::ChannelRecord;

impl Shared {
    /// The author's handle on this runtime.
    pub(crate) fn handle(self: &Arc<Self>) -> ConnectorHandle {
        ConnectorHandle::new(Arc::clone(self) as Arc<dyn HandleOps>)
    }

    async fn update_channel(
        &self,
        channel: &ConnectorChannelId,
        change: impl FnOnce(&mut ChannelRecord),
    ) -> Result<(), HandleError> {
        let record = {
            let mut state = self.state();
            let record = state
                .channels
                .get_mut(channel)
                .ok_or_else(|| HandleError::UnknownChannel(channel.clone()))?;
            change(record);
            self.commit_channel(record)
        };
        record.committed().await?;
        Ok(())
    }

    /// Hands the broadcast (its sizes checked by the handle) to this replica's subscribers and, on a shared
    /// database, to the others (a wake-up through the group commit, heard once it commits).
    async fn broadcast_now(&self, topic: String, message: String) -> Result<(), HandleError> {
        use crate::storage::Notice;
        if let Some(cluster) = &self.cluster {
            let notice = Notice::broadcast(cluster.cluster.replica(), &topic, &message);
            self.storage.commit(vec![notice.into_write()]).committed().await?;
        }
        let _ = self.broadcasts.send(Broadcast { topic, message });
        Ok(())
    }

    async fn set_status_now(
        &self,
        channel: &ConnectorChannelId,
        status: ConnectionStatus,
    ) -> Result<(), HandleError> {
        self.update_channel(channel, |record| record.status = status).await?;
        self.push_descriptor(channel).await;
        Ok(())
    }

    async fn device_status_now(
        &self,
        channel: &ConnectorChannelId,
        status: DeviceStatus,
    ) -> Result<bool, HandleError> {
        let Some(device) = &self.device else { return Err(HandleError::NoDeviceTarget) };
        self.require_signed_in(channel)?;
        let Some(correction) = device.report(channel, &status) else {
            tracing::warn!(%channel, "device status for a binding that names no device; ignored");
            return Ok(false);
        };
        let mut changed = false;
        self.update_channel(channel, |record| changed = device.project(record, &correction))
            .await?;
        if changed {
            tracing::info!(%channel, status = ?status, "device status changed");
            self.push_descriptor(channel).await;
        }
        Ok(changed)
    }

    async fn set_tool_status_now(
        &self,
        channel: &ConnectorChannelId,
        tool: DescriptorTool,
    ) -> Result<(), HandleError> {
        if self.def.card.tool(tool.tool_id.as_str()).is_none() {
            tracing::warn!(tool_id = %tool.tool_id, "ignoring availability of an undeclared tool");
            return Ok(());
        }
        self.update_channel(channel, |record| {
            record.tool_overrides.insert(tool.tool_id.clone(), tool);
        })
        .await?;
        self.push_descriptor(channel).await;
        Ok(())
    }

    async fn set_target_now(
        &self,
        channel: &ConnectorChannelId,
        target: DescriptorTarget,
    ) -> Result<(), HandleError> {
        let mut authenticated = true;
        self.update_channel(channel, |record| match &mut record.binding {
            Some(binding) => binding.target = target,
            None => authenticated = false,
        })
        .await?;
        if !authenticated {
            return Err(HandleError::NotAuthenticated(channel.clone()));
        }
        self.push_descriptor(channel).await;
        Ok(())
    }

    /// The IM state, when the Card declares `profile`: a `chat.message` on an IM v1 channel (or
    /// a `message.push` on an IM v2 one) could never be written and would stay pending.
    fn im_state(&self, profile: &'static str) -> Result<&ImState, HandleError> {
        let declared = self.def.card.supports.profiles.iter().any(|p| p.as_str() == profile);
        match &self.im {
            Some(im) if declared => Ok(im),
            _ => Err(HandleError::ProfileNotDeclared(profile)),
        }
    }
}

impl HandleOps for Shared {
    fn card(&self) -> Option<&xagent_protocol_types::ConnectorCard> {
        Some(&self.def.card)
    }

    fn connector_id(&self) -> Option<ConnectorId> {
        self.state().connector_id.clone()
    }

    fn is_online(&self) -> bool {
        !self.state().live_sockets.is_empty()
    }

    fn channels(&self) -> Vec<ConnectorChannelId> {
        let mut ids: Vec<_> = self.state().channels.keys().cloned().collect();
        ids.sort();
        ids
    }

    fn has_channel(&self, channel: &ConnectorChannelId) -> bool {
        self.state().channels.contains_key(channel)
    }

    fn is_routed(&self, channel: &ConnectorChannelId) -> bool {
        self.state().route(channel).is_some()
    }

    fn binding(&self, channel: &ConnectorChannelId) -> Option<Binding> {
        self.state().channels.get(channel).and_then(|r| r.binding.clone())
    }

    fn descriptor(&self, channel: &ConnectorChannelId) -> Option<ConnectionDescriptor> {
        self.current_descriptor(channel)
    }

    fn shutdown_signal(&self) -> tokio_util::sync::CancellationToken {
        self.shutdown.clone()
    }

    fn now_millis(&self) -> u64 {
        self.now()
    }

    fn set_status(
        &self,
        channel: &ConnectorChannelId,
        status: ConnectionStatus,
    ) -> BoxFuture<'_, Result<(), HandleError>> {
        let channel = channel.clone();
        async move { self.set_status_now(&channel, status).await }.boxed()
    }

    fn device_status(
        &self,
        channel: &ConnectorChannelId,
        status: DeviceStatus,
    ) -> BoxFuture<'_, Result<bool, HandleError>> {
        let channel = channel.clone();
        async move { self.device_status_now(&channel, status).await }.boxed()
    }

    fn grant_confirmation(
        &self,
        channel: &ConnectorChannelId,
        tool: &ToolId,
        arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), HandleError> {
        let Some(device) = &self.device else { return Err(HandleError::NoDeviceTarget) };
        device.grant(channel, tool, arguments, self.now());
        Ok(())
    }

    fn set_tool_status(
        &self,
        channel: &ConnectorChannelId,
        tool: DescriptorTool,
    ) -> BoxFuture<'_, Result<(), HandleError>> {
        let channel = channel.clone();
        async move { self.set_tool_status_now(&channel, tool).await }.boxed()
    }

    fn set_target(
        &self,
        channel: &ConnectorChannelId,
        target: DescriptorTarget,
    ) -> BoxFuture<'_, Result<(), HandleError>> {
        let channel = channel.clone();
        async move { self.set_target_now(&channel, target).await }.boxed()
    }

    fn push_descriptor(&self, channel: &ConnectorChannelId) -> BoxFuture<'_, bool> {
        let channel = channel.clone();
        async move { Shared::push_descriptor(self, &channel).await }.boxed()
    }

    fn push_tool_progress(
        &self,
        channel: &ConnectorChannelId,
        push: ToolProgressPush,
    ) -> BoxFuture<'_, ()> {
        let channel = channel.clone();
        async move {
            let packet =
                self.packet(Packet::with_payload(ids::packet_id(), push)).channel(channel.clone());
            self.send_on_route(&channel, packet).await;
        }
        .boxed()
    }

    fn consumer_join(&self, key: &str, channel: &ConnectorChannelId) -> bool {
        self.state().consumers.join(key, channel)
    }

    fn consumer_insert(
        &self,
        key: &str,
        channel: &ConnectorChannelId,
        stop: StopFn,
    ) -> Option<StopFn> {
        self.state().consumers.insert(key, channel, stop)
    }

    fn consumer_detach(&self, key: &str, channel: &ConnectorChannelId) -> Option<StopFn> {
        self.state().consumers.detach(key, channel)
    }

    fn consumer_users(&self, key: &str) -> usize {
        self.state().consumers.users(key)
    }

    fn consumer_want(
        &self,
        key: &str,
        channel: &ConnectorChannelId,
        start: StartFn,
        with_data_plane: bool,
    ) -> Option<bool> {
        let cluster = self.cluster.as_ref()?;
        let new = self.state().consumers.want(key, channel, start, with_data_plane);
        if new {
            cluster.consumers_wanted.notify_one();
        }
        Some(new)
    }

    fn tick(self: Arc<Self>) -> BoxFuture<'static, ()> {
        async move { Shared::tick(&self).await }.boxed()
    }

    fn enqueue_message(
        self: Arc<Self>,
        profile: &'static str,
        channel: ConnectorChannelId,
        payload: OutboundPayload,
        extra: Vec<crate::storage::WriteOp>,
    ) -> BoxFuture<'static, Result<(), HandleError>> {
        async move {
            let im = self.im_state(profile)?;
            im.enqueue(&self, &channel, payload, extra).await
        }
        .boxed()
    }

    fn outbox_events(&self) -> Option<tokio::sync::broadcast::Receiver<OutboxEvent>> {
        self.im.as_ref().map(|im| im.events.subscribe())
    }

    fn pending_messages(&self, channel: &ConnectorChannelId) -> Vec<MessageId> {
        self.im.as_ref().map(|im| im.pending(channel)).unwrap_or_default()
    }

    fn files(&self) -> Result<&FileStore, HandleError> {
        self.files.as_ref().ok_or(HandleError::FilesDisabled)
    }

    fn broadcast(&self, topic: &str, message: &str) -> BoxFuture<'_, Result<(), HandleError>> {
        let (topic, message) = (topic.to_owned(), message.to_owned());
        async move { self.broadcast_now(topic, message).await }.boxed()
    }

    fn subscribe_broadcast(&self) -> tokio::sync::broadcast::Receiver<Broadcast> {
        self.broadcasts.subscribe()
    }

    fn author_store(&self) -> crate::AuthorStore {
        crate::AuthorStore::new(self.storage.clone())
    }
}
