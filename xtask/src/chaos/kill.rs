//! The kill scenarios (`connector-kill`, `xagent-kill`): the echo Connector feeds the xAgent
//! sink while one of the two is killed with SIGKILL and restarted; the sink's log must then
//! hold every message exactly once and none after its expiry.

use super::harness::{Bins, Rng, Sizes, TTL_MS, free_port, spawn_connector};
use crate::bench_support::{API_KEY, temp_dir};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Victim {
    Connector,
    Sink,
}

fn spawn_sink(bin: &Path, state: &Path, port: u16, channels: usize) -> Result<Child> {
    Command::new(bin)
        .arg("--url")
        .arg(format!("http://127.0.0.1:{port}"))
        .arg("--state-dir")
        .arg(state)
        .arg("--channels")
        .arg(channels.to_string())
        .arg("--api-key")
        .arg(API_KEY)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

/// (unique ids, lines, lines received after expiry) in the sink's log.
pub(crate) fn read_sink_log(path: &Path) -> (HashMap<String, u64>, u64, u64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut ids: HashMap<String, u64> = HashMap::new();
    let (mut lines, mut late) = (0u64, 0u64);
    for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let parts: Vec<&str> = line.trim_end().split(' ').collect();
        let [id, created, received] = parts.as_slice() else { continue };
        lines += 1;
        *ids.entry((*id).to_string()).or_default() += 1;
        let created: u64 = created.parse().unwrap_or(0);
        let received: u64 = received.parse().unwrap_or(0);
        if created > 0 && received > created.saturating_add(TTL_MS) {
            late += 1;
        }
    }
    (ids, lines, late)
}

pub(crate) fn kill_scenario(
    bins: &Bins,
    victim: Victim,
    sizes: &Sizes,
    rng: &mut Rng,
) -> Result<Value> {
    let dir = temp_dir("chaos-kill")?;
    let (connector_dir, sink_dir) = (dir.join("connector"), dir.join("sink"));
    let port = free_port()?;
    let feed = vec![
        "--per-channel".to_string(),
        sizes.per_channel.to_string(),
        "--rate".to_string(),
        sizes.rate.to_string(),
    ];
    let expected_total = sizes.channels as u64 * sizes.per_channel;
    let started = Instant::now();
    let mut connector = spawn_connector(&bins.connector, &connector_dir, port, &feed)?;
    let mut sink = spawn_sink(&bins.sink, &sink_dir, port, sizes.channels)?;
    let log = sink_dir.join("accepted.log");
    // Kill only once the burst runs (the sink signed its channels in).
    let ready_by = Instant::now() + Duration::from_secs(60);
    while !sink_dir.join("channels.txt").exists() {
        if Instant::now() > ready_by {
            bail!("the sink did not sign its channels in within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut kill_points = Vec::new();
    for _ in 0..sizes.kills {
        // Kill while messages flow: after the sink accepted a random number of new messages
        // since the last restart, plus a random delay.
        let before = read_sink_log(&log).0.len();
        let wanted = before + 20 + rng.below(400) as usize;
        let progress_by = Instant::now() + Duration::from_secs(30);
        while read_sink_log(&log).0.len() < wanted.min(expected_total as usize)
            && Instant::now() < progress_by
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.below(100)));
        let (ids, _, _) = read_sink_log(&log);
        kill_points.push(ids.len());
        match victim {
            Victim::Connector => {
                connector.kill()?;
                connector.wait()?;
                std::thread::sleep(Duration::from_millis(rng.below(200)));
                connector = spawn_connector(&bins.connector, &connector_dir, port, &feed)?;
            }
            Victim::Sink => {
                sink.kill()?;
                sink.wait()?;
                std::thread::sleep(Duration::from_millis(rng.below(200)));
                sink = spawn_sink(&bins.sink, &sink_dir, port, sizes.channels)?;
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let (ids, _, _) = read_sink_log(&log);
        if ids.len() as u64 >= expected_total || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Give redeliveries in flight a moment to show up as duplicates, if any.
    std::thread::sleep(Duration::from_millis(500));
    let _ = connector.kill();
    let _ = sink.kill();
    let _ = connector.wait();
    let _ = sink.wait();
    let seconds = started.elapsed().as_secs_f64();

    let channels = std::fs::read_to_string(sink_dir.join("channels.txt")).unwrap_or_default();
    let expected: HashSet<String> = channels
        .lines()
        .filter(|l| !l.is_empty())
        .flat_map(|c| (0..sizes.per_channel).map(move |i| format!("m.{c}.{i}")))
        .collect();
    let (ids, lines, late) = read_sink_log(&log);
    let lost = expected.iter().filter(|id| !ids.contains_key(*id)).count();
    let unexpected = ids.keys().filter(|id| !expected.contains(*id)).count();
    let doubled = ids.values().filter(|n| **n > 1).count();
    let pass = lost == 0
        && doubled == 0
        && late == 0
        && unexpected == 0
        && expected.len() as u64 == expected_total
        && kill_points.len() >= sizes.kills;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({
        "victim": format!("{victim:?}"),
        "channels": sizes.channels,
        "expected": expected.len(),
        "accepted_lines": lines,
        "lost": lost,
        "doubled": doubled,
        "after_expiry": late,
        "unexpected": unexpected,
        "kills": kill_points.len(),
        "accepted_at_each_kill": kill_points,
        "seconds": seconds,
        "pass": pass,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_log_counts_duplicates_late_lines_and_ignores_a_torn_tail() {
        let dir = temp_dir("chaos-test").unwrap();
        let path = dir.join("accepted.log");
        let hour = TTL_MS;
        let text = format!(
            "m.a.0 1000 2000\nm.a.1 1000 2000\nm.a.0 1000 3000\nm.a.2 1000 {}\nm.a.3 10",
            1000 + hour + 1
        );
        std::fs::write(&path, text).unwrap();
        let (ids, lines, late) = read_sink_log(&path);
        assert_eq!(lines, 4);
        assert_eq!(ids.len(), 3);
        assert_eq!(ids["m.a.0"], 2);
        assert_eq!(late, 1);
        assert!(!ids.contains_key("m.a.3"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
