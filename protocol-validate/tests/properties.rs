//! Property tests: a Card or Descriptor built to satisfy every rule validates without any
//! violation, and each single mutation that breaks one rule is caught by that rule.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use xagent_protocol_types::primary_skill_name;
use xagent_protocol_validate::{
    CardFacts, DescriptorContext, validate_card, validate_descriptor, with_connector_channel_id,
};

/// A generated Card with the facts the mutations need.
#[derive(Clone, Debug)]
struct Generated {
    card: Value,
}

fn word() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9]{1,7}"
}

fn tool_id() -> impl Strategy<Value = String> {
    "[A-Za-z][A-Za-z0-9_.-]{0,30}"
}

fn build_time() -> impl Strategy<Value = String> {
    (0u32..100, 1u32..13, 1u32..29, 0u32..24, 0u32..60)
        .prop_map(|(y, mo, d, h, mi)| format!("{y:02}{mo:02}{d:02}{h:02}{mi:02}"))
}

fn valid_card() -> impl Strategy<Value = Generated> {
    (
        word(),
        word(),
        prop::bool::ANY,
        prop::collection::btree_set(tool_id(), 1..4),
        build_time(),
        prop::collection::btree_set(word(), 1..4),
        prop::bool::ANY,
    )
        .prop_map(|(kind, name, device, tool_ids, build_time, field_names, multiple)| {
            let card_id = format!("{kind}.{name}");
            let (target_type, profile) =
                if device { ("device", "xagent.device.v1") } else { ("im", "xagent.im.v2") };
            let primary = primary_skill_name(&card_id).into_string();
            let tools: Vec<Value> = tool_ids
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    let args = json!({
                        "type": "object",
                        "properties": {"text": {"type": "string"}},
                        "required": ["text"]
                    });
                    let schema = with_connector_channel_id(args.as_object().unwrap()).unwrap();
                    let related = if i % 2 == 0 { primary.clone() } else { format!("{primary}-extra") };
                    json!({
                        "tool_id": id,
                        "profile": profile,
                        "title": format!("Tool {i}"),
                        "related_skill_ids": [related],
                        "input_schema": Value::Object(schema),
                        "output_schema": {"type": "object"}
                    })
                })
                .collect();
            let fields: Vec<Value> = field_names
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    if i == 0 {
                        json!({"name": f, "label": "Token", "input_type": "password", "secret": true, "required": true})
                    } else {
                        json!({"name": f, "label": "Field", "input_type": "text", "default_value": "x"})
                    }
                })
                .collect();
            let card = json!({
                "schema": "xagent.connector/v1",
                "protocol_version": "3.0",
                "build": {"version": "1.0.0", "git_rev": "abc1234", "build_time": build_time},
                "connector_card_id": card_id,
                "connector": {"name": format!("{name} Connector"), "version": "0.1.0"},
                "supports": {
                    "user_channel_mode": if multiple { "multiple" } else { "single" },
                    "target_types": [target_type],
                    "targets": [{"target_type": target_type, "provider": name, "label": name}],
                    "profiles": [profile]
                },
                "tools": tools,
                "auth_flows": [
                    {"id": "qr", "target_type": target_type, "type": "qr_login", "title": "Scan"},
                    {"id": "form", "target_type": target_type, "type": "form", "title": "Form", "fields": fields}
                ],
                "security": {"trust_level": "third_party", "api_key_required": true}
            });
            Generated { card }
        })
}

fn obj(value: &mut Value) -> &mut Map<String, Value> {
    value.as_object_mut().unwrap()
}

