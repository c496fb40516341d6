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
//!
//! Each scenario has its file ([`mod@xagent_side`], [`mod@connector_side`], [`mod@throughput`]) over the
//! processes and clients of [`harness`] and the page bookkeeping of [`page`].

mod connector_side;
mod harness;
mod page;
mod throughput;
mod xagent_side;

use crate::bench_support::{Flags, print_table, warn_if_debug};
use crate::chaos::harness::Rng;
use anyhow::{Result, anyhow, bail};
use connector_side::connector_side;
use harness::{Sizes, ms};
use serde_json::{Map, Value};
use std::path::Path;
use std::process::ExitCode;
use throughput::throughput;
use xagent_protocol_types::{Clock, SystemClock};
use xagent_side::xagent_side;
use xagent_testkit::postgres::TestPostgres;

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
    crate::chaos::harness::finish(
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
