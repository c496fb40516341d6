//! The streamable HTTP transport's access control, over real sockets on 127.0.0.1: the bridge
//! signed in to a real `im.webchat` room, served with `serve_http`, called as any local process
//! would (one stateless MCP `tools/call` POST). Without the bearer token, with a wrong one, or
//! with `Host: localhost` the call is refused 401 with `WWW-Authenticate: Bearer`; a flood of
//! wrong tokens turns into 429 while the right token still gets in; and the token is in no log
//! line, at any level.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use xagent_connector_webchat::{ROOM_FLOW, Webchat, WebchatOptions};
use xagent_mcp::{BridgeConfig, HttpAuth, LinkConfig};
use xagent_protocol_types::{AuthInput, Secret};
use xagent_testkit::{Serving, bind_local};

const API_KEY: &str = "sk-mcp-http-test-7a31";
const ROOM: &str = "http-room";
const ACCESS_CODE: &str = "code-8765-room";
const TOKEN: &str = "c0ffee11c0ffee22c0ffee33c0ffee44c0ffee55c0ffee66";

/// Every log line of this test binary, at every level.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// One stateless `tools/call` of `connector_channels_list`: (status, WWW-Authenticate, body).
async fn call(url: &str, token: Option<&str>, host: Option<&str>) -> (u16, Option<String>, String) {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "name": "connector_channels_list", "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"}
            }
        }
    });
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "connector_channels_list")
        .timeout(Duration::from_secs(20))
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(host) = host {
        request = request.header("host", host);
    }
    let response = request.send().await.unwrap_or_else(|e| panic!("POST /mcp: {e}"));
    let status = response.status().as_u16();
    let challenge =
        response.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (status, challenge, response.text().await.unwrap_or_default())
}

/// The Tool result of a successful call's body (SSE or JSON).
fn result(body: &str) -> Option<Value> {
    body.lines()
        .map(|l| l.strip_prefix("data:").unwrap_or(l).trim())
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| v.get("result").cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_transport_requires_the_bearer_token() {
    let captured = Captured::default();
    let writer = captured.clone();
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .try_init();

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
                .with("owner_code", "owner-code-http-5678"),
            ..LinkConfig::new(base.clone())
        },
        state_dir: dir.path().join("bridge"),
    })
    .await
    .unwrap_or_else(|e| panic!("the bridge connects and signs in: {e}"));

    let shutdown = CancellationToken::new();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<SocketAddr>();
    let mut auth = HttpAuth::new(Secret::new(TOKEN));
    auth.failures_per_minute = 20;
    let served = tokio::spawn(xagent_mcp::serve_http(
        link,
        "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
        auth,
        shutdown.clone(),
        move |bound| {
            let _ = bound_tx.send(bound);
        },
    ));
    let bound = bound_rx.await.unwrap_or_else(|e| panic!("the HTTP transport listens: {e}"));
    let url = format!("http://{bound}/mcp");

    // The right token: the Tools answer.
    let (status, _, body) = call(&url, Some(TOKEN), None).await;
    assert_eq!(status, 200, "{body}");
    let listed = result(&body).unwrap_or_else(|| panic!("a Tool result: {body}"));
    assert_ne!(listed["isError"], json!(true), "{listed}");

    // No token, a wrong one (also one that shares a prefix), the Host trick: 401 and a challenge.
    let localhost = format!("localhost:{}", bound.port());
    let wrong_prefix = &TOKEN[..TOKEN.len() - 1];
    for (what, token, host) in [
        ("no token", None, None),
        ("a wrong token", Some("0000000000000000000000000000000000000000"), None),
        ("the token minus its last character", Some(wrong_prefix), None),
        ("Host: localhost without a token", None, Some(localhost.as_str())),
    ] {
        let (status, challenge, body) = call(&url, token, host).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert!(
            challenge.as_deref().is_some_and(|c| c.starts_with("Bearer")),
            "{what}: {challenge:?}"
        );
        assert!(
            body.contains("Authorization: Bearer"),
            "{what}: the refusal says what to send: {body}"
        );
        assert!(result(&body).is_none(), "{what}: no Tool ran: {body}");
    }

    // A flood of wrong tokens runs out of 401s and gets 429; the right token still gets in.
    let mut limited = 0;
    for _ in 0..40 {
        let (status, _, _) = call(&url, Some("guess-guess-guess-guess-guess-guess"), None).await;
        if status == 429 {
            limited += 1;
        } else {
            assert_eq!(status, 401);
        }
    }
    assert!(limited > 0, "repeated wrong tokens are rate-limited");
    let (status, _, body) = call(&url, Some(TOKEN), None).await;
    assert_eq!(status, 200, "the owner is never locked out by a flood: {body}");

    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), served).await;
    serving.stop().await;

    let logs = captured.text();
    assert!(logs.contains("bearer token"), "the refusals were logged at all: {} bytes", logs.len());
    assert!(!logs.contains(TOKEN), "the token is in the logs");
    assert!(!logs.contains(wrong_prefix), "a presented token is in the logs");
}
