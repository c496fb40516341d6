//! Graceful shutdown: a `tool.invoke` that is running when shutdown starts still gets its
//! `tool.invoke.ack` before the socket closes with 1001; packets sent after shutdown started
//! are not read any more.

mod support;

use serde_json::json;
use xagent_protocol_types::{Ping, ToolInvoke};
use xagent_server_runtime::RuntimeConfig;
use xagent_testkit::{Received, payload_json};

#[tokio::test]
async fn rule_graceful_shutdown_finishes_the_in_flight_ack_then_closes_1001() {
    let gate = support::Gate::new();
    let mut h = support::serve_custom(
        support::gated_connector(&gate).build().unwrap(),
        RuntimeConfig::default(),
        None,
    )
    .await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;

    let args = json!({ "connector_channel_id": channel, "text": "in flight" });
    let invoke =
        c.request(ToolInvoke::new("slow_work", args.as_object().cloned().unwrap()), Some(&channel));
    c.send(&invoke).await;
    gate.started.notified().await;

    // Shutdown starts while the tool runs; only then may the tool finish.
    h.server.shutdown();
    h.signal_stop();
    let late_ping = c.request(Ping::default(), None);
    c.send(&late_ping).await;
    gate.open(1);

    let mut seen = Vec::new();
    let close = loop {
        match c.recv().await {
            Received::Packet(packet) => seen.push(*packet),
            Received::Closed(code) => break code,
        }
    };
    let ack = seen
        .iter()
        .find(|p| p.type_str() == "tool.invoke.ack")
        .unwrap_or_else(|| panic!("no ack before the close; got {seen:?}"));
    assert_eq!(ack.reply_to.as_ref(), Some(&invoke.packet_id));
    assert_eq!(payload_json(ack)["result"], json!({ "text": "in flight", "run": 1 }));
    assert!(
        seen.iter().all(|p| p.type_str() != "pong"),
        "a packet sent after shutdown started was still processed: {seen:?}"
    );
    assert_eq!(close, Some(1001), "the socket closes with going-away after the ack");
    h.stop().await;
}
