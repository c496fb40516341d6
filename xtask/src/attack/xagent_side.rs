//! Round two, the xAgent side (issue 23): a hostile Connector against a real xAgent-side
//! binary. The Connector is a `server-runtime` Connector (the echo Connector with routes of its
//! own) whose author code puts whatever `download_url` it likes in `chat.message`; what it
//! learns is what its outbox hears back (the ack's code, message and retryability).
//!
//! - `F3`: `xagent-connector mcp` is told to fetch a canary HTTP server on another loopback
//!   port (directly, by the name `localhost`, and through a redirect from the Connector's own
//!   origin), and a closed port; figure: canary connections and whether the acks for the open
//!   and the closed port differ.
//! - `F11`: a 200 MiB body from the Connector's own origin (without a `Content-Length`); figure:
//!   the bridge's peak resident memory growth (`VmHWM`) and whether the refusal is retryable.
//! - `X3`: `xagent-connector mock-xagent` receives a file through a signed URL; figure: signed
//!   URLs in what it prints.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use xagent_profile_im::OutboxEvent;
use xagent_protocol_types::{ChatFile, ChatMessage, FileType};
use xagent_server_runtime::{ConnectorHandle, ConnectorServer};
use xagent_testkit::{ECHO_FLOW, echo_connector};

#[allow(unused_imports)]
use super::*;

/// The attacking Connector's system API key.
const HOSTILE_KEY: &str = "sk-hostile-connector-3f9a20";
/// The body the Connector serves for F11.
const BIG_BODY: u64 = 200 * 1024 * 1024;
/// The bridge's download limit (the runtime's default).
const LIMIT_MIB: f64 = 32.0;

/// The xAgent side's scenarios.
pub(super) async fn run(bin: &Path, _sizes: &Sizes) -> Result<Vec<Outcome>> {
    let canary = Canary::start().await?;
    let mut connector = Hostile::start(&canary).await?;
    let mut bridge = Bridge::start(bin, &connector).await?;
    let f3 = f3(&mut connector, &canary, &bridge).await;
    let f11 = f11(&mut connector, &bridge).await;
    bridge.stop().await;
    let x3 = x3(bin, &mut connector, &bridge.channel).await;
    connector.stop();
    Ok(vec![f3?, f11?, x3?])
}

/// An HTTP server on a loopback port other than the Connector's, counting connections.
struct Canary {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl Canary {
    async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buffer = [0u8; 2048];
                    let _ = socket.read(&mut buffer).await;
                    let _ = socket
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\nConnection: close\r\n\r\nsecret-admin-page")
                        .await;
                });
            }
        });
        Ok(Self { port, hits })
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// What the hostile Connector's outbox heard for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heard {
    Accepted,
    /// Rejected for good: "rejected CODE: MESSAGE".
    Final(String),
    /// Rejected, retryable.
    Retry(String),
    /// Nothing within the wait.
    Nothing,
}

impl Heard {
    fn text(&self) -> String {
        match self {
            Self::Accepted => "accepted".into(),
            Self::Final(reason) => format!("final: {reason}"),
            Self::Retry(reason) => format!("retryable: {reason}"),
            Self::Nothing => "no answer".into(),
        }
    }
}

/// The hostile Connector: the echo Connector served on 127.0.0.1 with routes of its own
/// origin (a redirect to the canary, a 200 MiB body).
struct Hostile {
    server: ConnectorServer,
    handle: ConnectorHandle,
    addr: std::net::SocketAddr,
    dir: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    produced: Arc<AtomicU64>,
    sent: usize,
}

impl Hostile {
    async fn start(canary: &Canary) -> Result<Self> {
        let dir = fresh_dir()?;
        let (connector, _echo) = echo_connector();
        let produced = Arc::new(AtomicU64::new(0));
        let counted = produced.clone();
        let to = format!("http://127.0.0.1:{}/admin", canary.port);
        let server = ConnectorServer::builder(connector)
            .state_dir(dir.join("connector"))
            .map_err(|e| anyhow!("{e}"))?
            .api_key(Secret::new(HOSTILE_KEY))
            .routes(move |_handle| hostile_routes(to, counted))
            .build()
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let (addr, stop) = serve_in_process(&server).await?;
        let handle = server.handle();
        Ok(Self { server, handle, addr, dir, stop: Some(stop), produced, sent: 0 })
    }

    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A signed-in channel other than `except`, once one is routed (at most 30 s).
    async fn channel(&self, except: Option<&ConnectorChannelId>) -> Result<ConnectorChannelId> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let found = self.handle.channels().into_iter().find(|channel| {
                Some(channel) != except
                    && self.handle.is_routed(channel)
                    && self.handle.binding(channel).is_some()
            });
            if let Some(channel) = found {
                return Ok(channel);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("no xAgent channel signed in to the hostile Connector within 30 s")
    }

