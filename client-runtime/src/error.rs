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
    /// This side refused to send a packet that breaks the rules the Connector applies on
    /// receive (the same validator, with the admitted Card); nothing was sent. The rule ids
    /// say what to fix.
    #[error("not sent: {message}; fix the packet")]
    Invalid {
        /// The rule ids broken (for example `im.delta.sequence`).
        rules: Vec<String>,
        /// Every violation, rule id first.
        message: String,
    },
    /// The packet is larger than the data plane takes (the outbound size rule); nothing was
    /// sent.
    #[error(
        "not sent: the packet is {bytes} bytes and the data plane takes at most {limit}; send less, or a file through the Transfer Plane"
    )]
    TooLarge {
        /// Its size as text.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The durable store failed.
    #[error(transparent)]
    Store(#[from] xagent_profile_im::StoreError),
}

impl ClientError {
    /// The stable code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::BaseUrl(_)
            | Self::NotAdmissible(_)
            | Self::Protocol(_)
            | Self::Invalid { .. } => ErrorCode::InvalidPacket,
            Self::Transport { .. } | Self::Http { .. } | Self::NotConnected | Self::Closed => {
                ErrorCode::ConnectorChannelUnavailable
            }
            Self::Unauthorized { .. } => ErrorCode::Unauthorized,
            Self::Timeout { .. } => ErrorCode::Timeout,
            Self::Remote(error) | Self::Refused(error) | Self::Withheld(error) => {
                error.code.clone()
            }
            Self::TooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::Store(_) => ErrorCode::InternalError,
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
