//! Errors of this crate. Each maps to one stable wire [`ErrorCode`] through a single `code()`
//! function, so no caller invents codes.

use std::sync::Arc;

use xagent_protocol_types::{ConnectorChannelId, ErrorCode, MessageId};

/// A payload broke an IM Profile rule. Raised when a message, activity or push is built or
/// checked, before anything leaves the process.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PayloadError {
    /// Neither text nor files: a message must carry at least one of them.
    #[error("message {0} has neither text nor files; add text or at least one file")]
    EmptyMessage(MessageId),
    /// `message_id` is missing or empty.
    #[error("the message has no message_id; the sender must choose a stable one per channel")]
    MissingMessageId,
    /// A file item has a `type` outside `image`, `video`, `audio`, `file`.
    #[error("file {file_ref} has type {file_type:?}; use image, video, audio or file")]
    UnknownFileType {
        /// The offending file.
        file_ref: String,
        /// The type it carried.
        file_type: String,
    },
    /// A file item has an empty `file_ref`.
    #[error("a file item has an empty file_ref; upload the file first and use the returned ref")]
    EmptyFileRef,
    /// Two file items of one message share a `file_ref`.
    #[error("file_ref {0} appears twice in one message; each file needs its own ref")]
    DuplicateFileRef(String),
    /// A Connector -> xAgent file item has no download URL.
    #[error("inbound file {0} has no download_url; xAgent cannot fetch it without one")]
    MissingDownloadUrl(String),
    /// A download URL that is not HTTP(S) or a relative Connector URI (e.g. `data:`/`file:`).
    #[error(
        "file {0} has a download_url that is not http(s) or relative; bytes and local paths must not travel in packets"
    )]
    BadDownloadUrl(String),
    /// File bytes, base64 or a local path was found in a payload field.
    #[error(
        "field {0} would carry file bytes or a local path; send files through the Transfer Plane"
    )]
    FileBytesForbidden(String),
    /// An xAgent-internal identity (`session_id`, `user_id`, ...) was found in a payload.
    #[error(
        "field {0} is an internal identity and must not appear in a payload; route by connector_channel_id"
    )]
    InternalIdentityForbidden(String),
    /// `chat.activity` with status `tool` but no `tool_name`.
    #[error("activity status tool needs a tool_name")]
    ToolNameRequired,
    /// `tool_name` present with a status other than `tool`.
    #[error("tool_name is only allowed with activity status tool")]
    ToolNameForbidden,
    /// `tool_name` empty or longer than 256 bytes.
    #[error("tool_name must be 1 to 256 bytes, got {0} bytes")]
    ToolNameLength(usize),
    /// An activity status outside `thinking`, `tool`, `idle`.
    #[error("activity status {0:?} is unknown; use thinking, tool or idle")]
    UnknownActivityStatus(String),
    /// A required IM v1 `message.push` field is missing.
    #[error("message.push field {0} is required by IM v1")]
    MissingPushField(&'static str),
}

impl PayloadError {
    /// The wire code for this rejection (`invalid_packet`).
    pub fn code(&self) -> ErrorCode {
        ErrorCode::InvalidPacket
    }
}

/// A storage backend failed. The message names the operation and the backend's own error,
/// which stays reachable as the [`source`](std::error::Error::source); never a payload.
#[derive(Clone, Debug)]
pub struct StoreError {
    /// What was being done (`save_pending`, `load_completed`, ...).
    pub operation: &'static str,
    /// The backend's error (shared, so the error stays `Clone`).
    cause: Arc<dyn std::error::Error + Send + Sync + 'static>,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "storage failed during {}: {}", self.operation, self.cause)
    }
}

impl std::error::Error for StoreError {
    /// The backend's own error itself (not the `Arc` around it), so it can be downcast.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.cause)
    }
}

/// A failure a backend can only describe in words (no error value of its own).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Described(String);

impl StoreError {
    /// A failure of `operation` described in words, for a backend without an error value.
    pub fn new(operation: &'static str, reason: impl Into<String>) -> Self {
        Self { operation, cause: Arc::new(Described(reason.into())) }
    }

    /// A failure of `operation` caused by the backend's own `error`, kept as the source so
    /// callers can inspect it (a full disk, a locked database) instead of parsing text.
    pub fn from_source(
        operation: &'static str,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self { operation, cause: Arc::new(error) }
    }

    /// The backend's explanation, as text.
    pub fn reason(&self) -> String {
        self.cause.to_string()
    }

    /// Storage failures are internal: `internal_error`.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::InternalError
    }
}

/// Two store errors are equal when they name the same operation and say the same thing.
impl PartialEq for StoreError {
    fn eq(&self, other: &Self) -> bool {
        self.operation == other.operation && self.reason() == other.reason()
    }
}

impl Eq for StoreError {}