    /// Sends a `chat.message` with one file at `download_url` and waits (at most `wait`) for
    /// what the outbox hears back.
    async fn offer(
        &mut self,
        channel: &ConnectorChannelId,
        download_url: &str,
        wait: Duration,
    ) -> Result<Heard> {
        self.sent += 1;
        let message_id = format!("in_hostile_{}", self.sent);
        let mut outbox =
            self.handle.outbox_events().ok_or_else(|| anyhow!("the Connector has no outbox"))?;
        let mut file = ChatFile::new(FileType::File, format!("file_hostile_{}", self.sent))
            .with_filename("invoice.pdf")
            .with_mime_type("application/pdf");
        file.download_url = Some(download_url.to_owned());
        let message = ChatMessage::with_files(message_id.as_str(), None, vec![file]);
        self.handle.send_message(channel, message).await.map_err(|e| anyhow!("{e}"))?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let event = match tokio::time::timeout_at(deadline, outbox.recv()).await {
                Err(_) => return Ok(Heard::Nothing),
                Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => continue,
                Ok(Err(_)) => return Ok(Heard::Nothing),
                Ok(Ok(event)) => event,
            };
            match event {
                OutboxEvent::Delivered { message_id: id, .. } if id.as_str() == message_id => {
                    return Ok(Heard::Accepted);
                }
                OutboxEvent::Failed { message_id: id, reason, .. } if id.as_str() == message_id => {
                    return Ok(Heard::Final(reason));
                }
                OutboxEvent::Retrying { message_id: id, reason, .. }
                    if id.as_str() == message_id =>
                {
                    return Ok(Heard::Retry(reason));
                }
                _ => {}
            }
        }
    }

    fn stop(&mut self) {
        self.server.shutdown();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The hostile Connector's own routes: `/hop` redirects to the canary, `/big` streams
/// 200 MiB without a `Content-Length`, counting what was pulled.
fn hostile_routes(to: String, produced: Arc<AtomicU64>) -> axum::Router {
    use axum::body::Body;
    use axum::response::Response;
    axum::Router::new()
        .route(
            "/hop",
            axum::routing::get(move || {
                let to = to.clone();
                async move {
                    Response::builder()
                        .status(302)
                        .header("location", to)
                        .body(Body::empty())
                        .unwrap_or_default()
                }
            }),
        )
        .route(
            "/big",
            axum::routing::get(move || {
                let produced = produced.clone();
                async move { Response::new(Body::from_stream(big_stream(produced))) }
            }),
        )
}

fn big_stream(
    produced: Arc<AtomicU64>,
) -> impl futures_util::Stream<Item = Result<axum::body::Bytes, std::io::Error>> {
    const CHUNK: u64 = 256 * 1024;
    futures_util::stream::unfold(0u64, move |sent| {
        let produced = produced.clone();
        async move {
            if sent >= BIG_BODY {
                return None;
            }
            produced.fetch_add(CHUNK, Ordering::SeqCst);
            Some((Ok(axum::body::Bytes::from(vec![0x25u8; CHUNK as usize])), sent + CHUNK))
        }
    })
}

/// `xagent-connector mcp` on stdio (its stdin kept open), signed in to the hostile Connector.
struct Bridge {
    child: tokio::process::Child,
    pid: u32,
    channel: ConnectorChannelId,
}

impl Bridge {
    async fn start(bin: &Path, connector: &Hostile) -> Result<Self> {
        let dir = connector.dir.join("bridge");
        let log = std::fs::File::create(connector.dir.join("bridge.log"))?;
        let mut child = tokio::process::Command::new(bin)
            .env("XAGENT_CONNECTOR_API_KEY", HOSTILE_KEY)
            .env("RUST_LOG", "info")
            .args(["mcp", "--base-url", &connector.base(), "--state-dir"])
            .arg(&dir)
            .args(["--flow", ECHO_FLOW, "--input", "token=tok-attack"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} mcp", bin.display()))?;
        let pid = child.id().ok_or_else(|| anyhow!("no pid"))?;
        let channel = match connector.channel(None).await {
            Ok(channel) => channel,
            Err(error) => {
                let _ = child.kill().await;
                return Err(error);
            }
        };
        Ok(Self { child, pid, channel })
    }

    async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// F3: a hostile Connector makes the xAgent side fetch other loopback ports.
async fn f3(connector: &mut Hostile, canary: &Canary, bridge: &Bridge) -> Result<Outcome> {
    let channel = bridge.channel.clone();
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        listener.local_addr()?.port()
    };
    let wait = Duration::from_secs(15);
    let open =
        connector.offer(&channel, &format!("http://127.0.0.1:{}/admin", canary.port), wait).await?;
    let shut = connector.offer(&channel, &format!("http://127.0.0.1:{closed}/admin"), wait).await?;
    let named =
        connector.offer(&channel, &format!("http://localhost:{}/admin", canary.port), wait).await?;
    let hop = connector.offer(&channel, &format!("{}/hop", connector.base()), wait).await?;
    // Let a redelivery (if any) happen before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let hits = canary.hits();
    let acks_differ = open != shut;
    let defended = hits == 0 && !acks_differ;
    Ok(Outcome::new(
        "F3",
        "SSRF on the xAgent side: a Connector's download_url reaches other loopback ports",
        defended,
        format!(
            "{hits} canary connection(s); open port: {}; closed port: {}; the acks {}",
            open.text(),
            shut.text(),
            if acks_differ { "differ (a port scanner)" } else { "are identical" }
        ),
    )
    .with(json!({
        "canary_hits": hits,
        "acks_differ": acks_differ,
        "open_port_ack": open.text(),
        "closed_port_ack": shut.text(),
        "by_name_ack": named.text(),
        "redirect_ack": hop.text(),
    })))
}

/// F11: a 200 MiB body from the Connector's own origin.
async fn f11(connector: &mut Hostile, bridge: &Bridge) -> Result<Outcome> {
    let channel = bridge.channel.clone();
    let before = proc_status_kib(bridge.pid, "VmHWM:") as f64 / 1024.0;
    let started = Instant::now();
    let heard = connector
        .offer(&channel, &format!("{}/big", connector.base()), Duration::from_secs(120))
        .await?;
    let peak = proc_status_kib(bridge.pid, "VmHWM:") as f64 / 1024.0;
    let growth = (peak - before).max(0.0);
    let produced_mib = connector.produced.load(Ordering::SeqCst) as f64 / (1024.0 * 1024.0);
    let retryable = !matches!(heard, Heard::Final(_));
    let defended = growth < LIMIT_MIB + 32.0 && !retryable;
    Ok(Outcome::new(
        "F11",
        "inbound downloads read whole before the size check, and the refusal is retryable",
        defended,
        format!(
            "peak RSS {before:.0} -> {peak:.0} MiB (+{growth:.0}), {produced_mib:.0} MiB pulled of 200, answer {} in {:.1} s",
            heard.text(),
            started.elapsed().as_secs_f64()
        ),
    )
    .with(json!({
        "peak_before_mib": before,
        "peak_after_mib": peak,
        "peak_growth_mib": growth,
        "pulled_mib": produced_mib,
        "limit_mib": LIMIT_MIB,
        "retryable": retryable,
        "ack": heard.text(),
    })))
}

/// X3: what `mock-xagent` prints when a file arrives through a signed URL.
async fn x3(bin: &Path, connector: &mut Hostile, bridge: &ConnectorChannelId) -> Result<Outcome> {
    let mut child = tokio::process::Command::new(bin)
        .env("XAGENT_CONNECTOR_API_KEY", HOSTILE_KEY)
        .env("NO_COLOR", "1")
        .args(["mock-xagent", "--base-url", &connector.base()])
        .args(["--flow", ECHO_FLOW, "--input", "token=tok-mock"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {} mock-xagent", bin.display()))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let printed = Arc::new(std::sync::Mutex::new(String::new()));
    let collected = printed.clone();
    let reader = tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(mut text) = collected.lock() {
                text.push_str(&line);
                text.push('\n');
            }
        }
    });
    let outcome = async {
        let channel = connector.channel(Some(bridge)).await?;
        let file = connector
            .handle
            .register_file(&channel, "statement.pdf", Some("application/pdf"), b"%PDF-1.7 signed")
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let message = ChatMessage::with_files("in_signed_x3", Some("a file".into()), vec![file]);
        connector.handle.send_message(&channel, message).await.map_err(|e| anyhow!("{e}"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if printed.lock().map(|t| t.contains("chat.message.ack")).unwrap_or(false) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok::<(), anyhow::Error>(())
    }
    .await;
    let _ = child.kill().await;
    reader.abort();
    outcome?;
    let text = printed.lock().map(|t| t.clone()).unwrap_or_default();
    let signed = text.matches("sig=").count();
    let saw_message = text.contains("\"type\":\"chat.message\"");
    Ok(Outcome::new(
        "X3",
        "mock-xagent's packet log prints signed download URLs",
        saw_message && signed == 0,
        format!(
            "{signed} signed URL(s) printed{}",
            if saw_message { "" } else { "; the chat.message was not printed" }
        ),
    )
    .with(json!({"signed_urls_printed": signed, "message_printed": saw_message})))
}
