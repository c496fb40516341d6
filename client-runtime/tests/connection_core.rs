//! The xAgent side on the connection core, over the in-memory transport with a `ManualClock`
//! (tokio's clock paused): the admitted Card and window read at every connect, the outbound
//! size rule, the send rules (the Connector's receive rules applied before a packet leaves),
//! and a packet of a Profile not negotiated dropped as the Connector side drops it.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{Played, accept_hello_with, config_for, packet, start};
use xagent_client_runtime::transport::MemoryPeer;
use xagent_client_runtime::{ClientConfig, ClientError, ClientEvent, next_event_matching};
use xagent_protocol_types::{
    ChatActivity, ChatMessageDelta, ConnectionStatus, ManualClock, Packet, ToolInvoke,
};
use xagent_protocol_validate::{AdmissionWindow, ProtocolVersion, rules};

/// The Connector these tests play: `im.core`, whose one tool takes only `text`.
const CORE: Played = Played {
    card_id: "im.core",
    name: "Core",
    target: "core",
    tool: "core_send",
    channel_argument: false,
};

fn config(clock: &ManualClock) -> ClientConfig {
    config_for(&CORE.card(), clock)
}

/// Reads the hello of a fresh peer and answers it with `version`.
async fn hello(
    peers: &mut tokio::sync::mpsc::Receiver<MemoryPeer>,
    version: &str,
) -> (MemoryPeer, Packet) {
    let mut ack = CORE.hello_ack("conn_1");
    ack.protocol_version = Some(version.to_owned());
    accept_hello_with(peers, ack).await
}

async fn nothing_sent(peer: &mut MemoryPeer) {
    let next = tokio::time::timeout(Duration::from_secs(2), peer.from_client.recv()).await;
    assert!(next.is_err(), "nothing may leave: {next:?}");
}

fn refused_naming(result: Result<impl std::fmt::Debug, ClientError>, rule: &str) {
    match result {
        Err(ClientError::Invalid { rules, message }) => {
            assert!(rules.iter().any(|r| r == rule), "{rule} not in {rules:?} ({message})");
        }
        other => panic!("expected a local refusal naming {rule}, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn readmission_rule_the_next_hello_announces_the_readmitted_cards_profiles_and_window() {
    let clock = ManualClock::new(1_000);
    let mut config = config(&clock);
    config.window = AdmissionWindow::new(ProtocolVersion::new(3, 0), ProtocolVersion::new(3, 1));
    let (plane, _events, _, mut peers) = start(config).await;
    let (peer, first) = hello(&mut peers, "3.0").await;
    plane.connected().await.expect("online");
    let announced = first.to_value().expect("encodes")["payload"]["supported_profiles"].clone();
    assert_eq!(announced, json!(["xagent.im.v2"]));
    // The Connector was upgraded to protocol 3.1 with IM v1 as well; a refetch re-admitted it.
    let mut upgraded = CORE.card();
    upgraded.protocol_version = "3.1".into();
    upgraded.supports.profiles.push("xagent.im.v1".into());
    plane.set_card(upgraded);
    drop(peer);
    let (_peer, second) = hello(&mut peers, "3.1").await;
    let payload = second.to_value().expect("encodes")["payload"].clone();
    assert_eq!(payload["supported_profiles"], json!(["xagent.im.v2", "xagent.im.v1"]));
    assert_eq!(payload["protocol_version"], json!("3.1"), "the current version of the window");
    // The ack (3.1, inside the configured window, the re-admitted Card's version) is admitted:
    // it is checked with the configured window, not the default one.
    let online = tokio::time::timeout(Duration::from_secs(5), plane.connected()).await;
    assert!(
        matches!(online, Ok(Ok(_))),
        "the second hello.ack must be admitted: {online:?}, {:?}",
        plane.state()
    );
}

#[tokio::test(start_paused = true)]
async fn outbound_size_rule_the_xagent_side_refuses_a_packet_over_the_connectors_limit() {
    let clock = ManualClock::new(1_000);
    let mut config = config(&clock);
    config.max_packet_bytes = 1024;
    let (plane, _events, _, mut peers) = start(config).await;
    let mut peer =
        CORE.online_with_channel(&plane, &mut peers, "cch_1", ConnectionStatus::Connected).await;
    let delta = ChatMessageDelta::new("msg_1", 1, "x".repeat(4096));
    match plane.send_delta(&"cch_1".into(), delta).await {
        Err(ClientError::TooLarge { bytes, limit }) => {
            assert_eq!(limit, 1024);
            assert!(bytes > 4096);
        }
        other => panic!("expected the size rule to refuse it, got {other:?}"),
    }
    nothing_sent(&mut peer).await;
    // A packet within the limit still goes out.
    let small = ChatMessageDelta::new("msg_1", 1, "hi");
    plane.send_delta(&"cch_1".into(), small).await.expect("sent");
    let sent = packet(&peer.next_json().await.expect("the delta"));
    assert_eq!(sent.type_str(), "chat.message.delta");
}

#[tokio::test(start_paused = true)]
async fn send_rule_a_delta_with_sequence_0_is_refused_locally_naming_the_rule() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, _, mut peers) = start(config(&clock)).await;
    let mut peer =
        CORE.online_with_channel(&plane, &mut peers, "cch_1", ConnectionStatus::Connected).await;
    let delta = ChatMessageDelta::new("msg_1", 0, "hi");
    refused_naming(plane.send_delta(&"cch_1".into(), delta).await, rules::CHAT_DELTA_SEQUENCE.id);
    nothing_sent(&mut peer).await;
}

