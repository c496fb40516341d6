//! Shared pieces of the whole-system benchmarks and the chaos harness: flags, building the
//! binaries they run, machine facts, resident memory, tables, percentiles, the echo Connector
//! on loopback, and a bare packet client over tokio-tungstenite.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use xagent_protocol_types::{Packet, Secret};
use xagent_server_runtime::ops::{DatabaseUrl, PoolOptions};
use xagent_server_runtime::storage::{
    GroupCommitStats, PostgresOptions, PostgresStorage, SqliteOptions, SqliteStorage, Storage,
    Synchronous,
};
use xagent_server_runtime::{ConnectorServer, RuntimeConfig};
use xagent_testkit::{EchoState, echo_connector};

/// The system API key every harness Connector runs with (loopback only, never a real secret).
pub const API_KEY: &str = "sk-bench-loopback-7d2f91c4";

/// Runs `cargo build --quiet ARGS` in `root`, in the profile this task runs in (`--release`
/// when xtask itself is a release build), and returns the directory the artifacts land in:
/// `$CARGO_TARGET_DIR/<profile>` when that is set (relative to `root`), else
/// `<root>/target/<profile>`.
pub fn cargo_build(root: &Path, args: &[&str]) -> Result<PathBuf> {
    let release = !cfg!(debug_assertions);
    let mut cmd =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root).args(["build", "--quiet"]).args(args);
    if release {
        cmd.arg("--release");
    }
    let what = format!("cargo build {}", args.join(" "));
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed");
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR");
    Ok(artifact_dir(root, target_dir.as_deref(), if release { "release" } else { "debug" }))
}

/// Builds `xagent-connector` with every subcommand (im.matrix is a cargo feature the default
/// build leaves out) in this task's profile and returns its path. Every harness builds it the
/// same way, so one run of several tasks builds it once.
pub fn xagent_connector(root: &Path) -> Result<PathBuf> {
    Ok(cargo_build(root, &["-p", "xagent-cli", "--features", "matrix"])?.join("xagent-connector"))
}

/// Where cargo, run in `root`, puts the artifacts of `profile`: under `target_dir` (the value
/// of `CARGO_TARGET_DIR`; a relative one counts from `root`), else under `<root>/target`.
fn artifact_dir(root: &Path, target_dir: Option<&std::ffi::OsStr>, profile: &str) -> PathBuf {
    target_dir.map_or_else(|| root.join("target"), |dir| root.join(dir)).join(profile)
}

/// Flags common to the `bench-*` tasks.
#[derive(Clone, Debug, Default)]
pub struct Flags {
    /// Short run for CI smoke tests.
    pub quick: bool,
    /// Print one JSON object instead of the table.
    pub json: bool,
    /// Remaining flags, for the task to read.
    pub rest: Vec<String>,
}

impl Flags {
    /// Splits `--quick` and `--json` from the other flags.
    pub fn parse(args: &[String]) -> Self {
        let mut flags = Flags::default();
        for arg in args {
            match arg.as_str() {
                "--quick" => flags.quick = true,
                "--json" => flags.json = true,
                _ => flags.rest.push(arg.clone()),
            }
        }
        flags
    }

    /// The value after `--name`, parsed.
    pub fn value<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>> {
        let Some(at) = self.rest.iter().position(|a| a == name) else { return Ok(None) };
        let Some(text) = self.rest.get(at + 1) else { bail!("{name} needs a value") };
        text.parse().map(Some).map_err(|_| anyhow!("{name}: cannot read {text:?}"))
    }

    /// Whether the switch `name` (a flag without a value, e.g. `--postgres`) was given; it is
    /// taken out of the remaining flags.
    pub fn switch(&mut self, name: &str) -> bool {
        let before = self.rest.len();
        self.rest.retain(|a| a != name);
        self.rest.len() != before
    }

    /// Fails on flags the task does not know.
    pub fn only(&self, known_valued: &[&str]) -> Result<()> {
        let mut skip = false;
        for arg in &self.rest {
            if skip {
                skip = false;
                continue;
            }
            if known_valued.contains(&arg.as_str()) {
                skip = true;
                continue;
            }
            bail!("unknown flag {arg:?}");
        }
        Ok(())
    }
}

/// What the run was measured on: CPU, cores, memory, load, kernel, build profile.
pub fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|r| r.trim_start_matches([' ', '\t', ':'])))
        .unwrap_or("unknown")
        .to_string();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    json!({
        "cpu": cpu,
        "cores": cores,
        "memory_mib": mem_kib / 1024,
        "load_average": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        "kernel": kernel.trim(),
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    })
}

/// Warns on stderr when measured in a debug build.
pub fn warn_if_debug() {
    if cfg!(debug_assertions) {
        eprintln!(
            "note: debug build; figures are only meaningful with `cargo xtask --release ...`"
        );
    }
}

