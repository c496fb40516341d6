//! The xAgent-side runtime against the server-runtime echo connector, over real sockets on
//! 127.0.0.1: admission, reconnect after a restart, channel reopen with a new id, tool
//! projection following Descriptor pushes, IM v2 both ways.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use support::{API_KEY, echo_config, quick_backoff, signed_in_channel};
use xagent_client_runtime::{
    BaseUrl, ClientConfig, ClientEvent, ControlPlane, DataPlane, Events, admit, project_tools,
};
use xagent_protocol_types::{
    AckStatus, ChatActivity, ChatMessage, ChatMessageDelta, DescriptorTool, Secret, ToolStatus,
};
use xagent_protocol_validate::AdmissionWindow;
use xagent_testkit::{ECHO_CARD_ID, EchoServer, inject_message, temp_state_dir};

async fn start(dir: &Path, addr: Option<SocketAddr>) -> EchoServer {
    EchoServer::start(dir, API_KEY, addr).await.expect("echo server starts")
}

fn base(server: &EchoServer) -> BaseUrl {
    BaseUrl::parse(&server.base_url()).expect("base url")
}

fn config(base: BaseUrl) -> ClientConfig {
    let mut config = echo_config(base);
    config.backoff = quick_backoff(Duration::from_millis(400));
    config
}

async fn next_event(events: &mut Events, want: impl FnMut(&ClientEvent) -> bool) -> ClientEvent {
    xagent_client_runtime::next_event_matching(events, Duration::from_secs(15), want)
        .await
        .expect("the awaited event arrived within 15 s")
}

/// Section 4.2: a Connector without a Skill answers `/skill.md` with 204 (as this runtime does)
/// or 404; either way it is admitted, with no Skill.
#[tokio::test]
async fn admission_rule_a_connector_without_a_skill_is_admitted_on_204_and_404() {
    use axum::http::StatusCode;
    let connector = xagent_server_runtime::Connector::builder("im.noskill", "No Skill", "1.0.0")
        .target(xagent_protocol_types::TargetDeclaration::new(
            xagent_protocol_types::TargetType::Im,
            "noskill",
            "No Skill",
        ))
        .profile(xagent_protocol_types::PROFILE_IM_V2)
        .on_message(|_, _| async {})
        .build()
        .expect("a valid Connector");
    let server = xagent_server_runtime::ConnectorServer::builder(connector)
        .api_key(Secret::new(API_KEY))
        .build()
        .await
        .expect("builds");
    let answers_204 = xagent_testkit::serve_on_loopback(&server).await;
    // The same Connector behind a router whose `/skill.md` is not found.
    let not_found = axum::Router::new()
        .route("/skill.md", axum::routing::get(|| async { StatusCode::NOT_FOUND }))
        .fallback_service(server.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let answers_404 = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, not_found).await });
    for (addr, status) in [(answers_204, 204), (answers_404, 404)] {
        let base = BaseUrl::parse(&format!("http://{addr}")).expect("base url");
        let http = reqwest::get(format!("http://{addr}/skill.md")).await.expect("answers");
        assert_eq!(http.status().as_u16(), status);
        let control = ControlPlane::new(base, Some(Secret::new(API_KEY)));
        let admitted = admit(&control, &AdmissionWindow::default(), Some("im.noskill"))
            .await
            .unwrap_or_else(|e| panic!("{status}: not admitted: {e}"));
        assert_eq!(admitted.skill, None, "{status}");
    }
}

#[tokio::test]
async fn admission_accepts_the_echo_connector_and_checks_its_key() {
    let server = start(&temp_state_dir("admit"), None).await;
    let control = ControlPlane::new(base(&server), Some(Secret::new(API_KEY)));
    let admitted =
        admit(&control, &AdmissionWindow::default(), Some(ECHO_CARD_ID)).await.expect("admitted");
    assert_eq!(admitted.card.connector_card_id, ECHO_CARD_ID);
    assert!(admitted.skill.as_deref().is_some_and(|s| s.contains("connector-im-echo")));
    let wrong_id = admit(&control, &AdmissionWindow::default(), Some("im.other")).await;
    assert!(wrong_id.is_err(), "a Card other than the configured one is refused");
    let no_key = ControlPlane::new(base(&server), None);
    let refused = admit(&no_key, &AdmissionWindow::default(), None).await;
    assert!(matches!(refused, Err(xagent_client_runtime::ClientError::Unauthorized { .. })));
    server.stop().await;
}

