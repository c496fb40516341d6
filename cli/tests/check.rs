//! `xagent-connector check`, run as a process on valid and invalid files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

fn bin() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_xagent-connector"));
    command.env("NO_COLOR", "1");
    command
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

/// Writes `contents` to a fresh file in a per-test temporary directory.
fn temp_file(test: &str, name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xagent-cli-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn run_stdin(args: &[&str], input: &str) -> Output {
    let mut child = bin()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The process may exit before reading (a usage error): a broken pipe is expected then.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    child.wait_with_output().unwrap()
}

fn json_report(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The rule ids of a JSON report's violations, in order.
fn rules(report: &Value) -> Vec<&str> {
    let violations = report["violations"].as_array().expect("violations");
    violations.iter().map(|v| v["rule"].as_str().expect("rule")).collect()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn valid_card_exits_0() {
    let output = run(&["check", "card", path(&fixture("card.json"))]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stdout));
    // The reference form flow's password field lacks secret: true: one warning line.
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.lines().all(|l| l.starts_with("warning")), "{text}");
    assert!(text.contains("card.auth_field_secret"));
}

#[test]
fn invalid_card_exits_1_with_every_violation_in_json() {
    let mut card = fixture_json("card.json");
    card["schema"] = json!("xagent.connector/v9");
    card["tools"][0]["tool_id"] = json!("bad id");
    let file = temp_file("invalid_card", "card.json", &card.to_string());
    let output = run(&["check", "card", path(&file), "--format", "json"]);
    assert_eq!(output.status.code(), Some(1));
    let report = json_report(&output);
    assert_eq!(report["valid"], false);
    let rules = rules(&report);
    assert!(rules.contains(&"card.schema") && rules.contains(&"card.tool_id_format"), "{rules:?}");
    for v in report["violations"].as_array().unwrap() {
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["rule", "severity", "path", "message"]);
    }
}

#[test]
fn text_format_is_one_violation_a_line() {
    let mut card = fixture_json("card.json");
    card["schema"] = json!("nope");
    card["supports"]["profiles"] = json!([]);
    let file = temp_file("text_format", "card.json", &card.to_string());
    let output = run(&["check", "card", path(&file)]);
    assert_eq!(output.status.code(), Some(1));
    let text = String::from_utf8(output.stdout).unwrap();
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("error")).collect();
    assert!(errors.iter().any(|l| l.contains("card.schema at /schema:")), "{text}");
    assert!(errors.iter().any(|l| l.contains("card.profiles at /supports/profiles:")), "{text}");
    assert!(!text.contains('\x1b'), "no colour when not a terminal");
    assert!(String::from_utf8(output.stderr).unwrap().contains("invalid"));
}

