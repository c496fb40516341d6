//! Auth flows: what a step reports, its errors, and a flow declared together with its handler
//! ([`FlowHandler`], typed form flows whose fields come from a struct).

use std::future::Future;

use schemars::JsonSchema;
use serde_json::{Map, Value};
use xagent_protocol_types::{AuthField, AuthFlow, ErrorCode, FlowId, TargetType};

use super::context::{AuthContext, AuthValues, Binding};

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

    /// An internal failure (a database, a bug): the cause is logged here and xAgent gets
    /// `internal_error` with a generic message, so no internal detail leaves the Connector.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(%cause, "auth step failed internally");
        Self::new(ErrorCode::InternalError, crate::error::INTERNAL_MESSAGE)
    }
}

/// The code behind one declared auth flow. Register it together with its declaration
/// ([`crate::ConnectorBuilder::auth_flow_with`], [`crate::ConnectorBuilder::qr_flow`]), so
/// a flow is declared and handled in one place. Default methods answer "unsupported".
///
/// `S` is the Connector's state ([`crate::ConnectorBuilder::state`]; `()` without one): the
/// flow reads it with [`AuthContext::state`].
pub trait FlowHandler<S = ()>: Send + Sync + 'static {
    /// Starts the flow with the form values (all secrets). A QR flow returns `Pending` with a
    /// prompt; a form flow usually `Authenticated` or `Failed`.
    fn start(
        &self,
        ctx: AuthContext<S>,
        input: AuthValues,
    ) -> impl Future<Output = Result<AuthStep, AuthError>> + Send;

    /// Polls a pending session, or refreshes its material when `refresh` is true.
    fn status(
        &self,
        ctx: AuthContext<S>,
        refresh: bool,
    ) -> impl Future<Output = Result<AuthStep, AuthError>> + Send {
        let _ = (ctx, refresh);
        async { Err(AuthError::unsupported("auth.status")) }
    }

    /// Cancels a pending session (never touches an existing binding).
    fn cancel(&self, ctx: AuthContext<S>) -> impl Future<Output = ()> + Send {
        let _ = ctx;
        async {}
    }
}

/// How a flow is named in the Card: id, title, optional description and the target type of
/// the channels it signs in.
#[derive(Clone, Debug)]
pub struct FlowSpec {
    pub(crate) id: FlowId,
    pub(crate) title: String,
    pub(crate) description: Option<String>,
    pub(crate) target_type: Option<TargetType>,
}

impl FlowSpec {
    /// A flow with its stable id and the title shown to the user.
    pub fn new(id: impl Into<FlowId>, title: impl Into<String>) -> Self {
        Self { id: id.into(), title: title.into(), description: None, target_type: None }
    }

    /// Sets the flow's `target_type` (default: the Card's first target type). A channel
    /// signed in with this flow has this target type and enables only the Profiles allowed
    /// for it: on a Card declaring `im` and `device`, give each flow its own.
    #[must_use]
    pub fn target_type(mut self, target_type: TargetType) -> Self {
        self.target_type = Some(target_type);
        self
    }

    /// Sets the guidance shown with the flow.
    #[must_use]
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    pub(crate) fn declare(&self, flow: AuthFlow) -> AuthFlow {
        match &self.description {
            Some(description) => flow.with_description(description.clone()),
            None => flow,
        }
    }

    /// A QR-login declaration of this spec.
    pub(crate) fn qr(&self, target_type: TargetType) -> AuthFlow {
        self.declare(AuthFlow::qr_login(self.id.clone(), target_type, self.title.clone()))
    }
}

/// The form fields of a flow, generated from the JSON Schema of its input struct: one field per
/// property (string-valued), `required` from the schema, the doc comment as label (its first
/// line) and help text (the rest), the first schema example as placeholder; a
/// [`xagent_protocol_types::Secret`] property becomes a `password` field, so its value is
/// never shown or echoed.
pub(crate) fn form_fields<Form: JsonSchema>() -> Result<Vec<AuthField>, String> {
    let schema = schemars::schema_for!(Form).to_value();
    let empty = Map::new();
    let properties = schema.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if properties.is_empty() {
        return Err("the form type must be a struct with at least one field".into());
    }
    let mut fields = Vec::new();
    for (name, property) in properties {
        let types: Vec<&str> = match property.get("type") {
            Some(Value::String(one)) => vec![one.as_str()],
            Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !types.contains(&"string") || types.iter().any(|t| !matches!(*t, "string" | "null")) {
            return Err(format!("form field {name:?} must be a string (or a Secret)"));
        }
        let secret = property.get("writeOnly") == Some(&Value::Bool(true))
            || property.get("format").and_then(Value::as_str) == Some("password");
        let doc = property
            .get("title")
            .or_else(|| property.get("description"))
            .and_then(Value::as_str)
            .unwrap_or(name);
        let (label, help) = match doc.split_once('\n') {
            Some((first, rest)) => (first.trim(), Some(rest.trim())),
            None => (doc.trim(), None),
        };
        let label = label.trim_end_matches('.');
        let mut field = if secret {
            AuthField::password(name.clone(), label)
        } else {
            AuthField::text(name.clone(), label)
        };
        let example = property.get("examples").and_then(Value::as_array).and_then(|e| e.first());
        if let Some(placeholder) = example.and_then(Value::as_str) {
            field = field.with_placeholder(placeholder);
        }
        if let Some(help) = help.filter(|h| !h.is_empty()) {
            field = field.with_help_text(help);
        }
        if required.contains(&name.as_str()) {
            field = field.required();
        }
        fields.push(field);
    }
    Ok(fields)
}

/// Why [`crate::ConnectorBuilder::on_bound`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BoundReason {
    /// A sign-in just completed.
    SignedIn,
    /// A signed-in channel was restored from storage at startup.
    Restored,
    /// A Connector without auth flows bound the channel when it was opened.
    Opened,
}
