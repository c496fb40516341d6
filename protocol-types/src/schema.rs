//! JSON Schemas generated from the types (draft 2020-12). `cargo xtask gen-schemas` writes them
//! to `schemas/`; they are at least as strict as the published ones.
//!
//! They are also written for code generators (`cargo xtask codegen-check` generates TypeScript
//! and Python from them and checks the result), which ignore `if`/`then`/`else`. So, without
//! changing what validates:
//! - the packet schema carries `$defs/KnownPacket`, a union discriminated by `type` with one
//!   closed variant per known packet type (envelope requirements and payload folded in); the root
//!   does not reference it, because the root also admits unknown types;
//! - each conditional requirement is stated a second time as an `anyOf` with one branch per value
//!   of its discriminating member (`conditional_branches`);
//! - the `/health` and `/files/uploads` bodies have schemas ([`health_schema`],
//!   [`upload_schema`]).
//!
//! Unit tests check that each restatement accepts exactly what the original accepts.

use schemars::generate::SchemaSettings;
use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Value, json};

use crate::{
    ConnectionDescriptor, ConnectorCard, HealthResponse, PacketBody, PacketType, Role, Routing,
    UploadResponse, WireError,
};

/// The known wire values of an enum except one: the `else` side of a conditional written as a
/// union (see [`conditional_branches`]).
pub(crate) fn known_except(known: &[&str], except: &str) -> Vec<Value> {
    known.iter().filter(|v| **v != except).map(|v| json!(v)).collect()
}

/// An `if`/`then`/`else` on one discriminating member, restated as an `anyOf` with one branch
/// per value: `discriminant == value` with `then`, and each of `others` with `otherwise`. The
/// `if`/`then` stays for validators; the union is what code generators understand, so a
/// conditional requirement is not lost in generated types. Each branch repeats the schema of
/// the members it names (taken from `schema`'s `properties`), since generators read a branch on
/// its own. Both forms accept the same documents (a test in this module checks it).
pub(crate) fn conditional_branches(
    schema: &Schema,
    discriminant: &str,
    value: Value,
    others: Vec<Value>,
    then: Value,
    otherwise: Value,
) -> Value {
    let base = schema.get("properties").and_then(Value::as_object);
    let branch = |test: Value, extra: &Value, require_discriminant: bool| {
        let mut properties = serde_json::Map::new();
        properties.insert(discriminant.into(), test);
        let mut required = Vec::new();
        if require_discriminant {
            required.push(json!(discriminant));
        }
        if let Some(Value::Array(more)) = extra.get("required") {
            required.extend(more.iter().cloned());
        }
        let mut named: Vec<(String, Value)> = required
            .iter()
            .filter_map(Value::as_str)
            .filter(|name| *name != discriminant)
            .map(|name| (name.to_owned(), json!({})))
            .collect();
        if let Some(Value::Object(more)) = extra.get("properties") {
            named.retain(|(name, _)| !more.contains_key(name));
            named.extend(more.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        for (name, overlay) in named {
            let merged = match (overlay, base.and_then(|b| b.get(&name))) {
                (Value::Object(overlay), Some(Value::Object(base))) => {
                    let mut merged = base.clone();
                    merged.extend(overlay);
                    Value::Object(merged)
                }
                (overlay, _) => overlay,
            };
            properties.insert(name, merged);
        }
        let mut out = json!({ "properties": properties });
        if !required.is_empty() {
            out["required"] = Value::Array(required);
        }
        out
    };
    let mut branches = vec![branch(json!({ "const": value }), &then, true)];
    for other in others {
        branches.push(branch(json!({ "const": other }), &otherwise, false));
    }
    Value::Array(branches)
}

fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12().into_generator()
}

fn finish(mut schema: Schema, id: &str, title: &str) -> Value {
    schema.insert("$id".into(), Value::String(id.into()));
    schema.insert("title".into(), Value::String(title.into()));
    let mut value = schema.to_value();
    strip_null(&mut value);
    order_root(&mut value);
    value
}

/// Optional fields are omitted, never `null`, on the wire we write; the published schemas reject
/// `null` there, so ours must too. Removes the `null` alternative schemars adds for `Option`.
fn strip_null(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(types)) = map.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    map.insert("type".into(), only);
                }
            }
            let mut merge = None;
            if let Some(Value::Array(branches)) = map.get_mut("anyOf") {
                branches.retain(|b| b != &serde_json::json!({ "type": "null" }));
                if branches.len() == 1 {
                    merge = Some(branches.remove(0));
                }
            }
            if let Some(Value::Object(only)) = merge {
                map.remove("anyOf");
                for (key, v) in only {
                    map.entry(key).or_insert(v);
                }
            }
            for (key, child) in map.iter_mut() {
                // Literal values are data, not schemas.
                if key != "const" && key != "enum" && key != "examples" && key != "default" {
                    strip_null(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_null),
        _ => {}
    }
}

