//! The Card's Tools: ids, input schemas, and the texts the model reads.

use serde_json::{Map, Value};
use xagent_protocol_types::{CHANNEL_ARGUMENT, primary_skill_name};

use super::json::*;
use super::validator::Validator;
use crate::catalog;
use crate::im;
use crate::model_text;
use crate::report::{Sink, child, index};
use crate::rules::*;

impl Validator {
    pub(super) fn card_tools(
        &self,
        sink: &mut Sink,
        root: &Map<String, Value>,
        card_id: Option<&str>,
        profiles: &[&str],
        target_types: &[&str],
    ) {
        let Some(tools) = root.get("tools") else { return };
        let Some(items) = tools.as_array() else {
            sink.push(&CARD_TOOL_ID, "/tools", "tools must be an array of Tool declarations");
            return;
        };
        let mut seen: Vec<&str> = Vec::new();
        let empty = Map::new();
        for (i, item) in items.iter().enumerate() {
            let p = index("/tools", i);
            let tool = item.as_object().unwrap_or(&empty);
            if let Some(id) = require_str(sink, &CARD_TOOL_ID, tool, "tool_id", &p) {
                if !is_valid_tool_id(id) {
                    sink.push(
                        &CARD_TOOL_ID_FORMAT,
                        child(&p, "tool_id"),
                        "tool_id is a model function name: at most 256 ASCII letters, digits, _, - or .",
                    );
                }
                if seen.contains(&id) {
                    sink.push(
                        &CARD_TOOL_ID_UNIQUE,
                        child(&p, "tool_id"),
                        format!("tool_id {id:?} is declared twice"),
                    );
                }
                seen.push(id);
            }
            if let Some(profile) = tool.get("profile") {
                match profile.as_str() {
                    Some(pr) if profiles.contains(&pr) => {}
                    _ => sink.push(
                        &CARD_TOOL_PROFILE,
                        child(&p, "profile"),
                        "the Tool's profile must be one of supports.profiles",
                    ),
                }
            }
            self.input_schema(sink, tool.get("input_schema"), &child(&p, "input_schema"));
            tool_texts(sink, tool, &p);
            let im_tool = match tool.get("profile").and_then(Value::as_str) {
                Some(profile) => catalog::is_im_profile(profile),
                None => !target_types.is_empty() && target_types.iter().all(|t| *t == "im"),
            };
            if im_tool && let Some(schema) = obj(tool.get("input_schema")) {
                for (at, name) in
                    crate::tool_schema::find_properties(schema, im::is_forbidden_tool_argument)
                {
                    let pointer =
                        at.split('/').skip(1).fold(child(&p, "input_schema"), |path, part| {
                            child(&child(&path, "properties"), part)
                        });
                    sink.push(
                        &CARD_IM_TOOL_TARGET_ARGUMENT,
                        pointer,
                        format!(
                            "argument {name:?} would let the model choose where the message goes or pass a platform credential; the channel routes the message (use an opaque reply_ref to answer one message)"
                        ),
                    );
                }
            }
            if let (Some(card_id), Some(related)) = (card_id, tool.get("related_skill_ids")) {
                let list = related.as_array().map(Vec::as_slice).unwrap_or_default();
                if !related.is_array() {
                    sink.push(
                        &CARD_TOOL_RELATED_SKILL,
                        child(&p, "related_skill_ids"),
                        "related_skill_ids must be an array of Skill names",
                    );
                }
                for (j, name) in list.iter().enumerate() {
                    if !name.as_str().is_some_and(|n| skill_name_matches_card(n, card_id)) {
                        sink.push(
                            &CARD_TOOL_RELATED_SKILL,
                            index(&child(&p, "related_skill_ids"), j),
                            format!(
                                "related Skill must be {} or {}-<purpose>",
                                primary_skill_name(card_id),
                                primary_skill_name(card_id)
                            ),
                        );
                    }
                }
            }
        }
    }

    pub(super) fn input_schema(&self, sink: &mut Sink, schema: Option<&Value>, path: &str) {
        let Some(schema) =
            obj(schema).filter(|s| s.get("type").and_then(Value::as_str) == Some("object"))
        else {
            sink.push(
                &CARD_TOOL_INPUT_SCHEMA,
                path,
                "input_schema must be an object schema with \"type\": \"object\"; build it with the helper",
            );
            return;
        };
        let properties = obj(schema.get("properties"));
        let channel_ok = properties
            .and_then(|p| obj(p.get(CHANNEL_ARGUMENT)))
            .is_some_and(|c| c.get("type").and_then(Value::as_str) == Some("string"));
        if !channel_ok {
            sink.push(
                &CARD_TOOL_CHANNEL_ARGUMENT,
                child(&child(path, "properties"), CHANNEL_ARGUMENT),
                "input_schema must declare connector_channel_id with type string",
            );
        }
        let required = schema.get("required").and_then(Value::as_array);
        if !required.is_some_and(|r| r.iter().any(|v| v.as_str() == Some(CHANNEL_ARGUMENT))) {
            sink.push(
                &CARD_TOOL_CHANNEL_REQUIRED,
                child(path, "required"),
                "input_schema.required must contain connector_channel_id",
            );
        }
        if properties.is_some_and(|p| p.contains_key("connector_card_id")) {
            sink.push(
                &CARD_TOOL_CARD_ID_ARGUMENT,
                child(&child(path, "properties"), "connector_card_id"),
                "remove the connector_card_id argument: the Card is resolved from the channel",
            );
        } else if required
            .is_some_and(|r| r.iter().any(|v| v.as_str() == Some("connector_card_id")))
        {
            sink.push(
                &CARD_TOOL_CARD_ID_ARGUMENT,
                child(path, "required"),
                "remove connector_card_id from required: it is not a model argument",
            );
        }
    }
}

/// `card.tool_wire_reference`: the texts of one Tool the model reads (its `title` and
/// `description`, and every `title` and `description` string inside its `input_schema`), each
/// scanned by [`model_text::wire_mentions`].
pub(super) fn tool_texts(sink: &mut Sink, tool: &Map<String, Value>, path: &str) {
    fn scan(sink: &mut Sink, text: &str, path: &str) {
        for found in model_text::wire_mentions(text) {
            sink.push(
                &CARD_TOOL_WIRE_REFERENCE,
                path,
                format!(
                    "the model reads this text and it names {}; describe what the Tool does for the user (a file argument is a file from the conversation), not the wire",
                    found.mention
                ),
            );
        }
    }
    fn walk(sink: &mut Sink, value: &Value, path: &str) {
        match value {
            Value::Object(map) => {
                for (key, sub) in map {
                    let here = child(path, key);
                    match sub {
                        Value::String(text) if key == "description" || key == "title" => {
                            scan(sink, text, &here)
                        }
                        _ => walk(sink, sub, &here),
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(sink, item, &index(path, i));
                }
            }
            _ => {}
        }
    }
    for key in ["title", "description"] {
        if let Some(text) = tool.get(key).and_then(Value::as_str) {
            scan(sink, text, &child(path, key));
        }
    }
    if let Some(schema) = tool.get("input_schema") {
        walk(sink, schema, &child(path, "input_schema"));
    }
}
