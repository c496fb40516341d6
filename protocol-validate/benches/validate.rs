//! Card validation and packet decode+validate per second, side by side with validating the same
//! documents against the published JSON Schemas with the `jsonschema` crate.
//!
//! Run with `cargo bench -p xagent-protocol-validate`; the ratio is recorded in the README.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::Value;
use xagent_protocol_types::Packet;
use xagent_protocol_validate::{CardFacts, PacketContext, Validator};

const CARD: &str = include_str!("../tests/fixtures/card.json");
const PACKET: &str = include_str!("../tests/fixtures/chat_message.json");
const CARD_SCHEMA: &str =
    include_str!("../../protocol-types/tests/fixtures/published/xagent.connector.v1.schema.json");
const PACKET_SCHEMA: &str = include_str!(
    "../../protocol-types/tests/fixtures/published/xagent.connector.packet.v1.schema.json"
);

fn schema(text: &str) -> jsonschema::Validator {
    let value: Value = serde_json::from_str(text).expect("published schema is JSON");
    jsonschema::validator_for(&value).expect("published schema compiles")
}

fn card(c: &mut Criterion) {
    let card: Value = serde_json::from_str(CARD).expect("fixture is JSON");
    let ours = Validator::new();
    let published = schema(CARD_SCHEMA);
    assert!(ours.card(&card).valid && published.is_valid(&card));
    let mut group = c.benchmark_group("card");
    group.throughput(Throughput::Elements(1));
    group.bench_function("protocol-validate", |b| b.iter(|| ours.card(black_box(&card))));
    group.bench_function("jsonschema (published schema)", |b| {
        b.iter(|| published.is_valid(black_box(&card)))
    });
    group.finish();
}

fn packet(c: &mut Criterion) {
    let card: Value = serde_json::from_str(CARD).expect("fixture is JSON");
    let facts = CardFacts::from_value(&card);
    let ours = Validator::new();
    let context = PacketContext { card: Some(&facts), sender: None };
    let published = schema(PACKET_SCHEMA);
    let bytes = PACKET.as_bytes();
    let mut group = c.benchmark_group("packet decode+validate");
    group.throughput(Throughput::Elements(1));
    group.bench_function("protocol-validate", |b| {
        b.iter(|| {
            let value: Value = serde_json::from_slice(black_box(bytes)).expect("JSON");
            let report = ours.packet(&value, context);
            let packet = Packet::decode(black_box(bytes)).expect("decodes");
            (report.valid, packet.packet_id)
        })
    });
    group.bench_function("jsonschema (published schema)", |b| {
        b.iter(|| {
            let value: Value = serde_json::from_slice(black_box(bytes)).expect("JSON");
            published.is_valid(&value)
        })
    });
    group.finish();
}

criterion_group!(benches, card, packet);
criterion_main!(benches);