/// Puts `$schema`, `$id`, `title` first so the committed files read well.
fn order_root(value: &mut Value) {
    if let Value::Object(map) = value {
        let mut ordered = serde_json::Map::new();
        for key in ["$schema", "$id", "title"] {
            if let Some(v) = map.remove(key) {
                ordered.insert(key.into(), v);
            }
        }
        ordered.append(map);
        *map = ordered;
    }
}

/// Schema of the Connector Card (`xagent.connector.v1.schema.json`).
pub fn card_schema() -> Value {
    let schema = generator().into_root_schema_for::<ConnectorCard>();
    finish(schema, "urn:xagent:schema:xagent.connector:v1", "xAgent Connector Card v1")
}

/// Schema of the Connection Descriptor (`xagent.connection.v2.schema.json`).
pub fn descriptor_schema() -> Value {
    let schema = generator().into_root_schema_for::<ConnectionDescriptor>();
    finish(schema, "urn:xagent:schema:xagent.connection:v2", "xAgent Connection Descriptor v2")
}

/// Schema of the packet envelope (`xagent.connector.packet.v1.schema.json`), with the payload of
/// every known type and the per-type envelope requirements (`request_id` on requests and acks,
/// `connector_channel_id` on user-level packets, `reply_to` on `chat.message.ack`, `error` on
/// `error` packets).
pub fn packet_schema() -> Value {
    let mut generator = generator();
    let error = generator.subschema_for::<WireError>();
    let payloads = PacketBody::payload_schemas(&mut generator);
    let mut rules = Vec::new();
    let mut variants = Vec::new();
    for (packet_type, payload) in payloads {
        let Some(spec) = PacketType::spec_of(packet_type) else { continue };
        let mut required = Vec::new();
        if spec.payload_required {
            required.push("payload");
        }
        if matches!(spec.role, Role::Request { .. } | Role::Ack { .. })
            && !matches!(spec.routing, Routing::Either)
        {
            required.push("request_id");
        }
        if matches!(spec.role, Role::MessageAck) {
            required.push("reply_to");
        }
        if matches!(spec.routing, Routing::Channel) {
            required.push("connector_channel_id");
        }
        let mut then = json!({ "properties": { "payload": payload.to_value() } });
        if matches!(spec.routing, Routing::Channel) {
            then["properties"]["connector_channel_id"] =
                json!({ "type": "string", "minLength": 1 });
        }
        if !required.is_empty() {
            then["required"] = json!(required);
        }
        variants.push(packet_variant(packet_type, &then, &error));
        rules.push(json!({
            "if": { "required": ["type"], "properties": { "type": { "const": packet_type } } },
            "then": then
        }));
    }
    let error_then = json!({ "required": ["error"] });
    variants.push(packet_variant("error", &error_then, &error));
    rules.push(json!({
        "if": { "required": ["type"], "properties": { "type": { "const": "error" } } },
        "then": error_then
    }));
    let mut schema = json_schema!({
        "type": "object",
        "required": ["schema", "packet_id", "type"],
        "properties": {
            "schema": { "const": crate::PACKET_SCHEMA },
            "packet_id": { "type": "string", "minLength": 1 },
            "request_id": { "type": "string" },
            "reply_to": { "type": "string" },
            "connector_channel_id": { "type": "string" },
            "type": { "type": "string", "minLength": 1 },
            "time": { "type": "integer", "minimum": 0 },
            "payload": { "type": "object" },
            "error": error.to_value()
        },
        "allOf": rules
    });
    schema.insert("$schema".into(), json!("https://json-schema.org/draft/2020-12/schema"));
    let mut defs = generator.take_definitions(true);
    let mut known = Vec::new();
    for (name, variant) in variants {
        known.push(json!({ "$ref": format!("#/$defs/{name}") }));
        defs.insert(name, variant);
    }
    defs.insert(
        "KnownPacket".into(),
        json!({
            "description": KNOWN_PACKET_DOC,
            "oneOf": known
        }),
    );
    schema.insert("$defs".into(), Value::Object(defs));
    finish(
        schema,
        "urn:xagent:schema:xagent.connector.packet:v1",
        "xAgent Connector Packet Envelope v1",
    )
}

