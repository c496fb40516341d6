//! `cargo xtask bench-scale`: resident memory per idle open channel, and restore time.
//!
//! The echo Connector runs as its own process (`testkit/examples/echo_connector.rs`),
//! so its resident memory (`/proc/<pid>/statm`) is its alone. One client socket says hello,
//! then opens and signs in channels in pipelined batches up to each step (10,000 and 100,000;
//! `--quick`: 1,000 and 5,000). After each step the Connector's RSS is read after a pause;
//! memory per channel is the growth since the hello divided by the channels added, so the
//! fixed cost of the process and the socket is left out.
//!
//! Restore: the Connector is stopped with SIGKILL, one pending IM v2 message per channel is
//! written into its outbox table (the rows its own outbox writes, `OutboundPayload::to_json`),
//! and the time from spawning the process to its `listening` line (state loaded, every
//! signed-in channel restored, the outbox reloaded) is measured, three times.
//!
//! `--open-only` opens channels without signing them in (no binding, no poller), to split
//! the per-channel cost; `--steps 10000,50000` sets the channel counts.
//!
//! Profiling: `XTASK_CONNECTOR_WRAP="heaptrack -o /tmp/scale"` starts the Connector under a
//! profiler; it is then stopped with SIGTERM (not SIGKILL) after the last step, so what is
//! still allocated at that point is the idle live heap. `XTASK_SCALE_HOLD=SECONDS` waits that
//! long after the hello and after the last step (to take a snapshot or attach a tool). The
//! figures of a profiled run include the profiler's own memory; measure without it. The
//! restore runs are skipped under a wrapper.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use xagent_profile_im::OutboundPayload;
use xagent_protocol_types::{ChatMessage, MessageId, Packet};

use crate::bench_support::{
    API_KEY, Flags, PacketSocket, machine, print_table, rss_of, temp_dir, warn_if_debug,
};
use crate::chaos::harness::{
    build_examples, connector_pid, connector_wrap, free_port, spawn_connector, stop_connector,
};

