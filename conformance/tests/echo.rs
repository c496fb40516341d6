//! The conformance suite against the server-runtime echo connector: every check passes.

use std::time::Duration;

use xagent_client_runtime::BaseUrl;
use xagent_conformance::{ConformanceOptions, Status, run};
use xagent_protocol_types::{AuthInput, Secret};
use xagent_testkit::{ECHO_FLOW, EchoServer, temp_state_dir};

const API_KEY: &str = "sk-conformance-test-55e1";

async fn echo_server() -> (EchoServer, String) {
    let server = EchoServer::start(&temp_state_dir("conformance"), API_KEY, None)
        .await
        .expect("echo server");
    let base = server.base_url();
    (server, base)
}

fn options(base: &str, flow: bool) -> ConformanceOptions {
    let mut options = ConformanceOptions::new(BaseUrl::parse(base).expect("base"));
    options.api_key = Some(Secret::new(API_KEY));
    options.timeout = Duration::from_secs(5);
    if flow {
        options.flow = Some(ECHO_FLOW.into());
        options.inputs = AuthInput::default().with("token", "tok-conformance");
    }
    options
}

#[tokio::test]
async fn every_check_passes_against_the_echo_connector_with_a_flow() {
    let (_server, base) = echo_server().await;
    let report = run(options(&base, true)).await;
    println!("{}", report.to_text(false));
    assert!(report.passed(), "{}", report.to_text(false));
    assert_eq!(report.count(Status::Skipped), 0, "{}", report.to_text(false));
    assert!(report.count(Status::Pass) >= 30);
}

#[tokio::test]
async fn without_a_flow_the_authenticated_checks_are_skipped_not_failed() {
    let (_server, base) = echo_server().await;
    let report = run(options(&base, false)).await;
    assert!(report.passed(), "{}", report.to_text(false));
    assert_eq!(report.check("auth.flow").map(|c| c.status), Some(Status::Skipped));
}

#[tokio::test]
async fn tool_checks_run_a_success_an_invalid_arguments_and_a_repeated_call() {
    let (server, base) = echo_server().await;
    let mut options = options(&base, true);
    let arguments = serde_json::json!({"text": "from conformance"});
    options.tools = vec![("echo_send".into(), arguments.as_object().cloned().unwrap_or_default())];
    let report = run(options).await;
    for id in
        ["tool.echo_send.success", "tool.echo_send.invalid_arguments", "tool.echo_send.repeat"]
    {
        assert_eq!(
            report.check(id).map(|c| c.status),
            Some(Status::Pass),
            "{id}: {}",
            report.to_text(false)
        );
    }
    // The repeat did not send twice.
    let sent = server.echo.log().sent.iter().filter(|(_, t)| t == "from conformance").count();
    assert_eq!(sent, 1);
}

#[tokio::test]
async fn conformance_rule_a_401_passes_no_check_and_a_missing_key_is_named() {
    let (_server, base) = echo_server().await;
    let mut options = options(&base, true);
    options.api_key = None;
    let report = run(options).await;
    let subprotocol = report.check("ws.subprotocol_required").expect("reported");
    assert_eq!(subprotocol.status, Status::Skipped, "{}", report.to_text(false));
    assert!(subprotocol.detail.contains("--api-key"), "{}", subprotocol.detail);
    let echoed = report.check("ws.subprotocol_echoed").expect("reported");
    assert!(echoed.detail.contains("no --api-key was given"), "{}", echoed.detail);
}

#[tokio::test]
async fn conformance_rule_a_failed_sign_in_reports_the_signed_in_checks_skipped_with_the_reason() {
    let (_server, base) = echo_server().await;
    let mut options = options(&base, true);
    options.inputs = AuthInput::default().with("token", xagent_testkit::ECHO_BAD_TOKEN);
    options.tools = vec![("echo_send".into(), Default::default())];
    let report = run(options).await;
    assert_eq!(report.check("auth.flow").map(|c| c.status), Some(Status::Fail));
    for id in [
        "descriptor.tool_not_in_card",
        "im.message_accepted",
        "auth.logout",
        "tool.echo_send.success",
    ] {
        let check = report.check(id).expect("reported");
        assert_eq!(check.status, Status::Skipped, "{id}");
        assert!(check.detail.contains("refused the token"), "{id}: {}", check.detail);
    }
}
