//! Authentication packets: start, status, cancel, logout.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{
    AuthSessionId, AuthStatus, CancelStatus, ConnectionDescriptor, ConnectorChannelId, Extra,
    FlowId, OkStatus,
};

/// Form values submitted with `auth.start`. Values may be secrets (passwords, bot tokens), so
/// `Debug` shows only the field names.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct AuthInput(pub Map<String, Value>);

impl AuthInput {
    /// The value of a field as a string, if present and a string.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(Value::as_str)
    }

    /// Sets a string field.
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.0.insert(name.into(), Value::String(value.into()));
        self
    }
}

impl std::fmt::Debug for AuthInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.keys().map(|key| (key, "<redacted>"))).finish()
    }
}

/// `auth.start` (xAgent -> Connector).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct AuthStart {
    /// A flow id from the Card's `auth_flows`.
    #[schemars(length(min = 1))]
    pub flow_id: FlowId,
    /// Form values (for `form` flows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<AuthInput>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl AuthStart {
    /// Starts a flow without input.
    pub fn new(flow_id: impl Into<FlowId>) -> Self {
        Self { flow_id: flow_id.into(), input: None, extra: Extra::new() }
    }

    /// Sets the form input.
    #[must_use]
    pub fn with_input(mut self, input: AuthInput) -> Self {
        self.input = Some(input);
        self
    }
}

/// The progress of an authentication session: the body of `auth.start.ack` and
/// `auth.status.ack`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
#[schemars(transform = authenticated_needs_descriptor)]
pub struct AuthProgress {
    /// Channel being authenticated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector_channel_id: Option<ConnectorChannelId>,
    /// Flow id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_id: Option<FlowId>,
    /// Session id, for `auth.status` and `auth.cancel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_session_id: Option<AuthSessionId>,
    /// State.
    pub status: AuthStatus,
    /// Raw QR code content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qr_code_text: Option<String>,
    /// QR code image URL or data URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qr_code_image: Option<String>,
    /// Expiry of the session or QR code (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// Suggested polling interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval_millis: Option<u64>,
    /// Readable state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Descriptor, returned with `authenticated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_descriptor: Option<ConnectionDescriptor>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

fn authenticated_needs_descriptor(schema: &mut schemars::Schema) {
    schema.insert(
        "if".into(),
        serde_json::json!({ "properties": { "status": { "const": "authenticated" } } }),
    );
    schema.insert("then".into(), serde_json::json!({ "required": ["connection_descriptor"] }));
    let branches = crate::schema::conditional_branches(
        schema,
        "status",
        "authenticated".into(),
        crate::schema::known_except(AuthStatus::KNOWN, "authenticated"),
        serde_json::json!({ "required": ["connection_descriptor"] }),
        serde_json::json!({}),
    );
    schema.insert("anyOf".into(), branches);
}

impl AuthProgress {
    /// A progress report with only a status.
    pub fn new(status: AuthStatus) -> Self {
        Self {
            connector_channel_id: None,
            flow_id: None,
            auth_session_id: None,
            status,
            qr_code_text: None,
            qr_code_image: None,
            expires_at: None,
            poll_interval_millis: None,
            message: None,
            connection_descriptor: None,
            extra: Extra::new(),
        }
    }

    /// Sets the channel, flow and session ids.
    #[must_use]
    pub fn for_session(
        mut self,
        channel: ConnectorChannelId,
        flow_id: FlowId,
        auth_session_id: AuthSessionId,
    ) -> Self {
        self.connector_channel_id = Some(channel);
        self.flow_id = Some(flow_id);
        self.auth_session_id = Some(auth_session_id);
        self
    }

    /// Sets the QR code text and image.
    #[must_use]
    pub fn with_qr(mut self, text: impl Into<String>, image: Option<String>) -> Self {
        self.qr_code_text = Some(text.into());
        self.qr_code_image = image;
        self
    }

    setters! {
        /// Sets the expiry.
        with_expires_at(expires_at: u64);
        /// Sets the polling interval.
        with_poll_interval_millis(poll_interval_millis: u64);
        /// Sets the message.
        with_message(message: into String);
        /// Sets the Descriptor.
        with_descriptor(connection_descriptor: ConnectionDescriptor);
    }
}

/// `auth.start.ack` (Connector -> xAgent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct AuthStartAck(pub AuthProgress);

/// `auth.status` (xAgent -> Connector): poll, or refresh the QR code.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct AuthStatusRequest {
    /// Flow id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_id: Option<FlowId>,
    /// Session to poll.
    #[schemars(length(min = 1))]
    pub auth_session_id: AuthSessionId,
    /// Ask for fresh material (a new QR code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<bool>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl AuthStatusRequest {
    /// A poll of a session.
    pub fn new(auth_session_id: impl Into<AuthSessionId>) -> Self {
        Self {
            flow_id: None,
            auth_session_id: auth_session_id.into(),
            refresh: None,
            extra: Extra::new(),
        }
    }

    /// Sets the flow id.
    #[must_use]
    pub fn with_flow_id(mut self, flow_id: impl Into<FlowId>) -> Self {
        self.flow_id = Some(flow_id.into());
        self
    }

    /// Asks for a refresh.
    #[must_use]
    pub fn refresh(mut self) -> Self {
        self.refresh = Some(true);
        self
    }
}

/// `auth.status.ack` (Connector -> xAgent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct AuthStatusAck(pub AuthProgress);

/// `auth.cancel` (xAgent -> Connector).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct AuthCancel {
    /// Session to cancel.
    #[schemars(length(min = 1))]
    pub auth_session_id: AuthSessionId,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl AuthCancel {
    /// Cancels a session.
    pub fn new(auth_session_id: impl Into<AuthSessionId>) -> Self {
        Self { auth_session_id: auth_session_id.into(), extra: Extra::new() }
    }
}

/// `auth.cancel.ack` (Connector -> xAgent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct AuthCancelAck {
    /// Channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector_channel_id: Option<ConnectorChannelId>,
    /// Session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_session_id: Option<AuthSessionId>,
    /// `canceled`, `ignored` or `not_found`.
    pub status: CancelStatus,
    /// Authentication state after the cancel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_status: Option<AuthStatus>,
    /// Readable state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Current Descriptor (with `ignored` when already authenticated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_descriptor: Option<ConnectionDescriptor>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl AuthCancelAck {
    /// An ack with a status.
    pub fn new(status: CancelStatus) -> Self {
        Self {
            connector_channel_id: None,
            auth_session_id: None,
            status,
            auth_status: None,
            message: None,
            connection_descriptor: None,
            extra: Extra::new(),
        }
    }
}

/// `auth.logout` (xAgent -> Connector): sign out of the target system. Empty payload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct AuthLogout {
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `auth.logout.ack` (Connector -> xAgent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct AuthLogoutAck {
    /// `ok`.
    pub status: OkStatus,
    /// Descriptor after sign-out (`created`, `expired` or `revoked`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_descriptor: Option<ConnectionDescriptor>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl AuthLogoutAck {
    /// An `ok` ack with the post-logout Descriptor.
    pub fn new(connection_descriptor: Option<ConnectionDescriptor>) -> Self {
        Self { status: OkStatus::Ok, connection_descriptor, extra: Extra::new() }
    }
}
