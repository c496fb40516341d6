//! IM v1 end to end over a real socket: a Connector declaring `xagent.im.v1` pushes an
//! inbound target message through the handle (built with `profile-im`'s v1 builder) and
//! xAgent receives a valid `message.push`; the successful write is the delivery boundary; a
//! push while the channel is closed waits in the outbox until the channel reopens. IM v2
//! packets on a v1-only connection are dropped silently.

mod support;

use serde_json::Value;
use xagent_profile_im::{MessagePushBuilder, validate_message_push};
use xagent_protocol_types::{
    ChannelClose, ChatMessage, ConnectorHello, ErrorCode, MessagePush, PROFILE_IM_V1,
    PROFILE_IM_V2, Packet, Ping, Side, TargetDeclaration, TargetType,
};
use xagent_protocol_validate::{CardFacts, PacketContext, validate_packet};
use xagent_server_runtime::{Connector, HandleError, RuntimeConfig};
use xagent_testkit::{ECHO_FLOW, WsClient, payload_json};

const CARD_ID: &str = "im.legacy";

fn legacy_connector() -> Connector {
    Connector::builder(CARD_ID, "Legacy IM", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "legacychat", "Legacy chat"))
        .profile(PROFILE_IM_V1)
        .auth_flow_with(
            xagent_protocol_types::AuthFlow::form(
                ECHO_FLOW,
                TargetType::Im,
                "Sign in",
                vec![xagent_protocol_types::AuthField::password("token", "Token").required()],
            ),
            support::InstantAuth,
        )
        .build()
        .unwrap()
}

fn push(message_id: &str, text: &str) -> MessagePush {
    MessagePushBuilder::new("legacychat", message_id, "user_4711", "text")
        .raw_text(text)
        .sender_name("Ann")
        .chat_type("direct")
        .build()
        .unwrap()
}

/// The packet as xAgent read it, checked by the protocol's packet validator.
fn assert_valid_push(packet: &Packet, facts: &CardFacts) {
    let value: Value = serde_json::from_str(&packet.to_json().unwrap()).unwrap();
    let report =
        validate_packet(&value, PacketContext { card: Some(facts), sender: Some(Side::Connector) });
    assert!(report.valid, "{:?}", report.violations);
    let body: &MessagePush = packet.payload().unwrap();
    validate_message_push(body).unwrap();
}

async fn hello_v1(c: &mut WsClient) {
    // xAgent supports both IM Profiles; only v1 is in common.
    let hello = ConnectorHello::new(CARD_ID, vec![PROFILE_IM_V2.into(), PROFILE_IM_V1.into()]);
    let packet = c.request(hello, None);
    let ack = c.call(packet).await;
    assert_eq!(ack.type_str(), "connector.hello.ack");
}

