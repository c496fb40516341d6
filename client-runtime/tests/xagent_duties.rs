//! The xAgent side's own duties over the in-memory transport with a `ManualClock`, each test
//! playing the Connector frame by frame: `user_channel_mode` before `channel.open`, the
//! per-message delta sequence kept by the runtime, and `xagent.connection/v1` Descriptors read
//! and normalised on receive.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use xagent_client_runtime::transport::{MemoryPeer, MemoryTransport};
use xagent_client_runtime::{BaseUrl, ClientConfig, ClientError, DataPlane, Events};
use xagent_protocol_types::{
    BuildInfo, CardTool, ChannelOpenAck, ChatMessage, Connection, ConnectionDescriptor,
    ConnectionStatus, ConnectorCard, ConnectorHelloAck, ConnectorInfo, DescriptorTarget,
    DescriptorTool, ErrorCode, ManualClock, Packet, ProfileId, Supports, TargetType,
    UserChannelMode,
};

/// The legacy fixture: a `channel.open.ack` whose Descriptor is `xagent.connection/v1`.
const LEGACY_ACK: &str =
    include_str!("../../protocol-types/tests/fixtures/legacy/packet--channel.open.ack.v1.json");
const CARD: &str = "im.legacy";
const TOOL: &str = "legacy_send";
/// The fixture's `connector_id`, which `hello.ack` announces.
const CONNECTOR_ID: &str = "conn_im_legacy_1";

fn card(mode: Option<UserChannelMode>) -> ConnectorCard {
    let schema = json!({"type": "object", "required": ["connector_channel_id", "text"],
        "properties": {"connector_channel_id": {"type": "string"}, "text": {"type": "string"}}});
    let mut card = ConnectorCard::new(
        CARD,
        BuildInfo::new("1"),
        ConnectorInfo::new("Legacy", "1.0.0"),
        Supports::new(vec![TargetType::Im], vec!["xagent.im.v2".into()]),
    )
    .with_tool(CardTool::new(TOOL, schema.as_object().cloned().unwrap_or_default()));
    card.supports.user_channel_mode = mode;
    card
}

async fn start(
    card: &ConnectorCard,
    clock: &ManualClock,
) -> (DataPlane, Events, tokio::sync::mpsc::Receiver<MemoryPeer>) {
    let base = BaseUrl::parse("http://memory.invalid").expect("valid");
    let mut config = ClientConfig::for_card(base, card).with_clock(Arc::new(clock.clone()));
    config.request_timeout = Duration::from_secs(5);
    let (transport, peers) = MemoryTransport::new();
    let (plane, events) = DataPlane::connect_with(config, transport).await.expect("starts");
    (plane, events, peers)
}

fn packet(value: &Value) -> Packet {
    Packet::from_value(value.clone()).expect("a packet")
}

async fn send(peer: &MemoryPeer, packet: Packet) {
    let value = packet.to_value().expect("encodes");
    assert!(peer.send_json(value).await, "the client is gone");
}

async fn accept_hello(peers: &mut tokio::sync::mpsc::Receiver<MemoryPeer>) -> MemoryPeer {
    let mut peer = peers.recv().await.expect("a connection attempt");
    let hello = packet(&peer.next_json().await.expect("hello"));
    assert_eq!(hello.type_str(), "connector.hello");
    send(
        &peer,
        Packet::with_payload("pkt_ack", ConnectorHelloAck::new(CARD, CONNECTOR_ID))
            .answering(&hello),
    )
    .await;
    peer
}

fn descriptor(channel: &str) -> ConnectionDescriptor {
    ConnectionDescriptor::new(
        Connection::new(
            CARD,
            CONNECTOR_ID,
            channel,
            TargetType::Im,
            vec!["xagent.im.v2".into()],
            ConnectionStatus::Connected,
        ),
        DescriptorTarget::new("legacy", "Legacy"),
    )
    .with_tool(DescriptorTool::available(TOOL))
}

/// Opens a channel for `owner`, the peer answering with `channel`.
async fn open_for(plane: &DataPlane, peer: &mut MemoryPeer, owner: &str, channel: &str) {
    let opening = tokio::spawn({
        let plane = plane.clone();
        let owner = owner.to_owned();
        async move { plane.open_channel_for(&owner, None).await }
    });
    let open = packet(&peer.next_json().await.expect("channel.open"));
    assert_eq!(open.type_str(), "channel.open");
    let ack = ChannelOpenAck::new(channel.into(), descriptor(channel));
    send(peer, Packet::with_payload("pkt_open_ack", ack).answering(&open).channel(channel)).await;
    opening.await.expect("joins").expect("opened");
}

