//! A positive test on the reference examples, and a negative test for every rule id, named
//! after the rule (`card.tool_id_format` -> `card_tool_id_format`).

use serde_json::{Value, json};
use xagent_protocol_types::{Secret, Side};
use xagent_protocol_validate::rules::ALL;
use xagent_protocol_validate::{
    CardFacts, DescriptorContext, DocumentKind, PacketContext, Report, SecretScanner, Severity,
    Validator, check_text, validate_base_url, validate_card, validate_descriptor, validate_health,
    validate_packet, validate_skill,
};

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn card() -> Value {
    fixture("card.json")
}

fn facts() -> CardFacts {
    CardFacts::from_value(&card())
}

fn skill_text() -> String {
    std::fs::read_to_string(format!("{}/tests/fixtures/SKILL.md", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
}

/// Asserts the report has a violation of `rule` at `path` with the rule's severity.
#[track_caller]
fn assert_rule(report: &Report, rule: &str, path: &str) {
    let expected = xagent_protocol_validate::rules::by_id(rule).unwrap().severity;
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.rule == rule && v.path == path && v.severity == expected),
        "expected {rule} at {path:?}, got {:#?}",
        report.violations
    );
    if expected == Severity::Error {
        assert!(!report.valid);
    }
}

fn card_with(change: impl FnOnce(&mut Value)) -> Report {
    let mut value = card();
    change(&mut value);
    validate_card(&value)
}

fn descriptor_with(change: impl FnOnce(&mut Value)) -> Report {
    let mut value = fixture("descriptor.json");
    change(&mut value);
    let facts = facts();
    validate_descriptor(
        &value,
        DescriptorContext { card: Some(&facts), channel: Some("cch_conn_im_wechat_xxx") },
    )
}

fn packet(value: &Value) -> Report {
    let facts = facts();
    validate_packet(value, PacketContext { card: Some(&facts), sender: None })
}

fn packet_from(sender: Side, value: &Value) -> Report {
    let facts = facts();
    validate_packet(value, PacketContext { card: Some(&facts), sender: Some(sender) })
}

fn envelope(packet_type: &str, payload: Value) -> Value {
    let mut value = json!({
        "schema": "xagent.connector.packet/v1",
        "packet_id": "pkt_1",
        "type": packet_type,
        "time": 1790000000000u64,
        "payload": payload
    });
    if let Some(spec) = xagent_protocol_types::PacketType::spec_of(packet_type) {
        use xagent_protocol_types::{Role, Routing};
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

fn hello() -> Value {
    envelope(
        "connector.hello",
        json!({"connector_card_id": "im.wechat", "protocol_version": "3.0", "supported_profiles": ["xagent.im.v2"]}),
    )
}

fn hello_ack() -> Value {
    envelope(
        "connector.hello.ack",
        json!({"connector_card_id": "im.wechat", "connector_id": "conn_1", "protocol_version": "3.0"}),
    )
}

fn tool_invoke() -> Value {
    envelope(
        "tool.invoke",
        json!({"tool_id": "wechat_message_send", "arguments": {"connector_channel_id": "cch_123", "text": "hi"}}),
    )
}

fn message_push() -> Value {
    envelope(
        "message.push",
        json!({
            "provider": "wechat", "profile": "xagent.im.v1", "event_kind": "im.message.received",
            "message_id": "m1", "sender_id": "wx_1", "display_name": "Alex", "chat_type": "p2p",
            "message_type": "text", "raw_text": "hi", "text": "hi", "activation_message": "answer",
            "reply": {"required": true, "tool_id": "wechat_message_send"},
            "skill": {"name": "connector-im-wechat"}
        }),
    )
}

fn v1_card() -> CardFacts {
    let mut value = card();
    value["supports"]["profiles"] = json!(["xagent.im.v1"]);
    CardFacts::from_value(&value)
}

// ---------------------------------------------------------------- positive

#[test]
fn reference_examples_have_no_errors() {
    let report = validate_card(&card());
    assert!(report.valid, "{:#?}", report.violations);
    // The reference form flow's password field does not set secret: true (a Should).
    assert!(report.violations.iter().all(|v| v.rule == "card.auth_field_secret"));

    let facts = facts();
    let report =
        validate_descriptor(&fixture("descriptor.json"), DescriptorContext::with_card(&facts));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);

    for name in [
        "channel_open_ack.json",
        "error.json",
        "chat_message.json",
        "chat_message_delta.json",
        "chat_message_ack.json",
        "chat_activity.json",
    ] {
        let report = packet_from(Side::Connector, &fixture(name));
        assert!(report.violations.is_empty(), "{name}: {:#?}", report.violations);
    }
    for value in [hello(), hello_ack(), tool_invoke()] {
        let report = packet(&value);
        assert!(report.violations.is_empty(), "{:#?}", report.violations);
    }
    let report = validate_packet(&message_push(), PacketContext::with_card(&v1_card()));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);

    let report = validate_health(&fixture("health.json"), &facts);
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    let report = validate_skill(&skill_text(), &facts);
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert!(validate_base_url("https://connector.example/prefix").violations.is_empty());
}

/// Issue 38: every rule id has a negative test here, named after it (`.` -> `_`), which is a
/// `#[test]` and names the rule id in its body (where it asserts the violation); a helper
/// function of the same name does not count.
#[test]
fn every_rule_has_a_negative_test_named_after_it() {
    let source = include_str!("rules.rs");
    for rule in ALL {
        let name = rule.id.replace('.', "_");
        let head = format!("#[test]\nfn {name}() {{\n");
        let Some(start) = source.find(&head) else {
            panic!("no negative test `{name}` for {}", rule.id);
        };
        let body = &source[start + head.len()..];
        let body = &body[..body.find("\n}\n").unwrap_or(body.len())];
        assert!(
            body.contains(&format!("\"{}\"", rule.id)) && body.contains("assert"),
            "the test `{name}` does not assert a violation of {}",
            rule.id
        );
    }
}

/// Issue 38: `RULES.md` has one row per rule id of the code, with its text reference, and no
/// row for an id the code no longer has.
#[test]
fn every_rule_has_an_entry_with_its_text_reference_in_rules_md() {
    let doc = include_str!("../RULES.md");
    let rows: Vec<(String, String)> = doc
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let id = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((id.to_owned(), (*cells.get(3)?).to_owned()))
        })
        .collect();
    for rule in ALL {
        let entries: Vec<&(String, String)> = rows.iter().filter(|(id, _)| id == rule.id).collect();
        assert_eq!(entries.len(), 1, "RULES.md must list {} once", rule.id);
        assert_eq!(entries[0].1, rule.section, "RULES.md gives {} another reference", rule.id);
        assert!(!rule.section.is_empty(), "{} has no text reference", rule.id);
    }
    for (id, _) in &rows {
        assert!(ALL.iter().any(|r| r.id == id), "RULES.md lists {id}, which no rule has");
    }
}

