//! Every error-code path of the data plane and the HTTP planes, each named by its rule.

mod support;

use serde_json::json;
use tokio_tungstenite::tungstenite::Message;
use xagent_protocol_types::{
    ConnectorChannelId, ConnectorHello, DescriptorGet, ErrorCode, Packet, PacketBody, ToolInvoke,
};
use xagent_testkit::{Received, WsClient, has_error, is_error_packet};

async fn expect_error(c: &mut WsClient, code: ErrorCode) -> Packet {
    let packet = c.next_packet().await;
    assert!(is_error_packet(&packet), "expected an error packet, got {packet:?}");
    assert!(has_error(&packet, &code), "expected {code}, got {packet:?}");
    packet
}

#[tokio::test]
async fn rule_hello_required_before_anything_else() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    let get = c.request(DescriptorGet::default(), Some(&ConnectorChannelId::new("cch_x")));
    c.send(&get).await;
    let err = expect_error(&mut c, ErrorCode::HelloRequired).await;
    assert_eq!(err.request_id, get.request_id);
    // The connection stays usable: hello still works.
    assert_eq!(c.hello(None).await.type_str(), "connector.hello.ack");
    h.stop().await;
}

#[tokio::test]
async fn rule_binary_frames_and_invalid_json_are_invalid_packet_and_keep_the_connection() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.send_message(Message::Binary(vec![1, 2, 3].into())).await;
    expect_error(&mut c, ErrorCode::InvalidPacket).await;
    c.send_text("{not json").await;
    expect_error(&mut c, ErrorCode::InvalidPacket).await;
    c.send_text(r#"{"schema":"wrong","packet_id":"p","type":"ping"}"#).await;
    expect_error(&mut c, ErrorCode::InvalidPacket).await;
    c.send_text(r#"{"schema":"xagent.connector.packet/v1","type":"ping"}"#).await;
    expect_error(&mut c, ErrorCode::InvalidPacket).await;
    assert_eq!(c.hello(None).await.type_str(), "connector.hello.ack");
    h.stop().await;
}

#[tokio::test]
async fn rule_unsupported_protocol_version_is_refused_and_closed_1008() {
    let h = support::start_default().await;
    for version in [Some("2.0"), None, Some("4.0")] {
        let mut c = h.client().await;
        let mut hello = ConnectorHello::new("im.echo", vec!["xagent.im.v2".into()]);
        hello.protocol_version = version.map(str::to_owned);
        let packet = c.request(hello, None);
        c.send(&packet).await;
        expect_error(&mut c, ErrorCode::ProtocolVersionUnsupported).await;
        assert!(matches!(c.recv().await, Received::Closed(Some(1008))), "version {version:?}");
    }
    h.stop().await;
}

#[tokio::test]
async fn rule_hello_needs_supported_profiles_and_the_right_card() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    let mut hello = ConnectorHello::new("im.echo", vec![]);
    hello.supported_profiles = None;
    let packet = c.request(hello, None);
    c.send(&packet).await;
    expect_error(&mut c, ErrorCode::InvalidPacket).await;

    let packet = c.request(ConnectorHello::new("im.other", vec!["xagent.im.v2".into()]), None);
    c.send(&packet).await;
    expect_error(&mut c, ErrorCode::ConnectorCardIdMismatch).await;

    let packet = c.request(ConnectorHello::new("im.echo", vec!["xagent.device.v1".into()]), None);
    c.send(&packet).await;
    expect_error(&mut c, ErrorCode::InvalidPacket).await;
    h.stop().await;
}

#[tokio::test]
async fn rule_user_level_packets_need_an_open_channel() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let args = json!({"connector_channel_id": "cch_x"}).as_object().cloned().unwrap();
    let invoke = c.request(ToolInvoke::new("echo_noop", args.clone()), None);
    c.send(&invoke).await;
    expect_error(&mut c, ErrorCode::ConnectorChannelIdRequired).await;
    let invoke =
        c.request(ToolInvoke::new("echo_noop", args), Some(&ConnectorChannelId::new("cch_x")));
    c.send(&invoke).await;
    expect_error(&mut c, ErrorCode::ChannelNotOpen).await;
    h.stop().await;
}

