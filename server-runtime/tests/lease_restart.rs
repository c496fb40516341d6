//! Offline lease with the simulated clock, reconnect, restart from the SQLite store.

mod support;

use std::time::Duration;

use xagent_protocol_types::{AckStatus, ChatMessage, ChatMessageAck, ManualClock, Packet};
use xagent_server_runtime::{ConnectorHandle, RuntimeConfig};
use xagent_testkit::{inject_message, payload_json};

const HOUR: u64 = 3_600_000;

async fn until_offline(handle: &ConnectorHandle) {
    for _ in 0..500 {
        if !handle.is_online() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the server did not notice the closed socket");
}

#[tokio::test]
async fn rule_lease_expires_after_an_offline_hour_and_cascades() {
    let h = support::start_default().await;
    let handle = h.server.handle();
    let mut c = h.client().await;
    let first = payload_json(&c.hello(None).await)["connector_id"].as_str().unwrap().to_owned();
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok-lease").await;
    c.close().await;
    until_offline(&handle).await;

    // Within the hour: still registered; a reconnect keeps the id and cancels the expiry.
    h.clock.advance(HOUR - 1000);
    h.server.tick().await;
    assert_eq!(handle.connector_id().map(String::from), Some(first.clone()));
    let mut c = h.client().await;
    let again =
        payload_json(&c.hello(Some(&first)).await)["connector_id"].as_str().unwrap().to_owned();
    assert_eq!(again, first);
    h.clock.advance(2 * HOUR);
    h.server.tick().await;
    assert!(handle.connector_id().is_some(), "an online runtime never expires");
    c.close().await;
    until_offline(&handle).await;

    // One continuous offline hour: unregister and cascade.
    h.clock.advance(HOUR - 1);
    h.server.tick().await;
    assert!(handle.connector_id().is_some());
    h.clock.advance(1);
    h.server.tick().await;
    assert!(handle.connector_id().is_none());
    assert!(handle.channels().is_empty());
    assert_eq!(
        h.echo.log().signed_out,
        vec![channel.clone()],
        "each channel runs its sign-out cleanup"
    );
    assert_eq!(h.echo.log().poller_stops, 1, "the shared consumer stops with its last channel");

    // A later hello creates a new runtime instance; the old channel is unknown.
    let mut c = h.client().await;
    let fresh =
        payload_json(&c.hello(Some(&first)).await)["connector_id"].as_str().unwrap().to_owned();
    assert_ne!(fresh, first);
    let (reopened, ack) = c.open_channel(Some(&channel)).await;
    assert_ne!(reopened, channel);
    assert_eq!(payload_json(&ack)["connection_descriptor"]["connection"]["status"], "created");
    h.stop().await;
}

#[tokio::test]
async fn restart_restores_channels_redelivers_pending_and_accepts_nothing_twice() {
    let dir = support::temp_dir("restart");
    let clock = ManualClock::new(support::START);
    let h = support::start(dir.clone(), clock.clone(), RuntimeConfig::default()).await;
    let mut c = h.client().await;
    let connector_id =
        payload_json(&c.hello(None).await)["connector_id"].as_str().unwrap().to_owned();
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok-restart").await;
    // xAgent -> Connector message accepted before the restart.
    c.send(
        &Packet::with_payload("px1", ChatMessage::text("x1", "before")).channel(channel.clone()),
    )
    .await;
    let (ack, _) = c.wait_for("chat.message.ack").await;
    assert_eq!(ack.payload::<ChatMessageAck>().unwrap().status, AckStatus::Accepted);
    // Connector -> xAgent message sent but never acknowledged.
    inject_message(&h.server.handle(), &channel, "in_r1", "pending across restart").await.unwrap();
    let (first_try, _) = c.wait_for("chat.message").await;
    c.close().await;
    h.stop().await;

    let h = support::start(dir.clone(), clock.clone(), RuntimeConfig::default()).await;
    assert_eq!(h.echo.log().restored, vec![channel.clone()]);
    assert_eq!(h.echo.log().poller_starts, 1);
    let handle = h.server.handle();
    assert_eq!(handle.pending_messages(&channel).len(), 1);
    let mut c = h.client().await;
    let again = payload_json(&c.hello(Some(&connector_id)).await)["connector_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(again, connector_id);
    let (reopened, ack) = c.open_channel(Some(&channel)).await;
    assert_eq!(reopened, channel);
    assert_eq!(payload_json(&ack)["connection_descriptor"]["connection"]["status"], "connected");
    let (redelivered, _) = c.wait_for("chat.message").await;
    let body: &ChatMessage = redelivered.payload().unwrap();
    assert_eq!(body.message_id.as_str(), "in_r1");
    assert_ne!(redelivered.packet_id, first_try.packet_id, "a new transmission, same message_id");
    let ack = Packet::with_payload("pk1", ChatMessageAck::accepted("in_r1"))
        .channel(channel.clone())
        .reply_to(redelivered.packet_id.clone());
    c.send(&ack).await;
    let ping = c.request(xagent_protocol_types::Ping::default(), None);
    c.call(ping).await;
    assert!(handle.pending_messages(&channel).is_empty());

    // The message accepted before the restart is a duplicate now.
    c.send(
        &Packet::with_payload("px2", ChatMessage::text("x1", "before")).channel(channel.clone()),
    )
    .await;
    let (dup, _) = c.wait_for("chat.message.ack").await;
    assert_eq!(dup.payload::<ChatMessageAck>().unwrap().status, AckStatus::Duplicate);
    assert_eq!(h.echo.log().delivered.len(), 0, "nothing delivered twice");
    c.close().await;
    h.stop().await;

    // Restored channels that no hello claims within the lease are cleaned up.
    let h = support::start(dir, clock.clone(), RuntimeConfig::default()).await;
    let handle = h.server.handle();
    assert_eq!(handle.channels(), vec![channel.clone()]);
    clock.advance(HOUR);
    h.server.tick().await;
    assert!(handle.channels().is_empty());
    assert!(handle.connector_id().is_none());
    assert_eq!(h.echo.log().signed_out, vec![channel]);
    h.stop().await;
}