#[test]
fn every_violation_names_a_known_rule() {
    let mut value = card();
    value["tools"][0]["tool_id"] = json!("bad id!");
    value["supports"]["profiles"] = json!([]);
    for v in validate_card(&value).violations {
        assert!(xagent_protocol_validate::rules::by_id(&v.rule).is_some(), "{}", v.rule);
    }
}

#[test]
fn all_violations_are_reported_at_once() {
    let report = card_with(|c| {
        c["schema"] = json!("nope");
        c["connector"]["name"] = json!("");
        c["tools"][0]["tool_id"] = json!("has space");
    });
    assert!(report.has("card.schema"));
    assert!(report.has("card.connector_name"));
    assert!(report.has("card.tool_id_format"));
}

// ---------------------------------------------------------------- document

#[test]
fn document_not_json() {
    let report = check_text(DocumentKind::Card, "{not json", None);
    assert_rule(&report, "document.not_json", "");
}

#[test]
fn document_not_object() {
    assert_rule(&validate_card(&json!([1])), "document.not_object", "");
    assert_rule(&packet(&json!("x")), "document.not_object", "");
    assert_rule(&check_text(DocumentKind::Descriptor, "3", None), "document.not_object", "");
}

// ---------------------------------------------------------------- card

#[test]
fn card_schema() {
    assert_rule(
        &card_with(|c| c["schema"] = json!("xagent.connector/v2")),
        "card.schema",
        "/schema",
    );
}

#[test]
fn card_protocol_version() {
    assert_rule(
        &card_with(|c| c["protocol_version"] = json!("2.0")),
        "card.protocol_version",
        "/protocol_version",
    );
    let report = card_with(|c| {
        c.as_object_mut().unwrap().remove("protocol_version");
    });
    assert_rule(&report, "card.protocol_version", "/protocol_version");
}

#[test]
fn card_build() {
    let report = card_with(|c| {
        c.as_object_mut().unwrap().remove("build");
    });
    assert_rule(&report, "card.build", "/build");
    assert_rule(
        &card_with(|c| {
            c["build"].as_object_mut().unwrap().remove("build_time");
        }),
        "card.build",
        "/build/build_time",
    );
}

#[test]
fn card_build_time_format() {
    assert_rule(
        &card_with(|c| c["build"]["build_time"] = json!("2026-07-24")),
        "card.build_time_format",
        "/build/build_time",
    );
}

#[test]
fn card_connector_card_id() {
    assert_rule(
        &card_with(|c| c["connector_card_id"] = json!("")),
        "card.connector_card_id",
        "/connector_card_id",
    );
}

#[test]
fn card_connector_name() {
    let report = card_with(|c| {
        c["connector"].as_object_mut().unwrap().remove("name");
    });
    assert_rule(&report, "card.connector_name", "/connector/name");
}

#[test]
fn card_connector_version() {
    assert_rule(
        &card_with(|c| c["connector"]["version"] = json!(7)),
        "card.connector_version",
        "/connector/version",
    );
}

#[test]
fn card_supports() {
    assert_rule(&card_with(|c| c["supports"] = json!([])), "card.supports", "/supports");
}

#[test]
fn card_target_types() {
    assert_rule(
        &card_with(|c| c["supports"]["target_types"] = json!([])),
        "card.target_types",
        "/supports/target_types",
    );
    assert_rule(
        &card_with(|c| c["supports"]["target_types"] = json!(["im", "im"])),
        "card.target_types",
        "/supports/target_types/1",
    );
}

#[test]
fn card_target_type_unknown() {
    assert_rule(
        &card_with(|c| c["supports"]["target_types"] = json!(["im", "browser"])),
        "card.target_type_unknown",
        "/supports/target_types/1",
    );
}

#[test]
fn card_profiles() {
    assert_rule(
        &card_with(|c| c["supports"]["profiles"] = json!([])),
        "card.profiles",
        "/supports/profiles",
    );
    assert_rule(
        &card_with(|c| c["supports"]["profiles"] = json!(["xagent.im.v2", "xagent.im.v2"])),
        "card.profiles",
        "/supports/profiles/1",
    );
}

#[test]
fn card_profile_unknown() {
    let report = card_with(|c| {
        c["supports"]["profiles"] = json!(["xagent.im.v2", "xagent.browser-runtime.v1"])
    });
    assert_rule(&report, "card.profile_unknown", "/supports/profiles/1");
    assert!(report.valid, "an unknown Profile is only a warning");
}

#[test]
fn card_profile_target_type() {
    assert_rule(
        &card_with(|c| c["supports"]["profiles"] = json!(["xagent.im.v2", "xagent.device.v1"])),
        "card.profile_target_type",
        "/supports/profiles/1",
    );
}

#[test]
fn card_user_channel_mode() {
    assert_rule(
        &card_with(|c| c["supports"]["user_channel_mode"] = json!("many")),
        "card.user_channel_mode",
        "/supports/user_channel_mode",
    );
}

#[test]
fn card_target_declaration() {
    let report = card_with(|c| {
        c["supports"]["targets"][0].as_object_mut().unwrap().remove("label");
    });
    assert_rule(&report, "card.target_declaration", "/supports/targets/0/label");
    assert!(report.valid);
}

#[test]
fn card_tool_id() {
    let report = card_with(|c| {
        c["tools"][0].as_object_mut().unwrap().remove("tool_id");
    });
    assert_rule(&report, "card.tool_id", "/tools/0/tool_id");
}

#[test]
fn card_tool_id_format() {
    assert_rule(
        &card_with(|c| c["tools"][0]["tool_id"] = json!("send message")),
        "card.tool_id_format",
        "/tools/0/tool_id",
    );
    assert_rule(
        &card_with(|c| c["tools"][0]["tool_id"] = json!("a".repeat(257))),
        "card.tool_id_format",
        "/tools/0/tool_id",
    );
}

#[test]
fn card_tool_id_unique() {
    let report = card_with(|c| {
        let tool = c["tools"][0].clone();
        c["tools"].as_array_mut().unwrap().push(tool);
    });
    assert_rule(&report, "card.tool_id_unique", "/tools/1/tool_id");
}

#[test]
fn card_tool_profile() {
    assert_rule(
        &card_with(|c| c["tools"][0]["profile"] = json!("xagent.im.v1")),
        "card.tool_profile",
        "/tools/0/profile",
    );
}

#[test]
fn card_tool_input_schema() {
    assert_rule(
        &card_with(|c| c["tools"][0]["input_schema"] = json!({"type": "array"})),
        "card.tool_input_schema",
        "/tools/0/input_schema",
    );
}

#[test]
fn card_tool_channel_argument() {
    assert_rule(
        &card_with(|c| {
            c["tools"][0]["input_schema"]["properties"]["connector_channel_id"]["type"] =
                json!("integer")
        }),
        "card.tool_channel_argument",
        "/tools/0/input_schema/properties/connector_channel_id",
    );
}

#[test]
fn card_tool_channel_required() {
    assert_rule(
        &card_with(|c| c["tools"][0]["input_schema"]["required"] = json!(["text"])),
        "card.tool_channel_required",
        "/tools/0/input_schema/required",
    );
}