type Mutation = (&'static str, fn(&mut Value));

/// Single mutations of a valid Card, each breaking one rule.
const CARD_MUTATIONS: &[Mutation] = &[
    ("card.schema", |c| c["schema"] = json!("xagent.connector/v0")),
    ("card.protocol_version", |c| c["protocol_version"] = json!("3.1")),
    ("card.build", |c| {
        obj(c).remove("build");
    }),
    ("card.build_time_format", |c| c["build"]["build_time"] = json!("yesterday")),
    ("card.connector_card_id", |c| c["connector_card_id"] = json!("")),
    ("card.connector_name", |c| c["connector"]["name"] = json!(null)),
    ("card.connector_version", |c| {
        obj(&mut c["connector"]).remove("version");
    }),
    ("card.supports", |c| c["supports"] = json!("im")),
    ("card.target_types", |c| c["supports"]["target_types"] = json!([])),
    ("card.target_type_unknown", |c| {
        c["supports"]["target_types"].as_array_mut().unwrap().push(json!("fax"))
    }),
    ("card.profiles", |c| c["supports"]["profiles"] = json!([])),
    ("card.profile_unknown", |c| {
        c["supports"]["profiles"].as_array_mut().unwrap().push(json!("vendor.custom.v1"))
    }),
    ("card.profile_target_type", |c| {
        let other = if c["supports"]["target_types"][0] == "im" {
            "xagent.device.v1"
        } else {
            "xagent.im.v2"
        };
        c["supports"]["profiles"].as_array_mut().unwrap().push(json!(other))
    }),
    ("card.user_channel_mode", |c| c["supports"]["user_channel_mode"] = json!("all")),
    ("card.target_declaration", |c| {
        obj(&mut c["supports"]["targets"][0]).remove("provider");
    }),
    ("card.tool_id", |c| c["tools"][0]["tool_id"] = json!("")),
    ("card.tool_id_format", |c| c["tools"][0]["tool_id"] = json!("two words")),
    ("card.tool_id_unique", |c| {
        let copy = c["tools"][0].clone();
        c["tools"].as_array_mut().unwrap().push(copy)
    }),
    ("card.tool_profile", |c| c["tools"][0]["profile"] = json!("xagent.im.v1")),
    ("card.tool_input_schema", |c| c["tools"][0]["input_schema"] = json!({"type": "string"})),
    ("card.tool_channel_argument", |c| {
        obj(&mut c["tools"][0]["input_schema"]["properties"]).remove("connector_channel_id");
    }),
    ("card.tool_channel_required", |c| c["tools"][0]["input_schema"]["required"] = json!(["text"])),
    ("card.tool_card_id_argument", |c| {
        c["tools"][0]["input_schema"]["properties"]["connector_card_id"] = json!({"type": "string"})
    }),
    ("card.tool_related_skill", |c| {
        c["tools"][0]["related_skill_ids"] = json!(["skill-of-someone-else"])
    }),
    ("card.auth_flow_required", |c| {
        obj(&mut c["auth_flows"][0]).remove("id");
    }),
    ("card.auth_flow_type", |c| c["auth_flows"][0]["type"] = json!("oauth2")),
    ("card.auth_flow_target_type", |c| c["auth_flows"][0]["target_type"] = json!("ticket")),
    ("card.auth_form_fields", |c| {
        obj(&mut c["auth_flows"][1]).remove("fields");
    }),
    ("card.auth_field_required", |c| {
        obj(&mut c["auth_flows"][1]["fields"][0]).remove("label");
    }),
    ("card.auth_field_name_unique", |c| {
        let copy = c["auth_flows"][1]["fields"][0].clone();
        c["auth_flows"][1]["fields"].as_array_mut().unwrap().push(copy)
    }),
    ("card.auth_field_input_type", |c| {
        c["auth_flows"][1]["fields"][0]["input_type"] = json!("pin")
    }),
    ("card.auth_field_secret", |c| {
        obj(&mut c["auth_flows"][1]["fields"][0]).remove("secret");
    }),
    ("card.auth_field_default_secret", |c| {
        c["auth_flows"][1]["fields"][0]["default_value"] = json!("hunter2")
    }),
    ("card.im_profiles_exclusive", |c| {
        c["supports"]["profiles"] = json!(["xagent.im.v1", "xagent.im.v2"])
    }),
    ("card.im_tool_target_argument", |c| {
        c["tools"][0]["profile"] = json!("xagent.im.v2");
        c["tools"][0]["input_schema"]["properties"]["chat_id"] = json!({"type": "string"})
    }),
    ("card.trust_level", |c| c["security"]["trust_level"] = json!("high")),
    ("card.server_base_url", |c| c["server_base_url"] = json!("https://c.example")),
    ("card.secret_leak", |c| {
        c["connector"]["description"] = json!("uses ghp_abcdefghijklmnopqrstuvwxyz0123456789")
    }),
];

fn descriptor_for(card: &Value) -> Value {
    let tools: Vec<Value> = card["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| json!({"tool_id": t["tool_id"], "status": "available", "target_permission_state": "granted"}))
        .collect();
    json!({
        "schema": "xagent.connection/v2",
        "connection": {
            "connector_card_id": card["connector_card_id"],
            "connector_id": "conn_1",
            "connector_channel_id": "cch_1",
            "target_type": card["supports"]["target_types"][0],
            "profiles": card["supports"]["profiles"],
            "status": "connected"
        },
        "target": {"provider": card["supports"]["targets"][0]["provider"], "display_name": "Account"},
        "tools": tools
    })
}

/// Single mutations of a valid Descriptor, each breaking one rule.
const DESCRIPTOR_MUTATIONS: &[Mutation] = &[
    ("descriptor.schema", |d| d["schema"] = json!("xagent.connection/v9")),
    ("descriptor.schema_legacy", |d| d["schema"] = json!("xagent.connection/v1")),
    ("descriptor.connection", |d| {
        obj(d).remove("connection");
    }),
    ("descriptor.connector_card_id", |d| d["connection"]["connector_card_id"] = json!("")),
    ("descriptor.card_mismatch", |d| d["connection"]["connector_card_id"] = json!("other.card")),
    ("descriptor.connector_id", |d| {
        obj(&mut d["connection"]).remove("connector_id");
    }),
    ("descriptor.connector_channel_id", |d| d["connection"]["connector_channel_id"] = json!(1)),
    ("descriptor.channel_mismatch", |d| d["connection"]["connector_channel_id"] = json!("cch_2")),
    ("descriptor.target_type", |d| d["connection"]["target_type"] = json!("browser")),
    ("descriptor.profiles", |d| d["connection"]["profiles"] = json!([])),
    ("descriptor.profile_not_in_card", |d| {
        d["connection"]["profiles"].as_array_mut().unwrap().push(json!("xagent.im.v1"))
    }),
    ("descriptor.profile_target_type", |d| {
        let other = if d["connection"]["target_type"] == "im" { "device" } else { "im" };
        d["connection"]["target_type"] = json!(other)
    }),
    ("descriptor.status", |d| d["connection"]["status"] = json!("up")),
    ("descriptor.target", |d| d["target"]["provider"] = json!("")),
    ("descriptor.target_display_name", |d| {
        obj(&mut d["target"]).remove("display_name");
    }),
    ("descriptor.tool_id", |d| {
        obj(&mut d["tools"][0]).remove("tool_id");
    }),
    ("descriptor.tool_status", |d| d["tools"][0]["status"] = json!("ready")),
    ("descriptor.tool_permission_state", |d| {
        d["tools"][0]["target_permission_state"] = json!("yes")
    }),
    ("descriptor.tool_not_in_card", |d| d["tools"][0]["tool_id"] = json!("tool not in card")),
    ("descriptor.secret_leak", |d| d["target"]["account_hint"] = json!("AKIAIOSFODNN7EXAMPLE")),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_card_satisfying_every_rule_has_no_violation(generated in valid_card()) {
        let report = validate_card(&generated.card);
        prop_assert!(report.violations.is_empty(), "{:#?}", report.violations);
    }

    #[test]
    fn each_card_mutation_is_caught_by_its_rule(
        generated in valid_card(),
        which in 0..CARD_MUTATIONS.len(),
    ) {
        let (rule, mutate) = CARD_MUTATIONS[which];
        let mut card = generated.card;
        mutate(&mut card);
        let report = validate_card(&card);
        prop_assert!(report.has(rule), "{rule} not reported: {:#?}", report.violations);
    }

    #[test]
    fn a_descriptor_satisfying_every_rule_has_no_violation(generated in valid_card()) {
        let facts = CardFacts::from_value(&generated.card);
        let descriptor = descriptor_for(&generated.card);
        let report = validate_descriptor(
            &descriptor,
            DescriptorContext { card: Some(&facts), channel: Some("cch_1") },
        );
        prop_assert!(report.violations.is_empty(), "{:#?}", report.violations);
    }

    #[test]
    fn each_descriptor_mutation_is_caught_by_its_rule(
        generated in valid_card(),
        which in 0..DESCRIPTOR_MUTATIONS.len(),
    ) {
        let (rule, mutate) = DESCRIPTOR_MUTATIONS[which];
        let facts = CardFacts::from_value(&generated.card);
        let mut descriptor = descriptor_for(&generated.card);
        mutate(&mut descriptor);
        let report = validate_descriptor(
            &descriptor,
            DescriptorContext { card: Some(&facts), channel: Some("cch_1") },
        );
        prop_assert!(report.has(rule), "{rule} not reported: {:#?}", report.violations);
    }
}

#[test]
fn every_mutation_list_entry_names_a_rule() {
    for (rule, _) in CARD_MUTATIONS.iter().chain(DESCRIPTOR_MUTATIONS) {
        assert!(xagent_protocol_validate::rules::by_id(rule).is_some(), "{rule}");
    }
}