#[tokio::test]
async fn rule_unknown_packet_types_get_unsupported_packet() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    c.send_text(r#"{"schema":"xagent.connector.packet/v1","packet_id":"p9","request_id":"r9","type":"session.sync_request"}"#).await;
    let err = expect_error(&mut c, ErrorCode::UnsupportedPacket).await;
    assert_eq!(err.request_id.as_ref().map(|r| r.as_str()), Some("r9"));
    // A packet the Connector sends (wrong direction) is unsupported too.
    c.send_text(r#"{"schema":"xagent.connector.packet/v1","packet_id":"p10","connector_channel_id":"c","type":"tool.progress.push","payload":{"tool_id":"x"}}"#).await;
    expect_error(&mut c, ErrorCode::UnsupportedPacket).await;
    h.stop().await;
}

struct Quiet;

impl xagent_server_runtime::ImTarget for Quiet {
    async fn deliver(
        &self,
        _ctx: xagent_server_runtime::ChannelContext,
        _message: xagent_protocol_types::ChatMessage,
        _how: xagent_server_runtime::FinalDelivery,
    ) -> Result<(), xagent_server_runtime::DeliveryError> {
        Ok(())
    }
}

#[tokio::test]
async fn rule_profile_packets_outside_the_negotiation_are_dropped_silently() {
    use xagent_protocol_types::{PROFILE_DEVICE_V1, PROFILE_IM_V2, TargetDeclaration, TargetType};
    let connector = xagent_server_runtime::Connector::builder("mixed.test", "Mixed", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "mixed", "Mixed"))
        .target(TargetDeclaration::new(TargetType::Device, "mixed", "Mixed device"))
        .profile(PROFILE_IM_V2)
        .profile(PROFILE_DEVICE_V1)
        .im_target(Quiet)
        .build()
        .unwrap();
    let server = xagent_server_runtime::ConnectorServer::builder(connector).build().await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let running = server.clone();
    let task = tokio::spawn(async move { running.serve(listener, std::future::pending()).await });
    let mut c = WsClient::connect(&format!("ws://{addr}/ws"), None).await.unwrap();
    // xAgent supports only the Device Profile: IM v2 is not negotiated.
    let hello = c.request(ConnectorHello::new("mixed.test", vec![PROFILE_DEVICE_V1.into()]), None);
    assert_eq!(c.call(hello).await.type_str(), "connector.hello.ack");
    let (channel, open) = c.open_channel(None).await;
    assert_eq!(
        xagent_testkit::payload_json(&open)["connection_descriptor"]["connection"]["profiles"],
        json!(["xagent.device.v1"])
    );
    let activity = Packet::with_payload("pa", xagent_protocol_types::ChatActivity::thinking())
        .channel(channel.clone());
    c.send(&activity).await;
    let message = Packet::with_payload("pm", xagent_protocol_types::ChatMessage::text("m1", "hi"))
        .channel(channel);
    c.send(&message).await;
    // Nothing answers the dropped packets: the next packet is the pong.
    let ping = c.request(xagent_protocol_types::Ping::default(), None);
    c.send(&ping).await;
    assert_eq!(c.next_packet().await.type_str(), "pong");
    server.shutdown();
    let _ = task.await;
}

#[tokio::test]
async fn rule_packets_over_the_size_limit_close_with_1009() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let big = format!(
        r#"{{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"ping","payload":{{"pad":"{}"}}}}"#,
        "x".repeat(1024 * 1024 + 10)
    );
    c.send_text(big).await;
    match c.recv().await {
        Received::Closed(code) => assert_eq!(code, Some(1009)),
        Received::Packet(p) => panic!("expected a close, got {p:?}"),
    }
    h.stop().await;
}

#[tokio::test]
async fn rule_ws_needs_the_subprotocol_and_the_api_key() {
    let h = support::start_default().await;
    let http = reqwest::Client::new();
    let upgrade = |req: reqwest::RequestBuilder| {
        req.header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
    };
    let no_proto =
        upgrade(http.get(h.http("/ws")).bearer_auth(support::API_KEY)).send().await.unwrap();
    assert_eq!(no_proto.status(), 400);
    let body: serde_json::Value = no_proto.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_packet");

    let no_key = upgrade(
        http.get(h.http("/ws")).header("Sec-WebSocket-Protocol", "xagent.connector.packet.v1"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(no_key.status(), 401);
    assert_eq!(no_key.headers()["www-authenticate"], "Bearer");
    let body: serde_json::Value = no_key.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");

    let wrong = upgrade(
        http.get(h.http("/ws"))
            .bearer_auth("sk-wrong")
            .header("Sec-WebSocket-Protocol", "xagent.connector.packet.v1"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(wrong.status(), 401);

    assert!(WsClient::connect(&h.ws_url(), None).await.is_err());
    let mut ok = WsClient::connect(&h.ws_url(), Some(support::API_KEY)).await.unwrap();
    assert_eq!(ok.hello(None).await.type_str(), "connector.hello.ack");
    h.stop().await;
}

#[tokio::test]
async fn rule_auth_errors() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    let status =
        c.request(xagent_protocol_types::AuthStatusRequest::new("auth_nope"), Some(&channel));
    let status = c.call(status).await;
    assert!(has_error(&status, &ErrorCode::AuthSessionNotFound));
    let cancel = c.request(xagent_protocol_types::AuthCancel::new("auth_nope"), Some(&channel));
    let cancel = c.call(cancel).await;
    assert_eq!(xagent_testkit::payload_json(&cancel)["status"], "not_found");
    let start = c.request(xagent_protocol_types::AuthStart::new("no_such_flow"), Some(&channel));
    let start = c.call(start).await;
    assert!(has_error(&start, &ErrorCode::InvalidPacket));
    let start = c.request(xagent_protocol_types::AuthStart::new("echo_token"), Some(&channel));
    let start = c.call(start).await;
    assert!(has_error(&start, &ErrorCode::InvalidArguments), "a required form field is missing");
    assert!(matches!(start.body, PacketBody::AuthStartAck(None)));
    h.stop().await;
}
