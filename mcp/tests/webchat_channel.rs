//! The bridge against the reference Connector `im.webchat` over real sockets on 127.0.0.1,
//! driven by the official Rust MCP SDK's client (rmcp) over an in-memory pipe: the code behind
//! `xagent-connector mcp`. A Card Tool call runs on the channel section 10.1 resolves (the
//! bridge's signed-in room), whatever `connector_channel_id` the MCP client passes, and also
//! when it passes none; the Tool list does not offer the argument as a choice.

use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService, ServiceExt};
use serde_json::{Map, Value, json};
use xagent_connector_webchat::{ROOM_FLOW, TOOL_MESSAGE_SEND, Webchat, WebchatOptions};
use xagent_mcp::{BridgeConfig, LinkConfig, McpBridge};
use xagent_protocol_types::{AuthInput, Secret};
use xagent_testkit::{Serving, bind_local};

const API_KEY: &str = "sk-mcp-webchat-test-51f0";
const ROOM: &str = "bridge-room";
const ACCESS_CODE: &str = "code-5678-room";

struct Setup {
    _dir: tempfile::TempDir,
    base: String,
    serving: Serving,
    link: std::sync::Arc<xagent_mcp::Link>,
    client: RunningService<RoleClient, ()>,
}

/// `im.webchat` on 127.0.0.1, a bridge signed in to the room `bridge-room` with the room form
/// flow, and rmcp's client connected to the bridge.
async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let listener = bind_local(None).await.unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    let base = format!("http://{addr}");
    let options = WebchatOptions::new(dir.path().join("webchat"), base.clone())
        .with_api_key(Secret::new(API_KEY));
    let webchat = Webchat::open(options).await.unwrap_or_else(|e| panic!("webchat: {e}"));
    let serving = Serving::spawn(listener, |listener, shutdown| async move {
        let _ = webchat.serve(listener, shutdown).await;
    });
    let link = xagent_mcp::connect(BridgeConfig {
        link: LinkConfig {
            api_key: Some(Secret::new(API_KEY)),
            flow: Some(ROOM_FLOW.into()),
            inputs: AuthInput::default()
                .with("room_name", ROOM)
                .with("access_code", ACCESS_CODE)
                .with("owner_code", "owner-5678-room"),
            ..LinkConfig::new(base.clone())
        },
        state_dir: dir.path().join("bridge"),
    })
    .await
    .unwrap_or_else(|e| panic!("the bridge connects and signs in: {e}"));
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let served = link.clone();
    tokio::spawn(async move {
        if let Ok(service) = McpBridge::new(served).serve(tokio::io::split(server_io)).await {
            let _ = service.waiting().await;
        }
    });
    let client = ().serve(tokio::io::split(client_io)).await;
    let client = client.unwrap_or_else(|e| panic!("the MCP client connects: {e}"));
    Setup { _dir: dir, base, serving, link, client }
}

fn arguments(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The texts of the room's messages, as a visitor who joined with the access code sees them.
async fn room_texts(base: &str) -> Vec<String> {
    let http = reqwest::Client::new();
    let joined = http
        .post(format!("{base}/chat/api/rooms/{ROOM}/join"))
        .json(&json!({ "access_code": ACCESS_CODE }))
        .send()
        .await
        .unwrap_or_else(|e| panic!("join: {e}"));
    assert_eq!(joined.status(), 200, "the visitor joins the bridge's room");
    let body: Value = joined.json().await.unwrap_or_default();
    let token = body["token"].as_str().unwrap_or_default().to_owned();
    let events = http
        .get(format!("{base}/chat/api/rooms/{ROOM}/events"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap_or_else(|e| panic!("events: {e}"));
    let snapshot = xagent_testkit::first_sse_event(events).await;
    snapshot["messages"]
        .as_array()
        .map(|messages| {
            messages.iter().filter_map(|m| m["text"].as_str().map(str::to_owned)).collect()
        })
        .unwrap_or_default()
}

/// Waits until the room shows `text`.
async fn wait_in_room(base: &str, text: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let texts = room_texts(base).await;
        if texts.iter().any(|t| t == text) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{text:?} never reached the room: {texts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn call(setup: &Setup, arguments: Value) -> rmcp::model::CallToolResult {
    let request =
        CallToolRequestParams::new(TOOL_MESSAGE_SEND).with_arguments(self::arguments(arguments));
    setup.client.call_tool(request).await.unwrap_or_else(|e| panic!("tools/call: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolution_10_1_a_made_up_channel_argument_runs_on_the_signed_in_channel() {
    let setup = setup().await;
    let result = call(
        &setup,
        json!({"connector_channel_id": "cch_made_up_by_the_model", "text": "via a made-up id"}),
    )
    .await;
    assert_ne!(result.is_error, Some(true), "the call runs on the resolved channel: {result:?}");
    wait_in_room(&setup.base, "via a made-up id").await;
    let _ = setup.client.cancel().await;
    setup.serving.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_argument_rule_a_call_without_it_runs_on_the_signed_in_channel() {
    let setup = setup().await;
    let tools = setup.client.list_all_tools().await.unwrap_or_else(|e| panic!("tools/list: {e}"));
    let send = tools
        .iter()
        .find(|t| t.name == TOOL_MESSAGE_SEND)
        .unwrap_or_else(|| panic!("{TOOL_MESSAGE_SEND} is listed: {tools:?}"));
    let schema = Value::Object((*send.input_schema).clone());
    assert!(
        schema["properties"].get("connector_channel_id").is_none(),
        "the channel is not offered as a choice: {schema}"
    );
    assert_eq!(schema["required"], json!(["text"]), "{schema}");

    let result = call(&setup, json!({"text": "without a channel"})).await;
    assert_ne!(result.is_error, Some(true), "{result:?}");
    wait_in_room(&setup.base, "without a channel").await;
    assert!(setup.link.channel_id().is_some(), "the bridge has its one channel");
    let _ = setup.client.cancel().await;
    setup.serving.stop().await;
}
