//! The Connector Card (`xagent.connector/v1`): the public, static description of a Connector.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{
    AuthFlowType, ConnectorCardId, FlowId, InputType, ProfileId, SkillId, TargetType, ToolId,
    TrustLevel, UserChannelMode,
};

const_str!(
    /// The `schema` discriminator of a Card: always `xagent.connector/v1`.
    CardSchema = "xagent.connector/v1"
);

/// Unknown members of a relayed object, kept so nothing is silently dropped.
pub type Extra = Map<String, Value>;

/// A Connector Card. Unknown fields at every level are kept in `extra` and written back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
#[schemars(title = "xAgent Connector Card v1")]
pub struct ConnectorCard {
    /// Always `xagent.connector/v1`.
    pub schema: CardSchema,
    /// The protocol version the Connector implements; current Cards declare `3.0`.
    #[schemars(extend("const" = "3.0"))]
    pub protocol_version: String,
    /// Build stamp, echoed by `/health`.
    pub build: BuildInfo,
    /// Stable identity fixed by the Connector developer (e.g. `im.wechat`).
    #[schemars(length(min = 1))]
    pub connector_card_id: ConnectorCardId,
    /// Name, version and vendor of the implementation.
    pub connector: ConnectorInfo,
    /// Static capabilities.
    pub supports: Supports,
    /// Tools exposed to the model; each must be callable now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<CardTool>,
    /// Authentication flows a user can run on a channel.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub auth_flows: Vec<AuthFlow>,
    /// Hints for the xAgent front end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ui: Option<UiHints>,
    /// Security declarations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<Security>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ConnectorCard {
    /// A Card with the required fields; the protocol version is this crate's.
    pub fn new(
        connector_card_id: impl Into<ConnectorCardId>,
        build: BuildInfo,
        connector: ConnectorInfo,
        supports: Supports,
    ) -> Self {
        Self {
            schema: CardSchema,
            protocol_version: crate::PROTOCOL_VERSION.to_owned(),
            build,
            connector_card_id: connector_card_id.into(),
            connector,
            supports,
            tools: Vec::new(),
            auth_flows: Vec::new(),
            ui: None,
            security: None,
            extra: Extra::new(),
        }
    }

    /// Adds a Tool declaration.
    #[must_use]
    pub fn with_tool(mut self, tool: CardTool) -> Self {
        self.tools.push(tool);
        self
    }

    /// Adds an authentication flow.
    #[must_use]
    pub fn with_auth_flow(mut self, flow: AuthFlow) -> Self {
        self.auth_flows.push(flow);
        self
    }

    /// Sets the UI hints.
    #[must_use]
    pub fn with_ui(mut self, ui: UiHints) -> Self {
        self.ui = Some(ui);
        self
    }

    /// Sets the security declarations.
    #[must_use]
    pub fn with_security(mut self, security: Security) -> Self {
        self.security = Some(security);
        self
    }

    /// Looks up a declared Tool by id.
    pub fn tool(&self, tool_id: &str) -> Option<&CardTool> {
        self.tools.iter().find(|tool| tool.tool_id.as_str() == tool_id)
    }

    /// Looks up a declared authentication flow by id.
    pub fn auth_flow(&self, flow_id: &str) -> Option<&AuthFlow> {
        self.auth_flows.iter().find(|flow| flow.id.as_str() == flow_id)
    }

    /// The name the primary Skill must carry: `connector-` + the card id, lower-cased, with `.`
    /// and `_` turned into `-`.
    pub fn primary_skill_name(&self) -> SkillId {
        primary_skill_name(self.connector_card_id.as_str())
    }
}

/// What every Connector Skill name starts with (protocol 4.2).
pub const SKILL_NAME_PREFIX: &str = "connector-";

/// The primary Skill name for a card id (`im.wechat` -> `connector-im-wechat`).
pub fn primary_skill_name(connector_card_id: &str) -> SkillId {
    let normalised: String = connector_card_id
        .chars()
        .map(|c| match c {
            '.' | '_' => '-',
            other => other.to_ascii_lowercase(),
        })
        .collect();
    SkillId::new(format!("{SKILL_NAME_PREFIX}{normalised}"))
}

/// Build stamp injected at compile time; `/health` must echo it exactly.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct BuildInfo {
    /// Release version of the build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Git tag of the build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_tag: Option<String>,
    /// Git revision of the build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_rev: Option<String>,
    /// Build time as `YYMMDDHHMM` in UTC (e.g. `2607241200`).
    pub build_time: String,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl BuildInfo {
    /// A build stamp with only its required `build_time`.
    pub fn new(build_time: impl Into<String>) -> Self {
        Self { build_time: build_time.into(), ..Self::default() }
    }

    /// Sets `version`.
    #[must_use]
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// Sets `git_tag`.
    #[must_use]
    pub fn with_git_tag(mut self, tag: impl Into<String>) -> Self {
        self.git_tag = Some(tag.into());
        self
    }

    /// Sets `git_rev`.
    #[must_use]
    pub fn with_git_rev(mut self, rev: impl Into<String>) -> Self {
        self.git_rev = Some(rev.into());
        self
    }
}

