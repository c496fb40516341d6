//! Write-queue backpressure over a real socket: when xAgent stops reading, the server does not
//! buffer without bound. Once the socket buffers and the bounded per-socket write queue
//! (`RuntimeConfig::write_queue`) are full, producers wait: a Descriptor push from the author
//! does not complete and the reader stops answering requests. Nothing is dropped and the
//! connection is not closed: when the peer reads again, every queued packet arrives and the
//! waiting producers complete.

mod support;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use xagent_protocol_types::{
    AuthInput, AuthStart, ChannelOpen, ConnectorChannelId, ConnectorHello, PROFILE_IM_V2, Packet,
    Ping, SUBPROTOCOL,
};
use xagent_server_runtime::RuntimeConfig;
use xagent_testkit::{ECHO_CARD_ID, ECHO_FLOW};

const QUEUE: usize = 4;
/// Socket buffer size asked for on both ends (the kernel may round it up).
const SOCKET_BUFFER: u32 = 4096;

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn send(ws: &mut Ws, packet: &Packet) {
    ws.send(Message::Text(packet.to_json().unwrap().into())).await.unwrap();
}

async fn next(ws: &mut Ws) -> Packet {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a packet within 10 s")
            .expect("the socket is open")
            .expect("a frame");
        match message {
            Message::Text(text) => return Packet::decode_str(text.as_str()).unwrap(),
            Message::Close(frame) => panic!("the server closed the socket: {frame:?}"),
            _ => continue,
        }
    }
}

async fn call(ws: &mut Ws, packet: Packet) -> Packet {
    send(ws, &packet).await;
    loop {
        let reply = next(ws).await;
        if reply.reply_to.as_ref() == Some(&packet.packet_id) {
            return reply;
        }
    }
}

/// The gated connector with a write queue of [`QUEUE`] behind a listener with small send
/// buffers, so a peer that stops reading fills them quickly.
async fn serve_with_small_buffers(gate: &support::Gate) -> support::Custom {
    let listen = tokio::net::TcpSocket::new_v4().unwrap();
    listen.set_send_buffer_size(SOCKET_BUFFER).unwrap();
    listen.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = listen.listen(16).unwrap();
    let config = RuntimeConfig::default().with_write_queue(QUEUE);
    support::serve_custom(support::gated_connector(gate).build().unwrap(), config, Some(listener))
        .await
}

