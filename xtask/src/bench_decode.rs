//! `cargo xtask bench-decode`: packets decoded per second, four ways side by side in one run
//! (the criterion bench `cargo bench -p xagent-protocol-types --bench decode` measures the
//! same paths with criterion's statistics):
//!
//! - typed: `Packet::decode` (envelope + typed payload, every field checked by the types);
//! - single-pass validator: `Validator::check_packet`, the hot-path form (one typed decode,
//!   the rules on the typed packet, one allocation-free scan of the text for secrets);
//! - typed + rules: typed decode, then the report form (`validate_packet` on a second parse
//!   into `Value`), as the runtime did before the single-pass form;
//! - `Value`: `serde_json::from_slice::<Value>` (JSON parsing alone, the floor);
//! - schema: parse to `Value`, then validate with `jsonschema` against the published envelope
//!   schema, and against the packet schema generated in `schemas/` (envelope + payload).
//!
//! Each path runs in rounds of about 0.2 s, alternating, and the best round counts.
//!
//! Then the C ABI overhead: the verdict `Validator::packet_is_valid` called from Rust, and the
//! same verdict `xagent_packet_is_valid` called through the C ABI from a C program
//! (`validate-ffi/tests/c/bench_validate.c`, built with `cc -O2`) and from Go through cgo
//! (`validate-ffi/tests/go`, skipped when `go` is missing), on the same packets: one round of
//! each in turn, best of 7 (3 with `--quick`). `--no-ffi` leaves this part out.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use xagent_protocol_types::Packet;
use xagent_protocol_validate::{PacketContext, Validator, validate_packet};

use crate::bench_support::{Flags, machine, print_table, warn_if_debug};

