//! The sequencing state machine, driven from both sides with wire packets.

use serde_json::{Value, json};
use xagent_protocol_types::{ConnectorChannelId, ErrorCode, Packet, ProfileId, Side};
use xagent_protocol_validate::{
    Accepted, AdmissionWindow, ChannelOwner, RejectAction, Rejection, Session,
};

const CARD: &str = "im.wechat";

fn pkt(value: Value) -> Packet {
    let mut value = value;
    value["schema"] = json!("xagent.connector.packet/v1");
    Packet::from_value(value).unwrap()
}

fn session(side: Side, profiles: &[&str]) -> Session {
    Session::from_parts(
        side,
        CARD.into(),
        profiles.iter().map(|p| ProfileId::from(*p)).collect(),
        AdmissionWindow::default(),
    )
}

fn hello(profiles: &[&str]) -> Packet {
    pkt(json!({
        "packet_id": "p_hello", "request_id": "r_hello", "type": "connector.hello",
        "payload": {"connector_card_id": CARD, "protocol_version": "3.0", "supported_profiles": profiles}
    }))
}

fn hello_ack() -> Packet {
    pkt(json!({
        "packet_id": "p_hello_ack", "request_id": "r_hello", "reply_to": "p_hello",
        "type": "connector.hello.ack",
        "payload": {"connector_card_id": CARD, "connector_id": "conn_1", "protocol_version": "3.0"}
    }))
}

fn descriptor(channel: &str, profiles: &[&str]) -> Value {
    json!({
        "schema": "xagent.connection/v2",
        "connection": {
            "connector_card_id": CARD, "connector_id": "conn_1", "connector_channel_id": channel,
            "target_type": "im", "profiles": profiles, "status": "created"
        },
        "target": {"provider": "wechat", "display_name": "WeChat"}
    })
}

fn open(request: &str) -> Packet {
    pkt(json!({"packet_id": format!("p_{request}"), "request_id": request, "type": "channel.open"}))
}

fn open_ack(request: &str, channel: &str, profiles: &[&str]) -> Packet {
    pkt(json!({
        "packet_id": format!("p_{request}_ack"), "request_id": request,
        "reply_to": format!("p_{request}"), "connector_channel_id": channel,
        "type": "channel.open.ack",
        "payload": {"connector_channel_id": channel, "connection_descriptor": descriptor(channel, profiles)}
    }))
}

fn chat_message(packet_id: &str, channel: &str, message_id: &str) -> Packet {
    pkt(json!({
        "packet_id": packet_id, "connector_channel_id": channel, "type": "chat.message",
        "payload": {"message_id": message_id, "text": "hi"}
    }))
}

fn chat_ack(packet_id: &str, reply_to: &str, channel: &str, message_id: &str) -> Packet {
    pkt(json!({
        "packet_id": packet_id, "reply_to": reply_to, "connector_channel_id": channel,
        "type": "chat.message.ack", "payload": {"message_id": message_id, "status": "accepted"}
    }))
}

fn tool_invoke(request: &str, channel: Option<&str>) -> Packet {
    let mut value = json!({
        "packet_id": format!("p_{request}"), "request_id": request, "type": "tool.invoke",
        "payload": {"tool_id": "wechat_message_send", "arguments": {}}
    });
    if let Some(channel) = channel {
        value["connector_channel_id"] = json!(channel);
    }
    pkt(value)
}

/// A Connector-side session past hello with channel `cch_1` open on IM v2.
fn connector_ready() -> Session {
    let mut s = session(Side::Connector, &["xagent.im.v2"]);
    s.on_received(&hello(&["xagent.im.v1", "xagent.im.v2"])).unwrap();
    s.on_sent(&hello_ack()).unwrap();
    s.on_received(&open("r_open")).unwrap();
    s.on_sent(&open_ack("r_open", "cch_1", &["xagent.im.v2"])).unwrap();
    s
}