#[tokio::test(start_paused = true)]
async fn send_rule_a_thinking_activity_with_tool_name_is_refused_locally_naming_the_rule() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, _, mut peers) = start(config(&clock)).await;
    let mut peer =
        CORE.online_with_channel(&plane, &mut peers, "cch_1", ConnectionStatus::Connected).await;
    let mut activity = ChatActivity::thinking();
    activity.tool_name = Some("search".into());
    refused_naming(
        plane.send_activity(&"cch_1".into(), activity).await,
        rules::CHAT_ACTIVITY_TOOL_NAME.id,
    );
    nothing_sent(&mut peer).await;
}

#[tokio::test(start_paused = true)]
async fn send_rule_a_tool_invoke_of_a_tool_not_in_the_card_is_refused_locally_naming_the_rule() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, _, mut peers) = start(config(&clock)).await;
    let mut peer =
        CORE.online_with_channel(&plane, &mut peers, "cch_1", ConnectionStatus::Connected).await;
    let arguments = json!({"text": "hi"}).as_object().cloned().unwrap_or_default();
    let call = ToolInvoke::new("not_in_the_card", arguments);
    refused_naming(plane.request(Some(&"cch_1".into()), call).await, rules::TOOL_INVOKE_TOOL_ID.id);
    nothing_sent(&mut peer).await;
    // The refused request left nothing behind: a Card Tool still goes out on the same channel.
    let arguments = json!({"text": "hi"}).as_object().cloned().unwrap_or_default();
    let calling = tokio::spawn({
        let plane = plane.clone();
        async move {
            plane.request(Some(&"cch_1".into()), ToolInvoke::new("core_send", arguments)).await
        }
    });
    let sent = packet(&peer.next_json().await.expect("the tool.invoke"));
    assert_eq!(sent.type_str(), "tool.invoke");
    calling.abort();
}

#[tokio::test(start_paused = true)]
async fn profile_rule_a_packet_of_a_profile_not_negotiated_is_dropped_on_the_xagent_side() {
    let clock = ManualClock::new(1_000);
    let (plane, mut events, _, mut peers) = start(config(&clock)).await;
    let mut peer =
        CORE.online_with_channel(&plane, &mut peers, "cch_1", ConnectionStatus::Connected).await;
    // IM v1 was not negotiated (neither the Card nor the hello has it).
    let push = json!({"schema": "xagent.connector.packet/v1", "packet_id": "pkt_v1",
        "type": "message.push", "connector_channel_id": "cch_1",
        "payload": {"message_id": "m_1", "text": "hello from v1"}});
    assert!(peer.send_json(push).await);
    nothing_sent(&mut peer).await;
    let seen = next_event_matching(&mut events, Duration::from_secs(2), |e| {
        matches!(e, ClientEvent::MessagePush { .. } | ClientEvent::Error(_))
    })
    .await;
    assert!(seen.is_none(), "dropped, not delivered: {seen:?}");
    // The connection is still up: a ping is answered.
    let pinging = tokio::spawn({
        let plane = plane.clone();
        async move { plane.ping().await }
    });
    let ping = packet(&peer.next_json().await.expect("the ping"));
    assert_eq!(ping.type_str(), "ping");
    pinging.abort();
}
