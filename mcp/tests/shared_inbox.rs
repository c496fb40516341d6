//! Two bridges of one Card on one PostgreSQL database (testkit's real server) in front of a
//! real `server-runtime` Connector over WebSocket on 127.0.0.1, each with the official Rust
//! MCP SDK's client (rmcp) over an in-memory pipe. Bridge A holds the data plane: its agent
//! takes one message, and A accepts another that carries a file (downloaded from the
//! Connector's own origin). A stops; bridge B, standing by, takes the data plane over, and
//! B's agent gets the message A accepted, with the file's bytes through the file resource,
//! and never the message A's agent already took; the same when A is killed (every task of it
//! ended at once, its lease left to expire).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams, ResourceContents};
use rmcp::service::{RoleClient, RunningService, ServiceExt};
use serde_json::{Map, Value, json};
use xagent_mcp::{BridgeConfig, Link, LinkConfig, McpBridge};
use xagent_profile_im::OutboxEvent;
use xagent_protocol_types::{AuthInput, ChatFile, FileType};
use xagent_server_runtime::prelude::{
    AuthStep, Binding, ChatMessage, Connector, ConnectorServer, DescriptorTarget, Deserialize,
    FlowSpec, JsonSchema, PROFILE_IM_V2, Secret, TargetDeclaration, TargetType,
};
use xagent_storage_postgres::DatabaseUrl;
use xagent_testkit::postgres::TestPostgres;

const API_KEY: &str = "sk-mcp-shared-inbox-3c9a";
const FLOW: &str = "work_token";
const FILE_BYTES: &[u8] = b"the quarterly report, as the target sent it\n";

#[derive(Deserialize, JsonSchema)]
struct TokenForm {
    /// Token
    token: Secret,
}

fn connector() -> Connector {
    let built = Connector::builder("im.shared", "Shared", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "shared", "Shared queue"))
        .profile(PROFILE_IM_V2)
        .form_flow(FlowSpec::new(FLOW, "Token"), |_, form: TokenForm| async move {
            let account = Binding::new(DescriptorTarget::new("shared", "Shared queue"));
            Ok(AuthStep::Authenticated(account.with_secret("token", form.token)))
        })
        .on_message(|_, _message| async {})
        .build();
    match built {
        Ok(connector) => connector,
        Err(error) => panic!("the test Connector is valid: {error}"),
    }
}

/// The Connector, serving the file at `/report` on its own origin.
async fn serve_connector(dir: &std::path::Path) -> (ConnectorServer, std::net::SocketAddr) {
    let server = ConnectorServer::builder(connector())
        .state_dir(dir.join("connector"))
        .unwrap_or_else(|e| panic!("state dir: {e}"))
        .api_key(Secret::new(API_KEY))
        .routes(|_handle| {
            axum::Router::new().route("/report", axum::routing::get(|| async { FILE_BYTES }))
        })
        .build()
        .await
        .unwrap_or_else(|e| panic!("server: {e}"));
    let addr = xagent_testkit::serve_on_loopback(&server).await;
    (server, addr)
}

fn bridge_config(
    addr: std::net::SocketAddr,
    state_dir: std::path::PathBuf,
    url: &DatabaseUrl,
) -> BridgeConfig {
    BridgeConfig {
        link: LinkConfig {
            api_key: Some(Secret::new(API_KEY)),
            flow: Some(FLOW.into()),
            inputs: AuthInput::default().with("token", "t-shared"),
            database_url: Some(url.clone()),
            ..LinkConfig::new(format!("http://{addr}"))
        },
        state_dir,
    }
}

/// rmcp's client on `link`, over an in-memory pipe.
async fn mcp_client(link: Arc<Link>) -> RunningService<RoleClient, ()> {
    let (server_io, client_io) = tokio::io::duplex(256 * 1024);
    tokio::spawn(async move {
        if let Ok(service) = McpBridge::new(link).serve(tokio::io::split(server_io)).await {
            let _ = service.waiting().await;
        }
    });
    let client = ().serve(tokio::io::split(client_io)).await;
    client.unwrap_or_else(|e| panic!("the MCP client connects: {e}"))
}

fn arguments(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// `connector_message_wait` with a timeout: the message taken, or `null`.
async fn wait_message(client: &RunningService<RoleClient, ()>, seconds: u64) -> Value {
    let request = CallToolRequestParams::new("connector_message_wait")
        .with_arguments(arguments(json!({ "timeout_seconds": seconds })));
    let result = client.call_tool(request).await.unwrap_or_else(|e| panic!("tools/call: {e}"));
    assert_ne!(result.is_error, Some(true), "{result:?}");
    result.structured_content.unwrap_or_default()["message"].clone()
}

/// What the Connector's outbox heard for one message first.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heard {
    /// Accepted.
    Delivered,
    /// Rejected retryably, with the reason the outbox kept.
    Retrying(String),
}

