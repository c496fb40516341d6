//! The runtime's findings of the issue-14 attack run, each over a real socket on 127.0.0.1:
//! an oversized message refused at the source (H3), the outbox pumping after every write (M5),
//! bounded request work per socket (M7), channel limits (L3) and close 1007 on invalid UTF-8
//! (I1). Request traces without queries (L2) are in `hardening_logs.rs`.

mod support;

use std::time::Duration;

use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use xagent_protocol_types::{
    ChatMessage, ChatMessageAck, ErrorCode, ManualClock, Packet, ToolInvoke, ToolInvokeContext,
};
use xagent_server_runtime::ops::CLOSE_INVALID_DATA;
use xagent_server_runtime::{HandleError, RuntimeConfig};
use xagent_testkit::{Received, has_error, is_error_packet};

#[tokio::test]
async fn i1_a_text_frame_that_is_not_utf8_closes_with_1007() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let frame = Frame::message(vec![0x7b, 0xff, 0xfe, 0x7d], OpCode::Data(Data::Text), true);
    c.send_message(Message::Frame(frame)).await;
    match c.recv().await {
        Received::Closed(code) => assert_eq!(code, Some(CLOSE_INVALID_DATA)),
        Received::Packet(packet) => panic!("expected a close, got {}", packet.type_str()),
    }
    h.stop().await;
}

#[tokio::test]
async fn h3_a_message_larger_than_a_packet_is_refused_at_the_source() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    let handle = h.server.handle();
    let huge = ChatMessage::text("msg_huge", "x".repeat(1024 * 1024));
    match handle.send_message(&channel, huge).await {
        Err(error @ HandleError::TooLarge { .. }) => {
            assert_eq!(error.code(), ErrorCode::PayloadTooLarge);
            assert!(error.to_string().contains("at most"), "{error}");
        }
        other => panic!("a packet over the limit must be refused, got {other:?}"),
    }
    assert!(handle.pending_messages(&channel).is_empty(), "nothing was queued");
    // A message that fits still goes out.
    handle.send_message(&channel, ChatMessage::text("msg_ok", "fits")).await.unwrap();
    let (packet, _) = c.wait_for("chat.message").await;
    assert_eq!(xagent_testkit::payload_json(&packet)["message_id"], "msg_ok");
    h.stop().await;
}

#[tokio::test]
async fn m5_messages_acknowledged_at_once_drain_without_the_maintenance_tick() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    let handle = h.server.handle();
    for n in 0..50 {
        handle.send_message(&channel, ChatMessage::text(format!("msg_{n}"), "hi")).await.unwrap();
    }
    // xAgent acknowledges every message the moment it arrives (often before the runtime has
    // recorded the write); all 50 must arrive without waiting for the 30 s maintenance tick.
    let mut got = 0;
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        while got < 50 {
            let (packet, _) = c.wait_for("chat.message").await;
            let message_id = xagent_testkit::payload_json(&packet)["message_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let ack = Packet::with_payload(
                xagent_protocol_types::PacketId::new(c.id("pkt")),
                ChatMessageAck::accepted(message_id),
            )
            .channel(channel.clone())
            .reply_to(packet.packet_id.clone());
            c.send(&ack).await;
            got += 1;
        }
    })
    .await;
    assert!(drained.is_ok(), "only {got} of 50 messages arrived without a maintenance tick");
    h.stop().await;
}

#[tokio::test]
async fn m7_request_work_per_socket_is_bounded_and_the_reader_waits() {
    let gate = support::Gate::new();
    let config = RuntimeConfig::default().with_max_in_flight_requests(4);
    let h =
        support::serve_custom(support::gated_connector(&gate).build().unwrap(), config, None).await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    let mut invokes = Vec::new();
    for n in 0..12 {
        let mut arguments = serde_json::Map::new();
        arguments.insert("connector_channel_id".into(), channel.as_str().into());
        arguments.insert("text".into(), format!("t{n}").into());
        let invoke = ToolInvoke::new("slow_work", arguments)
            .with_context(ToolInvokeContext::with_call_id(format!("call_{n}")));
        let packet = c.request(invoke, Some(&channel));
        c.send(&packet).await;
        invokes.push(packet);
    }
    // Give the server time to read everything it is willing to read.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(gate.runs(), 4, "at most 4 requests of the socket run at once");
    gate.open(12);
    let mut answered = 0;
    while answered < 12 {
        let packet = c.next_packet().await;
        if packet.type_str() == "tool.invoke.ack" {
            assert!(!is_error_packet(&packet), "{packet:?}");
            answered += 1;
        }
    }
    assert_eq!(gate.runs(), 12, "every request ran once the earlier ones finished");
    h.stop().await;
}

#[tokio::test]
async fn l3_channel_open_is_limited_per_socket_and_in_total() {
    let config = RuntimeConfig::default().with_channel_limits(3, 5);
    let h = support::start(support::temp_dir("l3"), ManualClock::new(support::START), config).await;
    let mut a = h.client().await;
    let hello = a.hello(None).await;
    let connector_id =
        xagent_testkit::payload_json(&hello)["connector_id"].as_str().unwrap_or("").to_owned();
    let mut opened = Vec::new();
    for _ in 0..3 {
        let (channel, ack) = a.open_channel(None).await;
        assert!(!is_error_packet(&ack), "{ack:?}");
        opened.push(channel);
    }
    let (_, refused) = a.open_channel(None).await;
    assert!(has_error(&refused, &ErrorCode::CapacityExceeded), "a 4th channel on one socket");
    // Reopening a channel this socket already has is not a new one.
    let (_, again) = a.open_channel(Some(&opened[0])).await;
    assert!(!is_error_packet(&again), "{again:?}");
    // Another socket: two more fill the Connector's total of 5.
    let mut b = h.client().await;
    b.hello(Some(&connector_id)).await;
    for _ in 0..2 {
        let (_, ack) = b.open_channel(None).await;
        assert!(!is_error_packet(&ack), "{ack:?}");
    }
    let (_, full) = b.open_channel(None).await;
    assert!(has_error(&full, &ErrorCode::CapacityExceeded), "the 6th channel in total");
    h.stop().await;
}
