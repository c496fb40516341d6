//! The wire error object and every error code the texts name.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

open_enum! {
    @open_set
    /// Stable machine-readable error codes. Section 8.23 of the common protocol, the Profile
    /// codes, and the codes our spec notes add; unknown codes are kept as `Other`.
    ErrorCode {
        /// Invalid JSON or envelope.
        InvalidPacket = "invalid_packet",
        /// A packet arrived before `connector.hello` completed.
        HelloRequired = "hello_required",
        /// `connector_card_id` in hello differs from the Card.
        ConnectorCardIdMismatch = "connector_card_id_mismatch",
        /// `connector_id` in hello does not match this runtime.
        ConnectorIdMismatch = "connector_id_mismatch",
        /// A user-level packet for a channel that is not open.
        ChannelNotOpen = "channel_not_open",
        /// A user-level packet without `connector_channel_id`.
        ConnectorChannelIdRequired = "connector_channel_id_required",
        /// The channel does not belong to the current xAgent user.
        ConnectorChannelNotOwned = "connector_channel_not_owned",
        /// The channel belongs to another Connector.
        ConnectorChannelConnectorMismatch = "connector_channel_connector_mismatch",
        /// The channel exists but is unavailable, or the Tool is unavailable.
        ConnectorChannelUnavailable = "connector_channel_unavailable",
        /// The channel does not exist or is not bound.
        ConnectionNotFound = "connection_not_found",
        /// Target-system authentication is incomplete.
        ConnectionNotAuthenticated = "connection_not_authenticated",
        /// No such authentication session.
        AuthSessionNotFound = "auth_session_not_found",
        /// A Tool invocation failed.
        ToolInvokeFailed = "tool_invoke_failed",
        /// The packet type is not supported.
        UnsupportedPacket = "unsupported_packet",
        /// The hello's protocol version is outside what this side admits.
        ProtocolVersionUnsupported = "protocol_version_unsupported",
        /// IM: the target system refused the message.
        TargetDeliveryFailed = "target_delivery_failed",
        /// IM: the channel is temporarily busy (retryable).
        ChannelBusy = "channel_busy",
        /// IM: a bounded queue overflowed.
        CapacityExceeded = "capacity_exceeded",
        /// IM v2: a delta sequence gap or a conflicting retransmission.
        SequenceConflict = "sequence_conflict",
        /// IM v2: the same `message_id` arrived with different content.
        MessageConflict = "message_conflict",
        /// A repeated `tool.invoke` key with different arguments.
        IdempotencyConflict = "idempotency_conflict",
        /// A message expired before it could be delivered.
        MessageExpired = "message_expired",
        /// Tool arguments do not match the declared input schema.
        InvalidArguments = "invalid_arguments",
        /// The Tool is not declared in the Card.
        ToolNotFound = "tool_not_found",
        /// The request timed out.
        Timeout = "timeout",
        /// Device: the bound device is offline.
        DeviceOffline = "device_offline",
        /// Device: the command did not finish in time.
        CommandTimeout = "command_timeout",
        /// Device or target: permission denied.
        PermissionDenied = "permission_denied",
        /// Device: a high-risk operation needs confirmation.
        ConfirmationRequired = "confirmation_required",
        /// The server is shutting down.
        ShuttingDown = "shutting_down",
        /// An unexpected internal failure.
        InternalError = "internal_error",
        /// System API key missing or wrong (HTTP planes).
        Unauthorized = "unauthorized",
        /// File reference unknown or expired (Transfer Plane).
        FileNotFound = "file_not_found",
        /// File reference belongs to another channel or the signature is wrong.
        Forbidden = "forbidden",
        /// A body exceeded its size limit.
        PayloadTooLarge = "payload_too_large",
    }
}

impl ErrorCode {
    /// The HTTP status of an error response carrying this code: the workspace's one map from
    /// a wire code to a status (as a number, so this crate stays free of HTTP types). An HTTP
    /// plane may refine it only where its own error knows more than the code, and says so
    /// where it does: the Transfer Plane answers a full store with 507 and a range outside the
    /// file with 416; im.webchat a full store with 507, a rate limit with 429 and a used or
    /// expired pairing link with 410.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::InvalidPacket | Self::InvalidArguments | Self::ConnectorChannelIdRequired => 400,
            Self::Unauthorized => 401,
            Self::Forbidden | Self::PermissionDenied => 403,
            Self::ConnectionNotFound
            | Self::FileNotFound
            | Self::ToolNotFound
            | Self::AuthSessionNotFound => 404,
            Self::ConnectionNotAuthenticated => 409,
            Self::PayloadTooLarge => 413,
            Self::UnsupportedPacket => 501,
            Self::CapacityExceeded | Self::ShuttingDown => 503,
            _ => 500,
        }
    }
}

/// The `error` object of a packet: `{code, message}`. The message is for developers and logs and
/// must never contain a secret.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct WireError {
    /// Stable machine-readable code.
    pub code: ErrorCode,
    /// Readable description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

macro_rules! wire_error_ctors {
    ($($fn_name:ident => $variant:ident),+ $(,)?) => {
        $(
            #[doc = concat!("A `", stringify!($fn_name), "` error with the given message.")]
            pub fn $fn_name(message: impl Into<String>) -> Self {
                Self::new(ErrorCode::$variant, message)
            }
        )+
    };
}

impl WireError {
    /// An error with a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: Some(message.into()) }
    }

    /// The message, or an empty string.
    pub fn message(&self) -> &str {
        self.message.as_deref().unwrap_or_default()
    }

    wire_error_ctors! {
        invalid_packet => InvalidPacket,
        hello_required => HelloRequired,
        connector_card_id_mismatch => ConnectorCardIdMismatch,
        connector_id_mismatch => ConnectorIdMismatch,
        channel_not_open => ChannelNotOpen,
        connector_channel_id_required => ConnectorChannelIdRequired,
        connector_channel_not_owned => ConnectorChannelNotOwned,
        connector_channel_connector_mismatch => ConnectorChannelConnectorMismatch,
        connector_channel_unavailable => ConnectorChannelUnavailable,
        connection_not_found => ConnectionNotFound,
        connection_not_authenticated => ConnectionNotAuthenticated,
        auth_session_not_found => AuthSessionNotFound,
        tool_invoke_failed => ToolInvokeFailed,
        unsupported_packet => UnsupportedPacket,
        protocol_version_unsupported => ProtocolVersionUnsupported,
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.message {
            Some(message) if !message.is_empty() => write!(f, "{}: {}", self.code, message),
            _ => write!(f, "{}", self.code),
        }
    }
}

impl std::error::Error for WireError {}