#[tokio::test]
async fn rule_im_v1_message_push_reaches_xagent_valid_and_the_write_is_the_delivery_boundary() {
    let connector = legacy_connector();
    let facts = CardFacts::from_card(connector.card());
    let h = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let handle = h.server.handle();
    let mut c = h.client().await;
    hello_v1(&mut c).await;
    let (channel, open) = c.open_channel(None).await;
    assert_eq!(
        payload_json(&open)["connection_descriptor"]["connection"]["profiles"],
        serde_json::json!([PROFILE_IM_V1])
    );
    c.sign_in(&channel, "tok-legacy").await;

    handle.push_message(&channel, push("lm_1", "hello from the target")).await.unwrap();
    let (packet, _) = c.wait_for("message.push").await;
    // The write is recorded as it completes (the outbox never waits on a socket).
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while !handle.pending_messages(&channel).is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("written means delivered for v1");
    assert_eq!(packet.connector_channel_id.as_ref(), Some(&channel));
    assert_valid_push(&packet, &facts);
    let body = payload_json(&packet);
    assert_eq!(body["profile"], PROFILE_IM_V1);
    assert_eq!(body["event_kind"], "im.message.received");
    assert_eq!(body["message_id"], "lm_1");
    assert_eq!(body["raw_text"], "hello from the target");
    assert!(body["text"].as_str().unwrap().contains("hello from the target"));

    // Pushed while the channel is closed: kept, and sent when the channel reopens.
    let close = c.request(ChannelClose::default(), Some(&channel));
    c.call(close).await;
    handle.push_message(&channel, push("lm_2", "while closed")).await.unwrap();
    assert_eq!(handle.pending_messages(&channel).len(), 1);
    let (reopened, _) = c.open_channel(Some(&channel)).await;
    assert_eq!(reopened, channel);
    let (again, _) = c.wait_for("message.push").await;
    assert_valid_push(&again, &facts);
    assert_eq!(payload_json(&again)["message_id"], "lm_2");
    let ping = c.request(Ping::default(), None);
    c.call(ping).await;
    assert!(handle.pending_messages(&channel).is_empty());

    // A push that breaks the v1 rules is refused before it is queued.
    let mut broken = push("lm_3", "x");
    broken.profile = Some(PROFILE_IM_V2.into());
    let refused = handle.push_message(&channel, broken).await;
    match refused {
        Err(error @ HandleError::Outbox(xagent_profile_im::OutboxError::Payload(_))) => {
            assert_eq!(error.code(), ErrorCode::InvalidPacket, "{error}")
        }
        other => panic!("expected the outbox's payload refusal, got {other:?}"),
    }
    assert!(handle.pending_messages(&channel).is_empty());

    // Issue 38: a push citing a reply Tool the Card does not declare is refused on the
    // Connector's side too (xAgent's judge would refuse it: message_push.card_reference).
    let mut hint = xagent_protocol_types::ReplyHint::default();
    hint.tool_id = Some("legacy_message_reply".into());
    let uncited =
        MessagePushBuilder::new("legacychat", "lm_4", "user_4711", "text").reply(hint).build();
    let uncited = uncited.expect("without the Card the push is well formed");
    match handle.push_message(&channel, uncited).await {
        Err(HandleError::Outbox(xagent_profile_im::OutboxError::Payload(error))) => {
            assert_eq!(error.rule(), "message_push.card_reference", "{error}")
        }
        other => panic!("expected message_push.card_reference, got {other:?}"),
    }
    assert!(handle.pending_messages(&channel).is_empty());
    h.stop().await;
}

#[tokio::test]
async fn rule_im_v1_a_v1_connector_cannot_send_v2_chat_messages_and_drops_v2_packets() {
    let h = support::serve_custom(legacy_connector(), RuntimeConfig::default(), None).await;
    let handle = h.server.handle();
    let mut c = h.client().await;
    hello_v1(&mut c).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;

    // The handle refuses a v2 chat.message instead of queueing what can never be written.
    let refused = handle.send_message(&channel, ChatMessage::text("v2_1", "nope")).await;
    match refused {
        Err(error @ HandleError::ProfileNotDeclared(_)) => {
            assert_eq!(error.code(), ErrorCode::UnsupportedPacket)
        }
        other => panic!("expected ProfileNotDeclared, got {other:?}"),
    }
    assert!(handle.pending_messages(&channel).is_empty());

    // A v2 chat.message from xAgent is outside the negotiated catalog: dropped, no answer.
    let message = Packet::with_payload("pm_v2", ChatMessage::text("x1", "hi")).channel(channel);
    c.send(&message).await;
    let ping = c.request(Ping::default(), None);
    c.send(&ping).await;
    assert_eq!(c.next_packet().await.type_str(), "pong");
    h.stop().await;
}

#[tokio::test]
async fn rule_im_v2_connector_refuses_v1_pushes_through_the_handle() {
    // The echo Card says api_key_required: it is served with its key.
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    let refused = h.server.handle().push_message(&channel, push("lm_x", "nope")).await;
    assert!(matches!(refused, Err(HandleError::ProfileNotDeclared(p)) if p == PROFILE_IM_V1));
    h.stop().await;
}
