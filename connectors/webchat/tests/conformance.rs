//! The black-box conformance suite (`xagent-conformance`) against a running `im.webchat`
//! with the `webchat_room` form flow: every check passes.

mod support;

use xagent_conformance::{ConformanceOptions, Status, run};
use xagent_connector_webchat::ROOM_FLOW;
use xagent_protocol_types::{AuthInput, Secret};

use support::{API_KEY, start, temp_dir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_passes_with_the_room_form_flow() {
    let dir = temp_dir("conformance");
    let server = start(&dir, None).await;
    let mut options = ConformanceOptions::new(server.base());
    options.api_key = Some(Secret::new(API_KEY));
    options.flow = Some(ROOM_FLOW.into());
    options.inputs = AuthInput::default()
        .with("room_name", "conformance")
        .with("access_code", "conf-1234")
        .with("owner_code", "conf-owner-5678");
    let report = run(options).await;
    let text = report.to_text(false);
    assert!(report.passed(), "{text}");
    for id in ["auth.flow", "im.message_accepted", "im.duplicate", "im.conflict", "transfer.upload"]
    {
        let check = report.check(id).unwrap_or_else(|| panic!("{id} ran:\n{text}"));
        assert_eq!(check.status, Status::Pass, "{id}:\n{text}");
    }
    server.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}
