//! Channel ownership and shared target consumers over a real socket: a channel of another
//! runtime instance is `connector_channel_connector_mismatch` (and `channel.open` of it gets a
//! new channel); a shared consumer is reference-counted and stops with its last channel, on
//! logout as on lease expiry.

mod support;

use std::time::Duration;

use xagent_protocol_types::{
    AuthLogout, ConnectionStatus, ConnectorChannelId, ConnectorId, DescriptorGet, ErrorCode,
    ManualClock,
};
use xagent_server_runtime::RuntimeConfig;
use xagent_server_runtime::storage::{ChannelRecord, SqliteStorage, Storage};
use xagent_testkit::{has_error, is_error_packet, payload_json};

#[tokio::test]
async fn rule_connector_channel_connector_mismatch_for_a_channel_of_another_runtime_instance() {
    let dir = support::temp_dir("foreign");
    {
        // A store holding the current instance and a channel left by an older one.
        let storage = SqliteStorage::open(&dir).unwrap();
        let current = ConnectorId::new("conn_im_echo_current");
        storage.commit_connector_id(Some(&current)).committed().await.unwrap();
        storage
            .commit_channel(&ChannelRecord {
                id: ConnectorChannelId::new("cch_foreign"),
                connector_id: ConnectorId::new("conn_im_echo_old"),
                status: ConnectionStatus::Created,
                binding: None,
                tool_overrides: Default::default(),
                created_at: support::START,
            })
            .committed()
            .await
            .unwrap();
    }
    let h = support::start(dir, ManualClock::new(support::START), RuntimeConfig::default()).await;
    let mut c = h.client().await;
    let ack = c.hello(None).await;
    assert_eq!(payload_json(&ack)["connector_id"], "conn_im_echo_current");
    let foreign = ConnectorChannelId::new("cch_foreign");

    let get = c.request(DescriptorGet::default(), Some(&foreign));
    c.send(&get).await;
    let refused = c.next_packet().await;
    assert!(is_error_packet(&refused), "{refused:?}");
    assert!(has_error(&refused, &ErrorCode::ConnectorChannelConnectorMismatch), "{refused:?}");
    assert_eq!(refused.request_id, get.request_id);

    // Opening it does not adopt it: a new channel of the current instance is issued.
    let (opened, open) = c.open_channel(Some(&foreign)).await;
    assert_ne!(opened, foreign);
    assert_eq!(
        payload_json(&open)["connection_descriptor"]["connection"]["connector_id"],
        "conn_im_echo_current"
    );
    h.stop().await;
}

#[tokio::test]
async fn rule_shared_consumers_are_reference_counted_and_stop_with_their_last_channel() {
    let h = support::start_default().await;
    let handle = h.server.handle();
    let mut c = h.client().await;
    c.hello(None).await;
    let (a, _) = c.open_channel(None).await;
    let (b, _) = c.open_channel(None).await;
    c.sign_in(&a, "tok-a").await;
    c.sign_in(&b, "tok-b").await;
    assert_eq!(h.echo.log().poller_starts, 1, "one consumer for both channels");
    assert_eq!(handle.consumer_users("echo-poller"), 2);

    let logout = c.request(AuthLogout::default(), Some(&a));
    c.call(logout).await;
    assert_eq!(h.echo.log().poller_stops, 0, "another channel still uses the consumer");
    assert_eq!(handle.consumer_users("echo-poller"), 1);
    let logout = c.request(AuthLogout::default(), Some(&b));
    c.call(logout).await;
    assert_eq!(h.echo.log().poller_stops, 1);
    assert_eq!(handle.consumer_users("echo-poller"), 0);
    h.stop().await;
}

#[tokio::test]
async fn rule_lease_expiry_signs_out_every_channel_and_stops_a_shared_consumer_once() {
    let h = support::start_default().await;
    let handle = h.server.handle();
    let mut c = h.client().await;
    c.hello(None).await;
    let (a, _) = c.open_channel(None).await;
    let (b, _) = c.open_channel(None).await;
    let (unbound, _) = c.open_channel(None).await;
    c.sign_in(&a, "tok-a").await;
    c.sign_in(&b, "tok-b").await;
    c.close().await;
    for _ in 0..500 {
        if !handle.is_online() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    h.clock.advance(3_600_000);
    h.server.tick().await;
    assert!(handle.channels().is_empty());
    let mut signed_out = h.echo.log().signed_out.clone();
    signed_out.sort();
    let mut expected = vec![a, b];
    expected.sort();
    assert_eq!(signed_out, expected, "each signed-in channel ran its sign-out cleanup");
    assert!(!h.echo.log().signed_out.contains(&unbound));
    assert_eq!(h.echo.log().poller_starts, 1);
    assert_eq!(
        h.echo.log().poller_stops,
        1,
        "the shared consumer stopped once, with its last user"
    );
    h.stop().await;
}

#[tokio::test]
async fn rule_channel_close_only_removes_the_route_and_keeps_the_binding() {
    let h = support::start_default().await;
    let handle = h.server.handle();
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    assert!(handle.is_routed(&channel));
    let close = c.request(xagent_protocol_types::ChannelClose::default(), Some(&channel));
    let closed = c.call(close).await;
    assert_eq!(payload_json(&closed)["status"], "ok");
    assert!(!handle.is_routed(&channel));
    assert!(handle.binding(&channel).is_some(), "channel.close is not a sign-out");
    assert!(h.echo.log().signed_out.is_empty());
    assert_eq!(h.echo.log().poller_stops, 0);
    let (reopened, ack) = c.open_channel(Some(&channel)).await;
    assert_eq!(reopened, channel);
    assert_eq!(payload_json(&ack)["connection_descriptor"]["connection"]["status"], "connected");
    h.stop().await;
}
