//! The protections of `im.matrix` that face a room's members and the homeserver, each against
//! a real Synapse and each failing without its protection: the file size limit (both ways),
//! the download timeout (a media repository that never answers, behind a stalling proxy),
//! the notice for a message the runtime refuses, and leaving rooms nobody pairs (on a
//! simulated clock).

#![recursion_limit = "256"]

mod support;

use std::sync::Arc;
use std::time::Duration;

use matrix_sdk::attachment::AttachmentConfig;
use matrix_sdk::ruma::events::room::message::MessageType;
use xagent_client_runtime::{ClientError, ClientEvent, ControlPlane, FileContent};
use xagent_connector_matrix::connector::{TOOL_FILE_SEND, refused_notice};
use xagent_protocol_types::{
    AckStatus, ChatMessage, Clock, ErrorCode, ManualClock, Secret, SystemClock, ToolInvoke,
    ToolInvokeContext,
};
use xagent_testkit::synapse::TestSynapse;

use support::{
    API_KEY, Server, body_of, connect, next_chat, next_event, pair_room, stalling_proxy, temp_dir,
};

fn octets() -> mime_guess::mime::Mime {
    mime_guess::mime::APPLICATION_OCTET_STREAM
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_over_the_size_limit_are_refused_both_ways() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("bot").await;
    let ivy = support::human(synapse, "ivy").await;
    let dir = temp_dir("file-limit");
    let server = Server::start_with(synapse, &bot, &dir, |o| o.max_file_bytes = 1_000).await;
    let (plane, mut events) = connect(&server).await;
    let (channel, room) = pair_room(&plane, &ivy, &bot, "Big files", false).await;

    // From the room: a file within the limit arrives; one over it arrives as a note only.
    room.send_attachment("small.bin", &octets(), vec![1; 500], AttachmentConfig::new())
        .await
        .expect("posted");
    assert_eq!(next_chat(&mut events).await.files.len(), 1, "a file within the limit");
    room.send_attachment("big.bin", &octets(), vec![2; 2_000], AttachmentConfig::new())
        .await
        .expect("posted");
    let inbound = next_chat(&mut events).await;
    assert!(inbound.files.is_empty(), "a file over the limit is not kept: {inbound:?}");
    let text = inbound.text.expect("a note for the agent");
    assert!(text.contains("big.bin") && text.contains("larger than the 1000 bytes"), "{text}");

    // To the room: a final message with a larger file is refused, and so is the Tool.
    let big = FileContent {
        filename: "big.txt".into(),
        mime_type: "text/plain".into(),
        bytes: vec![b'x'; 2_000],
    };
    let upload = plane.upload_message_file(&channel, big).await.expect("upload");
    plane
        .send_chat_message(&channel, ChatMessage::with_files("msg_big", None, vec![upload]))
        .await
        .expect("sent");
    let acked = next_event(&mut events, |e| {
        matches!(e, ClientEvent::ChatMessageAcked { ack, .. } if ack.message_id.as_str() == "msg_big")
    })
    .await;
    let ClientEvent::ChatMessageAcked { ack, .. } = acked else { unreachable!() };
    assert_eq!(ack.status, AckStatus::Rejected, "{ack:?}");
    assert_eq!(ack.code, Some(ErrorCode::PayloadTooLarge), "{ack:?}");

    let control = ControlPlane::new(server.base(), Some(Secret::new(API_KEY)));
    let upload =
        control.upload(&channel, "big.txt", "text/plain", vec![b'y'; 2_000]).await.expect("upload");
    let mut arguments = serde_json::Map::new();
    arguments.insert("connector_channel_id".into(), channel.as_str().into());
    arguments.insert("file_ref".into(), upload.file_ref.as_str().into());
    let call = ToolInvoke::new(TOOL_FILE_SEND, arguments)
        .with_context(ToolInvokeContext::with_call_id("call-big"));
    match plane.request(Some(&channel), call).await {
        Err(ClientError::Remote(error)) => assert_eq!(error.code, ErrorCode::PayloadTooLarge),
        other => panic!("a file over the limit is payload_too_large, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let files = ivy
        .messages_from(&room, &bot.user_id)
        .into_iter()
        .filter(|e| matches!(e.content.msgtype, MessageType::File(_)))
        .count();
    assert_eq!(files, 0, "nothing over the limit was posted");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_download_that_never_finishes_is_given_up_and_the_room_goes_on() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("bot").await;
    let jade = support::human(synapse, "jade").await;
    // The bot reaches the homeserver through a proxy whose media downloads never answer.
    let proxy = stalling_proxy(synapse.url(), "/download/").await;
    let dir = temp_dir("download-timeout");
    let server = Server::start_with(synapse, &bot, &dir, |o| {
        o.homeserver = proxy.url.clone();
        o.download_timeout = Duration::from_secs(2);
    })
    .await;
    let (plane, mut events) = connect(&server).await;
    let (_channel, room) = pair_room(&plane, &jade, &bot, "Slow media", false).await;

    room.send_attachment("stuck.bin", &octets(), vec![3; 100], AttachmentConfig::new())
        .await
        .expect("posted");
    let inbound = next_chat(&mut events).await;
    let text = inbound.text.expect("a note for the agent");
    assert!(text.contains("stuck.bin") && text.contains("could not be fetched"), "{text}");
    jade.say(&room, "still there?").await;
    let inbound = next_chat(&mut events).await;
    assert!(inbound.text.expect("text").ends_with(": still there?"));
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_the_runtime_refuses_is_answered_in_the_room() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("bot").await;
    let kai = support::human(synapse, "kai").await;
    let dir = temp_dir("refused");
    let server = Server::start_with(synapse, &bot, &dir, |o| {
        o.runtime = o.runtime.clone().with_max_packet_bytes(16 * 1024);
    })
    .await;
    let (plane, mut events) = connect(&server).await;
    let (_channel, room) = pair_room(&plane, &kai, &bot, "Long texts", false).await;

    // Larger as a packet than the data plane takes: refused, and the sender is told.
    kai.say(&room, &"long ".repeat(5_000)).await;
    let notice = refused_notice(ErrorCode::PayloadTooLarge);
    kai.wait_message(&room, &bot.user_id, |e| body_of(e) == notice).await;
    kai.say(&room, "short then").await;
    let inbound = next_chat(&mut events).await;
    assert!(inbound.text.expect("text").ends_with(": short then"), "the long one never came");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_room_nobody_pairs_is_left_after_an_hour_and_a_paired_one_is_kept() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("bot").await;
    let lea = support::human(synapse, "lea").await;
    let clock = ManualClock::new(SystemClock.now_millis());
    let dir = temp_dir("idle-rooms");
    let moved = clock.clone();
    let server = Server::start_with(synapse, &bot, &dir, |o| o.clock = Arc::new(moved)).await;
    let (plane, mut events) = connect(&server).await;
    let (_channel, paired) = pair_room(&plane, &lea, &bot, "Paired", false).await;
    let idle = lea.create_room("Nobody pairs this", false, &[&bot.user_id]).await;
    lea.wait_joined(&idle, &bot.user_id).await;
    // Each message wakes the bot's sync, after which it looks for idle rooms.
    lea.say(&idle, "hello?").await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    clock.advance(59 * 60 * 1000);
    lea.say(&idle, "anyone?").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(lea.is_joined(&idle, &bot.user_id).await, "left before the hour was over");

    clock.advance(2 * 60 * 1000);
    lea.say(&idle, "last try").await;
    lea.wait_left(&idle, &bot.user_id).await;
    assert!(lea.is_joined(&paired, &bot.user_id).await, "the paired room is kept");
    lea.say(&paired, "you stayed").await;
    let inbound = next_chat(&mut events).await;
    assert!(inbound.text.expect("text").ends_with(": you stayed"));
    plane.close().await;
    server.stop().await;
}