/// Sends `message` from the target and waits for what the Connector's outbox hears first.
async fn offer(
    server: &ConnectorServer,
    channel: &xagent_protocol_types::ConnectorChannelId,
    message: ChatMessage,
) -> Heard {
    let handle = server.handle();
    let mut outbox = handle.outbox_events().unwrap_or_else(|| panic!("an IM outbox"));
    let message_id = message.message_id.clone();
    handle.send_message(channel, message).await.unwrap_or_else(|e| panic!("send_message: {e}"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let event = tokio::time::timeout_at(deadline, outbox.recv())
            .await
            .unwrap_or_else(|_| panic!("{message_id} was not answered within 30 s"))
            .unwrap_or_else(|e| panic!("outbox events: {e}"));
        match event {
            OutboxEvent::Delivered { message_id: id, .. } if id == message_id => {
                return Heard::Delivered;
            }
            OutboxEvent::Retrying { message_id: id, reason, .. } if id == message_id => {
                return Heard::Retrying(reason);
            }
            OutboxEvent::Failed { message_id: id, reason, .. } if id == message_id => {
                panic!("{message_id} was refused: {reason}")
            }
            _ => {}
        }
    }
}

/// Sends `message` from the target and waits until the Connector's outbox heard it accepted.
async fn deliver(
    server: &ConnectorServer,
    channel: &xagent_protocol_types::ConnectorChannelId,
    message: ChatMessage,
) {
    assert_eq!(offer(server, channel, message).await, Heard::Delivered);
}

/// How bridge A stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// `Link::close`: the lease is given up; A's MCP session stays, on the shared inbox.
    Close,
    /// Every task of A ends at once, as at a process's death: nothing is given up, and B
    /// waits for A's lease to expire.
    Kill,
}

/// Runs `work` on A's runtime and waits for it.
async fn on_a<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    runtime.spawn(work).await.unwrap_or_else(|e| panic!("bridge A's task ran: {e}"))
}

