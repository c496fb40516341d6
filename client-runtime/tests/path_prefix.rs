//! Both halves joined over real sockets behind a path-prefixed Base URL: `server-runtime` signs
//! `/prefix/files/refs/...` and the client must fetch exactly that (the prefix was once added
//! twice); a file goes both ways, and a Card Tool runs through 10.1 resolution.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::json;
use xagent_client_runtime::{
    BaseUrl, ClientConfig, ClientEvent, ControlPlane, DataPlane, FileSink, admit,
    next_event_matching,
};
use xagent_protocol_types::{ChatFile, ChatMessage, ConnectorChannelId, Secret};
use xagent_protocol_validate::AdmissionWindow;
use xagent_server_runtime::{ConnectorServer, RuntimeConfig};
use xagent_testkit::{ECHO_CARD_ID, echo_connector, temp_state_dir};

const API_KEY: &str = "sk-prefix-test-51c0e2";
const PREFIX: &str = "/connectors/echo";

/// A saved file: its name and bytes.
type SavedFile = (String, Vec<u8>);

/// Keeps every saved file in memory.
#[derive(Default, Clone)]
struct Saved(Arc<Mutex<Vec<SavedFile>>>);

impl FileSink for Saved {
    fn save(
        &self,
        _channel: &ConnectorChannelId,
        file: &ChatFile,
        bytes: Vec<u8>,
    ) -> BoxFuture<'_, Result<String, String>> {
        let name = file.filename.clone().unwrap_or_default();
        Box::pin(async move {
            let mut saved = self.0.lock().map_err(|_| "poisoned".to_owned())?;
            saved.push((name, bytes));
            Ok(format!("saved_{}", saved.len()))
        })
    }
}

#[tokio::test]
async fn download_url_rule_a_prefixed_base_url_moves_a_file_both_ways() {
    let dir = temp_state_dir("prefix");
    let (connector, echo) = echo_connector();
    let server = ConnectorServer::builder(connector)
        .config(RuntimeConfig::default().with_base_path(PREFIX))
        .state_dir(&dir)
        .expect("state dir")
        .api_key(Secret::new(API_KEY))
        .build()
        .await
        .expect("builds");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = server.clone();
    let join = tokio::spawn(async move {
        let _ = running
            .serve(listener, async move {
                let _ = stopped.await;
            })
            .await;
    });

    let base = BaseUrl::parse(&format!("http://{addr}{PREFIX}")).expect("base");
    let control = ControlPlane::new(base.clone(), Some(Secret::new(API_KEY)));
    let admitted =
        admit(&control, &AdmissionWindow::default(), Some(ECHO_CARD_ID)).await.expect("admitted");
    let config = ClientConfig::for_card(base, &admitted.card).with_api_key(Secret::new(API_KEY));
    let (plane, mut events) = DataPlane::connect(config).await.expect("starts");
    let saved = Saved::default();
    plane.set_file_sink(Arc::new(saved.clone()));
    tokio::time::timeout(Duration::from_secs(10), plane.connected())
        .await
        .expect("in time")
        .expect("online");
    let channel = plane.open_channel_for("alice", None).await.expect("opened").connector_channel_id;
    support::authenticate(&plane, &channel).await;
    plane.remember_channel(channel.clone()).await;

    // Connector -> xAgent: the signed path already carries the prefix.
    let handle = server.handle();
    let file = handle
        .register_file(&channel, "in.txt", Some("text/plain"), b"from the target")
        .await
        .expect("registered");
    let url = file.download_url.clone().unwrap_or_default();
    assert!(url.starts_with(&format!("{PREFIX}/files/refs/")), "{url}");
    let message = ChatMessage::with_files("in_file_1", Some("a file".into()), vec![file]);
    handle.send_message(&channel, message).await.expect("sent");
    let event = next_event_matching(&mut events, Duration::from_secs(10), |e| {
        matches!(e, ClientEvent::ChatMessage(_))
    })
    .await;
    let Some(ClientEvent::ChatMessage(inbound)) = event else {
        panic!("the message with a file reaches the application: {event:?}");
    };
    assert_eq!(inbound.saved_files, vec!["saved_1".to_owned()]);
    inbound.accept();
    let stored = saved.0.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(stored, vec![("in.txt".to_owned(), b"from the target".to_vec())]);

    // xAgent -> Connector: upload on the channel, send it, the author reads the same bytes.
    let content = xagent_client_runtime::FileContent {
        filename: "out.txt".into(),
        mime_type: "text/plain".into(),
        bytes: b"from the agent".to_vec(),
    };
    let uploaded = plane.upload_message_file(&channel, content).await.expect("uploaded");
    let outbound = ChatMessage::with_files("out_file_1", None, vec![uploaded.clone()]);
    plane.send_chat_message(&channel, outbound).await.expect("queued");
    let acked = next_event_matching(&mut events, Duration::from_secs(10), |e| {
        matches!(e, ClientEvent::ChatMessageAcked { .. })
    })
    .await;
    assert!(acked.is_some(), "the Connector acked the file message");
    let delivered = echo.log().delivered.iter().any(|(ch, m, _)| {
        ch == &channel && m.files.iter().any(|f| f.file_ref == uploaded.file_ref)
    });
    assert!(delivered, "the file message reached the target");
    let (_, mut opened) = handle.open_file(&channel, &uploaded.file_ref).await.expect("opens");
    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut opened, &mut bytes).await.expect("reads");
    assert_eq!(bytes, b"from the agent");

    // A Card Tool through 10.1 resolution on the same prefixed connection.
    let arguments = json!({"connector_channel_id": channel.as_str(), "text": "hi"});
    let outcome = plane
        .invoke_tool("alice", None, "echo_send", arguments.as_object().cloned().unwrap_or_default())
        .await
        .expect("the tool runs");
    assert_eq!(outcome.channel, channel);
    assert_eq!(outcome.ack.result.as_ref().and_then(|r| r.get("status")), Some(&json!("sent")));

    plane.close().await;
    server.shutdown();
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), join).await;
}
