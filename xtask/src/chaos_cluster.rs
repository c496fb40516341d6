//! `cargo xtask chaos --cluster`: kill -9 in a cluster, loopback only, on testkit's PostgreSQL
//! and HAProxy (Debian's `postgresql` and `haproxy` packages).
//!
//! 1. **xagent-holder-kill** (the xAgent side): one `xagent-connector webchat` (SQLite) and
//!    two `xagent-connector mock-xagent --database-url` sharing one database. Only the holder
//!    of the Card's holder lease connects; it signs a channel in to one room and, every
//!    50 ms, calls `webchat_message_send` (its `tool_call_id` named in the text) and queues
//!    one assistant chat message, while visitors post to the room through the page API. The
//!    holder is killed with SIGKILL several times (and restarted, to stand by). Counted from
//!    the mocks' `--report-json` lines and the room's history: lost (a visitor message the
//!    Connector took that no mock received; a Tool call acknowledged `ok` or a queued message
//!    missing from the room), doubled (received or shown twice), after expiry (a Tool's
//!    message shown after the caller's 10 s deadline; a message received after its 1 h TTL),
//!    and the takeover time from the kill to the new holder's first successful `tool.invoke`.
//! 2. **replica-kill** (the Connector side): three `xagent-connector webchat --database-url`
//!    replicas (same database and API key, own state directories and ports) behind HAProxy
//!    (generated configuration: `option httpchk GET /ready`, `inter 1s fall 1 rise 1`,
//!    WebSocket tunnels of an hour), xAgent's `DataPlane` in this process through it with
//!    rooms over many channels. Visitors post through the page API of a random replica
//!    (directly or through a second HAProxy of the same configuration, which carries the
//!    pages' reconnects), the agent replies with `webchat_message_send` (tool call ids) and
//!    IM messages, each room has an open page (its event stream) on a random replica. The
//!    replica holding xAgent's socket (the one HAProxy counts its session on) and, separately,
//!    a random other one are killed several times and restarted after a few seconds. Counted:
//!    lost, doubled, after expiry (as above), pages' missed messages (a page whose replica
//!    died reconnects through HAProxy to a fresh snapshot; everything of its room must be in
//!    what it saw), and the failover time from each kill to the next successful
//!    `tool.invoke` through HAProxy (p50, p99; target p99 <= 5 s).
//! 3. **throughput** (`--throughput`, instead of the above): visitor messages per second on
//!    the page API through HAProxy with one replica behind it and with three, same run, with
//!    the CPU each part used per message. `--replica-cpu CORES` gives every replica a CPU
//!    quota (a cgroup), as if each ran on a small host of its own.
//!
//! `--quick` is small (about 1,000 messages, 10 channels, one kill of each kind) for CI;
//! `--only xagent|connector`, `--seed N`, `--json` as in `cargo xtask chaos`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures_util::StreamExt;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use xagent_client_runtime::{Backoff, BaseUrl, ClientConfig, ClientEvent, DataPlane};
use xagent_protocol_types::{
    AuthInput, AuthStart, AuthStatus, ChatMessage, Clock, ConnectorChannelId, PROFILE_IM_V2,
    Secret, SystemClock,
};
use xagent_testkit::haproxy::{Balance, HaproxyOptions, TestHaproxy};
use xagent_testkit::postgres::TestPostgres;

use crate::bench_support::{
    Flags, cpu_ticks, cpu_ticks_with_children, machine_ticks, print_table, temp_dir, warn_if_debug,
};
use crate::chaos::{Rng, free_port};

/// The system API key every replica and xAgent share.
const KEY: &str = "sk-chaos-cluster-5e1b77a0";
/// im.webchat's Card id and room flow.
const CARD_ID: &str = "im.webchat";
const ROOM_FLOW: &str = "webchat_room";
const TOOL: &str = "webchat_message_send";
/// The caller's deadline for a Tool call (the client runtime's request timeout): a Tool's
/// side effect shown later than this after the call started counts as after expiry.
const TOOL_DEADLINE_MS: u64 = 10_000;
/// The health check of a build without `GET /ready`: a static asset of the page.
const FALLBACK_CHECK: &str = "/chat/assets/icon.svg";
/// The outbox TTL (profile-im's default): a message received later is after expiry.
const TTL_MS: u64 = 60 * 60 * 1000;

struct Sizes {
    /// xAgent side: visitor messages into the one room, and kills of the holder.
    agent_messages: usize,
    agent_kills: usize,
    /// Connector side: channels (rooms), messages in both directions, kills of each kind.
    channels: usize,
    messages: usize,
    kills: usize,
    /// Throughput: visitor senders and seconds per configuration.
    senders: usize,
    seconds: u64,
    /// Connector side: the traffic stops after this long even if not all was sent (a
    /// cluster that fails every Tool call would take a deadline per call).
    max_traffic_seconds: u64,
}

/// Runs the cluster scenarios (`chaos --cluster ...`).
pub fn run(root: &Path, args: &[String]) -> Result<ExitCode> {
    let args: Vec<String> = args.iter().filter(|a| *a != "--cluster").cloned().collect();
    let flags = Flags::parse(&args);
    let throughput_only = flags.rest.iter().any(|a| a == "--throughput");
    let rest: Vec<String> = flags.rest.iter().filter(|a| *a != "--throughput").cloned().collect();
    Flags { rest, ..flags.clone() }.only(&["--only", "--seed", "--replica-cpu"])?;
    let replica_cpu: Option<f64> = flags.value("--replica-cpu")?;
    warn_if_debug();
    let only: Option<String> = flags.value("--only")?;
    if let Some(only) = &only
        && !["xagent", "connector"].contains(&only.as_str())
    {
        bail!("--only wants xagent or connector");
    }
    let seed: u64 = flags.value("--seed")?.unwrap_or_else(|| SystemClock.now_millis());
    let sizes = if flags.quick {
        Sizes {
            agent_messages: 300,
            agent_kills: 2,
            channels: 10,
            messages: 1_000,
            kills: 1,
            senders: 16,
            seconds: 5,
            max_traffic_seconds: 60,
        }
    } else {
        Sizes {
            agent_messages: 1_000,
            agent_kills: 5,
            channels: 100,
            messages: 10_000,
            kills: 3,
            senders: 64,
            seconds: 15,
            max_traffic_seconds: 600,
        }
    };
    let bin = crate::bench_support::xagent_connector(root)?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut rng = Rng::new(seed);
    let mut results = Map::new();
    let mut failed = Vec::new();
    runtime.block_on(async {
        let pg = TestPostgres::try_shared().await.map_err(|e| anyhow!("{e}"))?;
        if throughput_only {
            let outcome = throughput(&bin, pg, &sizes, replica_cpu).await?;
            if !outcome["pass"].as_bool().unwrap_or(false) {
                failed.push("throughput");
            }
            results.insert("throughput".into(), outcome);
            return Ok::<_, anyhow::Error>(());
        }
        if only.as_deref().is_none_or(|o| o == "xagent") {
            eprintln!("chaos --cluster: xagent-holder-kill ...");
            let outcome = xagent_side(&bin, pg, &sizes, &mut rng).await?;
            if !outcome["pass"].as_bool().unwrap_or(false) {
                failed.push("xagent-holder-kill");
            }
            results.insert("xagent-holder-kill".into(), outcome);
        }
        if only.as_deref().is_none_or(|o| o == "connector") {
            eprintln!("chaos --cluster: replica-kill ...");
            let outcome = connector_side(&bin, pg, &sizes, &mut rng).await?;
            if !outcome["pass"].as_bool().unwrap_or(false) {
                failed.push("replica-kill");
            }
            results.insert("replica-kill".into(), outcome);
        }
        Ok(())
    })?;
    crate::chaos::finish(
        "chaos_cluster",
        results,
        seed,
        flags.quick,
        &failed,
        flags.json,
        print_summary,
    )
}