async fn takeover(stop: Stop) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let url = TestPostgres::shared().await.fresh_database().await;
    let (server, addr) = serve_connector(dir.path()).await;

    // Bridge A, on a runtime of its own (so a kill can end all of it), takes the Card's holder
    // lease and the data plane; B stands by on the database.
    let runtime_a = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("A's runtime: {e}"));
    let a_config = bridge_config(addr, dir.path().join("a"), &url);
    let (a, client_a) = on_a(&runtime_a, async move {
        let a = xagent_mcp::connect(a_config)
            .await
            .unwrap_or_else(|e| panic!("bridge A connects: {e}"));
        let client = Arc::new(mcp_client(Arc::clone(&a)).await);
        (a, client)
    })
    .await;
    let channel = a.channel_id().unwrap_or_else(|| panic!("bridge A has a channel"));
    let b_config = bridge_config(addr, dir.path().join("b"), &url);
    let b_started = tokio::spawn(xagent_mcp::connect(b_config));
    let wait_on_a = |seconds| {
        let client_a = Arc::clone(&client_a);
        async move { wait_message(&client_a, seconds).await }
    };

    // A's agent takes the first message.
    deliver(&server, &channel, ChatMessage::text("msg_first", "taken on A")).await;
    let first = on_a(&runtime_a, wait_on_a(10)).await;
    assert_eq!(first["message_id"], "msg_first", "{first}");

    // A accepts a second one with a file, which its agent does not take.
    let mut file = ChatFile::new(FileType::File, "file_report")
        .with_filename("report.txt")
        .with_mime_type("text/plain");
    file.download_url = Some(format!("http://{addr}/report"));
    deliver(
        &server,
        &channel,
        ChatMessage::with_files("msg_second", Some("see the file".into()), vec![file]),
    )
    .await;
    assert!(!b_started.is_finished(), "B stands by while A holds the data plane");

    // A stops; B takes over.
    let stopped = tokio::time::Instant::now();
    let runtime_a = match stop {
        Stop::Close => {
            on_a(&runtime_a, async move { a.close().await }).await;
            Some(runtime_a)
        }
        Stop::Kill => {
            drop(a);
            runtime_a.shutdown_background();
            None
        }
    };
    let b = tokio::time::timeout(Duration::from_secs(30), b_started)
        .await
        .unwrap_or_else(|_| panic!("B did not take over within 30 s"))
        .unwrap_or_else(|e| panic!("B's start ran: {e}"))
        .unwrap_or_else(|e| panic!("bridge B connects: {e}"));
    eprintln!("{stop:?}: B took over {} ms after A stopped", stopped.elapsed().as_millis());
    assert_eq!(b.channel_id(), Some(channel.clone()), "B serves the channel A remembered");
    let client_b = mcp_client(Arc::clone(&b)).await;

    // B's agent gets the message A accepted, and its file's bytes through the resource.
    let second = wait_message(&client_b, 10).await;
    assert_eq!(second["message_id"], "msg_second", "{second}");
    assert_eq!(second["text"], "see the file");
    let uri = second["files"][0]["uri"].as_str().unwrap_or_else(|| panic!("a file: {second}"));
    assert_eq!(second["files"][0]["byte_size"], FILE_BYTES.len());
    let read = client_b
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .unwrap_or_else(|e| panic!("resources/read {uri}: {e}"));
    let blob = match read.contents.first() {
        Some(ResourceContents::BlobResourceContents { blob, .. }) => blob.clone(),
        other => panic!("a blob: {other:?}"),
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(blob)
        .unwrap_or_else(|e| panic!("base64: {e}"));
    assert_eq!(bytes, FILE_BYTES);
    let listed =
        client_b.list_all_resources().await.unwrap_or_else(|e| panic!("resources/list: {e}"));
    assert!(listed.iter().any(|r| r.uri == uri), "the file is listed on B: {listed:?}");

    // The message A's agent took is not handed again, and nothing else is waiting.
    assert_eq!(wait_message(&client_b, 1).await, Value::Null);

    // B holds the data plane now and stores a new message.
    match runtime_a {
        Some(runtime_a) => {
            // An agent still waiting on A's session gets it (a shared inbox is looked at
            // again every second), and B's does not.
            let waiting_on_a = runtime_a.spawn(wait_on_a(20));
            deliver(&server, &channel, ChatMessage::text("msg_third", "after the takeover")).await;
            let third = waiting_on_a.await.unwrap_or_else(|e| panic!("the wait on A ran: {e}"));
            assert_eq!(third["message_id"], "msg_third", "{third}");
            assert_eq!(wait_message(&client_b, 1).await, Value::Null, "taken on A, not on B");
            runtime_a.shutdown_background();
        }
        None => {
            deliver(&server, &channel, ChatMessage::text("msg_third", "after the takeover")).await;
            let third = wait_message(&client_b, 10).await;
            assert_eq!(third["message_id"], "msg_third", "{third}");
        }
    }
    let recent = b.inbox().recent(channel.as_str(), 10).await.unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<&str> = recent.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(ids, ["msg_first", "msg_second", "msg_third"], "one inbox, each message once");
    assert!(recent.iter().all(|m| m.taken), "every message was handed, once");

    let _ = client_b.cancel().await;
    b.close().await;
    server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_inbox_rule_the_bridge_that_takes_over_hands_out_what_the_first_accepted() {
    takeover(Stop::Close).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_inbox_rule_a_killed_holder_loses_no_accepted_message() {
    takeover(Stop::Kill).await;
}

/// The pending limit counts the shared inbox: with `MAX_PENDING_MESSAGES` waiting (stored by
/// any bridge of the Card), a new message is refused retryably, `capacity_exceeded`, and not
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_a_full_shared_inbox_refuses_retryably_until_the_agent_takes_one() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let url = TestPostgres::shared().await.fresh_database().await;
    let (server, addr) = serve_connector(dir.path()).await;
    // Another bridge's messages, as many as the limit, under this Card.
    let pool = xagent_storage_postgres::connect(&url, Default::default())
        .await
        .unwrap_or_else(|e| panic!("pool: {e}"));
    let inbox = xagent_mcp::inbox::Inbox::open_postgres(pool.clone(), "im.shared", 1)
        .await
        .unwrap_or_else(|e| panic!("the inbox's schema: {e}"));
    let limit = i64::try_from(xagent_mcp::link::MAX_PENDING_MESSAGES).unwrap_or(i64::MAX);
    pool.get()
        .await
        .unwrap_or_else(|e| panic!("a connection: {e}"))
        .execute(
            "INSERT INTO xagent_mcp_messages (scope, channel, message_id, text, files, received_at)
             SELECT 'im.shared', 'cch_other', 'msg_' || n, 'waiting', '[]', 1
             FROM generate_series(1, $1::BIGINT) AS n",
            &[&limit],
        )
        .await
        .unwrap_or_else(|e| panic!("filled: {e}"));
    assert_eq!(inbox.pending(None).await.ok(), Some(xagent_mcp::link::MAX_PENDING_MESSAGES));

    let a = xagent_mcp::connect(bridge_config(addr, dir.path().join("a"), &url))
        .await
        .unwrap_or_else(|e| panic!("bridge A connects: {e}"));
    let channel = a.channel_id().unwrap_or_else(|| panic!("bridge A has a channel"));
    let heard = offer(&server, &channel, ChatMessage::text("msg_over", "one too many")).await;
    assert!(
        matches!(&heard, Heard::Retrying(reason) if reason.contains("capacity_exceeded")),
        "{heard:?}"
    );
    assert!(!inbox.contains(channel.as_str(), "msg_over").await.unwrap_or(true));

    // The limit counts what waits, not what was handed: the agent takes one, the count is
    // under the limit again, and the Connector's next attempt (after its 1 s backoff, then
    // 2 s) is accepted.
    let client = mcp_client(Arc::clone(&a)).await;
    assert_eq!(wait_message(&client, 1).await["message_id"], "msg_1");
    assert_eq!(inbox.pending(None).await.ok(), Some(xagent_mcp::link::MAX_PENDING_MESSAGES - 1));
    let stored = tokio::time::timeout(Duration::from_secs(10), async {
        while !inbox.contains(channel.as_str(), "msg_over").await.unwrap_or(false) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(stored.is_ok(), "the refused message is accepted on a later attempt");
    let _ = client.cancel().await;
    a.close().await;
    server.shutdown();
}
