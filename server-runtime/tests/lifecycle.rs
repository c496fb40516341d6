//! The whole data-plane lifecycle over a real socket on 127.0.0.1.

mod support;

use serde_json::json;
use xagent_protocol_types::{
    AuthLogout, ChannelClose, ConnectionStatus, DescriptorGet, ErrorCode, Packet, PacketBody, Ping,
    ToolInvoke, ToolInvokeContext,
};
use xagent_testkit::{ECHO_BAD_TOKEN, has_error, payload_json};

fn args(value: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    value.as_object().cloned().unwrap()
}

#[tokio::test]
async fn hello_channel_auth_descriptor_tools_logout_close() {
    let h = support::start_default().await;
    let mut c = h.client().await;

    let ack = c.hello(None).await;
    let connector_id = payload_json(&ack)["connector_id"].as_str().unwrap().to_owned();
    assert!(connector_id.starts_with("conn_im_echo_"), "{connector_id}");
    assert_eq!(payload_json(&ack)["protocol_version"], "3.0");
    assert_eq!(ack.type_str(), "connector.hello.ack");

    let (channel, open) = c.open_channel(None).await;
    assert!(channel.as_str().starts_with("cch_"));
    let descriptor = &payload_json(&open)["connection_descriptor"];
    assert_eq!(descriptor["connection"]["status"], "created");
    assert_eq!(descriptor["connection"]["connector_id"], connector_id.as_str());
    assert_eq!(descriptor["connection"]["profiles"], json!(["xagent.im.v2"]));
    assert_eq!(descriptor["tools"][0]["status"], "unavailable");

    // Tools need a signed-in channel.
    let invoke = c.request(
        ToolInvoke::new("echo_noop", args(json!({"connector_channel_id": channel}))),
        Some(&channel),
    );
    let refused = c.call(invoke).await;
    assert!(has_error(&refused, &ErrorCode::ConnectionNotAuthenticated));

    // A refused token fails the session without binding.
    let failed = c.sign_in(&channel, ECHO_BAD_TOKEN).await;
    assert_eq!(payload_json(&failed)["status"], "failed");

    let signed = c.sign_in(&channel, "tok-echo-secret-123").await;
    let progress = payload_json(&signed);
    assert_eq!(progress["status"], "authenticated");
    assert!(progress["auth_session_id"].as_str().unwrap().starts_with("auth_"));
    assert_eq!(progress["connection_descriptor"]["connection"]["status"], "connected");
    assert_eq!(h.echo.log().poller_starts, 1);

    let get = c.request(DescriptorGet::default(), Some(&channel));
    let got = c.call(get).await;
    let d = &payload_json(&got)["connection_descriptor"];
    assert_eq!(d["tools"][0]["status"], "available");
    assert_eq!(d["target"]["provider"], "echo");

    // Descriptor push from the author.
    h.server.handle().set_status(&channel, ConnectionStatus::Degraded).await.unwrap();
    let (push, _) = c.wait_for("connection.descriptor.push").await;
    assert_eq!(payload_json(&push)["connection_descriptor"]["connection"]["status"], "degraded");
    h.server.handle().set_status(&channel, ConnectionStatus::Connected).await.unwrap();
    c.wait_for("connection.descriptor.push").await;

    // tool.invoke with progress, then idempotent repeat, then conflict.
    let context = ToolInvokeContext::with_call_id("call_1");
    let invoke = c.request(
        ToolInvoke::new("echo_send", args(json!({"connector_channel_id": channel, "text": "hi"})))
            .with_context(context.clone()),
        Some(&channel),
    );
    c.send(&invoke).await;
    let (progress, _) = c.wait_for("tool.progress.push").await;
    assert_eq!(payload_json(&progress)["tool_id"], "echo_send");
    let (first, _) = c.wait_for("tool.invoke.ack").await;
    assert_eq!(first.reply_to.as_ref(), Some(&invoke.packet_id));
    assert_eq!(first.request_id, invoke.request_id);
    assert_eq!(payload_json(&first)["result"]["status"], "sent");

    let again = c.request(
        ToolInvoke::new("echo_send", args(json!({"connector_channel_id": channel, "text": "hi"})))
            .with_context(context.clone()),
        Some(&channel),
    );
    let second = c.call(again).await;
    assert_eq!(payload_json(&second)["result"], payload_json(&first)["result"]);
    assert_eq!(h.echo.log().sent.len(), 1, "a repeated tool_call_id must not run the tool twice");

    let conflict = c.request(
        ToolInvoke::new(
            "echo_send",
            args(json!({"connector_channel_id": channel, "text": "other"})),
        )
        .with_context(context),
        Some(&channel),
    );
    let conflict = c.call(conflict).await;
    assert!(has_error(&conflict, &ErrorCode::IdempotencyConflict), "{conflict:?}");

    // ping / pong keeps request_id.
    let ping = c.request(Ping::default(), None);
    let pong = c.call(ping.clone()).await;
    assert_eq!(pong.type_str(), "pong");
    assert_eq!(pong.request_id, ping.request_id);

    let logout = c.request(AuthLogout::default(), Some(&channel));
    let out = c.call(logout).await;
    assert_eq!(payload_json(&out)["status"], "ok");
    assert_eq!(payload_json(&out)["connection_descriptor"]["connection"]["status"], "created");
    assert_eq!(h.echo.log().signed_out, vec![channel.clone()]);
    assert_eq!(h.echo.log().poller_stops, 1, "the shared poller stops with its last channel");

    let close = c.request(ChannelClose::default(), Some(&channel));
    let closed = c.call(close).await;
    assert_eq!(payload_json(&closed)["status"], "ok");

    // After close the channel is not routed: user-level packets get channel_not_open.
    let get = c.request(DescriptorGet::default(), Some(&channel));
    c.send(&get).await;
    let err = c.next_packet().await;
    assert!(matches!(err.body, PacketBody::Error(_)));
    assert!(has_error(&err, &ErrorCode::ChannelNotOpen));

    // Reopening the same id reuses the channel.
    let (reopened, _) = c.open_channel(Some(&channel)).await;
    assert_eq!(reopened, channel);
    c.close().await;
    h.stop().await;
}

