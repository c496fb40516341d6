//! Tool projection: which Card Tools the model may call on a channel, as function declarations.

use serde::Serialize;
use serde_json::{Map, Value};
use xagent_protocol_types::{CardTool, ConnectionDescriptor, ConnectorCard, ToolId, ToolStatus};

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

/// Intersects the Card's Tools with the Descriptor's available Tools. A Tool the Descriptor
/// does not list, lists with another status, or that the Card does not declare, is not
/// projected; Card order is kept.
pub fn project_tools(
    card: &ConnectorCard,
    descriptor: &ConnectionDescriptor,
) -> Vec<FunctionDeclaration> {
    card.tools
        .iter()
        .filter(|tool| {
            descriptor
                .tool(tool.tool_id.as_str())
                .is_some_and(|entry| entry.status == ToolStatus::Available)
        })
        .map(declaration)
        .collect()
}

/// The model-facing declaration of one Card Tool: upload-reference arguments are projected to
/// a unified file reference ([`crate::model_input_schema`]).
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
        BuildInfo, Connection, ConnectionStatus, ConnectorInfo, DescriptorTarget, DescriptorTool,
        Supports, TargetType,
    };

    fn schema() -> Map<String, Value> {
        json!({"type": "object", "required": ["connector_channel_id"],
               "properties": {"connector_channel_id": {"type": "string"}}})
        .as_object()
        .cloned()
        .unwrap_or_default()
    }

    #[test]
    fn only_card_tools_available_in_the_descriptor_are_projected() {
        let card = ConnectorCard::new(
            "im.x",
            BuildInfo::new("1"),
            ConnectorInfo::new("X", "1"),
            Supports::new(vec![TargetType::Im], vec!["xagent.im.v2".into()]),
        )
        .with_tool(CardTool::new("send", schema()).with_description("Send text"))
        .with_tool(CardTool::new("file", schema()).with_title("Send a file"))
        .with_tool(CardTool::new("later", schema()));
        let descriptor = ConnectionDescriptor::new(
            Connection::new(
                "im.x",
                "conn_1",
                "cch_1",
                TargetType::Im,
                vec!["xagent.im.v2".into()],
                ConnectionStatus::Connected,
            ),
            DescriptorTarget::new("x", "X"),
        )
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
}
