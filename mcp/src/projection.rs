//! What the MCP client sees of a Card Tool. The runtime's projection
//! ([`xagent_client_runtime::upload_refs::model_input_schema`]) already shows each upload-reference argument
//! as a file reference; the bridge adds two MCP-specific touches: `connector_channel_id` is not
//! shown (it selects nothing: the runtime resolves the channel by section 10.1, and the bridge
//! fills the argument in for the Connector), and a file reference says which files this bridge
//! can read (its file resources, or paths under `--allow-dir`).

use serde_json::{Map, Value, json};
use xagent_client_runtime::upload_refs::upload_ref_properties;

/// Built-in Tool (the runtime's): the bridge's channels.
pub const TOOL_CHANNELS_LIST: &str = xagent_client_runtime::CHANNELS_LIST_TOOL;
/// Built-in Tool (the runtime's): send a chat message on an explicit channel.
pub const TOOL_MESSAGE_SEND: &str = xagent_client_runtime::MESSAGE_SEND_TOOL;
/// Built-in Tool: wait for the next inbound message.
pub const TOOL_MESSAGE_WAIT: &str = "connector_message_wait";

/// The argument every Card Tool declares for the channel (the runtime's name for it).
pub const CHANNEL_ARG: &str = xagent_client_runtime::CHANNEL_ARGUMENT;

const FILES_HERE: &str = "Here: the URI of a file resource this server offers (xagent-connector://files/...) or a path under a directory the bridge was started with (--allow-dir).";

fn explain_file(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else { return };
    let before = object.get("description").and_then(Value::as_str).unwrap_or("A file.");
    let description = format!("{before} {FILES_HERE}");
    object.insert("description".into(), Value::String(description));
}

/// The schema the MCP client sees for a Card Tool, from the runtime's model-facing
/// `parameters` and the Card's own `input_schema` (to find the file arguments).
pub fn mcp_schema(
    parameters: &Map<String, Value>,
    card_input_schema: &Map<String, Value>,
) -> Map<String, Value> {
    let mut schema = parameters.clone();
    let uploads = upload_ref_properties(card_input_schema);
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for upload in &uploads {
            let Some(property) = properties.get_mut(&upload.name) else { continue };
            if upload.array {
                if let Some(items) = property.get_mut("items") {
                    explain_file(items);
                }
            } else {
                explain_file(property);
            }
        }
        properties.remove(CHANNEL_ARG);
    }
    if let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|name| name.as_str() != Some(CHANNEL_ARG));
    }
    schema
}

/// Schema of the bridge's own `connector_message_wait`.
pub fn message_wait_schema(max_seconds: u64) -> Map<String, Value> {
    match json!({
        "type": "object",
        "properties": {
            "connector_channel_id": {
                "type": "string",
                "description": "Only wait for this channel (default: any channel)."
            },
            "timeout_seconds": {
                "type": "integer",
                "minimum": 0,
                "maximum": max_seconds,
                "description": "How long to wait for a message (default 30)."
            }
        }
    }) {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::FILE_URI_PREFIX;
    use xagent_client_runtime::upload_refs::model_input_schema;

    fn card_schema() -> Map<String, Value> {
        match json!({
            "type": "object",
            "required": ["connector_channel_id", "file_ref"],
            "properties": {
                "connector_channel_id": {"type": "string"},
                "file_ref": {"type": "string", "x-xagent-upload-ref": true, "description": "The file to show."},
                "more": {"type": "array", "items": {"type": "string", "x-xagent-upload-ref": true}},
                "text": {"type": "string"}
            }
        }) {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    #[test]
    fn upload_ref_arguments_say_which_files_the_bridge_reads() {
        let card = card_schema();
        let shown = mcp_schema(&model_input_schema(&card), &card);
        let text = serde_json::to_string(&shown).unwrap_or_default();
        assert!(!text.contains("x-xagent-upload-ref"), "the annotation is not shown: {text}");
        let file = &shown["properties"]["file_ref"];
        assert_eq!(file["type"], "string");
        let description = file["description"].as_str().unwrap_or_default();
        assert!(!description.to_lowercase().contains("upload"), "{description}");
        assert!(description.contains(FILE_URI_PREFIX), "{description}");
        assert!(description.contains("--allow-dir"), "{description}");
        let items =
            shown["properties"]["more"]["items"]["description"].as_str().unwrap_or_default();
        assert!(items.contains(FILE_URI_PREFIX), "{items}");
        assert_eq!(shown["properties"]["text"], json!({"type": "string"}));
    }

    #[test]
    fn resolution_10_1_the_channel_argument_is_not_offered_as_a_choice() {
        let card = card_schema();
        let shown = mcp_schema(&model_input_schema(&card), &card);
        assert_eq!(shown["required"], json!(["file_ref"]));
        assert!(shown["properties"].get(CHANNEL_ARG).is_none(), "{shown:?}");
    }
}
