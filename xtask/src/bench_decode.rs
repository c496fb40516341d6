//! `cargo xtask bench-decode`: packets decoded per second, four ways side by side in one run
//! (the criterion bench `cargo bench -p xagent-protocol-types --bench decode` measures the
//! same paths with criterion's statistics):
//!
//! - typed: `Packet::decode` (envelope + typed payload, every field checked by the types);
//! - typed + rules: typed decode, then `protocol-validate`'s rule-based packet validator;
//! - `Value`: `serde_json::from_slice::<Value>` (JSON parsing alone, the floor);
//! - schema: parse to `Value`, then validate with `jsonschema` against the published envelope
//!   schema, and against the packet schema generated in `schemas/` (envelope + payload).
//!
//! Each path runs in rounds of about 0.2 s, alternating, and the best round counts.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use xagent_protocol_types::Packet;
use xagent_protocol_validate::{PacketContext, validate_packet};

use crate::bench_support::{Flags, machine, print_table, warn_if_debug};

type Path4 = (&'static str, Box<dyn Fn(&[u8]) -> bool>);

/// Runs the benchmark.
pub fn run(root: &Path, args: &[String]) -> Result<std::process::ExitCode> {
    let flags = Flags::parse(args);
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

    let paths: Vec<Path4> = vec![
        ("typed decode", Box::new(|b| Packet::decode(b).is_ok())),
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
        let floor = best[2];
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
    if flags.json {
        println!(
            "{}",
            json!({"bench": "decode", "quick": flags.quick, "results": results, "machine": machine()})
        );
    } else {
        print_table(&["packet", "path", "packets/s", "ratio vs Value"], &rows);
    }
    Ok(std::process::ExitCode::SUCCESS)
}