fn print_summary(result: &Value) {
    let mut rows = Vec::new();
    let pass = |r: &Value| if r["pass"].as_bool().unwrap_or(false) { "pass" } else { "FAIL" };
    let r = &result["chaos_cluster"]["xagent-holder-kill"];
    if !r.is_null() {
        rows.push(vec![
            "xagent-holder-kill".to_string(),
            format!(
                "{} visitor msgs, {} tool calls ok, {} queued, {} kills",
                r["visitor_messages"], r["tool_calls_ok"], r["agent_messages_queued"], r["kills"]
            ),
            format!(
                "lost {} · doubled {} · after expiry {}",
                r["lost"]["total"], r["doubled"]["total"], r["after_expiry"]
            ),
            format!(
                "takeover p50 {} · p99 {}",
                ms(&r["takeover_ms"]["p50"]),
                ms(&r["takeover_ms"]["p99"])
            ),
            pass(r).into(),
        ]);
    }
    let r = &result["chaos_cluster"]["replica-kill"];
    if !r.is_null() {
        rows.push(vec![
            "replica-kill".to_string(),
            format!(
                "{} ch, {} visitor + {} agent msgs, {} holder + {} other kills",
                r["channels"],
                r["visitor_messages"],
                r["agent_messages"],
                r["holder_kills"],
                r["other_kills"]
            ),
            format!(
                "lost {} · doubled {} · after expiry {} · page missed {}",
                r["lost"]["total"], r["doubled"]["total"], r["after_expiry"], r["pages"]["missed"]
            ),
            format!(
                "failover p50 {} · p99 {}",
                ms(&r["failover_ms"]["p50"]),
                ms(&r["failover_ms"]["p99"])
            ),
            pass(r).into(),
        ]);
    }
    let r = &result["chaos_cluster"]["throughput"];
    if !r.is_null() {
        rows.push(vec![
            "throughput".to_string(),
            format!("{} senders, {} s each", r["senders"], r["seconds"]),
            format!(
                "1 replica {} msg/s · 3 replicas {} msg/s",
                r["one_replica_per_sec"], r["three_replicas_per_sec"]
            ),
            format!("{}x", r["ratio"]),
            pass(r).into(),
        ]);
    }
    print_table(&["scenario", "load", "outcome", "time", "result"], &rows);
    for name in ["xagent-holder-kill", "replica-kill", "throughput"] {
        if let Some(findings) = result["chaos_cluster"][name]["findings"].as_array() {
            for finding in findings {
                println!("{name}: {}", finding.as_str().unwrap_or_default());
            }
        }
    }
    println!("\nseed {} (replay with --seed)", result["seed"]);
}

/// A time of the summary table: `N ms`, or `none` when nothing was measured.
fn ms(value: &Value) -> String {
    value.as_u64().map_or_else(|| "none".to_owned(), |n| format!("{n} ms"))
}

fn now_ms() -> u64 {
    SystemClock.now_millis()
}

