//! Errors of the Device Profile layer, each mapped to one stable wire [`ErrorCode`].

use xagent_protocol_types::{ErrorCode, ToolId, WireError};

/// Why a device operation was refused or failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The channel has no bound device.
    #[error("no device is bound to this channel; bind a device first")]
    NotBound,
    /// The bound device is offline (or not yet verified after a restart).
    #[error("the bound device is offline; retry when it is back online")]
    DeviceOffline,
    /// The device or the target system denied the operation.
    #[error("permission denied by the device: {0}")]
    PermissionDenied(String),
    /// The command did not finish (or did not start) in time.
    #[error("the device command did not finish within {0} ms")]
    CommandTimeout(u64),
    /// A high-risk operation needs confirmation first.
    #[error("tool {0} is high-risk and needs the user's confirmation before it runs")]
    ConfirmationRequired(ToolId),
    /// A high-risk operation this Connector refuses to run.
    #[error("tool {0} is high-risk and refused by this Connector's policy")]
    Refused(ToolId),
    /// The Tool is not declared.
    #[error("tool {0} is not declared for this device")]
    ToolNotFound(ToolId),
    /// The Tool is declared but currently unavailable.
    #[error("tool {0} is currently unavailable on this device")]
    ToolUnavailable(ToolId),
    /// An argument is missing, unknown, of the wrong type or out of range.
    #[error("argument {name}: {problem}")]
    InvalidArguments {
        /// The argument.
        name: String,
        /// What is wrong and what is allowed.
        problem: String,
    },
    /// A declaration breaks a Device Profile rule (e.g. lets the model choose the device).
    #[error("invalid tool declaration: {0}")]
    InvalidDeclaration(String),
    /// A result tried to carry media bytes instead of a `file_ref`.
    #[error("result field {0} carries media bytes; return a file_ref from the Transfer Plane")]
    MediaBytesForbidden(String),
    /// A bounded queue is full.
    #[error("the channel's operation queue is full ({0} operations)")]
    QueueFull(usize),
    /// The device reported a failure.
    #[error("the device command failed: {0}")]
    Failed(String),
}

impl DeviceError {
    /// The stable wire code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotBound => ErrorCode::ConnectionNotFound,
            Self::DeviceOffline => ErrorCode::DeviceOffline,
            Self::PermissionDenied(_) | Self::Refused(_) => ErrorCode::PermissionDenied,
            Self::CommandTimeout(_) => ErrorCode::CommandTimeout,
            Self::ConfirmationRequired(_) => ErrorCode::ConfirmationRequired,
            Self::ToolNotFound(_) => ErrorCode::ToolNotFound,
            Self::ToolUnavailable(_) => ErrorCode::ConnectorChannelUnavailable,
            Self::InvalidArguments { .. } => ErrorCode::InvalidArguments,
            Self::InvalidDeclaration(_) => ErrorCode::InternalError,
            Self::MediaBytesForbidden(_) | Self::Failed(_) => ErrorCode::ToolInvokeFailed,
            Self::QueueFull(_) => ErrorCode::CapacityExceeded,
        }
    }

    /// The wire error object (`{code, message}`) for a `tool.invoke.ack`.
    pub fn to_wire(&self) -> WireError {
        WireError::new(self.code(), self.to_string())
    }
}