#[tokio::test]
async fn reconnect_reuses_connector_id_and_channel() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    let first = payload_json(&c.hello(None).await)["connector_id"].as_str().unwrap().to_owned();
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok-1").await;
    c.close().await;

    let mut c = h.client().await;
    let again =
        payload_json(&c.hello(Some(&first)).await)["connector_id"].as_str().unwrap().to_owned();
    assert_eq!(again, first);
    let (reopened, ack) = c.open_channel(Some(&channel)).await;
    assert_eq!(reopened, channel);
    assert_eq!(payload_json(&ack)["connection_descriptor"]["connection"]["status"], "connected");
    h.stop().await;
}

#[tokio::test]
async fn unknown_channel_on_open_gets_a_new_id() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let stale = xagent_protocol_types::ConnectorChannelId::new("cch_unknown");
    let (id, ack) = c.open_channel(Some(&stale)).await;
    assert_ne!(id, stale);
    assert_eq!(ack.connector_channel_id.as_ref(), Some(&id));
    assert_eq!(payload_json(&ack)["connector_channel_id"], id.as_str());
    h.stop().await;
}

#[tokio::test]
async fn tool_invoke_rejects_unknown_tool_and_bad_arguments() {
    let h = support::start_default().await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;

    let unknown = c.request(
        ToolInvoke::new("nope", args(json!({"connector_channel_id": channel}))),
        Some(&channel),
    );
    let unknown = c.call(unknown).await;
    assert!(has_error(&unknown, &ErrorCode::ToolNotFound));
    assert_eq!(unknown.type_str(), "tool.invoke.ack");

    let bad = c.request(
        ToolInvoke::new("echo_send", args(json!({"connector_channel_id": channel, "text": 5}))),
        Some(&channel),
    );
    let bad = c.call(bad).await;
    assert!(has_error(&bad, &ErrorCode::InvalidArguments), "{bad:?}");

    let missing = c.request(
        ToolInvoke::new("echo_send", args(json!({"connector_channel_id": channel}))),
        Some(&channel),
    );
    let missing = c.call(missing).await;
    assert!(has_error(&missing, &ErrorCode::InvalidArguments));

    // The tool's own failure is tool_invoke_failed.
    let empty = c.request(
        ToolInvoke::new("echo_send", args(json!({"connector_channel_id": channel, "text": ""}))),
        Some(&channel),
    );
    let empty = c.call(empty).await;
    assert!(has_error(&empty, &ErrorCode::ToolInvokeFailed));

    // Unavailable tool (author override) -> connector_channel_unavailable.
    h.server
        .handle()
        .set_tool_status(
            &channel,
            xagent_protocol_types::DescriptorTool::new(
                "echo_noop",
                xagent_protocol_types::ToolStatus::Unavailable,
            ),
        )
        .await
        .unwrap();
    let noop = c.request(
        ToolInvoke::new("echo_noop", args(json!({"connector_channel_id": channel}))),
        Some(&channel),
    );
    let noop: Packet = c.call(noop).await;
    assert!(has_error(&noop, &ErrorCode::ConnectorChannelUnavailable), "{noop:?}");
    h.stop().await;
}
