//! Shared set-up of the client-runtime integration tests: a Connector played frame by frame
//! over the in-memory transport (its Card, Descriptor, hello and `channel.open` answers), and a
//! client of testkit's echo Connector on 127.0.0.1 (its config, a signed-in channel).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc::Receiver;
use xagent_client_runtime::transport::{MemoryPeer, MemoryTransport};
use xagent_client_runtime::{Backoff, BaseUrl, ClientConfig, DataPlane, Events};
use xagent_protocol_types::{
    AuthInput, AuthStart, AuthStartAck, AuthStatus, BuildInfo, CardTool, ChannelOpenAck,
    Connection, ConnectionDescriptor, ConnectionStatus, ConnectorCard, ConnectorChannelId,
    ConnectorHelloAck, ConnectorInfo, DescriptorTarget, DescriptorTool, ManualClock, PROFILE_IM_V2,
    Packet, Secret, Supports, TargetType,
};
use xagent_testkit::{ECHO_CARD_ID, ECHO_FLOW};

/// Who the Connector a test plays over the in-memory transport is: its Card id, its name and
/// target, its one IM tool and whether that tool names its channel in its arguments.
#[derive(Debug, Clone, Copy)]
pub struct Played {
    /// The Card id.
    pub card_id: &'static str,
    /// The Card's display name (and the Descriptor target's).
    pub name: &'static str,
    /// The Descriptor target's id.
    pub target: &'static str,
    /// The one tool's id.
    pub tool: &'static str,
    /// Whether the tool's schema requires `connector_channel_id` beside `text`.
    pub channel_argument: bool,
}

/// The Connector most in-memory tests play: `im.mem` with the tool `mem_send`.
pub const MEM: Played = Played {
    card_id: "im.mem",
    name: "Mem",
    target: "mem",
    tool: "mem_send",
    channel_argument: true,
};

/// [`MEM`]'s Card id.
pub const CARD: &str = MEM.card_id;

impl Played {
    /// The Card: IM v2 only, the one tool.
    pub fn card(&self) -> ConnectorCard {
        let schema = if self.channel_argument {
            json!({"type": "object", "required": ["connector_channel_id", "text"],
                "properties": {"connector_channel_id": {"type": "string"}, "text": {"type": "string"}}})
        } else {
            json!({"type": "object", "required": ["text"],
                "properties": {"text": {"type": "string"}}})
        };
        ConnectorCard::new(
            self.card_id,
            BuildInfo::new("1"),
            ConnectorInfo::new(self.name, "1.0.0"),
            Supports::new(vec![TargetType::Im], vec!["xagent.im.v2".into()]),
        )
        .with_tool(CardTool::new(self.tool, schema.as_object().cloned().unwrap_or_default()))
    }

    /// The Descriptor of `channel` in `status` on runtime `conn_1`, the tool available.
    pub fn descriptor(&self, channel: &str, status: ConnectionStatus) -> ConnectionDescriptor {
        ConnectionDescriptor::new(
            Connection::new(
                self.card_id,
                "conn_1",
                channel,
                TargetType::Im,
                vec!["xagent.im.v2".into()],
                status,
            ),
            DescriptorTarget::new(self.target, self.name),
        )
        .with_tool(DescriptorTool::available(self.tool))
    }

    /// The hello answer of Connector runtime `connector_id` (the current protocol version).
    pub fn hello_ack(&self, connector_id: &str) -> ConnectorHelloAck {
        ConnectorHelloAck::new(self.card_id, connector_id)
    }

    /// Answers the `channel.open` packet `open` with `channel` in `status`.
    pub async fn answer_open(
        &self,
        peer: &MemoryPeer,
        open: &Packet,
        channel: &str,
        status: ConnectionStatus,
    ) {
        let ack = ChannelOpenAck::new(channel.into(), self.descriptor(channel, status));
        send(peer, Packet::with_payload("pkt_open_ack", ack).answering(open).channel(channel))
            .await;
    }

    /// Reads the client's next packet, which must be a `channel.open`, and answers it with
    /// `channel` in `status`; returns the `channel.open`.
    pub async fn answer_next_open(
        &self,
        peer: &mut MemoryPeer,
        channel: &str,
        status: ConnectionStatus,
    ) -> Packet {
        let open = next(peer, "channel.open").await;
        self.answer_open(peer, &open, channel, status).await;
        open
    }

    /// Completes hello as runtime `conn_1`, then opens `channel` in `status` for the user
    /// `alice`; returns the online peer.
    pub async fn online_with_channel(
        &self,
        plane: &DataPlane,
        peers: &mut Receiver<MemoryPeer>,
        channel: &str,
        status: ConnectionStatus,
    ) -> MemoryPeer {
        let (mut peer, _) = accept_hello_with(peers, self.hello_ack("conn_1")).await;
        plane.connected().await.expect("online");
        let opening = {
            let plane = plane.clone();
            tokio::spawn(async move { plane.open_channel_for("alice", None).await })
        };
        self.answer_next_open(&mut peer, channel, status).await;
        opening.await.expect("joins").expect("channel.open.ack");
        peer
    }
}

/// [`MEM`]'s Card.
pub fn card() -> ConnectorCard {
    MEM.card()
}

/// [`MEM`]'s Descriptor of `channel` in `status`.
pub fn descriptor(channel: &str, status: ConnectionStatus) -> ConnectionDescriptor {
    MEM.descriptor(channel, status)
}

