//! The file Tool path end to end against `im.webchat` over real sockets: the model sees a
//! unified file reference (no Connector `file_ref`, no upload), the runtime uploads the
//! conversation's file on the channel 10.1 resolves to, and the file reaches the room page.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use xagent_client_runtime::{
    BaseUrl, ClientConfig, ControlPlane, DataPlane, FileContent, FileSource, admit,
};
use xagent_connector_webchat::{ROOM_FLOW, TOOL_FILE_SEND, Webchat, WebchatOptions};
use xagent_protocol_types::{AuthInput, AuthStart, AuthStartAck, AuthStatus, Secret};
use xagent_protocol_validate::AdmissionWindow;
use xagent_testkit::{Serving, bind_local, first_sse_event, temp_state_dir};

const API_KEY: &str = "sk-file-tool-3f9a0c";

/// The conversation's files, as the application knows them.
struct Conversation;

impl FileSource for Conversation {
    fn open(&self, reference: &str) -> BoxFuture<'_, Result<FileContent, String>> {
        let found = (reference == "conv-file-7").then(|| FileContent {
            filename: "chart.png".into(),
            mime_type: "image/png".into(),
            bytes: b"\x89PNG chart".to_vec(),
        });
        Box::pin(async move { found.ok_or_else(|| "no such file in the conversation".to_owned()) })
    }
}

async fn snapshot(http: &reqwest::Client, base: &str, token: &str) -> Value {
    let events = http.get(format!("{base}/chat/api/rooms/lobby/events")).bearer_auth(token);
    first_sse_event(events.send().await.expect("events")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_ref_rule_webchat_file_send_end_to_end() {
    let dir = temp_state_dir("file-tool");
    let listener = bind_local(None).await.expect("binds");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let options = WebchatOptions::new(&dir, base.clone()).with_api_key(Secret::new(API_KEY));
    let webchat = Webchat::open(options).await.expect("opens");
    let serving = Serving::spawn(listener, |listener, shutdown| async move {
        let _ = webchat.serve(listener, shutdown).await;
    });

    let base_url = BaseUrl::parse(&base).expect("base");
    let control = ControlPlane::new(base_url.clone(), Some(Secret::new(API_KEY)));
    let admitted = admit(&control, &AdmissionWindow::default(), None).await.expect("admitted");
    let config =
        ClientConfig::for_card(base_url, &admitted.card).with_api_key(Secret::new(API_KEY));
    let (plane, _events) = DataPlane::connect(config).await.expect("starts");
    plane.set_file_source(Arc::new(Conversation));
    plane.connected().await.expect("online");
    let channel = plane.open_channel_for("alice", None).await.expect("opened").connector_channel_id;
    let input = AuthInput::default()
        .with("room_name", "Lobby")
        .with("access_code", "code-1234")
        .with("owner_code", "owner-1234");
    let signed: AuthStartAck = plane
        .request(Some(&channel), AuthStart::new(ROOM_FLOW).with_input(input))
        .await
        .expect("auth.start");
    assert_eq!(signed.0.status, AuthStatus::Authenticated);

    // What the model sees: a file from the conversation, nothing about uploads.
    let tools = plane.model_tools("alice");
    let file_send = tools.iter().find(|t| t.name.as_str() == TOOL_FILE_SEND).expect("projected");
    let schema = serde_json::to_string(&file_send.parameters).expect("encodes");
    assert!(!schema.contains("x-xagent-upload-ref"), "{schema}");
    assert!(!schema.to_lowercase().contains("upload"), "{schema}");
    assert!(
        file_send.parameters["properties"]["file_ref"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("A file from the conversation"))
    );

    // A visitor in the room.
    let http = reqwest::Client::new();
    let joined: Value = http
        .post(format!("{base}/chat/api/rooms/lobby/join"))
        .json(&json!({"access_code": "code-1234"}))
        .send()
        .await
        .expect("join")
        .json()
        .await
        .expect("join body");
    let token = joined["token"].as_str().expect("token").to_owned();

    // The model's call: its own file reference; the runtime uploads on the resolved channel.
    let arguments = json!({"connector_channel_id": "whatever-the-model-said",
        "file_ref": "conv-file-7", "text": "the chart"});
    let outcome = plane
        .invoke_tool(
            "alice",
            None,
            TOOL_FILE_SEND,
            arguments.as_object().cloned().unwrap_or_default(),
        )
        .await
        .expect("the file Tool runs");
    assert_eq!(outcome.channel, channel, "resolved to the user's signed-in room");
    assert_eq!(outcome.ack.result.as_ref().map(|r| r["status"].clone()), Some(json!("sent")));

    // The file reached the page.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let file = loop {
        let seen = snapshot(&http, &base, &token).await;
        if let Some(file) = seen["messages"]
            .as_array()
            .and_then(|m| m.iter().find_map(|e| e["files"].get(0).cloned()))
        {
            break file;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the file never reached the room: {seen:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(file["filename"], "chart.png");

    // A reference the application does not know is refused before anything is sent.
    let unknown = json!({"connector_channel_id": "x", "file_ref": "conv-file-404"});
    let refused = plane
        .invoke_tool(
            "alice",
            None,
            TOOL_FILE_SEND,
            unknown.as_object().cloned().unwrap_or_default(),
        )
        .await;
    assert_eq!(refused.err().map(|e| e.code().to_string()).as_deref(), Some("invalid_arguments"));

    plane.close().await;
    serving.stop().await;
}
