//! Per-channel ordering with cross-channel concurrency over a real socket: one channel whose
//! target hangs on a delivery does not delay the other channels on the same socket, and its
//! own messages keep their order.

mod support;

use std::time::Duration;

use xagent_protocol_types::{AckStatus, ChatMessage, ChatMessageAck, ConnectorChannelId, Packet};
use xagent_testkit::WsClient;

fn message(c: &mut WsClient, channel: &ConnectorChannelId, id: String) -> Packet {
    Packet::with_payload(c.id("pkt"), ChatMessage::text(id, "hello")).channel(channel.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_target_channel_does_not_delay_the_fast_ones_on_the_same_socket() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let mut channels: Vec<ConnectorChannelId> = Vec::new();
    for _ in 0..20 {
        let (channel, _) = c.open_channel(None).await;
        c.sign_in(&channel, "tok-iso").await;
        channels.push(channel);
    }
    // Channel 0's target takes an hour per delivery: it is stuck for the whole test.
    h.echo.set_delivery_delay(&channels[0], Some(Duration::from_secs(3600)));
    for n in 0..2 {
        let packet = message(&mut c, &channels[0], format!("slow{n}"));
        c.send(&packet).await;
    }
    // Then five messages on each of the 19 fast channels, interleaved.
    for round in 0..5 {
        for channel in &channels[1..] {
            let packet = message(&mut c, channel, format!("fast{round}"));
            c.send(&packet).await;
        }
    }
    let mut accepted = 0;
    while accepted < 19 * 5 {
        let (ack, _) = c.wait_for("chat.message.ack").await;
        assert_ne!(ack.connector_channel_id.as_ref(), Some(&channels[0]), "the slow one finished");
        assert_eq!(ack.payload::<ChatMessageAck>().unwrap().status, AckStatus::Accepted);
        accepted += 1;
    }
    // Every fast message reached the target, in order per channel; the slow channel's first
    // message is still with its target and its second still waits behind it.
    let log = h.echo.log();
    for channel in &channels[1..] {
        let texts: Vec<&str> = log
            .delivered
            .iter()
            .filter(|(c, _, _)| c == channel)
            .map(|(_, m, _)| m.message_id.as_str())
            .collect();
        assert_eq!(texts, ["fast0", "fast1", "fast2", "fast3", "fast4"]);
    }
    assert!(log.delivered.iter().all(|(c, _, _)| c != &channels[0]));
}

#[tokio::test]
async fn a_channel_with_a_full_lane_gets_a_retryable_busy_refusal() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (slow, _) = c.open_channel(None).await;
    c.sign_in(&slow, "tok-iso").await;
    h.echo.set_delivery_delay(&slow, Some(Duration::from_secs(3600)));
    // One runs, 64 wait: the next one is refused (not queued, not lost: xAgent retries it).
    for n in 0..66 {
        let packet = message(&mut c, &slow, format!("m{n}"));
        c.send(&packet).await;
    }
    let (ack, _) = c.wait_for("chat.message.ack").await;
    let ack: &ChatMessageAck = ack.payload().unwrap();
    assert_eq!(ack.status, AckStatus::Rejected);
    assert_eq!(ack.code, Some(xagent_protocol_types::ErrorCode::ChannelBusy));
    assert_eq!(ack.retryable, Some(true));
}