/// A client config for [`MEM`]'s Card on `clock`, requests timing out after 5 s.
pub fn config(clock: &ManualClock) -> ClientConfig {
    config_for(&card(), clock)
}

/// A client config for `card` on `clock`, requests timing out after 5 s.
pub fn config_for(card: &ConnectorCard, clock: &ManualClock) -> ClientConfig {
    let base = BaseUrl::parse("http://memory.invalid").expect("valid");
    let mut config = ClientConfig::for_card(base, card).with_clock(Arc::new(clock.clone()));
    config.request_timeout = Duration::from_secs(5);
    config
}

/// Starts a data plane on the in-memory transport; the receiver yields each connection attempt.
pub async fn start(
    config: ClientConfig,
) -> (DataPlane, Events, MemoryTransport, Receiver<MemoryPeer>) {
    let (transport, peers) = MemoryTransport::new();
    let (plane, events) = DataPlane::connect_with(config, transport.clone()).await.expect("starts");
    (plane, events, transport, peers)
}

/// A JSON value the client sent, as a packet.
pub fn packet(value: &Value) -> Packet {
    Packet::from_value(value.clone()).expect("a packet")
}

/// Sends `packet` to the client.
pub async fn send(peer: &MemoryPeer, packet: Packet) {
    let value = packet.to_value().expect("encodes");
    assert!(peer.send_json(value).await, "the client is gone");
}

/// The client's next packet, which must be of type `kind`.
pub async fn next(peer: &mut MemoryPeer, kind: &str) -> Packet {
    let next = packet(&peer.next_json().await.expect("a packet from the client"));
    assert_eq!(next.type_str(), kind, "{next:?}");
    next
}

/// The next packet of type `kind` the client sent, skipping others.
pub async fn next_of(peer: &mut MemoryPeer, kind: &str) -> Packet {
    loop {
        let value = peer.next_json().await.expect("the client is connected");
        let next = packet(&value);
        if next.type_str() == kind {
            return next;
        }
    }
}

/// Completes hello on a fresh peer with `ack`; returns the peer and the hello it answered.
pub async fn accept_hello_with(
    peers: &mut Receiver<MemoryPeer>,
    ack: ConnectorHelloAck,
) -> (MemoryPeer, Packet) {
    let mut peer = peers.recv().await.expect("a connection attempt");
    let hello = packet(&peer.next_json().await.expect("hello"));
    assert_eq!(hello.type_str(), "connector.hello");
    send(&peer, Packet::with_payload("pkt_ack", ack).answering(&hello)).await;
    (peer, hello)
}

/// Completes hello on a fresh peer as [`MEM`]'s runtime `connector_id`; returns the peer and
/// the hello it answered.
pub async fn accept_hello_as(
    peers: &mut Receiver<MemoryPeer>,
    connector_id: &str,
) -> (MemoryPeer, Packet) {
    accept_hello_with(peers, MEM.hello_ack(connector_id)).await
}

/// Completes hello on a fresh peer as [`MEM`]'s runtime `conn_1`.
pub async fn accept_hello(peers: &mut Receiver<MemoryPeer>) -> MemoryPeer {
    accept_hello_as(peers, "conn_1").await.0
}

/// Answers the `channel.open` packet `open` with [`MEM`]'s `channel` in `status`.
pub async fn answer_open(
    peer: &MemoryPeer,
    open: &Packet,
    channel: &str,
    status: ConnectionStatus,
) {
    MEM.answer_open(peer, open, channel, status).await;
}

/// The API key the tests start testkit's echo Connector with.
pub const API_KEY: &str = "sk-client-test-8a1d4f";

/// A client config for the echo Connector at `base`: its Card id, IM v2, [`API_KEY`],
/// requests timing out after 5 s.
pub fn echo_config(base: BaseUrl) -> ClientConfig {
    let mut config = ClientConfig::new(base, ECHO_CARD_ID, vec![PROFILE_IM_V2.into()])
        .with_api_key(Secret::new(API_KEY));
    config.request_timeout = Duration::from_secs(5);
    config
}

/// Reconnects quickly: from 50 ms, doubling up to `max`, giving up after 100 failures.
pub fn quick_backoff(max: Duration) -> Backoff {
    Backoff { initial: Duration::from_millis(50), max, factor: 2.0, max_failures: Some(100) }
}

/// Opens a channel on the echo Connector and signs it in through its form flow.
pub async fn sign_in(plane: &DataPlane) -> ConnectorChannelId {
    let opened = plane.open_channel(None).await.expect("channel.open");
    authenticate(plane, &opened.connector_channel_id).await;
    opened.connector_channel_id
}

/// Signs the open `channel` in through the echo Connector's form flow.
pub async fn authenticate(plane: &DataPlane, channel: &ConnectorChannelId) {
    let ack: AuthStartAck = plane
        .request(
            Some(channel),
            AuthStart::new(ECHO_FLOW).with_input(AuthInput::default().with("token", "tok-123")),
        )
        .await
        .expect("auth.start");
    assert_eq!(ack.0.status, AuthStatus::Authenticated);
}

/// [`sign_in`], then remembers the channel so that a restart reopens it.
pub async fn signed_in_channel(plane: &DataPlane) -> ConnectorChannelId {
    let channel = sign_in(plane).await;
    plane.remember_channel(channel.clone()).await;
    channel
}