/// Resident memory of a process by pid (or "self"), in bytes; 0 when unknown.
pub fn rss_of(pid: &str) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// CPU time (user + system, reaped children included) a process has used so far, in clock
/// ticks of 10 ms, from `/proc/PID/stat` (`pid` may be "self"); 0 when unknown.
pub fn cpu_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields = stat_fields(&stat);
    // utime, stime, cutime, cstime: fields 14 to 17 of the line, 11 to 14 after the name.
    (11..=14).filter_map(|i| fields.get(i)?.parse::<u64>().ok()).sum()
}

/// The fields of a `/proc/PID/stat` line after the command name (which may hold spaces).
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')').map_or_else(Vec::new, |(_, rest)| rest.split_whitespace().collect())
}

/// [`cpu_ticks`] of `pid` plus that of its live children (PostgreSQL's backends, say).
pub fn cpu_ticks_with_children(pid: u32) -> u64 {
    let mut ticks = cpu_ticks(&pid.to_string());
    let Ok(entries) = std::fs::read_dir("/proc") else { return ticks };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(child) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // The parent's pid is field 4 of the line, 1 after the name.
        if stat_fields(&stat).get(1).and_then(|p| p.parse::<u32>().ok()) == Some(pid) {
            ticks += cpu_ticks(child);
        }
    }
    ticks
}

/// The whole machine's CPU time so far, in clock ticks: (busy, total) over all cores, from
/// the first line of `/proc/stat`; (0, 0) when unknown.
pub fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let values: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().take(8).sum();
    // idle and iowait are the 4th and 5th values.
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

/// Prints rows under headers, columns padded to their widest cell.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.len());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> =
            cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        println!("| {} |", padded.join(" | "));
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    println!("|{}|", widths.iter().map(|w| "-".repeat(w + 2)).collect::<Vec<_>>().join("|"));
    for row in rows {
        line(row.clone());
    }
}

/// The `q`-quantile (0..=1) of sorted values.
pub fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// The median of a few measurements.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// A fresh, private directory under the system temp dir (made with `tempfile`, kept after the
/// run so its logs can be read).
pub fn temp_dir(name: &str) -> Result<PathBuf> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("xagent-{name}-"))
        .tempdir()
        .with_context(|| format!("creating a temporary directory for {name}"))?;
    Ok(dir.keep())
}

/// The echo Connector (IM v2, `echo_noop` Tool) served on 127.0.0.1 from `dir`.
pub struct EchoConnector {
    /// The server (handle, tick, shutdown).
    pub server: ConnectorServer,
    /// The echo target's log.
    pub echo: EchoState,
    /// Where it listens.
    pub addr: SocketAddr,
    join: tokio::task::JoinHandle<()>,
}

impl EchoConnector {
    /// Builds and serves the echo Connector with its state in `dir` (SQLite with the
    /// runtime's default durability, `synchronous=FULL`).
    pub async fn start(dir: &Path) -> Result<Self> {
        Self::start_with(dir, Synchronous::default()).await
    }

    /// [`EchoConnector::start`] with the given SQLite durability.
    pub async fn start_with(dir: &Path, synchronous: Synchronous) -> Result<Self> {
        let options = SqliteOptions { synchronous, ..SqliteOptions::default() };
        let storage = SqliteStorage::open_with(dir, options).context("opening the storage")?;
        Self::start_configured(dir, storage, RuntimeConfig::default()).await
    }

    /// [`EchoConnector::start_with`] over the given storage (SQLite or PostgreSQL) with the
    /// given runtime tunables (keep a clone of the storage to read its group-commit counters).
    pub async fn start_configured(
        dir: &Path,
        storage: impl Storage,
        config: RuntimeConfig,
    ) -> Result<Self> {
        let (connector, echo) = echo_connector();
        let server = ConnectorServer::builder(connector)
            .config(config)
            .state_dir(dir)
            .context("state dir")?
            .storage(storage)
            .api_key(Secret::new(API_KEY))
            .build()
            .await
            .context("building the echo connector")?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let running = server.clone();
        let join = tokio::spawn(async move {
            if let Err(error) = running.serve(listener, std::future::pending::<()>()).await {
                eprintln!("echo connector stopped: {error}");
            }
        });
        Ok(Self { server, echo, addr, join })
    }

    /// The `/ws` URL.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    /// Stops serving and waits for the server to finish.
    pub async fn stop(self) {
        self.server.shutdown();
        self.join.abort();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.server.wait_finished()).await;
    }
}

/// The server side of a whole-system benchmark: the echo Connector, with its state in a fresh
/// temporary directory, on a 2-worker runtime of its own (the measuring client runs apart).
pub struct ServerSide {
    /// The servers' runtime (other servers of the benchmark may run on it too).
    pub runtime: tokio::runtime::Runtime,
    /// The echo Connector.
    pub connector: EchoConnector,
    /// The state directory (removed by [`ServerSide::stop`]).
    pub dir: PathBuf,
}

