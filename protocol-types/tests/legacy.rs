//! Section 12: a `xagent.connection/v1` Descriptor on the wire is accepted and normalised on
//! receive (singular `profile` -> `profiles`), and never written back as v1.

use serde_json::Value;
use xagent_protocol_types::{
    ChannelOpenAck, ConnectionDescriptor, DESCRIPTOR_SCHEMA, Packet, PacketBody, ProfileId,
};

fn load(name: &str) -> String {
    let path = format!("{}/tests/fixtures/legacy/{name}.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn descriptor_of(packet: &Packet) -> &ConnectionDescriptor {
    match &packet.body {
        PacketBody::ChannelOpenAck(Some(ack)) => &ack.connection_descriptor,
        other => panic!("expected a channel.open.ack with a payload, got {other:?}"),
    }
}

#[test]
fn descriptor_v1_rule_a_v1_descriptor_in_a_packet_is_read_and_normalised() {
    let text = load("packet--channel.open.ack.v1");
    let fast = Packet::decode_str(&text).expect("the fast path reads a v1 Descriptor");
    let value: Value = serde_json::from_str(&text).expect("JSON");
    let slow = Packet::from_value(value).expect("the generic path reads a v1 Descriptor");
    assert_eq!(fast, slow, "both decoding paths agree");
    let descriptor = descriptor_of(&fast);
    assert_eq!(descriptor.connection.profiles, vec![ProfileId::from("xagent.im.v2")]);
    assert_eq!(descriptor.connection.connector_channel_id, "cch_legacy");
    assert!(descriptor.is_tool_available("legacy_send"));
    let region = descriptor.connection.extra.get("region").and_then(Value::as_str);
    assert_eq!(region, Some("kept as an unknown field"), "unknown fields survive");
}

#[test]
fn descriptor_v1_rule_the_normalised_descriptor_is_written_as_v2_only() {
    let packet = Packet::decode_str(&load("packet--channel.open.ack.v1")).expect("reads");
    let written = serde_json::to_value(&packet).expect("encodes");
    let descriptor = &written["payload"]["connection_descriptor"];
    assert_eq!(descriptor["schema"], DESCRIPTOR_SCHEMA);
    assert_eq!(descriptor["connection"]["profiles"], serde_json::json!(["xagent.im.v2"]));
    assert!(descriptor["connection"].get("profile").is_none(), "never written back as v1");
    let typed: ChannelOpenAck =
        serde_json::from_value(written["payload"].clone()).expect("the v2 form reads again");
    assert_eq!(&typed.connection_descriptor, descriptor_of(&packet));
}

#[test]
fn descriptor_v1_rule_an_unknown_schema_is_still_refused() {
    let text =
        load("packet--channel.open.ack.v1").replace("xagent.connection/v1", "xagent.connection/v7");
    assert!(Packet::decode_str(&text).is_err());
}
