//! Card Tools at the model boundary: the projection the model sees (upload-reference
//! arguments shown as a unified file reference), `tool.invoke` with the channel resolution of
//! protocol section 10.1, the upload that turns a model file reference into the Connector's
//! `file_ref`, the built-in model Tools `connector_channels_list` and `connector_message_send`,
//! and inbound files saved through an application-supplied sink.

use serde_json::{Value, json};
use xagent_protocol_types::{
    ConnectorChannelId, ErrorCode, ToolInvokeAck, ToolProgressPush, WireError,
};

use crate::connection::Shared;
use crate::files::FileSource;
use crate::{ClientError, DataPlane, FunctionDeclaration};

/// The name of the built-in Tool listing the user's channels.
pub const CHANNELS_LIST_TOOL: &str = "connector_channels_list";
/// The name of the built-in Tool sending text to an explicit channel.
pub const MESSAGE_SEND_TOOL: &str = "connector_message_send";

/// The built-in model Tools, with their schemas.
pub fn builtin_tools() -> Vec<FunctionDeclaration> {
    let object = |value: Value| value.as_object().cloned().unwrap_or_default();
    vec![
        FunctionDeclaration {
            name: CHANNELS_LIST_TOOL.into(),
            description: "List the user's Connector channels: id, status, target account and the Tools available on each.".into(),
            parameters: object(json!({"type": "object", "properties": {}, "additionalProperties": false})),
        },
        FunctionDeclaration {
            name: MESSAGE_SEND_TOOL.into(),
            description: "Send text to one exact channel the user chose. Pass a connector_channel_id returned by connector_channels_list unchanged.".into(),
            parameters: object(json!({
                "type": "object",
                "required": ["connector_channel_id", "text"],
                "additionalProperties": false,
                "properties": {
                    "connector_channel_id": {"type": "string", "minLength": 1, "description": "The channel, exactly as connector_channels_list returned it."},
                    "text": {"type": "string", "minLength": 1, "description": "The text to send."}
                }
            })),
        },
    ]
}

/// How a Tool call is made beyond its arguments.
#[derive(Debug, Clone, Default)]
pub struct ToolCallOptions {
    /// The model's call id: the Connector's key for a repeated call.
    pub tool_call_id: Option<String>,
    /// The xAgent session (opaque to the Connector).
    pub session_id: Option<String>,
    /// The caller stands in for a model that may leave out the redundant
    /// `connector_channel_id` argument: the resolved channel is written there when it is
    /// missing ([`crate::fill_channel_argument`]). A value present is passed on unchanged and
    /// never selects the channel (section 10.1).
    pub fill_channel_argument: bool,
}

/// What [`DataPlane::invoke_tool`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    /// The channel the call resolved to.
    pub channel: ConnectorChannelId,
    /// The typed ack.
    pub ack: ToolInvokeAck,
}

pub(crate) fn on_progress(_shared: &Shared, progress: &ToolProgressPush) {
    tracing::debug!(tool = %progress.tool_id, "tool progress");
}

pub(crate) fn invalid(property: &str, expected: &str) -> ClientError {
    ClientError::Refused(WireError::new(
        ErrorCode::InvalidArguments,
        format!("{property} must be {expected}"),
    ))
}

pub(crate) async fn upload_one(
    plane: &DataPlane,
    source: &dyn FileSource,
    channel: &ConnectorChannelId,
    reference: &Value,
    property: &str,
) -> Result<Value, ClientError> {
    let reference = reference
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid(property, "a file reference from the conversation"))?;
    let file = source.open(reference).await.map_err(|reason| {
        ClientError::Refused(WireError::new(
            ErrorCode::InvalidArguments,
            format!("{property}: the file could not be opened: {reason}"),
        ))
    })?;
    let uploaded = plane.upload_on(channel, file).await?;
    Ok(Value::String(uploaded.file_ref.to_string()))
}

#[cfg(test)]
mod tests {
    use serde_json::Map;

    use super::*;
    use crate::upload_refs::{
        UPLOAD_REF_ANNOTATION, UploadRefProperty, model_input_schema, upload_ref_properties,
    };

    fn send_file_schema() -> Map<String, Value> {
        json!({
            "type": "object",
            "required": ["connector_channel_id", "file_ref"],
            "properties": {
                "connector_channel_id": {"type": "string"},
                "file_ref": {"type": "string", "description": "A file_ref from POST /files/uploads.", UPLOAD_REF_ANNOTATION: true},
                "more": {"type": "array", "items": {"type": "string", UPLOAD_REF_ANNOTATION: true}},
                "caption": {"type": "string"}
            }
        })
        .as_object()
        .cloned()
        .unwrap_or_default()
    }

    #[test]
    fn upload_ref_rule_annotated_properties_are_found() {
        let found = upload_ref_properties(&send_file_schema());
        assert_eq!(
            found,
            vec![
                UploadRefProperty { name: "file_ref".into(), array: false },
                UploadRefProperty { name: "more".into(), array: true },
            ]
        );
    }

    #[test]
    fn upload_ref_rule_model_schema_shows_no_connector_file_ref() {
        let projected = model_input_schema(&send_file_schema());
        let text = serde_json::to_string(&projected).unwrap_or_default();
        assert!(!text.contains(UPLOAD_REF_ANNOTATION), "{text}");
        assert!(!text.to_lowercase().contains("upload"), "{text}");
        let file = &projected["properties"]["file_ref"];
        assert_eq!(file["type"], "string");
        assert!(
            file["description"].as_str().unwrap_or("").contains("A file from the conversation")
        );
        assert_eq!(projected["properties"]["more"]["items"]["type"], "string");
        assert_eq!(projected["properties"]["caption"], json!({"type": "string"}));
        assert_eq!(projected["required"], send_file_schema()["required"]);
    }

    #[test]
    fn builtin_tools_have_object_schemas_with_required_channel() {
        let tools = builtin_tools();
        assert_eq!(tools[0].name.as_str(), CHANNELS_LIST_TOOL);
        assert_eq!(tools[1].name.as_str(), MESSAGE_SEND_TOOL);
        assert_eq!(tools[1].parameters["required"], json!(["connector_channel_id", "text"]));
        for tool in tools {
            assert_eq!(tool.parameters["type"], "object");
        }
    }
}