impl ServerSide {
    /// Starts it; `name` names the state directory.
    pub fn start(name: &str, synchronous: Synchronous) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bench-server")
            .enable_all()
            .build()?;
        let dir = temp_dir(name)?;
        let connector = runtime.block_on(EchoConnector::start_with(&dir, synchronous))?;
        Ok(Self { runtime, connector, dir })
    }

    /// [`ServerSide::start`] with the runtime's state in the PostgreSQL database `url` (the
    /// state directory then holds only the Transfer Plane's files).
    pub fn start_postgres(name: &str, url: &DatabaseUrl) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bench-server")
            .enable_all()
            .build()?;
        let dir = temp_dir(name)?;
        let connector = runtime.block_on(async {
            let storage = PostgresStorage::connect(url, PostgresOptions::default())
                .await
                .context("connecting the runtime's storage to PostgreSQL")?;
            EchoConnector::start_configured(&dir, storage, RuntimeConfig::default()).await
        })?;
        Ok(Self { runtime, connector, dir })
    }

    /// Stops the Connector and the runtime and removes the state directory.
    pub fn stop(self) {
        self.runtime.block_on(self.connector.stop());
        drop(self.runtime);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The storage a benchmark runs the runtime on, with its group-commit counters.
#[derive(Clone)]
pub enum BenchStorage {
    /// SQLite in a state directory.
    Sqlite(SqliteStorage),
    /// PostgreSQL (boxed: it carries its URL and pool).
    Postgres(Box<PostgresStorage>),
}

impl BenchStorage {
    /// The runtime's storage on `url` with the default pool and these group-commit bounds.
    pub async fn postgres(
        url: &DatabaseUrl,
        group_commit: xagent_server_runtime::storage::GroupCommitConfig,
    ) -> Result<Self> {
        let options = PostgresOptions::default().with_group_commit(group_commit);
        let storage = PostgresStorage::connect(url, options)
            .await
            .context("connecting the runtime's storage to PostgreSQL")?;
        Ok(Self::Postgres(Box::new(storage)))
    }

    /// The writer's counters so far.
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        match self {
            Self::Sqlite(s) => s.group_commit_stats(),
            Self::Postgres(s) => s.group_commit_stats(),
        }
    }
}

/// The PostgreSQL server of a `--postgres` benchmark: testkit's (Debian's binaries in a
/// temporary directory, `fsync` on), or the one `XAGENT_TEST_DATABASE_URL` names; each call
/// gives a fresh empty database on it.
pub async fn bench_database() -> Result<DatabaseUrl> {
    let server = xagent_testkit::postgres::TestPostgres::try_shared().await?;
    Ok(server.try_fresh_database().await?)
}

