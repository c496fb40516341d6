//! The single-pass packet validator (`Validator::check_packet`, typed) and the report form
//! (`Validator::packet`, on a `Value`) give the same verdict: on every packet fixture of the
//! workspace, with and without a Card, from each sender, and on generated mutations of the
//! per-message packets (nulls, empty strings, wrong types, forbidden fields, bad URLs, secrets,
//! removed fields). The typed form must also accept every valid per-message fixture by itself,
//! or it would not be a hot path. The same holds for the typed form on a packet the caller
//! decoded itself (`Validator::check_decoded` / `accept_decoded`), which must refuse each rule
//! it checks (one negative case per rule id below).

#[path = "support/corpus.rs"]
mod corpus;

use corpus::{bases, card, envelope, fixtures, mutate};
use proptest::prelude::*;
use serde_json::{Value, json};
use xagent_protocol_types::{Packet, Side};
use xagent_protocol_validate::{PacketContext, Validator};

const HOT: &[&str] = &[
    "tool.invoke",
    "tool.invoke.ack",
    "tool.progress.push",
    "chat.message",
    "chat.message.delta",
    "chat.message.ack",
    "chat.activity",
    "ping",
    "pong",
    "error",
];

/// Asserts both forms agree on `value` in every context; returns the report verdicts.
#[track_caller]
fn assert_agree(name: &str, value: &Value) -> Vec<bool> {
    let bytes = serde_json::to_vec(value).expect("encodes");
    let facts = card();
    let validator = Validator::default();
    let mut verdicts = Vec::new();
    for card in [None, Some(&facts)] {
        for sender in [None, Some(Side::Connector), Some(Side::Xagent)] {
            let context = PacketContext { card, sender };
            let report = validator.packet(value, context);
            let checked = validator.check_packet(&bytes, context);
            assert_eq!(
                checked.is_ok(),
                report.valid,
                "{name} (card: {}, sender: {sender:?}): single-pass {:?} vs report {report:?}",
                card.is_some(),
                checked.as_ref().err()
            );
            if validator.accept_packet(&bytes, context).is_some() {
                assert!(report.valid, "{name}: the typed form accepted an invalid packet");
            }
            if let Err(failed) = &checked {
                assert_eq!(failed, &report, "{name}: the invalid verdict carries the full report");
            }
            // The same typed rules on a packet decoded by the caller: same verdict, same report.
            if let Ok(packet) = Packet::decode(&bytes) {
                assert_eq!(
                    validator.accept_decoded(&packet, &bytes, context),
                    validator.accept_packet(&bytes, context).is_some(),
                    "{name}: accept_decoded and accept_packet disagree"
                );
                let decoded = validator.check_decoded(&packet, &bytes, context);
                assert_eq!(decoded.is_ok(), report.valid, "{name}: check_decoded vs report");
                if let Err(failed) = decoded {
                    assert_eq!(failed, report, "{name}: check_decoded carries the full report");
                }
            }
            verdicts.push(report.valid);
        }
    }
    verdicts
}

#[test]
fn both_forms_agree_on_every_fixture() {
    let mut valid_hot = 0;
    for (name, value) in fixtures() {
        assert_agree(&name, &value);
        let packet_type = value["type"].as_str().unwrap_or_default();
        let bytes = serde_json::to_vec(&value).expect("encodes");
        let context = PacketContext::default();
        if HOT.contains(&packet_type) && Validator::default().packet(&value, context).valid {
            assert!(
                Validator::default().accept_packet(&bytes, context).is_some(),
                "{name}: a valid per-message packet must pass the typed form alone"
            );
            valid_hot += 1;
        }
    }
    assert!(valid_hot >= 8, "only {valid_hot} valid per-message fixtures");
}

