//! `cargo xtask bench-webchat`: the agent's `webchat_message_send` through a running
//! `xagent-connector webchat` process (built in this task's profile, its own SQLite state
//! directory, the runtime's default durability: WAL, `synchronous=FULL`), driven from outside
//! by one xAgent client over one WebSocket with `--inflight` calls (default 64) outstanding at
//! all times, against raw single-row SQLite FULL commits measured in the same run.
//!
//! Every call has its own request id, so each one stores a message (its records ride the
//! tool-call record's commit) and answers only once that commit is durable. Each round: raw
//! commits for a period, then the closed loop (after a 300 ms warm-up), then raw commits
//! again; `ratio_vs_sqlite` is the median over the rounds of calls per second over the mean
//! of the two raw figures around it (target >= 1.0).
//!
//! `--quick` is one round of 2 s (raw: 1 s each side); the full run 3 rounds of 5 s (raw: 3 s).
//! `--rounds N`, `--seconds S` and `--inflight N` override. `--json` prints one JSON object.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;
use xagent_protocol_types::Packet;
use xagent_server_runtime::storage::Synchronous;

use crate::bench_support::{API_KEY, Flags, PacketSocket, machine, median, print_table, temp_dir};

/// Runs the benchmark with the given flags.
pub fn run(root: &Path, args: &[String]) -> Result<std::process::ExitCode> {
    let flags = Flags::parse(args);
    flags.only(&["--rounds", "--seconds", "--inflight"])?;
    crate::bench_support::warn_if_debug();
    let rounds: usize = flags.value("--rounds")?.unwrap_or(if flags.quick { 1 } else { 3 });
    let seconds: f64 = flags.value("--seconds")?.unwrap_or(if flags.quick { 2.0 } else { 5.0 });
    let inflight: u64 = flags.value("--inflight")?.unwrap_or(64);
    if inflight == 0 {
        bail!("--inflight must be at least 1");
    }
    let raw_period = Duration::from_secs(if flags.quick { 1 } else { 3 });
    let bin = crate::bench_support::xagent_connector(root)?;
    let dir = temp_dir("bench-webchat")?;
    let port = crate::chaos::harness::free_port()?;
    let mut child = spawn_webchat(&bin, &dir.join("state"), port)?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let url = format!("ws://127.0.0.1:{port}/ws");
    let measured = (|| -> Result<Vec<(f64, f64, f64, u64)>> {
        let mut out = Vec::new();
        for round in 0..rounds {
            let before = crate::bench_durable::raw_commits(
                &dir.join(format!("raw-{round}-a.sqlite3")),
                raw_period,
                Synchronous::Full,
            )?;
            let (calls, errors) = runtime.block_on(closed_loop(
                &url,
                round,
                inflight,
                Duration::from_secs_f64(seconds),
            ))?;
            let after = crate::bench_durable::raw_commits(
                &dir.join(format!("raw-{round}-b.sqlite3")),
                raw_period,
                Synchronous::Full,
            )?;
            out.push((calls, before, after, errors));
        }
        Ok(out)
    })();
    let _ = child.kill();
    let _ = child.wait();
    drop(runtime);
    let _ = std::fs::remove_dir_all(&dir);
    let measured = measured?;

    let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let mut ratios: Vec<f64> =
        measured.iter().map(|(calls, a, b, _)| calls / ((a + b) / 2.0).max(1.0)).collect();
    let mut calls: Vec<f64> = measured.iter().map(|m| m.0).collect();
    let mut raw: Vec<f64> = measured.iter().map(|m| (m.1 + m.2) / 2.0).collect();
    let errors: u64 = measured.iter().map(|m| m.3).sum();
    let result = json!({
        "bench": "webchat",
        "quick": flags.quick,
        "rounds": rounds,
        "seconds": seconds,
        "inflight": inflight,
        "durability": "WAL, synchronous=FULL on both sides (the runtime's default)",
        "webchat_message_send_per_s": median(&mut calls).round(),
        "sqlite_commits_per_s": median(&mut raw).round(),
        "errors": errors,
        "ratio_vs_sqlite": round3(median(&mut ratios)),
        "ratio_per_round": measured
            .iter()
            .map(|(c, a, b, _)| round3(c / ((a + b) / 2.0).max(1.0)))
            .collect::<Vec<_>>(),
        "target_ratio_vs_sqlite": 1.0,
        "machine": machine(),
    });
    if flags.json {
        println!("{result}");
    } else {
        print_table(
            &["path", "per s"],
            &[
                vec![
                    "raw SQLite: single-row INSERT commits (FULL)".into(),
                    format!("{}", result["sqlite_commits_per_s"]),
                ],
                vec![
                    format!("webchat_message_send, {inflight} in flight, from outside"),
                    format!("{}", result["webchat_message_send_per_s"]),
                ],
            ],
        );
        println!(
            "ratio vs raw commits: {} (target >= 1.0), errors: {errors}",
            result["ratio_vs_sqlite"]
        );
    }
    if errors > 0 {
        bail!("{errors} calls failed");
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Starts `xagent-connector webchat` on `port` and waits for its `listening` line.
fn spawn_webchat(bin: &Path, state: &Path, port: u16) -> Result<Child> {
    let mut child = Command::new(bin)
        .arg("webchat")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--state-dir")
        .arg(state)
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).context("reading the webchat's first line")?;
    if !line.contains("listening") {
        let _ = child.kill();
        let _ = child.wait();
        bail!("xagent-connector webchat did not start: {line:?}");
    }
    Ok(child)
}

/// `connector.hello` for `im.webchat`, `channel.open` and the room form's sign-in (a new room
/// per round); returns the signed-in channel.
async fn session(socket: &mut PacketSocket, round: usize) -> Result<String> {
    let ack = socket
        .call(json!({"type": "connector.hello", "payload": {
            "connector_card_id": "im.webchat", "protocol_version": "3.0",
            "supported_profiles": ["xagent.im.v2"]}}))
        .await?;
    if ack.error.is_some() {
        bail!("hello refused: {:?}", ack.error);
    }
    let ack = socket.call(json!({"type": "channel.open"})).await?;
    let channel = ack
        .connector_channel_id
        .as_ref()
        .map(|c| c.as_str().to_string())
        .ok_or_else(|| anyhow!("channel.open.ack without a channel: {:?}", ack.error))?;
    let signed = socket
        .call(json!({"type": "auth.start", "connector_channel_id": channel, "payload": {
            "flow_id": "webchat_room", "input": {
                "room_name": format!("Bench {round}"), "access_code": "bench-access-1",
                "owner_code": "bench-owner-1"}}}))
        .await?;
    let status = signed.to_value().ok().map(|v| v["payload"]["status"].clone());
    if signed.error.is_some() || status != Some(json!("authenticated")) {
        bail!("sign-in refused: {:?} {status:?}", signed.error);
    }
    Ok(channel)
}

fn invoke(channel: &str, round: usize, n: u64) -> String {
    format!(
        r#"{{"schema":"xagent.connector.packet/v1","packet_id":"pkt_w{round}_{n}","request_id":"req_w{round}_{n}","connector_channel_id":"{channel}","type":"tool.invoke","payload":{{"tool_id":"webchat_message_send","arguments":{{"connector_channel_id":"{channel}","text":"bench message {n}"}}}}}}"#
    )
}

/// Whether a frame answers one of the calls, and whether that call failed.
fn reply(text: &str) -> Option<bool> {
    let packet = Packet::decode_str(text).ok()?;
    if packet.type_str() != "tool.invoke.ack" {
        return None;
    }
    packet.request_id.as_ref()?.as_str().strip_prefix("req_w")?;
    let failed = packet.error.is_some()
        || packet.to_value().ok().is_some_and(|v| v["payload"]["ok"] == json!(false));
    Some(failed)
}

/// `inflight` calls outstanding at all times for `phase` (after a 300 ms warm-up): calls per
/// second and failed calls.
async fn closed_loop(
    url: &str,
    round: usize,
    inflight: u64,
    phase: Duration,
) -> Result<(f64, u64)> {
    let mut socket = PacketSocket::connect(url, Some(API_KEY)).await?;
    let channel = session(&mut socket, round).await?;
    let mut next = 0u64;
    for _ in 0..inflight {
        socket.send_text(invoke(&channel, round, next)).await?;
        next += 1;
    }
    let started = Instant::now();
    let warmup = Duration::from_millis(300);
    let mut measuring: Option<Instant> = None;
    let (mut done, mut errors) = (0u64, 0u64);
    loop {
        let Some(text) = socket.recv_text(Duration::from_secs(10)).await? else {
            bail!("the webchat closed the socket");
        };
        let Some(failed) = reply(&text) else { continue };
        let now = Instant::now();
        match measuring {
            None if now - started >= warmup => measuring = Some(now),
            Some(since) => {
                done += 1;
                errors += u64::from(failed);
                if now - since >= phase {
                    let _ = socket.socket.close(None).await;
                    return Ok((done as f64 / (now - since).as_secs_f64(), errors));
                }
            }
            None => {}
        }
        socket.send_text(invoke(&channel, round, next)).await?;
        next += 1;
    }
}
