//! `cargo xtask attack [--quick] [--json]`: the attack run of issue 14 as a repeatable suite.
//!
//! Builds `xagent-connector`, starts `xagent-connector webchat` on 127.0.0.1 with a fresh state
//! directory (the API key in a 0600 file), signs an xAgent channel in to a few rooms over the
//! real data plane, then runs each finding's reproduction against it, bounded in time and
//! size. A finding whose attack still works fails the run. `--quick` shortens the floods (CI);
//! the full run's figures go into RELIABILITY.md.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use xagent_client_runtime::{BaseUrl, ClientConfig, DataPlane};
use xagent_protocol_types::{
    AuthInput, AuthStart, AuthStatus, ConnectorChannelId, PROFILE_IM_V2, Secret,
};

mod bridge;
mod homie;
mod listener;
mod round_one;
mod webchat_access;
mod webchat_load;
mod xagent_side;

const API_KEY: &str = "sk-attack-run-5d1c9e0b7a";
const CARD_ID: &str = "im.webchat";
const ROOM_FLOW: &str = "webchat_room";

/// One finding's outcome.
struct Outcome {
    id: &'static str,
    what: &'static str,
    defended: bool,
    detail: String,
    figures: Value,
}

impl Outcome {
    fn new(
        id: &'static str,
        what: &'static str,
        defended: bool,
        detail: impl Into<String>,
    ) -> Self {
        Self { id, what, defended, detail: detail.into(), figures: Value::Null }
    }

    fn with(mut self, figures: Value) -> Self {
        self.figures = figures;
        self
    }
}

/// Sizes of the floods.
struct Sizes {
    full: bool,
    drain_messages: usize,
    guess_seconds: f64,
    stream_attempts: usize,
    history_messages: usize,
    uploads: usize,
    upload_mib: usize,
}

/// Runs the suite.
pub fn run(root: &Path, args: &[String]) -> Result<ExitCode> {
    let quick = args.iter().any(|a| a == "--quick");
    let json_out = args.iter().any(|a| a == "--json");
    if let Some(other) = args.iter().find(|a| !matches!(a.as_str(), "--quick" | "--json")) {
        bail!("unknown flag {other:?}; usage: cargo xtask attack [--quick] [--json]");
    }
    let bin = build(root)?;
    let sizes = if quick {
        Sizes {
            full: false,
            drain_messages: 100,
            guess_seconds: 2.0,
            stream_attempts: 24,
            history_messages: 20,
            uploads: 4,
            upload_mib: 6,
        }
    } else {
        Sizes {
            full: true,
            drain_messages: 1_000,
            guess_seconds: 10.0,
            stream_attempts: 200,
            history_messages: 200,
            uploads: 8,
            upload_mib: 24,
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let outcomes = runtime.block_on(attack_all(&bin, &sizes))?;
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.defended).collect();
    if json_out {
        let list: Vec<Value> = outcomes
            .iter()
            .map(|o| {
                json!({"finding": o.id, "what": o.what, "defended": o.defended, "detail": o.detail, "figures": o.figures})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({"quick": quick, "findings": list}))?);
    } else {
        println!("attack run against every surface ({})", if quick { "quick" } else { "full" });
        for o in &outcomes {
            let mark = if o.defended { "defended" } else { "ATTACK WORKS" };
            println!("{:<4} {:<13} {} — {}", o.id, mark, o.what, o.detail);
        }
    }
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "xtask attack: {} finding(s) still reproduce: {}",
            failed.len(),
            failed.iter().map(|o| o.id).collect::<Vec<_>>().join(", ")
        );
        Ok(ExitCode::from(1))
    }
}

fn build(root: &Path) -> Result<PathBuf> {
    crate::bench_support::xagent_connector(root)
}

/// The running Connector under attack.
struct Target {
    child: tokio::process::Child,
    pid: u32,
    addr: String,
    dir: PathBuf,
    log: PathBuf,
}