#[test]
fn invalid_packets_get_the_report_with_pointers() {
    let mut value = envelope(
        "chat.message",
        json!({"message_id": "m", "files": [
            {"type": "image", "file_ref": "f", "download_url": "file:///etc/passwd", "base64": "AA"}
        ]}),
    );
    value["payload"]["session_id"] = json!("s");
    let bytes = serde_json::to_vec(&value).unwrap();
    let report = Validator::default().check_packet(&bytes, PacketContext::default()).unwrap_err();
    for (rule, path) in [
        ("im.download_url_scheme", "/payload/files/0/download_url"),
        ("im.file_bytes", "/payload/files/0/base64"),
        ("im_v2.forbidden_field", "/payload/session_id"),
    ] {
        assert!(report.violations.iter().any(|v| v.rule == rule && v.path == path), "{report:?}");
    }
    let not_json = Validator::default().check_packet(b"{nope", PacketContext::default());
    assert!(not_json.unwrap_err().has("document.not_json"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(768))]

    #[test]
    fn both_forms_agree_on_mutated_packets(
        base in 0usize..9,
        first in (0usize..4, 0usize..64, 0usize..3, 0usize..32),
        second in proptest::option::of((0usize..4, 0usize..64, 0usize..3, 0usize..32)),
    ) {
        let bases = bases();
        let start = &bases[base % bases.len()];
        let mut value = mutate(start, first.0, first.1, first.2, first.3);
        if let Some((a, k, o, v)) = second {
            value = mutate(&value, a, k, o, v);
        }
        assert_agree(&format!("mutation of base {base}: {value}"), &value);
    }
}

#[test]
fn bases_are_valid_and_take_the_typed_path() {
    for value in bases() {
        let bytes = serde_json::to_vec(&value).unwrap();
        assert!(Validator::default().packet(&value, PacketContext::default()).valid, "{value}");
        assert!(
            Validator::default().accept_packet(&bytes, PacketContext::default()).is_some(),
            "{value}"
        );
    }
}