/// Why the outbox refused a call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The payload broke a Profile rule.
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// The channel's pending queue is full and the overflow policy refused the new message.
    #[error(
        "channel {channel} already holds {capacity} pending messages; retry later or raise the capacity"
    )]
    CapacityExceeded {
        /// The full channel.
        channel: ConnectorChannelId,
        /// Its capacity.
        capacity: usize,
    },
    /// The same `message_id` is already pending on the channel with different content.
    #[error(
        "message {message_id} is already pending on channel {channel} with different content; choose a new message_id"
    )]
    MessageConflict {
        /// The channel.
        channel: ConnectorChannelId,
        /// The reused id.
        message_id: MessageId,
    },
    /// A call named a message that is not pending (or not in the expected state).
    #[error("message {message_id} on channel {channel} is not {expected}")]
    NotPending {
        /// The channel.
        channel: ConnectorChannelId,
        /// The message.
        message_id: MessageId,
        /// The state the call expected.
        expected: &'static str,
    },
    /// The storage backend failed; the in-memory state was not changed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A channel cannot take another's id: the new id already has messages of its own.
    #[error(
        "channel {from} cannot be renamed to {to}: {to} already has pending messages; forget one of the two channels first"
    )]
    RenameTargetTaken {
        /// The id the channel had.
        from: ConnectorChannelId,
        /// The id it was to get.
        to: ConnectorChannelId,
    },
    /// A stored record could not be decoded at startup.
    #[error("stored message {message_id} on channel {channel} cannot be decoded: {reason}")]
    CorruptRecord {
        /// The channel.
        channel: ConnectorChannelId,
        /// The message.
        message_id: MessageId,
        /// The decoder's explanation.
        reason: String,
    },
}

impl OutboxError {
    /// The stable wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Payload(e) => e.code(),
            Self::CapacityExceeded { .. } => ErrorCode::CapacityExceeded,
            Self::MessageConflict { .. } => ErrorCode::MessageConflict,
            Self::NotPending { .. } => ErrorCode::InvalidPacket,
            Self::Store(e) => e.code(),
            Self::CorruptRecord { .. } | Self::RenameTargetTaken { .. } => ErrorCode::InternalError,
        }
    }
}

/// A `chat.message.delta` was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeltaError {
    /// A sequence gap (or a sequence of 0): deltas must go 1, 2, 3, ... without holes.
    #[error(
        "delta for message {message_id} has sequence {got}, expected {expected}; deltas start at 1 and must not skip"
    )]
    SequenceGap {
        /// The message.
        message_id: MessageId,
        /// The next sequence the assembler expected.
        expected: u64,
        /// The sequence received.
        got: u64,
    },
    /// A retransmitted sequence whose text differs from the first transmission.
    #[error("delta {sequence} of message {message_id} was retransmitted with different text")]
    ConflictingRetransmission {
        /// The message.
        message_id: MessageId,
        /// The repeated sequence.
        sequence: u64,
    },
    /// Accepting the delta would exceed the per-message text limit.
    #[error("delta text of message {message_id} would exceed {limit} bytes")]
    TooLarge {
        /// The message.
        message_id: MessageId,
        /// The byte limit.
        limit: usize,
    },
    /// The channel already tracks the maximum number of unfinished messages and eviction is
    /// not possible.
    #[error("channel {0} tracks too many unfinished delta messages")]
    CapacityExceeded(ConnectorChannelId),
}

impl DeltaError {
    /// `sequence_conflict` for gaps and conflicting replays, `capacity_exceeded` for limits.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::SequenceGap { .. } | Self::ConflictingRetransmission { .. } => {
                ErrorCode::SequenceConflict
            }
            Self::TooLarge { .. } | Self::CapacityExceeded(_) => ErrorCode::CapacityExceeded,
        }
    }
}

/// The receiver-side idempotency set refused a call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdempotencyError {
    /// The storage backend failed; nothing was recorded.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The payload broke a Profile rule.
    #[error(transparent)]
    Payload(#[from] PayloadError),
}

impl IdempotencyError {
    /// The stable wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Store(e) => e.code(),
            Self::Payload(e) => e.code(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_store_error_keeps_the_backends_error_as_its_source() {
        let io = std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left on device");
        let error = StoreError::from_source("save_pending", io);
        let source = error.source().expect("the backend's error is the source");
        let io = source.downcast_ref::<std::io::Error>().expect("still an io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::StorageFull);
        assert_eq!(
            error.to_string(),
            "storage failed during save_pending: no space left on device"
        );
        assert_eq!(error.code(), ErrorCode::InternalError);
        // Clone shares the source; equality is by operation and text.
        assert_eq!(error.clone(), error);
        assert_ne!(error, StoreError::new("load_pending", "no space left on device"));
    }
}
