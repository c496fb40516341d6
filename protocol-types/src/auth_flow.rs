//! A Card's `auth_flows[]`: how a channel authenticates against the target system, the form
//! fields of a `form` flow and the UI hints of a login.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{AuthFlowType, Extra, FlowId, InputType, TargetType};

/// `auth_flows[]`: one way to authenticate a channel against the target system.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
#[schemars(transform = form_flow_needs_fields)]
pub struct AuthFlow {
    /// Stable flow id.
    #[schemars(length(min = 1))]
    pub id: FlowId,
    /// Target type the flow binds.
    pub target_type: TargetType,
    /// `qr_login` or `form` (open on read).
    #[serde(rename = "type")]
    pub flow_type: AuthFlowType,
    /// User-facing title.
    pub title: String,
    /// Guidance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Form fields (required for `form`, at least one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<AuthField>,
    /// A JSON Schema describing the flow's configuration, for richer front ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_schema: Option<Map<String, Value>>,
    /// Rendering hints for `config_schema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ui_schema: Option<Map<String, Value>>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl AuthFlow {
    /// A QR-login flow.
    pub fn qr_login(
        id: impl Into<FlowId>,
        target_type: TargetType,
        title: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            target_type,
            flow_type: AuthFlowType::QrLogin,
            title: title.into(),
            description: None,
            fields: Vec::new(),
            config_schema: None,
            ui_schema: None,
            extra: Extra::new(),
        }
    }

    /// A form flow with its fields.
    pub fn form(
        id: impl Into<FlowId>,
        target_type: TargetType,
        title: impl Into<String>,
        fields: Vec<AuthField>,
    ) -> Self {
        Self {
            id: id.into(),
            target_type,
            flow_type: AuthFlowType::Form,
            title: title.into(),
            description: None,
            fields,
            config_schema: None,
            ui_schema: None,
            extra: Extra::new(),
        }
    }

    /// Sets the description.
    #[must_use]
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Names of the fields whose values are secret (`secret: true` or `password` input).
    pub fn secret_field_names(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().filter(|f| f.is_secret()).map(|f| f.name.as_str())
    }
}

fn form_flow_needs_fields(schema: &mut schemars::Schema) {
    schema.insert(
        "if".into(),
        serde_json::json!({ "required": ["type"], "properties": { "type": { "const": "form" } } }),
    );
    schema.insert(
        "then".into(),
        serde_json::json!({ "required": ["fields"], "properties": { "fields": { "minItems": 1 } } }),
    );
    let branches = crate::schema::conditional_branches(
        schema,
        "type",
        "form".into(),
        crate::schema::known_except(AuthFlowType::KNOWN, "form"),
        serde_json::json!({
            "required": ["fields"],
            "properties": { "fields": { "type": "array", "minItems": 1 } }
        }),
        serde_json::json!({}),
    );
    schema.insert("anyOf".into(), branches);
}

/// `auth_flows[].fields[]`: one form input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
#[schemars(transform = secret_field_has_no_default)]
pub struct AuthField {
    /// Submitted name, unique within the flow.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Display label.
    #[schemars(length(min = 1))]
    pub label: String,
    /// `text` or `password` (open on read).
    pub input_type: InputType,
    /// Whether the user must fill it (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    /// Placeholder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
    /// Guidance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub help_text: Option<String>,
    /// Whether the value is sensitive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<bool>,
    /// Default value; forbidden for a secret field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_value: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl AuthField {
    /// A plain text field.
    pub fn text(name: impl Into<String>, label: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            label: label.into(),
            input_type: InputType::Text,
            required: None,
            placeholder: None,
            help_text: None,
            secret: None,
            default_value: None,
            extra: Extra::new(),
        }
    }

    /// A password field, marked secret.
    pub fn password(name: impl Into<String>, label: impl Into<String>) -> Self {
        Self { input_type: InputType::Password, secret: Some(true), ..Self::text(name, label) }
    }

    /// Marks the field required.
    #[must_use]
    pub fn required(mut self) -> Self {
        self.required = Some(true);
        self
    }

    setters! {
        /// Sets the placeholder.
        with_placeholder(placeholder: into String);
        /// Sets the help text.
        with_help_text(help_text: into String);
    }

    /// True when the value is sensitive: `secret: true` or a `password` input.
    pub fn is_secret(&self) -> bool {
        self.secret == Some(true) || self.input_type == InputType::Password
    }

    /// True when the field must be filled.
    pub fn is_required(&self) -> bool {
        self.required == Some(true)
    }
}

fn secret_field_has_no_default(schema: &mut schemars::Schema) {
    schema.insert(
        "if".into(),
        serde_json::json!({ "required": ["secret"], "properties": { "secret": { "const": true } } }),
    );
    schema.insert("then".into(), serde_json::json!({ "not": { "required": ["default_value"] } }));
    let branches = crate::schema::conditional_branches(
        schema,
        "secret",
        true.into(),
        vec![false.into()],
        serde_json::json!({ "properties": { "default_value": false } }),
        serde_json::json!({}),
    );
    schema.insert("anyOf".into(), branches);
}

/// `ui`: front-end hints.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct UiHints {
    /// The recommended login flow and its steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login_flow: Option<LoginFlowHint>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `ui.login_flow`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct LoginFlowHint {
    /// The flow these steps drive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_id: Option<FlowId>,
    /// Ordered steps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<LoginFlowStep>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One step of `ui.login_flow.steps[]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct LoginFlowStep {
    /// Step kind (e.g. `qr_code`, `polling`, `form`).
    #[serde(rename = "type")]
    pub step_type: String,
    /// Packet type the front end sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_type: Option<String>,
    /// Packet type it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_type: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl LoginFlowStep {
    /// A step with its kind and request/response packet types.
    pub fn new(step_type: impl Into<String>, request_type: &str, response_type: &str) -> Self {
        Self {
            step_type: step_type.into(),
            request_type: Some(request_type.to_owned()),
            response_type: Some(response_type.to_owned()),
            extra: Extra::new(),
        }
    }
}
