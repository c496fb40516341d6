//! The author's API: what a Connector author implements (auth flows, an IM target) and the
//! values the runtime hands them (contexts, bindings, form input as secrets).

use std::collections::BTreeMap;
use std::future::Future;

use serde_json::Value;
use xagent_profile_im::{ActivityAction, ActivityCapability};
use xagent_protocol_types::{
    AuthInput, AuthSessionId, ChatMessage, ConnectorChannelId, DescriptorTarget, ErrorCode, FlowId,
    MessageId, RequestId, Secret, ToolCallId, ToolId, ToolProgressPush,
};

use crate::runtime::ConnectorHandle;

/// What the runtime keeps about a signed-in channel: display-level target facts (they go into
/// the Descriptor) and private material (tokens, cursors) that never leaves the Connector.
/// Persisted by the storage, restored after a restart. `Debug` shows only the secret names.
#[derive(Clone, PartialEq)]
pub struct Binding {
    /// Display-level account facts for the Descriptor's `target` (redacted hints only).
    pub target: DescriptorTarget,
    secrets: BTreeMap<String, Secret>,
}

impl Binding {
    /// A binding with its Descriptor target and no private material.
    pub fn new(target: DescriptorTarget) -> Self {
        Self { target, secrets: BTreeMap::new() }
    }

    /// Adds a private value (a target token, a cursor): persisted, never shown.
    #[must_use]
    pub fn with_secret(mut self, name: impl Into<String>, value: Secret) -> Self {
        self.secrets.insert(name.into(), value);
        self
    }

    /// A private value by name.
    pub fn secret(&self, name: &str) -> Option<&Secret> {
        self.secrets.get(name)
    }

    /// All private values.
    pub fn secrets(&self) -> &BTreeMap<String, Secret> {
        &self.secrets
    }
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("target", &self.target)
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Form values of an `auth.start`, every one held as a [`Secret`] so none can be logged.
#[derive(Clone, Default)]
pub struct AuthValues(BTreeMap<String, Secret>);

impl AuthValues {
    /// Reads the wire input; non-string values are kept as their JSON text.
    pub fn from_input(input: Option<&AuthInput>) -> Self {
        let mut values = BTreeMap::new();
        if let Some(input) = input {
            for (name, value) in &input.0 {
                let text = match value {
                    Value::String(text) => text.clone(),
                    Value::Null => continue,
                    other => other.to_string(),
                };
                values.insert(name.clone(), Secret::new(text));
            }
        }
        Self(values)
    }

    /// A value by field name.
    pub fn get(&self, name: &str) -> Option<&Secret> {
        self.0.get(name)
    }

    /// True when the field is present and not empty.
    pub fn has(&self, name: &str) -> bool {
        self.0.get(name).is_some_and(|value| !value.is_empty())
    }

    /// Field names (never values).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

impl std::fmt::Debug for AuthValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.keys().map(|k| (k, "<redacted>"))).finish()
    }
}

/// What a QR or other interactive flow shows the user while it waits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuthPrompt {
    /// Raw QR code content.
    pub qr_code_text: Option<String>,
    /// QR code image (URL or data URL).
    pub qr_code_image: Option<String>,
    /// When the prompt expires (Unix ms).
    pub expires_at: Option<u64>,
    /// Suggested polling interval.
    pub poll_interval_millis: Option<u64>,
    /// Readable state.
    pub message: Option<String>,
}

/// The state an auth flow step reports.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AuthStep {
    /// Waiting for the user.
    Pending(AuthPrompt),
    /// The QR code was scanned; waiting for confirmation.
    Scanned(AuthPrompt),
    /// Signed in: the runtime persists the binding and the channel becomes `connected`.
    Authenticated(Binding),
    /// The QR code must be refreshed (`auth.status` with `refresh: true`).
    QrRefreshRequired(AuthPrompt),
    /// The session expired.
    Expired,
    /// The attempt failed; the message is shown to the user and must not contain a secret.
    Failed(String),
}

