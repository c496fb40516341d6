//! What every chaos scenario stands on: the seeded generator ([`Rng`]), the report's end
//! ([`finish`]), the sizes of the single-process scenarios, and the example processes they
//! kill (the echo Connector and the xAgent sink: building, starting, finding and stopping them).

use crate::bench_support::{API_KEY, Flags, machine};
use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Outbox TTL of the echo Connector (profile-im's default), for the expiry check.
pub(crate) const TTL_MS: u64 = 60 * 60 * 1000;

/// A small deterministic generator (xorshift64*), so a seed replays a run.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (0 is mapped to a fixed odd constant).
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 { 0x9E37_79B9_7F4A_7C15 } else { seed })
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

pub(crate) struct Sizes {
    pub(crate) channels: usize,
    pub(crate) per_channel: u64,
    pub(crate) kills: usize,
    pub(crate) rate: f64,
    pub(crate) barrage: usize,
    pub(crate) soak_channels: usize,
    pub(crate) soak_seconds: u64,
    /// Weights of Tool calls, messages to the Connector and uploads in the soak.
    pub(crate) mix: [u64; 3],
    /// Inbound messages per second the Connector feeds during the soak.
    pub(crate) inbound_rate: f64,
}

/// `--seed N`, or one drawn from the clock (printed in the report, so a run can be replayed).
pub fn seed(flags: &Flags) -> Result<u64> {
    Ok(flags.value("--seed")?.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    }))
}

/// Ends a chaos task: the report under `name` (JSON or `print`'s table), and success only when
/// no scenario is in `failed`.
pub fn finish(
    name: &str,
    results: serde_json::Map<String, Value>,
    seed: u64,
    quick: bool,
    failed: &[&str],
    json: bool,
    print: fn(&Value),
) -> Result<std::process::ExitCode> {
    let result = json!({
        name: results,
        "seed": seed,
        "quick": quick,
        "pass": failed.is_empty(),
        "machine": machine(),
    });
    if json {
        println!("{result}");
    } else {
        print(&result);
    }
    if failed.is_empty() {
        Ok(std::process::ExitCode::SUCCESS)
    } else {
        let task = name.replace('_', " --");
        eprintln!("{task}: FAILED: {}", failed.join(", "));
        Ok(std::process::ExitCode::FAILURE)
    }
}

pub(crate) fn pass(r: &Value) -> String {
    if r["pass"].as_bool().unwrap_or(false) { "pass".into() } else { "FAIL".into() }
}

/// Paths of the two example binaries.
pub struct Bins {
    /// `echo_connector`.
    pub connector: PathBuf,
    /// `xagent_sink`.
    pub sink: PathBuf,
}

/// Builds the example processes in the profile this task runs in.
pub fn build_examples(root: &Path) -> Result<Bins> {
    let dir = crate::bench_support::cargo_build(
        root,
        &[
            "-p",
            "xagent-testkit",
            "-p",
            "xagent-client-runtime",
            "--example",
            "echo_connector",
            "--example",
            "xagent_sink",
        ],
    )?
    .join("examples");
    Ok(Bins { connector: dir.join("echo_connector"), sink: dir.join("xagent_sink") })
}

/// A free loopback port (bound and released; the Connector rebinds it with SO_REUSEADDR).
pub(crate) fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Starts the echo Connector process and waits for its `listening` line.
pub fn spawn_connector(bin: &Path, state: &Path, port: u16, extra: &[String]) -> Result<Child> {
    let wrap = connector_wrap();
    for attempt in 0..50 {
        let mut command = match wrap.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(bin);
                command
            }
            None => Command::new(bin),
        };
        let mut child = command
            .arg("--state-dir")
            .arg(state)
            .arg("--port")
            .arg(port.to_string())
            .arg("--api-key")
            .arg(API_KEY)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        // A wrapper (a profiler) may print lines of its own before the Connector's.
        for _ in 0..if wrap.is_empty() { 1 } else { 20 } {
            line.clear();
            if stdout.read_line(&mut line).unwrap_or(0) == 0 || line.starts_with("listening") {
                break;
            }
        }
        if line.starts_with("listening") {
            return Ok(child);
        }
        let _ = child.kill();
        let _ = child.wait();
        if attempt == 49 {
            bail!("the echo connector did not start on port {port}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the echo connector did not start")
}

/// `XTASK_CONNECTOR_WRAP`: a command line (split on whitespace) the echo Connector is started
/// under, e.g. `heaptrack -o /tmp/connector`, for profiling the benchmarks' Connector.
pub fn connector_wrap() -> Vec<String> {
    std::env::var("XTASK_CONNECTOR_WRAP")
        .map(|w| w.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The pid of the echo Connector process of `child`: the child itself, or, when it runs under
/// a wrapper (`XTASK_CONNECTOR_WRAP`), the wrapper's descendant named `echo_connector`.
pub fn connector_pid(child: &Child) -> String {
    let top = child.id().to_string();
    if connector_wrap().is_empty() {
        return top;
    }
    let mut queue = vec![top.clone()];
    while let Some(pid) = queue.pop() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "echo_connector" {
            return pid;
        }
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten();
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            queue.extend(children.split_whitespace().map(str::to_string));
        }
    }
    top
}

/// Stops the echo Connector: SIGKILL, or under a wrapper SIGTERM to the Connector itself and
/// a wait for the wrapper (a profiler writes its report then).
pub fn stop_connector(child: &mut Child) -> Result<()> {
    if connector_wrap().is_empty() {
        child.kill()?;
    } else {
        let _ = Command::new("kill").arg("-TERM").arg(connector_pid(child)).status();
    }
    child.wait()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_sequence() {
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        let first: Vec<u64> = (0..5).map(|_| a.below(1000)).collect();
        let second: Vec<u64> = (0..5).map(|_| b.below(1000)).collect();
        assert_eq!(first, second);
        assert!(first.iter().all(|n| *n < 1000));
        assert_ne!(Rng::new(0).next(), 0);
    }
}
