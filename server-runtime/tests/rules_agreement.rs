//! The runtime and the validator (`xagent-connector check`, xAgent's admission) give the same
//! answer on the same input, for each rule the issue found in two places (issue 12). The
//! lower halves of these tests live next to each rule's one home (`protocol-types`,
//! `protocol-validate`, `profile-im`, `file-transfer`).

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use xagent_protocol_types::{
    AuthFlow, PROFILE_IM_V2, REPEATED_CALL_WINDOW_MS, Side, TargetDeclaration, TargetType,
    bearer_token,
};
use xagent_protocol_validate::{
    CardFacts, PacketContext, validate_card, validate_packet, validate_skill,
};
use xagent_server_runtime::prelude::*;
use xagent_server_runtime::{DefinitionError, RuntimeConfig};
use xagent_testkit::payload_json;

fn rules(report: &xagent_protocol_validate::Report) -> Vec<String> {
    report.errors().map(|v| v.rule.clone()).collect()
}

#[tokio::test]
async fn rule_bearer_scheme_is_case_insensitive_on_ws_and_health_as_on_uploads() {
    let h = support::start_default().await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let header = format!("{scheme} {}", support::API_KEY);
        assert_eq!(bearer_token(&header), Some(support::API_KEY), "the shared parser");
        let mut request = h.ws_url().into_client_request().unwrap();
        let headers = request.headers_mut();
        headers.insert(
            "Sec-WebSocket-Protocol",
            HeaderValue::from_static("xagent.connector.packet.v1"),
        );
        headers.insert("Authorization", HeaderValue::from_str(&header).unwrap());
        let connected = tokio_tungstenite::connect_async(request).await;
        assert!(connected.is_ok(), "/ws refused {scheme}: {:?}", connected.err());
        let health = reqwest::Client::new()
            .get(h.http("/health"))
            .header("Authorization", &header)
            .send()
            .await
            .unwrap();
        assert_eq!(health.status(), 200, "/health refused {scheme}");
    }
    let wrong = reqwest::Client::new()
        .get(h.http("/health"))
        .header("Authorization", "Basic abc")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    h.stop().await;
}

/// A `chat.message` from xAgent with file items.
fn chat_with_files(channel: &str, id: &str, files: Value) -> Value {
    json!({
        "schema": "xagent.connector.packet/v1",
        "type": "chat.message",
        "packet_id": format!("pkt_{id}"),
        "time": support::START,
        "connector_channel_id": channel,
        "payload": { "message_id": id, "text": "see file", "files": files }
    })
}

#[tokio::test]
async fn rule_im_file_bytes_download_url_scheme_and_file_ref_unique_the_runtime_refuses_what_check_refuses()
 {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok-rules").await;
    let good =
        json!({ "file_ref": "file_a", "type": "file", "download_url": "https://x.example/a" });
    let cases = [
        ("m_good", json!([good.clone()]), None),
        (
            "m_bytes",
            json!([{ "file_ref": "file_b", "type": "file", "base64": "aGVsbG8=" }]),
            Some("im.file_bytes"),
        ),
        (
            "m_scheme",
            json!([{ "file_ref": "file_c", "type": "file", "download_url": "file:///etc/passwd" }]),
            Some("im.download_url_scheme"),
        ),
        ("m_twice", json!([good.clone(), good]), Some("im.file_ref")),
    ];
    for (id, files, refused_by) in cases {
        let packet = chat_with_files(channel.as_str(), id, files);
        let context = PacketContext { card: None, sender: Some(Side::Xagent) };
        let report = validate_packet(&packet, context);
        match refused_by {
            Some(rule) => assert!(rules(&report).iter().any(|r| r == rule), "{id}: {report:?}"),
            None => assert!(report.valid, "{id}: {report:?}"),
        }
        c.send_text(packet.to_string()).await;
        let (ack, _) = c.wait_for("chat.message.ack").await;
        let status = payload_json(&ack)["status"].clone();
        if refused_by.is_some() {
            assert_eq!(status, "rejected", "{id}: the runtime accepted what check refuses");
        } else {
            assert_eq!(status, "accepted", "{id}: the runtime refused what check accepts");
        }
    }
    c.close().await;
    h.stop().await;
}

#[test]
fn rule_repeated_call_window_is_the_shared_24_hours() {
    let window = RuntimeConfig::default().tool_call_window;
    assert_eq!(window, Duration::from_millis(REPEATED_CALL_WINDOW_MS));
    assert_eq!(window, Duration::from_secs(24 * 3600));
}