/// An auth step that could not run. The message must say what to do and contain no secret.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct AuthError {
    /// Stable code for the ack error.
    pub code: ErrorCode,
    /// Readable reason.
    pub message: String,
}

impl AuthError {
    /// An error with a code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// The flow does not support this step.
    pub fn unsupported(step: &str) -> Self {
        Self::new(ErrorCode::UnsupportedPacket, format!("this auth flow does not support {step}"))
    }
}

/// Where an auth step runs: the channel, the flow, the session, and the runtime handle.
#[derive(Clone, Debug)]
pub struct AuthContext {
    /// The channel being authenticated.
    pub channel: ConnectorChannelId,
    /// The flow from the Card.
    pub flow_id: FlowId,
    /// The session this step belongs to.
    pub auth_session_id: AuthSessionId,
    /// The runtime.
    pub handle: ConnectorHandle,
}

/// A signed-in channel as seen by author code: its id, its binding, and the runtime handle.
#[derive(Clone, Debug)]
pub struct ChannelContext {
    /// The channel.
    pub channel: ConnectorChannelId,
    /// Its binding (target facts and private material).
    pub binding: Binding,
    /// The runtime.
    pub handle: ConnectorHandle,
}

/// The author's authentication flows. Every step is a native `async fn` in the implementation.
/// Default methods answer "unsupported" or do nothing.
pub trait AuthProvider: Send + Sync + 'static {
    /// Starts `ctx.flow_id` with the form values (all secrets). A form flow usually returns
    /// `Authenticated` or `Failed` at once; a QR flow returns `Pending` with a prompt.
    fn start(
        &self,
        ctx: AuthContext,
        input: AuthValues,
    ) -> impl Future<Output = Result<AuthStep, AuthError>> + Send;

    /// Polls a pending session, or refreshes its material when `refresh` is true.
    fn status(
        &self,
        ctx: AuthContext,
        refresh: bool,
    ) -> impl Future<Output = Result<AuthStep, AuthError>> + Send {
        let _ = (ctx, refresh);
        async { Err(AuthError::unsupported("auth.status")) }
    }

    /// Cancels a pending session (never touches an existing binding).
    fn cancel(&self, ctx: AuthContext) -> impl Future<Output = ()> + Send {
        let _ = ctx;
        async {}
    }

    /// Signs the channel out of the target system (clears tokens there). The runtime then
    /// forgets the binding and the channel returns to `created`.
    fn logout(&self, ctx: ChannelContext) -> impl Future<Output = Result<(), AuthError>> + Send {
        let _ = ctx;
        async { Ok(()) }
    }

    /// The channel is being unregistered (lease expiry, or a restored channel nobody claimed):
    /// run the provider-specific sign-out cleanup. Defaults to [`AuthProvider::logout`].
    fn unregister(&self, ctx: ChannelContext) -> impl Future<Output = ()> + Send {
        async move {
            if let Err(error) = self.logout(ctx).await {
                tracing::warn!(code = %error.code, "sign-out cleanup during unregister failed");
            }
        }
    }

    /// A signed-in channel was restored from storage at startup: re-attach target consumers.
    fn restore(&self, ctx: ChannelContext) -> impl Future<Output = ()> + Send {
        let _ = ctx;
        async {}
    }
}

/// An [`AuthProvider`] for Connectors without auth flows.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoAuth;

impl AuthProvider for NoAuth {
    async fn start(&self, _ctx: AuthContext, _input: AuthValues) -> Result<AuthStep, AuthError> {
        Err(AuthError::unsupported("auth.start"))
    }
}

/// Why the target system did not take a message; `retryable` decides between a retry and a
/// final rejection (`chat.message.ack`).
#[derive(Clone, Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct DeliveryError {
    /// Stable code (`target_delivery_failed`, `channel_busy`, `permission_denied`, ...).
    pub code: ErrorCode,
    /// Short readable reason without secrets.
    pub message: String,
    /// Whether the same message may be delivered again later.
    pub retryable: bool,
}