type Path4 = (&'static str, Box<dyn Fn(&[u8]) -> bool>);

/// Runs the benchmark.
pub fn run(root: &Path, args: &[String]) -> Result<std::process::ExitCode> {
    let mut flags = Flags::parse(args);
    let no_ffi = flags.rest.iter().any(|a| a == "--no-ffi");
    flags.rest.retain(|a| a != "--no-ffi");
    flags.only(&[])?;
    warn_if_debug();
    let load = |relative: &str| -> Result<jsonschema::Validator> {
        let path = root.join(relative);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let value: Value = serde_json::from_str(&text)?;
        jsonschema::validator_for(&value).map_err(|e| anyhow::anyhow!("{relative}: {e}"))
    };
    let published =
        load("protocol-types/tests/fixtures/published/xagent.connector.packet.v1.schema.json")?;
    let generated = load("schemas/xagent.connector.packet.v1.schema.json")?;
    let message = std::fs::read_to_string(
        root.join("protocol-types/tests/fixtures/examples/packet--chat.message.json"),
    )?;
    let message = serde_json::to_vec(&serde_json::from_str::<Value>(&message)?)?;
    let invoke = br#"{"schema":"xagent.connector.packet/v1","packet_id":"pkt_81f2","request_id":"req_81f2","connector_channel_id":"cch_5d1e","type":"tool.invoke","time":1790000000000,"payload":{"tool_id":"echo_send","arguments":{"connector_channel_id":"cch_5d1e","text":"hello there"}}}"#.to_vec();

    let validator = Validator::default();
    let paths: Vec<Path4> = vec![
        ("typed decode", Box::new(|b| Packet::decode(b).is_ok())),
        (
            "single-pass validator (check_packet)",
            Box::new(move |b| validator.check_packet(b, PacketContext::default()).is_ok()),
        ),
        (
            "typed decode + rule validator",
            Box::new(|b| {
                Packet::decode(b).is_ok()
                    && serde_json::from_slice::<Value>(b)
                        .is_ok_and(|v| validate_packet(&v, PacketContext::default()).valid)
            }),
        ),
        ("serde_json Value", Box::new(|b| serde_json::from_slice::<Value>(b).is_ok())),
        (
            "Value + jsonschema (published envelope)",
            Box::new(move |b| {
                serde_json::from_slice::<Value>(b).is_ok_and(|v| published.is_valid(&v))
            }),
        ),
        (
            "Value + jsonschema (generated, with payloads)",
            Box::new(move |b| {
                serde_json::from_slice::<Value>(b).is_ok_and(|v| generated.is_valid(&v))
            }),
        ),
    ];
    let round = Duration::from_millis(if flags.quick { 100 } else { 200 });
    let rounds = if flags.quick { 3 } else { 10 };
    let mut results = Vec::new();
    let mut rows = Vec::new();
    for (sample, bytes) in [("chat.message", &message), ("tool.invoke", &invoke)] {
        let mut best = vec![0f64; paths.len()];
        for (i, (name, f)) in paths.iter().enumerate() {
            anyhow::ensure!(f(bytes), "{name} rejects the {sample} sample");
            let _ = i;
        }
        for _ in 0..rounds {
            for (i, (_, f)) in paths.iter().enumerate() {
                let started = Instant::now();
                let mut n = 0u64;
                while started.elapsed() < round {
                    for _ in 0..64 {
                        black_box(f(black_box(bytes)));
                    }
                    n += 64;
                }
                best[i] = best[i].max(n as f64 / started.elapsed().as_secs_f64());
            }
        }
        let floor = best[3];
        for (i, (name, _)) in paths.iter().enumerate() {
            let ratio = if floor > 0.0 { (best[i] / floor * 1000.0).round() / 1000.0 } else { 0.0 };
            rows.push(vec![
                sample.to_string(),
                name.to_string(),
                format!("{:.0}", best[i]),
                format!("{ratio}"),
            ]);
            results.push(json!({"packet": sample, "path": name, "per_second": best[i].round(), "ratio_vs_value": ratio}));
        }
    }
    let ffi = if no_ffi {
        Vec::new()
    } else {
        ffi_overhead(root, &[("chat.message", &message), ("tool.invoke", &invoke)], flags.quick)?
    };
    if flags.json {
        println!(
            "{}",
            json!({"bench": "decode", "quick": flags.quick, "results": results, "ffi": ffi, "machine": machine()})
        );
    } else {
        print_table(&["packet", "path", "packets/s", "ratio vs Value"], &rows);
        if !ffi.is_empty() {
            println!();
            let rows: Vec<Vec<String>> = ffi
                .iter()
                .map(|r| {
                    let text = |k: &str| match &r[k] {
                        Value::Null => "-".to_owned(),
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    vec![
                        text("packet"),
                        text("rust_ns"),
                        text("c_ns"),
                        text("c_overhead"),
                        text("go_ns"),
                        text("go_overhead"),
                    ]
                })
                .collect();
            print_table(
                &["packet", "Rust ns/call", "C ns/call", "C overhead", "Go ns/call", "Go overhead"],
                &rows,
            );
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Nanoseconds per call of `f` over one round of about `round`.
fn ns_per_call(round: Duration, f: impl Fn() -> bool) -> f64 {
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < round {
        for _ in 0..64 {
            black_box(f());
        }
        n += 64;
    }
    started.elapsed().as_nanos() as f64 / n as f64
}

/// Runs `command`, checks it succeeded, returns its standard output.
fn run_checked(command: &mut std::process::Command, what: &str) -> Result<String> {
    let output = command.output().with_context(|| format!("running {what}"))?;
    anyhow::ensure!(
        output.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn ns_from(stdout: &str) -> Result<f64> {
    let value: Value = serde_json::from_str(stdout.trim()).context("reading ns_per_call")?;
    value["ns_per_call"].as_f64().context("ns_per_call missing")
}

/// The C ABI overhead rows: Rust, C and Go calls of the same verdict on the same packets.
fn ffi_overhead(root: &Path, samples: &[(&str, &Vec<u8>)], quick: bool) -> Result<Vec<Value>> {
    use std::process::Command;
    let lib = crate::bench_support::cargo_build(root, &["-p", "xagent-validate-ffi"])?;
    let include = root.join("validate-ffi/include");
    let work = crate::bench_support::temp_dir("bench-ffi")?;
    let c_bin = work.join("bench_validate");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    run_checked(
        Command::new(&cc)
            .args(["-O2", "-std=c11", "-I"])
            .arg(&include)
            .arg(root.join("validate-ffi/tests/c/bench_validate.c"))
            .arg("-L")
            .arg(&lib)
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-lxagent_validate_ffi")
            .arg("-o")
            .arg(&c_bin),
        "compiling bench_validate.c",
    )?;
    let go_bin = work.join("validatecheck");
    let go = Command::new("go").arg("version").output().is_ok_and(|o| o.status.success());
    if go {
        run_checked(
            Command::new("go")
                .args(["build", "-o"])
                .arg(&go_bin)
                .arg(".")
                .current_dir(root.join("validate-ffi/tests/go"))
                .env("CGO_ENABLED", "1")
                .env("CGO_CFLAGS", format!("-O2 -I{}", include.display()))
                .env(
                    "CGO_LDFLAGS",
                    format!("-L{0} -lxagent_validate_ffi -Wl,-rpath,{0}", lib.display()),
                )
                .env("GOFLAGS", "-mod=mod")
                .env("GO111MODULE", "on")
                .env("GOPROXY", "off")
                .env("GOCACHE", work.join("go-cache"))
                .env("GOPATH", work.join("gopath")),
            "go build (validate-ffi/tests/go)",
        )?;
    } else {
        eprintln!(
            "note: `go` is not installed; the Go column is left out (apt-get install golang-go)"
        );
    }
    let millis = if quick { 100 } else { 300 };
    let rounds = if quick { 3 } else { 7 };
    let validator = Validator::default();
    let mut rows = Vec::new();
    for (name, bytes) in samples {
        let file = work.join(format!("{name}.json"));
        std::fs::write(&file, bytes)?;
        // One round of each caller in turn, best of `rounds`: a shared machine's load changes
        // over seconds, and alternating keeps the three on the same footing.
        let (mut rust, mut c, mut go_ns) = (f64::MAX, f64::MAX, f64::MAX);
        for _ in 0..rounds {
            rust = rust.min(ns_per_call(Duration::from_millis(millis), || {
                validator.packet_is_valid(black_box(bytes), PacketContext::default())
            }));
            c = c.min(ns_from(&run_checked(
                Command::new(&c_bin).arg(&file).arg(millis.to_string()).arg("1"),
                "bench_validate",
            )?)?);
            if go {
                go_ns = go_ns.min(ns_from(&run_checked(
                    Command::new(&go_bin).arg("bench").arg(&file).arg(millis.to_string()).arg("1"),
                    "validatecheck bench",
                )?)?);
            }
        }
        let go_ns = go.then_some(go_ns);
        let overhead = |foreign: f64| ((foreign / rust - 1.0) * 1000.0).round() / 1000.0;
        rows.push(json!({
            "packet": name,
            "rust_ns": (rust * 10.0).round() / 10.0,
            "c_ns": c,
            "c_overhead": overhead(c),
            "go_ns": go_ns,
            "go_overhead": go_ns.map(overhead),
        }));
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(rows)
}