fn skill_connector(skill: &str) -> Result<Connector, DefinitionError> {
    Connector::builder("im.rules", "Rules", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "rules", "Rules"))
        .profile(PROFILE_IM_V2)
        .on_message(|_, _| async {})
        .skill(skill)
        .build()
}

#[test]
fn rule_skill_byte_order_mark_the_builder_and_check_agree() {
    let body = "---\nname: connector-im-rules\ndescription: Rules.\n---\n\nUse the Tools.\n";
    let card = json!({ "connector_card_id": "im.rules" });
    let facts = CardFacts::from_value(&card);
    for (skill, valid) in [
        (body.to_owned(), true),
        (format!("\u{feff}{body}"), true),
        (body.replace("connector-im-rules", "connector-im-other"), false),
    ] {
        let checked = validate_skill(&skill, &facts);
        let built = skill_connector(&skill);
        assert_eq!(checked.valid, valid, "check: {checked:?}");
        assert_eq!(built.is_ok(), valid, "the builder disagrees with check on {skill:?}");
        if let Err(DefinitionError::SkillViolations(violations)) = built {
            let built_rules: Vec<String> = violations.into_iter().map(|v| v.rule).collect();
            assert_eq!(built_rules, rules(&checked));
        }
    }
}

#[test]
fn rule_card_auth_flow_id_unique_the_builder_refuses_what_check_refuses() {
    struct Never;
    impl FlowHandler for Never {
        async fn start(
            &self,
            _ctx: AuthContext,
            _input: xagent_server_runtime::AuthValues,
        ) -> Result<AuthStep, AuthError> {
            Ok(AuthStep::Failed("no".into()))
        }
    }
    let flow = AuthFlow::qr_login("rules_qr", TargetType::Im, "QR");
    let built =
        skill_connector("---\nname: connector-im-rules\n---\n").map(|_| ()).and_then(|()| {
            Connector::builder("im.rules", "Rules", "1.0.0")
                .target(TargetDeclaration::new(TargetType::Im, "rules", "Rules"))
                .profile(PROFILE_IM_V2)
                .on_message(|_, _| async {})
                .auth_flow_with(flow.clone(), Never)
                .auth_flow_with(flow.clone(), Never)
                .build()
                .map(|_| ())
        });
    assert!(matches!(built, Err(DefinitionError::DuplicateFlow(id)) if id == "rules_qr"));
    let mut card = serde_json::to_value(
        skill_connector("---\nname: connector-im-rules\n---\n").unwrap().card(),
    )
    .unwrap();
    let flow_json = serde_json::to_value(&flow).unwrap();
    card["auth_flows"] = json!([flow_json.clone(), flow_json]);
    let checked = validate_card(&card);
    assert!(rules(&checked).iter().any(|r| r == "card.auth_flow_id_unique"), "{checked:?}");
}

/// The arguments of a send Tool that lets the model pick the chat: what IM v1 §4 forbids.
#[derive(Deserialize, JsonSchema)]
struct SendToChat {
    /// The text to send.
    text: String,
    /// The chat to send it to.
    chat_id: String,
}

/// Issue 38: the Connector's build refuses a Card the validator refuses under the new IM Card
/// rules, naming the same rule (the build runs `validate_card` on the Card it generates).
#[test]
fn rule_card_im_tool_target_argument_and_im_profiles_exclusive_the_builder_refuses_what_check_refuses()
 {
    let send = || ToolSpec::new("rules_send", "Send\n\nSends a text.");
    let handler = |_: ToolContext, args: SendToChat| async move {
        Ok::<_, ToolError>(format!("{} {}", args.text.len(), args.chat_id.len()))
    };
    let builds = [
        (
            "card.im_tool_target_argument",
            Connector::builder("im.rules", "Rules", "1.0.0")
                .target(TargetDeclaration::new(TargetType::Im, "rules", "Rules"))
                .profile(PROFILE_IM_V2)
                .on_message(|_, _| async {})
                .tool(send(), handler)
                .build(),
        ),
        (
            "card.im_profiles_exclusive",
            Connector::builder("im.rules", "Rules", "1.0.0")
                .target(TargetDeclaration::new(TargetType::Im, "rules", "Rules"))
                .profile(PROFILE_IM_V2)
                .profile(xagent_protocol_types::PROFILE_IM_V1)
                .on_message(|_, _| async {})
                .build(),
        ),
    ];
    for (rule, built) in builds {
        match built {
            Err(DefinitionError::CardViolations(violations)) => {
                assert!(violations.iter().any(|v| v.rule == rule), "{rule}: {violations:?}")
            }
            Err(other) => panic!("{rule}: refused for another reason: {other}"),
            Ok(_) => panic!("{rule}: the builder accepted the Card"),
        }
    }
}

