//! The all-judges agreement test (issue 22): every packet fixture of the workspace and every
//! mutation of the validator's mutation set goes through every judge, and all give the same
//! verdict and the same rule ids:
//!
//! - `xagent-connector check packet --card --sender` (the real binary on every fixture; its
//!   library function `check_text_from` on the mutations);
//! - the C ABI (`xagent_validate_packet_from` for the report, `xagent_packet_is_valid` for the
//!   hot-path verdict);
//! - the connection core's packet rules (`xagent_connection::Rules`), what both runtimes' read
//!   loops apply on receive (the server's with xAgent as sender, the client's with the
//!   Connector) and the xAgent writer applies on send;
//! - `client-runtime` on receive and on send: `Validator::check_decoded` on the decoded packet
//!   with the Connector (receive) or xAgent (send) as sender, the entry point the core's rules
//!   call;
//!   plus, for a `chat.message`, the typed IM check (`validate_chat_message`) the IM builders
//!   apply before sending.
//!
//! Judged without a sender, the report must be valid exactly when it is valid for both senders,
//! and `xagent_packet_is_valid` with `XAGENT_SENDER_UNKNOWN` gives that verdict too (what its
//! doc promises).
//!
//! Cards (issue 38): every Card fixture and a mutation per Card rule of the IM Profiles go
//! through `xagent-connector check card` (the binary and `check_text`), the C ABI
//! (`xagent_validate_card`) and xAgent's admission (`check_card`), which all give the same
//! verdict and rule ids. (The Connector's build runs the same `validate_card` on the Card it
//! generates: `server-runtime/tests/rules_agreement.rs`.)
//!
//! Skills (issue 34, item 7): each Skill fixture of the C ABI's data goes through `check skill`
//! (the binary and `check_text`), the C ABI (`xagent_validate_skill`) and admission, with the
//! same verdict and rule ids; the Card mutations include the texts the model reads.

#[path = "../../protocol-validate/tests/support/corpus.rs"]
mod corpus;

use std::process::Command;
use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::Value;
use xagent_connection::Rules;
use xagent_protocol_types::{ConnectorCard, Packet, PacketBody, Side};
use xagent_protocol_validate::{
    AdmissionWindow, CardFacts, DocumentKind, PacketContext, Report, Validator, check_text_from,
};
use xagent_validate_ffi::{
    XAGENT_SENDER_CONNECTOR, XAGENT_SENDER_UNKNOWN, XAGENT_SENDER_XAGENT, card_report,
    packet_is_valid_from, packet_report_from, skill_report,
};

struct Judges {
    card_text: String,
    facts: CardFacts,
    typed_facts: CardFacts,
    server: Rules,
    validator: Validator,
}

fn judges() -> &'static Judges {
    static JUDGES: OnceLock<Judges> = OnceLock::new();
    JUDGES.get_or_init(|| {
        let card_text = std::fs::read_to_string(corpus::card_path()).expect("card fixture");
        let card: ConnectorCard = serde_json::from_str(&card_text).expect("a typed Card");
        Judges {
            facts: corpus::card(),
            typed_facts: CardFacts::from_card(&card),
            server: Rules::new(Side::Xagent, AdmissionWindow::default()),
            validator: Validator::new().with_window(AdmissionWindow::default()),
            card_text,
        }
    })
}

fn rule_ids(report: &Report) -> Vec<String> {
    report.errors().map(|v| v.rule.clone()).collect()
}

fn c_sender(sender: Option<Side>) -> i32 {
    match sender {
        Some(Side::Connector) => XAGENT_SENDER_CONNECTOR,
        Some(Side::Xagent) => XAGENT_SENDER_XAGENT,
        None => XAGENT_SENDER_UNKNOWN,
    }
}

/// What a runtime's receive or send path decides: decode, then the typed rules (the report
/// when they refuse); a packet the decoder refuses gets the report form's report.
fn runtime_verdict(text: &str, facts: &CardFacts, sender: Side) -> Result<(), Report> {
    let validator = &judges().validator;
    let context = PacketContext { card: Some(facts), sender: Some(sender) };
    match Packet::decode_str(text) {
        Ok(packet) => validator.check_decoded(&packet, text.as_bytes(), context),
        Err(_) => Err(validator.packet_bytes(text.as_bytes(), context)),
    }
}

