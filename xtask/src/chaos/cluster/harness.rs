//! What the cluster scenarios share: their sizes and names, the processes they start and kill
//! (webchat replicas, mock-xagents, the cluster behind HAProxy), xAgent's side in this process
//! ([`Agent`]), a stop signal, CPU accounting, and small measures.

use crate::chaos::harness::free_port;
use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use xagent_client_runtime::{Backoff, BaseUrl, ClientConfig, ClientEvent, DataPlane};
use xagent_protocol_types::{
    AuthInput, AuthStart, AuthStatus, Clock, ConnectorChannelId, PROFILE_IM_V2, Secret, SystemClock,
};
use xagent_testkit::haproxy::{Balance, HaproxyOptions, TestHaproxy};

/// The system API key every replica and xAgent share.
const KEY: &str = "sk-chaos-cluster-5e1b77a0";

/// im.webchat's Card id and room flow.
const CARD_ID: &str = "im.webchat";

const ROOM_FLOW: &str = "webchat_room";

const TOOL: &str = "webchat_message_send";

/// The caller's deadline for a Tool call (the client runtime's request timeout): a Tool's
/// side effect shown later than this after the call started counts as after expiry.
pub(crate) const TOOL_DEADLINE_MS: u64 = 10_000;

/// The health check of a build without `GET /ready`: a static asset of the page.
const FALLBACK_CHECK: &str = "/chat/assets/icon.svg";

/// The outbox TTL (profile-im's default): a message received later is after expiry.
pub(crate) const TTL_MS: u64 = 60 * 60 * 1000;

pub(crate) struct Sizes {
    /// xAgent side: visitor messages into the one room, and kills of the holder.
    pub(crate) agent_messages: usize,
    pub(crate) agent_kills: usize,
    /// Connector side: channels (rooms), messages in both directions, kills of each kind.
    pub(crate) channels: usize,
    pub(crate) messages: usize,
    pub(crate) kills: usize,
    /// Throughput: visitor senders and seconds per configuration.
    pub(crate) senders: usize,
    pub(crate) seconds: u64,
    /// Connector side: the traffic stops after this long even if not all was sent (a
    /// cluster that fails every Tool call would take a deadline per call).
    pub(crate) max_traffic_seconds: u64,
}

pub(crate) fn now_ms() -> u64 {
    SystemClock.now_millis()
}

