//! Errors of the xAgent-side runtime, each with the protocol's stable code.

use xagent_protocol_types::{ConnectorChannelId, ErrorCode, FileRef, WireError};

use crate::BaseUrlError;
use crate::download::DownloadError;

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
    /// The TLS handshake refused the Connector's certificate; the problem says what is wrong
    /// and what to change.
    #[error("TLS to {endpoint} failed: {problem}")]
    Tls {
        /// Which endpoint.
        endpoint: String,
        /// What was wrong with the certificate.
        problem: crate::tls::TlsProblem,
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
    /// A packet from the peer could not be understood (a protocol violation of the peer's;
    /// local failures have their own variants).
    #[error("the Connector sent an invalid packet: {0}")]
    Protocol(String),
    /// A local argument or setting is not valid (a URL, a header value, a MIME type, a packet
    /// type that is not a request); nothing was sent.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A packet could not be encoded as JSON; nothing was sent.
    #[error("the packet could not be encoded: {0}")]
    Encode(String),
    /// The outbox refused a message or a change (its capacity, a reused `message_id`, its
    /// store).
    #[error(transparent)]
    Outbox(#[from] xagent_profile_im::OutboxError),
    /// A task of this client stopped unexpectedly (it panicked or was cancelled).
    #[error("{0}")]
    Internal(String),
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
    /// A write was not committed (the backend failed, or the holder lease moved on and this
    /// process may no longer deliver or acknowledge); nothing of it was stored.
    #[error(transparent)]
    Commit(#[from] crate::store::CommitError),
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
        channel: ConnectorChannelId,
        /// The message.
        message_id: xagent_protocol_types::MessageId,
    },
    /// A file of an assistant message is not one this client uploaded on the message's
    /// channel, or it expired.
    #[error(transparent)]
    OutboundFile(#[from] OutboundFileError),
    /// `supports.user_channel_mode` is `single` and the user already has a channel.
    #[error(transparent)]
    UserChannelLimit(#[from] UserChannelLimit),
    /// An inbound file was refused by the download policy or could not be downloaded.
    #[error(transparent)]
    Download(#[from] DownloadError),
}

impl ClientError {
    /// A request or connection to `endpoint` that failed before an answer: [`Self::Tls`] when
    /// the handshake refused the certificate, else [`Self::Transport`] with every cause.
    pub(crate) fn transport(endpoint: &str, error: &(dyn std::error::Error + 'static)) -> Self {
        match crate::tls::TlsProblem::find(error) {
            Some(problem) => Self::Tls { endpoint: endpoint.to_owned(), problem },
            None => Self::Transport {
                endpoint: endpoint.to_owned(),
                reason: crate::tls::error_chain(error),
            },
        }
    }

    /// The stable code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::BaseUrl(_)
            | Self::NotAdmissible(_)
            | Self::Protocol(_)
            | Self::Invalid { .. } => ErrorCode::InvalidPacket,
            Self::Transport { .. }
            | Self::Tls { .. }
            | Self::Http { .. }
            | Self::NotConnected
            | Self::Closed => ErrorCode::ConnectorChannelUnavailable,
            Self::Unauthorized { .. } => ErrorCode::Unauthorized,
            Self::Timeout { .. } => ErrorCode::Timeout,
            Self::Remote(error) | Self::Refused(error) | Self::Withheld(error) => {
                error.code.clone()
            }
            Self::TooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::Store(_) | Self::Commit(_) | Self::Encode(_) | Self::Internal(_) => {
                ErrorCode::InternalError
            }
            Self::InvalidInput(_) => ErrorCode::InvalidArguments,
            Self::Outbox(error) => error.code(),
            Self::Delta(error) => error.code(),
            Self::StreamClosed { .. } => ErrorCode::SequenceConflict,
            Self::OutboundFile(error) => error.code(),
            Self::UserChannelLimit(_) => ErrorCode::CapacityExceeded,
            Self::Download(error) => error.code(),
        }
    }

    /// True when retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Transport { .. }
                | Self::Tls { .. }
                | Self::NotConnected
                | Self::Timeout { .. }
                | Self::Http { .. }
                | Self::Withheld(_)
                | Self::Download(DownloadError::Failed(_))
        )
    }
}

/// A `channel.open` the Card's `supports.user_channel_mode` does not allow: the mode is
/// `single` (or omitted, which reads as `single`) and the user already has a channel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "user {owner} already has {} and the Card's user_channel_mode is single: reopen that channel (pass it as the existing channel) to sign in again, or forget it before opening another",
    match existing { Some(channel) => format!("channel {channel}"), None => "a channel being opened".to_owned() }
)]
pub struct UserChannelLimit {
    /// The xAgent user.
    pub owner: String,
    /// The user's channel (`None`: another open for the user is still waiting for its ack).
    pub existing: Option<ConnectorChannelId>,
}

/// Why a file of an assistant message was refused before sending.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OutboundFileError {
    /// This client did not upload the `file_ref` (or forgot it after it expired).
    #[error(
        "file_ref {file_ref} was not uploaded by this client; upload the file on channel {channel} with DataPlane::upload_message_file and put the file item it returns in the message"
    )]
    NotUploaded {
        /// The reference.
        file_ref: FileRef,
        /// The message's channel.
        channel: ConnectorChannelId,
    },
    /// The `file_ref` was uploaded on another channel; the Connector binds it to that one.
    #[error(
        "file_ref {file_ref} was uploaded on another channel, not {channel}; a file_ref belongs to the channel it was uploaded on: upload the file again on this channel"
    )]
    OtherChannel {
        /// The reference.
        file_ref: FileRef,
        /// The message's channel.
        channel: ConnectorChannelId,
    },
    /// The Connector's expiry of the `file_ref` has passed.
    #[error("file_ref {file_ref} expired at {expired_at} (Unix ms); upload the file again")]
    Expired {
        /// The reference.
        file_ref: FileRef,
        /// When it expired (the upload answer's `expires_at`).
        expired_at: u64,
    },
}

impl OutboundFileError {
    /// The Transfer Plane's code for the same case: `file_not_found` for an unknown or
    /// expired reference, `forbidden` for one of another channel.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotUploaded { .. } | Self::Expired { .. } => ErrorCode::FileNotFound,
            Self::OtherChannel { .. } => ErrorCode::Forbidden,
        }
    }
}
