//! Our generated schemas are at least as strict as the published ones: every document a
//! published schema rejects, ours rejects too. Documents are made by mutating a valid base
//! document one change at a time; the test also requires that every `required`, `enum`,
//! `const` and `pattern` keyword of the published schemas rejected at least one of them.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::{Value, json};

fn base(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/documents/{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("base document")).expect("JSON")
}

/// Every JSON pointer in a document, parents before children.
fn pointers(value: &Value, prefix: String, out: &mut Vec<String>) {
    out.push(prefix.clone());
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let escaped = key.replace('~', "~0").replace('/', "~1");
                pointers(child, format!("{prefix}/{escaped}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                pointers(child, format!("{prefix}/{i}"), out);
            }
        }
        _ => {}
    }
}

fn split_parent(pointer: &str) -> Option<(&str, String)> {
    let (parent, last) = pointer.rsplit_once('/')?;
    Some((parent, last.replace("~1", "/").replace("~0", "~")))
}

/// All single-change mutations of a document: remove a member or element, or replace a value.
fn mutations(document: &Value) -> Vec<Value> {
    let replacements = [
        json!("zz-not-a-known-value"),
        json!(""),
        json!("bad id with spaces!"),
        json!("x".repeat(300)),
        json!(12345),
        json!(-1),
        json!(true),
        json!(null),
        json!([]),
        json!(["zz"]),
        json!({}),
    ];
    let mut all = Vec::new();
    pointers(document, String::new(), &mut all);
    let mut out = Vec::new();
    for pointer in all.iter().filter(|p| !p.is_empty()) {
        for replacement in &replacements {
            let mut mutated = document.clone();
            if let Some(slot) = mutated.pointer_mut(pointer) {
                *slot = replacement.clone();
                out.push(mutated);
            }
        }
        if let Some((parent, key)) = split_parent(pointer) {
            let mut mutated = document.clone();
            let removed = match mutated.pointer_mut(parent) {
                Some(Value::Object(map)) => map.remove(&key).is_some(),
                Some(Value::Array(items)) => match key.parse::<usize>() {
                    Ok(i) if i < items.len() => {
                        items.remove(i);
                        true
                    }
                    _ => false,
                },
                _ => false,
            };
            if removed {
                out.push(mutated);
            }
            // Duplicate an array element (uniqueItems).
            let mut mutated = document.clone();
            if let Some(Value::Array(items)) = mutated.pointer_mut(parent)
                && let Ok(i) = key.parse::<usize>()
            {
                let copy = items[i].clone();
                items.push(copy);
                out.push(mutated);
            }
        }
    }
    out
}

/// Locations of the keywords the issue names, in a published schema.
fn keyword_locations(schema: &Value, prefix: String, out: &mut BTreeSet<String>) {
    let Value::Object(map) = schema else { return };
    for (key, child) in map {
        let location = format!("{prefix}/{key}");
        match key.as_str() {
            "required" | "enum" | "const" | "pattern" => {
                out.insert(location);
            }
            // Members of these are named subschemas, not keywords.
            "properties" | "$defs" | "patternProperties" => {
                if let Value::Object(named) = child {
                    for (name, subschema) in named {
                        keyword_locations(subschema, format!("{location}/{name}"), out);
                    }
                }
            }
            _ => keyword_locations(child, location, out),
        }
    }
}

fn check_at_least_as_strict(schema_name: &str, documents: &[&str]) {
    let published_schema = published(schema_name);
    let our_schema = ours(schema_name);
    let published_validator = jsonschema::validator_for(&published_schema).expect("compiles");
    let our_validator = jsonschema::validator_for(&our_schema).expect("compiles");
    let mut rejected_by_keyword = BTreeSet::new();
    let mut checked = 0;
    for name in documents {
        let document = base(name);
        assert!(
            published_validator.is_valid(&document),
            "{name} must satisfy the published schema"
        );
        assert!(our_validator.is_valid(&document), "{name} must satisfy our schema");
        for mutated in mutations(&document) {
            let published_errors: Vec<String> = published_validator
                .iter_errors(&mutated)
                .map(|e| e.schema_path().to_string())
                .collect();
            if published_errors.is_empty() {
                continue;
            }
            checked += 1;
            assert!(
                !our_validator.is_valid(&mutated),
                "published {schema_name} schema rejects ({published_errors:?}) but ours accepts:\n{}",
                serde_json::to_string_pretty(&mutated).unwrap_or_default()
            );
            rejected_by_keyword.extend(published_errors);
        }
    }
    let mut expected = BTreeSet::new();
    keyword_locations(&published_schema, String::new(), &mut expected);
    assert!(expected.len() >= 2, "the walker found keywords in the published {schema_name} schema");
    let uncovered: Vec<&String> = expected
        .iter()
        .filter(|keyword| {
            !rejected_by_keyword
                .iter()
                .any(|hit| keyword.as_str() == hit || keyword.starts_with(&format!("{hit}/")))
        })
        .collect();
    assert!(
        uncovered.is_empty(),
        "no mutation exercised these published {schema_name} keywords: {uncovered:#?}"
    );
    assert!(checked > 20, "only {checked} rejected documents for {schema_name}");
}

#[test]
fn card_schema_is_at_least_as_strict_as_published() {
    check_at_least_as_strict("card", &["card--full"]);
}

#[test]
fn descriptor_schema_is_at_least_as_strict_as_published() {
    check_at_least_as_strict("descriptor", &["descriptor--full"]);
}