/// Runs `text` through every judge for `sender` and asserts they agree; returns the verdict.
#[track_caller]
fn assert_judges_agree(name: &str, text: &str, sender: Side) -> bool {
    let judges = judges();
    let cli = check_text_from(DocumentKind::Packet, text, Some(&judges.facts), Some(sender));
    let expected = rule_ids(&cli);
    let what = |judge: &str| format!("{name} (sent by {sender:?}): {judge} disagrees with check");

    // The C ABI: the same report, byte for byte, and the hot-path verdict.
    let ffi = packet_report_from(
        text.as_bytes(),
        Some(judges.card_text.as_bytes()),
        c_sender(Some(sender)),
    );
    assert_eq!(ffi, cli.to_json(), "{}", what("the C ABI report"));
    let hot = packet_is_valid_from(
        text.as_bytes(),
        Some(judges.card_text.as_bytes()),
        c_sender(Some(sender)),
    );
    assert_eq!(hot, Some(cli.valid), "{}", what("xagent_packet_is_valid"));

    // The runtimes: the server on receive (from xAgent), the client on receive (from the
    // Connector) and on send (as xAgent). Each with the Card's facts as it builds them.
    let mut runtimes: Vec<(&str, Result<(), Report>)> = Vec::new();
    match sender {
        Side::Xagent => {
            let server = judges.server.judge(text, Some(&judges.typed_facts));
            runtimes.push(("server-runtime on receive (the core's rules)", server.map(drop)));
            runtimes.push((
                "client-runtime on send",
                runtime_verdict(text, &judges.typed_facts, Side::Xagent),
            ));
        }
        Side::Connector => {
            runtimes.push((
                "client-runtime on receive",
                runtime_verdict(text, &judges.typed_facts, Side::Connector),
            ));
        }
    }
    for (judge, verdict) in runtimes {
        assert_eq!(verdict.is_ok(), cli.valid, "{}: {verdict:?} vs {cli:?}", what(judge));
        if let Err(report) = verdict {
            assert_eq!(rule_ids(&report), expected, "{}", what(judge));
        }
    }

    // The typed IM checks the senders apply to a chat.message (the IM builders) and a
    // message.push (the Connector's outbox): they refuse exactly when check reports an IM
    // payload rule, and name one of those rules. (On receive, the core's rules alone judge.)
    let im_rules: Vec<&String> = expected
        .iter()
        .filter(|r| {
            xagent_protocol_validate::rules::by_id(r).is_some_and(|rule| {
                rule.id.starts_with("im")
                    || rule.id.starts_with("chat_")
                    || rule.id.starts_with("message_push.")
            })
        })
        .collect();
    // (A push's error shares its variants with IM v2, so only its verdict is compared.)
    let typed = Packet::decode_str(text).ok().and_then(|packet| match packet.body {
        PacketBody::ChatMessage(message) => {
            Some((xagent_profile_im::validate_chat_message(&message, sender), true))
        }
        PacketBody::MessagePush(push) => {
            Some((xagent_profile_im::validate_message_push_for(&push, &judges.typed_facts), false))
        }
        _ => None,
    });
    if let Some((typed, same_rule)) = typed {
        match typed {
            Ok(()) => {
                assert!(im_rules.is_empty(), "{}: {im_rules:?}", what("validate_chat_message"))
            }
            Err(error) => assert!(
                !im_rules.is_empty() && (!same_rule || im_rules.iter().any(|r| *r == error.rule())),
                "{}: {error:?} ({}) vs {im_rules:?}",
                what("validate_chat_message"),
                error.rule()
            ),
        }
    }
    cli.valid
}

/// Judged without a sender: valid exactly when valid from both senders, and the C ABI agrees.
#[track_caller]
fn assert_no_sender_agrees(name: &str, text: &str, from_connector: bool, from_xagent: bool) {
    let judges = judges();
    let report = check_text_from(DocumentKind::Packet, text, Some(&judges.facts), None);
    assert_eq!(report.valid, from_connector && from_xagent, "{name}: without a sender {report:?}");
    let ffi = packet_report_from(
        text.as_bytes(),
        Some(judges.card_text.as_bytes()),
        XAGENT_SENDER_UNKNOWN,
    );
    assert_eq!(ffi, report.to_json(), "{name}: the C ABI without a sender");
    let hot = packet_is_valid_from(
        text.as_bytes(),
        Some(judges.card_text.as_bytes()),
        XAGENT_SENDER_UNKNOWN,
    );
    assert_eq!(hot, Some(report.valid), "{name}: xagent_packet_is_valid without a sender");
}

fn judge_everywhere(name: &str, value: &Value) {
    let text = value.to_string();
    let from_connector = assert_judges_agree(name, &text, Side::Connector);
    let from_xagent = assert_judges_agree(name, &text, Side::Xagent);
    assert_no_sender_agrees(name, &text, from_connector, from_xagent);
}

