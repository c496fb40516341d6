//! [`ConnectorHandle`]: the author's handle on the running Connector, in one place: channel
//! facts, Descriptor and status changes, Tool progress, shared consumers, inbound IM messages
//! and files.

use std::sync::Arc;

use xagent_file_transfer::{FileStore, NewFile};
use xagent_profile_im::OutboundPayload;
use xagent_protocol_types::{
    ChatFile, ChatMessage, ConnectionDescriptor, ConnectionStatus, ConnectorChannelId, ConnectorId,
    DescriptorTarget, DescriptorTool, FileRef, MessageId, MessagePush, PROFILE_IM_V1,
    PROFILE_IM_V2, Packet, ToolProgressPush,
};

use crate::binding::Binding;
use crate::error::HandleError;
use crate::ids;
use crate::im::ImState;
use crate::state::{Shared, StopFn};
use crate::storage::ChannelRecord;

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
        self.0.state().route(channel).is_some()
    }

    /// The channel's binding, if signed in.
    pub fn binding(&self, channel: &ConnectorChannelId) -> Option<Binding> {
        self.0.state().channels.get(channel).and_then(|r| r.binding.clone())
    }

    /// The channel's current Descriptor.
    pub fn descriptor(&self, channel: &ConnectorChannelId) -> Option<ConnectionDescriptor> {
        self.0.current_descriptor(channel)
    }

    /// The runtime's shutdown signal: cancelled when the server starts shutting down, so the
    /// author's long-running work (a poller, a page's event stream) can end with it.
    pub fn shutdown_signal(&self) -> tokio_util::sync::CancellationToken {
        self.0.shutdown.clone()
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

    /// Reports the state of a channel's device (Device Profile v1): the runtime corrects the
    /// channel's `connection.status` and every device Tool's availability, answers calls
    /// still queued for a device that can no longer take them, and pushes the Descriptor
    /// when it changed. Returns true when the Descriptor changed.
    pub async fn device_status(
        &self,
        channel: &ConnectorChannelId,
        status: crate::author::DeviceStatus,
    ) -> Result<bool, HandleError> {
        let Some(device) = &self.0.device else { return Err(HandleError::NoDeviceTarget) };
        {
            let state = self.0.state();
            match state.channels.get(channel) {
                None => return Err(HandleError::UnknownChannel(channel.clone())),
                Some(record) if record.binding.is_none() => {
                    return Err(HandleError::NotAuthenticated(channel.clone()));
                }
                Some(_) => {}
            }
        }
        let Some(correction) = device.report(channel, &status) else {
            tracing::warn!(%channel, "device status for a binding that names no device; ignored");
            return Ok(false);
        };
        let mut changed = false;
        self.update_channel(channel, |record| changed = device.project(record, &correction))?;
        if changed {
            tracing::info!(%channel, status = ?status, "device status changed");
            self.0.push_descriptor(channel).await;
        }
        Ok(changed)
    }

    /// The user confirmed the next call of a high-risk device Tool on the channel (through
    /// the Connector's own means: a prompt on the device, an approval page). The grant is
    /// used by that one call and expires after the configured time.
    pub fn grant_confirmation(
        &self,
        channel: &ConnectorChannelId,
        tool: &xagent_protocol_types::ToolId,
    ) -> Result<(), HandleError> {
        let Some(device) = &self.0.device else { return Err(HandleError::NoDeviceTarget) };
        device.grant(channel, tool, self.0.now());
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
    /// when the last channel signs out or is unregistered. Returns true when started. `start`
    /// runs without any runtime lock held (it may call this handle) and is panic-contained.
    pub fn attach_consumer(
        &self,
        key: &str,
        channel: &ConnectorChannelId,
        start: impl FnOnce() -> StopFn,
    ) -> bool {
        if self.0.state().consumers.join(key, channel) {
            return false;
        }
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(start));
        let Ok(stop) = started else {
            tracing::error!(consumer = key, "starting a shared consumer panicked; contained");
            return false;
        };
        // Another channel may have started the same consumer meanwhile: keep theirs.
        let surplus = self.0.state().consumers.insert(key, channel, stop);
        match surplus {
            Some(stop) => {
                stop();
                false
            }
            None => true,
        }
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

    // ---------------------------------------------------------------- IM

    /// Hands an inbound target message to xAgent as an IM v2 `chat.message`: the outbox takes
    /// responsibility (persisted, TTL from now), sends it when the channel is routed and
    /// redelivers it until xAgent acknowledges it. Refused (`ProfileNotDeclared`) when the Card
    /// does not declare `xagent.im.v2`.
    pub async fn send_message(
        &self,
        channel: &ConnectorChannelId,
        message: ChatMessage,
    ) -> Result<(), HandleError> {
        let im = self.im_state(PROFILE_IM_V2)?;
        im.enqueue(&self.0, channel, OutboundPayload::ChatMessage(message)).await
    }

    /// Hands an inbound target message to xAgent as an IM v1 `message.push` (build it with
    /// `profile-im`'s v1 builder). The successful socket write is its delivery boundary.
    /// Refused (`ProfileNotDeclared`) when the Card does not declare `xagent.im.v1`.
    pub async fn push_message(
        &self,
        channel: &ConnectorChannelId,
        push: MessagePush,
    ) -> Result<(), HandleError> {
        let im = self.im_state(PROFILE_IM_V1)?;
        im.enqueue(&self.0, channel, OutboundPayload::from(push)).await
    }

    /// The IM state, when the Card declares `profile`: a `chat.message` on an IM v1 channel (or
    /// a `message.push` on an IM v2 one) could never be written and would stay pending.
    fn im_state(&self, profile: &'static str) -> Result<&ImState, HandleError> {
        let declared = self.0.def.card.supports.profiles.iter().any(|p| p.as_str() == profile);
        match &self.0.im {
            Some(im) if declared => Ok(im),
            _ => Err(HandleError::ProfileNotDeclared(profile)),
        }
    }

    /// Subscribes to the IM outbox's facts (delivered, failed for good, expired, ...), so an
    /// author can show the fate of an inbound message in the target system. `None` when the
    /// Card declares no IM Profile. A slow subscriber loses the oldest events (`Lagged`).
    pub fn outbox_events(
        &self,
    ) -> Option<tokio::sync::broadcast::Receiver<xagent_profile_im::OutboxEvent>> {
        self.0.im.as_ref().map(|im| im.events.subscribe())
    }

    /// Message ids still pending towards xAgent on a channel.
    pub fn pending_messages(&self, channel: &ConnectorChannelId) -> Vec<MessageId> {
        self.0.im.as_ref().map(|im| im.pending(channel)).unwrap_or_default()
    }

    // ---------------------------------------------------------------- files

    fn store(&self) -> Result<&FileStore, HandleError> {
        self.0.files.as_ref().ok_or(HandleError::FilesDisabled)
    }

    /// Caches an inbound file from the target system for `channel` and returns the
    /// `chat.message.files[]` item with a signed `download_url` (put it in a message sent with
    /// [`ConnectorHandle::send_message`]).
    pub async fn register_file(
        &self,
        channel: &ConnectorChannelId,
        filename: &str,
        mime_type: Option<&str>,
        bytes: impl AsRef<[u8]>,
    ) -> Result<ChatFile, HandleError> {
        if !self.0.state().channels.contains_key(channel) {
            return Err(HandleError::UnknownChannel(channel.clone()));
        }
        let mut new_file = NewFile::new(channel.clone(), filename);
        if let Some(mime) = mime_type {
            new_file = new_file.with_mime_type(mime);
        }
        let stored = self.store()?.register_bytes(new_file, bytes).await?;
        Ok(stored.chat_file())
    }

    /// [`ConnectorHandle::register_file`] for a file arriving as a stream of chunks (a
    /// visitor's upload, a target-system download): written to the store as it comes, never
    /// held whole in memory. More than `max_bytes` is refused with the Transfer Plane's
    /// `TooLarge` (HTTP 413) and nothing is kept; a full store is its `CapacityExceeded` (507).
    pub async fn register_file_stream<S, B, E>(
        &self,
        channel: &ConnectorChannelId,
        filename: &str,
        mime_type: Option<&str>,
        max_bytes: u64,
        stream: S,
    ) -> Result<ChatFile, HandleError>
    where
        S: futures_util::Stream<Item = Result<B, E>>,
        B: AsRef<[u8]>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if !self.0.state().channels.contains_key(channel) {
            return Err(HandleError::UnknownChannel(channel.clone()));
        }
        let mut new_file = NewFile::new(channel.clone(), filename).with_max_bytes(max_bytes);
        if let Some(mime) = mime_type {
            new_file = new_file.with_mime_type(mime);
        }
        let stored = self.store()?.register_stream(new_file, stream).await?;
        Ok(stored.chat_file())
    }

    /// Opens a file xAgent uploaded for `channel` (a `file_ref` from an outbound
    /// `chat.message`); a reference of another channel is refused.
    pub async fn open_file(
        &self,
        channel: &ConnectorChannelId,
        file_ref: &FileRef,
    ) -> Result<(xagent_file_transfer::FileRecord, tokio::fs::File), HandleError> {
        let (record, file) = self.store()?.open_file(file_ref).await?;
        if &record.connector_channel_id != channel {
            return Err(HandleError::FileOwnership);
        }
        Ok((record, file))
    }
}
