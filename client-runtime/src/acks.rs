//! The fate of an assistant message, for a caller that wants to wait for it: the ack that
//! ended its delivery (`accepted`, `duplicate`, or a rejection that is not retryable), kept
//! for the last [`crate::RECENT_SETTLED_ACKS`] messages so a caller who starts waiting after the ack
//! arrived still learns it. A retryable rejection does not end anything (the outbox delivers
//! the message again), so it is not reported here.
//!
//! The runtime records every settling ack itself as the outbox applies it; an application asks
//! with [`DataPlane::settled_ack`] instead of keeping its own buffer of
//! [`crate::ClientEvent::ChatMessageAcked`] events.

use std::time::Duration;

use xagent_protocol_types::{ChatMessageAck, ConnectorChannelId, MessageId};

use crate::DataPlane;

impl DataPlane {
    /// Waits up to `within` for the Connector's final answer on an assistant message queued
    /// with [`DataPlane::send_chat_message`] (or `connector_message_send`): the ack that ended
    /// its delivery. A retryable rejection keeps waiting, since the outbox delivers the message
    /// again. `None` when the time passes first (the message may still be delivered later).
    pub async fn settled_ack(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        within: Duration,
    ) -> Option<ChatMessageAck> {
        let persisted = self.shared().im.lock().await.persisted(channel);
        self.shared().settled.wait(&persisted, message_id, within).await
    }
}