/// Nothing more arrives from the client within two (simulated) seconds.
async fn assert_silent(peer: &mut MemoryPeer, what: &str) {
    let nothing = tokio::time::timeout(Duration::from_secs(2), peer.from_client.recv()).await;
    assert!(nothing.is_err(), "{what} must not be written: {nothing:?}");
}

#[tokio::test(start_paused = true)]
async fn user_channel_mode_rule_single_refuses_a_second_channel_before_channel_open() {
    // An omitted mode reads as single (protocol 4.1).
    let clock = ManualClock::new(1_000);
    let (plane, _events, mut peers) = start(&card(None), &clock).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    open_for(&plane, &mut peer, "alice", "cch_1").await;
    match plane.open_channel_for("alice", None).await {
        Err(ClientError::UserChannelLimit(limit)) => {
            assert_eq!(limit.owner, "alice");
            assert_eq!(limit.existing.as_ref().map(|c| c.as_str()), Some("cch_1"));
        }
        other => panic!("expected the single-channel limit, got {other:?}"),
    }
    assert_silent(&mut peer, "a second channel.open for alice").await;
    // The user's own channel may be reopened, and another user is not limited.
    let reopening = tokio::spawn({
        let plane = plane.clone();
        async move { plane.open_channel_for("alice", Some(&"cch_1".into())).await }
    });
    let open = packet(&peer.next_json().await.expect("the reopen"));
    assert_eq!(open.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_1"));
    let ack = ChannelOpenAck::new("cch_1".into(), descriptor("cch_1"));
    send(&peer, Packet::with_payload("pkt_reopen", ack).answering(&open).channel("cch_1")).await;
    reopening.await.expect("joins").expect("reopened");
    open_for(&plane, &mut peer, "bob", "cch_2").await;
}

#[tokio::test(start_paused = true)]
async fn user_channel_mode_rule_multiple_lets_a_user_open_several_channels() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, mut peers) = start(&card(Some(UserChannelMode::Multiple)), &clock).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    open_for(&plane, &mut peer, "alice", "cch_1").await;
    open_for(&plane, &mut peer, "alice", "cch_2").await;
    assert_eq!(plane.directory().owned_by("alice").count(), 2);
}

#[tokio::test(start_paused = true)]
async fn delta_sequence_rule_the_runtime_numbers_deltas_from_1_and_the_final_closes_the_stream() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, mut peers) = start(&card(None), &clock).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    open_for(&plane, &mut peer, "alice", "cch_1").await;
    let channel = "cch_1".into();
    let mut stream = plane.stream_message(&channel, "msg_out");
    for (expected, text) in [(1, "Hel"), (2, "lo"), (3, ", you")] {
        assert_eq!(stream.delta(text).await.expect("sent"), expected);
        let delta = peer.next_json().await.expect("a delta");
        assert_eq!(delta["type"], "chat.message.delta");
        assert_eq!(delta["payload"]["sequence"], expected);
        assert_eq!(delta["payload"]["message_id"], "msg_out");
        assert_eq!(delta["payload"]["text"], text);
    }
    stream.finish(ChatMessage::text("msg_out", "Hello, you")).await.expect("queued");
    let last = peer.next_json().await.expect("the final message");
    assert_eq!(last["type"], "chat.message");
    // The final closed the stream: a fourth delta, however numbered, does not leave.
    let late = xagent_protocol_types::ChatMessageDelta::new("msg_out", 4, "!");
    match plane.send_delta(&channel, late).await {
        Err(error @ ClientError::StreamClosed { .. }) => {
            assert_eq!(error.code(), ErrorCode::SequenceConflict);
        }
        other => panic!("expected the closed stream to refuse, got {other:?}"),
    }
    let mut again = plane.stream_message(&channel, "msg_out");
    assert!(matches!(again.delta("more").await, Err(ClientError::StreamClosed { .. })));
    assert_silent(&mut peer, "a delta after the final").await;
}

