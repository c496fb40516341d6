//! Development tasks for the workspace. Run them with `cargo xtask <task>`.
//!
//! - `gen-schemas`: write the JSON Schemas generated from `xagent-protocol-types` into
//!   `schemas/`.
//! - `gen-schemas --check`: exit non-zero when the committed schemas differ from what the types
//!   generate (the drift check CI runs).
//! - `codegen-check [--only ts|py]`: generate TypeScript and Python types from `schemas/` and
//!   round-trip every wire fixture through them (see [`codegen`]; needs `npm ci --prefix codegen`
//!   and `pip install -r codegen/requirements.txt`).
//! - `bench-ws`, `bench-decode`, `bench-durable`, `bench-scale`, `bench-isolation`, `bench-webchat`
//!   `[--quick] [--json]`: whole-system
//!   benchmarks, each against the machine's own limit in the same run (see `BENCHMARKS.md`).
//!   `bench-ws` and `bench-durable` take `--postgres` (the runtime on PostgreSQL, against raw
//!   PostgreSQL commits on the same server).
//! - `chaos [--quick]`: kill -9 and malformed-input harness on loopback (see `RELIABILITY.md`);
//!   `chaos --cluster [--quick] [--throughput [--replica-cpu CORES]]`: the same for replicas on
//!   PostgreSQL behind HAProxy; `chaos --matrix [--quick] [--seed N]`: kill -9 of
//!   `xagent-connector matrix` during a conversation in an encrypted room on a real Synapse.
//! - `fuzz --seconds N [--target T]`: runs every cargo-fuzz target in `fuzz/` for N seconds.
//! - `attack [--quick] [--json]`: every finding of the im.webchat attack run (issue 14) against
//!   a freshly started `xagent-connector webchat`, loopback only; fails if any attack works.
//!
//! ## Modules and which way they depend
//!
//! Rows are listed top first: a module imports only its own row and rows below it, and no two
//! files import each other in a circle (`tests/module_layers.rs` checks both).
//!
//! **Tasks.**
//!
//! | module | holds |
//! |---|---|
//! | `bench_scale`, `bench_webchat` | benchmarks that start the chaos harness's processes |
//! | `attack`, `chaos`, `bench_isolation`, `bench_ws`, `bench_decode`, `codegen`, `fuzz` | one task each |
//!
//! **What the tasks share.**
//!
//! | module | holds |
//! |---|---|
//! | `bench_durable` | the durable benchmark and its signed-in channels and client settings |
//! | `bench_support`, `cpu_limit` | flags, tables, processes, sockets and CPU measures; cgroup CPU quotas |

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use serde_json::Value;

mod attack;
mod bench_decode;
mod bench_durable;
mod bench_isolation;
mod bench_scale;
mod bench_support;
mod bench_webchat;
mod bench_ws;
mod chaos;
mod codegen;
mod cpu_limit;
mod fuzz;

const USAGE: &str = "usage: cargo xtask gen-schemas [--check] | codegen-check [--only ts|py] | bench-ws|bench-decode|bench-durable|bench-scale|bench-isolation|bench-webchat [--quick] [--json] (bench-decode: [--no-ffi]; bench-ws: [--log text|json]; bench-ws, bench-durable: [--postgres]) | chaos [--quick] [--cluster [--throughput [--replica-cpu CORES]] | --matrix [--seed N]] | fuzz --seconds N [--target T] | attack [--quick] [--json]";

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("gen-schemas") => {
            let check = match args.get(1).map(String::as_str) {
                None => false,
                Some("--check") => true,
                Some(other) => {
                    bail!("unknown flag {other:?}; usage: cargo xtask gen-schemas [--check]")
                }
            };
            gen_schemas(&workspace_root(), check)
        }
        Some("codegen-check") => codegen::run(&workspace_root(), &args[1..]),
        Some("bench-ws") => bench_ws::run(&args[1..]),
        Some("bench-decode") => bench_decode::run(&workspace_root(), &args[1..]),
        Some("bench-durable") => bench_durable::run(&args[1..]),
        Some("bench-isolation") => bench_isolation::run(&args[1..]),
        Some("bench-scale") => bench_scale::run(&workspace_root(), &args[1..]),
        Some("bench-webchat") => bench_webchat::run(&workspace_root(), &args[1..]),
        Some("chaos") => chaos::run(&workspace_root(), &args[1..]),
        Some("fuzz") => fuzz::run(&workspace_root(), &args[1..]),
        Some("attack") => attack::run(&workspace_root(), &args[1..]),
        _ => {
            eprintln!("{USAGE}");
            Ok(ExitCode::from(2))
        }
    }
}

fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Every generated schema file, as (path relative to `schemas/`, contents).
fn generated() -> Result<Vec<(PathBuf, String)>> {
    use xagent_protocol_types::schema;
    let mut files = vec![
        (PathBuf::from("xagent.connector.v1.schema.json"), schema::card_schema()),
        (PathBuf::from("xagent.connection.v2.schema.json"), schema::descriptor_schema()),
        (PathBuf::from("xagent.connector.packet.v1.schema.json"), schema::packet_schema()),
    ];
    files.push((PathBuf::from("http").join("health.schema.json"), schema::health_schema()));
    files.push((PathBuf::from("http").join("upload.schema.json"), schema::upload_schema()));
    for (packet_type, payload) in schema::payload_schemas() {
        files.push((PathBuf::from("packets").join(format!("{packet_type}.schema.json")), payload));
    }
    files.into_iter().map(|(path, value)| Ok((path, render(&value)?))).collect()
}

fn render(value: &Value) -> Result<String> {
    let mut text = serde_json::to_string_pretty(value).context("serialising a schema")?;
    text.push('\n');
    Ok(text)
}

fn gen_schemas(root: &Path, check: bool) -> Result<ExitCode> {
    let dir = root.join("schemas");
    let files = generated()?;
    let mut drift = Vec::new();
    for (relative, contents) in &files {
        let path = dir.join(relative);
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() == Some(contents.as_str()) {
            continue;
        }
        if check {
            drift.push(relative.display().to_string());
        } else {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            std::fs::write(&path, contents)
                .with_context(|| format!("writing {}", path.display()))?;
            println!("wrote schemas/{}", relative.display());
        }
    }
    // Files in schemas/ that the types no longer generate are drift too.
    let expected: Vec<PathBuf> = files.iter().map(|(p, _)| p.clone()).collect();
    for stale in schema_files(&dir)? {
        if !expected.contains(&stale) {
            if check {
                drift.push(format!("{} (no longer generated)", stale.display()));
            } else {
                std::fs::remove_file(dir.join(&stale))
                    .with_context(|| format!("removing {}", stale.display()))?;
                println!("removed schemas/{}", stale.display());
            }
        }
    }
    if check {
        if drift.is_empty() {
            println!("schemas/ is up to date ({} files)", files.len());
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!("schemas/ differs from what the types generate:");
        for path in &drift {
            eprintln!("  {path}");
        }
        eprintln!("run `cargo xtask gen-schemas` and commit the result");
        return Ok(ExitCode::FAILURE);
    }
    println!("{} schema files in schemas/", files.len());
    Ok(ExitCode::SUCCESS)
}

fn schema_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let path = dir.join(&relative);
        let Ok(entries) = std::fs::read_dir(&path) else { continue };
        for entry in entries {
            let entry = entry.with_context(|| format!("reading {}", path.display()))?;
            let name = relative.join(entry.file_name());
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(name);
            } else if name.to_string_lossy().ends_with(".schema.json") {
                out.push(name);
            }
        }
    }
    Ok(out)
}