#[tokio::test]
async fn rule_write_queue_backpressure_a_slow_reader_makes_producers_wait_without_loss() {
    // Small kernel buffers on both ends, so the bounded write queue is reached quickly.
    let gate = support::Gate::new();
    let h = serve_with_small_buffers(&gate).await;
    let handle = h.server.handle();

    let (mut ws, channel) = signed_in_peer(&h, true, "slow").await;

    // xAgent stops reading. The author keeps pushing Descriptors until a push has to wait.
    let mut accepted = 0usize;
    let blocked = loop {
        match tokio::time::timeout(Duration::from_millis(300), handle.push_descriptor(&channel))
            .await
        {
            Ok(queued) => {
                assert!(queued, "the channel is routed");
                accepted += 1;
                assert!(accepted < 1_000, "the server kept buffering without bound");
            }
            Err(_) => break true,
        }
    };
    assert!(blocked);
    eprintln!("accepted {accepted} pushes before a producer had to wait");
    assert!(accepted >= QUEUE, "the queue itself holds {QUEUE} packets, accepted {accepted}");

    // The reader is held back too: a ping is read, but its pong waits for queue space, so
    // nothing more is read from this peer meanwhile.
    let ping = Packet::with_payload("p4", Ping::default()).request_id("r4");
    send(&mut ws, &ping).await;
    // A tool call sent after the ping is not read (its handler would count a run).
    let args = serde_json::json!({ "connector_channel_id": channel, "text": "later" });
    let invoke = Packet::with_payload(
        "p6",
        xagent_protocol_types::ToolInvoke::new("slow_work", args.as_object().cloned().unwrap()),
    )
    .request_id("r6")
    .channel(channel.clone());
    send(&mut ws, &invoke).await;
    // A producer that waits now completes once the peer reads again.
    let mut waiting = {
        let handle = handle.clone();
        let channel = channel.clone();
        tokio::spawn(async move { handle.push_descriptor(&channel).await })
    };
    let early = tokio::time::timeout(Duration::from_millis(200), &mut waiting).await;
    assert!(early.is_err(), "a producer must wait while the queue is full");
    assert_eq!(gate.runs(), 0, "the reader stopped reading while its reply could not be queued");
    assert!(handle.is_online(), "a slow reader is not disconnected");
    gate.open(1);

    // xAgent reads again: every accepted push, the waiting one and the pong arrive.
    let mut pushes = 0usize;
    let mut pong = false;
    let mut tool_ack = false;
    while pushes < accepted + 1 || !pong || !tool_ack {
        let packet = next(&mut ws).await;
        match packet.type_str() {
            "connection.descriptor.push" => pushes += 1,
            "pong" => {
                assert_eq!(packet.reply_to.as_ref(), Some(&ping.packet_id));
                pong = true;
            }
            "tool.invoke.ack" => {
                assert_eq!(packet.reply_to.as_ref(), Some(&invoke.packet_id), "{packet:?}");
                tool_ack = true;
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(gate.runs(), 1);
    assert_eq!(pushes, accepted + 1, "nothing was dropped and nothing duplicated");
    assert!(waiting.await.unwrap(), "the waiting producer completed");
    // The connection is still fully usable.
    let ping = Packet::with_payload("p5", Ping::default()).request_id("r5");
    assert_eq!(call(&mut ws, ping).await.type_str(), "pong");
    h.stop().await;
}

/// A socket (with a small receive buffer when `small`) that said hello, opened a channel and
/// signed it in; packet ids start with `id`.
async fn signed_in_peer(h: &support::Custom, small: bool, id: &str) -> (Ws, ConnectorChannelId) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    if small {
        socket.set_recv_buffer_size(SOCKET_BUFFER).unwrap();
    }
    let stream = socket.connect(h.addr).await.unwrap();
    let mut request = h.ws_url().into_client_request().unwrap();
    request.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_static(SUBPROTOCOL));
    let (mut ws, _) = tokio_tungstenite::client_async(request, stream).await.unwrap();
    let hello = Packet::with_payload(
        format!("{id}-p1"),
        ConnectorHello::new(ECHO_CARD_ID, vec![PROFILE_IM_V2.into()]),
    )
    .request_id(format!("{id}-r1"));
    assert_eq!(call(&mut ws, hello).await.type_str(), "connector.hello.ack");
    let open = Packet::with_payload(format!("{id}-p2"), ChannelOpen::default())
        .request_id(format!("{id}-r2"));
    let channel: ConnectorChannelId = call(&mut ws, open).await.connector_channel_id.unwrap();
    let start = AuthStart::new(ECHO_FLOW).with_input(AuthInput::default().with("token", "tok"));
    let start = Packet::with_payload(format!("{id}-p3"), start)
        .request_id(format!("{id}-r3"))
        .channel(channel.clone());
    call(&mut ws, start).await;
    (ws, channel)
}

#[tokio::test]
async fn rule_write_queue_a_stalled_peer_does_not_hold_up_im_delivery_to_others() {
    let gate = support::Gate::new();
    let h = serve_with_small_buffers(&gate).await;
    let handle = h.server.handle();
    let (mut stalled, stalled_channel) = signed_in_peer(&h, true, "a").await;
    let (mut healthy, healthy_channel) = signed_in_peer(&h, false, "b").await;

    // The first peer stops reading until its queue is full.
    let mut accepted = 0usize;
    while tokio::time::timeout(Duration::from_millis(300), handle.push_descriptor(&stalled_channel))
        .await
        .is_ok()
    {
        accepted += 1;
        assert!(accepted < 1_000, "the server kept buffering without bound");
    }

    // A message for the stalled peer must not make the author wait, nor block the other peer.
    let to_stalled = xagent_protocol_types::ChatMessage::text("m_stalled", "for the stalled peer");
    tokio::time::timeout(Duration::from_secs(2), handle.send_message(&stalled_channel, to_stalled))
        .await
        .expect("handing a message to a stalled channel returns at once")
        .unwrap();
    let to_healthy = xagent_protocol_types::ChatMessage::text("m_healthy", "for the healthy peer");
    tokio::time::timeout(Duration::from_secs(2), handle.send_message(&healthy_channel, to_healthy))
        .await
        .expect("the other channel is not held up")
        .unwrap();
    loop {
        let packet = next(&mut healthy).await;
        if packet.type_str() == "chat.message" {
            assert_eq!(packet.connector_channel_id.as_ref(), Some(&healthy_channel));
            break;
        }
    }
    // The stalled peer's message is still pending, not lost.
    assert!(
        handle.pending_messages(&stalled_channel).iter().any(|m| m.as_str() == "m_stalled"),
        "the stalled peer's message stays pending"
    );
    // Once the peer reads again its message goes out as soon as its queue has room: no
    // backoff to wait out, no maintenance tick needed.
    loop {
        let packet = next(&mut stalled).await;
        if packet.type_str() == "chat.message" {
            assert_eq!(packet.connector_channel_id.as_ref(), Some(&stalled_channel));
            let message: &xagent_protocol_types::ChatMessage = packet.payload().unwrap();
            assert_eq!(message.message_id.as_str(), "m_stalled");
            break;
        }
    }
    h.stop().await;
}