#[tokio::test]
async fn reconnects_after_restart_and_reopens_the_same_channel() {
    let dir = temp_state_dir("restart");
    let server = start(&dir, None).await;
    let addr = server.addr;
    let (plane, mut events) =
        DataPlane::connect(config(base(&server))).await.expect("the data plane starts");
    let first_id = plane.connected().await.expect("connected");
    let channel = signed_in_channel(&plane).await;
    server.stop().await;
    next_event(&mut events, |e| matches!(e, ClientEvent::Disconnected { .. })).await;

    let server = start(&dir, Some(addr)).await;
    let reopened =
        next_event(&mut events, |e| matches!(e, ClientEvent::ChannelReopened { .. })).await;
    let ClientEvent::ChannelReopened { previous, current, descriptor } = reopened else {
        unreachable!()
    };
    assert_eq!(previous, channel);
    assert_eq!(current, channel, "a restarted Connector recognises its persisted channel");
    assert_eq!(descriptor.connection.connector_channel_id, channel);
    assert_eq!(
        plane.connected().await.expect("reconnected"),
        first_id,
        "same connector_id after restart"
    );
    plane.ping().await.expect("ping after reconnect");
    plane.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_rebuilt_connector_gets_a_new_id_and_channels_reopen_under_new_ids() {
    let server = start(&temp_state_dir("rebuilt-a"), None).await;
    let addr = server.addr;
    let (plane, mut events) =
        DataPlane::connect(config(base(&server))).await.expect("the data plane starts");
    let first_id = plane.connected().await.expect("connected");
    let channel = signed_in_channel(&plane).await;
    server.stop().await;

    // Same address, empty state: the Connector does not know the old ids.
    let server = start(&temp_state_dir("rebuilt-b"), Some(addr)).await;
    let replaced =
        next_event(&mut events, |e| matches!(e, ClientEvent::ConnectorReplaced { .. })).await;
    let ClientEvent::ConnectorReplaced { previous, current } = replaced else { unreachable!() };
    assert_eq!(previous, first_id);
    assert_ne!(current, first_id);
    let reopened =
        next_event(&mut events, |e| matches!(e, ClientEvent::ChannelReopened { .. })).await;
    let ClientEvent::ChannelReopened { previous, current, .. } = reopened else { unreachable!() };
    assert_eq!(previous, channel);
    assert_ne!(current, channel, "an unknown channel comes back under a new id");
    assert_eq!(plane.current_channel(&channel).await, Some(current));
    plane.close().await;
    server.stop().await;
}

#[tokio::test]
async fn tool_projection_follows_descriptor_pushes() {
    let server = start(&temp_state_dir("tools"), None).await;
    let control = ControlPlane::new(base(&server), Some(Secret::new(API_KEY)));
    let card = control.card().await.expect("card");
    let (plane, mut events) =
        DataPlane::connect(config(base(&server))).await.expect("the data plane starts");
    plane.connected().await.expect("connected");
    let channel = signed_in_channel(&plane).await;
    let descriptor = server.server.handle().descriptor(&channel).expect("descriptor");
    let names: Vec<String> =
        project_tools(&card, &descriptor).iter().map(|f| f.name.to_string()).collect();
    assert_eq!(names, vec!["echo_send", "echo_noop"]);

    server
        .server
        .handle()
        .set_tool_status(&channel, DescriptorTool::new("echo_send", ToolStatus::DeniedByTarget))
        .await
        .expect("tool status");
    let pushed =
        next_event(&mut events, |e| matches!(e, ClientEvent::DescriptorPushed { .. })).await;
    let ClientEvent::DescriptorPushed { channel: pushed_channel, descriptor } = pushed else {
        unreachable!()
    };
    assert_eq!(pushed_channel, channel);
    let names: Vec<String> =
        project_tools(&card, &descriptor).iter().map(|f| f.name.to_string()).collect();
    assert_eq!(names, vec!["echo_noop"]);
    plane.close().await;
    server.stop().await;
}

#[tokio::test]
async fn im_v2_both_ways() {
    let server = start(&temp_state_dir("im"), None).await;
    let (plane, mut events) =
        DataPlane::connect(config(base(&server))).await.expect("the data plane starts");
    plane.connected().await.expect("connected");
    let channel = signed_in_channel(&plane).await;
    let handle = server.server.handle();

    // Connector -> xAgent: a user message, accepted once.
    inject_message(&handle, &channel, "in_1", "hello agent").await.expect("inject");
    let event = next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessage(_))).await;
    let ClientEvent::ChatMessage(inbound) = event else { unreachable!() };
    assert_eq!(inbound.message.text.as_deref(), Some("hello agent"));
    assert_eq!(inbound.channel, channel);
    inbound.accept();

    // xAgent -> Connector: deltas, activity, and a final message with an ack.
    plane.send_activity(&channel, ChatActivity::thinking()).await.expect("activity");
    plane.send_delta(&channel, ChatMessageDelta::new("out_1", 1, "Hel")).await.expect("delta");
    plane.send_delta(&channel, ChatMessageDelta::new("out_1", 2, "lo")).await.expect("delta");
    plane.send_chat_message(&channel, ChatMessage::text("out_1", "Hello")).await.expect("queued");
    let acked =
        next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessageAcked { .. })).await;
    let ClientEvent::ChatMessageAcked { ack, .. } = acked else { unreachable!() };
    assert_eq!(ack.status, AckStatus::Accepted);
    assert_eq!(ack.message_id, "out_1");
    assert!(!plane.is_pending(&channel, &"out_1".into()).await);
    {
        let log = server.echo.log();
        assert_eq!(log.delivered.len(), 1, "the final message reached the target once");
        assert_eq!(log.delivered[0].1.text.as_deref(), Some("Hello"));
        assert!(!log.activities.is_empty());
    }
    let stats = plane.outbox_stats().await;
    assert_eq!(stats.totals.delivered, 1);
    plane.close().await;
    server.stop().await;
}

