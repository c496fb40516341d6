//! The Connection Descriptor (`xagent.connection/v2`): the runtime state of one channel.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::{
    ConnectionStatus, ConnectorCardId, ConnectorChannelId, ConnectorId, Extra, PermissionState,
    ProfileId, TargetType, ToolId, ToolStatus,
};

const_str!(
    /// The `schema` discriminator of a current Descriptor: always `xagent.connection/v2`.
    DescriptorSchema = "xagent.connection/v2"
);

/// A Connection Descriptor. Unknown fields are kept in `extra` and written back. Reading
/// accepts a `xagent.connection/v1` document too and normalises it at once (its singular
/// `connection.profile` becomes `connection.profiles`), wherever the Descriptor sits (an ack,
/// a push, a file); writing always produces v2.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[non_exhaustive]
#[schemars(title = "xAgent Connection Descriptor v2")]
pub struct ConnectionDescriptor {
    /// Always `xagent.connection/v2`.
    pub schema: DescriptorSchema,
    /// Identity and state of the channel.
    pub connection: Connection,
    /// Display-level facts about the bound target account (redacted hints only).
    pub target: DescriptorTarget,
    /// Tool availability for this channel.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<DescriptorTool>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ConnectionDescriptor {
    /// A Descriptor without Tools.
    pub fn new(connection: Connection, target: DescriptorTarget) -> Self {
        Self {
            schema: DescriptorSchema,
            connection,
            target,
            tools: Vec::new(),
            extra: Extra::new(),
        }
    }

    /// Adds a Tool availability entry.
    #[must_use]
    pub fn with_tool(mut self, tool: DescriptorTool) -> Self {
        self.tools.push(tool);
        self
    }

    /// Replaces the Tool list.
    #[must_use]
    pub fn with_tools(mut self, tools: Vec<DescriptorTool>) -> Self {
        self.tools = tools;
        self
    }

    /// The entry for a Tool, if listed.
    pub fn tool(&self, tool_id: &str) -> Option<&DescriptorTool> {
        self.tools.iter().find(|tool| tool.tool_id.as_str() == tool_id)
    }

    /// Whether the Tool can be called on this channel now: the one availability rule that the
    /// xAgent side's projection and its `tool.invoke` resolution both ask. The channel is
    /// signed in and active (`connected`, or `degraded` with the Tool still listed
    /// `available`), the Tool is listed `available`, and the target does not deny permission.
    pub fn is_tool_available(&self, tool_id: &str) -> bool {
        matches!(self.connection.status, ConnectionStatus::Connected | ConnectionStatus::Degraded)
            && self.tool(tool_id).is_some_and(|tool| {
                tool.status == ToolStatus::Available
                    && tool.target_permission_state != Some(PermissionState::Denied)
            })
    }

    /// Reads a Descriptor of either wire version (what `Deserialize` does too): the result is
    /// always the current model (we never emit v1).
    pub fn from_wire(value: Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value(value)
    }
}

/// Section 12: a `xagent.connection/v1` document becomes the current model before it is
/// read: the schema is v2, and a singular `connection.profile` becomes `connection.profiles`.
fn normalise_v1(value: &mut Value) {
    let is_v1 = value.get("schema").and_then(Value::as_str) == Some(crate::DESCRIPTOR_SCHEMA_V1);
    let Some(object) = value.as_object_mut().filter(|_| is_v1) else { return };
    object.insert("schema".into(), Value::String(crate::DESCRIPTOR_SCHEMA.into()));
    if let Some(connection) = object.get_mut("connection").and_then(Value::as_object_mut)
        && !connection.contains_key("profiles")
        && let Some(profile) = connection.remove("profile")
    {
        let profiles = match profile {
            Value::Null => Vec::new(),
            other => vec![other],
        };
        connection.insert("profiles".into(), Value::Array(profiles));
    }
}

/// The fields of a current Descriptor as read, after [`normalise_v1`].
#[derive(Deserialize)]
struct CurrentDescriptor {
    schema: DescriptorSchema,
    connection: Connection,
    target: DescriptorTarget,
    #[serde(default)]
    tools: Vec<DescriptorTool>,
    #[serde(flatten)]
    extra: Extra,
}

impl<'de> Deserialize<'de> for ConnectionDescriptor {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut value = Value::deserialize(deserializer)?;
        normalise_v1(&mut value);
        let CurrentDescriptor { schema, connection, target, tools, extra } =
            CurrentDescriptor::deserialize(value).map_err(serde::de::Error::custom)?;
        Ok(Self { schema, connection, target, tools, extra })
    }
}

/// `connection`: who owns the channel and what it can do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Connection {
    /// Must equal the Card's id.
    #[schemars(length(min = 1))]
    pub connector_card_id: ConnectorCardId,
    /// The runtime instance.
    #[schemars(length(min = 1))]
    pub connector_id: ConnectorId,
    /// Must equal the channel the Descriptor describes.
    #[schemars(length(min = 1))]
    pub connector_channel_id: ConnectorChannelId,
    /// Target type of the bound account.
    pub target_type: TargetType,
    /// Profiles enabled on this channel; non-empty, unique, all declared by the Card.
    #[schemars(length(min = 1), extend("uniqueItems" = true), inner(length(min = 1)))]
    pub profiles: Vec<ProfileId>,
    /// Channel state.
    pub status: ConnectionStatus,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl Connection {
    /// All required fields.
    pub fn new(
        connector_card_id: impl Into<ConnectorCardId>,
        connector_id: impl Into<ConnectorId>,
        connector_channel_id: impl Into<ConnectorChannelId>,
        target_type: TargetType,
        profiles: Vec<ProfileId>,
        status: ConnectionStatus,
    ) -> Self {
        Self {
            connector_card_id: connector_card_id.into(),
            connector_id: connector_id.into(),
            connector_channel_id: connector_channel_id.into(),
            target_type,
            profiles,
            status,
            extra: Extra::new(),
        }
    }
}

