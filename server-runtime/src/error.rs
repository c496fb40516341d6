//! The runtime's errors and the one place each maps to a wire code and an HTTP status.
//!
//! - [`DefinitionError`]: the Connector definition is unusable (found at build).
//! - [`ServerError`]: the server could not start or serve.
//! - [`HandleError`]: an author's [`crate::ConnectorHandle`] call failed.
//!
//! [`HandleError::code`] is the only map from a runtime error to a wire code; the HTTP status
//! of an error response comes from the code ([`ErrorCode::http_status`]).

use xagent_file_transfer::TransferError;
use xagent_profile_device::DeviceError;
use xagent_profile_im::OutboxError;
use xagent_protocol_types::{ConnectorChannelId, ErrorCode};
use xagent_protocol_validate::Violation;

use crate::storage::StorageError;

/// What xAgent is told when Connector code failed internally; the cause goes to the log only.
pub(crate) const INTERNAL_MESSAGE: &str = "the Connector failed internally; try again later, and if it persists ask its operator to check the Connector's log";

/// A problem in the Connector definition, found by [`crate::ConnectorBuilder::build`] or
/// [`crate::ServerBuilder::build`]. `Debug` prints the same readable text as `Display`, so a
/// `main` returning the error shows one violation per line.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionError {
    /// A Tool id is empty, too long, or has characters other than ASCII letters, digits,
    /// `_`, `-`, `.`.
    #[error(
        "tool id {0:?} is not a valid model function name: use 1-256 ASCII letters, digits, '_', '-', '.'"
    )]
    BadToolId(String),
    /// Two Tools share an id.
    #[error("tool id {0:?} is registered twice; tool ids must be unique")]
    DuplicateTool(String),
    /// A Tool's argument type does not produce a usable object schema.
    #[error("tool {tool:?}: {reason}")]
    ToolSchema {
        /// The Tool.
        tool: String,
        /// Why.
        reason: String,
    },
    /// A form flow's input type does not give usable form fields.
    #[error("auth flow {flow:?}: {reason}")]
    FlowForm {
        /// The flow.
        flow: String,
        /// Why.
        reason: String,
    },
    /// Two flows share an id.
    #[error("auth flow id {0:?} is declared twice; flow ids must be unique")]
    DuplicateFlow(String),
    /// The Card does not serialise.
    #[error("the generated Connector Card is invalid: {0}")]
    InvalidCard(#[from] serde_json::Error),
    /// The generated Card breaks hard rules of the protocol (`error` violations of
    /// `xagent_protocol_validate::validate_card`): a Connector never serves such a Card.
    /// Warnings are logged, not refused.
    #[error("the generated Connector Card breaks {} rule(s):\n{}", .0.len(), list_violations(.0))]
    CardViolations(Vec<Violation>),
    /// The primary Skill breaks hard rules (`error` violations of
    /// `xagent_protocol_validate::validate_skill`, the same check `xagent-connector check` and
    /// xAgent's admission apply).
    #[error("the primary Skill breaks {} rule(s):\n{}", .0.len(), list_violations(.0))]
    SkillViolations(Vec<Violation>),
    /// The Card declares an IM Profile but no IM target was given.
    #[error("the Card declares {0} but no ImTarget was registered; call .im_target(...)")]
    MissingImTarget(String),
    /// A device declaration breaks a Device Profile rule (e.g. a Tool argument lets the model
    /// supply a device fact).
    #[error("device declaration: {0}")]
    Device(#[from] DeviceError),
    /// A device Tool's argument schema would let the model pass an unconstrained command or
    /// file bytes (Device v1 sections 7 and 6): refused unless the operator opted out for that
    /// Tool and property.
    #[error(
        "{0}; only if you really want the model to pass this, opt out for it with \
         .allow_unconstrained_device_argument({tool:?}, {property:?}) (docs/DEVICE.md)",
        tool = .0.tool.as_str(),
        property = .0.property
    )]
    UnsafeDeviceArgument(xagent_profile_device::UnsafeArgument),
    /// Device Tools are declared but no device target handles them.
    #[error("device tools are declared but no device target; call .device_target(..)")]
    MissingDeviceTarget,
    /// The Card says `security.api_key_required` but the server has no API key.
    #[error(
        "the Card says security.api_key_required but no system API key is configured; set one with .api_key(..) (or XAGENT_CONNECTOR_API_KEY)"
    )]
    ApiKeyMissing,
}

