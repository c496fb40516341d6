//! The conformance suite against the server-runtime echo connector: every check passes.

use std::time::Duration;

use xagent_client_runtime::BaseUrl;
use xagent_client_runtime::conformance::{ConformanceOptions, Status, run};
use xagent_protocol_types::{AuthInput, Secret, SystemClock};
use xagent_server_runtime::testing::{ECHO_FLOW, echo_connector};
use xagent_server_runtime::{ConnectorServer, RuntimeConfig};

const API_KEY: &str = "sk-conformance-test-55e1";

async fn echo_server() -> (ConnectorServer, String) {
    let dir = std::env::temp_dir().join(format!(
        "xcr-conformance-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let (connector, _echo) = echo_connector();
    let server = ConnectorServer::builder(connector)
        .config(RuntimeConfig::default())
        .state_dir(&dir)
        .expect("state dir")
        .clock(SystemClock)
        .api_key(Secret::new(API_KEY))
        .build()
        .await
        .expect("server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let running = server.clone();
    tokio::spawn(async move {
        let _ = running.serve(listener, std::future::pending::<()>()).await;
    });
    (server, format!("http://{addr}"))
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