#[tokio::test(start_paused = true)]
async fn delta_sequence_rule_a_caller_cannot_send_0_or_a_gap() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, mut peers) = start(&card(None), &clock).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    open_for(&plane, &mut peer, "alice", "cch_1").await;
    let channel = "cch_1".into();
    let delta = |sequence, text: &str| {
        xagent_protocol_types::ChatMessageDelta::new("msg_raw", sequence, text)
    };
    // 0 breaks the payload rule every packet is judged by before it leaves.
    match plane.send_delta(&channel, delta(0, "zero")).await {
        Err(ClientError::Invalid { rules, .. }) => {
            assert!(rules.iter().any(|r| r == "chat_delta.sequence"), "{rules:?}");
        }
        other => panic!("expected the payload rule to refuse sequence 0, got {other:?}"),
    }
    // A gap breaks the per-message sequence the runtime keeps.
    match plane.send_delta(&channel, delta(2, "gap")).await {
        Err(error @ ClientError::Delta(_)) => {
            assert_eq!(error.code(), ErrorCode::SequenceConflict);
        }
        other => panic!("expected a sequence refusal, got {other:?}"),
    }
    assert_silent(&mut peer, "a delta with sequence 0 or a gap").await;
    plane.send_delta(&channel, delta(1, "one")).await.expect("the first");
    assert_eq!(peer.next_json().await.expect("delta 1")["payload"]["sequence"], 1);
    // An identical repeat is a retransmission; a changed one is a conflict.
    plane.send_delta(&channel, delta(1, "one")).await.expect("a retransmission");
    assert_eq!(peer.next_json().await.expect("delta 1 again")["payload"]["sequence"], 1);
    assert!(matches!(
        plane.send_delta(&channel, delta(1, "uno")).await,
        Err(ClientError::Delta(_))
    ));
    assert!(matches!(
        plane.send_delta(&channel, delta(3, "gap")).await,
        Err(ClientError::Delta(_))
    ));
    assert_silent(&mut peer, "a conflicting repeat or a gap").await;
    // The runtime's own numbering continues where the caller left off.
    let mut stream = plane.stream_message(&channel, "msg_raw");
    assert_eq!(stream.delta("two").await.expect("sent"), 2);
}

#[tokio::test(start_paused = true)]
async fn descriptor_v1_rule_a_v1_descriptor_in_channel_open_ack_is_accepted_and_normalised() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, mut peers) = start(&card(None), &clock).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    let opening = tokio::spawn({
        let plane = plane.clone();
        async move { plane.open_channel_for("alice", None).await }
    });
    let open = packet(&peer.next_json().await.expect("channel.open"));
    let mut ack: Value = serde_json::from_str(LEGACY_ACK).expect("the fixture is JSON");
    ack["request_id"] = json!(open.request_id.as_ref().map(|r| r.as_str()));
    ack["reply_to"] = json!(open.packet_id.as_str());
    assert!(peer.send_json(ack).await, "the client is gone");
    let opened = opening.await.expect("joins").expect("a v1 Descriptor is accepted");
    assert_eq!(
        opened.connection_descriptor.connection.profiles,
        vec![ProfileId::from("xagent.im.v2")]
    );
    let directory = plane.directory();
    let entry = directory.get(&"cch_legacy".into()).expect("the channel is in the directory");
    assert_eq!(entry.owner.as_deref(), Some("alice"));
    assert!(entry.tool_available(TOOL), "the normalised Descriptor was recorded");
    assert_eq!(plane.model_tools("alice").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn delta_sequence_rule_a_delta_that_was_not_written_gives_its_number_back() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, mut peers) = start(&card(None), &clock).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    open_for(&plane, &mut peer, "alice", "cch_1").await;
    // Not written: the channel is not open on this connection.
    let mut elsewhere = plane.stream_message(&"cch_closed".into(), "msg_w");
    assert!(matches!(elsewhere.delta("lost").await, Err(ClientError::Withheld(_))));
    assert_silent(&mut peer, "a delta on a channel that is not open").await;
    let mut stream = plane.stream_message(&"cch_1".into(), "msg_w");
    assert_eq!(stream.delta("first").await.expect("sent"), 1);
    // Not written: over the packet size limit; the next fragment takes the same number.
    let huge = "x".repeat(2 << 20);
    assert!(stream.delta(huge).await.is_err(), "a packet over the limit is refused");
    assert_eq!(peer.next_json().await.expect("delta 1")["payload"]["sequence"], 1);
    assert_eq!(stream.delta("second").await.expect("sent"), 2);
    let second = peer.next_json().await.expect("delta 2");
    assert_eq!(
        (second["payload"]["sequence"].clone(), second["payload"]["text"].clone()),
        (json!(2), json!("second"))
    );
}