impl DeliveryError {
    /// A failure that a retry will not fix.
    pub fn permanent(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), retryable: false }
    }

    /// A temporary failure (network, rate limit, busy).
    pub fn temporary(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), retryable: true }
    }
}

/// A streamed assistant message as assembled from `chat.message.delta`s (only with
/// [`ImTarget::STREAMS_DELTAS`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeltaUpdate {
    /// The assistant message.
    pub message_id: MessageId,
    /// True for the first delta: create the target message. Later: update it.
    pub first: bool,
    /// All text assembled so far.
    pub text_so_far: String,
    /// The target message handle returned for the first delta, if any.
    pub handle: Option<String>,
}

/// How a final message reaches the target: as a new message, or by editing the message that
/// streamed its deltas (never both).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FinalDelivery {
    /// Send a new target message.
    New,
    /// Replace the content of the streamed target message.
    Edit {
        /// The handle returned by [`ImTarget::delta`], if one was returned.
        handle: Option<String>,
    },
}

/// The IM target of a Connector: where outbound messages go. Inbound messages are handed to
/// the runtime through [`ConnectorHandle`].
pub trait ImTarget: Send + Sync + 'static {
    /// True when the target can edit a sent message, so deltas are shown as they stream;
    /// false (default) keeps deltas in the runtime and only the final message is delivered.
    const STREAMS_DELTAS: bool = false;

    /// Delivers a final `chat.message` from xAgent to the target system. Called once per
    /// accepted `message_id` (the runtime answers duplicates and conflicts itself); return only
    /// when every side effect is done.
    fn deliver(
        &self,
        ctx: ChannelContext,
        message: ChatMessage,
        how: FinalDelivery,
    ) -> impl Future<Output = Result<(), DeliveryError>> + Send;

    /// A streamed message grew (only with [`ImTarget::STREAMS_DELTAS`]); return the target
    /// message handle when `update.first` created one.
    fn delta(
        &self,
        ctx: ChannelContext,
        update: DeltaUpdate,
    ) -> impl Future<Output = Option<String>> + Send {
        let _ = (ctx, update);
        async { None }
    }

    /// What the target can show of `chat.activity` (default: a typing indicator only).
    const ACTIVITY: ActivityCapability = ActivityCapability::TypingOnly;

    /// Show, refresh or clear the activity indicator, as decided by the runtime's activity
    /// tracker from `chat.activity` snapshots, deltas, final messages and the local timeout.
    /// Failures must be swallowed: activity never affects message delivery. Default: nothing.
    fn activity(
        &self,
        ctx: ChannelContext,
        action: ActivityAction,
    ) -> impl Future<Output = ()> + Send {
        let _ = (ctx, action);
        async {}
    }
}

/// A failed Tool run: a stable code and a message (no secrets) for the ack error.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    /// Stable code.
    pub code: ErrorCode,
    /// Readable reason.
    pub message: String,
}

impl ToolError {
    /// An error with a code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// `tool_invoke_failed`.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ToolInvokeFailed, message)
    }

    /// `permission_denied` (the target system refused).
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::PermissionDenied, message)
    }
}

/// What a Tool handler gets besides its typed arguments.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// The channel (from the envelope; the model's argument copy is never used).
    pub channel: ConnectorChannelId,
    /// The Tool.
    pub tool_id: ToolId,
    /// The request.
    pub request_id: Option<RequestId>,
    /// xAgent's call id, if given (correlation only, never authorization).
    pub tool_call_id: Option<ToolCallId>,
    /// The channel's binding.
    pub binding: Binding,
    /// The runtime.
    pub handle: ConnectorHandle,
}

impl ToolContext {
    /// Sends a `tool.progress.push` for this call (never replaces the ack).
    pub async fn progress(&self, message: impl Into<String>, fraction: Option<f64>) {
        let mut push = ToolProgressPush::new(self.tool_id.clone()).with_message(message);
        if let Some(fraction) = fraction {
            push = push.with_progress(fraction.clamp(0.0, 1.0));
        }
        self.handle.push_tool_progress(&self.channel, push).await;
    }
}
