//! Malformed input yields a typed error, never a panic: wrong JSON types, missing fields,
//! unknown enum values, huge numbers, deep nesting, random bytes.

use proptest::prelude::*;
use serde_json::{Value, json};
use xagent_protocol_types::*;

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
        "[a-z._]{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "xagent.connector.packet/v1",
            "xagent.connector/v1",
            "xagent.connection/v2",
            "xagent.connection/v1",
            "tool.invoke",
            "chat.message",
            "connector.hello",
            "im",
            "3.0",
        ])
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "schema",
                        "packet_id",
                        "request_id",
                        "type",
                        "payload",
                        "error",
                        "code",
                        "time",
                        "connector_channel_id",
                        "message_id",
                        "text",
                        "files",
                        "status",
                        "tool_id",
                        "arguments",
                        "connection",
                        "target",
                        "tools",
                        "profiles",
                        "sequence",
                        "supports",
                        "connector",
                        "build",
                        "connector_card_id",
                    ]),
                    inner,
                ),
                0..8,
            )
            .prop_map(|pairs| {
                Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

/// Packet-shaped values with a random type and payload, to reach the payload decoders.
fn arb_packetish() -> impl Strategy<Value = Value> {
    let types: Vec<&'static str> = PacketType::TABLE.iter().map(|s| s.packet_type).collect();
    (prop::sample::select(types), arb_json(), any::<bool>()).prop_map(|(t, payload, with_error)| {
        let mut packet = json!({
            "schema": PACKET_SCHEMA, "packet_id": "pkt_1", "type": t, "payload": payload
        });
        if with_error {
            packet["error"] = json!({ "code": "x" });
        }
        packet
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = Packet::decode(&bytes);
    }

    #[test]
    fn random_json_never_panics(value in arb_json()) {
        let text = value.to_string();
        let _ = Packet::decode_str(&text);
        let _ = Packet::from_value(value.clone());
        let _ = serde_json::from_value::<ConnectorCard>(value.clone());
        let _ = ConnectionDescriptor::from_wire(value.clone());
        let _ = serde_json::from_value::<HealthResponse>(value);
    }

    #[test]
    fn random_payloads_decode_or_fail_typed(value in arb_packetish()) {
        let text = value.to_string();
        let fast = Packet::decode_str(&text);
        let slow = Packet::from_value(value);
        // Both paths agree on success or failure.
        prop_assert_eq!(fast.is_ok(), slow.is_ok());
        if let Err(error) = fast {
            prop_assert_eq!(error.code(), ErrorCode::InvalidPacket);
            prop_assert!(!error.to_string().is_empty());
        }
    }
}

#[test]
fn deeply_nested_payload_is_an_error_not_a_stack_overflow() {
    let depth = 100_000;
    let text = format!(
        r#"{{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"tool.invoke","payload":{{"tool_id":"t","arguments":{{"a":{}{}}}}}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let error = Packet::decode_str(&text).expect_err("too deep");
    assert_eq!(error.code(), ErrorCode::InvalidPacket);
}

#[test]
fn huge_numbers_are_errors() {
    for time in ["1e400", "99999999999999999999999999", "-1", "1.5"] {
        let text = format!(
            r#"{{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"ping","time":{time}}}"#
        );
        assert!(Packet::decode_str(&text).is_err(), "time {time} must be rejected");
    }
    let text = r#"{"schema":"xagent.connector.packet/v1","packet_id":"p","connector_channel_id":"c",
        "type":"chat.message.delta","payload":{"message_id":"m","sequence":1e30,"text":"x"}}"#;
    assert!(Packet::decode_str(text).is_err());
}

#[test]
fn wrong_types_missing_fields_and_unknown_values() {
    let cases = [
        // not an object
        "[]",
        "42",
        "\"text\"",
        // wrong schema
        r#"{"schema":"other/v1","packet_id":"p","type":"ping"}"#,
        // missing packet_id / type
        r#"{"schema":"xagent.connector.packet/v1","type":"ping"}"#,
        r#"{"schema":"xagent.connector.packet/v1","packet_id":"p"}"#,
        // empty packet_id
        r#"{"schema":"xagent.connector.packet/v1","packet_id":"","type":"ping"}"#,
        // wrong envelope types
        r#"{"schema":"xagent.connector.packet/v1","packet_id":7,"type":"ping"}"#,
        r#"{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"ping","request_id":{}}"#,
        // payload not an object
        r#"{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"ping","payload":[1]}"#,
        // required payload missing
        r#"{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"tool.invoke"}"#,
        // payload field of the wrong type
        r#"{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"tool.invoke","payload":{"tool_id":3}}"#,
        r#"{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"chat.message","payload":{"text":"no id"}}"#,
    ];
    for case in cases {
        let error = Packet::decode_str(case).expect_err(case);
        assert_eq!(error.code(), ErrorCode::InvalidPacket, "{case}");
    }
}

#[test]
fn decode_errors_keep_ids_for_the_error_reply() {
    let text = r#"{"schema":"xagent.connector.packet/v1","packet_id":"pkt_9","request_id":"req_9",
        "connector_channel_id":"cch_9","type":"tool.invoke","payload":{"tool_id":[]}}"#;
    let error = Packet::decode_str(text).expect_err("bad payload");
    assert_eq!(error.ids.request_id.as_ref().map(RequestId::as_str), Some("req_9"));
    assert_eq!(error.ids.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_9"));
    let broken = r#"{"schema":"xagent.connector.packet/v1","request_id":"req_8","type":5}"#;
    let error = Packet::decode_str(broken).expect_err("bad envelope");
    assert_eq!(error.ids.request_id.as_ref().map(RequestId::as_str), Some("req_8"));
}

#[test]
fn decode_error_messages_do_not_echo_values() {
    let text = r#"{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"chat.message.delta",
        "connector_channel_id":"c","payload":{"message_id":"m","sequence":"sk-live-SECRET","text":"x"}}"#;
    let error = Packet::decode_str(text).expect_err("sequence is a string");
    assert!(!error.to_string().contains("SECRET"), "{error}");
}

#[test]
fn unknown_enum_values_are_kept_not_rejected() {
    let text = r#"{"schema":"xagent.connector.packet/v1","packet_id":"p","connector_channel_id":"c",
        "type":"chat.activity","payload":{"status":"dreaming"}}"#;
    let packet = Packet::decode_str(text).expect("open enum");
    let activity: &ChatActivity = packet.payload().expect("activity");
    assert_eq!(activity.status, ActivityStatus::Other("dreaming".into()));
    assert!(!activity.status.is_known());
    assert_eq!(packet.to_value().expect("json")["payload"]["status"], "dreaming");
}

#[test]
fn unknown_packet_types_keep_their_payload() {
    let text = r#"{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"session.sync_request","payload":{"x":[1,2]}}"#;
    let packet = Packet::decode_str(text).expect("unknown types decode");
    match &packet.body {
        PacketBody::Unknown { packet_type, payload } => {
            assert_eq!(packet_type, "session.sync_request");
            assert_eq!(payload.as_ref().expect("payload")["x"], json!([1, 2]));
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
    assert_eq!(packet.packet_type(), PacketType::Unknown("session.sync_request".into()));
}
