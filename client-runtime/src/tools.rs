//! Tool projection: which Card Tools the model may call on a channel, as function declarations.

use serde::Serialize;
use serde_json::{Map, Value};
use xagent_protocol_types::{CardTool, ConnectionDescriptor, ConnectorCard, ToolId};

/// A model-visible function: a Card Tool that the channel's Descriptor lists as available.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionDeclaration {
    /// The function name: the `tool_id`.
    pub name: ToolId,
    /// What the function does (the Tool's description, else its title).
    pub description: String,
    /// JSON Schema of the arguments (the Card's `input_schema`, upload references projected).
    pub parameters: Map<String, Value>,
}

/// The Card's Tools that can be called on the channel now, by the same availability rule
/// that [`crate::DataPlane::invoke_tool`] resolves with
/// ([`ConnectionDescriptor::is_tool_available`]): nothing on a channel that is not active,
/// nothing the Descriptor does not list `available` or whose permission the target denies,
/// nothing the Card does not declare. Card order is kept.
pub fn project_tools(
    card: &ConnectorCard,
    descriptor: &ConnectionDescriptor,
) -> Vec<FunctionDeclaration> {
    card.tools
        .iter()
        .filter(|tool| descriptor.is_tool_available(tool.tool_id.as_str()))
        .map(declaration)
        .collect()
}

/// The model-facing declaration of one Card Tool: upload-reference arguments are projected to
/// a unified file reference ([`crate::upload_refs::model_input_schema`]).
pub fn declaration(tool: &CardTool) -> FunctionDeclaration {
    FunctionDeclaration {
        name: tool.tool_id.clone(),
        description: tool
            .description
            .clone()
            .or_else(|| tool.title.clone())
            .unwrap_or_else(|| tool.tool_id.to_string()),
        parameters: crate::upload_refs::model_input_schema(&tool.input_schema),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use xagent_protocol_types::{
        BuildInfo, Connection, ConnectionStatus, ConnectorChannelId, ConnectorInfo,
        DescriptorTarget, DescriptorTool, ErrorCode, PermissionState, Supports, TargetType,
        ToolStatus,
    };

    use crate::{ChannelDirectory, SessionBinding};

    fn schema() -> Map<String, Value> {
        json!({"type": "object", "required": ["connector_channel_id"],
               "properties": {"connector_channel_id": {"type": "string"}}})
        .as_object()
        .cloned()
        .unwrap_or_default()
    }

    /// An IM v2 Card without Tools yet.
    fn card() -> ConnectorCard {
        let supports = Supports::new(vec![TargetType::Im], vec!["xagent.im.v2".into()]);
        ConnectorCard::new("im.x", BuildInfo::new("1"), ConnectorInfo::new("X", "1"), supports)
    }

    /// The Descriptor of channel `cch_1` of that Connector, in `status`, without Tools yet.
    fn descriptor(status: ConnectionStatus) -> ConnectionDescriptor {
        let im = vec!["xagent.im.v2".into()];
        let connection = Connection::new("im.x", "conn_1", "cch_1", TargetType::Im, im, status);
        ConnectionDescriptor::new(connection, DescriptorTarget::new("x", "X"))
    }

    #[test]
    fn only_card_tools_available_in_the_descriptor_are_projected() {
        let card = card()
            .with_tool(CardTool::new("send", schema()).with_description("Send text"))
            .with_tool(CardTool::new("file", schema()).with_title("Send a file"))
            .with_tool(CardTool::new("later", schema()));
        let descriptor = descriptor(ConnectionStatus::Connected)
            .with_tool(DescriptorTool::available("send"))
            .with_tool(DescriptorTool::available("file"))
            .with_tool(DescriptorTool::new("later", ToolStatus::Unavailable))
            .with_tool(DescriptorTool::available("not_in_card"));
        let projected = project_tools(&card, &descriptor);
        let names: Vec<&str> = projected.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, vec!["send", "file"]);
        assert_eq!(projected[0].description, "Send text");
        assert_eq!(projected[1].description, "Send a file");
    }

    /// Every connection status, Tool status and permission state (and a Tool the Descriptor
    /// leaves out): the projection offers the Tool exactly when a call bound to that channel
    /// resolves, and refuses it with `connector_channel_unavailable` otherwise.
    #[test]
    fn availability_rule_projection_offers_a_tool_iff_invoke_accepts_it() {
        let card = card().with_tool(CardTool::new("send", schema()));
        let statuses = ConnectionStatus::KNOWN.iter().map(|s| ConnectionStatus::parse(s));
        let tool_states: Vec<Option<ToolStatus>> = std::iter::once(None)
            .chain(ToolStatus::KNOWN.iter().map(|s| Some(ToolStatus::parse(s))))
            .collect();
        let permissions: Vec<Option<PermissionState>> = std::iter::once(None)
            .chain(PermissionState::KNOWN.iter().map(|s| Some(PermissionState::parse(s))))
            .collect();
        let mut combinations = 0;
        for status in statuses {
            for tool_state in &tool_states {
                for permission in &permissions {
                    let mut descriptor = descriptor(status.clone());
                    if let Some(tool_state) = tool_state {
                        let mut tool = DescriptorTool::new("send", tool_state.clone());
                        tool.target_permission_state = permission.clone();
                        descriptor = descriptor.with_tool(tool);
                    }
                    let channel = ConnectorChannelId::new("cch_1");
                    let mut directory = ChannelDirectory::new(Some(card.clone()));
                    directory.set_owner(&channel, "alice");
                    if let Err(refused) = directory.apply_descriptor(&channel, &descriptor) {
                        panic!("a valid Descriptor was refused: {refused}");
                    }
                    let offered =
                        project_tools(&card, &descriptor).iter().any(|f| f.name == "send");
                    let binding = SessionBinding::new("im.x", "cch_1");
                    let resolved = directory.resolve("alice", Some(&binding), "send");
                    let case = format!("{status} / {tool_state:?} / {permission:?}");
                    match resolved {
                        Ok(resolved) => {
                            assert!(offered, "invoke accepts but projection hides: {case}");
                            assert_eq!(resolved, channel);
                        }
                        Err(error) => {
                            assert!(!offered, "projection offers but invoke refuses: {case}");
                            assert_eq!(
                                error.code,
                                ErrorCode::ConnectorChannelUnavailable,
                                "{case}"
                            );
                        }
                    }
                    combinations += 1;
                }
            }
        }
        assert_eq!(combinations, 8 * 6 * 5, "every combination was judged");
    }
}