#[test]
fn card_tool_card_id_argument() {
    assert_rule(
        &card_with(|c| {
            c["tools"][0]["input_schema"]["properties"]["connector_card_id"] =
                json!({"type": "string"})
        }),
        "card.tool_card_id_argument",
        "/tools/0/input_schema/properties/connector_card_id",
    );
}

#[test]
fn card_tool_related_skill() {
    assert_rule(
        &card_with(|c| c["tools"][0]["related_skill_ids"] = json!(["im-connector-reply"])),
        "card.tool_related_skill",
        "/tools/0/related_skill_ids/0",
    );
    assert!(
        card_with(|c| c["tools"][0]["related_skill_ids"] = json!(["connector-im-wechat-file"]))
            .valid
    );
}

#[test]
fn card_im_profiles_exclusive() {
    let report = card_with(|c| {
        c["supports"]["profiles"] = json!(["xagent.im.v2", "xagent.im.v1"]);
    });
    assert_rule(&report, "card.im_profiles_exclusive", "/supports/profiles/1");
    assert_eq!(report.errors().filter(|v| v.rule == "card.im_profiles_exclusive").count(), 1);
    // Either IM Profile alone, or with a Profile of another target type, is fine.
    for profiles in [json!(["xagent.im.v1"]), json!(["xagent.im.v2", "xagent.device.v1"])] {
        let report = card_with(|c| {
            c["supports"]["target_types"] = json!(["im", "device"]);
            c["supports"]["profiles"] = profiles.clone();
            c["tools"][0].as_object_mut().unwrap().remove("profile");
        });
        assert!(!report.has("card.im_profiles_exclusive"), "{profiles}: {report:?}");
    }
}

#[test]
fn card_tool_wire_reference() {
    let report = card_with(|c| {
        c["tools"][0]["description"] =
            json!("Sends a file. Upload it with POST /files/uploads first.")
    });
    assert_rule(&report, "card.tool_wire_reference", "/tools/0/description");
    let report = card_with(|c| c["tools"][0]["title"] = json!("Answer the tool.invoke"));
    assert_rule(&report, "card.tool_wire_reference", "/tools/0/title");
    // The descriptions inside the input schema, at any depth, the model reads too.
    let report = card_with(|c| {
        c["tools"][0]["input_schema"]["properties"]["file"] = json!({
            "type": "object",
            "description": "The file_ref /files/uploads returned",
            "properties": {"kind": {"type": "string", "description": "the type of a chat.message file"}}
        })
    });
    for path in [
        "/tools/0/input_schema/properties/file/description",
        "/tools/0/input_schema/properties/file/properties/kind/description",
    ] {
        assert_rule(&report, "card.tool_wire_reference", path);
    }
    // A property named `description`, bare words and the Tool's own dotted id are fine.
    let report = card_with(|c| {
        c["tools"][0]["description"] = json!("Sends a message with a file from the conversation.");
        c["tools"][0]["input_schema"]["properties"]["description"] =
            json!({"type": "string", "description": "What the message says; see im.wechat.send."});
    });
    assert!(!report.has("card.tool_wire_reference"), "{report:?}");
}

#[test]
fn card_im_tool_target_argument() {
    let report = card_with(|c| {
        c["tools"][0]["input_schema"]["properties"]["chat_id"] = json!({"type": "string"})
    });
    assert_rule(
        &report,
        "card.im_tool_target_argument",
        "/tools/0/input_schema/properties/chat_id",
    );
    // Any spelling, at any depth the model fills; contact ids and bot tokens too.
    let report = card_with(|c| {
        c["tools"][0]["input_schema"]["properties"]["to"] = json!({
            "type": "object",
            "properties": {"contactId": {"type": "string"}, "Bot-Token": {"type": "string"}}
        })
    });
    for path in [
        "/tools/0/input_schema/properties/to",
        "/tools/0/input_schema/properties/to/properties/contactId",
        "/tools/0/input_schema/properties/to/properties/Bot-Token",
    ] {
        assert_rule(&report, "card.im_tool_target_argument", path);
    }
    // A Tool without a profile in an IM-only Card is an IM Tool; a device Tool is not one.
    let report = card_with(|c| {
        c["tools"][0].as_object_mut().unwrap().remove("profile");
        c["tools"][0]["input_schema"]["properties"]["room_id"] = json!({"type": "string"});
    });
    assert_rule(
        &report,
        "card.im_tool_target_argument",
        "/tools/0/input_schema/properties/room_id",
    );
    let report = card_with(|c| {
        c["supports"]["target_types"] = json!(["device"]);
        c["supports"]["profiles"] = json!(["xagent.device.v1"]);
        c["tools"][0]["profile"] = json!("xagent.device.v1");
        c["tools"][0]["input_schema"]["properties"]["chat_id"] = json!({"type": "string"});
    });
    assert!(!report.has("card.im_tool_target_argument"), "{report:?}");
    // The reference Tool's own arguments (`text`) and the reserved channel argument pass.
    assert!(!validate_card(&card()).has("card.im_tool_target_argument"));
}

#[test]
fn card_auth_flow_required() {
    let report = card_with(|c| {
        c["auth_flows"][0].as_object_mut().unwrap().remove("title");
    });
    assert_rule(&report, "card.auth_flow_required", "/auth_flows/0/title");
}

#[test]
fn card_auth_flow_type() {
    let report = card_with(|c| c["auth_flows"][0]["type"] = json!("oauth"));
    assert_rule(&report, "card.auth_flow_type", "/auth_flows/0/type");
    assert!(report.valid);
}

#[test]
fn card_auth_flow_target_type() {
    assert_rule(
        &card_with(|c| c["auth_flows"][0]["target_type"] = json!("email")),
        "card.auth_flow_target_type",
        "/auth_flows/0/target_type",
    );
}

#[test]
fn card_auth_form_fields() {
    assert_rule(
        &card_with(|c| c["auth_flows"][1]["fields"] = json!([])),
        "card.auth_form_fields",
        "/auth_flows/1/fields",
    );
}

#[test]
fn card_auth_field_required() {
    let report = card_with(|c| {
        c["auth_flows"][1]["fields"][1].as_object_mut().unwrap().remove("label");
    });
    assert_rule(&report, "card.auth_field_required", "/auth_flows/1/fields/1/label");
}

#[test]
fn card_auth_field_name_unique() {
    assert_rule(
        &card_with(|c| c["auth_flows"][1]["fields"][1]["name"] = json!("bot_token")),
        "card.auth_field_name_unique",
        "/auth_flows/1/fields/1/name",
    );
}

#[test]
fn card_auth_flow_id_unique() {
    let report = card_with(|c| {
        let id = c["auth_flows"][0]["id"].clone();
        c["auth_flows"][1]["id"] = id;
    });
    assert_rule(&report, "card.auth_flow_id_unique", "/auth_flows/1/id");
}

#[test]
fn card_auth_field_input_type() {
    assert_rule(
        &card_with(|c| c["auth_flows"][1]["fields"][1]["input_type"] = json!("number")),
        "card.auth_field_input_type",
        "/auth_flows/1/fields/1/input_type",
    );
}

