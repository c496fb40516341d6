//! The runtime's IM checks (this crate, called by both runtimes) and `xagent-connector check`
//! (the report validator) give the same verdict on the same `chat.message`: the disagreements
//! issue 12 lists (a file item with `base64`, a `file:` `download_url`) and the rules around
//! them. Each case names its rule.

use serde_json::{Value, json};
use xagent_profile_im::validate_chat_message;
use xagent_protocol_types::{ChatMessage, Side};
use xagent_protocol_validate::{PacketContext, validate_packet};

fn packet(payload: Value) -> Value {
    json!({
        "schema": "xagent.connector.packet/v1",
        "packet_id": "pkt_1",
        "connector_channel_id": "cch_1",
        "type": "chat.message",
        "time": 1790000000000u64,
        "payload": payload,
    })
}

fn file(extra: Value) -> Value {
    let mut item =
        json!({"type": "image", "file_ref": "file_1", "download_url": "/files/refs/file_1"});
    for (k, v) in extra.as_object().unwrap() {
        item[k] = v.clone();
    }
    item
}

/// (rule, payload, accepted?) for both senders.
fn cases() -> Vec<(&'static str, Value, bool)> {
    vec![
        ("ok.relative_url", json!({"message_id": "m", "files": [file(json!({}))]}), true),
        (
            "ok.https_url",
            json!({"message_id": "m", "files": [file(json!({"download_url": "HTTPS://cdn.example/x"}))]}),
            true,
        ),
        ("ok.text", json!({"message_id": "m", "text": "hi"}), true),
        (
            "im.file_bytes (base64 in a file item)",
            json!({"message_id": "m", "files": [file(json!({"base64": "AAAA"}))]}),
            false,
        ),
        (
            "im.file_bytes (local_path on the message)",
            json!({"message_id": "m", "text": "x", "local_path": "/tmp/x"}),
            false,
        ),
        (
            "im.download_url_scheme (file:)",
            json!({"message_id": "m", "files": [file(json!({"download_url": "file:///etc/passwd"}))]}),
            false,
        ),
        (
            "im.download_url_scheme (data:)",
            json!({"message_id": "m", "files": [file(json!({"download_url": "data:image/png;base64,AAAA"}))]}),
            false,
        ),
        (
            "im.download_url_scheme (ftp:)",
            json!({"message_id": "m", "files": [file(json!({"download_url": "ftp://h/x"}))]}),
            false,
        ),
        (
            "im.download_url_scheme (drive letter)",
            json!({"message_id": "m", "files": [file(json!({"download_url": "C:\\x.png"}))]}),
            false,
        ),
        (
            "im.download_url_scheme (leading space)",
            json!({"message_id": "m", "files": [file(json!({"download_url": " file:///x"}))]}),
            false,
        ),
        (
            "im.file_ref (unique within a message)",
            json!({"message_id": "m", "files": [file(json!({})), file(json!({}))]}),
            false,
        ),
        (
            "im_v2.forbidden_field",
            json!({"message_id": "m", "text": "x", "session_id": "s"}),
            false,
        ),
        ("chat_message.content", json!({"message_id": "m", "text": ""}), false),
    ]
}

#[test]
fn check_and_runtime_agree_on_chat_message_files() {
    for sender in [Side::Connector, Side::Xagent] {
        for (rule, payload, accepted) in cases() {
            let report = validate_packet(
                &packet(payload.clone()),
                PacketContext { card: None, sender: Some(sender) },
            );
            let message: ChatMessage = serde_json::from_value(payload).unwrap();
            let runtime = validate_chat_message(&message, sender);
            assert_eq!(report.valid, accepted, "check on {rule} from {sender:?}: {report:?}");
            assert_eq!(runtime.is_ok(), accepted, "runtime on {rule} from {sender:?}: {runtime:?}");
        }
    }
}
