//! Every wire example of the reference texts parses into the typed model, serialises back to
//! the same JSON, and validates against our generated schemas and, where one applies, the
//! published ones.

mod common;

use common::*;
use serde_json::{Map, Value};
use xagent_protocol_types::*;

fn load(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/examples/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn check(name: &str) {
    let value = load(name);
    let (kind, rest) = name.split_once("--").expect("fixture names are kind--name");
    match kind {
        "card" => {
            let card: ConnectorCard = round_trip(&value);
            assert_eq!(card.connector_card_id, "im.wechat");
            assert_valid(&ours("card"), &value, "card vs our schema");
            assert_valid(&published("card"), &value, "card vs published schema");
        }
        "descriptor" => {
            let descriptor: ConnectionDescriptor = round_trip(&value);
            assert!(!descriptor.connection.profiles.is_empty());
            assert_valid(&ours("descriptor"), &value, "descriptor vs our schema");
            assert_valid(&published("descriptor"), &value, "descriptor vs published schema");
        }
        "packet" => {
            let packet: Packet = round_trip(&value);
            assert_eq!(packet.type_str(), rest.trim_end_matches(".error"));
            assert!(!matches!(packet.body, PacketBody::Unknown { .. }), "{rest} is a known type");
            // The fast decoding path agrees with the generic one.
            let text = serde_json::to_string(&value).expect("serialises");
            assert_eq!(Packet::decode_str(&text).expect("decodes"), packet);
            assert_valid(&ours("packet"), &value, "packet vs our schema");
            assert_valid(&published("packet"), &value, "packet vs published schema");
        }
        "envelope" => {
            let envelope: Envelope = round_trip(&value);
            assert_eq!(envelope.schema, PACKET_SCHEMA);
            let mut envelope_only = ours("packet");
            envelope_only.as_object_mut().expect("object").remove("allOf");
            assert_valid(&envelope_only, &value, "envelope vs our envelope schema");
            assert_valid(&published("packet"), &value, "envelope vs published schema");
        }
        "payload" => {
            let packet_type = rest;
            let packet = Packet::from_value(serde_json::json!({
                "schema": PACKET_SCHEMA,
                "packet_id": "pkt_fixture",
                "type": packet_type,
                "payload": value.clone(),
            }))
            .unwrap_or_else(|e| panic!("{packet_type} payload decodes: {e}"));
            assert_eq!(packet.type_str(), packet_type);
            let back = packet.body.payload_value().expect("serialises").expect("has payload");
            assert_eq!(back, value, "payload round trip changed the document");
            assert_valid(&payload_schema(packet_type), &value, "payload vs our schema");
        }
        "health" => {
            let health: HealthResponse = round_trip(&value);
            assert_eq!(health.status, "ok");
            let schema = schemars::schema_for!(HealthResponse).to_value();
            assert_valid(&schema, &value, "health vs our schema");
        }
        "upload" => {
            let upload: UploadResponse = round_trip(&value);
            assert_eq!(upload.file_type, FileType::Image);
            let schema = schemars::schema_for!(UploadResponse).to_value();
            assert_valid(&schema, &value, "upload vs our schema");
        }
        "card-tool" => {
            let tool: CardTool = round_trip(&value);
            assert_eq!(tool.tool_id, "wechat_message_send");
            assert_valid(&def_of(&ours("card"), "CardTool"), &value, "tool vs our schema");
            assert_valid(&def_of(&published("card"), "tool"), &value, "tool vs published schema");
        }
        "tool-arguments" => {
            let arguments: Map<String, Value> = round_trip(&value);
            let invoke = ToolInvoke::new("wechat_message_send", arguments);
            assert_eq!(invoke.arguments[CHANNEL_ARGUMENT], "cch_123");
        }
        "push-file" => {
            let file: PushFile = round_trip(&value);
            assert_eq!(file.file_type, Some(FileType::Image));
            let schema = schemars::schema_for!(PushFile).to_value();
            assert_valid(&schema, &value, "file vs our schema");
            let chat: ChatFile = round_trip(&value);
            assert_eq!(chat.file_ref, "file_abc123");
        }
        "profile-declaration" => {
            let supports: Supports = round_trip(&value["supports"]);
            assert_eq!(supports.profiles.len(), 1);
            assert_valid(&def_of(&ours("card"), "Supports"), &value["supports"], "supports");
            if let Some(connection) = value.get("connection") {
                let target: TargetType = round_trip(&connection["target_type"]);
                let profiles: Vec<ProfileId> = round_trip(&connection["profiles"]);
                assert!(supports.target_types.contains(&target));
                assert_eq!(profiles, supports.profiles);
            }
        }
        other => panic!("unknown fixture kind {other}"),
    }
}

macro_rules! fixtures {
    ($($test:ident => $file:literal,)+) => {
        $( #[test] fn $test() { check($file); } )+

        #[test]
        fn every_fixture_file_has_a_test() {
            let listed = [$($file),+];
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/examples");
            let mut on_disk: Vec<String> = std::fs::read_dir(dir)
                .expect("fixture dir")
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".json"))
                .map(|n| n.trim_end_matches(".json").to_owned())
                .collect();
            on_disk.sort();
            let mut listed: Vec<String> = listed.iter().map(|s| s.to_string()).collect();
            listed.sort();
            assert_eq!(on_disk, listed);
        }
    };
}

fixtures! {
    card_minimal => "card--minimal",
    card_tool_wechat_message_send => "card-tool--wechat_message_send",
    descriptor_minimal => "descriptor--minimal",
    envelope_fields => "envelope--fields",
    health_ok => "health--ok",
    upload_response => "upload--response",
    packet_channel_open_ack => "packet--channel.open.ack",
    packet_chat_activity => "packet--chat.activity",
    packet_chat_message => "packet--chat.message",
    packet_chat_message_ack => "packet--chat.message.ack",
    packet_chat_message_delta => "packet--chat.message.delta",
    packet_error => "packet--error",
    packet_tool_invoke_ack_error => "packet--tool.invoke.ack.error",
    payload_auth_cancel => "payload--auth.cancel",
    payload_auth_cancel_ack => "payload--auth.cancel.ack",
    payload_auth_logout_ack => "payload--auth.logout.ack",
    payload_auth_start => "payload--auth.start",
    payload_auth_start_ack => "payload--auth.start.ack",
    payload_auth_status => "payload--auth.status",
    payload_channel_close_ack => "payload--channel.close.ack",
    payload_connection_descriptor_get_ack => "payload--connection.descriptor.get.ack",
    payload_connection_descriptor_push => "payload--connection.descriptor.push",
    payload_connector_hello => "payload--connector.hello",
    payload_connector_hello_ack => "payload--connector.hello.ack",
    payload_message_push => "payload--message.push",
    payload_tool_invoke => "payload--tool.invoke",
    payload_tool_invoke_ack => "payload--tool.invoke.ack",
    payload_tool_progress_push => "payload--tool.progress.push",
    profile_declaration_device_v1 => "profile-declaration--device-v1",
    profile_declaration_im_v1 => "profile-declaration--im-v1",
    profile_declaration_im_v2 => "profile-declaration--im-v2",
    push_file_image => "push-file--image",
    tool_arguments_send_text => "tool-arguments--send-text",
}
