//! `xagent-connector conformance` and `mock-xagent`, run as processes against the echo
//! connector served on 127.0.0.1.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use xagent_testkit::{ECHO_FLOW, EchoServer, temp_state_dir};

const API_KEY: &str = "sk-cli-conformance-2b7e";

async fn echo() -> String {
    let server = EchoServer::start(&temp_state_dir("cli-conformance"), API_KEY, None)
        .await
        .expect("echo server");
    let base = server.base_url();
    // Kept running for the rest of the test process.
    std::mem::forget(server);
    base
}

fn bin() -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"));
    command.env("NO_COLOR", "1").env_remove("XAGENT_CONNECTOR_API_KEY");
    command
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_passes_against_the_echo_connector_and_prints_json() {
    let base = echo().await;
    let output = bin()
        .args(["conformance", "--base-url", &base, "--api-key", API_KEY, "--flow", ECHO_FLOW])
        .args(["--input", "token=tok-cli", "--format", "json"])
        .output()
        .await
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert_eq!(report["passed"], true);
    assert_eq!(report["summary"]["fail"], 0);
    assert!(report["checks"].as_array().is_some_and(|c| c.len() >= 30));
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_fails_with_exit_1_when_the_key_is_wrong() {
    let base = echo().await;
    let output = bin()
        .args(["conformance", "--base-url", &base, "--api-key", "not-the-key"])
        .output()
        .await
        .expect("runs");
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("FAIL"), "{stdout}");
    assert!(!stdout.contains("not-the-key"), "the key must not be printed");
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_usage_errors_exit_2() {
    let output = bin().args(["conformance", "--base-url", "ftp://x"]).output().await.expect("runs");
    assert_eq!(output.status.code(), Some(2));
    let output = bin()
        .args([
            "conformance",
            "--base-url",
            "http://127.0.0.1:9",
            "--flow",
            "f",
            "--input",
            "novalue",
        ])
        .output()
        .await
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn mock_xagent_prints_the_packets_it_exchanges() {
    let base = echo().await;
    let mut child = bin()
        .args(["mock-xagent", "--base-url", &base, "--api-key", API_KEY, "--flow", ECHO_FLOW])
        .args(["--input", "token=tok-mock"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawns");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    let outcome = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push(line.clone());
            if line.contains("auth.start.ack") {
                return true;
            }
        }
        false
    })
    .await;
    let _ = child.kill().await;
    assert_eq!(outcome, Ok(true), "output so far: {seen:#?}");
    let text = seen.join("\n");
    assert!(text.contains("admitted im.echo"));
    assert!(text.contains("xagent -> connector") && text.contains("\"type\":\"connector.hello\""));
    assert!(text.contains("connector -> xagent") && text.contains("connector.hello.ack"));
    assert!(text.contains("channel.open.ack"));
    assert!(!text.contains("tok-mock"), "form secrets are not printed back by the Connector");
}

#[tokio::test(flavor = "multi_thread")]
async fn mock_xagent_log_redacts_signed_urls() {
    let server = EchoServer::start(&temp_state_dir("cli-mock-redact"), API_KEY, None)
        .await
        .expect("echo server");
    let mut child = bin()
        .args(["mock-xagent", "--base-url", &server.base_url(), "--api-key", API_KEY])
        .args(["--flow", ECHO_FLOW, "--input", "token=tok-mock"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawns");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    let signed_in = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push(line.clone());
            if line.contains("auth.start.ack") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(signed_in, Ok(true), "output so far: {seen:#?}");
    // The Connector sends a file through a signed URL, valid for minutes.
    let handle = server.server.handle();
    let channel = handle.channels().into_iter().next().expect("the mock's channel");
    let file = handle
        .register_file(&channel, "in.txt", Some("text/plain"), b"a signed file")
        .await
        .expect("registered");
    let url = file.download_url.clone().expect("a signed download_url");
    let query = url.split_once('?').map(|(_, q)| q.to_owned()).expect("a signature");
    let message = xagent_protocol_types::ChatMessage::with_files(
        "in_signed_1",
        Some("hi".into()),
        vec![file],
    );
    handle.send_message(&channel, message).await.expect("sent");
    let acked = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push(line.clone());
            if line.contains("chat.message.ack") {
                return true;
            }
        }
        false
    })
    .await;
    let _ = child.kill().await;
    assert_eq!(acked, Ok(true), "output so far: {seen:#?}");
    let text = seen.join("\n");
    assert!(text.contains("\"type\":\"chat.message\""), "{text}");
    assert!(!text.contains(&query), "the signature is printed: {text}");
    assert!(!text.contains("sig="), "{text}");
    assert!(text.contains("13 bytes downloaded"), "the mock downloads as xAgent would: {text}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mock_xagent_reports_each_repeated_call_with_its_own_id_for_a_harness() {
    let server = EchoServer::start(&temp_state_dir("cli-mock-report"), API_KEY, None)
        .await
        .expect("echo server");
    let mut child = bin()
        .args(["mock-xagent", "--base-url", &server.base_url(), "--api-key", API_KEY])
        .args(["--flow", ECHO_FLOW, "--input", "token=tok-mock", "--report-json"])
        .args(["--tool", "echo_send", "--args", r#"{"text":"hi {call}"}"#])
        .args(["--repeat-every", "50", "--say"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawns");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut reports: Vec<Value> = Vec::new();
    let enough = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(value) = serde_json::from_str::<Value>(&line)
                && value.get("report").is_some()
            {
                reports.push(value);
            }
            let ok = reports.iter().filter(|r| r["report"] == "tool" && r["ok"] == true).count();
            let queued = reports.iter().filter(|r| r["report"] == "queued").count();
            if ok >= 3 && queued >= 1 {
                return true;
            }
        }
        false
    })
    .await;
    let _ = child.kill().await;
    assert_eq!(enough, Ok(true), "reports so far: {reports:#?}");
    assert!(reports.iter().any(|r| r["report"] == "online"), "{reports:#?}");
    assert!(reports.iter().all(|r| r["at"].as_u64().is_some()), "every line is timed");
    let calls: Vec<&str> = reports
        .iter()
        .filter(|r| r["report"] == "tool" && r["ok"] == true)
        .filter_map(|r| r["call"].as_str())
        .collect();
    let distinct: std::collections::HashSet<&&str> = calls.iter().collect();
    assert_eq!(distinct.len(), calls.len(), "every call has its own id: {calls:?}");
    let sent: Vec<String> = server.echo.log().sent.iter().map(|(_, text)| text.clone()).collect();
    for call in &calls {
        assert!(sent.contains(&format!("hi {call}")), "{call} is in its call's text: {sent:?}");
    }
    server.stop().await;
}