/// Runs the benchmark.
pub fn run(root: &std::path::Path, args: &[String]) -> Result<std::process::ExitCode> {
    let flags = Flags::parse(args);
    let open_only = flags.rest.iter().any(|a| a == "--open-only");
    let rest: Vec<String> = flags.rest.iter().filter(|a| *a != "--open-only").cloned().collect();
    let flags = Flags { rest, ..flags };
    flags.only(&["--steps"])?;
    warn_if_debug();
    let steps: Vec<usize> = match flags.value::<String>("--steps")? {
        Some(list) => list.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
        None if flags.quick => vec![1_000, 5_000],
        None => vec![10_000, 100_000],
    };
    anyhow::ensure!(!steps.is_empty(), "--steps wants channel counts, e.g. 10000,100000");
    let bins = build_examples(root)?;
    let dir = temp_dir("bench-scale")?;
    let state = dir.join("connector");
    let port = free_port()?;
    // The runtime's default channel limits (4,096 per socket, 16,384 in all) are raised to
    // the largest step: this benchmark opens every channel on one socket.
    let limit = steps.iter().copied().max().unwrap_or(0).max(16_384);
    let limits = vec!["--max-channels".to_string(), limit.to_string()];
    let mut child = spawn_connector(&bins.connector, &state, port, &limits)?;
    let pid = connector_pid(&child);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;

    let mut memory = Vec::new();
    let mut channels: Vec<String> = Vec::new();
    let (rss_base, socket) = runtime.block_on(async {
        let mut socket =
            PacketSocket::connect(&format!("ws://127.0.0.1:{port}/ws"), Some(API_KEY)).await?;
        socket
            .call(json!({"type": "connector.hello", "payload": {"connector_card_id": "im.echo",
                "protocol_version": "3.0", "supported_profiles": ["xagent.im.v2"]}}))
            .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok::<_, anyhow::Error>((rss_of(&pid), socket))
    })?;
    let hold = std::env::var("XTASK_SCALE_HOLD").ok().and_then(|s| s.parse::<u64>().ok());
    if let Some(seconds) = hold {
        eprintln!("bench-scale: connector pid {pid}; holding {seconds} s after the hello");
        std::thread::sleep(Duration::from_secs(seconds));
    }
    let mut socket = socket;
    for &step in &steps {
        let started = Instant::now();
        let opened = runtime
            .block_on(open_channels(&mut socket, &mut channels, step, !open_only))
            .with_context(|| format!("with {} channels open", channels.len()));
        if opened.is_err() {
            let _ = stop_connector(&mut child);
        }
        opened?;
        let opening = started.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_secs(1));
        let rss = rss_of(&pid);
        let per_channel = rss.saturating_sub(rss_base) as f64 / channels.len() as f64;
        memory.push(json!({
            "channels": channels.len(),
            "rss_kib": rss / 1024,
            "rss_base_kib": rss_base / 1024,
            "bytes_per_channel": per_channel.round(),
            "open_and_sign_in_seconds": (opening * 100.0).round() / 100.0,
        }));
    }
    if let Some(seconds) = hold {
        eprintln!("bench-scale: idle with {} channels; holding {seconds} s", channels.len());
        std::thread::sleep(Duration::from_secs(seconds));
    }
    // Stopped while the socket is still open: the idle state is what a profiler reports.
    stop_connector(&mut child)?;
    drop(socket);

    let count = channels.len();
    write_pending(&state.join("connector.sqlite3"), &channels)?;
    let mut restores = Vec::new();
    let mut rss_restored = 0;
    // Under a profiler the restore runs would overwrite its report of the idle heap: skipped.
    let rounds = if connector_wrap().is_empty() { 3 } else { 0 };
    for _ in 0..rounds {
        let started = Instant::now();
        let mut restarted = spawn_connector(&bins.connector, &state, port, &limits)?;
        restores.push(started.elapsed().as_secs_f64());
        std::thread::sleep(Duration::from_millis(300));
        rss_restored = rss_of(&connector_pid(&restarted));
        stop_connector(&mut restarted)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    restores.sort_by(|a, b| a.total_cmp(b));
    let restore = restores.get(restores.len() / 2).copied().unwrap_or(0.0);
    let result = json!({
        "bench": "scale",
        "quick": flags.quick,
        "signed_in": !open_only,
        "memory": memory,
        "restore": {
            "channels": count,
            "pending_messages": count,
            "seconds_median_of_3": (restore * 1000.0).round() / 1000.0,
            "seconds_all": restores,
            "rss_after_restore_kib": rss_restored / 1024,
        },
        "targets": {"bytes_per_channel": 2048, "restore_seconds": 2.0},
        "machine": machine(),
    });
    if flags.json {
        println!("{result}");
    } else {
        let mut rows: Vec<Vec<String>> = memory
            .iter()
            .map(|m| {
                vec![
                    format!("{} idle signed-in channels", m["channels"]),
                    format!("RSS {} KiB (base {} KiB)", m["rss_kib"], m["rss_base_kib"]),
                    format!("{} B per channel", m["bytes_per_channel"]),
                ]
            })
            .collect();
        rows.push(vec![
            format!("restart with {count} channels + {count} pending"),
            format!("RSS {} KiB after restore", rss_restored / 1024),
            format!("{restore:.3} s to listening (median of 3)"),
        ]);
        print_table(&["state", "memory", "figure"], &rows);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Opens (and, with `sign_in`, signs in) channels on one socket until `target` exist, 256
/// requests in flight.
async fn open_channels(
    socket: &mut PacketSocket,
    channels: &mut Vec<String>,
    target: usize,
    sign_in: bool,
) -> Result<()> {
    let mut n = channels.len();
    while channels.len() < target {
        let batch = (target - channels.len()).min(256);
        for i in 0..batch {
            let text = json!({"schema": "xagent.connector.packet/v1", "packet_id": format!("po_{n}_{i}"),
                "request_id": format!("ro_{n}_{i}"), "type": "channel.open"});
            socket.send_text(text.to_string()).await?;
        }
        let mut opened = Vec::new();
        while opened.len() < batch {
            let packet = next(socket).await?;
            if packet.type_str() == "error" {
                bail!("channel.open refused: {:?}", packet.error);
            }
            if packet.type_str() == "channel.open.ack" {
                let id = packet.connector_channel_id.as_ref().map(|c| c.as_str().to_string());
                opened.push(id.context("channel.open.ack without channel")?);
            }
        }
        if !sign_in {
            channels.extend(opened);
            n += batch;
            continue;
        }
        for (i, channel) in opened.iter().enumerate() {
            let text = json!({"schema": "xagent.connector.packet/v1", "packet_id": format!("pa_{n}_{i}"),
                "request_id": format!("ra_{n}_{i}"), "connector_channel_id": channel, "type": "auth.start",
                "payload": {"flow_id": "echo_token", "input": {"token": "scale-token"}}});
            socket.send_text(text.to_string()).await?;
        }
        let mut signed = 0;
        while signed < batch {
            let packet = next(socket).await?;
            if packet.type_str() == "error" {
                bail!("auth.start refused: {:?}", packet.error);
            }
            if packet.type_str() == "auth.start.ack" {
                if packet.error.is_some() {
                    bail!("sign-in refused: {:?}", packet.error);
                }
                signed += 1;
            }
        }
        channels.extend(opened);
        n += batch;
    }
    Ok(())
}

async fn next(socket: &mut PacketSocket) -> Result<Packet> {
    let text = socket
        .recv_text(Duration::from_secs(30))
        .await?
        .context("the connector closed the socket")?;
    Ok(Packet::decode_str(&text)?)
}

/// One pending `chat.message` per channel in the outbox table, as the outbox writes them.
fn write_pending(db: &std::path::Path, channels: &[String]) -> Result<()> {
    let conn =
        rusqlite::Connection::open(db).with_context(|| format!("opening {}", db.display()))?;
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    conn.execute_batch("BEGIN")?;
    for (seq, channel) in channels.iter().enumerate() {
        let message =
            ChatMessage::text(MessageId::new(format!("pending_{seq}")), "waiting for xAgent")
                .created_at(now as u64);
        let payload = OutboundPayload::ChatMessage(message).to_json()?;
        conn.execute(
            "INSERT INTO im_pending (channel, message_id, seq, payload, attempts,
               first_responsibility_at, expires_at, next_attempt_at, last_error)
             VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, ?5, NULL)",
            rusqlite::params![
                channel,
                format!("pending_{seq}"),
                seq as i64,
                payload,
                now,
                now + 3_600_000
            ],
        )?;
    }
    conn.execute_batch("COMMIT")?;
    Ok(())
}