#[test]
fn every_judge_agrees_on_every_packet_fixture() {
    let fixtures = corpus::fixtures();
    for (name, value) in &fixtures {
        judge_everywhere(name, value);
    }
    for (name, value) in corpus::bases().iter().enumerate() {
        judge_everywhere(&format!("base {name}"), value);
    }
}

/// Every Card fixture of the workspace (the directories the Go package's goldens read).
fn card_fixtures() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for dir in [
        "protocol-validate/tests/fixtures",
        "protocol-types/tests/fixtures/examples",
        "validate-ffi/tests/data",
        "cli/tests/fixtures",
    ] {
        let Ok(entries) = std::fs::read_dir(corpus::root().join(dir)) else { continue };
        let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let Ok(value) = serde_json::from_str::<Value>(&text) else { continue };
            if value.get("schema").and_then(Value::as_str) == Some("xagent.connector/v1") {
                out.push((path.display().to_string(), value));
            }
        }
    }
    out
}

/// Mutations of the reference Card, one per Card rule of the IM Profiles (issue 38).
fn card_mutations() -> Vec<(&'static str, Value)> {
    let base = corpus::read(&corpus::card_path());
    let mut both = base.clone();
    both["supports"]["profiles"] = serde_json::json!(["xagent.im.v1", "xagent.im.v2"]);
    let mut target = base.clone();
    target["tools"][0]["input_schema"]["properties"]["contact_id"] =
        serde_json::json!({"type": "string"});
    let mut nested = base.clone();
    nested["tools"][0]["input_schema"]["properties"]["to"] = serde_json::json!({
        "type": "object", "properties": {"chatId": {"type": "string"}}
    });
    let mut wire = base.clone();
    wire["tools"][0]["description"] =
        serde_json::json!("Sends a text. For a file, POST /files/uploads first.");
    let mut wire_schema = base;
    wire_schema["tools"][0]["input_schema"]["properties"]["text"]["description"] =
        serde_json::json!("The text of the chat.message to send.");
    vec![
        ("card.tool_wire_reference", wire),
        ("card.tool_wire_reference", wire_schema),
        ("card.im_profiles_exclusive", both),
        ("card.im_tool_target_argument", target),
        ("card.im_tool_target_argument", nested),
    ]
}

/// Every Card judge on one Card: the library form of `check card`, the C ABI and admission.
#[track_caller]
fn assert_card_judges_agree(name: &str, card: &Value) -> Report {
    let text = card.to_string();
    let cli = xagent_protocol_validate::check_text(DocumentKind::Card, &text, None);
    assert_eq!(card_report(text.as_bytes()), cli.to_json(), "{name}: the C ABI");
    // Admission fetches the Skill too: give it the primary Skill the Card's Tools relate.
    let primary = card
        .get("connector_card_id")
        .and_then(Value::as_str)
        .map(xagent_protocol_types::primary_skill_name);
    let skill = match primary {
        Some(name) => {
            xagent_client_runtime::SkillDocument::Present(format!("---\nname: {name}\n---\n"))
        }
        None => xagent_client_runtime::SkillDocument::Absent,
    };
    let admitted = xagent_client_runtime::admission::check_card(
        card,
        &skill,
        &AdmissionWindow::default(),
        None,
    );
    assert_eq!(admitted.is_ok(), cli.valid, "{name}: admission {admitted:?} vs {cli:?}");
    if let Err(refusal) = &admitted {
        for rule in rule_ids(&cli) {
            assert!(refusal.contains(&format!("[{rule}]")), "{name}: admission omits {rule}");
        }
    }
    cli
}

#[test]
fn every_card_judge_agrees_on_every_card_fixture_and_mutation() {
    let fixtures = card_fixtures();
    assert!(fixtures.len() >= 6, "found only {} Card fixtures", fixtures.len());
    for (name, card) in &fixtures {
        assert_card_judges_agree(name, card);
    }
    for (rule, card) in card_mutations() {
        let report = assert_card_judges_agree(rule, &card);
        assert!(report.has(rule) && !report.valid, "{rule}: {report:?}");
    }
}