impl std::fmt::Debug for DefinitionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// One violation per line: `  - [rule] /pointer: message`.
fn list_violations(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| {
            let path = if v.path.is_empty() { "/" } else { v.path.as_str() };
            format!("  - [{}] {}: {}", v.rule, path, v.message)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Why the runtime could not start or serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Binding or serving the socket failed.
    #[error("I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// The file store could not be opened.
    #[error("the file store could not be opened: {0}")]
    Files(#[from] TransferError),
    /// The definition cannot be served with this configuration.
    #[error(transparent)]
    Definition(#[from] DefinitionError),
    /// The configuration is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The state directory belongs to another running process.
    #[error(transparent)]
    StateLock(#[from] crate::state_lock::StateLockError),
}

/// Why a [`crate::ConnectorHandle`] call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError {
    /// No such channel.
    #[error("channel {0} is not known to this Connector")]
    UnknownChannel(ConnectorChannelId),
    /// The channel is not signed in.
    #[error("channel {0} is not authenticated; sign in first")]
    NotAuthenticated(ConnectorChannelId),
    /// A device call on a Connector without a device target.
    #[error("this Connector has no device target; register one with .device_target(..)")]
    NoDeviceTarget,
    /// The channel does not enable the Profile this call needs.
    #[error("the Card does not declare {0}")]
    ProfileNotDeclared(&'static str),
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The IM outbox refused the message or could not take it: the channel's queue is full
    /// (`capacity_exceeded`: retry later), the message breaks a Profile rule
    /// (`invalid_packet`), it reuses a pending `message_id` with other content
    /// (`message_conflict`), or the outbox's storage failed (`internal_error`). The source
    /// says which; [`HandleError::code`] gives its code.
    #[error("the outbox refused the message: {0}")]
    Outbox(#[from] OutboxError),
    /// The message is larger as a packet than the data plane takes (`payload_too_large`).
    #[error(
        "the message is {size} bytes as a packet; the data plane takes at most {limit} bytes per packet: shorten the text or send the content as a file"
    )]
    TooLarge {
        /// The message's size as a packet, in bytes.
        size: usize,
        /// The largest packet the data plane takes ([`crate::RuntimeConfig::max_packet_bytes`]).
        limit: usize,
    },
    /// An author broadcast's topic or message is too long (`payload_too_large`).
    #[error(
        "the broadcast's {what} is {size} bytes; at most {limit} bytes: send a pointer to durable state instead"
    )]
    BroadcastTooLarge {
        /// `topic` or `message`.
        what: &'static str,
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The Transfer Plane is not enabled (no state directory, no files configuration).
    #[error("the Transfer Plane is not enabled; give the server a state directory")]
    FilesDisabled,
    /// The handle is detached ([`crate::ConnectorHandle::detached`], for unit tests): the
    /// operation needs a running Connector connected to xAgent (`channel_not_open`).
    #[error(
        "{0} needs a running Connector connected to xAgent; this handle is detached (made for a test) and has no connection"
    )]
    Detached(&'static str),
    /// The file belongs to another channel (`forbidden`).
    #[error("the file belongs to another channel")]
    FileOwnership,
    /// The Transfer Plane refused the file; its kind is kept (`file_not_found`, ...).
    #[error(transparent)]
    File(#[from] TransferError),
}

impl HandleError {
    /// The stable wire code: the one map from a runtime error to a code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::UnknownChannel(_) => ErrorCode::ConnectionNotFound,
            Self::NotAuthenticated(_) => ErrorCode::ConnectionNotAuthenticated,
            Self::ProfileNotDeclared(_) | Self::NoDeviceTarget => ErrorCode::UnsupportedPacket,
            Self::Storage(_) | Self::FilesDisabled => ErrorCode::InternalError,
            Self::Outbox(error) => error.code(),
            Self::TooLarge { .. } | Self::BroadcastTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::FileOwnership => ErrorCode::Forbidden,
            Self::Detached(_) => ErrorCode::ChannelNotOpen,
            Self::File(error) => error.code(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_validate::Severity;

    #[test]
    fn card_violations_print_one_readable_line_each() {
        let violation = |rule: &str, path: &str| Violation {
            rule: rule.into(),
            severity: Severity::Error,
            path: path.into(),
            message: "what to do".into(),
            sender: None,
        };
        let error = DefinitionError::CardViolations(vec![
            violation("card.a", "/tools/0"),
            violation("card.b", ""),
        ]);
        let text = format!("{error:?}");
        assert_eq!(
            text,
            "the generated Connector Card breaks 2 rule(s):\n  - [card.a] /tools/0: what to do\n  - [card.b] /: what to do"
        );
        assert!(!text.contains("Violation {"));
    }

    #[test]
    fn file_errors_keep_their_kind() {
        assert_eq!(
            HandleError::File(TransferError::FileNotFound("gone")).code(),
            ErrorCode::FileNotFound
        );
        assert_eq!(HandleError::FileOwnership.code(), ErrorCode::Forbidden);
        assert_eq!(ErrorCode::FileNotFound.http_status(), 404);
    }

    #[test]
    fn outbox_refusals_keep_their_source_and_its_code() {
        use std::error::Error as _;
        let full = OutboxError::CapacityExceeded { channel: "ch_1".into(), capacity: 2 };
        let error = HandleError::from(full);
        assert_eq!(error.code(), ErrorCode::CapacityExceeded);
        assert!(error.source().is_some(), "the OutboxError is kept as the source");
        assert!(error.to_string().contains("retry later"), "{error}");
        let storage = HandleError::from(StorageError::new("commit IM writes", "disk full"));
        assert_eq!(storage.code(), ErrorCode::InternalError);
        let big = HandleError::TooLarge { size: 2_000_000, limit: 1_048_576 };
        assert_eq!(big.code(), ErrorCode::PayloadTooLarge);
        assert!(big.to_string().contains("send the content as a file"), "{big}");
    }
}
