//! The `soak` scenario: many signed-in channels of mixed traffic (Tools, messages both ways,
//! file uploads) against the Connector process; zero protocol errors and a flat memory.

use super::harness::{Bins, Rng, Sizes, connector_pid, free_port, spawn_connector, stop_connector};
use crate::bench_durable::{client_config, signed_in_channels};
use crate::bench_support::{API_KEY, rss_of, temp_dir};
use anyhow::Result;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use xagent_client_runtime::{ClientEvent, ControlPlane, DataPlane};
use xagent_protocol_types::{ChatMessage, MessageId, Secret, ToolInvoke};

/// Concurrent traffic tasks of the soak.
const SOAK_WORKERS: u64 = 16;

/// Uploads per soak at most (the file store keeps 10,000 files for 24 h by default).
const MAX_SOAK_UPLOADS: u64 = 5_000;

pub(crate) async fn soak(bins: &Bins, sizes: &Sizes, rng: &mut Rng) -> Result<Value> {
    let dir = temp_dir("chaos-soak")?;
    let port = free_port()?;
    let feed = vec!["--loop".to_string(), "--rate".to_string(), sizes.inbound_rate.to_string()];
    let mix = sizes.mix;
    let uploads_left = Arc::new(AtomicU64::new(MAX_SOAK_UPLOADS));
    let mut child = spawn_connector(&bins.connector, &dir.join("connector"), port, &feed)?;
    let pid = connector_pid(&child);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let config = client_config(addr)?;
    let control = ControlPlane::new(config.base_url.clone(), Some(Secret::new(API_KEY)));
    let (plane, mut events) = DataPlane::connect(config).await?;
    plane.connected().await?;
    let channels = signed_in_channels(&plane, sizes.soak_channels).await?;
    let errors = Arc::new(AtomicU64::new(0));
    let inbound = Arc::new(AtomicU64::new(0));
    let (e2, i2) = (errors.clone(), inbound.clone());
    let listener = tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            match event {
                ClientEvent::ChatMessage(message) => {
                    message.accept();
                    i2.fetch_add(1, Ordering::Relaxed);
                }
                ClientEvent::ChatMessageAcked { ack, .. }
                    if ack.status.as_str() != "accepted" && ack.status.as_str() != "duplicate" =>
                {
                    e2.fetch_add(1, Ordering::Relaxed);
                }
                ClientEvent::Error(_) => {
                    e2.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
    });
    let started = Instant::now();
    let total = Duration::from_secs(sizes.soak_seconds);
    let warm_at = Duration::from_secs_f64(sizes.soak_seconds as f64 * 0.2);
    let counters =
        Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let channels = Arc::new(channels);
    let mut workers = Vec::new();
    for worker in 0..SOAK_WORKERS {
        let (plane, control, channels) = (plane.clone(), control.clone(), channels.clone());
        let (errors, counters) = (errors.clone(), counters.clone());
        let uploads_left = uploads_left.clone();
        let mut rng = Rng::new(rng.next());
        workers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while started.elapsed() < total {
                n += 1;
                let tag = format!("{worker}_{n}");
                let channel = &channels[rng.below(channels.len() as u64) as usize];
                let mut pick = rng.below(mix.iter().sum::<u64>().max(1));
                let mut kind = 0;
                while kind < 2 && pick >= mix[kind] {
                    pick -= mix[kind];
                    kind += 1;
                }
                // The file store holds at most 10,000 files for 24 h: stay below that.
                if kind == 2
                    && uploads_left
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                        .is_err()
                {
                    kind = 0;
                }
                let kind = match kind {
                    0 => {
                        let mut arguments = serde_json::Map::new();
                        arguments.insert("connector_channel_id".into(), json!(channel.as_str()));
                        arguments.insert("text".into(), json!(format!("soak {tag}")));
                        let invoke = ToolInvoke::new("echo_send", arguments);
                        (0, plane.request(Some(channel), invoke).await.is_ok())
                    }
                    1 => {
                        let message = ChatMessage::text(
                            MessageId::new(format!("soak_{tag}")),
                            format!("assistant {tag}"),
                        );
                        (1, plane.send_chat_message(channel, message).await.is_ok())
                    }
                    _ => {
                        let bytes = vec![b'x'; 512 + rng.below(4096) as usize];
                        let name = format!("soak-{tag}.txt");
                        (2, control.upload(channel, &name, "text/plain", bytes).await.is_ok())
                    }
                };
                if kind.1 {
                    counters[kind.0].fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                counters[3].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut samples: Vec<(f64, u64)> = Vec::new();
    while started.elapsed() < total {
        tokio::time::sleep(Duration::from_millis(500)).await;
        samples.push((started.elapsed().as_secs_f64(), rss_of(&pid)));
    }
    for worker in workers {
        worker.await?;
    }
    let (tools, messages, files, n) = (
        counters[0].load(Ordering::Relaxed),
        counters[1].load(Ordering::Relaxed),
        counters[2].load(Ordering::Relaxed),
        counters[3].load(Ordering::Relaxed),
    );
    // Let the outboxes drain, then read the final outbox counters.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = plane.outbox_stats().await;
    let still_pending = stats.pending;
    plane.close().await;
    listener.abort();
    let _ = stop_connector(&mut child);
    let _ = std::fs::remove_dir_all(&dir);
    let mean = |from: f64, to: f64| {
        let picked: Vec<u64> =
            samples.iter().filter(|(t, _)| *t >= from && *t <= to).map(|(_, r)| *r).collect();
        if picked.is_empty() { 0 } else { picked.iter().sum::<u64>() / picked.len() as u64 }
    };
    let secs = sizes.soak_seconds as f64;
    let warm = mean(warm_at.as_secs_f64(), warm_at.as_secs_f64() + secs * 0.1);
    let end = mean(secs * 0.9, secs + 1.0);
    let growth = if warm > 0 { (end as f64 / warm as f64 - 1.0) * 100.0 } else { 0.0 };
    let protocol_errors = errors.load(Ordering::Relaxed);
    // A 10-second --quick soak is mostly warm-up: memory is judged only in the full run.
    let memory_ok = sizes.soak_seconds < 60 || (growth <= 10.0 && warm > 0);
    let pass = protocol_errors == 0 && still_pending == 0 && memory_ok;
    Ok(json!({
        "channels": channels.len(),
        "seconds": sizes.soak_seconds,
        "operations": n,
        "tool_calls": tools,
        "messages_to_connector": messages,
        "messages_from_connector": inbound.load(Ordering::Relaxed),
        "uploads": files,
        "protocol_errors": protocol_errors,
        "outbox_pending_at_end": still_pending,
        "rss_warm_kib": warm / 1024,
        "rss_end_kib": end / 1024,
        "rss_growth_pct": (growth * 10.0).round() / 10.0,
        "memory_judged": sizes.soak_seconds >= 60,
        "rss_growth_bytes_per_operation": if n > 0 { (end.saturating_sub(warm) as f64 / n as f64).round() } else { 0.0 },
        "mix_tools_messages_files": mix,
        "inbound_rate": sizes.inbound_rate,
        "rss_samples_kib": samples.iter().map(|(t, r)| json!([(t * 10.0).round() / 10.0, r / 1024])).collect::<Vec<_>>(),
        "pass": pass,
    }))
}
