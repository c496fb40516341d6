//! The packet corpus every packet judge is tested on: every packet fixture of the workspace
//! (and every payload fixture in its envelope), the valid per-message bases, and the mutations
//! applied to them. Shared by `protocol-validate/tests/single_pass.rs` (report form against
//! single-pass form) and `cli/tests/judges.rs` (every judge of the workspace), which include it
//! with `#[path]`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use xagent_protocol_types::{PacketType, Role, Routing};
use xagent_protocol_validate::CardFacts;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

pub fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON fixture")
}

pub fn card() -> CardFacts {
    CardFacts::from_value(&read(&root().join("protocol-validate/tests/fixtures/card.json")))
}

/// Wraps a payload in the envelope its type needs.
pub fn envelope(packet_type: &str, payload: Value) -> Value {
    let mut value = json!({
        "schema": "xagent.connector.packet/v1",
        "packet_id": "pkt_1",
        "type": packet_type,
        "time": 1790000000000u64,
        "payload": payload
    });
    if let Some(spec) = PacketType::spec_of(packet_type) {
        if matches!(spec.role, Role::Request { .. } | Role::Ack { .. }) {
            value["request_id"] = json!("req_1");
        }
        if matches!(spec.role, Role::Ack { .. } | Role::MessageAck) {
            value["reply_to"] = json!("pkt_0");
        }
        if spec.routing == Routing::Channel {
            value["connector_channel_id"] = json!("cch_123");
        }
    }
    value
}

/// Every packet fixture in the workspace, and every payload fixture in its envelope.
pub fn fixtures() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let dirs = [
        "protocol-validate/tests/fixtures",
        "protocol-types/tests/fixtures/examples",
        "validate-ffi/tests/data",
        "profile-im/tests/fixtures",
    ];
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(root().join(dir)) else { continue };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let Ok(value) = serde_json::from_str::<Value>(&text) else { continue };
            if value.get("schema").and_then(Value::as_str) == Some("xagent.connector.packet/v1") {
                out.push((format!("{dir}/{name}"), value));
            } else if let Some(packet_type) =
                name.strip_prefix("payload--").and_then(|n| n.strip_suffix(".json"))
            {
                out.push((format!("{dir}/{name}"), envelope(packet_type, value)));
            }
        }
    }
    assert!(out.len() >= 25, "found only {} packet fixtures", out.len());
    out
}

/// The per-message bases the mutations start from.
pub fn bases() -> Vec<Value> {
    let file = json!({"type": "image", "file_ref": "file_1", "download_url": "/files/refs/file_1"});
    vec![
        envelope(
            "tool.invoke",
            json!({"tool_id": "wechat_message_send", "arguments": {"connector_channel_id": "cch_123", "text": "hi"}, "context": {"tool_call_id": "call_1"}}),
        ),
        envelope(
            "tool.invoke.ack",
            json!({"tool_id": "wechat_message_send", "result": {"ok": true, "n": null}}),
        ),
        envelope(
            "tool.progress.push",
            json!({"tool_id": "wechat_message_send", "progress": 0.5, "message": "half"}),
        ),
        envelope("chat.message", json!({"message_id": "m1", "text": "hello", "files": [file]})),
        envelope("chat.message.delta", json!({"message_id": "m1", "sequence": 1, "text": "he"})),
        envelope(
            "chat.message.ack",
            json!({"message_id": "m1", "status": "rejected", "code": "message_conflict", "retryable": false}),
        ),
        envelope("chat.activity", json!({"status": "tool", "tool_name": "search"})),
        envelope("ping", json!({})),
        json!({"schema": "xagent.connector.packet/v1", "packet_id": "p", "type": "error", "error": {"code": "invalid_packet", "message": "m"}}),
    ]
}

pub fn palette() -> Vec<Value> {
    vec![
        Value::Null,
        json!(""),
        json!("x"),
        json!(0),
        json!(-1),
        json!(1.5),
        json!(true),
        json!({}),
        json!([]),
        json!("file:///etc/passwd"),
        json!("HTTPS://cdn.example/x"),
        json!("Bearer abcdefghijklmnop"),
        json!("ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
        json!("tool"),
        json!("idle"),
        json!("rejected"),
        json!([{"type": "file", "file_ref": "f2", "download_url": "/f2"}]),
    ]
}

pub const KEYS: &[&str] = &[
    "schema",
    "packet_id",
    "request_id",
    "reply_to",
    "connector_channel_id",
    "type",
    "time",
    "payload",
    "error",
    "tool_id",
    "arguments",
    "progress",
    "message_id",
    "text",
    "files",
    "sequence",
    "status",
    "code",
    "retryable",
    "tool_name",
    "session_id",
    "base64",
    "url",
    "download_url",
    "file_ref",
    "api_key",
    "role",
    "created_at",
    "result",
    "message",
    "reasoning",
];

/// Applies one mutation at a place chosen by `at` (envelope, payload, or first file item).
pub fn mutate(base: &Value, at: usize, key: usize, op: usize, value: usize) -> Value {
    let mut out = base.clone();
    let target = match at % 4 {
        0 => Some(&mut out),
        1 | 2 => out.get_mut("payload"),
        _ => out.pointer_mut("/payload/files/0"),
    };
    if let Some(Value::Object(map)) = target {
        let key = KEYS[key % KEYS.len()];
        match op % 3 {
            0 => {
                map.remove(key);
            }
            _ => {
                map.insert(key.to_owned(), palette()[value % palette().len()].clone());
            }
        }
    }
    out
}

/// The path of the Card fixture the packets are judged against.
pub fn card_path() -> PathBuf {
    root().join("protocol-validate/tests/fixtures/card.json")
}
