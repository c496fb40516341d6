//! The xAgent stand-ins against `im.webchat` (issue 22, item 6): `xagent-connector mock-xagent
//! --tool` and the `minimal_xagent` example sign in to a room with its two-field flow and call
//! `webchat_message_send` with only `{"text": ...}`, as a new user would, and the call runs.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use xagent_connector_webchat::{ROOM_FLOW, TOOL_MESSAGE_SEND, Webchat, WebchatOptions};
use xagent_protocol_types::Secret;
use xagent_testkit::{Serving, bind_local, temp_state_dir};

/// The example program itself, compiled into this test (a test cannot run another package's
/// example binary): the test runs its own sign-in and call.
#[allow(dead_code)]
#[path = "../../client-runtime/examples/minimal_xagent.rs"]
mod minimal_xagent;

const API_KEY: &str = "sk-stand-ins-8d2b61";

/// `im.webchat` in this process on 127.0.0.1 (fresh state); returns its Base URL.
async fn webchat(name: &str) -> (Serving, String) {
    let dir = temp_state_dir(name);
    let listener = bind_local(None).await.expect("binds");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let options = WebchatOptions::new(&dir, base.clone()).with_api_key(Secret::new(API_KEY));
    let webchat = Webchat::open(options).await.expect("opens");
    let serving = Serving::spawn(listener, |listener, shutdown| async move {
        let _ = webchat.serve(listener, shutdown).await;
    });
    (serving, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_mock_xagent_tool_calls_run_against_webchat_without_the_channel_argument() {
    let (serving, base) = webchat("mock-tool").await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .env("RUST_LOG", "warn")
        .args(["mock-xagent", "--base-url", &base, "--flow", ROOM_FLOW])
        .args(["--input", "room_name=Lobby", "--input", "access_code=code-1234"])
        .args(["--input", "owner_code=owner-1234"])
        .args(["--tool", TOOL_MESSAGE_SEND, "--args", r#"{"text":"hi"}"#])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starts");
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let success = format!("tool {TOOL_MESSAGE_SEND} on ");
    let mut errors = Vec::new();
    let outcome = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            tokio::select! {
                line = out.next_line() => match line {
                    Ok(Some(line)) if line.starts_with(&success) => return Ok(line),
                    Ok(Some(_)) => {}
                    _ => return Err("stdout ended".to_owned()),
                },
                line = err.next_line() => match line {
                    Ok(Some(line)) if line.contains("failed") => return Err(line),
                    Ok(Some(line)) => errors.push(line),
                    _ => {}
                },
            }
        }
    })
    .await;
    let line = match outcome {
        Ok(Ok(line)) => line,
        Ok(Err(failure)) => panic!("mock-xagent's call failed: {failure} (stderr: {errors:?})"),
        Err(_) => panic!("mock-xagent printed no tool outcome within 30 s (stderr: {errors:?})"),
    };
    assert!(line.contains(r#""status":"sent""#), "{line}");
    drop(child);
    serving.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_minimal_xagent_signs_in_with_every_form_field_and_its_tool_call_runs() {
    let (serving, base) = webchat("minimal-xagent").await;
    let args: Vec<String> = [
        base.as_str(),
        API_KEY,
        ROOM_FLOW,
        "room_name=Lobby",
        "access_code=code-1234",
        "owner_code=owner-1234",
        TOOL_MESSAGE_SEND,
        r#"{"text":"hi"}"#,
    ]
    .map(str::to_owned)
    .to_vec();
    let parsed = minimal_xagent::parse(&args).expect("the command line parses");
    let (plane, _events, outcome) =
        minimal_xagent::sign_in_and_call(parsed).await.expect("signs in and calls the Tool");
    let result = outcome.ack.result.expect("a result");
    assert_eq!(result["status"], json!("sent"), "{result}");
    assert!(minimal_xagent::parse(&args[..4]).is_err(), "a Tool and its arguments are needed");
    plane.close().await;
    serving.stop().await;
}
