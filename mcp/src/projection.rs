//! What the MCP client sees of a Card Tool: its `input_schema` with the channel made optional
//! (the bridge resolves it) and each upload-reference argument (`"x-xagent-upload-ref": true`,
//! see docs/DECISIONS.md) shown as a file reference the client supplies.

use serde_json::{Map, Value, json};

use crate::files::FILE_URI_PREFIX;

/// The annotation that marks an upload-reference argument.
pub const UPLOAD_REF: &str = "x-xagent-upload-ref";

/// The argument every Card Tool declares for the channel.
pub const CHANNEL_ARG: &str = "connector_channel_id";

/// An argument whose value the bridge turns into an uploaded `file_ref`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadArg {
    /// Property name.
    pub name: String,
    /// Whether the property is an array of references.
    pub array: bool,
}

fn is_upload_ref(schema: &Value) -> bool {
    schema.get(UPLOAD_REF).and_then(Value::as_bool) == Some(true)
}

fn file_reference_schema() -> Value {
    json!({
        "type": "string",
        "description": format!(
            "A file: the URI of a file resource this server offers ({FILE_URI_PREFIX}...) or a path under a directory the bridge was started with (--allow-dir)."
        )
    })
}

/// Finds the upload-reference arguments of an `input_schema`.
pub fn upload_args(input_schema: &Map<String, Value>) -> Vec<UploadArg> {
    let Some(properties) = input_schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    properties
        .iter()
        .filter_map(|(name, schema)| {
            if is_upload_ref(schema) {
                Some(UploadArg { name: name.clone(), array: false })
            } else if schema.get("items").is_some_and(is_upload_ref) {
                Some(UploadArg { name: name.clone(), array: true })
            } else {
                None
            }
        })
        .collect()
}

/// The schema the MCP client sees for a Card Tool.
pub fn model_schema(input_schema: &Map<String, Value>) -> Map<String, Value> {
    let mut schema = input_schema.clone();
    let uploads = upload_args(input_schema);
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for upload in &uploads {
            let Some(property) = properties.get_mut(&upload.name) else { continue };
            if upload.array {
                if let Some(object) = property.as_object_mut() {
                    object.insert("items".into(), file_reference_schema());
                }
            } else {
                *property = file_reference_schema();
            }
        }
        if let Some(channel) = properties.get_mut(CHANNEL_ARG) {
            *channel = json!({
                "type": "string",
                "description": "Optional: a channel from connector_channels_list; by default the bridge picks the first channel where this tool is available."
            });
        }
    }
    if let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|name| name.as_str() != Some(CHANNEL_ARG));
    }
    schema
}

/// Schema of the built-in `connector_channels_list`.
pub fn channels_list_schema() -> Map<String, Value> {
    object(json!({ "type": "object", "properties": {} }))
}

/// Schema of the built-in `connector_message_send`.
pub fn message_send_schema() -> Map<String, Value> {
    object(json!({
        "type": "object",
        "required": ["connector_channel_id", "text"],
        "properties": {
            "connector_channel_id": {
                "type": "string",
                "description": "The channel to write to, from connector_channels_list."
            },
            "text": { "type": "string", "minLength": 1, "description": "The message text." }
        }
    }))
}

/// Schema of the built-in `connector_message_wait`.
pub fn message_wait_schema(max_seconds: u64) -> Map<String, Value> {
    object(json!({
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
    }))
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card_schema() -> Map<String, Value> {
        object(json!({
            "type": "object",
            "required": ["connector_channel_id", "file_ref"],
            "properties": {
                "connector_channel_id": {"type": "string"},
                "file_ref": {"type": "string", "x-xagent-upload-ref": true, "description": "internal"},
                "more": {"type": "array", "items": {"type": "string", "x-xagent-upload-ref": true}},
                "text": {"type": "string"}
            }
        }))
    }

    #[test]
    fn upload_ref_arguments_are_shown_as_file_references() {
        let shown = model_schema(&card_schema());
        let text = serde_json::to_string(&shown).unwrap_or_default();
        assert!(!text.contains(UPLOAD_REF), "the annotation is not shown: {text}");
        assert!(!text.contains("internal"), "the Connector's description is not shown: {text}");
        let file = &shown["properties"]["file_ref"];
        assert_eq!(file["type"], "string");
        assert!(file["description"].as_str().is_some_and(|d| d.contains(FILE_URI_PREFIX)));
        assert_eq!(shown["properties"]["more"]["items"], file_reference_schema());
        assert_eq!(shown["properties"]["text"], json!({"type": "string"}));
        assert_eq!(
            upload_args(&card_schema()),
            vec![
                UploadArg { name: "file_ref".into(), array: false },
                UploadArg { name: "more".into(), array: true }
            ]
        );
    }

    #[test]
    fn the_channel_argument_becomes_optional() {
        let shown = model_schema(&card_schema());
        assert_eq!(shown["required"], json!(["file_ref"]));
        assert!(shown["properties"][CHANNEL_ARG].is_object());
    }
}
