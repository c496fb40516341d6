//! `cargo xtask fuzz --seconds N [--target T]`: runs every cargo-fuzz target in `fuzz/` (or
//! one) for N seconds each, one after the other, and prints per target the executions, the
//! coverage reached and whether it crashed.
//!
//! Needs `cargo install --locked cargo-fuzz` and the nightly toolchain
//! (`cargo +nightly fuzz`). New inputs go to a scratch corpus under `fuzz/target/`; the
//! committed corpus in `fuzz/corpus/<target>/` is read as seeds and never written, so a smoke
//! run leaves the working tree clean. `--merge` minimises the scratch inputs into the
//! committed corpus afterwards (libFuzzer `-merge=1`, only inputs that add coverage).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::bench_support::{Flags, print_table};

/// The fuzz targets, in the order they run.
pub const TARGETS: [&str; 4] =
    ["packet_decode", "session_sequence", "card_descriptor", "multipart_upload"];

/// Runs the targets.
pub fn run(root: &Path, args: &[String]) -> Result<std::process::ExitCode> {
    let flags = Flags::parse(args);
    let merge = flags.rest.iter().any(|a| a == "--merge");
    let rest: Vec<String> = flags.rest.iter().filter(|a| *a != "--merge").cloned().collect();
    let flags = Flags { rest, ..flags };
    flags.only(&["--seconds", "--target"])?;
    let seconds: u64 = flags.value("--seconds")?.unwrap_or(10);
    let only: Option<String> = flags.value("--target")?;
    if let Some(target) = &only
        && !TARGETS.contains(&target.as_str())
    {
        bail!("unknown target {target:?}; targets: {}", TARGETS.join(", "));
    }
    let fuzz_dir = root.join("fuzz");
    let mut rows = Vec::new();
    let mut results = Vec::new();
    let mut failed = false;
    for target in TARGETS.iter().filter(|t| only.as_deref().is_none_or(|o| o == **t)) {
        let scratch = fuzz_dir.join("target").join("scratch-corpus").join(target);
        std::fs::create_dir_all(&scratch)
            .with_context(|| format!("creating {}", scratch.display()))?;
        let seeds = fuzz_dir.join("corpus").join(target);
        let output = Command::new("cargo")
            .current_dir(&fuzz_dir)
            .args(["+nightly", "fuzz", "run", "-O", target])
            .arg(&scratch)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg("-print_final_stats=1")
            .output()
            .context("running cargo +nightly fuzz (cargo install --locked cargo-fuzz)")?;
        let log = String::from_utf8_lossy(&output.stderr);
        let runs = stat(&log, "stat::number_of_executed_units:");
        let coverage = log
            .lines()
            .rev()
            .find_map(|l| l.split(" cov: ").nth(1).and_then(|r| r.split_whitespace().next()))
            .unwrap_or("?")
            .to_string();
        let ok = output.status.success();
        if !ok {
            failed = true;
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!(
                "{target} failed:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if ok && merge {
            let status = Command::new("cargo")
                .current_dir(&fuzz_dir)
                .args(["+nightly", "fuzz", "run", "-O", target])
                .arg(&seeds)
                .arg(&scratch)
                .args(["--", "-merge=1"])
                .output()
                .context("merging the corpus")?;
            if !status.status.success() {
                bail!("merging the {target} corpus failed");
            }
        }
        rows.push(vec![
            target.to_string(),
            format!("{seconds}"),
            runs.map(|r| r.to_string()).unwrap_or_else(|| "?".into()),
            coverage.clone(),
            if ok { "no crash".into() } else { "CRASH".into() },
        ]);
        results.push(json!({"target": target, "seconds": seconds, "executions": runs, "coverage": coverage, "crashed": !ok}));
    }
    if flags.json {
        println!("{}", json!({"fuzz": results}));
    } else {
        print_table(&["target", "seconds", "executions", "coverage (edges)", "result"], &rows);
    }
    Ok(if failed { std::process::ExitCode::FAILURE } else { std::process::ExitCode::SUCCESS })
}

fn stat(log: &str, key: &str) -> Option<u64> {
    log.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.trim().parse().ok()))
}
