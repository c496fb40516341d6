//! `xagent-connector webchat --database-url`: the runtime's state in PostgreSQL (testkit's
//! server). A tool call runs through the process; after a restart the channel and the call's
//! record come back from the database (a repeat of the call gets the first result), the state
//! directory holds no runtime database, and the log shows the URL only redacted.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use xagent_client_runtime::{Backoff, BaseUrl, ClientConfig, DataPlane};
use xagent_connector_webchat::{CARD_ID, ROOM_FLOW, TOOL_MESSAGE_SEND};
use xagent_protocol_types::{
    AuthInput, AuthStart, AuthStatus, ConnectorChannelId, PROFILE_IM_V2, Secret, ToolInvoke,
    ToolInvokeAck, ToolInvokeContext,
};
use xagent_storage_postgres::DatabaseUrl;
use xagent_testkit::line_containing;
use xagent_testkit::postgres::TestPostgres;

const API_KEY: &str = "sk-cli-webchat-database-5c1e";

/// A running `xagent-connector webchat`: the process, its address and its stderr lines.
struct Running {
    child: tokio::process::Child,
    addr: String,
    log: tokio::task::JoinHandle<String>,
}

async fn start(state: &std::path::Path, url: &DatabaseUrl) -> Running {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        // From the environment, so the password is not in the process list.
        .env("XAGENT_CONNECTOR_DATABASE_URL", url.expose())
        .env("RUST_LOG", "info")
        .args(["webchat", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starts");
    let log = tokio::spawn(read_all(child.stderr.take().expect("stderr")));
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = line_containing(&mut lines, "im.webchat listening on").await;
    let addr = line
        .strip_prefix("im.webchat listening on http://")
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the listening line")
        .to_owned();
    // Keep stdout drained.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Running { child, addr, log }
}

async fn read_all(stream: impl AsyncRead + Unpin) -> String {
    let mut lines = BufReader::new(stream).lines();
    let mut all = String::new();
    while let Ok(Some(line)) = lines.next_line().await {
        all.push_str(&line);
        all.push('\n');
    }
    all
}

impl Running {
    /// SIGTERM, then the whole log once the process is gone.
    async fn stop(mut self) -> String {
        #[cfg(unix)]
        {
            let status = xagent_testkit::terminate(&mut self.child).await;
            assert_eq!(status.code(), Some(0), "a clean shutdown: {status:?}");
        }
        #[cfg(not(unix))]
        {
            let _ = self.child.kill().await;
        }
        self.log.await.unwrap_or_default()
    }
}

async fn connect(addr: &str) -> DataPlane {
    let base = BaseUrl::parse(&format!("http://{addr}")).expect("base url");
    let mut config = ClientConfig::new(base, CARD_ID, vec![PROFILE_IM_V2.into()])
        .with_api_key(Secret::new(API_KEY));
    config.backoff = Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(300),
        factor: 2.0,
        max_failures: Some(200),
    };
    config.request_timeout = Duration::from_secs(10);
    let (plane, _events) = DataPlane::start(config);
    tokio::time::timeout(Duration::from_secs(20), plane.connected())
        .await
        .expect("connects in time")
        .expect("connects");
    plane
}

fn send(channel: &ConnectorChannelId, call_id: &str) -> ToolInvoke {
    let Value::Object(mut arguments) = json!({"text": "kept in PostgreSQL"}) else {
        unreachable!("an object")
    };
    arguments.insert("connector_channel_id".into(), json!(channel.as_str()));
    ToolInvoke::new(TOOL_MESSAGE_SEND, arguments)
        .with_context(ToolInvokeContext::with_call_id(call_id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webchat_keeps_the_runtime_state_in_postgres_across_a_restart() {
    let url = TestPostgres::shared().await.fresh_database().await;
    // testkit's server trusts local connections: a password in the URL is carried, not
    // checked, which lets the test see that the log never shows it.
    let url =
        DatabaseUrl::parse(&url.expose().replacen("://postgres@", "://postgres:hunter2-pg@", 1))
            .expect("the URL with a password");
    let state = xagent_testkit::temp_state_dir("cli-webchat-database");

    let running = start(&state, &url).await;
    let plane = connect(&running.addr).await;
    let opened = plane.open_channel(None).await.expect("channel.open");
    let channel = opened.connector_channel_id.clone();
    let input = AuthInput::default()
        .with("room_name", "Lobby")
        .with("access_code", "code-1234")
        .with("owner_code", "owner-5678");
    let ack = plane
        .request(Some(&channel), AuthStart::new(ROOM_FLOW).with_input(input))
        .await
        .expect("auth.start");
    assert_eq!(ack.0.status, AuthStatus::Authenticated, "{:?}", ack.0.message);
    plane.remember_channel(channel.clone()).await;
    let first: ToolInvokeAck =
        plane.request(Some(&channel), send(&channel, "call-pg-1")).await.expect("tool call");
    plane.close().await;
    let log = running.stop().await;

    // Redacted in the log, never in full; no runtime SQLite file beside the Connector's own.
    assert!(log.contains(&url.to_string()), "the log names the database, redacted:\n{log}");
    assert!(!log.contains("hunter2-pg"), "the password never appears in the log:\n{log}");
    assert!(
        !state.join(xagent_server_runtime::DATABASE_FILE).exists(),
        "the runtime's state is not in SQLite"
    );

    // The same database after a restart: the channel, its binding and the call's record.
    let running = start(&state, &url).await;
    let plane = connect(&running.addr).await;
    let reopened = plane.open_channel(Some(&channel)).await.expect("reopen");
    assert_eq!(reopened.connector_channel_id, channel, "the channel came back from PostgreSQL");
    plane.remember_channel(channel.clone()).await;
    let repeat: ToolInvokeAck =
        plane.request(Some(&channel), send(&channel, "call-pg-1")).await.expect("repeat");
    assert_eq!(first.result, repeat.result, "the repeat is answered from the stored record");
    plane.close().await;
    running.stop().await;

    // And the rows are there, read back directly.
    let pool = xagent_storage_postgres::connect(&url, Default::default()).await.expect("pool");
    let client = pool.get().await.expect("connection");
    let calls = client
        .query_one(
            "SELECT COUNT(*) FROM server_tool_calls WHERE channel = $1 AND key = 'call:call-pg-1'",
            &[&channel.as_str()],
        )
        .await
        .expect("counts");
    assert_eq!(calls.get::<_, i64>(0), 1);
    let _ = std::fs::remove_dir_all(state);
}
