//! Helpers shared by the integration tests: schema validators and round-trip checks.

#![allow(dead_code)]

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use xagent_protocol_types::schema;

pub fn published(name: &str) -> Value {
    let text = match name {
        "card" => include_str!("../fixtures/published/xagent.connector.v1.schema.json"),
        "descriptor" => include_str!("../fixtures/published/xagent.connection.v2.schema.json"),
        "packet" => include_str!("../fixtures/published/xagent.connector.packet.v1.schema.json"),
        other => panic!("no published schema {other}"),
    };
    serde_json::from_str(text).expect("published schema is JSON")
}

pub fn ours(name: &str) -> Value {
    match name {
        "card" => schema::card_schema(),
        "descriptor" => schema::descriptor_schema(),
        "packet" => schema::packet_schema(),
        other => panic!("no schema {other}"),
    }
}

/// A schema that checks a sub-document against one `$defs` entry of a root schema.
pub fn def_of(root: &Value, def: &str) -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": root["$defs"].clone(),
        "$ref": format!("#/$defs/{def}")
    })
}

pub fn payload_schema(packet_type: &str) -> Value {
    schema::payload_schemas()
        .into_iter()
        .find(|(t, _)| *t == packet_type)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("no payload schema for {packet_type}"))
}

pub fn errors(schema: &Value, instance: &Value) -> Vec<String> {
    let validator = jsonschema::validator_for(schema).expect("schema compiles");
    validator
        .iter_errors(instance)
        .map(|e| format!("{} at {} ({})", e, e.instance_path(), e.schema_path()))
        .collect()
}

pub fn assert_valid(schema: &Value, instance: &Value, what: &str) {
    let errors = errors(schema, instance);
    assert!(errors.is_empty(), "{what} should validate, errors: {errors:#?}");
}

/// Parses into `T`, serialises back, and requires semantically equal JSON.
pub fn round_trip<T: DeserializeOwned + Serialize>(original: &Value) -> T {
    let typed: T = serde_json::from_value(original.clone()).expect("parses into the typed model");
    let back = serde_json::to_value(&typed).expect("serialises");
    assert_eq!(&back, original, "round trip changed the document");
    typed
}