#[test]
fn card_auth_field_secret() {
    assert_rule(&validate_card(&card()), "card.auth_field_secret", "/auth_flows/1/fields/0/secret");
    assert!(
        !card_with(|c| c["auth_flows"][1]["fields"][0]["secret"] = json!(true))
            .has("card.auth_field_secret")
    );
}

#[test]
fn card_auth_field_default_secret() {
    assert_rule(
        &card_with(|c| c["auth_flows"][1]["fields"][0]["default_value"] = json!("x")),
        "card.auth_field_default_secret",
        "/auth_flows/1/fields/0/default_value",
    );
}

#[test]
fn card_trust_level() {
    assert_rule(
        &card_with(|c| c["security"]["trust_level"] = json!("trusted")),
        "card.trust_level",
        "/security/trust_level",
    );
}

#[test]
fn card_server_base_url() {
    assert_rule(
        &card_with(|c| c["ui"]["server_base_url"] = json!("https://x.example")),
        "card.server_base_url",
        "/ui/server_base_url",
    );
}

#[test]
fn card_secret_leak() {
    let report = card_with(|c| {
        c["connector"]["description"] = json!("token 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1")
    });
    assert_rule(&report, "card.secret_leak", "/connector/description");
    assert!(!report.violations.iter().any(|v| v.message.contains("AAHdq")));
    // A known secret, through a configured scanner.
    let scanner =
        SecretScanner::new().with_secret("system API key", &Secret::new("sys-key-42-abc"));
    let mut value = card();
    value["connector"]["vendor"] = json!("sys-key-42-abc");
    let report = Validator::new().with_scanner(scanner).card(&value);
    assert_rule(&report, "card.secret_leak", "/connector/vendor");
}

// ---------------------------------------------------------------- descriptor

#[test]
fn descriptor_schema() {
    assert_rule(
        &descriptor_with(|d| d["schema"] = json!("xagent.connection/v3")),
        "descriptor.schema",
        "/schema",
    );
}

#[test]
fn descriptor_schema_legacy() {
    let report = descriptor_with(|d| {
        d["schema"] = json!("xagent.connection/v1");
        let connection = d["connection"].as_object_mut().unwrap();
        connection.remove("profiles");
        connection.insert("profile".into(), json!("xagent.im.v2"));
    });
    assert_rule(&report, "descriptor.schema_legacy", "/schema");
    assert!(report.valid, "{:#?}", report.violations);
}

#[test]
fn descriptor_connection() {
    assert_rule(
        &descriptor_with(|d| d["connection"] = json!(null)),
        "descriptor.connection",
        "/connection",
    );
}

#[test]
fn descriptor_connector_card_id() {
    let report = descriptor_with(|d| {
        d["connection"].as_object_mut().unwrap().remove("connector_card_id");
    });
    assert_rule(&report, "descriptor.connector_card_id", "/connection/connector_card_id");
}

#[test]
fn descriptor_card_mismatch() {
    assert_rule(
        &descriptor_with(|d| d["connection"]["connector_card_id"] = json!("im.telegram")),
        "descriptor.card_mismatch",
        "/connection/connector_card_id",
    );
}

#[test]
fn descriptor_connector_id() {
    assert_rule(
        &descriptor_with(|d| d["connection"]["connector_id"] = json!("")),
        "descriptor.connector_id",
        "/connection/connector_id",
    );
}

#[test]
fn descriptor_connector_channel_id() {
    let report = descriptor_with(|d| {
        d["connection"].as_object_mut().unwrap().remove("connector_channel_id");
    });
    assert_rule(&report, "descriptor.connector_channel_id", "/connection/connector_channel_id");
}

#[test]
fn descriptor_channel_mismatch() {
    assert_rule(
        &descriptor_with(|d| d["connection"]["connector_channel_id"] = json!("cch_other")),
        "descriptor.channel_mismatch",
        "/connection/connector_channel_id",
    );
}

#[test]
fn descriptor_target_type() {
    assert_rule(
        &descriptor_with(|d| d["connection"]["target_type"] = json!("fax")),
        "descriptor.target_type",
        "/connection/target_type",
    );
}

#[test]
fn descriptor_profiles() {
    assert_rule(
        &descriptor_with(|d| d["connection"]["profiles"] = json!([])),
        "descriptor.profiles",
        "/connection/profiles",
    );
    assert_rule(
        &descriptor_with(|d| d["connection"]["profiles"] = json!(["xagent.im.v2", "xagent.im.v2"])),
        "descriptor.profiles",
        "/connection/profiles/1",
    );
}

#[test]
fn descriptor_profile_not_in_card() {
    assert_rule(
        &descriptor_with(|d| d["connection"]["profiles"] = json!(["xagent.im.v1"])),
        "descriptor.profile_not_in_card",
        "/connection/profiles/0",
    );
}

#[test]
fn descriptor_profile_target_type() {
    assert_rule(
        &descriptor_with(|d| d["connection"]["target_type"] = json!("device")),
        "descriptor.profile_target_type",
        "/connection/profiles/0",
    );
}

#[test]
fn descriptor_status() {
    assert_rule(
        &descriptor_with(|d| d["connection"]["status"] = json!("online")),
        "descriptor.status",
        "/connection/status",
    );
}

#[test]
fn descriptor_target() {
    let report = descriptor_with(|d| {
        d["target"].as_object_mut().unwrap().remove("provider");
    });
    assert_rule(&report, "descriptor.target", "/target/provider");
}

#[test]
fn descriptor_target_display_name() {
    let report = descriptor_with(|d| {
        d["target"].as_object_mut().unwrap().remove("display_name");
    });
    assert_rule(&report, "descriptor.target_display_name", "/target/display_name");
}

#[test]
fn descriptor_tool_id() {
    assert_rule(
        &descriptor_with(|d| d["tools"][0]["tool_id"] = json!("")),
        "descriptor.tool_id",
        "/tools/0/tool_id",
    );
}

#[test]
fn descriptor_tool_id_unique() {
    let report = descriptor_with(|d| {
        let tool = d["tools"][0].clone();
        d["tools"].as_array_mut().unwrap().push(tool);
    });
    assert_rule(&report, "descriptor.tool_id_unique", "/tools/1/tool_id");
}

#[test]
fn descriptor_tool_status() {
    let report = descriptor_with(|d| {
        d["tools"][0].as_object_mut().unwrap().remove("status");
    });
    assert_rule(&report, "descriptor.tool_status", "/tools/0/status");
}

#[test]
fn descriptor_tool_permission_state() {
    assert_rule(
        &descriptor_with(|d| d["tools"][0]["target_permission_state"] = json!("maybe")),
        "descriptor.tool_permission_state",
        "/tools/0/target_permission_state",
    );
}

#[test]
fn descriptor_tool_not_in_card() {
    assert_rule(
        &descriptor_with(|d| d["tools"][0]["tool_id"] = json!("wechat_contact_search")),
        "descriptor.tool_not_in_card",
        "/tools/0/tool_id",
    );
}