impl Target {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A data-plane WebSocket with the subprotocol and the API key (nothing sent yet).
    async fn socket(
        &self,
    ) -> Result<tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>>
    {
        let url = format!("ws://{}/ws", self.addr);
        Ok(crate::bench_support::PacketSocket::connect(&url, Some(API_KEY)).await?.socket)
    }

    /// Resident memory of the Connector process, MiB.
    fn rss_mib(&self) -> f64 {
        proc_status_kib(self.pid, "VmRSS:") as f64 / 1024.0
    }

    /// Peak resident memory so far, MiB.
    fn peak_mib(&self) -> f64 {
        proc_status_kib(self.pid, "VmHWM:") as f64 / 1024.0
    }
}

fn proc_status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn fresh_dir() -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("xtask-attack-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

async fn start(bin: &Path) -> Result<Target> {
    start_in(bin, fresh_dir()?, "127.0.0.1:0").await
}

/// Starts `xagent-connector webchat` with its state under `dir`, listening on `listen`.
async fn start_in(bin: &Path, dir: PathBuf, listen: &str) -> Result<Target> {
    let key_file = dir.join("api-key");
    std::fs::write(&key_file, API_KEY)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))?;
    }
    let log = dir.join("connector.log");
    let mut child = tokio::process::Command::new(bin)
        .env_remove("XAGENT_CONNECTOR_API_KEY")
        // Debug level: the L2 check reads this log for signed URLs.
        .env(
            "RUST_LOG",
            "debug,hyper=info,h2=info,rustls=info,tungstenite=info,tokio_tungstenite=info",
        )
        .args(["webchat", "--listen", listen, "--state-dir"])
        .arg(dir.join("state"))
        .arg("--api-key-file")
        .arg(&key_file)
        .stdout(Stdio::piped())
        .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&log)?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("the Connector did not start in 30 s")??
        .ok_or_else(|| anyhow!("the Connector exited at start"))?;
    let addr = line
        .strip_prefix("im.webchat listening on http://")
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or_else(|| anyhow!("unexpected first line {line:?}"))?
        .to_owned();
    let pid = child.id().ok_or_else(|| anyhow!("no pid"))?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Target { child, pid, addr, dir, log })
}

/// xAgent's side: a data plane signed in to rooms with the form flow.
async fn xagent(target: &Target) -> Result<DataPlane> {
    let base = BaseUrl::parse(&target.url("")).map_err(|e| anyhow!("{e}"))?;
    let config = ClientConfig::new(base, CARD_ID, vec![PROFILE_IM_V2.into()])
        .with_api_key(Secret::new(API_KEY));
    let (plane, mut events) = DataPlane::connect(config).await?;
    let control = xagent_client_runtime::ControlPlane::new(
        BaseUrl::parse(&target.url("")).map_err(|e| anyhow!("{e}"))?,
        Some(Secret::new(API_KEY)),
    );
    // Accept every visitor message (as xAgent would) so outboxes drain, and fetch its files
    // through their signed URLs (the L2 check looks for those in the log).
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let xagent_client_runtime::ClientEvent::ChatMessage(inbound) = event {
                let urls: Vec<String> =
                    inbound.message.files.iter().filter_map(|f| f.download_url.clone()).collect();
                inbound.accept();
                for url in urls {
                    let _ = control.download(&url).await;
                }
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(15), plane.connected())
        .await
        .context("xAgent could not connect")?
        .map_err(|e| anyhow!("{e}"))?;
    Ok(plane)
}

