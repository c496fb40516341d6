//! What an embedding application used to write itself and now asks the runtime for, over the
//! in-memory transport with tokio's clock paused (each test plays the Connector frame by
//! frame): following a QR sign-in to its end, learning the settling ack of a sent message, and
//! filling the model's redundant `connector_channel_id` with the channel section 10.1 chose.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{MEM, config_for, descriptor, next, packet, send};
use tokio::sync::mpsc::Receiver;
use xagent_client_runtime::transport::{MemoryPeer, MemoryTransport};
use xagent_client_runtime::{ClientError, DataPlane, Events, ToolCallOptions};
use xagent_protocol_types::{
    AuthFlow, AuthInput, AuthProgress, AuthStartAck, AuthStatus, AuthStatusAck, ChatMessage,
    ChatMessageAck, Clock, ConnectionStatus, ConnectorCard, ConnectorChannelId, ErrorCode,
    ManualClock, Packet, TargetType, ToolInvokeAck,
};

const QR: &str = "mem_qr";

/// [`MEM`]'s Card with a QR sign-in flow.
fn card() -> ConnectorCard {
    support::card().with_auth_flow(AuthFlow::qr_login(QR, TargetType::Im, "Scan"))
}

async fn start() -> (DataPlane, Events, MemoryTransport, Receiver<MemoryPeer>) {
    start_at(&ManualClock::new(1_000)).await
}

async fn start_at(
    clock: &ManualClock,
) -> (DataPlane, Events, MemoryTransport, Receiver<MemoryPeer>) {
    support::start(config_for(&card(), clock)).await
}

/// The payload of a packet the client sent, as JSON.
fn payload(packet: &Packet) -> Value {
    packet.to_value().map(|v| v["payload"].clone()).unwrap_or_default()
}

fn qr(status: AuthStatus, link: &str) -> AuthProgress {
    AuthProgress::new(status)
        .for_session("cch_qr".into(), QR.into(), "as_1".into())
        .with_qr(link, None)
        .with_poll_interval_millis(1_000)
}

#[tokio::test(start_paused = true)]
async fn sign_in_rule_a_qr_flow_is_polled_at_its_pace_refreshed_and_remembered() {
    let (plane, _events, _, mut peers) = start().await;
    let mut peer = MEM
        .online_with_channel(&plane, &mut peers, "cch_qr", ConnectionStatus::Authenticating)
        .await;
    let channel = ConnectorChannelId::new("cch_qr");

    let starting = {
        let (plane, channel) = (plane.clone(), channel.clone());
        tokio::spawn(async move { plane.sign_in(&channel, QR, AuthInput::default()).await })
    };
    let start = next(&mut peer, "auth.start").await;
    let first = AuthStartAck(qr(AuthStatus::Pending, "https://mem.invalid/pair/1"));
    send(&peer, Packet::with_payload("pkt_s", first).answering(&start).channel("cch_qr")).await;
    let driver = starting.await.expect("joins").expect("auth.start.ack");
    assert!(driver.is_following(), "a pending QR flow is followed");
    assert_eq!(driver.progress().qr_code_text.as_deref(), Some("https://mem.invalid/pair/1"));
    let mut steps = driver.watch();

    // The first poll waits the interval the Connector asked for.
    let asked = tokio::time::Instant::now();
    let poll = next(&mut peer, "auth.status").await;
    assert!(asked.elapsed() >= Duration::from_millis(1_000), "{:?}", asked.elapsed());
    assert_eq!(payload(&poll)["refresh"], Value::Null);
    let expired = AuthStatusAck(qr(AuthStatus::QrRefreshRequired, "https://mem.invalid/pair/1"));
    send(&peer, Packet::with_payload("pkt_p1", expired).answering(&poll).channel("cch_qr")).await;

    // An expired code: the next poll asks for a fresh one.
    let poll = next(&mut peer, "auth.status").await;
    assert_eq!(payload(&poll)["refresh"], json!(true));
    let fresh = AuthStatusAck(qr(AuthStatus::Pending, "https://mem.invalid/pair/2"));
    send(&peer, Packet::with_payload("pkt_p2", fresh).answering(&poll).channel("cch_qr")).await;
    let shown = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            steps.changed().await.expect("the driver runs");
            let link = steps.borrow_and_update().qr_code_text.clone();
            if link.as_deref() == Some("https://mem.invalid/pair/2") {
                return link;
            }
        }
    })
    .await;
    assert!(shown.is_ok(), "the fresh link is published");

    let poll = next(&mut peer, "auth.status").await;
    assert_eq!(payload(&poll)["refresh"], Value::Null);
    let mut done = qr(AuthStatus::Authenticated, "https://mem.invalid/pair/2");
    done.connection_descriptor = Some(descriptor("cch_qr", ConnectionStatus::Connected));
    send(
        &peer,
        Packet::with_payload("pkt_p3", AuthStatusAck(done)).answering(&poll).channel("cch_qr"),
    )
    .await;
    let end = driver.finished().await.expect("the flow ends");
    assert_eq!(end.status, AuthStatus::Authenticated);
    let remembered: Vec<ConnectorChannelId> =
        plane.channels().await.into_iter().map(|(persisted, _)| persisted).collect();
    assert_eq!(remembered, vec![channel], "a signed-in channel is remembered");
}