/// p50 / p99 / max of `values` (nearest rank), as JSON.
pub(crate) fn percentiles(values: &[u64]) -> Value {
    if values.is_empty() {
        return json!({"p50": null, "p99": null, "max": null, "n": 0});
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank =
        |p: f64| sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
    json!({"p50": rank(0.50), "p99": rank(0.99), "max": sorted[sorted.len() - 1], "n": sorted.len()})
}

// ---------------------------------------------------------------------------------------
// Processes

/// A running `xagent-connector webchat` (one replica).
pub(crate) struct Replica {
    pub(crate) child: Option<Child>,
    pub(crate) port: u16,
    pub(crate) dir: PathBuf,
    pub(crate) database: Option<String>,
    /// Visitor streams and joins are many from one address here: the caps are raised.
    pub(crate) bin: PathBuf,
}

impl Replica {
    pub(crate) async fn start(
        bin: &Path,
        dir: PathBuf,
        database: Option<String>,
    ) -> Result<Replica> {
        let mut replica =
            Replica { child: None, port: free_port()?, dir, database, bin: bin.to_path_buf() };
        replica.restart().await?;
        Ok(replica)
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Starts (again) on the same port and state directory; waits for its `listening` line.
    pub(crate) async fn restart(&mut self) -> Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("replica.log"))?;
        for attempt in 0..50 {
            let mut command = Command::new(&self.bin);
            command
                .env("XAGENT_CONNECTOR_API_KEY", KEY)
                .env("RUST_LOG", "warn")
                .env_remove("XAGENT_CONNECTOR_DATABASE_URL")
                .args(["webchat", "--listen", &format!("127.0.0.1:{}", self.port)])
                .arg("--state-dir")
                .arg(self.dir.join("state"))
                .args(["--streams-per-address", "4096", "--streams-total", "4096"])
                .args(["--streams-per-room", "256", "--joins-per-address-burst", "100000"])
                .args(["--joins-per-address-per-minute", "0"])
                .stdout(Stdio::piped())
                .stderr(log.try_clone()?)
                .kill_on_drop(true);
            // The URL goes through the environment, never the command line.
            if let Some(url) = &self.database {
                command.env("XAGENT_CONNECTOR_DATABASE_URL", url);
            }
            let mut child =
                command.spawn().with_context(|| format!("starting {}", self.bin.display()))?;
            let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
            let mut lines = BufReader::new(stdout).lines();
            let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
            if let Ok(Ok(Some(line))) = first
                && line.starts_with("im.webchat listening on")
            {
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                self.child = Some(child);
                return Ok(());
            }
            let _ = child.kill().await;
            if attempt == 49 {
                let log = std::fs::read_to_string(self.dir.join("replica.log")).unwrap_or_default();
                let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
                bail!("replica on port {} did not start: {tail}", self.port);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("replica did not start")
    }

    /// SIGKILL (no goodbye) and reaped.
    pub(crate) async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// A running `xagent-connector mock-xagent --report-json` and its report lines.
pub(crate) struct Mock {
    pub(crate) child: Option<Child>,
    pub(crate) name: &'static str,
}

/// A report line of a mock: which mock printed it, and the line.
pub(crate) type Reports = Arc<Mutex<Vec<(&'static str, Value)>>>;

impl Mock {
    pub(crate) fn start(
        bin: &Path,
        name: &'static str,
        base: &str,
        database: &str,
        room: &str,
        reports: &Reports,
    ) -> Result<Mock> {
        let mut child = Command::new(bin)
            .env("XAGENT_CONNECTOR_API_KEY", KEY)
            .env("XAGENT_CONNECTOR_DATABASE_URL", database)
            .env("RUST_LOG", "error")
            .args(["mock-xagent", "--base-url", base, "--flow", ROOM_FLOW, "--report-json"])
            .args(["--input", &format!("room_name={room}")])
            .args(["--input", &format!("access_code={}", access_code(room))])
            .args(["--input", &format!("owner_code=owner-{}", access_code(room))])
            .args(["--tool", TOOL, "--args", r#"{"text":"tool {call}"}"#])
            .args(["--repeat-every", "50", "--say"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} mock-xagent", bin.display()))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let reports = reports.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(value) = serde_json::from_str::<Value>(&line)
                    && value.get("report").is_some()
                    && let Ok(mut reports) = reports.lock()
                {
                    reports.push((name, value));
                }
            }
        });
        Ok(Mock { child: Some(child), name })
    }

    pub(crate) async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// The three replicas on one database, and the two load balancers in front of them.
pub(crate) struct Cluster {
    pub(crate) replicas: Vec<Replica>,
    /// xAgent's data plane goes through this one (its sessions say which replica holds it).
    pub(crate) agent_proxy: TestHaproxy,
    /// Visitors' posts and reconnecting pages go through this one.
    pub(crate) page_proxy: TestHaproxy,
    /// The health check path HAProxy uses (`/ready`, or `/health` on a build without it).
    pub(crate) health_path: String,
}

impl Cluster {
    pub(crate) async fn start(
        bin: &Path,
        dir: &Path,
        database: &str,
        count: usize,
    ) -> Result<Cluster> {
        let mut replicas = Vec::new();
        // One after the other: the first applies the schema migrations.
        for n in 0..count {
            replicas.push(
                Replica::start(bin, dir.join(format!("replica{n}")), Some(database.into())).await?,
            );
        }
        let ready = reqwest::get(format!("{}/ready", replicas[0].url())).await?;
        // Before `GET /ready` exists, only a static page answers 200 without the API key
        // (`/health` wants it): it says the process is up, not that it reaches its database.
        let health_path = if ready.status() == reqwest::StatusCode::NOT_FOUND {
            FALLBACK_CHECK.to_owned()
        } else {
            "/ready".to_owned()
        };
        let options = HaproxyOptions::default()
            .with_health_path(health_path.as_str())
            .with_checks(Duration::from_secs(1), 1, 1)
            .with_tunnel_timeout(Duration::from_secs(3600));
        let addrs: Vec<SocketAddr> = replicas.iter().map(Replica::addr).collect();
        let agent_proxy = TestHaproxy::start(&addrs, options.clone()).await?;
        // As docs/CLUSTER.md advises: the replica holding xAgent's socket delivers every
        // message and answers more slowly, so it gets fewer of the visitors' requests.
        let page_proxy =
            TestHaproxy::start(&addrs, options.with_balance(Balance::LeastConn)).await?;
        for addr in &addrs {
            agent_proxy.wait_backend_state(*addr, true, Duration::from_secs(10)).await?;
            page_proxy.wait_backend_state(*addr, true, Duration::from_secs(10)).await?;
        }
        Ok(Cluster { replicas, agent_proxy, page_proxy, health_path })
    }

    /// The replica HAProxy counts xAgent's socket on (a current session), if one.
    pub(crate) async fn holder(&self) -> Option<usize> {
        let csv = self.agent_proxy.admin_command("show stat").await.ok()?;
        let mut header: Vec<&str> = Vec::new();
        for line in csv.lines() {
            if let Some(names) = line.strip_prefix("# ") {
                header = names.split(',').collect();
                continue;
            }
            let column = |name: &str| header.iter().position(|h| *h == name);
            let fields: Vec<&str> = line.split(',').collect();
            let (Some(sv), Some(scur)) = (column("svname"), column("scur")) else { continue };
            let Some(index) =
                fields.get(sv).and_then(|s| s.strip_prefix('b')?.parse::<usize>().ok())
            else {
                continue;
            };
            if fields.get(scur).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0) > 0 {
                return Some(index);
            }
        }
        None
    }

    pub(crate) async fn stop(mut self) {
        for replica in &mut self.replicas {
            replica.kill().await;
        }
    }
}

/// xAgent's data plane through `url`, accepting every inbound message; inbound messages are
/// recorded as (message_id, created_at, received_at) and acks of queued messages by id.
pub(crate) struct Agent {
    pub(crate) plane: DataPlane,
    pub(crate) inbound: Arc<Mutex<Vec<(String, u64, u64)>>>,
    /// The last ack status of each queued message, by id.
    pub(crate) acked: Arc<Mutex<HashMap<String, String>>>,
}

impl Agent {
    pub(crate) async fn connect(url: &str) -> Result<Agent> {
        let base = BaseUrl::parse(url).map_err(|e| anyhow!("{e}"))?;
        let mut config = ClientConfig::new(base, CARD_ID, vec![PROFILE_IM_V2.into()])
            .with_api_key(Secret::new(KEY));
        config.backoff = Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(500),
            factor: 2.0,
            max_failures: None,
        };
        config.request_timeout = Duration::from_secs(TOOL_DEADLINE_MS / 1000);
        let (plane, mut events) = DataPlane::connect(config).await?;
        let inbound = Arc::new(Mutex::new(Vec::new()));
        let acked = Arc::new(Mutex::new(HashMap::new()));
        let (i2, a2) = (inbound.clone(), acked.clone());
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                match event {
                    ClientEvent::ChatMessage(message) => {
                        let id = message.message.message_id.to_string();
                        let created = message.message.created_at.unwrap_or(0);
                        if let Ok(mut inbound) = i2.lock() {
                            inbound.push((id, created, now_ms()));
                        }
                        message.accept();
                    }
                    ClientEvent::ChatMessageAcked { ack, .. } => {
                        if let Ok(mut acked) = a2.lock() {
                            acked.insert(ack.message_id.to_string(), ack.status.to_string());
                        }
                    }
                    _ => {}
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), plane.connected())
            .await
            .context("xAgent did not connect through HAProxy within 30 s")?
            .map_err(|e| anyhow!("{e}"))?;
        Ok(Agent { plane, inbound, acked })
    }

    /// Opens a channel signed in to `room` (creating the room).
    pub(crate) async fn open_room(&self, room: &str) -> Result<ConnectorChannelId> {
        let opened = self.plane.open_channel(None).await.map_err(|e| anyhow!("{e}"))?;
        let channel = opened.connector_channel_id.clone();
        let code = access_code(room);
        let input = AuthInput::default()
            .with("room_name", room)
            .with("access_code", code.as_str())
            .with("owner_code", format!("owner-{code}").as_str());
        let ack = self
            .plane
            .request(Some(&channel), AuthStart::new(ROOM_FLOW).with_input(input))
            .await
            .map_err(|e| anyhow!("{e}"))?;
        if ack.0.status != AuthStatus::Authenticated {
            bail!("signing in to {room}: {:?}", ack.0.message);
        }
        self.plane.remember_channel(channel.clone()).await;
        Ok(channel)
    }

    /// One `webchat_message_send` with `call` as its `tool_call_id` (and in its text).
    pub(crate) async fn tool(&self, channel: &ConnectorChannelId, call: &str) -> Result<()> {
        let channel = self.plane.current_channel(channel).await.unwrap_or_else(|| channel.clone());
        let mut arguments = Map::new();
        arguments.insert("text".into(), json!(format!("tool {call}")));
        xagent_client_runtime::fill_channel_argument(&mut arguments, &channel);
        let mut context = xagent_protocol_types::ToolInvokeContext::default();
        context.tool_call_id = Some(call.into());
        let invoke = xagent_protocol_types::ToolInvoke::new(TOOL, arguments).with_context(context);
        self.plane.request(Some(&channel), invoke).await.map_err(|e| anyhow!("{e}"))?;
        Ok(())
    }
}

/// A stop signal for the harness's tasks.
#[derive(Clone)]
pub(crate) struct Stop(tokio::sync::watch::Sender<bool>);

pub(crate) fn tokio_util_stop() -> Stop {
    Stop(tokio::sync::watch::channel(false).0)
}

impl Stop {
    pub(crate) fn stop(&self) {
        self.0.send_replace(true);
    }

    pub(crate) fn stopped(&self) -> bool {
        *self.0.borrow()
    }

    pub(crate) async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|stopped| *stopped).await;
    }
}

// ---------------------------------------------------------------------------------------
// 3. One replica against three

/// A time of the summary table: `N ms`, or `none` when nothing was measured.
pub(crate) fn ms(value: &Value) -> String {
    value.as_u64().map_or_else(|| "none".to_owned(), |n| format!("{n} ms"))
}

pub(crate) fn cluster_health_line(findings: &[String]) -> &'static str {
    if findings.iter().any(|f| f.contains("/ready")) {
        "GET /chat/assets/icon.svg (no /ready), inter 1s fall 1 rise 1"
    } else {
        "GET /ready, inter 1s fall 1 rise 1"
    }
}

pub(crate) fn access_code(room: &str) -> String {
    format!("code-{room}-4711")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        let p = percentiles(&values);
        assert_eq!(
            (p["p50"].as_u64(), p["p99"].as_u64(), p["max"].as_u64()),
            (Some(50), Some(99), Some(100))
        );
        assert!(percentiles(&[])["p99"].is_null());
        assert_eq!(percentiles(&[7])["p99"], 7);
    }
}