/// Single-row INSERT transactions per second for `window` on PostgreSQL: one connection of a
/// pool with the runtime's default settings (the same driver, tokio-postgres, and session
/// settings as the runtime's storage), one autocommitted INSERT at a time, rows shaped like
/// the runtime's tool-call records: the rate the server commits at for one writer.
pub async fn raw_postgres_commits(url: &DatabaseUrl, window: Duration) -> Result<f64> {
    let pool = xagent_storage_postgres::connect(url, PoolOptions::default()).await?;
    let client = pool.get().await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS raw_tool_calls (
              channel TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, result TEXT,
              error_code TEXT, error_message BYTEA, completed_at BIGINT NOT NULL,
              PRIMARY KEY (channel, key))",
        )
        .await?;
    let insert = client
        .prepare_cached(
            "INSERT INTO raw_tool_calls (channel, key, fingerprint, result, completed_at)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .await?;
    let result = r#"{"status":"sent","message_id":"echo_1"}"#;
    let run = format!("{:x}", std::process::id());
    let started = std::time::Instant::now();
    let mut n = 0u64;
    while started.elapsed() < window {
        let key = format!("req_{run}_{n}_{}", started.elapsed().as_nanos());
        client
            .execute(
                &insert,
                &[
                    &"cch_bench",
                    &key,
                    &"0123456789abcdef0123456789abcdef",
                    &result,
                    &1_790_000_000_000i64,
                ],
            )
            .await?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// A WebSocket carrying packets, with nothing between the caller and tokio-tungstenite.
pub struct PacketSocket {
    /// The socket.
    pub socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next: u64,
}

impl PacketSocket {
    /// Connects offering the protocol subprotocol and, if given, the API key.
    pub async fn connect(url: &str, api_key: Option<&str>) -> Result<Self> {
        let request = xagent_connection::upgrade_request(url, api_key)?;
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .with_context(|| format!("connecting to {url}"))?;
        Ok(Self { socket, next: 0 })
    }

    /// Sends a text frame.
    pub async fn send_text(&mut self, text: String) -> Result<()> {
        self.socket.send(Message::Text(text.into())).await.context("sending a frame")
    }

    /// The next text frame (pings and pongs skipped); `None` when the socket closed.
    pub async fn recv_text(&mut self, within: Duration) -> Result<Option<String>> {
        loop {
            match tokio::time::timeout(within, self.socket.next()).await {
                Err(_) => bail!("no frame within {within:?}"),
                Ok(None) | Ok(Some(Err(_))) | Ok(Some(Ok(Message::Close(_)))) => return Ok(None),
                Ok(Some(Ok(Message::Text(text)))) => return Ok(Some(text.as_str().to_string())),
                Ok(Some(Ok(_))) => continue,
            }
        }
    }

    /// Sends a request (fresh packet and request ids) and returns the packet answering it.
    pub async fn call(&mut self, mut value: Value) -> Result<Packet> {
        self.next += 1;
        let request_id = format!("req_setup_{}", self.next);
        value["schema"] = json!("xagent.connector.packet/v1");
        value["packet_id"] = json!(format!("pkt_setup_{}", self.next));
        value["request_id"] = json!(request_id);
        self.send_text(value.to_string()).await?;
        loop {
            let Some(text) = self.recv_text(Duration::from_secs(10)).await? else {
                bail!("socket closed while waiting for {request_id}");
            };
            let packet = Packet::decode_str(&text)?;
            if packet.request_id.as_ref().map(|r| r.as_str()) == Some(request_id.as_str()) {
                return Ok(packet);
            }
        }
    }

    /// `connector.hello` for the echo card, then `channel.open` and the echo form sign-in;
    /// returns the signed-in channel id.
    pub async fn echo_session(&mut self, hello: bool, channel: Option<&str>) -> Result<String> {
        if hello {
            let ack = self
                .call(json!({"type": "connector.hello", "payload": {
                    "connector_card_id": "im.echo", "protocol_version": "3.0",
                    "supported_profiles": ["xagent.im.v2"]}}))
                .await?;
            if ack.error.is_some() {
                bail!("hello refused: {:?}", ack.error);
            }
        }
        let mut open = json!({"type": "channel.open"});
        if let Some(channel) = channel {
            open["connector_channel_id"] = json!(channel);
        }
        let ack = self.call(open).await?;
        let channel = ack
            .connector_channel_id
            .as_ref()
            .map(|c| c.as_str().to_string())
            .ok_or_else(|| anyhow!("channel.open.ack without a channel: {:?}", ack.error))?;
        let signed = self
            .call(json!({"type": "auth.start", "connector_channel_id": channel, "payload": {
                "flow_id": "echo_token", "input": {"token": "bench-token"}}}))
            .await?;
        if signed.error.is_some() {
            bail!("sign-in refused: {:?}", signed.error);
        }
        Ok(channel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_split_quick_json_and_valued_flags() {
        let flags = Flags::parse(&args(&["--quick", "--rounds", "2", "--json"]));
        assert!(flags.quick && flags.json);
        assert_eq!(flags.value::<usize>("--rounds").unwrap(), Some(2));
        assert!(flags.only(&["--rounds"]).is_ok());
    }

    #[test]
    fn flags_refuse_unknown_and_unreadable_values() {
        let flags = Flags::parse(&args(&["--rounds", "two", "--bogus"]));
        assert!(flags.value::<usize>("--rounds").is_err());
        assert!(flags.only(&["--rounds"]).is_err());
        assert!(Flags::parse(&args(&["--rounds"])).value::<usize>("--rounds").is_err());
    }

    #[test]
    fn built_artifacts_are_looked_for_where_cargo_target_dir_puts_them() {
        let root = Path::new("/work/repo");
        assert_eq!(artifact_dir(root, None, "debug"), Path::new("/work/repo/target/debug"));
        let absolute = std::ffi::OsStr::new("/tmp/shared-target");
        assert_eq!(
            artifact_dir(root, Some(absolute), "release"),
            Path::new("/tmp/shared-target/release")
        );
        let relative = std::ffi::OsStr::new("build/out");
        assert_eq!(
            artifact_dir(root, Some(relative), "debug"),
            Path::new("/work/repo/build/out/debug")
        );
    }

    #[test]
    fn quantiles_and_median() {
        let sorted: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&sorted, 0.5), 51);
        assert_eq!(quantile(&sorted, 0.99), 99);
        assert_eq!(quantile(&[], 0.5), 0);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn rss_of_self_is_known_and_of_a_missing_process_is_zero() {
        assert!(rss_of("self") > 0);
        assert_eq!(rss_of("999999999"), 0);
    }
}
