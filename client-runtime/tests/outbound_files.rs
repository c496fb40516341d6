//! Assistant file messages against the server-runtime echo connector over real sockets on
//! 127.0.0.1: the runtime uploads a message's file on the message's channel, and refuses a
//! `file_ref` it did not upload on that channel, or one that expired, before anything is
//! queued.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{API_KEY, echo_config, sign_in};
use xagent_client_runtime::{
    BaseUrl, ClientConfig, ClientError, ClientEvent, ControlPlane, DataPlane, Events, FileContent,
    OutboundFileError,
};
use xagent_protocol_types::{
    AckStatus, ChatMessage, Clock, ErrorCode, ManualClock, Secret, SystemClock,
};
use xagent_testkit::{EchoServer, temp_state_dir};

fn config(server: &EchoServer, clock: &ManualClock) -> ClientConfig {
    let base = BaseUrl::parse(&server.base_url()).expect("base url");
    echo_config(base).with_clock(Arc::new(clock.clone()))
}

fn report() -> FileContent {
    FileContent {
        filename: "report.txt".into(),
        mime_type: "text/plain".into(),
        bytes: b"forty-two".to_vec(),
    }
}

async fn setup(name: &str) -> (EchoServer, ManualClock, DataPlane, Events) {
    let server = EchoServer::start(&temp_state_dir(name), API_KEY, None).await.expect("starts");
    // The client's clock starts at the server's time; tests move it on.
    let clock = ManualClock::new(SystemClock.now_millis());
    let (plane, events) =
        DataPlane::connect(config(&server, &clock)).await.expect("the data plane starts");
    plane.connected().await.expect("connected");
    (server, clock, plane, events)
}

