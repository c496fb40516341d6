//! The conformance suite against the server-runtime echo connector: every check passes.

use std::time::Duration;

use xagent_client_runtime::BaseUrl;
use xagent_client_runtime::conformance::{ConformanceOptions, Status, run};
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