/// `connector`: who built this Connector.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ConnectorInfo {
    /// Display name, fixed by the developer.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Implementation version; bump it when Tools, flows, Skills or capabilities change.
    #[schemars(length(min = 1))]
    pub version: String,
    /// Vendor name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Short description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ConnectorInfo {
    /// Name and version.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self { name: name.into(), version: version.into(), ..Self::default() }
    }

    /// Sets `vendor`.
    #[must_use]
    pub fn with_vendor(mut self, vendor: impl Into<String>) -> Self {
        self.vendor = Some(vendor.into());
        self
    }

    /// Sets `description`.
    #[must_use]
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }
}

/// `supports`: static capabilities.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Supports {
    /// `single` (the default when omitted) or `multiple` channels per user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_channel_mode: Option<UserChannelMode>,
    /// Target types; non-empty.
    #[schemars(length(min = 1), extend("uniqueItems" = true))]
    pub target_types: Vec<TargetType>,
    /// Concrete targets with provider and label.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetDeclaration>,
    /// Profiles the Connector implements; non-empty.
    #[schemars(length(min = 1), extend("uniqueItems" = true), inner(length(min = 1)))]
    pub profiles: Vec<ProfileId>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl Supports {
    /// Target types and Profiles.
    pub fn new(target_types: Vec<TargetType>, profiles: Vec<ProfileId>) -> Self {
        Self { target_types, profiles, ..Self::default() }
    }

    /// Adds a target declaration.
    #[must_use]
    pub fn with_target(mut self, target: TargetDeclaration) -> Self {
        self.targets.push(target);
        self
    }

    /// Sets the user channel mode.
    #[must_use]
    pub fn with_user_channel_mode(mut self, mode: UserChannelMode) -> Self {
        self.user_channel_mode = Some(mode);
        self
    }

    /// The effective channel mode (`single` when omitted).
    pub fn effective_user_channel_mode(&self) -> UserChannelMode {
        self.user_channel_mode.clone().unwrap_or(UserChannelMode::Single)
    }
}

/// `supports.targets[]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct TargetDeclaration {
    /// Target type.
    pub target_type: TargetType,
    /// Provider (e.g. `wechat`).
    #[schemars(length(min = 1))]
    pub provider: String,
    /// Display label.
    #[schemars(length(min = 1))]
    pub label: String,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl TargetDeclaration {
    /// Type, provider and label.
    pub fn new(
        target_type: TargetType,
        provider: impl Into<String>,
        label: impl Into<String>,
    ) -> Self {
        Self {
            target_type,
            provider: provider.into(),
            label: label.into(),
            description: None,
            extra: Extra::new(),
        }
    }
}

/// `tools[]`: one model-visible Tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct CardTool {
    /// Model function name: 1-256 ASCII letters, digits, `_`, `-`, `.`.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9_.-]+$"))]
    pub tool_id: ToolId,
    /// The Profile this Tool belongs to (must be in `supports.profiles`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileId>,
    /// Human title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the Tool does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Skills recommended when using this Tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)))]
    pub related_skill_ids: Vec<SkillId>,
    /// JSON Schema of the arguments; an object schema carrying the reserved
    /// `connector_channel_id` string argument.
    #[schemars(schema_with = "tool_input_schema_schema")]
    pub input_schema: Map<String, Value>,
    /// JSON Schema of the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Map<String, Value>>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl CardTool {
    /// A Tool with an id and an input schema (which must already carry `connector_channel_id`;
    /// `protocol-validate` has the helper that injects it).
    pub fn new(tool_id: impl Into<ToolId>, input_schema: Map<String, Value>) -> Self {
        Self {
            tool_id: tool_id.into(),
            profile: None,
            title: None,
            description: None,
            related_skill_ids: Vec::new(),
            input_schema,
            output_schema: None,
            extra: Extra::new(),
        }
    }

    /// Sets the owning Profile.
    #[must_use]
    pub fn with_profile(mut self, profile: impl Into<ProfileId>) -> Self {
        self.profile = Some(profile.into());
        self
    }

    /// Sets the title.
    #[must_use]
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Sets the description.
    #[must_use]
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Adds a related Skill.
    #[must_use]
    pub fn with_related_skill(mut self, skill: impl Into<SkillId>) -> Self {
        self.related_skill_ids.push(skill.into());
        self
    }

    /// Sets the output schema.
    #[must_use]
    pub fn with_output_schema(mut self, schema: Map<String, Value>) -> Self {
        self.output_schema = Some(schema);
        self
    }
}