async fn sign_in(
    plane: &DataPlane,
    channel: Option<&ConnectorChannelId>,
    room: &str,
    code: &str,
) -> Result<ConnectorChannelId> {
    let channel = match channel {
        Some(channel) => channel.clone(),
        None => plane.open_channel(None).await.map_err(|e| anyhow!("{e}"))?.connector_channel_id,
    };
    let ack = plane
        .request(
            Some(&channel),
            AuthStart::new(ROOM_FLOW).with_input(
                AuthInput::default()
                    .with("room_name", room)
                    .with("access_code", code)
                    .with("owner_code", owner_code_for(code).as_str()),
            ),
        )
        .await
        .map_err(|e| anyhow!("{e}"))?;
    if ack.0.status != AuthStatus::Authenticated {
        bail!("signing in to {room} failed: {:?}", ack.0.message);
    }
    plane.remember_channel(channel.clone()).await;
    Ok(channel)
}

/// The owner code the harness gives a room it creates (F7: new rooms need one): derived from
/// the visitors' code, so the same room is always signed in to with the same pair.
fn owner_code_for(code: &str) -> String {
    format!("owner-of-{code}")
}

async fn join(http: &reqwest::Client, target: &Target, room: &str, code: &str) -> Result<String> {
    let response = http
        .post(target.url(&format!("/chat/api/rooms/{room}/join")))
        .json(&json!({"access_code": code}))
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("joining {room} answered {}", response.status());
    }
    let body: Value = response.json().await?;
    body["token"].as_str().map(str::to_owned).ok_or_else(|| anyhow!("no token"))
}

fn form(
    name: &str,
    mime: &str,
    bytes: Vec<u8>,
    text: Option<String>,
) -> Result<reqwest::multipart::Form> {
    let part = reqwest::multipart::Part::bytes(bytes).file_name(name.to_owned()).mime_str(mime)?;
    let mut form = reqwest::multipart::Form::new().part("file", part);
    if let Some(text) = text {
        form = form.text("text", text);
    }
    Ok(form)
}

impl Target {
    /// SIGTERM, then waits for the process to end (at most 20 s).
    async fn terminate(&mut self) -> Result<()> {
        let _ = std::process::Command::new("kill").args(["-TERM", &self.pid.to_string()]).status();
        match tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await {
            Ok(status) => {
                status?;
                Ok(())
            }
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("the Connector did not stop within 20 s of SIGTERM")
            }
        }
    }
}

/// Every surface's scenarios, in report order.
async fn attack_all(bin: &Path, sizes: &Sizes) -> Result<Vec<Outcome>> {
    let mut outcomes = round_one::run(bin, sizes).await?;
    // Round two (issue 23): each surface's module appends its scenarios here.
    outcomes.extend(listener::run(bin, sizes).await?);
    outcomes.extend(xagent_side::run(bin, sizes).await?);
    outcomes.extend(webchat_access::run(bin, sizes).await?);
    outcomes.extend(webchat_load::run(bin, sizes).await?);
    outcomes.extend(bridge::run(bin, sizes).await?);
    outcomes.extend(homie::run(bin, sizes).await?);
    outcomes.sort_by_key(|o| order(o.id));
    Ok(outcomes)
}

/// Report order: round one as issue 14 lists it, then round two's findings by number
/// (`F1`, `F2`, ...), then anything else by name.
fn order(id: &str) -> (usize, usize, String) {
    let first = round_one::order(id);
    if first < round_one::ROUND_ONE_LEN {
        return (0, first, String::new());
    }
    match id.strip_prefix('F').and_then(|n| n.parse::<usize>().ok()) {
        Some(n) => (1, n, String::new()),
        None => (2, 0, id.to_owned()),
    }
}

/// Serves `server` on a fresh 127.0.0.1 port in this process, for the in-process Connectors
/// some scenarios need (a hostile one, a device lab); dropping or sending on the returned
/// sender stops it.
async fn serve_in_process(
    server: &xagent_server_runtime::ConnectorServer,
) -> Result<(std::net::SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = server.clone();
    tokio::spawn(async move {
        let _ = running
            .serve(listener, async move {
                let _ = stopped.await;
            })
            .await;
    });
    Ok((addr, stop))
}