/// One packet per rule the typed form checks on a decoded packet, each breaking only that
/// rule: the typed decode takes it, `accept_decoded` refuses it, and `check_decoded` reports
/// the rule by id.
#[test]
fn decoded_form_refuses_each_rule_it_checks() {
    let facts = card();
    let mut no_im = card();
    no_im.profiles.clear();
    let file = |extra: Value| {
        let mut item = json!({"type": "image", "file_ref": "f1", "download_url": "/files/f1"});
        if let (Some(item), Some(extra)) = (item.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                item.insert(k.clone(), v.clone());
            }
        }
        item
    };
    let msg = |payload: Value| envelope("chat.message", payload);
    let mut no_request_id = envelope("tool.invoke", json!({"tool_id": "t", "arguments": {}}));
    no_request_id.as_object_mut().map(|o| o.remove("request_id"));
    let mut no_reply_to =
        envelope("chat.message.ack", json!({"message_id": "m", "status": "accepted"}));
    no_reply_to.as_object_mut().map(|o| o.remove("reply_to"));
    let mut no_channel = msg(json!({"message_id": "m", "text": "hi"}));
    no_channel.as_object_mut().map(|o| o.remove("connector_channel_id"));
    let mut empty_code = envelope("ping", json!({}));
    empty_code["error"] = json!({"code": "", "message": "x"});
    let mut ack_without_payload = envelope("tool.invoke.ack", json!({}));
    ack_without_payload.as_object_mut().map(|o| o.remove("payload"));
    let cases: Vec<(&str, Value, PacketContext<'_>)> = vec![
        ("packet.request_id", no_request_id, PacketContext::default()),
        ("chat_ack.reply_to", no_reply_to, PacketContext::default()),
        ("packet.channel_required", no_channel, PacketContext::default()),
        ("packet.error_code", empty_code, PacketContext::default()),
        ("packet.error_required", envelope("error", json!({})), PacketContext::default()),
        ("packet.payload_required", ack_without_payload, PacketContext::default()),
        (
            "packet.profile_not_declared",
            msg(json!({"message_id": "m", "text": "hi"})),
            PacketContext { card: Some(&no_im), sender: None },
        ),
        (
            "tool_invoke.tool_id",
            envelope("tool.invoke", json!({"tool_id": "", "arguments": {}})),
            PacketContext::default(),
        ),
        (
            "tool_invoke.tool_id",
            envelope("tool.invoke", json!({"tool_id": "not_in_the_card", "arguments": {}})),
            PacketContext { card: Some(&facts), sender: None },
        ),
        (
            "tool_progress.tool_id",
            envelope("tool.progress.push", json!({"tool_id": ""})),
            PacketContext::default(),
        ),
        (
            "tool_progress.progress",
            envelope("tool.progress.push", json!({"tool_id": "t", "progress": 1.5})),
            PacketContext::default(),
        ),
        (
            "im_v2.forbidden_field",
            msg(json!({"message_id": "m", "text": "hi", "session_id": "s"})),
            PacketContext::default(),
        ),
        (
            "im.file_bytes",
            msg(json!({"message_id": "m", "files": [file(json!({"base64": "AA"}))]})),
            PacketContext::default(),
        ),
        (
            "im_v2.message_id",
            msg(json!({"message_id": "", "text": "hi"})),
            PacketContext::default(),
        ),
        (
            "chat_message.content",
            msg(json!({"message_id": "m", "text": ""})),
            PacketContext::default(),
        ),
        (
            "im.file_ref",
            msg(json!({"message_id": "m", "files": [file(json!({})), file(json!({}))]})),
            PacketContext::default(),
        ),
        (
            "im.file_type",
            msg(json!({"message_id": "m", "files": [file(json!({"type": "sticker"}))]})),
            PacketContext::default(),
        ),
        (
            "im.download_url_scheme",
            msg(
                json!({"message_id": "m", "files": [file(json!({"download_url": "file:///etc/passwd"}))]}),
            ),
            PacketContext::default(),
        ),
        (
            "chat_message.download_url",
            msg(json!({"message_id": "m", "files": [{"type": "image", "file_ref": "f1"}]})),
            PacketContext { card: None, sender: Some(Side::Connector) },
        ),
        (
            "chat_delta.sequence",
            envelope("chat.message.delta", json!({"message_id": "m", "sequence": 0, "text": "h"})),
            PacketContext::default(),
        ),
        (
            "chat_delta.files",
            envelope(
                "chat.message.delta",
                json!({"message_id": "m", "sequence": 1, "text": "h", "files": []}),
            ),
            PacketContext::default(),
        ),
        (
            "chat_ack.status",
            envelope("chat.message.ack", json!({"message_id": "m", "status": "maybe"})),
            PacketContext::default(),
        ),
        (
            "chat_ack.rejected",
            envelope("chat.message.ack", json!({"message_id": "m", "status": "rejected"})),
            PacketContext::default(),
        ),
        (
            "chat_activity.status",
            envelope("chat.activity", json!({"status": "dancing"})),
            PacketContext::default(),
        ),
        (
            "chat_activity.tool_name",
            envelope("chat.activity", json!({"status": "tool"})),
            PacketContext::default(),
        ),
        (
            "chat_activity.tool_name",
            envelope("chat.activity", json!({"status": "idle", "tool_name": "search"})),
            PacketContext::default(),
        ),
        (
            "packet.secret_leak",
            msg(json!({"message_id": "m", "text": "ghp_abcdefghijklmnopqrstuvwxyz0123456789"})),
            PacketContext::default(),
        ),
    ];
    let validator = Validator::default();
    let mut failures = Vec::new();
    for (rule, value, context) in &cases {
        let bytes = serde_json::to_vec(value).expect("encodes");
        let Ok(packet) = Packet::decode(&bytes) else {
            failures.push(format!("{rule}: the typed decode refused {value}"));
            continue;
        };
        if validator.accept_decoded(&packet, &bytes, *context) {
            failures.push(format!("{rule}: accept_decoded took {value}"));
        }
        match validator.check_decoded(&packet, &bytes, *context) {
            Ok(()) => failures.push(format!("{rule}: check_decoded took {value}")),
            Err(report) if !report.has(rule) => {
                failures.push(format!("{rule}: not in the report {report:?} of {value}"));
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The decoded form accepts what the bytes form accepts, on the packet the caller decoded:
/// every base packet passes it alone, with the same packet the bytes form returns.
#[test]
fn decoded_form_accepts_the_valid_bases() {
    let validator = Validator::default();
    for value in bases() {
        let bytes = serde_json::to_vec(&value).unwrap();
        let packet = Packet::decode(&bytes).expect("decodes");
        assert!(validator.accept_decoded(&packet, &bytes, PacketContext::default()), "{value}");
        assert_eq!(validator.check_decoded(&packet, &bytes, PacketContext::default()), Ok(()));
        assert_eq!(validator.accept_packet(&bytes, PacketContext::default()), Some(packet));
    }
}