#[test]
fn descriptor_secret_leak() {
    assert_rule(
        &descriptor_with(|d| d["target"]["account_hint"] = json!("Bearer abcdefghijklmnop")),
        "descriptor.secret_leak",
        "/target/account_hint",
    );
}

// ---------------------------------------------------------------- skill

#[test]
fn skill_front_matter() {
    assert_rule(
        &validate_skill("# WeChat\nno header", &facts()),
        "skill.front_matter",
        "/front_matter",
    );
}

#[test]
fn skill_byte_order_mark() {
    // Tolerant on read: a leading BOM is skipped (the name is still read and checked), and
    // `check` warns. Admission reads the name with the same function, so both accept.
    let text = format!("\u{feff}{}", skill_text());
    let report = validate_skill(&text, &facts());
    assert_rule(&report, "skill.byte_order_mark", "/front_matter");
    assert!(report.valid, "a BOM alone does not make the Skill invalid: {report:?}");
    assert_eq!(
        xagent_protocol_validate::skill_front_matter_name(&text),
        xagent_protocol_validate::skill_front_matter_name(&skill_text()),
    );
    let bad = validate_skill("\u{feff}---\nname: connector-other\n---\n", &facts());
    assert_rule(&bad, "skill.name_card", "/front_matter/name");
}

#[test]
fn skill_name_format() {
    assert_rule(
        &validate_skill("---\nname: Connector_IM_WeChat\n---\n", &facts()),
        "skill.name_format",
        "/front_matter/name",
    );
}

#[test]
fn skill_name_card() {
    assert_rule(
        &validate_skill("---\nname: im-connector-reply\n---\n", &facts()),
        "skill.name_card",
        "/front_matter/name",
    );
    assert!(validate_skill("---\nname: connector-im-wechat-file\n---\n", &facts()).valid);
}

#[test]
fn skill_secret_leak() {
    let text = format!("{}\nUse api_key: sk-abcdefghijklmnopqrstuvwxyz0123456789\n", skill_text());
    let report = validate_skill(&text, &facts());
    assert_rule(&report, "skill.secret_leak", "/line/11");
    assert!(!report.violations.iter().any(|v| v.message.contains("sk-abc")));
}

#[test]
fn skill_wire_reference() {
    let lines = skill_text().lines().count();
    for (extra, named) in [
        ("Upload the file with POST /files/uploads, then pass its file_ref.", "/files/uploads"),
        ("Download it from /files/refs/{file_ref}.", "/files/refs"),
        ("Call PUT /files first.", "put /files"),
        ("Wait for the tool.invoke.ack.", "tool.invoke.ack"),
        ("Answer with a chat.message.", "chat.message"),
        ("Send Connector.Hello yourself.", "connector.hello"),
    ] {
        let text = format!("{}\n{extra}\n", skill_text());
        let report = validate_skill(&text, &facts());
        assert_rule(&report, "skill.wire_reference", &format!("/line/{}", lines + 2));
        assert!(report.violations.iter().any(|v| v.message.contains(named)), "{extra}: {report:?}");
    }
    // Words, the Tools' own dotted ids and other paths are what a Skill is made of.
    let text = format!(
        "{}\nSend a message or a file from the conversation; ping the user on an error.\n\
         Use im.wechat.send_file; save under /files of the user; see tool.invoked_at.\n",
        skill_text()
    );
    assert!(!validate_skill(&text, &facts()).has("skill.wire_reference"));
}

#[test]
fn skill_related_skill_ids() {
    // The reference Card's Tool relates the primary Skill, which its SKILL.md is.
    assert!(!validate_skill(&skill_text(), &facts()).has("skill.related_skill_ids"));
    // A Tool relating a Skill other than the served one (a typo, or an unserved purpose Skill).
    let mut value = card();
    value["tools"][0]["related_skill_ids"] = json!(["connector-im-wechat-files"]);
    let other = CardFacts::from_value(&value);
    assert!(validate_card(&value).valid, "the prefix check alone accepts it");
    assert_rule(
        &validate_skill(&skill_text(), &other),
        "skill.related_skill_ids",
        "/front_matter/name",
    );
    // A Connector serving no Skill: any related Skill is a dangling reference.
    let report = Validator::default().absent_skill(&facts());
    assert_rule(&report, "skill.related_skill_ids", "");
    let mut unrelated = card();
    unrelated["tools"][0].as_object_mut().unwrap().remove("related_skill_ids");
    assert!(Validator::default().absent_skill(&CardFacts::from_value(&unrelated)).valid);
}

// ---------------------------------------------------------------- health

fn health_with(change: impl FnOnce(&mut Value)) -> Report {
    let mut value = fixture("health.json");
    change(&mut value);
    validate_health(&value, &facts())
}

#[test]
fn health_status() {
    let report = health_with(|h| {
        h.as_object_mut().unwrap().remove("status");
    });
    assert_rule(&report, "health.status", "/status");
}

#[test]
fn health_card_id() {
    assert_rule(
        &health_with(|h| h["connector_card_id"] = json!("im.other")),
        "health.card_id",
        "/connector_card_id",
    );
}

#[test]
fn health_protocol_version() {
    assert_rule(
        &health_with(|h| h["protocol_version"] = json!("3.1")),
        "health.protocol_version",
        "/protocol_version",
    );
}

#[test]
fn health_build() {
    assert_rule(
        &health_with(|h| h["build"]["git_rev"] = json!("fff0000")),
        "health.build",
        "/build",
    );
}

#[test]
fn health_card_version() {
    let report = health_with(|h| h["connector_card_version"] = json!("0.0.2"));
    assert_rule(&report, "health.card_version", "/connector_card_version");
    assert!(report.valid);
}

// ---------------------------------------------------------------- base URL

#[test]
fn base_url_syntax() {
    for bad in ["connector.example", "", "https://exa mple.com", "https://host:99999"] {
        assert_rule(&validate_base_url(bad), "base_url.syntax", "");
    }
}

#[test]
fn base_url_scheme() {
    assert_rule(&validate_base_url("ftp://connector.example"), "base_url.scheme", "");
    assert_rule(&validate_base_url("ws://connector.example"), "base_url.scheme", "");
}

#[test]
fn base_url_host() {
    assert_rule(&validate_base_url("https:///path"), "base_url.host", "");
    assert_rule(&validate_base_url("http://:8080"), "base_url.host", "");
}

#[test]
fn base_url_userinfo() {
    assert_rule(&validate_base_url("https://user:pw@connector.example"), "base_url.userinfo", "");
}

#[test]
fn base_url_query() {
    assert_rule(&validate_base_url("https://connector.example/p?x=1"), "base_url.query", "");
    assert_rule(&validate_base_url("https://connector.example?"), "base_url.query", "");
}

#[test]
fn base_url_fragment() {
    assert_rule(&validate_base_url("https://connector.example/#top"), "base_url.fragment", "");
}

// ---------------------------------------------------------------- hello