/// An xAgent-side session past hello with channel `cch_1` open on IM v2.
fn xagent_ready() -> Session {
    let mut s = session(Side::Xagent, &["xagent.im.v2"]);
    s.on_sent(&hello(&["xagent.im.v1", "xagent.im.v2"])).unwrap();
    s.on_received(&hello_ack()).unwrap();
    s.on_sent(&open("r_open")).unwrap();
    s.on_received(&open_ack("r_open", "cch_1", &["xagent.im.v2"])).unwrap();
    s
}

fn code(result: Result<Accepted, Rejection>) -> ErrorCode {
    result.unwrap_err().error.code
}

#[test]
fn full_exchange_from_the_connector_side() {
    let mut s = session(Side::Connector, &["xagent.im.v2"]);
    match s.on_received(&hello(&["xagent.im.v1", "xagent.im.v2"])).unwrap() {
        Accepted::Hello { negotiated, .. } => {
            assert_eq!(negotiated.profile_ids(), &[ProfileId::from("xagent.im.v2")]);
        }
        other => panic!("{other:?}"),
    }
    assert!(!s.is_established());
    assert!(matches!(s.on_sent(&hello_ack()).unwrap(), Accepted::Established(_)));
    assert_eq!(s.connector_id().unwrap().as_str(), "conn_1");
    assert!(matches!(s.on_received(&open("r_open")).unwrap(), Accepted::Request(_)));
    match s.on_sent(&open_ack("r_open", "cch_1", &["xagent.im.v2"])).unwrap() {
        Accepted::ChannelOpened { channel, request } => {
            assert_eq!(channel.as_str(), "cch_1");
            assert_eq!(request.packet_type, "channel.open");
        }
        other => panic!("{other:?}"),
    }
    assert!(s.is_open(&"cch_1".into()));
    assert!(s.allows("chat.message", Side::Connector, Some(&"cch_1".into())));
    assert!(matches!(
        s.on_received(&tool_invoke("r_t", Some("cch_1"))).unwrap(),
        Accepted::Request(_)
    ));
    let ack = pkt(json!({
        "packet_id": "p_t_ack", "request_id": "r_t", "reply_to": "p_r_t", "connector_channel_id": "cch_1",
        "type": "tool.invoke.ack", "payload": {"tool_id": "wechat_message_send", "result": {}}
    }));
    match s.on_sent(&ack).unwrap() {
        Accepted::Reply(Some(request)) => assert_eq!(request.packet_type, "tool.invoke"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.pending_requests().count(), 0);
}

#[test]
fn hello_required_before_hello() {
    let mut s = session(Side::Connector, &["xagent.im.v2"]);
    let rejection = s.on_received(&tool_invoke("r1", Some("cch_1"))).unwrap_err();
    assert_eq!(rejection.error.code, ErrorCode::HelloRequired);
    assert_eq!(rejection.action, RejectAction::Reply);
    let ping = pkt(json!({"packet_id": "p", "request_id": "r", "type": "ping"}));
    assert_eq!(code(s.on_received(&ping)), ErrorCode::HelloRequired);
    // After the hello, but before its ack is sent, still nothing else.
    s.on_received(&hello(&["xagent.im.v2"])).unwrap();
    assert_eq!(code(s.on_received(&open("r_open"))), ErrorCode::HelloRequired);
    // The Connector itself may not send user-level packets before its ack.
    let push = chat_message("p_m", "cch_1", "m1");
    assert_eq!(code(s.on_sent(&push)), ErrorCode::HelloRequired);
}

#[test]
fn hello_required_on_the_xagent_side() {
    let mut s = session(Side::Xagent, &["xagent.im.v2"]);
    assert_eq!(code(s.on_sent(&open("r_open"))), ErrorCode::HelloRequired);
    s.on_sent(&hello(&["xagent.im.v2"])).unwrap();
    assert_eq!(code(s.on_received(&chat_message("p", "cch_1", "m"))), ErrorCode::HelloRequired);
}

#[test]
fn connector_card_id_mismatch_in_hello() {
    let mut s = session(Side::Connector, &["xagent.im.v2"]);
    let mut bad = hello(&["xagent.im.v2"]).to_value().unwrap();
    bad["payload"]["connector_card_id"] = json!("im.other");
    assert_eq!(code(s.on_received(&pkt(bad))), ErrorCode::ConnectorCardIdMismatch);
    assert!(!s.is_established());
    // A correct hello still works afterwards.
    s.on_received(&hello(&["xagent.im.v2"])).unwrap();
}

#[test]
fn connector_card_id_mismatch_in_hello_ack() {
    let mut s = session(Side::Xagent, &["xagent.im.v2"]);
    s.on_sent(&hello(&["xagent.im.v2"])).unwrap();
    let mut bad = hello_ack().to_value().unwrap();
    bad["payload"]["connector_card_id"] = json!("im.other");
    let rejection = s.on_received(&pkt(bad)).unwrap_err();
    assert_eq!(rejection.error.code, ErrorCode::ConnectorCardIdMismatch);
    assert_eq!(rejection.action, RejectAction::ReplyAndClose);
}

#[test]
fn protocol_version_unsupported_closes() {
    for version in [json!(null), json!("2.0"), json!("4.0"), json!("three")] {
        let mut s = session(Side::Connector, &["xagent.im.v2"]);
        let mut value = hello(&["xagent.im.v2"]).to_value().unwrap();
        if version.is_null() {
            value["payload"].as_object_mut().unwrap().remove("protocol_version");
        } else {
            value["payload"]["protocol_version"] = version.clone();
        }
        let rejection = s.on_received(&pkt(value)).unwrap_err();
        assert_eq!(rejection.error.code, ErrorCode::ProtocolVersionUnsupported, "{version}");
        assert_eq!(rejection.action, RejectAction::ReplyAndClose);
    }
    // A newer minor of the same major is fine on the Connector side.
    let mut s = session(Side::Connector, &["xagent.im.v2"]);
    let mut value = hello(&["xagent.im.v2"]).to_value().unwrap();
    value["payload"]["protocol_version"] = json!("3.1");
    assert!(s.on_received(&pkt(value)).is_ok());
    // The xAgent side admits the Connector by its window.
    let mut x = session(Side::Xagent, &["xagent.im.v2"]);
    x.on_sent(&hello(&["xagent.im.v2"])).unwrap();
    let mut ack = hello_ack().to_value().unwrap();
    ack["payload"].as_object_mut().unwrap().remove("protocol_version");
    assert_eq!(code(x.on_received(&pkt(ack))), ErrorCode::ProtocolVersionUnsupported);
}

#[test]
fn hello_without_supported_profiles_is_invalid_packet() {
    let mut s = session(Side::Connector, &["xagent.im.v2"]);
    let mut value = hello(&[]).to_value().unwrap();
    value["payload"].as_object_mut().unwrap().remove("supported_profiles");
    assert_eq!(code(s.on_received(&pkt(value))), ErrorCode::InvalidPacket);
}

#[test]
fn hello_without_request_id_is_invalid_packet() {
    let mut s = session(Side::Connector, &["xagent.im.v2"]);
    let mut value = hello(&["xagent.im.v2"]).to_value().unwrap();
    value.as_object_mut().unwrap().remove("request_id");
    assert_eq!(code(s.on_received(&pkt(value))), ErrorCode::InvalidPacket);
}

#[test]
fn second_hello_is_invalid_packet() {
    let mut s = connector_ready();
    assert_eq!(code(s.on_received(&hello(&["xagent.im.v2"]))), ErrorCode::InvalidPacket);
}

#[test]
fn refused_hello_returns_to_waiting() {
    let mut s = session(Side::Xagent, &["xagent.im.v2"]);
    s.on_sent(&hello(&["xagent.im.v2"])).unwrap();
    let error = pkt(json!({
        "packet_id": "e", "request_id": "r_hello", "type": "error",
        "error": {"code": "protocol_version_unsupported"}
    }));
    assert!(matches!(s.on_received(&error).unwrap(), Accepted::Error(Some(_))));
    // A new hello may be sent.
    s.on_sent(&hello(&["xagent.im.v2"])).unwrap();
}

#[test]
fn channel_not_open() {
    let mut s = connector_ready();
    assert_eq!(
        code(s.on_received(&tool_invoke("r1", Some("cch_other")))),
        ErrorCode::ChannelNotOpen
    );
    let mut x = xagent_ready();
    assert_eq!(
        code(x.on_received(&chat_message("p", "cch_other", "m"))),
        ErrorCode::ChannelNotOpen
    );
    assert_eq!(code(x.on_sent(&tool_invoke("r1", Some("cch_other")))), ErrorCode::ChannelNotOpen);
}

#[test]
fn channel_not_open_after_close() {
    let mut s = connector_ready();
    let close = pkt(json!({
        "packet_id": "p_close", "request_id": "r_close", "connector_channel_id": "cch_1",
        "type": "channel.close"
    }));
    assert!(matches!(s.on_received(&close).unwrap(), Accepted::ChannelClosed { .. }));
    // The close ack still pairs with its request.
    let close_ack = pkt(json!({
        "packet_id": "p_close_ack", "request_id": "r_close", "reply_to": "p_close",
        "connector_channel_id": "cch_1", "type": "channel.close.ack", "payload": {"status": "ok"}
    }));
    assert!(matches!(s.on_sent(&close_ack).unwrap(), Accepted::Reply(Some(_))));
    assert_eq!(code(s.on_received(&tool_invoke("r2", Some("cch_1")))), ErrorCode::ChannelNotOpen);
    assert_eq!(code(s.on_sent(&chat_message("p", "cch_1", "m"))), ErrorCode::ChannelNotOpen);
}

#[test]
fn connector_channel_id_required() {
    let mut s = connector_ready();
    assert_eq!(
        code(s.on_received(&tool_invoke("r1", None))),
        ErrorCode::ConnectorChannelIdRequired
    );
    let mut value = chat_message("p", "cch_1", "m").to_value().unwrap();
    value.as_object_mut().unwrap().remove("connector_channel_id");
    assert_eq!(code(s.on_sent(&pkt(value))), ErrorCode::ConnectorChannelIdRequired);
    // channel.open.ack must name the opened channel.
    let mut x = session(Side::Xagent, &["xagent.im.v2"]);
    x.on_sent(&hello(&["xagent.im.v2"])).unwrap();
    x.on_received(&hello_ack()).unwrap();
    x.on_sent(&open("r_open")).unwrap();
    let mut ack = open_ack("r_open", "cch_1", &["xagent.im.v2"]).to_value().unwrap();
    ack.as_object_mut().unwrap().remove("connector_channel_id");
    assert_eq!(code(x.on_received(&pkt(ack))), ErrorCode::ConnectorChannelIdRequired);
}

#[test]
fn connector_channel_not_owned() {
    let mut s = connector_ready().with_ownership(|channel: &ConnectorChannelId| {
        if channel.as_str() == "cch_someone_else" {
            ChannelOwner::NotOwned
        } else {
            ChannelOwner::Unknown
        }
    });
    assert_eq!(
        code(s.on_received(&tool_invoke("r1", Some("cch_someone_else")))),
        ErrorCode::ConnectorChannelNotOwned
    );
    assert_eq!(code(s.on_received(&tool_invoke("r2", Some("cch_x")))), ErrorCode::ChannelNotOpen);
}

#[test]
fn connector_channel_connector_mismatch() {
    let mut s =
        connector_ready().with_ownership(|_: &ConnectorChannelId| ChannelOwner::OtherConnector);
    assert_eq!(
        code(s.on_received(&tool_invoke("r1", Some("cch_9")))),
        ErrorCode::ConnectorChannelConnectorMismatch
    );
    // A channel.open.ack whose Descriptor names another Card.
    let mut x = session(Side::Xagent, &["xagent.im.v2"]);
    x.on_sent(&hello(&["xagent.im.v2"])).unwrap();
    x.on_received(&hello_ack()).unwrap();
    x.on_sent(&open("r_open")).unwrap();
    let mut ack = open_ack("r_open", "cch_1", &["xagent.im.v2"]).to_value().unwrap();
    ack["payload"]["connection_descriptor"]["connection"]["connector_card_id"] = json!("im.other");
    assert_eq!(code(x.on_received(&pkt(ack))), ErrorCode::ConnectorChannelConnectorMismatch);
    assert!(!x.is_open(&"cch_1".into()));
}

#[test]
fn connector_id_mismatch_in_descriptor() {
    let mut x = session(Side::Xagent, &["xagent.im.v2"]);
    x.on_sent(&hello(&["xagent.im.v2"])).unwrap();
    x.on_received(&hello_ack()).unwrap();
    x.on_sent(&open("r_open")).unwrap();
    let mut ack = open_ack("r_open", "cch_1", &["xagent.im.v2"]).to_value().unwrap();
    ack["payload"]["connection_descriptor"]["connection"]["connector_id"] = json!("conn_other");
    assert_eq!(code(x.on_received(&pkt(ack))), ErrorCode::ConnectorIdMismatch);
    // A pushed Descriptor with another runtime id is ignored, not answered.
    let mut x = xagent_ready();
    let mut d = descriptor("cch_1", &["xagent.im.v2"]);
    d["connection"]["connector_id"] = json!("conn_other");
    let push = pkt(json!({
        "packet_id": "p_push", "connector_channel_id": "cch_1", "type": "connection.descriptor.push",
        "payload": {"connection_descriptor": d}
    }));
    let rejection = x.on_received(&push).unwrap_err();
    assert_eq!(rejection.error.code, ErrorCode::ConnectorIdMismatch);
    assert_eq!(rejection.action, RejectAction::Ignore);
}

#[test]
fn unsupported_packet() {
    let mut s = connector_ready();
    let unknown = pkt(
        json!({"packet_id": "p", "connector_channel_id": "cch_1", "type": "session.sync_request"}),
    );
    assert_eq!(code(s.on_received(&unknown)), ErrorCode::UnsupportedPacket);
    // Wrong direction: a Connector may not send deltas or activity.
    let delta = pkt(json!({
        "packet_id": "p_d", "connector_channel_id": "cch_1", "type": "chat.message.delta",
        "payload": {"message_id": "m", "sequence": 1, "text": "x"}
    }));
    assert_eq!(code(s.on_sent(&delta)), ErrorCode::UnsupportedPacket);
    assert!(s.on_received(&delta).is_ok());
    // A Profile not negotiated.
    let push = pkt(json!({
        "packet_id": "p_mp", "connector_channel_id": "cch_1", "type": "message.push",
        "payload": {"provider": "wechat", "text": "hi"}
    }));
    assert_eq!(code(s.on_sent(&push)), ErrorCode::UnsupportedPacket);
}

#[test]
fn unsupported_packet_when_channel_lacks_the_profile() {
    let mut s = session(Side::Connector, &["xagent.im.v1", "xagent.im.v2"]);
    s.on_received(&hello(&["xagent.im.v1", "xagent.im.v2"])).unwrap();
    s.on_sent(&hello_ack()).unwrap();
    s.on_received(&open("r_open")).unwrap();
    s.on_sent(&open_ack("r_open", "cch_1", &["xagent.im.v1"])).unwrap();
    assert_eq!(code(s.on_sent(&chat_message("p", "cch_1", "m"))), ErrorCode::UnsupportedPacket);
    // A pushed Descriptor re-negotiates the channel.
    let push = pkt(json!({
        "packet_id": "p_push", "connector_channel_id": "cch_1", "type": "connection.descriptor.push",
        "payload": {"connection_descriptor": descriptor("cch_1", &["xagent.im.v2"])}
    }));
    s.on_sent(&push).unwrap();
    assert!(s.on_sent(&chat_message("p", "cch_1", "m")).is_ok());
    assert_eq!(
        s.channel(&"cch_1".into()).unwrap().profiles.profile_ids(),
        &[ProfileId::from("xagent.im.v2")]
    );
}

#[test]
fn invalid_packet_request_without_request_id() {
    let mut s = connector_ready();
    let mut value = tool_invoke("r1", Some("cch_1")).to_value().unwrap();
    value.as_object_mut().unwrap().remove("request_id");
    assert_eq!(code(s.on_received(&pkt(value))), ErrorCode::InvalidPacket);
}

#[test]
fn invalid_packet_reused_request_id() {
    let mut s = connector_ready();
    s.on_received(&tool_invoke("r1", Some("cch_1"))).unwrap();
    assert_eq!(code(s.on_received(&tool_invoke("r1", Some("cch_1")))), ErrorCode::InvalidPacket);
}

#[test]
fn acks_pair_by_request_id() {
    let mut x = xagent_ready();
    x.on_sent(&tool_invoke("r1", Some("cch_1"))).unwrap();
    // Wrong ack type for the request.
    let wrong = pkt(json!({
        "packet_id": "a", "request_id": "r1", "connector_channel_id": "cch_1",
        "type": "auth.logout.ack", "payload": {"status": "ok"}
    }));
    assert_eq!(code(x.on_received(&wrong)), ErrorCode::InvalidPacket);
    // Wrong reply_to.
    let bad_reply = pkt(json!({
        "packet_id": "a", "request_id": "r1", "reply_to": "p_nope", "connector_channel_id": "cch_1",
        "type": "tool.invoke.ack", "payload": {}
    }));
    assert_eq!(code(x.on_received(&bad_reply)), ErrorCode::InvalidPacket);
    // Ack without request_id.
    let missing = pkt(json!({
        "packet_id": "a", "connector_channel_id": "cch_1", "type": "tool.invoke.ack", "payload": {}
    }));
    assert_eq!(code(x.on_received(&missing)), ErrorCode::InvalidPacket);
    // Unknown request_id: ignored.
    let stale = pkt(json!({
        "packet_id": "a", "request_id": "r_old", "connector_channel_id": "cch_1",
        "type": "tool.invoke.ack", "payload": {}
    }));
    assert_eq!(x.on_received(&stale).unwrap_err().action, RejectAction::Ignore);
    // The right one, with an error (business failure), pairs.
    let failed = pkt(json!({
        "packet_id": "a", "request_id": "r1", "reply_to": "p_r1", "connector_channel_id": "cch_1",
        "type": "tool.invoke.ack", "error": {"code": "tool_invoke_failed", "message": "no text"}
    }));
    assert!(matches!(x.on_received(&failed).unwrap(), Accepted::Reply(Some(_))));
    assert_eq!(x.pending_requests().count(), 0);
}

#[test]
fn timed_out_request_makes_late_ack_ignored() {
    let mut x = xagent_ready();
    x.on_sent(&tool_invoke("r1", Some("cch_1"))).unwrap();
    assert!(x.forget_request(Side::Xagent, &"r1".into()).is_some());
    let late = pkt(json!({
        "packet_id": "a", "request_id": "r1", "connector_channel_id": "cch_1",
        "type": "tool.invoke.ack", "payload": {}
    }));
    assert_eq!(x.on_received(&late).unwrap_err().action, RejectAction::Ignore);
}

#[test]
fn chat_message_acks_pair_by_reply_to() {
    let mut x = xagent_ready();
    // Connector -> xAgent user message, acked by xAgent.
    assert!(matches!(
        x.on_received(&chat_message("pm1", "cch_1", "m1")).unwrap(),
        Accepted::Message(_)
    ));
    assert_eq!(
        code(x.on_sent(&chat_ack("a0", "pm1", "cch_1", "m_other"))),
        ErrorCode::InvalidPacket
    );
    match x.on_sent(&chat_ack("a1", "pm1", "cch_1", "m1")).unwrap() {
        Accepted::MessageAck(message) => assert_eq!(message.message_id, "m1"),
        other => panic!("{other:?}"),
    }
    // xAgent -> Connector assistant message, acked by the Connector.
    x.on_sent(&chat_message("pm2", "cch_1", "m2")).unwrap();
    assert!(matches!(
        x.on_received(&chat_ack("a2", "pm2", "cch_1", "m2")).unwrap(),
        Accepted::MessageAck(_)
    ));
    // An ack to nothing is ignored; an ack without reply_to is invalid.
    assert_eq!(
        x.on_received(&chat_ack("a3", "pm_unknown", "cch_1", "m")).unwrap_err().action,
        RejectAction::Ignore
    );
    let mut value = chat_ack("a4", "pm2", "cch_1", "m2").to_value().unwrap();
    value.as_object_mut().unwrap().remove("reply_to");
    assert_eq!(code(x.on_received(&pkt(value))), ErrorCode::InvalidPacket);
}

#[test]
fn ping_pong_pair_either_way() {
    let mut s = connector_ready();
    let ping = pkt(json!({"packet_id": "pp", "request_id": "rp", "type": "ping"}));
    s.on_sent(&ping).unwrap();
    let pong =
        pkt(json!({"packet_id": "po", "request_id": "rp", "reply_to": "pp", "type": "pong"}));
    assert!(matches!(s.on_received(&pong).unwrap(), Accepted::Reply(Some(_))));
    let bare = pkt(json!({"packet_id": "pb", "type": "ping"}));
    assert!(s.on_received(&bare).is_ok());
}

#[test]
fn outbound_kinds_follow_the_channel() {
    let x = xagent_ready();
    let channel: ConnectorChannelId = "cch_1".into();
    assert_eq!(x.outbound_packet(&channel, "assistant_delta"), Some("chat.message.delta"));
    assert_eq!(x.outbound_packet(&channel, "session.sync_message"), None);
    assert_eq!(x.outbound_packet(&"cch_2".into(), "assistant_delta"), None);
}

#[test]
fn rejection_builds_an_error_packet() {
    let mut s = session(Side::Connector, &["xagent.im.v2"]);
    let request = tool_invoke("r1", Some("cch_1"));
    let rejection = s.on_received(&request).unwrap_err();
    let reply = rejection.error_packet("p_err", &request);
    let value = reply.to_value().unwrap();
    assert_eq!(value["type"], "error");
    assert_eq!(value["request_id"], "r1");
    assert_eq!(value["reply_to"], "p_r1");
    assert_eq!(value["connector_channel_id"], "cch_1");
    assert_eq!(value["error"]["code"], "hello_required");
}

#[test]
fn channels_with_the_same_profiles_share_one_profile_set() {
    let mut s = session(Side::Connector, &["xagent.im.v1", "xagent.im.v2"]);
    s.on_received(&hello(&["xagent.im.v1", "xagent.im.v2"])).unwrap();
    s.on_sent(&hello_ack()).unwrap();
    for (request, channel, profiles) in [
        ("r1", "cch_1", &["xagent.im.v2"][..]),
        ("r2", "cch_2", &["xagent.im.v2"][..]),
        ("r3", "cch_3", &["xagent.im.v1"][..]),
    ] {
        s.on_received(&open(request)).unwrap();
        s.on_sent(&open_ack(request, channel, profiles)).unwrap();
    }
    let profiles = |c: &str| s.channel_profiles(&c.into()).cloned().unwrap();
    assert!(profiles("cch_1").ptr_eq(&profiles("cch_2")), "one shared set, not a copy each");
    assert!(!profiles("cch_1").ptr_eq(&profiles("cch_3")));
    assert_eq!(profiles("cch_3").profile_ids(), &[ProfileId::from("xagent.im.v1")]);
    assert_eq!(s.channel(&"cch_2".into()).unwrap().id, ConnectorChannelId::from("cch_2"));
    assert_eq!(s.open_channels().count(), 3);
}
