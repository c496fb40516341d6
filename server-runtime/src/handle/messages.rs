//! The handle's IM and file calls: inbound target messages to xAgent through the outbox, the
//! outbox's events, and files registered with the Transfer Plane.

use std::sync::Arc;

use xagent_file_transfer::{FileStore, NewFile};
use xagent_profile_im::{OutboundPayload, OutboxEvent};
use xagent_protocol_types::{
    ChatFile, ChatMessage, ConnectorChannelId, FileRef, MessageId, MessagePush, PROFILE_IM_V1,
    PROFILE_IM_V2,
};

use super::ConnectorHandle;
use crate::error::HandleError;

impl ConnectorHandle {
    /// Hands an inbound target message to xAgent as an IM v2 `chat.message`: the outbox takes
    /// responsibility (persisted, TTL from now), sends it when the channel is routed and
    /// redelivers it until xAgent acknowledges it. Refused (`ProfileNotDeclared`) when the Card
    /// does not declare `xagent.im.v2`.
    pub async fn send_message(
        &self,
        channel: &ConnectorChannelId,
        message: ChatMessage,
    ) -> Result<(), HandleError> {
        let payload = OutboundPayload::ChatMessage(message);
        Arc::clone(&self.0)
            .enqueue_message(PROFILE_IM_V2, channel.clone(), payload, Vec::new())
            .await
    }

    /// [`ConnectorHandle::send_message`] with records of the author's stored in the same
    /// transaction as the message's outbox record: when this returns `Ok` both are durable,
    /// and when it fails neither was stored (one commit instead of two, and no record of a
    /// message the outbox never took). The writes were checked when they were made
    /// ([`crate::AuthorWrite`]); they share the outbox's submission, so a backend refusing
    /// one fails the messages queued with it too.
    pub async fn send_message_with(
        &self,
        channel: &ConnectorChannelId,
        message: ChatMessage,
        writes: Vec<crate::AuthorWrite>,
    ) -> Result<(), HandleError> {
        let payload = OutboundPayload::ChatMessage(message);
        let extra = writes.into_iter().map(crate::AuthorWrite::into_write_op).collect();
        Arc::clone(&self.0).enqueue_message(PROFILE_IM_V2, channel.clone(), payload, extra).await
    }

    /// Hands an inbound target message to xAgent as an IM v1 `message.push` (build it with
    /// `profile-im`'s v1 builder). The successful socket write is its delivery boundary.
    /// Refused (`ProfileNotDeclared`) when the Card does not declare `xagent.im.v1`, and
    /// refused (`invalid_packet`, `message_push.card_reference`) when it cites a reply Tool,
    /// a Skill or, in its `activation_message`, a Tool id or Skill name the Card does not
    /// declare: xAgent's judge refuses such a push, so it is never queued.
    pub async fn push_message(
        &self,
        channel: &ConnectorChannelId,
        push: MessagePush,
    ) -> Result<(), HandleError> {
        let card = self.0.card().ok_or(HandleError::Detached("push_message"))?;
        let facts = xagent_protocol_validate::CardFacts::from_card(card);
        xagent_profile_im::validate_message_push_for(&push, &facts)
            .map_err(xagent_profile_im::OutboxError::from)?;
        let payload = OutboundPayload::from(push);
        Arc::clone(&self.0)
            .enqueue_message(PROFILE_IM_V1, channel.clone(), payload, Vec::new())
            .await
    }

    /// Subscribes to the IM outbox's facts (delivered, failed for good, expired, ...), so an
    /// author can show the fate of an inbound message in the target system. `None` when the
    /// Card declares no IM Profile. A slow subscriber loses the oldest events (`Lagged`).
    pub fn outbox_events(&self) -> Option<tokio::sync::broadcast::Receiver<OutboxEvent>> {
        self.0.outbox_events()
    }

    /// Message ids still pending towards xAgent on a channel.
    pub fn pending_messages(&self, channel: &ConnectorChannelId) -> Vec<MessageId> {
        self.0.pending_messages(channel)
    }

    // ---------------------------------------------------------------- files

    fn store(&self) -> Result<&FileStore, HandleError> {
        self.0.files()
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
        let store = self.store()?;
        if !self.0.has_channel(channel) {
            return Err(HandleError::UnknownChannel(channel.clone()));
        }
        let mut new_file = NewFile::new(channel.clone(), filename);
        if let Some(mime) = mime_type {
            new_file = new_file.with_mime_type(mime);
        }
        let stored = store.register_bytes(new_file, bytes).await?;
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
        let store = self.store()?;
        if !self.0.has_channel(channel) {
            return Err(HandleError::UnknownChannel(channel.clone()));
        }
        let mut new_file = NewFile::new(channel.clone(), filename).with_max_bytes(max_bytes);
        if let Some(mime) = mime_type {
            new_file = new_file.with_mime_type(mime);
        }
        let stored = store.register_stream(new_file, stream).await?;
        Ok(stored.chat_file())
    }

    /// Opens a file xAgent uploaded for `channel` (a `file_ref` from an outbound
    /// `chat.message`); a reference of another channel is refused.
    pub async fn open_file(
        &self,
        channel: &ConnectorChannelId,
        file_ref: &FileRef,
    ) -> Result<(xagent_file_transfer::FileRecord, xagent_file_transfer::FileReader), HandleError>
    {
        let (record, file) = self.store()?.open_file(file_ref).await?;
        if &record.connector_channel_id != channel {
            return Err(HandleError::FileOwnership);
        }
        Ok((record, file))
    }
}
