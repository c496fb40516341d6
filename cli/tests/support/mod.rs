//! Shared by the CLI's integration tests: `xagent-connector webchat` run as a process (on
//! SQLite in its state directory or on a PostgreSQL database) and reached as xAgent would, with
//! a room signed in and `webchat_message_send` calls.
#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, Lines};
use xagent_client_runtime::{Backoff, BaseUrl, ClientConfig, DataPlane};
use xagent_connector_webchat::{CARD_ID, ROOM_FLOW, TOOL_MESSAGE_SEND};
use xagent_protocol_types::{
    AuthInput, AuthStart, AuthStatus, ConnectorChannelId, PROFILE_IM_V2, Secret, ToolInvoke,
    ToolInvokeContext,
};
use xagent_storage_postgres::DatabaseUrl;
use xagent_testkit::line_containing;

/// A running `xagent-connector webchat`: the process, its address and its whole stderr.
pub struct Webchat {
    /// The process (killed when dropped).
    pub child: tokio::process::Child,
    /// `host:port` it listens on.
    pub addr: String,
    log: tokio::task::JoinHandle<String>,
}

/// Starts im.webchat on `state` with `api_key`, its runtime state in SQLite there or, with
/// `url`, in PostgreSQL (passed in the environment, so no password is in the process list).
pub async fn start_webchat(
    state: &std::path::Path,
    url: Option<&DatabaseUrl>,
    api_key: &str,
) -> Webchat {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"));
    command.env_remove("XAGENT_CONNECTOR_DATABASE_URL");
    if let Some(url) = url {
        command.env("XAGENT_CONNECTOR_DATABASE_URL", url.expose());
    }
    let mut child = command
        .env("XAGENT_CONNECTOR_API_KEY", api_key)
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
    let addr = webchat_addr(BufReader::new(stdout).lines()).await;
    Webchat { child, addr, log }
}

/// Reads im.webchat's stdout up to its "listening on" line and returns the address in it;
/// the rest of stdout is drained in the background so the process never blocks on it.
pub async fn webchat_addr<R: AsyncRead + Unpin + Send + 'static>(
    mut lines: Lines<BufReader<R>>,
) -> String {
    let line = line_containing(&mut lines, "im.webchat listening on").await;
    let addr = line
        .strip_prefix("im.webchat listening on http://")
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the listening line")
        .to_owned();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    addr
}

/// Every line of `stream` until it ends.
pub async fn read_all(stream: impl AsyncRead + Unpin) -> String {
    let mut lines = BufReader::new(stream).lines();
    let mut all = String::new();
    while let Ok(Some(line)) = lines.next_line().await {
        all.push_str(&line);
        all.push('\n');
    }
    all
}

impl Webchat {
    /// SIGTERM, a clean exit, then the whole log once the process is gone.
    pub async fn stop(mut self) -> String {
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

/// An xAgent data plane to im.webchat at `addr`, connected, with quick retries.
pub async fn connect(addr: &str, api_key: &str) -> DataPlane {
    let base = BaseUrl::parse(&format!("http://{addr}")).expect("base url");
    let mut config = ClientConfig::new(base, CARD_ID, vec![PROFILE_IM_V2.into()])
        .with_api_key(Secret::new(api_key));
    config.backoff = Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(300),
        factor: 2.0,
        max_failures: Some(200),
    };
    config.request_timeout = Duration::from_secs(10);
    let (plane, _events) = DataPlane::connect(config).await.expect("the data plane starts");
    tokio::time::timeout(Duration::from_secs(20), plane.connected())
        .await
        .expect("connects in time")
        .expect("connects");
    plane
}

/// Opens a channel and signs it in to a new room "Lobby"; the channel is remembered.
pub async fn open_room(plane: &DataPlane) -> ConnectorChannelId {
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
    channel
}

/// A `webchat_message_send` of `text` on `channel` with the call id `call_id`.
pub fn send(channel: &ConnectorChannelId, call_id: &str, text: &str) -> ToolInvoke {
    let Value::Object(mut arguments) = json!({"text": text}) else { unreachable!("an object") };
    arguments.insert("connector_channel_id".into(), json!(channel.as_str()));
    ToolInvoke::new(TOOL_MESSAGE_SEND, arguments)
        .with_context(ToolInvokeContext::with_call_id(call_id))
}

/// `url` with a password put in (testkit's server trusts local connections, so the password
/// is carried but not checked, which lets a test see it never reaches a log).
pub fn with_password(url: &DatabaseUrl, password: &str) -> DatabaseUrl {
    DatabaseUrl::parse(&url.expose().replacen(
        "://postgres@",
        &format!("://postgres:{password}@"),
        1,
    ))
    .expect("the URL with a password")
}