#[test]
fn not_json_exits_1() {
    let file = temp_file("not_json", "card.json", "{ this is not json");
    let output = run(&["check", "card", path(&file), "--format", "json"]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(json_report(&output)["violations"][0]["rule"], "document.not_json");
}

#[test]
fn not_an_object_exits_1() {
    let output = run_stdin(&["check", "packet", "-", "--format", "json"], "[1, 2]");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(json_report(&output)["violations"][0]["rule"], "document.not_object");
}

#[test]
fn missing_file_exits_2() {
    let output = run(&["check", "card", "/definitely/not/here.json"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8(output.stderr).unwrap().contains("cannot read"));
}

#[test]
fn bad_flag_exits_2() {
    assert_eq!(run(&["check", "card", "x.json", "--colour"]).status.code(), Some(2));
    assert_eq!(run(&["check", "card", "x.json", "--format", "yaml"]).status.code(), Some(2));
    assert_eq!(run(&["check", "skill", "SKILL.md"]).status.code(), Some(2), "--card is required");
    assert_eq!(run(&["check"]).status.code(), Some(2));
}

#[test]
fn unreadable_card_reference_exits_2() {
    let bad = temp_file("bad_card_ref", "card.json", "not json");
    let output =
        run(&["check", "descriptor", path(&fixture("descriptor.json")), "--card", path(&bad)]);
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn stdin_for_file_and_card_is_refused() {
    let output = run_stdin(&["check", "descriptor", "-", "--card", "-"], "{}");
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn descriptor_against_card() {
    let card = fixture("card.json");
    let ok =
        run(&["check", "descriptor", path(&fixture("descriptor.json")), "--card", path(&card)]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stdout));
    let mut descriptor = fixture_json("descriptor.json");
    descriptor["connection"]["profiles"] = json!(["xagent.device.v1"]);
    let file = temp_file("descriptor_card", "d.json", &descriptor.to_string());
    let bad = run(&["check", "descriptor", path(&file), "--card", path(&card), "--format", "json"]);
    assert_eq!(bad.status.code(), Some(1));
    let report = json_report(&bad);
    let rules = rules(&report);
    assert!(rules.contains(&"descriptor.profile_not_in_card"), "{rules:?}");
    // Without the Card, the cross-check does not run.
    let alone = run(&["check", "descriptor", path(&file), "--format", "json"]);
    let report = json_report(&alone);
    assert!(!report.to_string().contains("profile_not_in_card"));
}

#[test]
fn packet_from_stdin() {
    let message = std::fs::read_to_string(fixture("chat_message.json")).unwrap();
    let output =
        run_stdin(&["check", "packet", "-", "--card", path(&fixture("card.json"))], &message);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stdout));
    let mut bad = fixture_json("chat_message.json");
    bad["payload"]["text"] = json!("");
    bad["payload"]["files"] = json!([]);
    let output = run_stdin(&["check", "packet", "-", "--format", "json"], &bad.to_string());
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(json_report(&output)["violations"][0]["rule"], "chat_message.content");
}

#[test]
fn skill_against_card() {
    let card = fixture("card.json");
    let ok = run(&["check", "skill", path(&fixture("SKILL.md")), "--card", path(&card)]);
    assert_eq!(ok.status.code(), Some(0));
    let wrong = temp_file("skill", "SKILL.md", "---\nname: im-connector-reply\n---\nbody\n");
    let output = run(&["check", "skill", path(&wrong), "--card", path(&card), "--format", "json"]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(json_report(&output)["violations"][0]["rule"], "skill.name_card");
}

#[test]
fn valid_json_report_shape() {
    let output = run(&["check", "card", path(&fixture("card.json")), "--format", "json"]);
    let report = json_report(&output);
    assert_eq!(report["valid"], true);
    assert!(report["violations"].is_array());
}

/// Issue 22: `check packet` judged with no sender, so a Connector-sent `chat.message` file
/// without `download_url` was reported valid while `client-runtime` refuses it. Without
/// `--sender` the packet is judged for both directions (the violation names the Connector);
/// `--sender connector` refuses it, `--sender xagent` accepts it.
#[test]
fn rule_chat_message_download_url_check_packet_sender() {
    let packet = json!({
        "schema": "xagent.connector.packet/v1", "packet_id": "pkt_1", "type": "chat.message",
        "connector_channel_id": "cch_1", "time": 1790000000000u64,
        "payload": {"message_id": "m1", "files": [{"type": "image", "file_ref": "f1"}]}
    });
    let file = temp_file("sender", "message.json", &packet.to_string());
    let output = run(&["check", "packet", path(&file), "--format", "json"]);
    assert_eq!(output.status.code(), Some(1));
    let report = json_report(&output);
    assert_eq!(rules(&report), vec!["chat_message.download_url"]);
    assert_eq!(report["violations"][0]["sender"], "connector");

    let output =
        run(&["check", "packet", path(&file), "--sender", "connector", "--format", "json"]);
    assert_eq!(output.status.code(), Some(1));
    let report = json_report(&output);
    assert_eq!(rules(&report), vec!["chat_message.download_url"]);
    assert!(report["violations"][0].get("sender").is_none(), "{report}");

    let output = run(&["check", "packet", path(&file), "--sender", "xagent"]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stdout));

    let output = run(&["check", "packet", path(&file), "--sender", "model"]);
    assert_eq!(output.status.code(), Some(2), "an unknown sender is a usage error");
}