fn outbound(error: Result<impl std::fmt::Debug, ClientError>) -> OutboundFileError {
    match error {
        Err(ClientError::OutboundFile(error)) => error,
        other => panic!("expected an outbound file refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn outbound_file_rule_a_message_file_is_uploaded_on_its_channel_and_delivered() {
    let (server, _clock, plane, mut events) = setup("outbound-ok").await;
    let channel = sign_in(&plane).await;
    let file = plane.upload_message_file(&channel, report()).await.expect("uploaded");
    assert_eq!(file.filename.as_deref(), Some("report.txt"));
    assert_eq!(file.byte_size, Some(9));
    assert!(file.expires_at.is_some() && file.download_url.is_none(), "{file:?}");
    let reply = ChatMessage::with_files("out_file", Some("the report".into()), vec![file.clone()]);
    plane.send_chat_message(&channel, reply).await.expect("queued");
    let acked =
        xagent_client_runtime::next_event_matching(&mut events, Duration::from_secs(15), |e| {
            matches!(e, ClientEvent::ChatMessageAcked { .. })
        })
        .await;
    let Some(ClientEvent::ChatMessageAcked { ack, .. }) = acked else {
        panic!("no ack within 15 s")
    };
    assert_eq!(ack.status, AckStatus::Accepted);
    {
        let log = server.echo.log();
        let (delivered_on, message, _) = log
            .delivered
            .iter()
            .find(|(_, m, _)| m.message_id == "out_file")
            .expect("delivered to the target");
        assert_eq!(delivered_on, &channel);
        assert_eq!(message.files[0].file_ref, file.file_ref);
    }
    plane.close().await;
    server.stop().await;
}

#[tokio::test]
async fn outbound_file_rule_a_file_ref_uploaded_on_another_channel_is_refused() {
    let (server, _clock, plane, _events) = setup("outbound-other").await;
    let first = sign_in(&plane).await;
    let second = sign_in(&plane).await;
    let file = plane.upload_message_file(&first, report()).await.expect("uploaded");
    let message = ChatMessage::with_files("out_cross", None, vec![file]);
    let refused = outbound(plane.send_chat_message(&second, message).await);
    assert!(matches!(refused, OutboundFileError::OtherChannel { .. }), "{refused}");
    assert_eq!(refused.code(), ErrorCode::Forbidden);
    assert!(!plane.is_pending(&second, &"out_cross".into()).await, "nothing was queued");
    plane.close().await;
    server.stop().await;
}

#[tokio::test]
async fn outbound_file_rule_a_file_ref_this_client_did_not_upload_is_refused() {
    let (server, _clock, plane, _events) = setup("outbound-unknown").await;
    let channel = sign_in(&plane).await;
    // Uploaded past the runtime: it cannot know the reference's channel or expiry.
    let control = ControlPlane::new(plane.control().base().clone(), Some(Secret::new(API_KEY)));
    let answer = control.upload(&channel, "x.txt", "text/plain", b"x".to_vec()).await.expect("up");
    let file = xagent_protocol_types::ChatFile::new(answer.file_type, answer.file_ref);
    let refused = outbound(
        plane.send_chat_message(&channel, ChatMessage::with_files("out_x", None, vec![file])).await,
    );
    assert!(matches!(refused, OutboundFileError::NotUploaded { .. }), "{refused}");
    assert_eq!(refused.code(), ErrorCode::FileNotFound);
    plane.close().await;
    server.stop().await;
}

#[tokio::test]
async fn outbound_file_rule_an_expired_file_ref_is_refused() {
    let (server, clock, plane, _events) = setup("outbound-expired").await;
    let channel = sign_in(&plane).await;
    let file = plane.upload_message_file(&channel, report()).await.expect("uploaded");
    let expires_at = file.expires_at.expect("the Connector's expiry");
    let file_ref = file.file_ref.clone();
    clock.set(expires_at);
    let message = ChatMessage::with_files("out_late", None, vec![file]);
    let refused = outbound(plane.send_chat_message(&channel, message).await);
    assert_eq!(refused, OutboundFileError::Expired { file_ref, expired_at: expires_at });
    assert_eq!(refused.code(), ErrorCode::FileNotFound);
    plane.close().await;
    server.stop().await;
}

/// Architecture 3.4: a new `connector_id` is a rebuilt Connector instance that knows none of
/// the old one's files, so the record of what this client uploaded goes with the rest of the
/// old instance's state: an old `file_ref` is refused as not uploaded, on the channel as it
/// came back, and a file uploaded there again is taken.
#[tokio::test]
async fn outbound_file_rule_a_new_connector_id_forgets_the_old_instances_uploads() {
    let (server, _clock, plane, mut events) = setup("outbound-replaced-a").await;
    let addr = server.addr;
    let channel = support::signed_in_channel(&plane).await;
    let old = plane.upload_message_file(&channel, report()).await.expect("uploaded");
    server.stop().await;

    // Same address, empty state: another runtime instance.
    let server =
        EchoServer::start(&temp_state_dir("outbound-replaced-b"), API_KEY, Some(addr)).await;
    let server = server.expect("starts again");
    let reopened =
        xagent_client_runtime::next_event_matching(&mut events, Duration::from_secs(15), |e| {
            matches!(e, ClientEvent::ChannelReopened { .. })
        })
        .await;
    let Some(ClientEvent::ChannelReopened { current, .. }) = reopened else {
        panic!("the channel reopens: {reopened:?}")
    };
    support::authenticate(&plane, &current).await;
    let stale = ChatMessage::with_files("out_stale", None, vec![old]);
    let refused = outbound(plane.send_chat_message(&current, stale).await);
    assert!(matches!(refused, OutboundFileError::NotUploaded { .. }), "{refused}");
    assert!(!plane.is_pending(&current, &"out_stale".into()).await, "nothing was queued");
    let again = plane.upload_message_file(&current, report()).await.expect("uploaded again");
    let message = ChatMessage::with_files("out_again", None, vec![again]);
    plane.send_chat_message(&current, message).await.expect("queued");
    plane.close().await;
    server.stop().await;
}
