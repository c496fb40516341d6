//! Errors of the xAgent-side runtime, each with the protocol's stable code.

use xagent_protocol_types::{ErrorCode, WireError};

use crate::BaseUrlError;

/// What went wrong on the xAgent side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The Base URL breaks a rule.
    #[error(transparent)]
    BaseUrl(#[from] BaseUrlError),
    /// An HTTP request failed before a response arrived.
    #[error(
        "request to {endpoint} failed: {reason}; check that the Connector is running and reachable"
    )]
    Transport {
        /// Which endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// The system API key was refused (401/403).
    #[error("{endpoint} refused the system API key (HTTP {status}); check the configured key")]
    Unauthorized {
        /// Which endpoint.
        endpoint: String,
        /// 401 or 403.
        status: u16,
    },
    /// An HTTP response other than the expected one.
    #[error("{endpoint} answered HTTP {status}: {body}")]
    Http {
        /// Which endpoint.
        endpoint: String,
        /// Status code.
        status: u16,
        /// Start of the body, for diagnosis.
        body: String,
    },
    /// The Connector's documents or behaviour break the protocol.
    #[error("the Connector is not admissible: {0}")]
    NotAdmissible(String),
    /// The data plane is not connected.
    #[error("the data plane is not connected; wait for the reconnect or call connect again")]
    NotConnected,
    /// No ack arrived in time.
    #[error("no {expected} arrived within {millis} ms")]
    Timeout {
        /// The ack type awaited.
        expected: &'static str,
        /// The timeout.
        millis: u64,
    },
    /// The peer answered with an error.
    #[error("the Connector answered with an error: {0}")]
    Remote(WireError),
    /// A packet from the peer could not be understood.
    #[error("the Connector sent an invalid packet: {0}")]
    Protocol(String),
    /// The client was shut down.
    #[error("the client is closed")]
    Closed,
    /// This side refused: a packet from the Connector broke a rule, or a call cannot be made
    /// (channel resolution, ownership, arguments). The code is the spec's.
    #[error("refused ({}): {}", .0.code, .0.message())]
    Refused(WireError),
    /// The session withheld an outgoing packet: it may not be sent now (before
    /// `connector.hello.ack`, or on a channel not open on this connection).
    #[error("not sent ({}): {}; wait until the connection and the channel are open", .0.code, .0.message())]
    Withheld(WireError),
    /// The durable store failed.
    #[error(transparent)]
    Store(#[from] xagent_profile_im::StoreError),
    /// A `chat.message.delta` was not sent: its `sequence` is not the next one of its message
    /// (0, a gap, or a repeat with other text), or a per-message bound was reached; the same
    /// verdict the Connector would give.
    #[error("delta not sent: {0}")]
    Delta(#[from] xagent_profile_im::DeltaError),
    /// A delta for a message that is already final (its `chat.message` was queued) or whose
    /// stream expired: the Connector would ignore it.
    #[error(
        "delta not sent: message {message_id} on channel {channel} is already final or its stream expired; stream a new message under a new message_id"
    )]
    StreamClosed {
        /// The channel.
        channel: xagent_protocol_types::ConnectorChannelId,
        /// The message.
        message_id: xagent_protocol_types::MessageId,
    },
    /// A file of an assistant message is not one this client uploaded on the message's
    /// channel, or it expired.
    #[error(transparent)]
    OutboundFile(#[from] crate::OutboundFileError),
    /// `supports.user_channel_mode` is `single` and the user already has a channel.
    #[error(transparent)]
    UserChannelLimit(#[from] crate::UserChannelLimit),
}

impl ClientError {
    /// The stable code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::BaseUrl(_) | Self::NotAdmissible(_) | Self::Protocol(_) => {
                ErrorCode::InvalidPacket
            }
            Self::Transport { .. } | Self::Http { .. } | Self::NotConnected | Self::Closed => {
                ErrorCode::ConnectorChannelUnavailable
            }
            Self::Unauthorized { .. } => ErrorCode::Unauthorized,
            Self::Timeout { .. } => ErrorCode::Timeout,
            Self::Remote(error) | Self::Refused(error) | Self::Withheld(error) => {
                error.code.clone()
            }
            Self::Store(_) => ErrorCode::InternalError,
            Self::Delta(error) => error.code(),
            Self::StreamClosed { .. } => ErrorCode::SequenceConflict,
            Self::OutboundFile(error) => error.code(),
            Self::UserChannelLimit(_) => ErrorCode::CapacityExceeded,
        }
    }

    /// True when retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Transport { .. }
                | Self::NotConnected
                | Self::Timeout { .. }
                | Self::Http { .. }
                | Self::Withheld(_)
        )
    }
}