/// `target`: display-level account information only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct DescriptorTarget {
    /// Provider, e.g. `wechat`.
    #[schemars(length(min = 1))]
    pub provider: String,
    /// Label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Display name (we always emit it).
    pub display_name: String,
    /// Redacted account hint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_hint: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl DescriptorTarget {
    /// Provider and display name.
    pub fn new(provider: impl Into<String>, display_name: impl Into<String>) -> Self {
        Self {
            provider: provider.into(),
            label: None,
            display_name: display_name.into(),
            account_hint: None,
            extra: Extra::new(),
        }
    }

    setters! {
        /// Sets the label.
        with_label(label: into String);
        /// Sets the redacted account hint.
        with_account_hint(account_hint: into String);
    }
}

/// `tools[]`: availability of one Card Tool on this channel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct DescriptorTool {
    /// A Tool declared in the Card.
    #[schemars(length(min = 1))]
    pub tool_id: ToolId,
    /// Availability (we always emit it).
    pub status: ToolStatus,
    /// What the target system says about permission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_permission_state: Option<PermissionState>,
    /// Why a Tool is not available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl DescriptorTool {
    /// A Tool with a status.
    pub fn new(tool_id: impl Into<ToolId>, status: ToolStatus) -> Self {
        Self {
            tool_id: tool_id.into(),
            status,
            target_permission_state: None,
            reason: None,
            extra: Extra::new(),
        }
    }

    /// An available Tool with granted permission.
    pub fn available(tool_id: impl Into<ToolId>) -> Self {
        Self::new(tool_id, ToolStatus::Available).with_permission(PermissionState::Granted)
    }

    setters! {
        /// Sets the permission state.
        with_permission(target_permission_state: PermissionState);
        /// Sets the reason.
        with_reason(reason: into String);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v1() -> Value {
        json!({
            "schema": "xagent.connection/v1",
            "connection": {
                "connector_card_id": "im.x", "connector_id": "conn_1", "connector_channel_id": "cch_1",
                "target_type": "im", "profile": "xagent.im.v1", "status": "connected"
            },
            "target": { "provider": "x", "display_name": "X" }
        })
    }

    #[test]
    fn v1_descriptor_is_normalised_to_profiles() {
        let descriptor = ConnectionDescriptor::from_wire(v1()).expect("v1 reads");
        assert_eq!(descriptor.connection.profiles, vec![ProfileId::from("xagent.im.v1")]);
        let written = serde_json::to_value(&descriptor).expect("encodes");
        assert_eq!(written["schema"], "xagent.connection/v2");
        assert!(written["connection"].get("profile").is_none());
    }

    #[test]
    fn v2_descriptor_is_read_unchanged_and_unknown_fields_survive() {
        let mut v2 = v1();
        v2["schema"] = json!("xagent.connection/v2");
        let connection = v2["connection"].as_object_mut().expect("object");
        connection.remove("profile");
        connection.insert("profiles".into(), json!(["xagent.im.v2"]));
        connection.insert("region".into(), json!("eu"));
        let descriptor = ConnectionDescriptor::from_wire(v2.clone()).expect("v2 reads");
        assert_eq!(serde_json::to_value(&descriptor).expect("encodes"), v2);
    }

    #[test]
    fn other_schema_is_rejected() {
        let mut doc = v1();
        doc["schema"] = json!("xagent.connection/v9");
        assert!(ConnectionDescriptor::from_wire(doc).is_err());
    }

    #[test]
    fn tool_availability() {
        let descriptor = ConnectionDescriptor::from_wire(v1())
            .expect("reads")
            .with_tool(DescriptorTool::available("send"))
            .with_tool(DescriptorTool::new("file", ToolStatus::RequiresReauth));
        assert!(descriptor.is_tool_available("send"));
        assert!(!descriptor.is_tool_available("file"));
        assert!(!descriptor.is_tool_available("absent"));
    }

    #[test]
    fn availability_rule_needs_an_active_channel_and_no_denied_permission() {
        let listed = |status: ConnectionStatus, tool: DescriptorTool| {
            let mut descriptor = ConnectionDescriptor::from_wire(v1()).expect("reads");
            descriptor.connection.status = status;
            descriptor.with_tool(tool)
        };
        for status in [ConnectionStatus::Connected, ConnectionStatus::Degraded] {
            assert!(listed(status, DescriptorTool::available("send")).is_tool_available("send"));
        }
        for status in [
            ConnectionStatus::Created,
            ConnectionStatus::Authenticating,
            ConnectionStatus::Offline,
            ConnectionStatus::Expired,
            ConnectionStatus::Revoked,
            ConnectionStatus::Error,
        ] {
            let descriptor = listed(status.clone(), DescriptorTool::available("send"));
            assert!(!descriptor.is_tool_available("send"), "{status}");
        }
        let denied = DescriptorTool::available("send").with_permission(PermissionState::Denied);
        assert!(!listed(ConnectionStatus::Connected, denied).is_tool_available("send"));
        let unknown = DescriptorTool::available("send").with_permission(PermissionState::Unknown);
        assert!(listed(ConnectionStatus::Connected, unknown).is_tool_available("send"));
    }
}
