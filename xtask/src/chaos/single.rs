//! `cargo xtask chaos`: the reliability harness, bounded in time, loopback only.
//!
//! 1. **connector-kill**: the echo Connector (`testkit/examples/echo_connector.rs`, a
//!    separate process) feeds 10,000 inbound messages across 100 channels to an xAgent sink
//!    (`client-runtime/examples/xagent_sink.rs`, another process on the client runtime's own
//!    durable store, which fsyncs every accepted message's effect before accepting it and
//!    relies on the runtime's receiver idempotency for everything seen before). The Connector is killed with SIGKILL at random moments (5
//!    times, each after the sink accepted a random 20 to 420 new messages since the last
//!    restart, plus 0 to 100 ms) and restarted on the same state directory and port. The
//!    sink's log then must hold every message exactly once: zero lost, zero accepted twice,
//!    zero received after its expiry (outbox TTL, 1 hour).
//! 2. **xagent-kill**: the same with the sink killed and restarted instead.
//! 3. **barrage**: over one live socket to an in-process echo Connector, 10,000 random and
//!    mutated packets, each followed by a `ping`; every answer must be a well-formed packet,
//!    a packet our own decoder rejects must get exactly one `error` with the code the decoder
//!    names, other refusals must carry a known error code, the socket must stay up (every
//!    `ping` gets its `pong`), and every `chat.message` acked `accepted` (one valid message is
//!    interleaved every 50 packets) must have reached the target.
//! 4. **soak**: 1,000 signed-in channels of mixed traffic for 60 s against the Connector
//!    process (Tools, messages both ways, file uploads): zero protocol errors, and the
//!    Connector's resident memory at the end within 10 % of its level after warm-up.
//!
//! `--quick` shrinks every scenario for CI (1,000 messages over 20 channels and 2 kills,
//! 2,000 barrage packets, 100 channels for 10 s; a soak shorter than 60 s reports memory but
//! does not judge it, since it is mostly warm-up). `--mix T,M,F`, `--inbound-rate R` and
//! `--soak-seconds S` change the soak's traffic. `--only NAME` runs one scenario; `--seed N`
//! replays the kill timings and mutations; `--json` prints one JSON object.

use super::barrage::barrage;
use super::harness::{Rng, Sizes, build_examples, finish, pass, seed};
use super::kill::{Victim, kill_scenario};
use super::soak::soak;
use crate::bench_support::{Flags, print_table, warn_if_debug};
use anyhow::{Result, bail};
use serde_json::Value;
use std::path::Path;

/// Runs the scenarios.
pub fn run(root: &Path, args: &[String]) -> Result<std::process::ExitCode> {
    let flags = Flags::parse(args);
    flags.only(&["--only", "--seed", "--mix", "--inbound-rate", "--soak-seconds"])?;
    warn_if_debug();
    let only: Option<String> = flags.value("--only")?;
    let seed = seed(&flags)?;
    let sizes = if flags.quick {
        Sizes {
            channels: 20,
            per_channel: 50,
            kills: 2,
            rate: 500.0,
            barrage: 2_000,
            soak_channels: 100,
            soak_seconds: 10,
            mix: [5, 4, 1],
            inbound_rate: 200.0,
        }
    } else {
        Sizes {
            channels: 100,
            per_channel: 100,
            kills: 5,
            rate: 1_000.0,
            barrage: 10_000,
            soak_channels: 1_000,
            soak_seconds: 60,
            mix: [5, 4, 1],
            inbound_rate: 200.0,
        }
    };
    let mut sizes = sizes;
    if let Some(mix) = flags.value::<String>("--mix")? {
        let parts: Vec<u64> = mix.split(',').filter_map(|p| p.trim().parse().ok()).collect();
        let [t, m, f] = parts.as_slice() else { bail!("--mix wants three weights, e.g. 5,4,1") };
        sizes.mix = [*t, *m, *f];
    }
    if let Some(rate) = flags.value("--inbound-rate")? {
        sizes.inbound_rate = rate;
    }
    if let Some(seconds) = flags.value("--soak-seconds")? {
        sizes.soak_seconds = seconds;
    }
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let mut rng = Rng::new(seed);
    let mut results = serde_json::Map::new();
    let mut failed = Vec::new();
    let needs_processes = wanted("connector-kill") || wanted("xagent-kill") || wanted("soak");
    let bins = if needs_processes { Some(build_examples(root)?) } else { None };

    for (name, victim) in [("connector-kill", Victim::Connector), ("xagent-kill", Victim::Sink)] {
        if !wanted(name) {
            continue;
        }
        let Some(bins) = &bins else { continue };
        eprintln!("chaos: {name} ...");
        let outcome = kill_scenario(bins, victim, &sizes, &mut rng)?;
        if !outcome["pass"].as_bool().unwrap_or(false) {
            failed.push(name);
        }
        results.insert(name.into(), outcome);
    }
    if wanted("barrage") {
        eprintln!("chaos: barrage ...");
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let outcome = runtime.block_on(barrage(sizes.barrage, &mut rng))?;
        if !outcome["pass"].as_bool().unwrap_or(false) {
            failed.push("barrage");
        }
        results.insert("barrage".into(), outcome);
    }
    if wanted("soak")
        && let Some(bins) = &bins
    {
        {
            eprintln!("chaos: soak ...");
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let outcome = runtime.block_on(soak(bins, &sizes, &mut rng))?;
            if !outcome["pass"].as_bool().unwrap_or(false) {
                failed.push("soak");
            }
            results.insert("soak".into(), outcome);
        }
    }
    finish("chaos", results, seed, flags.quick, &failed, flags.json, print_summary)
}

fn print_summary(result: &Value) {
    let mut rows = Vec::new();
    for name in ["connector-kill", "xagent-kill"] {
        let r = &result["chaos"][name];
        if r.is_null() {
            continue;
        }
        rows.push(vec![
            name.to_string(),
            format!("{} msgs / {} ch, {} kills", r["expected"], r["channels"], r["kills"]),
            format!(
                "lost {} · doubled {} · after expiry {} · unexpected {}",
                r["lost"], r["doubled"], r["after_expiry"], r["unexpected"]
            ),
            format!("{:.1} s", r["seconds"].as_f64().unwrap_or(0.0)),
            pass(r),
        ]);
    }
    let r = &result["chaos"]["barrage"];
    if !r.is_null() {
        rows.push(vec![
            "barrage".into(),
            format!("{} malformed/mutated packets", r["packets"]),
            format!(
                "wrong answers {} · pongs missed {} · accepted lost {}",
                r["wrong_answers"], r["pongs_missed"], r["accepted_lost"]
            ),
            format!("{:.1} s", r["seconds"].as_f64().unwrap_or(0.0)),
            pass(r),
        ]);
    }
    let r = &result["chaos"]["soak"];
    if !r.is_null() {
        rows.push(vec![
            "soak".into(),
            format!("{} channels, {} s mixed", r["channels"], r["seconds"]),
            format!(
                "protocol errors {} · RSS {} -> {} KiB ({:+.1} %)",
                r["protocol_errors"],
                r["rss_warm_kib"],
                r["rss_end_kib"],
                r["rss_growth_pct"].as_f64().unwrap_or(0.0)
            ),
            format!("{} ops", r["operations"]),
            pass(r),
        ]);
    }
    print_table(&["scenario", "load", "outcome", "time", "result"], &rows);
    println!("\nseed {} (replay with --seed)", result["seed"]);
}