#[tokio::test(start_paused = true)]
async fn sign_in_rule_a_flow_the_card_does_not_declare_is_refused_locally() {
    let (plane, _events, _, mut peers) = start().await;
    let mut peer = MEM
        .online_with_channel(&plane, &mut peers, "cch_qr", ConnectionStatus::Authenticating)
        .await;
    match plane.sign_in(&"cch_qr".into(), "mem_nothing", AuthInput::default()).await {
        Err(ClientError::Refused(error)) => {
            assert_eq!(error.code, ErrorCode::InvalidArguments);
            assert!(error.message().contains(QR), "names the declared flows: {error:?}");
        }
        other => panic!("expected a local refusal, got {other:?}"),
    }
    let nothing = tokio::time::timeout(Duration::from_secs(2), peer.from_client.recv()).await;
    assert!(nothing.is_err(), "nothing was sent: {nothing:?}");
}

#[tokio::test(start_paused = true)]
async fn settled_ack_rule_the_ack_that_ends_delivery_is_reported_not_a_retryable_one() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, _, mut peers) = start_at(&clock).await;
    let mut peer =
        MEM.online_with_channel(&plane, &mut peers, "cch_1", ConnectionStatus::Connected).await;
    let channel = ConnectorChannelId::new("cch_1");
    let message = ChatMessage::text("msg_out_1", "hello").created_at(1_000);
    plane.send_chat_message(&channel, message).await.expect("queued");
    let sent = next(&mut peer, "chat.message").await;
    let busy = ChatMessageAck::rejected("msg_out_1", ErrorCode::ChannelBusy, "later", true);
    send(&peer, Packet::with_payload("pkt_a1", busy).answering(&sent).channel("cch_1")).await;
    let waited = plane.settled_ack(&channel, &"msg_out_1".into(), Duration::from_millis(100)).await;
    assert!(waited.is_none(), "a retryable rejection settles nothing: {waited:?}");

    // The outbox delivers it again once its backoff (on the data plane's clock) has passed;
    // this time it is accepted, and a caller asking after the ack arrived still learns it.
    let again = loop {
        clock.advance(1_000);
        match tokio::time::timeout(Duration::from_millis(500), peer.next_json()).await {
            Ok(Some(value)) => break packet(&value),
            Ok(None) => panic!("the client closed the connection"),
            Err(_) => assert!(clock.now_millis() < 120_000, "the message was never redelivered"),
        }
    };
    assert_eq!(again.type_str(), "chat.message");
    let accepted = ChatMessageAck::accepted("msg_out_1");
    send(&peer, Packet::with_payload("pkt_a2", accepted).answering(&again).channel("cch_1")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let settled = plane.settled_ack(&channel, &"msg_out_1".into(), Duration::ZERO).await;
    assert_eq!(settled.map(|a| a.status.to_string()), Some("accepted".into()));
}

#[tokio::test(start_paused = true)]
async fn resolution_10_1_the_channel_argument_is_filled_when_missing_and_never_routes() {
    let (plane, _events, _, mut peers) = start().await;
    let mut peer =
        MEM.online_with_channel(&plane, &mut peers, "cch_1", ConnectionStatus::Connected).await;
    let fill = ToolCallOptions { fill_channel_argument: true, ..ToolCallOptions::default() };
    for (given, expected) in [
        (json!({"text": "a"}), json!("cch_1")),
        (json!({"text": "b", "connector_channel_id": "cch_made_up"}), json!("cch_made_up")),
    ] {
        let arguments = given.as_object().cloned().unwrap_or_default();
        let calling = {
            let (plane, fill) = (plane.clone(), fill.clone());
            tokio::spawn(async move {
                plane.invoke_tool_with("alice", None, "mem_send", arguments, fill).await
            })
        };
        let invoke = next(&mut peer, "tool.invoke").await;
        assert_eq!(invoke.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_1"));
        assert_eq!(payload(&invoke)["arguments"]["connector_channel_id"], expected);
        let ack = ToolInvokeAck::new("mem_send", json!({"ok": true}));
        send(&peer, Packet::with_payload("pkt_t", ack).answering(&invoke).channel("cch_1")).await;
        let outcome = calling.await.expect("joins").expect("the call runs");
        assert_eq!(outcome.channel.as_str(), "cch_1", "section 10.1 chose the channel");
    }
}
