//! The IM payload rules have one home (`xagent_protocol_validate::im`) and the packet judges
//! apply the direction-dependent rules the same way. Each test names the rule it proves; the
//! three reproductions of issue 22 (a file item's `url: file:///etc/passwd`, a file item carrying
//! `user_id`, a Connector-sent file without `download_url` judged with no sender) fail on the
//! validator before the rules were unified.

use serde_json::{Value, json};
use xagent_protocol_types::Side;
use xagent_protocol_validate::{
    DocumentKind, PacketContext, Report, Validator, check_text, check_text_from,
};

fn chat_message(file: Value) -> Value {
    json!({
        "schema": "xagent.connector.packet/v1", "packet_id": "pkt_1", "type": "chat.message",
        "connector_channel_id": "cch_1", "time": 1790000000000u64,
        "payload": {"message_id": "m1", "files": [file]}
    })
}

/// The report form and the single-pass form, from each sender and without one.
fn every_form(packet: &Value) -> Vec<(Option<Side>, Report, bool)> {
    let bytes = serde_json::to_vec(packet).expect("encodes");
    let validator = Validator::default();
    [None, Some(Side::Connector), Some(Side::Xagent)]
        .into_iter()
        .map(|sender| {
            let context = PacketContext { card: None, sender };
            let report = validator.packet(packet, context);
            let fast = validator.check_packet(&bytes, context).is_ok();
            (sender, report, fast)
        })
        .collect()
}

#[test]
fn rule_im_download_url_scheme_covers_a_file_items_url() {
    let packet = chat_message(json!({
        "type": "file", "file_ref": "f1", "download_url": "/files/refs/f1",
        "url": "file:///etc/passwd"
    }));
    for (sender, report, fast) in every_form(&packet) {
        assert!(!report.valid && !fast, "{sender:?}: {report:?}");
        let v = report.errors().find(|v| v.rule == "im.download_url_scheme").expect("the rule");
        assert_eq!(v.path, "/payload/files/0/url");
    }
}

#[test]
fn rule_im_v2_forbidden_field_in_a_file_item() {
    let packet = chat_message(json!({
        "type": "file", "file_ref": "f1", "download_url": "/files/refs/f1", "user_id": "u1"
    }));
    for (sender, report, fast) in every_form(&packet) {
        assert!(!report.valid && !fast, "{sender:?}: {report:?}");
        let v = report.errors().find(|v| v.rule == "im_v2.forbidden_field").expect("the rule");
        assert_eq!(v.path, "/payload/files/0/user_id");
    }
    // IM v1: the same identity rule under its v1 id, in a message.push file item too.
    let push = json!({
        "schema": "xagent.connector.packet/v1", "packet_id": "p", "type": "message.push",
        "connector_channel_id": "cch_1",
        "payload": {"profile": "xagent.im.v1", "provider": "x", "event_kind": "im.message.received",
            "message_id": "m", "sender_id": "s", "message_type": "text", "raw_text": "", "text": "t",
            "files": [{"file_ref": "f", "url": "/f", "session_id": "s1"}]}
    });
    let report = Validator::default().packet(&push, PacketContext::default());
    assert!(
        report
            .errors()
            .any(|v| v.rule == "im_v1.forbidden_field" && v.path == "/payload/files/0/session_id"),
        "{report:?}"
    );
}

#[test]
fn rule_chat_message_download_url_without_a_sender_is_judged_for_the_connector() {
    let packet = chat_message(json!({"type": "image", "file_ref": "f1"}));
    let text = packet.to_string();
    // No sender: chat.message goes both ways, so it is judged for both, and the violation names
    // the sender it holds for.
    let report = check_text(DocumentKind::Packet, &text, None);
    assert!(!report.valid, "{report:?}");
    let v = report.errors().find(|v| v.rule == "chat_message.download_url").expect("the rule");
    assert_eq!(v.sender.as_deref(), Some("connector"));
    assert!(v.message.contains("Connector"), "{}", v.message);
    assert!(report.to_json().contains(r#""sender":"connector""#), "{}", report.to_json());
    // Sent by the Connector: refused, without a sender tag (the sender is known).
    let report = check_text_from(DocumentKind::Packet, &text, None, Some(Side::Connector));
    let v = report.errors().find(|v| v.rule == "chat_message.download_url").expect("the rule");
    assert_eq!(v.sender, None);
    // Sent by xAgent: no download_url needed (the file was uploaded).
    assert!(check_text_from(DocumentKind::Packet, &text, None, Some(Side::Xagent)).valid);
    for (sender, report, fast) in every_form(&packet) {
        assert_eq!(report.valid, fast, "{sender:?}");
        assert_eq!(report.valid, sender == Some(Side::Xagent), "{sender:?}: {report:?}");
    }
}

#[test]
fn violations_of_rules_that_hold_for_every_sender_name_no_sender() {
    let packet = chat_message(json!({"type": "document", "file_ref": "f1", "download_url": "/f"}));
    let report = check_text(DocumentKind::Packet, &packet.to_string(), None);
    let v = report.errors().find(|v| v.rule == "im.file_type").expect("the rule");
    assert_eq!(v.sender, None);
    assert!(!report.to_json().contains("\"sender\""), "{}", report.to_json());
}
