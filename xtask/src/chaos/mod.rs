//! `cargo xtask chaos`: the reliability harness, bounded in time, loopback only (see
//! `RELIABILITY.md`). Three harnesses over the shared [`harness`]: the single-process
//! scenarios ([`single`]: kills, barrage, soak), `--cluster` (replicas on PostgreSQL behind
//! HAProxy, [`cluster`]) and `--matrix` (`xagent-connector matrix` on a real Synapse,
//! [`matrix`]).

mod barrage;
mod cluster;
pub mod harness;
mod kill;
mod matrix;
mod single;
mod soak;

use std::path::Path;

/// Runs the harness the flags name.
pub fn run(root: &Path, args: &[String]) -> anyhow::Result<std::process::ExitCode> {
    if args.iter().any(|a| a == "--cluster") {
        return cluster::run(root, args);
    }
    if args.iter().any(|a| a == "--matrix") {
        return matrix::run(root, args);
    }
    single::run(root, args)
}
