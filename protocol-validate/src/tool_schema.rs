//! The Tool input schema helper: adds the reserved `connector_channel_id` argument.
//!
//! Every Tool a Card declares takes the reserved model argument `connector_channel_id` (a
//! required string). Connector authors write the schema of their own arguments and pass it
//! through [`with_connector_channel_id`], so no Connector hand-writes the reserved part.

use serde_json::{Map, Value, json};
use xagent_protocol_types::{CHANNEL_ARGUMENT, ErrorCode};

/// Description given to the injected argument.
pub const CHANNEL_ARGUMENT_DESCRIPTION: &str = "Opaque id of the user-level Connector channel to act on. Copy it exactly as \
     connector_channels_list or the inbound message gave it; never build or guess one.";

/// Why a schema cannot take the reserved argument.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolSchemaError {
    /// The schema's `type` is not `"object"`.
    #[error("a Tool input schema must have \"type\": \"object\"; wrap the arguments in an object")]
    NotAnObject,
    /// `properties` exists but is not an object.
    #[error("the Tool input schema's \"properties\" must be an object")]
    PropertiesNotAnObject,
    /// `required` exists but is not an array of strings.
    #[error("the Tool input schema's \"required\" must be an array of strings")]
    RequiredNotAnArray,
    /// The schema already declares the reserved argument.
    #[error(
        "the Tool input schema already declares connector_channel_id; remove it, the helper adds the reserved argument"
    )]
    AlreadyDeclared,
    /// The schema declares the forbidden `connector_card_id` argument.
    #[error(
        "a Tool input schema must not declare connector_card_id; the Card is resolved from the channel"
    )]
    ForbiddenCardId,
}

impl ToolSchemaError {
    /// The stable code: a malformed declaration is an `invalid_arguments` contract error.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::InvalidArguments
    }
}

/// A parameter name as the argument-name rules compare it: lowercase, without `_` and `-`, so
/// `chatId`, `chat-id` and `CHAT_ID` all read `chatid`.
pub fn squash_argument_name(name: &str) -> String {
    name.chars().filter(|c| *c != '_' && *c != '-').flat_map(char::to_lowercase).collect()
}

/// True when `name` is one of `names`, compared with [`squash_argument_name`].
pub fn argument_name_in(name: &str, names: &[&str]) -> bool {
    let name = squash_argument_name(name);
    names.iter().any(|n| squash_argument_name(n) == name)
}

