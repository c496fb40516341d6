//! Streaming one assistant message: `chat.message.delta`s numbered by the runtime, closed by
//! the final `chat.message`.
//!
//! IM v2 (section 6) numbers the deltas of a message 1, 2, 3, ... without gaps, and the final
//! `chat.message` is the only completion fact. The runtime keeps that sequence per message
//! (judged by the same assembler the Connector runs, so a delta it would refuse is refused
//! here first): a [`MessageStream`] never lets a caller choose a `sequence`, and after the
//! final no delta of the message leaves.

use xagent_profile_im::EnqueueOutcome;
use xagent_protocol_types::{ChatMessage, ConnectorChannelId, ErrorCode, MessageId, WireError};

use crate::{ClientError, DataPlane};

/// An assistant message being streamed on one channel ([`DataPlane::stream_message`]).
#[derive(Debug)]
pub struct MessageStream {
    plane: DataPlane,
    channel: ConnectorChannelId,
    message_id: MessageId,
}

impl MessageStream {
    pub(crate) fn new(
        plane: DataPlane,
        channel: ConnectorChannelId,
        message_id: MessageId,
    ) -> Self {
        Self { plane, channel, message_id }
    }

    /// The channel the message goes to.
    pub fn channel(&self) -> &ConnectorChannelId {
        &self.channel
    }

    /// The message's id (the final `chat.message` carries the same).
    pub fn message_id(&self) -> &MessageId {
        &self.message_id
    }

    /// Sends the next text fragment under the next `sequence` (1 for the first) and returns
    /// that sequence. When the write fails the number is taken back (the Connector never saw
    /// the fragment), so the next call uses it again and the Connector never sees a gap.
    pub async fn delta(&mut self, text: impl Into<String>) -> Result<u64, ClientError> {
        let delta = self.plane.next_delta(&self.channel, &self.message_id, text.into()).await?;
        let sequence = delta.sequence;
        self.plane.write_delta(&self.channel, delta, true).await?;
        Ok(sequence)
    }

    /// Queues the final message (its `message_id` must be the stream's): it completes the
    /// message and closes the stream, as [`DataPlane::send_chat_message`] does for any final.
    pub async fn finish(self, message: ChatMessage) -> Result<EnqueueOutcome, ClientError> {
        if message.message_id != self.message_id {
            return Err(ClientError::Refused(WireError::new(
                ErrorCode::InvalidPacket,
                format!(
                    "the final message has message_id {}, but the stream is {}; finish with the streamed message's id",
                    message.message_id, self.message_id
                ),
            )));
        }
        self.plane.send_chat_message(&self.channel, message).await
    }
}