#[test]
fn hello_card_id() {
    let mut value = hello();
    value["payload"]["connector_card_id"] = json!("im.other");
    assert_rule(&packet(&value), "hello.card_id", "/payload/connector_card_id");
    let report = Validator::new()
        .hello(&json!({"protocol_version": "3.0", "supported_profiles": []}), &facts());
    assert_rule(&report, "hello.card_id", "/connector_card_id");
}

#[test]
fn hello_protocol_version() {
    let mut value = hello();
    value["payload"].as_object_mut().unwrap().remove("protocol_version");
    assert_rule(&packet(&value), "hello.protocol_version", "/payload/protocol_version");
    value["payload"]["protocol_version"] = json!("2.9");
    assert_rule(&packet(&value), "hello.protocol_version", "/payload/protocol_version");
}

#[test]
fn hello_supported_profiles() {
    let mut value = hello();
    value["payload"].as_object_mut().unwrap().remove("supported_profiles");
    assert_rule(&packet(&value), "hello.supported_profiles", "/payload/supported_profiles");
}

#[test]
fn hello_no_shared_profile() {
    let mut value = hello();
    value["payload"]["supported_profiles"] = json!(["xagent.im.v1"]);
    let report = packet(&value);
    assert_rule(&report, "hello.no_shared_profile", "/payload/supported_profiles");
    assert!(report.valid);
}

#[test]
fn hello_ack_card_id() {
    let mut value = hello_ack();
    value["payload"]["connector_card_id"] = json!("im.other");
    assert_rule(&packet(&value), "hello_ack.card_id", "/payload/connector_card_id");
}

#[test]
fn hello_ack_connector_id() {
    let mut value = hello_ack();
    value["payload"]["connector_id"] = json!("");
    assert_rule(&packet(&value), "hello_ack.connector_id", "/payload/connector_id");
}

#[test]
fn hello_ack_protocol_version() {
    let mut value = hello_ack();
    value["payload"]["protocol_version"] = json!("3.1");
    assert_rule(&packet(&value), "hello_ack.protocol_version", "/payload/protocol_version");
    let report = Validator::new()
        .hello_ack(&json!({"connector_card_id": "im.wechat", "connector_id": "c"}), &facts());
    assert_rule(&report, "hello_ack.protocol_version", "/protocol_version");
}

// ---------------------------------------------------------------- envelope

#[test]
fn packet_schema() {
    let mut value = tool_invoke();
    value["schema"] = json!("xagent.connector.packet/v2");
    assert_rule(&packet(&value), "packet.schema", "/schema");
}

#[test]
fn packet_packet_id() {
    let mut value = tool_invoke();
    value["packet_id"] = json!(5);
    assert_rule(&packet(&value), "packet.packet_id", "/packet_id");
}

#[test]
fn packet_type() {
    let mut value = tool_invoke();
    value.as_object_mut().unwrap().remove("type");
    assert_rule(&packet(&value), "packet.type", "/type");
}

#[test]
fn packet_type_unknown() {
    let value = envelope("session.sync_request", json!({}));
    assert_rule(&packet(&value), "packet.type_unknown", "/type");
}

#[test]
fn packet_field_type() {
    let mut value = tool_invoke();
    value["time"] = json!(-1);
    value["request_id"] = json!(7);
    value["payload"] = json!([]);
    let report = packet(&value);
    assert_rule(&report, "packet.field_type", "/time");
    assert_rule(&report, "packet.field_type", "/request_id");
    assert_rule(&report, "packet.field_type", "/payload");
}

#[test]
fn packet_time() {
    let mut value = tool_invoke();
    value.as_object_mut().unwrap().remove("time");
    let report = packet(&value);
    assert_rule(&report, "packet.time", "/time");
    assert!(report.valid);
}

#[test]
fn packet_request_id() {
    let mut value = tool_invoke();
    value.as_object_mut().unwrap().remove("request_id");
    assert_rule(&packet(&value), "packet.request_id", "/request_id");
    let mut ack =
        envelope("tool.invoke.ack", json!({"tool_id": "wechat_message_send", "result": {}}));
    ack["request_id"] = json!("");
    assert_rule(&packet(&ack), "packet.request_id", "/request_id");
}

#[test]
fn packet_reply_to() {
    let mut ack =
        envelope("tool.invoke.ack", json!({"tool_id": "wechat_message_send", "result": {}}));
    ack.as_object_mut().unwrap().remove("reply_to");
    let report = packet(&ack);
    assert_rule(&report, "packet.reply_to", "/reply_to");
    assert!(report.valid);
}

#[test]
fn packet_channel_required() {
    let mut value = tool_invoke();
    value.as_object_mut().unwrap().remove("connector_channel_id");
    assert_rule(&packet(&value), "packet.channel_required", "/connector_channel_id");
}

#[test]
fn packet_payload_required() {
    let mut value = tool_invoke();
    value.as_object_mut().unwrap().remove("payload");
    assert_rule(&packet(&value), "packet.payload_required", "/payload");
    let mut ack = envelope("channel.open.ack", json!({}));
    ack.as_object_mut().unwrap().remove("payload");
    assert_rule(&packet(&ack), "packet.payload_required", "/payload");
}

#[test]
fn packet_payload_invalid() {
    let value = envelope("auth.status", json!({"auth_session_id": "a", "refresh": "yes"}));
    assert_rule(&packet(&value), "packet.payload_invalid", "/payload");
}

#[test]
fn packet_error_required() {
    let mut value = fixture("error.json");
    value.as_object_mut().unwrap().remove("error");
    assert_rule(&packet(&value), "packet.error_required", "/error");
}

#[test]
fn packet_error_code() {
    let mut value = fixture("error.json");
    value["error"] = json!({"message": "no code"});
    assert_rule(&packet(&value), "packet.error_code", "/error/code");
}

#[test]
fn packet_profile_not_declared() {
    assert_rule(&packet(&message_push()), "packet.profile_not_declared", "/type");
}

#[test]
fn packet_secret_leak() {
    let mut value = envelope(
        "tool.invoke.ack",
        json!({"tool_id": "wechat_message_send", "result": {"access_token": "abcdef123456"}}),
    );
    value["error"] = json!(null);
    assert_rule(&packet(&value), "packet.secret_leak", "/payload/result/access_token");
    let mut err = fixture("error.json");
    err["error"]["message"] = json!("login failed for key AKIAIOSFODNN7EXAMPLE");
    assert_rule(&packet(&err), "packet.secret_leak", "/error/message");
    // auth.start carries the user's form input by design.
    let start = envelope(
        "auth.start",
        json!({"flow_id": "telegram_bot_binding", "input": {"bot_token": "123456:ABC-DEF"}}),
    );
    assert!(!packet(&start).has("packet.secret_leak"));
}

