//! The Connector Card (`xagent.connector/v1`): the public, static description of a Connector.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{
    AuthFlow, ConnectorCardId, ProfileId, SkillId, TargetType, ToolId, TrustLevel, UiHints,
    UserChannelMode,
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

    setters! {
        /// Sets the UI hints.
        with_ui(ui: UiHints);
        /// Sets the security declarations.
        with_security(security: Security);
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

    setters! {
        /// Sets `version`.
        with_version(version: into String);
        /// Sets `git_tag`.
        with_git_tag(git_tag: into String);
        /// Sets `git_rev`.
        with_git_rev(git_rev: into String);
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

    setters! {
        /// Sets `vendor`.
        with_vendor(vendor: into String);
        /// Sets `description`.
        with_description(description: into String);
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

    setters! {
        /// Sets the owning Profile.
        with_profile(profile: into ProfileId);
        /// Sets the title.
        with_title(title: into String);
        /// Sets the description.
        with_description(description: into String);
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

    /// What the Card says of whether the Tool only reads ([`TOOL_READ_ONLY_KEY`]); `None` when
    /// it says nothing (a Card of another toolkit), which a reader takes as "may change things".
    pub fn read_only_hint(&self) -> Option<bool> {
        self.extra.get(TOOL_READ_ONLY_KEY).and_then(Value::as_bool)
    }

    /// Marks the Tool as one that only reads (or not) with [`TOOL_READ_ONLY_KEY`].
    #[must_use]
    pub fn with_read_only_hint(mut self, read_only: bool) -> Self {
        self.extra.insert(TOOL_READ_ONLY_KEY.into(), Value::Bool(read_only));
        self
    }
}

/// The member of a `tools[]` entry by which this toolkit's Connectors say a Tool only reads
/// (no side effect in the target system). The 3.0 Card has no field for it and its schema lets
/// a Tool carry more members; a peer that does not know it ignores it. MCP hosts need it to
/// let an agent run a Tool unattended (the bridge's `readOnlyHint`).
pub const TOOL_READ_ONLY_KEY: &str = "x-xagent-read-only";

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
    use crate::AuthField;
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