const KNOWN_PACKET_DOC: &str = "A packet of a type this version knows, as a union discriminated by `type`: \
the shape code generators turn into one typed variant per packet type. Not referenced by the root, \
which also admits unknown types; a document matching a variant satisfies the root's rules for that \
type, and vice versa.";

/// The `$defs` name of the packet variant of a wire type: `chat.message.ack` ->
/// `ChatMessageAckPacket`.
fn variant_name(packet_type: &str) -> String {
    let mut name = String::new();
    for part in packet_type.split(['.', '_']) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            name.extend(first.to_uppercase());
            name.push_str(chars.as_str());
        }
    }
    name.push_str("Packet");
    name
}

/// One closed variant of [`packet_schema`]'s `KnownPacket` union: the envelope with `type` fixed
/// and the per-type rules (`then`) folded in, as one object schema, so generators that do not
/// understand `if`/`then` still produce a precise type.
fn packet_variant(packet_type: &str, then: &Value, error: &Schema) -> (String, Value) {
    let mut properties = json!({
        "schema": { "const": crate::PACKET_SCHEMA },
        "packet_id": { "type": "string", "minLength": 1 },
        "request_id": { "type": "string" },
        "reply_to": { "type": "string" },
        "connector_channel_id": { "type": "string" },
        "type": { "const": packet_type },
        "time": { "type": "integer", "minimum": 0 },
        "payload": { "type": "object" },
        "error": error.clone().to_value()
    });
    if let (Some(target), Some(Value::Object(extra))) =
        (properties.as_object_mut(), then.get("properties"))
    {
        for (key, value) in extra {
            target.insert(key.clone(), value.clone());
        }
    }
    let mut required = vec![json!("schema"), json!("packet_id"), json!("type")];
    if let Some(Value::Array(extra)) = then.get("required") {
        required.extend(extra.iter().cloned());
    }
    let variant = json!({
        "type": "object",
        "description": format!("A `{packet_type}` packet."),
        "properties": properties,
        "required": required,
        "additionalProperties": true
    });
    (variant_name(packet_type), variant)
}

/// Schema of the `GET /health` success body (`schemas/http/health.schema.json`).
pub fn health_schema() -> Value {
    let schema = generator().into_root_schema_for::<HealthResponse>();
    finish(schema, "urn:xagent:schema:xagent.connector.health:v1", "xAgent Connector Health")
}

/// Schema of the `POST /files/uploads` success body (`schemas/http/upload.schema.json`).
pub fn upload_schema() -> Value {
    let schema = generator().into_root_schema_for::<UploadResponse>();
    finish(
        schema,
        "urn:xagent:schema:xagent.connector.upload:v1",
        "xAgent Connector Upload Response",
    )
}