#[test]
fn packet_descriptor() {
    let value = envelope("connection.descriptor.push", json!({"connection_descriptor": "x"}));
    assert_rule(&packet(&value), "packet.descriptor", "/payload/connection_descriptor");
    let mut ack = fixture("channel_open_ack.json");
    ack["payload"].as_object_mut().unwrap().remove("connection_descriptor");
    assert_rule(&packet(&ack), "packet.descriptor", "/payload/connection_descriptor");
    // Nested Descriptor rules report under the payload path.
    let mut ack = fixture("channel_open_ack.json");
    ack["payload"]["connection_descriptor"]["connection"]["connector_channel_id"] = json!("cch_x");
    assert_rule(
        &packet(&ack),
        "descriptor.channel_mismatch",
        "/payload/connection_descriptor/connection/connector_channel_id",
    );
}

#[test]
fn packet_status() {
    assert_rule(
        &packet(&envelope("channel.close.ack", json!({"status": "closed"}))),
        "packet.status",
        "/payload/status",
    );
    assert_rule(
        &packet(&envelope("auth.start.ack", json!({"status": "unauthenticated"}))),
        "packet.status",
        "/payload/status",
    );
    assert!(packet(&envelope("auth.status.ack", json!({"status": "unauthenticated"}))).valid);
    assert_rule(
        &packet(&envelope("auth.cancel.ack", json!({"status": "done"}))),
        "packet.status",
        "/payload/status",
    );
}

#[test]
fn channel_open_ack_channel() {
    let mut ack = fixture("channel_open_ack.json");
    ack["payload"]["connector_channel_id"] = json!("cch_999");
    assert_rule(&packet(&ack), "channel_open_ack.channel", "/payload/connector_channel_id");
}

#[test]
fn auth_flow_id() {
    assert_rule(
        &packet(&envelope("auth.start", json!({"flow_id": ""}))),
        "auth.flow_id",
        "/payload/flow_id",
    );
    assert_rule(
        &packet(&envelope("auth.start", json!({"flow_id": "github_oauth"}))),
        "auth.flow_id",
        "/payload/flow_id",
    );
}

#[test]
fn auth_session_id() {
    assert_rule(
        &packet(&envelope("auth.cancel", json!({}))),
        "auth.session_id",
        "/payload/auth_session_id",
    );
    assert_rule(
        &packet(&envelope("auth.status", json!({"flow_id": "x"}))),
        "auth.session_id",
        "/payload/auth_session_id",
    );
}

#[test]
fn tool_invoke_tool_id() {
    let mut value = tool_invoke();
    value["payload"]["tool_id"] = json!("wechat_contact_search");
    assert_rule(&packet(&value), "tool_invoke.tool_id", "/payload/tool_id");
}

#[test]
fn tool_invoke_arguments() {
    let mut value = tool_invoke();
    value["payload"]["arguments"] = json!("text=hi");
    assert_rule(&packet(&value), "tool_invoke.arguments", "/payload/arguments");
}

#[test]
fn tool_progress_tool_id() {
    let value = envelope("tool.progress.push", json!({"status": "running"}));
    assert_rule(&packet(&value), "tool_progress.tool_id", "/payload/tool_id");
}

#[test]
fn tool_progress_progress() {
    let value = envelope("tool.progress.push", json!({"tool_id": "t", "progress": 1.5}));
    assert_rule(&packet(&value), "tool_progress.progress", "/payload/progress");
}

// ---------------------------------------------------------------- IM

fn v1_packet(value: &Value) -> Report {
    validate_packet(value, PacketContext::with_card(&v1_card()))
}

#[test]
fn message_push_required_field() {
    let mut value = message_push();
    value["payload"].as_object_mut().unwrap().remove("sender_id");
    assert_rule(&v1_packet(&value), "message_push.required_field", "/payload/sender_id");
}

#[test]
fn message_push_recommended_field() {
    let mut value = message_push();
    value["payload"].as_object_mut().unwrap().remove("chat_type");
    let report = v1_packet(&value);
    assert_rule(&report, "message_push.recommended_field", "/payload/chat_type");
    assert!(report.valid);
}

#[test]
fn message_push_profile() {
    let mut value = message_push();
    value["payload"]["profile"] = json!("xagent.im.v2");
    assert_rule(&v1_packet(&value), "message_push.profile", "/payload/profile");
}

#[test]
fn message_push_target_session() {
    let mut value = message_push();
    value["payload"]["session_ref"] = json!("s1");
    value["payload"]["target_session_id"] = json!("s2");
    assert_rule(&v1_packet(&value), "message_push.target_session", "/payload");
}

#[test]
fn message_push_card_reference() {
    type Change = fn(&mut Value);
    let cases: [(&str, Change, &str); 5] = [
        (
            "reply Tool",
            |p| p["reply"]["tool_id"] = json!("wechat_message_reply"),
            "/payload/reply/tool_id",
        ),
        ("Skill", |p| p["skill"]["name"] = json!("connector-im-telegram"), "/payload/skill/name"),
        (
            "Skill Tools",
            |p| p["skill"]["tool_ids"] = json!(["wechat_message_send", "wechat_file_send"]),
            "/payload/skill/tool_ids/1",
        ),
        (
            "guidance Tool",
            |p| p["activation_message"] = json!("Answer with wechat_message_reply."),
            "/payload/activation_message",
        ),
        (
            "guidance Skill",
            |p| p["activation_message"] = json!("Follow connector-im-wechat-replies."),
            "/payload/activation_message",
        ),
    ];
    for (what, change, path) in cases {
        let mut value = message_push();
        change(&mut value["payload"]);
        let report = v1_packet(&value);
        assert_rule(&report, "message_push.card_reference", path);
        // Without a Card there is nothing to cite against.
        let alone = validate_packet(&value, PacketContext::default());
        assert!(!alone.has("message_push.card_reference"), "{what}: {alone:?}");
    }
    // Citing what the Card declares passes; the user's own words are not citations.
    let mut value = message_push();
    value["payload"]["activation_message"] =
        json!("Reply with wechat_message_send; see connector-im-wechat.");
    value["payload"]["skill"]["tool_ids"] = json!(["wechat_message_send"]);
    value["payload"]["raw_text"] = json!("try wechat_hack and connector-evil");
    let report = v1_packet(&value);
    assert!(!report.has("message_push.card_reference"), "{report:?}");
}

#[test]
fn im_file_ref() {
    let mut value = fixture("chat_message.json");
    let file = value["payload"]["files"][0].clone();
    value["payload"]["files"].as_array_mut().unwrap().push(file);
    assert_rule(&packet(&value), "im.file_ref", "/payload/files/1/file_ref");
    let mut push = message_push();
    push["payload"]["files"] = json!([{"download_url": "/files/refs/x"}]);
    assert_rule(&v1_packet(&push), "im.file_ref", "/payload/files/0/file_ref");
    // Unique within a message.push too (the runtime refuses the duplicate as well).
    let mut push = message_push();
    let item = json!({"file_ref": "f1", "download_url": "/files/refs/f1"});
    push["payload"]["files"] = json!([item.clone(), item]);
    assert_rule(&v1_packet(&push), "im.file_ref", "/payload/files/1/file_ref");
}