/// p50 / p99 / max of `values` (nearest rank), as JSON.
fn percentiles(values: &[u64]) -> Value {
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
struct Replica {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    database: Option<String>,
    /// Visitor streams and joins are many from one address here: the caps are raised.
    bin: PathBuf,
}

impl Replica {
    async fn start(bin: &Path, dir: PathBuf, database: Option<String>) -> Result<Replica> {
        let mut replica =
            Replica { child: None, port: free_port()?, dir, database, bin: bin.to_path_buf() };
        replica.restart().await?;
        Ok(replica)
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Starts (again) on the same port and state directory; waits for its `listening` line.
    async fn restart(&mut self) -> Result<()> {
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
    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// A running `xagent-connector mock-xagent --report-json` and its report lines.
struct Mock {
    child: Option<Child>,
    name: &'static str,
}

/// A report line of a mock: which mock printed it, and the line.
type Reports = Arc<Mutex<Vec<(&'static str, Value)>>>;

impl Mock {
    fn start(
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

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

fn access_code(room: &str) -> String {
    format!("code-{room}-4711")
}

// ---------------------------------------------------------------------------------------
// The visitor side over HTTP

/// A visitor session in one room, on whichever replica `base` names.
#[derive(Clone)]
struct Visitor {
    http: reqwest::Client,
    room: String,
    token: String,
}

impl Visitor {
    async fn join(http: &reqwest::Client, base: &str, room: &str) -> Result<Visitor> {
        let response = http
            .post(format!("{base}/chat/api/rooms/{room}/join"))
            .json(&json!({"access_code": access_code(room)}))
            .timeout(Duration::from_secs(10))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let token = body["token"]
            .as_str()
            .ok_or_else(|| anyhow!("joining {room} on {base} answered {status}: {body}"))?;
        Ok(Visitor { http: http.clone(), room: room.into(), token: token.into() })
    }

    /// Posts a message; the stored entry (its `message_id` and `status`).
    async fn post(&self, base: &str, text: &str, client_id: &str) -> Result<Value> {
        let response = self
            .http
            .post(format!("{base}/chat/api/rooms/{}/messages", self.room))
            .bearer_auth(&self.token)
            .json(&json!({"text": text, "client_id": client_id}))
            .timeout(Duration::from_secs(10))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{status}: {body}");
        }
        Ok(body)
    }

    /// The room's event stream (a page) on `base`.
    async fn events(&self, base: &str) -> Result<reqwest::Response> {
        let response = self
            .http
            .get(format!("{base}/chat/api/rooms/{}/events", self.room))
            .bearer_auth(&self.token)
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("events answered {}", response.status());
        }
        Ok(response)
    }

    /// The messages of the room's snapshot on `base` (oldest first).
    async fn history(&self, base: &str) -> Result<Vec<Value>> {
        let response = self.events(base).await?;
        let mut events = sse_events(response);
        let first = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .context("no snapshot within 10 s")?
            .ok_or_else(|| anyhow!("the stream ended before its snapshot"))?;
        Ok(first["messages"].as_array().cloned().unwrap_or_default())
    }
}

/// The `data:` JSON of every Server-Sent Event of `response`, until it ends.
fn sse_events(response: reqwest::Response) -> impl futures_util::Stream<Item = Value> + Unpin {
    let state = (response.bytes_stream(), String::new());
    Box::pin(futures_util::stream::unfold(state, |(mut body, mut text)| async move {
        loop {
            if let Some(end) = text.find("\n\n") {
                let event: String = text.drain(..end + 2).collect();
                let data: String = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:").map(str::trim_start))
                    .collect();
                if let Ok(value) = serde_json::from_str::<Value>(&data) {
                    return Some((value, (body, text)));
                }
                continue;
            }
            match body.next().await {
                Some(Ok(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk)),
                _ => return None,
            }
        }
    }))
}

// ---------------------------------------------------------------------------------------
// 1. The xAgent side

async fn xagent_side(bin: &Path, pg: &TestPostgres, sizes: &Sizes, rng: &mut Rng) -> Result<Value> {
    let dir = temp_dir("chaos-cluster-xagent")?;
    let started = Instant::now();
    let database = pg.fresh_database().await;
    let mut connector = Replica::start(bin, dir.join("connector"), None).await?;
    let base = connector.url();
    let room = "chaosagent";
    let reports: Reports = Arc::new(Mutex::new(Vec::new()));
    let mut mocks = [
        Mock::start(bin, "a", &base, database.expose(), room, &reports)?,
        Mock::start(bin, "b", &base, database.expose(), room, &reports)?,
    ];
    let lines = |kind: &str| -> Vec<(&'static str, Value)> {
        reports
            .lock()
            .map(|r| r.iter().filter(|(_, v)| v["report"] == kind).cloned().collect())
            .unwrap_or_default()
    };
    // The holder signs the room in; then visitors can join it.
    let ready_by = Instant::now() + Duration::from_secs(60);
    while !lines("tool").iter().any(|(_, v)| v["ok"] == true) {
        if Instant::now() > ready_by {
            connector.kill().await;
            bail!("no mock-xagent made a successful Tool call within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let http = reqwest::Client::new();
    let visitor = Visitor::join(&http, &base, room).await?;
    // A page open from the start sees every message of the room (a snapshot holds only the
    // newest 200).
    let stop = tokio_util_stop();
    let (page, page_task) = watch_page(visitor.clone(), base.clone(), base.clone(), stop.clone());
    // Visitors post at an even pace over the kills.
    let posted: Arc<Mutex<Vec<Value>>> = Arc::new(Mutex::new(Vec::new()));
    let post_errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let poster = {
        let (visitor, base, posted, post_errors) =
            (visitor.clone(), base.clone(), posted.clone(), post_errors.clone());
        let total = sizes.agent_messages;
        tokio::spawn(async move {
            for n in 0..total {
                let text = format!("visitor {n}");
                match visitor.post(&base, &text, &format!("v{n}")).await {
                    Ok(entry) => posted.lock().map(|mut p| p.push(entry)).unwrap_or(()),
                    Err(e) => post_errors.lock().map(|mut p| p.push(e.to_string())).unwrap_or(()),
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };
    let mut kills = Vec::new();
    for _ in 0..sizes.agent_kills {
        tokio::time::sleep(Duration::from_millis(1_000 + rng.below(1_500))).await;
        // The holder is the mock whose last `online` line is the newest.
        let online = lines("online");
        let Some((holder, _)) = online.last().cloned() else { continue };
        let Some(index) = mocks.iter().position(|m| m.name == holder) else { continue };
        let killed_at = now_ms();
        mocks[index].kill().await;
        kills.push((holder, killed_at));
        // Wait for the other's first successful call, then bring the killed one back.
        let by = Instant::now() + Duration::from_secs(30);
        while !lines("tool")
            .iter()
            .any(|(n, v)| *n != holder && v["ok"] == true && v["at"].as_u64() > Some(killed_at))
            && Instant::now() < by
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(1_000))).await;
        mocks[index] = Mock::start(bin, holder, &base, database.expose(), room, &reports)?;
    }
    poster.await?;
    // Drain: every visitor message taken reaches xAgent, queued messages reach the room.
    let taken: Vec<String> = posted
        .lock()
        .map(|p| p.iter().filter_map(|e| e["message_id"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let drain_by = Instant::now() + Duration::from_secs(30);
    loop {
        let received: HashSet<String> = lines("message")
            .iter()
            .filter_map(|(_, v)| v["message_id"].as_str().map(str::to_owned))
            .collect();
        if taken.iter().all(|id| received.contains(id)) || Instant::now() > drain_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stop the calls, let the outbox deliver what was queued, then read the room.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for mock in &mut mocks {
        mock.kill().await;
    }
    let history = visitor.history(&base).await?;
    stop.stop();
    let _ = tokio::time::timeout(Duration::from_secs(5), page_task).await;
    connector.kill().await;
    let seconds = started.elapsed().as_secs_f64();
    let page = page.lock().map_err(|_| anyhow!("the page task panicked"))?;
    let contents = room_contents(&page, &history);

    // Visitor messages at the application.
    let received = lines("message");
    let mut got: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut late_messages = 0;
    for (_, line) in &received {
        let Some(id) = line["message_id"].as_str() else { continue };
        got.entry(id).or_default().push(line["at"].as_u64().unwrap_or(0));
        if let (Some(created), Some(at)) = (line["created_at"].as_u64(), line["at"].as_u64())
            && at > created.saturating_add(TTL_MS)
        {
            late_messages += 1;
        }
    }
    let lost_inbound = taken.iter().filter(|id| !got.contains_key(id.as_str())).count();
    let (doubled_inbound, redelivered) = doubles(&got, &page.delivered_at);
    // Tool calls and queued messages in the room.
    let shown = by_text(&contents);
    let shown_ids = &contents;
    let starts: HashMap<String, u64> = lines("tool_start")
        .iter()
        .filter_map(|(_, v)| Some((v["call"].as_str()?.to_owned(), v["at"].as_u64()?)))
        .collect();
    let tools_ok: Vec<String> = lines("tool")
        .iter()
        .filter(|(_, v)| v["ok"] == true)
        .filter_map(|(_, v)| v["call"].as_str().map(str::to_owned))
        .collect();
    let lost_tools = tools_ok.iter().filter(|c| !shown.contains_key(&format!("tool {c}"))).count();
    let mut doubled_tools = 0;
    let mut late_tools = 0;
    for (call, started_at) in &starts {
        let Some(times) = shown.get(&format!("tool {call}")) else { continue };
        if times.len() > 1 {
            doubled_tools += 1;
        }
        if times.iter().any(|t| *t > started_at + TOOL_DEADLINE_MS) {
            late_tools += 1;
        }
    }
    let queued: Vec<String> = lines("queued")
        .iter()
        .filter_map(|(_, v)| v["message_id"].as_str().map(str::to_owned))
        .collect();
    let lost_queued = queued.iter().filter(|id| !shown_ids.contains_key(*id)).count();
    let doubled_queued = queued
        .iter()
        .filter(|id| shown.get(&format!("say {id}")).is_some_and(|t| t.len() > 1))
        .count();
    let takeovers: Vec<u64> = kills
        .iter()
        .filter_map(|(holder, killed_at)| {
            lines("tool")
                .iter()
                .filter(|(n, v)| n != holder && v["ok"] == true)
                .filter_map(|(_, v)| v["at"].as_u64())
                .filter(|at| at > killed_at)
                .min()
                .map(|at| at - killed_at)
        })
        .collect();
    let lost = lost_inbound + lost_tools + lost_queued;
    let doubled = doubled_inbound + doubled_tools + doubled_queued;
    let after_expiry = late_messages + late_tools;
    let post_errors = post_errors.lock().map(|p| p.clone()).unwrap_or_default();
    let mut findings = Vec::new();
    if takeovers.len() < kills.len() {
        findings.push(format!(
            "{} of {} kills were not followed by a successful Tool call of the other mock within 30 s",
            kills.len() - takeovers.len(),
            kills.len()
        ));
    }
    if !post_errors.is_empty() {
        findings.push(format!(
            "{} visitor posts refused, e.g. {}",
            post_errors.len(),
            post_errors[0]
        ));
    }
    let pass = lost == 0
        && doubled == 0
        && after_expiry == 0
        && kills.len() == sizes.agent_kills
        && takeovers.len() == kills.len()
        && post_errors.is_empty()
        && !tools_ok.is_empty();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({
        "visitor_messages": taken.len(),
        "visitor_messages_received": got.len(),
        "tool_calls_started": starts.len(),
        "tool_calls_ok": tools_ok.len(),
        "agent_messages_queued": queued.len(),
        "room_entries": contents.len(),
        "kills": kills.len(),
        "lost": {"total": lost, "visitor_messages": lost_inbound, "tool_calls": lost_tools, "agent_messages": lost_queued},
        "doubled": {"total": doubled, "visitor_messages": doubled_inbound, "tool_calls": doubled_tools, "agent_messages": doubled_queued},
        "after_expiry": after_expiry,
        "redelivered_unacknowledged": redelivered,
        "takeover_ms": percentiles(&takeovers),
        "takeovers_ms": takeovers,
        "findings": findings,
        "seconds": seconds,
        "pass": pass,
    }))
}

// ---------------------------------------------------------------------------------------
// 2. The Connector side

/// The three replicas on one database, and the two load balancers in front of them.
struct Cluster {
    replicas: Vec<Replica>,
    /// xAgent's data plane goes through this one (its sessions say which replica holds it).
    agent_proxy: TestHaproxy,
    /// Visitors' posts and reconnecting pages go through this one.
    page_proxy: TestHaproxy,
    /// The health check path HAProxy uses (`/ready`, or `/health` on a build without it).
    health_path: String,
}

impl Cluster {
    async fn start(bin: &Path, dir: &Path, database: &str, count: usize) -> Result<Cluster> {
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
    async fn holder(&self) -> Option<usize> {
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

    async fn stop(mut self) {
        for replica in &mut self.replicas {
            replica.kill().await;
        }
    }
}

/// xAgent's data plane through `url`, accepting every inbound message; inbound messages are
/// recorded as (message_id, created_at, received_at) and acks of queued messages by id.
struct Agent {
    plane: DataPlane,
    inbound: Arc<Mutex<Vec<(String, u64, u64)>>>,
    /// The last ack status of each queued message, by id.
    acked: Arc<Mutex<HashMap<String, String>>>,
}

impl Agent {
    async fn connect(url: &str) -> Result<Agent> {
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
    async fn open_room(&self, room: &str) -> Result<ConnectorChannelId> {
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
    async fn tool(&self, channel: &ConnectorChannelId, call: &str) -> Result<()> {
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

/// A Tool call made in the run: when it started and ended (Unix ms), whether it succeeded.
#[derive(Clone, Debug)]
struct Call {
    id: String,
    room: usize,
    started: u64,
    ended: u64,
    ok: bool,
}

/// What the harness sent and saw, shared by its tasks.
#[derive(Default)]
struct Ledger {
    /// Visitor posts the Connector took: (room, message_id, status at the answer).
    posts: Vec<(usize, String, String)>,
    post_failures: Vec<String>,
    calls: Vec<Call>,
    /// Assistant messages queued: (room, message_id).
    queued: Vec<(usize, String)>,
    queue_failures: Vec<String>,
    sent: usize,
}

/// A room's open page: every message it saw (by id: text and `created_at`), when it first
/// saw each visitor message `delivered` (Unix ms), and how often it had to reconnect.
#[derive(Default)]
struct Page {
    seen: HashMap<String, (String, u64)>,
    delivered_at: HashMap<String, u64>,
    reconnects: u64,
    failed_reconnects: u64,
}

impl Page {
    fn record(&mut self, entry: &Value) {
        let Some(id) = entry["message_id"].as_str() else { return };
        let text = entry["text"].as_str().unwrap_or_default().to_owned();
        let created = entry["created_at"].as_u64().unwrap_or(0);
        self.seen.entry(id.to_owned()).or_insert((text, created));
        if entry["status"] == "delivered" {
            self.delivered_at.entry(id.to_owned()).or_insert_with(now_ms);
        }
    }
}

/// Keeps `visitor`'s page open: its event stream on `first`, and after the stream ends (its
/// replica died) again through `proxy`, until `stop`.
fn watch_page(
    visitor: Visitor,
    first: String,
    proxy: String,
    stop: Stop,
) -> (Arc<Mutex<Page>>, tokio::task::JoinHandle<()>) {
    let page = Arc::new(Mutex::new(Page::default()));
    let watched = page.clone();
    let task = tokio::spawn(async move {
        let mut base = first;
        let mut connected_once = false;
        while !stop.stopped() {
            let response = match visitor.events(&base).await {
                Ok(response) => response,
                Err(_) => {
                    if let Ok(mut page) = watched.lock() {
                        page.failed_reconnects += 1;
                    }
                    base = proxy.clone();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            if connected_once && let Ok(mut page) = watched.lock() {
                page.reconnects += 1;
            }
            connected_once = true;
            let mut events = sse_events(response);
            loop {
                let next = tokio::select! {
                    next = events.next() => next,
                    () = stop.wait() => None,
                };
                let Some(event) = next else { break };
                let Ok(mut page) = watched.lock() else { break };
                for entry in event["messages"].as_array().into_iter().flatten() {
                    page.record(entry);
                }
                if event["message"].is_object() {
                    page.record(&event["message"]);
                }
            }
            base = proxy.clone();
        }
    });
    (page, task)
}

/// What a room holds: its pages' view joined with its final history, by message id.
fn room_contents(page: &Page, history: &[Value]) -> HashMap<String, (String, u64)> {
    let mut contents = page.seen.clone();
    for entry in history {
        if let Some(id) = entry["message_id"].as_str() {
            let text = entry["text"].as_str().unwrap_or_default().to_owned();
            contents
                .entry(id.to_owned())
                .or_insert((text, entry["created_at"].as_u64().unwrap_or(0)));
        }
    }
    contents
}

/// Message ids of `contents` by text (a side effect applied twice is one text, two ids).
fn by_text(contents: &HashMap<String, (String, u64)>) -> HashMap<String, Vec<u64>> {
    let mut texts: HashMap<String, Vec<u64>> = HashMap::new();
    for (text, created) in contents.values() {
        texts.entry(text.clone()).or_default().push(*created);
    }
    texts
}

async fn connector_side(
    bin: &Path,
    pg: &TestPostgres,
    sizes: &Sizes,
    rng: &mut Rng,
) -> Result<Value> {
    let dir = temp_dir("chaos-cluster-replicas")?;
    let started = Instant::now();
    let database = pg.fresh_database().await;
    let mut cluster = Cluster::start(bin, &dir, database.expose(), 3).await?;
    let mut findings = Vec::new();
    if cluster.health_path != "/ready" {
        findings.push(format!(
            "the replicas have no GET /ready (404) and /health needs the API key: HAProxy \
             checks {} instead",
            cluster.health_path
        ));
    }
    let agent = Arc::new(Agent::connect(&cluster.agent_proxy.url()).await?);
    let rooms: Vec<String> = (0..sizes.channels).map(|n| format!("chaosroom{n}")).collect();
    let mut channels = Vec::new();
    for room in &rooms {
        channels.push(agent.open_room(room).await?);
    }
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let replica_urls: Vec<String> = cluster.replicas.iter().map(Replica::url).collect();
    let page_url = cluster.page_proxy.url();
    // Every room's visitor joins on a random replica (the others in turn if that one
    // refuses: before the rooms live in the shared database only one replica knows them).
    let mut visitors = Vec::new();
    let mut refused_joins = 0;
    for room in &rooms {
        let first = rng.below(3) as usize;
        let mut joined = None;
        for step in 0..3 {
            let base = &replica_urls[(first + step) % 3];
            match Visitor::join(&http, base, room).await {
                Ok(visitor) => {
                    joined = Some(visitor);
                    break;
                }
                Err(_) => refused_joins += 1,
            }
        }
        visitors.push(joined.ok_or_else(|| anyhow!("no replica let a visitor join {room}"))?);
    }
    if refused_joins > 0 {
        findings.push(format!(
            "{refused_joins} visitor joins were refused by a replica that does not know the room \
             (rooms are not in the shared database yet)"
        ));
    }
    let stop = tokio_util_stop();
    // Pages: each room's event stream on a random replica; reconnect through HAProxy.
    let mut pages = Vec::new();
    let mut page_tasks = Vec::new();
    for visitor in &visitors {
        let first = replica_urls[rng.below(3) as usize].clone();
        let (page, task) = watch_page(visitor.clone(), first, page_url.clone(), stop.clone());
        pages.push(page);
        page_tasks.push(task);
    }
    // Traffic: visitor posts (half), Tool calls and IM messages (a quarter each).
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let workers = 8usize;
    let per_worker = sizes.messages.div_ceil(workers);
    let (traffic_started, max_traffic) = (Instant::now(), sizes.max_traffic_seconds);
    let mut traffic = Vec::new();
    for worker in 0..workers {
        let (agent, ledger) = (agent.clone(), ledger.clone());
        let (visitors, channels) = (visitors.clone(), channels.clone());
        let (replica_urls, proxy) = (replica_urls.clone(), page_url.clone());
        let mut rng = Rng::new(rng.next());
        traffic.push(tokio::spawn(async move {
            for n in 0..per_worker {
                if traffic_started.elapsed().as_secs() >= max_traffic {
                    break;
                }
                let room = rng.below(visitors.len() as u64) as usize;
                let id = format!("w{worker}n{n}");
                match rng.below(4) {
                    0 | 1 => {
                        // Directly to a random replica or through HAProxy; a refused or
                        // failed post is repeated (same client_id) through HAProxy.
                        let pick = rng.below(4) as usize;
                        let mut base = replica_urls.get(pick).cloned().unwrap_or(proxy.clone());
                        let mut last = String::new();
                        let mut done = false;
                        for _ in 0..20 {
                            match visitors[room].post(&base, &format!("visitor {id}"), &id).await {
                                Ok(entry) => {
                                    let message_id =
                                        entry["message_id"].as_str().unwrap_or_default();
                                    let status = entry["status"].as_str().unwrap_or_default();
                                    if let Ok(mut l) = ledger.lock() {
                                        l.posts.push((room, message_id.into(), status.into()));
                                    }
                                    done = true;
                                    break;
                                }
                                Err(e) => last = e.to_string(),
                            }
                            base = proxy.clone();
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                        if !done && let Ok(mut l) = ledger.lock() {
                            l.post_failures.push(last);
                        }
                    }
                    2 => {
                        // The same tool_call_id until it succeeds: the Connector's key.
                        let started = now_ms();
                        let mut ok = false;
                        while now_ms() < started + TOOL_DEADLINE_MS {
                            if agent.tool(&channels[room], &id).await.is_ok() {
                                ok = true;
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        let call = Call { id: id.clone(), room, started, ended: now_ms(), ok };
                        if let Ok(mut l) = ledger.lock() {
                            l.calls.push(call);
                        }
                    }
                    _ => {
                        let message = ChatMessage::text(id.as_str(), format!("say {id}"))
                            .created_at(now_ms());
                        let channel = agent
                            .plane
                            .current_channel(&channels[room])
                            .await
                            .unwrap_or_else(|| channels[room].clone());
                        let queued = agent.plane.send_chat_message(&channel, message).await;
                        if let Ok(mut l) = ledger.lock() {
                            match queued {
                                Ok(_) => l.queued.push((room, id.clone())),
                                Err(e) => l.queue_failures.push(e.to_string()),
                            }
                        }
                    }
                }
                if let Ok(mut l) = ledger.lock() {
                    l.sent += 1;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    // A prober: one Tool call every 100 ms on the first room, for the failover time.
    let probe_stop = tokio_util_stop();
    let prober = {
        let (agent, ledger, stop, channel) =
            (agent.clone(), ledger.clone(), probe_stop.clone(), channels[0].clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.stopped() {
                n += 1;
                let id = format!("probe{n}");
                let started = now_ms();
                let ok = agent.tool(&channel, &id).await.is_ok();
                let call = Call { id, room: 0, started, ended: now_ms(), ok };
                if let Ok(mut l) = ledger.lock() {
                    l.calls.push(call);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // Kills: the holder and another replica in turn, each at a random point of the traffic.
    let total = per_worker * workers;
    let mut kills: Vec<(&'static str, usize, u64)> = Vec::new();
    let plan: Vec<&'static str> = (0..sizes.kills).flat_map(|_| ["holder", "other"]).collect();
    for (k, kind) in plan.iter().enumerate() {
        let at = total * (k + 1) / (plan.len() + 1)
            + rng.below((total / (plan.len() * 4)).max(1) as u64) as usize;
        while ledger.lock().map(|l| l.sent).unwrap_or(total) < at.min(total.saturating_sub(1))
            && traffic_started.elapsed().as_secs() < max_traffic
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut holder = None;
        let by = Instant::now() + Duration::from_secs(10);
        while holder.is_none() && Instant::now() < by {
            holder = cluster.holder().await;
            if holder.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let Some(holder) = holder else {
            findings.push("HAProxy showed no replica holding xAgent's socket within 10 s".into());
            continue;
        };
        let victim = if *kind == "holder" {
            holder
        } else {
            let others: Vec<usize> = (0..3).filter(|i| *i != holder).collect();
            others[rng.below(others.len() as u64) as usize]
        };
        cluster.replicas[victim].kill().await;
        kills.push((kind, victim, now_ms()));
        tokio::time::sleep(Duration::from_millis(2_000 + rng.below(2_000))).await;
        cluster.replicas[victim].restart().await?;
    }
    for task in traffic {
        task.await?;
    }
    // Drain: the outbox empties and every visitor message the Connector took reaches xAgent.
    let drain_by = Instant::now() + Duration::from_secs(60);
    loop {
        let pending = agent.plane.outbox_stats().await.pending;
        let wanted: Vec<String> = ledger
            .lock()
            .map(|l| l.posts.iter().filter(|p| p.2 != "rejected").map(|p| p.1.clone()).collect())
            .unwrap_or_default();
        let got: HashSet<String> = agent
            .inbound
            .lock()
            .map(|i| i.iter().map(|m| m.0.clone()).collect())
            .unwrap_or_default();
        if (pending == 0 && wanted.iter().all(|id| got.contains(id))) || Instant::now() > drain_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The prober's last call ends, then the pages get a moment to see it.
    probe_stop.stop();
    prober.await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.stop();
    for task in page_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    // Every room's history, read on whichever replica serves it. A delivery state the last
    // kill left behind is set by the holder's sweep within its window (5 s plus a 2 s pass):
    // the histories are read again until none shows `sending` or that window has passed.
    let settle_until = Instant::now() + Duration::from_secs(8);
    let histories = loop {
        let mut histories = Vec::new();
        for visitor in &visitors {
            let mut history = None;
            for base in std::iter::once(&page_url).chain(&replica_urls) {
                if let Ok(h) = visitor.history(base).await {
                    history = Some(h);
                    break;
                }
            }
            histories.push(history.unwrap_or_default());
        }
        let sending = histories.iter().flatten().any(|e: &Value| e["status"] == "sending");
        if !sending || Instant::now() >= settle_until {
            break histories;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let outbox_pending = agent.plane.outbox_stats().await.pending;
    agent.plane.close().await;
    let seconds = started.elapsed().as_secs_f64();
    let logs: String = cluster
        .replicas
        .iter()
        .map(|r| std::fs::read_to_string(r.dir.join("replica.log")).unwrap_or_default())
        .collect();
    let panics = logs.matches("panicked").count();
    cluster.stop().await;

    let ledger = ledger.lock().map_err(|_| anyhow!("a task panicked"))?;
    let inbound = agent.inbound.lock().map_err(|_| anyhow!("a task panicked"))?.clone();
    let acked = agent.acked.lock().map_err(|_| anyhow!("a task panicked"))?.clone();
    let mut got: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut late = 0;
    for (id, created, received) in &inbound {
        got.entry(id.as_str()).or_default().push(*received);
        if *created > 0 && *received > created + TTL_MS {
            late += 1;
        }
    }
    let taken: Vec<&(usize, String, String)> =
        ledger.posts.iter().filter(|p| p.2 != "rejected").collect();
    let rejected_posts = ledger.posts.len() - taken.len();
    let lost_visitor = taken.iter().filter(|p| !got.contains_key(p.1.as_str())).count();
    // The rooms' contents (pages and final histories): a Tool call's or a queued message's
    // side effect is one entry.
    let mut texts: HashMap<(usize, String), Vec<u64>> = HashMap::new();
    let mut entries: Vec<HashSet<String>> = Vec::new();
    let (mut missed, mut reconnects, mut failed_reconnects) = (0, 0, 0);
    let mut missed_examples = Vec::new();
    let mut delivered_at: HashMap<String, u64> = HashMap::new();
    let mut still_sending = 0;
    for (room, history) in histories.iter().enumerate() {
        let page = pages[room].lock().map_err(|_| anyhow!("a page task panicked"))?;
        let contents = room_contents(&page, history);
        for (text, created) in by_text(&contents) {
            texts.insert((room, text), created);
        }
        entries.push(contents.keys().cloned().collect());
        // Pages: everything in the room's final history must be among what its page saw.
        for entry in history {
            let Some(id) = entry["message_id"].as_str() else { continue };
            if !page.seen.contains_key(id) {
                missed += 1;
                if missed_examples.len() < 5 {
                    missed_examples.push(entry.to_string());
                }
            }
        }
        still_sending += history.iter().filter(|e| e["status"] == "sending").count();
        reconnects += page.reconnects;
        failed_reconnects += page.failed_reconnects;
        delivered_at.extend(page.delivered_at.iter().map(|(k, v)| (k.clone(), *v)));
    }
    let calls_ok: Vec<&Call> = ledger.calls.iter().filter(|c| c.ok).collect();
    let lost_tools = calls_ok
        .iter()
        .filter(|c| !texts.contains_key(&(c.room, format!("tool {}", c.id))))
        .count();
    let mut doubled_tools = 0;
    let mut late_tools = 0;
    for call in &ledger.calls {
        let Some(times) = texts.get(&(call.room, format!("tool {}", call.id))) else { continue };
        if times.len() > 1 {
            doubled_tools += 1;
        }
        if times.iter().any(|t| *t > call.started + TOOL_DEADLINE_MS) {
            late_tools += 1;
        }
    }
    let refused = |id: &String| acked.get(id).is_some_and(|s| s == "rejected");
    let lost_queued = ledger
        .queued
        .iter()
        .filter(|(room, id)| !entries[*room].contains(id) && !refused(id))
        .count();
    let rejected_queued = ledger.queued.iter().filter(|(_, id)| refused(id)).count();
    let doubled_queued = ledger
        .queued
        .iter()
        .filter(|(room, id)| texts.get(&(*room, format!("say {id}"))).is_some_and(|t| t.len() > 1))
        .count();
    let unacked_queued = ledger
        .queued
        .iter()
        .filter(|(_, id)| !acked.get(id).is_some_and(|s| s == "accepted" || s == "duplicate"))
        .count();
    // Failover: from each kill to the next Tool call started after it that succeeded.
    let next_ok = |killed: u64| {
        ledger.calls.iter().filter(|c| c.ok && c.started >= killed).map(|c| c.ended - killed).min()
    };
    let failovers: Vec<u64> =
        kills.iter().filter(|k| k.0 == "holder").filter_map(|k| next_ok(k.2)).collect();
    let other_next: Vec<u64> =
        kills.iter().filter(|k| k.0 == "other").filter_map(|k| next_ok(k.2)).collect();
    let holder_kills = kills.iter().filter(|k| k.0 == "holder").count();
    let tools_failed = ledger.calls.iter().filter(|c| !c.ok).count();
    let probes_failed = ledger.calls.iter().filter(|c| !c.ok && c.id.starts_with("probe")).count();
    let cut_short = ledger.sent < total;
    if failovers.len() < holder_kills {
        findings.push(format!(
            "{} of {holder_kills} holder kills were never followed by a successful tool.invoke",
            holder_kills - failovers.len()
        ));
    }
    if rejected_posts > 0 {
        findings.push(format!("{rejected_posts} visitor posts were answered `rejected` at once"));
    }
    if !ledger.post_failures.is_empty() {
        findings.push(format!(
            "{} visitor posts failed 20 tries, e.g. {}",
            ledger.post_failures.len(),
            ledger.post_failures[0]
        ));
    }
    // A probe is one attempt: the one in flight when its socket died fails, as it should.
    if tools_failed > probes_failed {
        findings.push(format!(
            "{} Tool calls did not succeed within their 10 s deadline (retried with their \
             tool_call_id)",
            tools_failed - probes_failed
        ));
    }
    if still_sending > 0 {
        findings.push(format!(
            "{still_sending} visitor messages xAgent took still show `sending` in their room"
        ));
    }
    if missed > 0 {
        findings.push(format!("pages missed {missed} messages, e.g. {missed_examples:?}"));
    }
    if rejected_queued > 0 {
        findings.push(format!("{rejected_queued} IM messages were rejected by the Connector"));
    }
    if cut_short {
        findings.push(format!(
            "the traffic was cut short after {} s with {} of {total} messages sent",
            sizes.max_traffic_seconds, ledger.sent
        ));
    }
    if !ledger.queue_failures.is_empty() {
        findings.push(format!(
            "{} IM messages were refused by the outbox, e.g. {}",
            ledger.queue_failures.len(),
            ledger.queue_failures[0]
        ));
    }
    if panics > 0 {
        findings.push(format!("{panics} panics in the replicas' logs"));
    }
    let (doubled_visitor, redelivered) = doubles(&got, &delivered_at);
    let lost = lost_visitor + lost_tools + lost_queued;
    let doubled = doubled_visitor + doubled_tools + doubled_queued;
    let after_expiry = late + late_tools;
    let p99 = percentiles(&failovers)["p99"].as_u64();
    let pass = lost == 0
        && doubled == 0
        && after_expiry == 0
        && missed == 0
        && panics == 0
        && failovers.len() == holder_kills
        && holder_kills == sizes.kills
        && p99.is_some_and(|p| p <= 5_000)
        && !cut_short
        && rejected_queued == 0;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({
        "channels": rooms.len(),
        "replicas": 3,
        "health_check": cluster_health_line(&findings),
        "visitor_messages": ledger.posts.len(),
        "visitor_messages_rejected": rejected_posts,
        "visitor_posts_failed": ledger.post_failures.len(),
        "agent_messages": calls_ok.len() + ledger.queued.len(),
        "tool_calls": ledger.calls.len(),
        "tool_calls_ok": calls_ok.len(),
        "im_messages_queued": ledger.queued.len(),
        "im_messages_unacked": unacked_queued,
        "im_messages_rejected": rejected_queued,
        "traffic_cut_short": cut_short,
        "outbox_pending_at_end": outbox_pending,
        "visitor_entries_still_sending": still_sending,
        "holder_kills": holder_kills,
        "other_kills": kills.len() - holder_kills,
        "kills": kills.iter().map(|k| json!({"kind": k.0, "replica": k.1})).collect::<Vec<_>>(),
        "lost": {"total": lost, "visitor_messages": lost_visitor, "tool_calls": lost_tools, "im_messages": lost_queued},
        "doubled": {"total": doubled, "visitor_messages": doubled_visitor, "tool_calls": doubled_tools, "im_messages": doubled_queued},
        "after_expiry": after_expiry,
        "redelivered_unacknowledged": redelivered,
        "probes_failed": probes_failed,
        "pages": {"missed": missed, "reconnects": reconnects, "failed_reconnects": failed_reconnects},
        "failover_ms": percentiles(&failovers),
        "failovers_ms": failovers,
        "other_kill_next_ok_ms": other_next,
        "findings": findings,
        "seconds": seconds,
        "pass": pass,
    }))
}

/// Of the messages received more than once (`received`: id -> times, Unix ms): those received
/// again after their page showed them `delivered` (doubled: the ack was in, the runtime's
/// receiver idempotency should have held it), and the others (redelivered: the process that
/// took it first died before its accept was acknowledged, so the Connector sent it again).
fn doubles(
    received: &HashMap<&str, Vec<u64>>,
    delivered_at: &HashMap<String, u64>,
) -> (usize, usize) {
    let (mut doubled, mut redelivered) = (0, 0);
    for (id, times) in received {
        if times.len() < 2 {
            continue;
        }
        let mut times = times.clone();
        times.sort_unstable();
        match delivered_at.get(*id) {
            Some(at) if times[1] > *at => doubled += 1,
            _ => redelivered += 1,
        }
    }
    (doubled, redelivered)
}

fn cluster_health_line(findings: &[String]) -> &'static str {
    if findings.iter().any(|f| f.contains("/ready")) {
        "GET /chat/assets/icon.svg (no /ready), inter 1s fall 1 rise 1"
    } else {
        "GET /ready, inter 1s fall 1 rise 1"
    }
}

/// A stop signal for the harness's tasks.
#[derive(Clone)]
struct Stop(tokio::sync::watch::Sender<bool>);

fn tokio_util_stop() -> Stop {
    Stop(tokio::sync::watch::channel(false).0)
}

impl Stop {
    fn stop(&self) {
        self.0.send_replace(true);
    }

    fn stopped(&self) -> bool {
        *self.0.borrow()
    }

    async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|stopped| *stopped).await;
    }
}

// ---------------------------------------------------------------------------------------
// 3. One replica against three

/// With `replica_cpu`, each replica runs under a CPU quota of that many cores (see
/// [`crate::cpu_limit`]), as if on a small host of its own, so the figure shows what adding
/// replicas buys when they, not the shared machine, are the limit.
async fn throughput(
    bin: &Path,
    pg: &TestPostgres,
    sizes: &Sizes,
    replica_cpu: Option<f64>,
) -> Result<Value> {
    let postmaster = postmaster_pid(pg).await;
    let mut figures = Vec::new();
    let mut findings = Vec::new();
    for count in [1usize, 3] {
        let dir = temp_dir("chaos-cluster-throughput")?;
        let database = pg.fresh_database().await;
        let cluster = Cluster::start(bin, &dir, database.expose(), count).await?;
        let mut limits = Vec::new();
        if let Some(cores) = replica_cpu {
            for pid in cluster.replicas.iter().filter_map(|r| r.child.as_ref()?.id()) {
                limits.push(crate::cpu_limit::CpuLimit::apply(
                    &format!("xagent-chaos-replica-{pid}"),
                    pid,
                    cores,
                )?);
            }
        }
        let agent = Agent::connect(&cluster.agent_proxy.url()).await?;
        let rooms = sizes.senders.div_ceil(4);
        for n in 0..rooms {
            agent.open_room(&format!("tproom{n}")).await?;
        }
        let proxy = cluster.page_proxy.url();
        let http = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
        let mut visitors = Vec::new();
        let mut refused = 0;
        for n in 0..sizes.senders {
            let room = format!("tproom{}", n % rooms);
            let mut joined = None;
            for _ in 0..6 {
                match Visitor::join(&http, &proxy, &room).await {
                    Ok(v) => {
                        joined = Some(v);
                        break;
                    }
                    Err(_) => refused += 1,
                }
            }
            visitors.push(
                joined.ok_or_else(|| anyhow!("no visitor could join {room} through HAProxy"))?,
            );
        }
        let cpu = CpuMeter::new(&cluster, postmaster);
        let deadline = Instant::now() + Duration::from_secs(sizes.seconds);
        let mut tasks = Vec::new();
        for (n, visitor) in visitors.into_iter().enumerate() {
            let proxy = proxy.clone();
            tasks.push(tokio::spawn(async move {
                let (mut ok, mut failed, mut i) = (0u64, 0u64, 0u64);
                while Instant::now() < deadline {
                    i += 1;
                    match visitor.post(&proxy, "hello", &format!("t{n}x{i}")).await {
                        Ok(entry) if entry["status"] != "rejected" => ok += 1,
                        _ => failed += 1,
                    }
                }
                (ok, failed)
            }));
        }
        let (mut ok, mut failed) = (0, 0);
        for task in tasks {
            let (o, f) = task.await?;
            ok += o;
            failed += f;
        }
        let cost = cpu.per_message(&cluster, postmaster, ok);
        agent.plane.close().await;
        cluster.stop().await;
        drop(limits);
        let _ = std::fs::remove_dir_all(&dir);
        if refused > 0 || failed > 0 {
            findings.push(format!(
                "{count} replica(s): {refused} joins and {failed} posts through HAProxy refused"
            ));
        }
        figures.push((ok as f64 / sizes.seconds as f64, failed, cost));
    }
    let (one, three) = (figures[0].0, figures[1].0);
    let ratio = if one > 0.0 { three / one } else { 0.0 };
    Ok(json!({
        "senders": sizes.senders,
        "seconds": sizes.seconds,
        "replica_cpu_cores": replica_cpu,
        "one_replica_per_sec": one.round(),
        "three_replicas_per_sec": three.round(),
        "ratio": (ratio * 100.0).round() / 100.0,
        "target_met": ratio >= 2.0,
        "failed_posts": figures.iter().map(|f| f.1).sum::<u64>(),
        "cpu_one_replica": figures[0].2,
        "cpu_three_replicas": figures[1].2,
        "findings": findings,
        "pass": figures.iter().all(|f| f.1 == 0),
    }))
}

/// The PostgreSQL server's main process, from the `postmaster.pid` in its data directory
/// (`None` for a server elsewhere: its CPU is then not counted).
async fn postmaster_pid(pg: &TestPostgres) -> Option<u32> {
    let pool = xagent_storage_postgres::connect(pg.admin_url(), Default::default()).await.ok()?;
    let client = pool.get().await.ok()?;
    let row = client.query_one("SHOW data_directory", &[]).await.ok()?;
    let dir: String = row.try_get(0).ok()?;
    let pid = std::fs::read_to_string(Path::new(&dir).join("postmaster.pid")).ok()?;
    pid.lines().next()?.trim().parse().ok()
}

/// CPU used during a throughput window, by part: the replicas, HAProxy, PostgreSQL, and this
/// process (xAgent and the visitors), plus how busy the whole machine was.
struct CpuMeter {
    replicas: u64,
    /// Each replica's, in the order of `Cluster::replicas`.
    each: Vec<u64>,
    haproxy: u64,
    postgres: u64,
    load: u64,
    machine: (u64, u64),
}

impl CpuMeter {
    fn sample(cluster: &Cluster, postmaster: Option<u32>) -> CpuMeter {
        let each: Vec<u64> = cluster
            .replicas
            .iter()
            .map(|r| {
                r.child.as_ref().and_then(|c| c.id()).map_or(0, |pid| cpu_ticks(&pid.to_string()))
            })
            .collect();
        let replicas = each.iter().sum();
        let haproxy = [&cluster.agent_proxy, &cluster.page_proxy]
            .iter()
            .map(|p| cpu_ticks(&p.pid().to_string()))
            .sum();
        CpuMeter {
            replicas,
            each,
            haproxy,
            postgres: postmaster.map_or(0, cpu_ticks_with_children),
            load: cpu_ticks("self"),
            machine: machine_ticks(),
        }
    }

    fn new(cluster: &Cluster, postmaster: Option<u32>) -> CpuMeter {
        Self::sample(cluster, postmaster)
    }

    /// CPU milliseconds per message since [`CpuMeter::new`], by part.
    fn per_message(&self, cluster: &Cluster, postmaster: Option<u32>, messages: u64) -> Value {
        let now = Self::sample(cluster, postmaster);
        // A clock tick is 10 ms.
        let ms = |after: u64, before: u64| {
            let per = after.saturating_sub(before) as f64 * 10.0 / messages.max(1) as f64;
            (per * 1000.0).round() / 1000.0
        };
        let (busy, total) = (
            now.machine.0.saturating_sub(self.machine.0),
            now.machine.1.saturating_sub(self.machine.1),
        );
        // The busiest first (the socket holder, which also delivers every message to xAgent).
        let mut each: Vec<f64> =
            now.each.iter().zip(&self.each).map(|(after, before)| ms(*after, *before)).collect();
        each.sort_by(|a, b| b.total_cmp(a));
        json!({
            "replicas_ms": ms(now.replicas, self.replicas),
            "each_replica_ms": each,
            "haproxy_ms": ms(now.haproxy, self.haproxy),
            "postgres_ms": ms(now.postgres, self.postgres),
            "load_generator_ms": ms(now.load, self.load),
            "machine_busy": if total > 0 { (busy as f64 / total as f64 * 100.0).round() / 100.0 } else { 0.0 },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_after_the_page_showed_it_delivered_is_doubled_one_before_is_a_redelivery() {
        let received: HashMap<&str, Vec<u64>> =
            HashMap::from([("once", vec![10]), ("late", vec![50, 10]), ("early", vec![10, 20])]);
        let delivered_at =
            HashMap::from([("late".to_owned(), 30), ("early".to_owned(), 30), ("once".into(), 1)]);
        assert_eq!(doubles(&received, &delivered_at), (1, 1));
        assert_eq!(doubles(&received, &HashMap::new()), (0, 2), "never delivered: redelivered");
    }

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

    #[test]
    fn a_page_keeps_the_first_view_of_a_message_and_when_it_was_delivered() {
        let mut page = Page::default();
        page.record(
            &json!({"message_id": "m1", "text": "hi", "created_at": 5, "status": "sending"}),
        );
        page.record(
            &json!({"message_id": "m1", "text": "hi", "created_at": 5, "status": "delivered"}),
        );
        page.record(&json!({"text": "no id"}));
        assert_eq!(page.seen.len(), 1);
        assert!(page.delivered_at.contains_key("m1"));
        let history = vec![json!({"message_id": "m2", "text": "hi", "created_at": 6})];
        let contents = room_contents(&page, &history);
        assert_eq!(contents.len(), 2);
        assert_eq!(by_text(&contents)["hi"].len(), 2, "one text under two ids is a double");
    }
}