/// Issue 38: a Tool relating the primary Skill of a Connector that serves none is refused by
/// the build, as xAgent's admission refuses it.
#[test]
fn rule_skill_related_skill_ids_the_builder_refuses_a_related_skill_it_does_not_serve() {
    let tool =
        || ToolSpec::new("rules_ping", "Ping\n\nAnswers.").related_skill("connector-im-rules");
    let handler = |_: ToolContext, _: NoArgs| async { Ok::<_, ToolError>(true) };
    let built = Connector::builder("im.rules", "Rules", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "rules", "Rules"))
        .profile(PROFILE_IM_V2)
        .on_message(|_, _| async {})
        .tool(tool(), handler)
        .build();
    match built {
        Err(DefinitionError::SkillViolations(violations)) => assert!(
            violations.iter().any(|v| v.rule == "skill.related_skill_ids"),
            "{violations:?}"
        ),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("the builder accepted a Tool relating a Skill it does not serve"),
    }
    let served = Connector::builder("im.rules", "Rules", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "rules", "Rules"))
        .profile(PROFILE_IM_V2)
        .on_message(|_, _| async {})
        .tool(tool(), handler)
        .skill("---\nname: connector-im-rules\n---\nUse rules_ping.\n")
        .build();
    assert!(served.is_ok(), "serving the related Skill is enough");
}

/// No arguments.
#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

/// The arguments of a file-send Tool whose field text sends the model to the Transfer Plane.
#[derive(Deserialize, JsonSchema)]
struct SendUploaded {
    /// The file_ref that POST /files/uploads returned.
    file: String,
}

/// Issue 34 item 7: the build refuses a Tool description or a Skill that sends the model to the
/// Transfer Plane or names a wire packet, with the rule `check` names, and accepts the same
/// texts written as what the Tool does.
#[test]
fn rule_card_tool_wire_reference_and_skill_wire_reference_the_builder_refuses_what_check_refuses() {
    let builder = || {
        Connector::builder("im.rules", "Rules", "1.0.0")
            .target(TargetDeclaration::new(TargetType::Im, "rules", "Rules"))
            .profile(PROFILE_IM_V2)
            .on_message(|_, _| async {})
    };
    let ping = |_: ToolContext, _: NoArgs| async { Ok::<_, ToolError>(true) };
    let send = |_: ToolContext, args: SendUploaded| async move { Ok::<_, ToolError>(args.file) };
    let builds = [
        (
            "card.tool_wire_reference",
            builder()
                .tool(ToolSpec::new("rules_ping", "Ping\n\nAnswers the tool.invoke it gets."), ping)
                .build(),
        ),
        (
            "card.tool_wire_reference",
            builder().tool(ToolSpec::new("rules_send", "Send\n\nSends a file."), send).build(),
        ),
        (
            "skill.wire_reference",
            builder()
                .skill("---\nname: connector-im-rules\n---\nReply with a chat.message.\n")
                .build(),
        ),
        (
            "skill.wire_reference",
            builder()
                .skill("---\nname: connector-im-rules\n---\nFirst POST /files/uploads.\n")
                .build(),
        ),
    ];
    for (rule, built) in builds {
        let violations = match built {
            Err(DefinitionError::CardViolations(v) | DefinitionError::SkillViolations(v)) => v,
            Err(other) => panic!("{rule}: refused for another reason: {other}"),
            Ok(_) => panic!("{rule}: the builder accepted the text"),
        };
        assert!(violations.iter().any(|v| v.rule == rule), "{rule}: {violations:?}");
    }
    let skill = "---\nname: connector-im-rules\n---\nReply with a message; attach a file from the conversation.\n";
    assert!(
        validate_skill(skill, &CardFacts::from_value(&json!({"connector_card_id": "im.rules"})))
            .valid
    );
    let built = builder()
        .tool(ToolSpec::new("rules_ping", "Ping\n\nAnswers a message."), ping)
        .skill(skill)
        .build();
    assert!(built.is_ok(), "plain texts are accepted");
}
