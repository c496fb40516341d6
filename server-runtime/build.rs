//! Stamps the build time (YYMMDDHHMM, UTC) and, when available, the git revision and tag into
//! the crate, so `BuildStamp::runtime()` and the `/health` default need no runtime lookup.

#[path = "src/build_info/stamp.rs"]
mod stamp;

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/build_info/stamp.rs");
    println!("cargo:rerun-if-env-changed=XAGENT_BUILD_TIME");
    println!("cargo:rerun-if-env-changed=XAGENT_GIT_REV");
    println!("cargo:rerun-if-env-changed=XAGENT_GIT_TAG");
    let build_time = std::env::var("XAGENT_BUILD_TIME").unwrap_or_else(|_| now_stamp());
    println!("cargo:rustc-env=XAGENT_RUNTIME_BUILD_TIME={build_time}");
    let rev = std::env::var("XAGENT_GIT_REV")
        .ok()
        .or_else(|| git(&["rev-parse", "--short=7", "HEAD"]))
        .unwrap_or_default();
    println!("cargo:rustc-env=XAGENT_RUNTIME_GIT_REV={rev}");
    let tag = std::env::var("XAGENT_GIT_TAG")
        .ok()
        .or_else(|| git(&["describe", "--tags", "--exact-match"]))
        .unwrap_or_default();
    println!("cargo:rustc-env=XAGENT_RUNTIME_GIT_TAG={tag}");
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

/// Now as YYMMDDHHMM in UTC (the runtime's own stamp function).
fn now_stamp() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    stamp::stamp(secs)
}