/// Every property of a Tool input schema, at any depth the model can fill (`properties`,
/// `items`, `additionalProperties`, `anyOf`/`oneOf`/`allOf`, `prefixItems`, `$defs` and
/// `definitions`), whose name `forbidden` accepts: as `(path, name)`, `path` being the
/// `/`-joined property names that lead to it (`/reply/chat_id`). The one walk of the rules that
/// keep a kind of fact out of model-filled arguments (IM send targets here, device facts in
/// `xagent-profile-device`).
pub fn find_properties(
    schema: &Map<String, Value>,
    forbidden: impl Fn(&str) -> bool,
) -> Vec<(String, String)> {
    fn walk(
        schema: &Map<String, Value>,
        path: &str,
        forbidden: &dyn Fn(&str) -> bool,
        out: &mut Vec<(String, String)>,
    ) {
        if let Some(Value::Object(props)) = schema.get("properties") {
            for (name, sub) in props {
                let here = format!("{path}/{name}");
                if forbidden(name) {
                    out.push((here.clone(), name.clone()));
                }
                if let Value::Object(sub) = sub {
                    walk(sub, &here, forbidden, out);
                }
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(Value::Object(sub)) = schema.get(key) {
                walk(sub, path, forbidden, out);
            }
        }
        for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
            if let Some(Value::Array(subs)) = schema.get(key) {
                for sub in subs.iter().filter_map(Value::as_object) {
                    walk(sub, path, forbidden, out);
                }
            }
        }
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(defs)) = schema.get(key) {
                for sub in defs.values().filter_map(Value::as_object) {
                    walk(sub, path, forbidden, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(schema, "", &forbidden, &mut out);
    out
}

/// Returns a copy of `schema` with `connector_channel_id` added to `properties` (type string)
/// and to `required` (first). The input is not modified.
///
/// ```
/// use serde_json::json;
/// use xagent_protocol_validate::with_connector_channel_id;
///
/// let args = json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
/// let schema = with_connector_channel_id(args.as_object().unwrap())?;
/// assert_eq!(schema["required"], json!(["connector_channel_id", "text"]));
/// assert_eq!(schema["properties"]["connector_channel_id"]["type"], "string");
/// # Ok::<(), xagent_protocol_validate::ToolSchemaError>(())
/// ```
pub fn with_connector_channel_id(
    schema: &Map<String, Value>,
) -> Result<Map<String, Value>, ToolSchemaError> {
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(ToolSchemaError::NotAnObject);
    }
    let properties = match schema.get("properties") {
        None => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return Err(ToolSchemaError::PropertiesNotAnObject),
    };
    let required: Vec<String> = match schema.get("required") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned).ok_or(ToolSchemaError::RequiredNotAnArray))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ToolSchemaError::RequiredNotAnArray),
    };
    if properties.contains_key(CHANNEL_ARGUMENT) || required.iter().any(|r| r == CHANNEL_ARGUMENT) {
        return Err(ToolSchemaError::AlreadyDeclared);
    }
    if properties.contains_key("connector_card_id")
        || required.iter().any(|r| r == "connector_card_id")
    {
        return Err(ToolSchemaError::ForbiddenCardId);
    }

    let mut new_properties = Map::with_capacity(properties.len() + 1);
    new_properties.insert(
        CHANNEL_ARGUMENT.to_owned(),
        json!({ "type": "string", "description": CHANNEL_ARGUMENT_DESCRIPTION }),
    );
    new_properties.extend(properties);
    let mut new_required = Vec::with_capacity(required.len() + 1);
    new_required.push(Value::String(CHANNEL_ARGUMENT.to_owned()));
    new_required.extend(required.into_iter().map(Value::String));

    let mut out = Map::with_capacity(schema.len() + 2);
    for (key, value) in schema {
        match key.as_str() {
            "properties" | "required" => {}
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
        if key == "type" {
            out.insert("properties".into(), Value::Object(new_properties.clone()));
            out.insert("required".into(), Value::Array(new_required.clone()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn injects_into_an_empty_object_schema() {
        let input = obj(json!({"type": "object"}));
        let out = with_connector_channel_id(&input).unwrap();
        assert_eq!(out["required"], json!(["connector_channel_id"]));
        assert_eq!(out["properties"]["connector_channel_id"]["type"], "string");
        assert_eq!(input, obj(json!({"type": "object"})), "input untouched");
    }

    #[test]
    fn keeps_other_keywords_and_arguments() {
        let input = obj(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "title": "Send",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": false
        }));
        let before = input.clone();
        let out = with_connector_channel_id(&input).unwrap();
        assert_eq!(input, before);
        assert_eq!(out["title"], "Send");
        assert_eq!(out["additionalProperties"], false);
        assert_eq!(out["properties"]["text"], json!({"type": "string"}));
        assert_eq!(out["required"], json!(["connector_channel_id", "text"]));
    }

    #[test]
    fn tool_schema_not_object_is_refused() {
        for bad in [json!({}), json!({"type": "string"}), json!({"type": ["object", "null"]})] {
            assert_eq!(with_connector_channel_id(&obj(bad)), Err(ToolSchemaError::NotAnObject));
        }
        assert_eq!(
            with_connector_channel_id(&obj(json!({"type": "object", "properties": []}))),
            Err(ToolSchemaError::PropertiesNotAnObject)
        );
        assert_eq!(
            with_connector_channel_id(&obj(json!({"type": "object", "required": [1]}))),
            Err(ToolSchemaError::RequiredNotAnArray)
        );
    }

    #[test]
    fn tool_schema_already_declared_is_refused() {
        let in_properties = obj(json!({
            "type": "object",
            "properties": {"connector_channel_id": {"type": "string"}}
        }));
        assert_eq!(
            with_connector_channel_id(&in_properties),
            Err(ToolSchemaError::AlreadyDeclared)
        );
        let in_required = obj(json!({"type": "object", "required": ["connector_channel_id"]}));
        assert_eq!(with_connector_channel_id(&in_required), Err(ToolSchemaError::AlreadyDeclared));
    }

    #[test]
    fn tool_schema_card_id_is_refused() {
        let input = obj(json!({
            "type": "object",
            "properties": {"connector_card_id": {"type": "string"}}
        }));
        assert_eq!(with_connector_channel_id(&input), Err(ToolSchemaError::ForbiddenCardId));
    }
}