#[tokio::test]
async fn files_both_ways_through_the_transfer_plane() {
    let server = start(&temp_state_dir("files"), None).await;
    let control = ControlPlane::new(base(&server), Some(Secret::new(API_KEY)));
    let (plane, mut events) =
        DataPlane::connect(config(base(&server))).await.expect("the data plane starts");
    plane.connected().await.expect("connected");
    let channel = signed_in_channel(&plane).await;
    let handle = server.server.handle();

    // Connector -> xAgent: an inbound image, downloaded through its relative download_url
    // without any key, as the xAgent download chain does.
    let png = b"\x89PNG\r\n\x1a\nnot-really-an-image".to_vec();
    let file = handle
        .register_file(&channel, "photo.png", Some("image/png"), &png)
        .await
        .expect("registered");
    let url = file.download_url.clone().expect("download_url");
    assert!(url.starts_with("/files/refs/"), "{url}");
    handle
        .send_message(&channel, ChatMessage::with_files("in_file", None, vec![file]))
        .await
        .expect("queued");
    let event = next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessage(_))).await;
    let ClientEvent::ChatMessage(inbound) = event else { unreachable!() };
    let received = inbound.message.files[0].download_url.clone().expect("url");
    let downloaded = control.download(&received).await.expect("download");
    assert_eq!(downloaded.bytes, png);
    assert_eq!(downloaded.content_type.as_deref(), Some("image/png"));
    inbound.accept();

    // xAgent -> Connector: upload first, then reference the file_ref in the final message.
    let answer = xagent_client_runtime::FileContent {
        filename: "answer.txt".into(),
        mime_type: "text/plain".into(),
        bytes: b"42".to_vec(),
    };
    let upload = plane.upload_message_file(&channel, answer).await.expect("upload");
    let reply =
        ChatMessage::with_files("out_file", Some("here is the file".into()), vec![upload.clone()]);
    plane.send_chat_message(&channel, reply).await.expect("queued");
    let acked =
        next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessageAcked { .. })).await;
    let ClientEvent::ChatMessageAcked { ack, .. } = acked else { unreachable!() };
    assert_eq!(ack.status, AckStatus::Accepted);
    let log = server.echo.log();
    let delivered =
        log.delivered.iter().find(|(_, m, _)| m.message_id == "out_file").expect("delivered");
    assert_eq!(delivered.1.files[0].file_ref, upload.file_ref);
}
