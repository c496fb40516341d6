//! Packet decoding per second, side by side in one run:
//!
//! - `typed`: [`Packet::decode`], the envelope plus the payload parsed into its typed struct
//!   (every field type, required field and enum checked by the types);
//! - `value`: `serde_json::from_slice::<Value>` of the same bytes (the floor: JSON parsing
//!   alone, no checks);
//! - `schema_published`: parse to `Value` and validate against the published envelope schema
//!   with `jsonschema` (the envelope only: the published schema leaves payloads open);
//! - `schema_generated`: parse to `Value` and validate against the packet schema generated
//!   into `schemas/` (envelope and typed payload per `type`).
//!
//! Run with `cargo bench -p xagent-protocol-types --bench decode`. `cargo xtask bench-decode`
//! measures the same four paths without criterion and prints the ratios (see BENCHMARKS.md).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::Value;
use std::hint::black_box;
use xagent_protocol_types::Packet;

/// (name, wire bytes) of the packets measured: the two hot data-plane packets.
fn samples() -> Vec<(&'static str, Vec<u8>)> {
    let message = include_str!("../tests/fixtures/examples/packet--chat.message.json");
    let invoke = r#"{"schema":"xagent.connector.packet/v1","packet_id":"pkt_81f2","request_id":"req_81f2","connector_channel_id":"cch_5d1e","type":"tool.invoke","time":1790000000000,"payload":{"tool_id":"echo_send","arguments":{"connector_channel_id":"cch_5d1e","text":"hello there"}}}"#;
    vec![("chat.message", compact(message)), ("tool.invoke", compact(invoke))]
}

fn compact(text: &str) -> Vec<u8> {
    let value: Value = serde_json::from_str(text).expect("fixture is JSON");
    serde_json::to_vec(&value).expect("serialises")
}

fn schema(text: &str) -> jsonschema::Validator {
    let value: Value = serde_json::from_str(text).expect("schema is JSON");
    jsonschema::validator_for(&value).expect("schema compiles")
}

fn decode(c: &mut Criterion) {
    let published =
        schema(include_str!("../tests/fixtures/published/xagent.connector.packet.v1.schema.json"));
    let generated = schema(include_str!("../../schemas/xagent.connector.packet.v1.schema.json"));
    for (name, bytes) in samples() {
        assert!(Packet::decode(&bytes).is_ok(), "{name} decodes");
        let value: Value = serde_json::from_slice(&bytes).expect("JSON");
        assert!(published.is_valid(&value) && generated.is_valid(&value), "{name} is valid");
        let mut group = c.benchmark_group(format!("decode/{name}"));
        group.throughput(Throughput::Elements(1));
        group.bench_function("typed", |b| b.iter(|| Packet::decode(black_box(&bytes)).is_ok()));
        group.bench_function("value", |b| {
            b.iter(|| serde_json::from_slice::<Value>(black_box(&bytes)).is_ok())
        });
        group.bench_function("schema_published", |b| {
            b.iter(|| {
                serde_json::from_slice::<Value>(black_box(&bytes))
                    .is_ok_and(|value| published.is_valid(&value))
            })
        });
        group.bench_function("schema_generated", |b| {
            b.iter(|| {
                serde_json::from_slice::<Value>(black_box(&bytes))
                    .is_ok_and(|value| generated.is_valid(&value))
            })
        });
        group.finish();
    }
}

criterion_group!(benches, decode);
criterion_main!(benches);