/// Schema of each known payload, by wire type (`schemas/packets/<type>.schema.json`).
pub fn payload_schemas() -> Vec<(&'static str, Value)> {
    let mut out = Vec::new();
    let types: Vec<&'static str> =
        PacketType::TABLE.iter().map(|spec| spec.packet_type).filter(|t| *t != "error").collect();
    for packet_type in types {
        let mut generator = generator();
        let mut all = PacketBody::payload_schemas(&mut generator);
        let Some(position) = all.iter().position(|(t, _)| *t == packet_type) else { continue };
        let (_, payload) = all.swap_remove(position);
        let mut schema = payload;
        // Resolve a top-level $ref into the root so the file stands alone.
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str).map(str::to_owned) {
            let name = reference.trim_start_matches("#/$defs/").to_owned();
            let mut defs = generator.take_definitions(true);
            if let Some(Value::Object(body)) = defs.remove(&name) {
                schema = Schema::from(body);
            }
            if !defs.is_empty() {
                schema.insert("$defs".into(), Value::Object(defs));
            }
        } else {
            let defs = generator.take_definitions(true);
            if !defs.is_empty() {
                schema.insert("$defs".into(), Value::Object(defs));
            }
        }
        schema.insert("$schema".into(), json!("https://json-schema.org/draft/2020-12/schema"));
        let id = format!("urn:xagent:schema:xagent.connector.packet:v1:{packet_type}");
        let title = format!("{packet_type} payload");
        out.push((packet_type, finish(schema, &id, &title)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet_fixtures() -> Vec<Value> {
        let base = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        let mut out = Vec::new();
        for dir in ["examples", "documents"] {
            let entries = std::fs::read_dir(format!("{base}/{dir}")).expect("fixture dir");
            for entry in entries {
                let path = entry.expect("entry").path();
                let name = path.file_name().expect("name").to_string_lossy().into_owned();
                if name.starts_with("packet--") {
                    let text = std::fs::read_to_string(&path).expect("fixture");
                    out.push(serde_json::from_str(&text).expect("JSON"));
                }
            }
        }
        out
    }

    /// The `KnownPacket` union accepts exactly the packets of known types the root accepts, so
    /// types generated from it are neither looser nor stricter than the schema.
    #[test]
    fn known_packet_union_agrees_with_the_root_rules() {
        let root = packet_schema();
        let union = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$defs": root["$defs"].clone(),
            "$ref": "#/$defs/KnownPacket"
        });
        let root_validator = jsonschema::validator_for(&root).expect("root compiles");
        let union_validator = jsonschema::validator_for(&union).expect("union compiles");
        let known: Vec<&str> = PacketType::TABLE.iter().map(|spec| spec.packet_type).collect();
        let mut checked = 0;
        let mut accepted = 0;
        for fixture in packet_fixtures() {
            let mut documents = vec![fixture.clone()];
            for field in ["request_id", "reply_to", "connector_channel_id", "payload", "error"] {
                let mut without = fixture.clone();
                if without.as_object_mut().and_then(|map| map.remove(field)).is_some() {
                    documents.push(without);
                }
            }
            for document in documents.clone() {
                for packet_type in &known {
                    let mut retyped = document.clone();
                    retyped["type"] = json!(packet_type);
                    documents.push(retyped);
                }
            }
            for document in documents {
                let by_root = root_validator.is_valid(&document);
                assert_eq!(
                    by_root,
                    union_validator.is_valid(&document),
                    "root and KnownPacket disagree on {document}"
                );
                checked += 1;
                accepted += usize::from(by_root);
            }
        }
        assert!(checked > 500 && accepted > 20, "checked {checked}, accepted {accepted}");
    }

    /// Every combination of the given member values (`None` = member absent) on top of `base`.
    fn combinations(base: Value, members: &[(&str, Vec<Option<Value>>)]) -> Vec<Value> {
        let mut out = vec![base];
        for (name, values) in members {
            let mut next = Vec::new();
            for document in &out {
                for value in values {
                    let mut document = document.clone();
                    match value {
                        Some(value) => document[*name] = value.clone(),
                        None => {
                            if let Some(map) = document.as_object_mut() {
                                map.remove(*name);
                            }
                        }
                    }
                    next.push(document);
                }
            }
            out = next;
        }
        out
    }

    /// The conditional requirements restated as `anyOf` unions accept exactly what their
    /// `if`/`then`/`else` accepts, so generated types (which see only the union) are neither
    /// looser nor stricter than validators (which see both).
    #[test]
    fn conditional_unions_agree_with_if_then_else() {
        let card = card_schema();
        let packet = packet_schema();
        let descriptor = crate::ConnectionDescriptor::from_wire(json!({
            "schema": "xagent.connection/v2",
            "connection": { "connector_card_id": "c", "connector_id": "i", "connector_channel_id": "h",
                "target_type": "im", "profiles": ["xagent.im.v2"], "status": "connected" },
            "target": { "provider": "p", "display_name": "d" }
        }))
        .expect("descriptor");
        let descriptor = serde_json::to_value(descriptor).expect("descriptor JSON");
        let field = json!({ "name": "n", "label": "l", "input_type": "text" });
        let known = |values: &[&str]| -> Vec<Option<Value>> {
            let mut out: Vec<Option<Value>> = values.iter().map(|v| Some(json!(v))).collect();
            out.push(None);
            out
        };
        let cases: Vec<(&Value, &str, Vec<Value>)> = vec![
            (
                &card,
                "AuthFlow",
                combinations(
                    json!({ "id": "f", "target_type": "im", "title": "t" }),
                    &[
                        ("type", known(crate::AuthFlowType::KNOWN)),
                        ("fields", vec![None, Some(json!([])), Some(json!([field]))]),
                    ],
                ),
            ),
            (
                &card,
                "AuthField",
                combinations(
                    field.clone(),
                    &[
                        ("secret", vec![None, Some(json!(true)), Some(json!(false))]),
                        ("default_value", vec![None, Some(json!("x"))]),
                    ],
                ),
            ),
            (
                &packet,
                "AuthProgress",
                combinations(
                    json!({}),
                    &[
                        ("status", known(crate::AuthStatus::KNOWN)),
                        ("connection_descriptor", vec![None, Some(descriptor)]),
                    ],
                ),
            ),
            (
                &packet,
                "ChatMessageAck",
                combinations(
                    json!({ "message_id": "m" }),
                    &[
                        ("status", known(crate::AckStatus::KNOWN)),
                        ("code", vec![None, Some(json!("timeout"))]),
                        ("retryable", vec![None, Some(json!(true))]),
                    ],
                ),
            ),
            (
                &packet,
                "ChatActivity",
                combinations(
                    json!({}),
                    &[
                        ("status", known(crate::ActivityStatus::KNOWN)),
                        ("tool_name", vec![None, Some(json!("web_search"))]),
                    ],
                ),
            ),
        ];
        for (root, def, documents) in cases {
            let only = |drop: &[&str]| {
                let mut defs = root["$defs"].clone();
                let body = defs[def].as_object_mut().expect("def is an object");
                assert!(body.contains_key("anyOf") && body.contains_key("if"), "{def}");
                for key in drop {
                    body.remove(*key);
                }
                let schema = json!({ "$defs": defs, "$ref": format!("#/$defs/{def}") });
                jsonschema::validator_for(&schema).expect("compiles")
            };
            let conditional = only(&["anyOf"]);
            let union = only(&["if", "then", "else"]);
            let mut accepted = 0;
            for document in &documents {
                let by_conditional = conditional.is_valid(document);
                assert_eq!(by_conditional, union.is_valid(document), "{def}: {document}");
                accepted += usize::from(by_conditional);
            }
            assert!(
                accepted > 0 && accepted < documents.len(),
                "{def}: {accepted}/{}",
                documents.len()
            );
        }
    }

    #[test]
    fn variant_names_are_pascal_case() {
        assert_eq!(variant_name("chat.message.ack"), "ChatMessageAckPacket");
        assert_eq!(variant_name("error"), "ErrorPacket");
    }
}
