//! Every long-running command stops cleanly on SIGTERM (what service managers and
//! `docker stop` send), not only on Ctrl-C: `homie` against a real Mosquitto broker, and the
//! `mcp` bridge over stdio and over streamable HTTP in front of the echo Connector. Each runs
//! as the real `xagent-connector` process and must exit with status 0 (a process that does
//! not handle SIGTERM dies of it, with no exit code). `webchat`'s own test is in webchat.rs.
#![cfg(unix)]

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use xagent_connector_homie::testing::Mosquitto;
use xagent_testkit::{ECHO_FLOW, EchoServer, line_containing, temp_state_dir, terminate};

const API_KEY: &str = "sk-cli-stop-5c1d";

fn bin(command: &str) -> tokio::process::Command {
    let mut bin = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"));
    bin.arg(command)
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    bin
}

/// `GET {base}/health` with the API key answers 200: the server is serving.
async fn healthy(base: &str) -> bool {
    let answer =
        reqwest::Client::new().get(format!("{base}/health")).bearer_auth(API_KEY).send().await;
    answer.is_ok_and(|answer| answer.status() == reqwest::StatusCode::OK)
}

/// `mcp` in front of a fresh echo Connector, signing in with the echo flow.
async fn mcp(name: &str, extra: &[&str]) -> (tokio::process::Child, EchoServer) {
    let echo = EchoServer::start(&temp_state_dir(&format!("cli-stop-{name}")), API_KEY, None)
        .await
        .expect("echo server");
    let child = bin("mcp")
        .args(["--base-url", &echo.base_url(), "--flow", ECHO_FLOW, "--input", "token=tok-stop"])
        .arg("--state-dir")
        .arg(temp_state_dir(&format!("cli-stop-{name}-bridge")))
        .args(extra)
        .stdin(Stdio::piped())
        .spawn()
        .expect("starts");
    (child, echo)
}

#[tokio::test(flavor = "multi_thread")]
async fn homie_stops_cleanly_on_sigterm() {
    let broker = Mosquitto::start().expect("mosquitto");
    let mut child = bin("homie")
        .args(["--listen", "127.0.0.1:0", "--mqtt-url", &broker.url()])
        .args(["--pairing-code", "stop-test-device=stop-code-1234"])
        .arg("--state-dir")
        .arg(temp_state_dir("cli-stop-homie"))
        .spawn()
        .expect("starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = line_containing(&mut stdout, "device.homie listening on").await;
    let base = line.split_whitespace().nth(3).expect("the Base URL").to_owned();
    assert!(healthy(&base).await, "serving before the signal");
    let status = terminate(&mut child).await;
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean shutdown, not a kill: {status:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_over_stdio_stops_cleanly_on_sigterm() {
    let (mut child, echo) = mcp("stdio", &[]).await;
    // The bridge answers `initialize` only once it serves (and listens for the signal).
    let mut stdin = child.stdin.take().expect("stdin");
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"stop-test","version":"1"}}}"#;
    stdin.write_all(format!("{initialize}\n").as_bytes()).await.expect("writes");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    line_containing(&mut stdout, r#""id":1"#).await;
    // stdin stays open: only the signal can end it.
    let status = terminate(&mut child).await;
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean shutdown, not a kill: {status:?}");
    drop(stdin);
    echo.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_over_http_stops_cleanly_on_sigterm() {
    let (mut child, echo) = mcp("http", &["--http", "127.0.0.1:0"]).await;
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let line = line_containing(&mut stderr, "MCP over streamable HTTP at").await;
    let url = line.rsplit(' ').next().expect("the MCP URL").to_owned();
    let answer = reqwest::Client::new().get(&url).send().await;
    assert!(answer.is_ok(), "serving before the signal: {answer:?}");
    let status = terminate(&mut child).await;
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean shutdown, not a kill: {status:?}");
    echo.stop().await;
}
