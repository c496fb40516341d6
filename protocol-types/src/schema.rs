//! JSON Schemas generated from the types (draft 2020-12). `cargo xtask gen-schemas` writes them
//! to `schemas/`; they are at least as strict as the published ones.

use schemars::generate::SchemaSettings;
use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Value, json};

use crate::{
    ConnectionDescriptor, ConnectorCard, PacketBody, PacketType, Role, Routing, WireError,
};

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
        rules.push(json!({
            "if": { "required": ["type"], "properties": { "type": { "const": packet_type } } },
            "then": then
        }));
    }
    rules.push(json!({
        "if": { "required": ["type"], "properties": { "type": { "const": "error" } } },
        "then": { "required": ["error"] }
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
    let defs = generator.take_definitions(true);
    if !defs.is_empty() {
        schema.insert("$defs".into(), Value::Object(defs));
    }
    finish(
        schema,
        "urn:xagent:schema:xagent.connector.packet:v1",
        "xAgent Connector Packet Envelope v1",
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