/// Issue 34 item 7: every Skill judge on each Skill fixture of the C ABI's data (its `SKILL.md`
/// and `SKILL-wire-reference.md`, which names the Transfer Plane and a packet) against that
/// Card: `xagent-connector check skill` (the binary and `check_text`), the C ABI
/// (`xagent_validate_skill`) and xAgent's admission (`check_card` with the served Skill) give
/// the same verdict and rule ids. (The Connector's build: `server-runtime/tests/rules_agreement.rs`.)
#[test]
fn every_skill_judge_agrees_on_every_skill_fixture() {
    let dir = corpus::root().join("validate-ffi/tests/data");
    let card_path = dir.join("card.json");
    let card_text = std::fs::read_to_string(&card_path).expect("the C ABI's Card");
    let card: Value = serde_json::from_str(&card_text).expect("a JSON Card");
    let facts = CardFacts::from_value(&card);
    let mut refused = 0;
    for name in ["SKILL.md", "SKILL-wire-reference.md"] {
        let path = dir.join(name);
        let skill = std::fs::read_to_string(&path).expect("a Skill fixture");
        let cli = xagent_protocol_validate::check_text(DocumentKind::Skill, &skill, Some(&facts));
        assert_eq!(
            skill_report(skill.as_bytes(), card_text.as_bytes()),
            cli.to_json(),
            "{name}: the C ABI"
        );
        let output = Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
            .args(["check", "skill", "--format", "json", "--card"])
            .arg(&card_path)
            .arg(&path)
            .output()
            .expect("runs");
        let report: Report = serde_json::from_slice(&output.stdout).expect("a JSON report");
        assert_eq!(report, cli, "{name}: the binary");
        let admitted = xagent_client_runtime::admission::check_card(
            &card,
            &xagent_client_runtime::SkillDocument::Present(skill.clone()),
            &AdmissionWindow::default(),
            None,
        );
        assert_eq!(admitted.is_ok(), cli.valid, "{name}: admission {admitted:?} vs {cli:?}");
        if let Err(refusal) = &admitted {
            refused += 1;
            for rule in rule_ids(&cli) {
                assert!(refusal.contains(&format!("[{rule}]")), "{name}: admission omits {rule}");
            }
        }
    }
    assert_eq!(refused, 1, "SKILL-wire-reference.md is refused, SKILL.md admitted");
}

/// The binary on the Card fixtures: the same report as its library function.
#[test]
fn check_card_binary_agrees_with_its_library_function_on_every_card_fixture() {
    for (name, card) in card_fixtures() {
        let output = Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
            .args(["check", "card", "--format", "json"])
            .arg(&name)
            .output()
            .expect("runs");
        let report: Report = serde_json::from_slice(&output.stdout).expect("a JSON report");
        let library =
            xagent_protocol_validate::check_text(DocumentKind::Card, &card.to_string(), None);
        assert_eq!(report, library, "{name}");
        assert_eq!(output.status.code(), Some(if library.valid { 0 } else { 1 }), "{name}");
    }
}

/// The real binary on every fixture: the same report as its library function.
#[test]
fn check_packet_binary_agrees_with_its_library_function_on_every_fixture() {
    let dir = std::env::temp_dir().join(format!("xagent-judges-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let card = corpus::card_path();
    for (i, (name, value)) in corpus::fixtures().iter().enumerate() {
        let file = dir.join(format!("packet-{i}.json"));
        std::fs::write(&file, value.to_string()).expect("write");
        for (flag, sender) in [
            (Some("connector"), Some(Side::Connector)),
            (Some("xagent"), Some(Side::Xagent)),
            (None, None),
        ] {
            let mut command = Command::new(env!("CARGO_BIN_EXE_xagent-connector"));
            command.args(["check", "packet", "--format", "json", "--card"]).arg(&card).arg(&file);
            if let Some(flag) = flag {
                command.args(["--sender", flag]);
            }
            let output = command.output().expect("runs");
            let report: Report = serde_json::from_slice(&output.stdout).expect("a JSON report");
            let library = check_text_from(
                DocumentKind::Packet,
                &value.to_string(),
                Some(&judges().facts),
                sender,
            );
            assert_eq!(report, library, "{name} (--sender {flag:?})");
            assert_eq!(output.status.code(), Some(if library.valid { 0 } else { 1 }), "{name}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn every_judge_agrees_on_mutated_packets(
        base in 0usize..9,
        first in (0usize..4, 0usize..64, 0usize..3, 0usize..32),
        second in proptest::option::of((0usize..4, 0usize..64, 0usize..3, 0usize..32)),
    ) {
        let bases = corpus::bases();
        let start = &bases[base % bases.len()];
        let mut value = corpus::mutate(start, first.0, first.1, first.2, first.3);
        if let Some((a, k, o, v)) = second {
            value = corpus::mutate(&value, a, k, o, v);
        }
        judge_everywhere(&format!("mutation of base {base}: {value}"), &value);
    }
}