#[test]
fn packet_schema_is_at_least_as_strict_as_published() {
    check_at_least_as_strict("packet", &["packet--full"]);
}

fn rejects(schema: &Value, document: Value) {
    let validator = jsonschema::validator_for(schema).expect("compiles");
    assert!(!validator.is_valid(&document), "should be rejected: {document}");
}

fn accepts(schema: &Value, document: Value) {
    let errors = errors(schema, &document);
    assert!(errors.is_empty(), "should be accepted: {document}: {errors:?}");
}

#[test]
fn prose_rule_activity_tool_name_only_with_tool_status() {
    let schema = payload_schema("chat.activity");
    accepts(&schema, json!({ "status": "tool", "tool_name": "web_search" }));
    accepts(&schema, json!({ "status": "thinking" }));
    rejects(&schema, json!({ "status": "tool" }));
    rejects(&schema, json!({ "status": "thinking", "tool_name": "web_search" }));
    rejects(&schema, json!({ "status": "idle", "tool_name": "x" }));
    rejects(&schema, json!({ "status": "tool", "tool_name": "x".repeat(257) }));
    rejects(&schema, json!({ "status": "sleeping" }));
}

#[test]
fn prose_rule_chat_message_needs_text_or_files() {
    let schema = payload_schema("chat.message");
    accepts(&schema, json!({ "message_id": "m1", "text": "hi" }));
    accepts(
        &schema,
        json!({ "message_id": "m1", "files": [{ "type": "file", "file_ref": "f1" }] }),
    );
    rejects(&schema, json!({ "message_id": "m1" }));
    rejects(&schema, json!({ "message_id": "m1", "text": "" }));
    rejects(&schema, json!({ "message_id": "m1", "text": "", "files": [] }));
    rejects(
        &schema,
        json!({ "message_id": "m1", "files": [{ "type": "sticker", "file_ref": "f1" }] }),
    );
}

#[test]
fn prose_rule_chat_message_has_no_internal_identities() {
    let schema = payload_schema("chat.message");
    for field in ["session_id", "user_id", "user_connector_id", "connector_id", "role"] {
        rejects(&schema, json!({ "message_id": "m1", "text": "hi", field: "x" }));
    }
}

#[test]
fn prose_rule_rejected_ack_needs_code_and_retryable() {
    let schema = payload_schema("chat.message.ack");
    accepts(&schema, json!({ "message_id": "m1", "status": "accepted" }));
    accepts(
        &schema,
        json!({ "message_id": "m1", "status": "rejected", "code": "x", "retryable": false }),
    );
    rejects(&schema, json!({ "message_id": "m1", "status": "rejected" }));
    rejects(&schema, json!({ "message_id": "m1", "status": "rejected", "code": "x" }));
}

#[test]
fn prose_rule_delta_sequence_starts_at_one() {
    let schema = payload_schema("chat.message.delta");
    accepts(&schema, json!({ "message_id": "m1", "sequence": 1, "text": "a" }));
    rejects(&schema, json!({ "message_id": "m1", "sequence": 0, "text": "a" }));
}

#[test]
fn prose_rule_form_flow_needs_fields_and_secret_has_no_default() {
    let card = ours("card");
    let flow = def_of(&card, "AuthFlow");
    accepts(&flow, json!({ "id": "f", "target_type": "im", "type": "qr_login", "title": "t" }));
    rejects(&flow, json!({ "id": "f", "target_type": "im", "type": "form", "title": "t" }));
    rejects(
        &flow,
        json!({ "id": "f", "target_type": "im", "type": "form", "title": "t", "fields": [] }),
    );
    let field = def_of(&card, "AuthField");
    accepts(
        &field,
        json!({ "name": "n", "label": "l", "input_type": "text", "default_value": "x" }),
    );
    rejects(
        &field,
        json!({ "name": "n", "label": "l", "input_type": "password", "secret": true, "default_value": "x" }),
    );
}

#[test]
fn prose_rule_tool_schema_must_not_declare_connector_card_id() {
    let tool = def_of(&ours("card"), "CardTool");
    rejects(
        &tool,
        json!({
            "tool_id": "t",
            "input_schema": {
                "type": "object",
                "required": ["connector_channel_id"],
                "properties": {
                    "connector_channel_id": { "type": "string" },
                    "connector_card_id": { "type": "string" }
                }
            }
        }),
    );
}

#[test]
fn prose_rule_envelope_fields_required_per_type() {
    let packet = ours("packet");
    let base = json!({
        "schema": "xagent.connector.packet/v1", "packet_id": "p", "request_id": "r",
        "connector_channel_id": "c", "type": "tool.invoke",
        "payload": { "tool_id": "t", "arguments": {} }
    });
    accepts(&packet, base.clone());
    for missing in ["request_id", "connector_channel_id", "payload"] {
        let mut doc = base.clone();
        doc.as_object_mut().expect("object").remove(missing);
        rejects(&packet, doc);
    }
    // chat.message.ack needs reply_to.
    let ack = json!({
        "schema": "xagent.connector.packet/v1", "packet_id": "p", "connector_channel_id": "c",
        "type": "chat.message.ack", "payload": { "message_id": "m", "status": "accepted" }
    });
    rejects(&packet, ack.clone());
    let mut with_reply = ack;
    with_reply["reply_to"] = json!("pkt_msg");
    accepts(&packet, with_reply);
    // An error packet needs its error object.
    rejects(
        &packet,
        json!({ "schema": "xagent.connector.packet/v1", "packet_id": "p", "type": "error" }),
    );
}