fn tool_input_schema_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "required": ["type", "properties", "required"],
        "properties": {
            "type": { "const": "object" },
            "properties": {
                "type": "object",
                "required": ["connector_channel_id"],
                "properties": {
                    "connector_channel_id": {
                        "type": "object",
                        "required": ["type"],
                        "properties": { "type": { "const": "string" } }
                    },
                    "connector_card_id": false
                }
            },
            "required": {
                "type": "array",
                "uniqueItems": true,
                "items": { "type": "string" },
                "contains": { "const": "connector_channel_id" }
            }
        }
    })
}

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

    /// Sets the placeholder.
    #[must_use]
    pub fn with_placeholder(mut self, placeholder: impl Into<String>) -> Self {
        self.placeholder = Some(placeholder.into());
        self
    }

    /// Sets the help text.
    #[must_use]
    pub fn with_help_text(mut self, help: impl Into<String>) -> Self {
        self.help_text = Some(help.into());
        self
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

/// `security`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Security {
    /// Trust level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_level: Option<TrustLevel>,
    /// Whether the system connection needs an API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_required: Option<bool>,
    /// Whether requests are signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_signature: Option<bool>,
    /// Data categories the Connector may access.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_classes: Vec<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl Security {
    /// Trust level and whether an API key is required.
    pub fn new(trust_level: TrustLevel, api_key_required: bool) -> Self {
        Self {
            trust_level: Some(trust_level),
            api_key_required: Some(api_key_required),
            ..Self::default()
        }
    }

    /// Adds a data class.
    #[must_use]
    pub fn with_data_class(mut self, class: impl Into<String>) -> Self {
        self.data_classes.push(class.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn primary_skill_name_normalises_dots_and_underscores() {
        assert_eq!(primary_skill_name("im.wechat"), "connector-im-wechat");
        assert_eq!(primary_skill_name("device.adb_Pro"), "connector-device-adb-pro");
    }

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let wire = json!({
            "schema": "xagent.connector/v1",
            "protocol_version": "3.0",
            "build": { "build_time": "2607241200", "builder": "ci" },
            "connector_card_id": "im.x",
            "connector": { "name": "X", "version": "1", "homepage": "https://x.invalid" },
            "supports": { "target_types": ["im", "fax"], "profiles": ["xagent.im.v2"], "beta": 1 },
            "marketplace": { "listed": true }
        });
        let card: ConnectorCard = serde_json::from_value(wire.clone()).expect("reads");
        assert_eq!(card.supports.target_types[1], TargetType::Other("fax".into()));
        assert_eq!(card.extra["marketplace"], json!({ "listed": true }));
        assert_eq!(serde_json::to_value(&card).expect("writes"), wire);
    }

    #[test]
    fn wrong_card_schema_is_rejected() {
        let wire = json!({
            "schema": "xagent.connector/v2", "protocol_version": "3.0", "build": { "build_time": "1" },
            "connector_card_id": "im.x", "connector": { "name": "X", "version": "1" },
            "supports": { "target_types": ["im"], "profiles": ["xagent.im.v2"] }
        });
        assert!(serde_json::from_value::<ConnectorCard>(wire).is_err());
    }

    #[test]
    fn builders_produce_a_complete_card() {
        let card = ConnectorCard::new(
            "im.x",
            BuildInfo::new("2611291200").with_version("1.0.0"),
            ConnectorInfo::new("X", "1.0.0"),
            Supports::new(vec![TargetType::Im], vec![crate::PROFILE_IM_V2.into()]),
        )
        .with_auth_flow(AuthFlow::form(
            "x_form",
            TargetType::Im,
            "Sign in",
            vec![AuthField::text("user", "User").required(), AuthField::password("pw", "Password")],
        ));
        let value = serde_json::to_value(&card).expect("writes");
        assert_eq!(value["schema"], "xagent.connector/v1");
        assert_eq!(value["protocol_version"], "3.0");
        assert_eq!(value["auth_flows"][0]["fields"][1]["secret"], true);
        let secrets: Vec<&str> = card.auth_flows[0].secret_field_names().collect();
        assert_eq!(secrets, vec!["pw"]);
    }

    #[test]
    fn auth_input_debug_hides_values() {
        let input = crate::AuthInput::default().with("bot_token", "123:SECRET");
        let shown = format!("{input:?}");
        assert!(shown.contains("bot_token"));
        assert!(!shown.contains("SECRET"));
    }
}