#[test]
fn im_file_bytes() {
    // The runtime (profile-im) refuses these; `check` must too.
    let mut value = fixture("chat_message.json");
    value["payload"]["files"][0]["base64"] = json!("AAAA");
    assert_rule(&packet(&value), "im.file_bytes", "/payload/files/0/base64");
    let mut value = fixture("chat_message.json");
    value["payload"]["local_path"] = json!("/tmp/x.png");
    assert_rule(&packet(&value), "im.file_bytes", "/payload/local_path");
    let mut push = message_push();
    push["payload"]["files"] = json!([{"file_ref": "f1", "url": "/f", "data": "AAAA"}]);
    assert_rule(&v1_packet(&push), "im.file_bytes", "/payload/files/0/data");
}

#[test]
fn im_download_url_scheme() {
    for url in ["file:///etc/passwd", "data:image/png;base64,AAAA", "ftp://h/x", "C:\\x.png", ""] {
        let mut value = fixture("chat_message.json");
        value["payload"]["files"][0]["download_url"] = json!(url);
        assert_rule(&packet(&value), "im.download_url_scheme", "/payload/files/0/download_url");
        let mut value = fixture("chat_message.json");
        value["payload"]["files"][0]["download_url"] = json!(url);
        assert!(!packet_from(Side::Xagent, &value).valid, "{url:?} refused in both directions");
    }
    let mut push = message_push();
    push["payload"]["files"] = json!([{"file_ref": "f1", "url": "file:///x"}]);
    assert_rule(&v1_packet(&push), "im.download_url_scheme", "/payload/files/0/url");
    let mut value = fixture("chat_message.json");
    value["payload"]["files"][0]["download_url"] = json!("HTTPS://cdn.example/x.png");
    assert!(packet(&value).valid, "{:?}", packet(&value));
}

#[test]
fn im_v1_forbidden_field() {
    let mut push = message_push();
    push["payload"]["user_id"] = json!("u1");
    assert_rule(&v1_packet(&push), "im_v1.forbidden_field", "/payload/user_id");
}

#[test]
fn im_file_type() {
    let mut value = fixture("chat_message.json");
    value["payload"]["files"][0]["type"] = json!("document");
    assert_rule(&packet(&value), "im.file_type", "/payload/files/0/type");
}

#[test]
fn im_file_url() {
    let mut push = message_push();
    push["payload"]["files"] = json!([{"file_ref": "f1", "type": "image"}]);
    let report = v1_packet(&push);
    assert_rule(&report, "im.file_url", "/payload/files/0/download_url");
    assert!(report.valid);
}

#[test]
fn im_v2_forbidden_field() {
    let mut value = fixture("chat_message.json");
    value["payload"]["session_id"] = json!("s1");
    assert_rule(&packet(&value), "im_v2.forbidden_field", "/payload/session_id");
    let mut activity = fixture("chat_activity.json");
    activity["payload"]["role"] = json!("assistant");
    assert_rule(&packet(&activity), "im_v2.forbidden_field", "/payload/role");
}

#[test]
fn im_v2_message_id() {
    let mut value = fixture("chat_message_delta.json");
    value["payload"]["message_id"] = json!("");
    assert_rule(&packet(&value), "im_v2.message_id", "/payload/message_id");
}

#[test]
fn chat_message_content() {
    let mut value = fixture("chat_message.json");
    value["payload"]["text"] = json!("");
    value["payload"]["files"] = json!([]);
    assert_rule(&packet(&value), "chat_message.content", "/payload");
}

#[test]
fn chat_message_download_url() {
    let mut value = fixture("chat_message.json");
    value["payload"]["files"][0].as_object_mut().unwrap().remove("download_url");
    assert_rule(
        &packet_from(Side::Connector, &value),
        "chat_message.download_url",
        "/payload/files/0/download_url",
    );
    assert!(packet_from(Side::Xagent, &value).valid, "xAgent -> Connector files need no URL");
}

#[test]
fn chat_delta_sequence() {
    let mut value = fixture("chat_message_delta.json");
    value["payload"]["sequence"] = json!(0);
    assert_rule(&packet(&value), "chat_delta.sequence", "/payload/sequence");
}

#[test]
fn chat_delta_text() {
    let mut value = fixture("chat_message_delta.json");
    value["payload"].as_object_mut().unwrap().remove("text");
    assert_rule(&packet(&value), "chat_delta.text", "/payload/text");
}

#[test]
fn chat_delta_files() {
    let mut value = fixture("chat_message_delta.json");
    value["payload"]["files"] = json!([]);
    assert_rule(&packet(&value), "chat_delta.files", "/payload/files");
}

#[test]
fn chat_ack_reply_to() {
    let mut value = fixture("chat_message_ack.json");
    value.as_object_mut().unwrap().remove("reply_to");
    assert_rule(&packet(&value), "chat_ack.reply_to", "/reply_to");
}

#[test]
fn chat_ack_status() {
    let mut value = fixture("chat_message_ack.json");
    value["payload"]["status"] = json!("ok");
    assert_rule(&packet(&value), "chat_ack.status", "/payload/status");
}

#[test]
fn chat_ack_rejected() {
    let mut value = fixture("chat_message_ack.json");
    value["payload"].as_object_mut().unwrap().remove("retryable");
    assert_rule(&packet(&value), "chat_ack.rejected", "/payload/retryable");
    value["payload"].as_object_mut().unwrap().remove("code");
    assert_rule(&packet(&value), "chat_ack.rejected", "/payload/code");
}

#[test]
fn chat_activity_status() {
    let mut value = fixture("chat_activity.json");
    value["payload"]["status"] = json!("typing");
    assert_rule(&packet(&value), "chat_activity.status", "/payload/status");
}

#[test]
fn chat_activity_tool_name() {
    let mut value = fixture("chat_activity.json");
    value["payload"]["tool_name"] = json!("x".repeat(257));
    assert_rule(&packet(&value), "chat_activity.tool_name", "/payload/tool_name");
    let mut idle = fixture("chat_activity.json");
    idle["payload"]["status"] = json!("idle");
    assert_rule(&packet(&idle), "chat_activity.tool_name", "/payload/tool_name");
    let mut missing = fixture("chat_activity.json");
    missing["payload"].as_object_mut().unwrap().remove("tool_name");
    assert_rule(&packet(&missing), "chat_activity.tool_name", "/payload/tool_name");
}

#[test]
fn chat_activity_content() {
    for key in ["reasoning", "arguments", "error", "result"] {
        let mut value = fixture("chat_activity.json");
        value["payload"][key] = json!("details");
        assert_rule(&packet(&value), "chat_activity.content", &format!("/payload/{key}"));
    }
    for name in [
        "/usr/local/bin/search",
        "C:\\tools\\search.exe",
        "https://tools.example/search",
        "file:search",
        "tools/search",
    ] {
        let mut value = fixture("chat_activity.json");
        value["payload"]["tool_name"] = json!(name);
        assert_rule(&packet(&value), "chat_activity.content", "/payload/tool_name");
    }
    for name in ["web_search", "mcp.github.create_issue", "github:create_issue"] {
        let mut value = fixture("chat_activity.json");
        value["payload"]["tool_name"] = json!(name);
        assert!(packet(&value).valid, "{name}");
    }
}
