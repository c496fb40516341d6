//! An inbound `chat.message` and the application's verdict on it.

use tokio::sync::oneshot;
use xagent_protocol_types::{ChatMessage, ConnectorChannelId};

/// An inbound `chat.message` awaiting the application's verdict. Dropping it unanswered
/// rejects it as retryable (`channel_busy`), so the Connector redelivers it.
#[derive(Debug)]
pub struct InboundMessage {
    /// The channel it arrived on.
    pub channel: ConnectorChannelId,
    /// The message.
    pub message: ChatMessage,
    /// The application's references of the message's files, in order, when a
    /// [`crate::FileSink`] is set (the files were downloaded and saved before this event).
    pub saved_files: Vec<String>,
    responder: Option<oneshot::Sender<Verdict>>,
}

/// The application's answer to an inbound message.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Accepted: its effect is done.
    Accept,
    /// Rejected with a stable code; `retryable` says whether redelivery may succeed.
    Reject {
        /// Stable code.
        code: xagent_protocol_types::ErrorCode,
        /// Short reason.
        message: String,
        /// Whether the same message may succeed later.
        retryable: bool,
    },
}

impl InboundMessage {
    pub(crate) fn with_responder(
        channel: ConnectorChannelId,
        message: ChatMessage,
        responder: oneshot::Sender<Verdict>,
        saved_files: Vec<String>,
    ) -> Self {
        Self { channel, message, saved_files, responder: Some(responder) }
    }

    /// Accepts the message (call after its effect is done).
    pub fn accept(mut self) {
        if let Some(responder) = self.responder.take() {
            let _ = responder.send(Verdict::Accept);
        }
    }

    /// Rejects the message.
    pub fn reject(
        mut self,
        code: xagent_protocol_types::ErrorCode,
        message: impl Into<String>,
        retryable: bool,
    ) {
        if let Some(responder) = self.responder.take() {
            let _ = responder.send(Verdict::Reject { code, message: message.into(), retryable });
        }
    }
}

impl Drop for InboundMessage {
    fn drop(&mut self) {
        if let Some(responder) = self.responder.take() {
            let _ = responder.send(Verdict::Reject {
                code: xagent_protocol_types::ErrorCode::ChannelBusy,
                message: "the message was not handled".into(),
                retryable: true,
            });
        }
    }
}
