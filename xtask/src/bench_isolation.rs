//! `cargo xtask bench-isolation`: cross-channel isolation of deliveries xAgent -> target. One
//! xAgent socket carries `--channels` signed-in channels of the echo Connector (default 100);
//! every channel keeps one `chat.message` in flight (the next is sent when its
//! `chat.message.ack` arrives). Two phases in the same run:
//!
//! 1. all channels fast (the echo target accepts at once);
//! 2. channel 0's target takes `--delay-ms` (default 1,000 ms) per delivery, the others fast.
//!
//! The figure is the acks per second of the other channels (99 by default) in phase 2 over
//! phase 1 (`ratio_fast_channels`, target >= 0.9): with per-channel ordering and cross-channel
//! concurrency, one slow target channel never delays another. Each phase runs as two halves in
//! the order 1, 2, 2, 1, so a load that rises or falls steadily on a shared machine during the
//! run weighs on both phases alike instead of on the second one only.
//!
//! `--quick` runs 2 s phases over 20 channels; the full run 5 s phases over 100.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::json;
use xagent_protocol_types::{ChatMessage, ConnectorChannelId, Packet, PacketBody};

use crate::bench_support::{
    API_KEY, Flags, PacketSocket, ServerSide, machine, print_table, warn_if_debug,
};

/// Runs the benchmark with the given flags.
pub fn run(args: &[String]) -> Result<std::process::ExitCode> {
    let flags = Flags::parse(args);
    flags.only(&["--channels", "--seconds", "--delay-ms", "--synchronous"])?;
    warn_if_debug();
    let synchronous = crate::bench_durable::synchronous_flag(&flags)?;
    let channels: usize = flags.value("--channels")?.unwrap_or(if flags.quick { 20 } else { 100 });
    if channels < 2 {
        bail!("--channels: at least 2 (one slow, the others fast)");
    }
    let seconds: f64 = flags.value("--seconds")?.unwrap_or(if flags.quick { 2.0 } else { 5.0 });
    let delay = Duration::from_millis(flags.value("--delay-ms")?.unwrap_or(1_000));
    let phase = Duration::from_secs_f64(seconds);

    let servers = ServerSide::start("bench-isolation", synchronous)?;
    let connector = &servers.connector;
    let client = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut driver = client.block_on(Driver::connect(&connector.ws_url(), channels))?;

    let half = phase / 2;
    let slow = ConnectorChannelId::new(driver.channels[0].clone());
    let fast_first = client.block_on(driver.phase(half))?;
    connector.echo.set_delivery_delay(&slow, Some(delay));
    let slow_first = client.block_on(driver.phase(half))?;
    let slow_second = client.block_on(driver.phase(half))?;
    connector.echo.set_delivery_delay(&slow, None);
    let fast_second = client.block_on(driver.phase(half))?;
    let all_fast = fast_first.join(fast_second);
    let one_slow = slow_first.join(slow_second);
    client.block_on(driver.drain())?;
    servers.stop();

    let fast = |p: &Phase| p.acks[1..].iter().sum::<u64>() as f64 / p.seconds;
    let ratio = {
        let base = fast(&all_fast);
        if base > 0.0 { (fast(&one_slow) / base * 1000.0).round() / 1000.0 } else { 0.0 }
    };
    let result = json!({
        "bench": "isolation",
        "quick": flags.quick,
        "channels": channels,
        "phase_seconds": seconds,
        "slow_delay_ms": delay.as_millis() as u64,
        "synchronous": synchronous.as_str(),
        "all_fast": {
            "fast_channels_acks_per_s": fast(&all_fast).round(),
            "channel_0_acks": all_fast.acks[0],
        },
        "one_slow": {
            "fast_channels_acks_per_s": fast(&one_slow).round(),
            "channel_0_acks": one_slow.acks[0],
        },
        "ratio_fast_channels": ratio,
        "target_ratio": 0.9,
        "rejected": all_fast.rejected + one_slow.rejected,
        "machine": machine(),
    });
    if flags.json {
        println!("{result}");
    } else {
        print_table(
            &["phase", "acks/s of the fast channels", "acks of channel 0"],
            &[
                vec![
                    "all channels fast".into(),
                    format!("{}", result["all_fast"]["fast_channels_acks_per_s"]),
                    format!("{}", result["all_fast"]["channel_0_acks"]),
                ],
                vec![
                    format!("channel 0 takes {} ms per delivery", delay.as_millis()),
                    format!("{}", result["one_slow"]["fast_channels_acks_per_s"]),
                    format!("{}", result["one_slow"]["channel_0_acks"]),
                ],
            ],
        );
        println!(
            "\n{} fast channels keep {} of their throughput (target >= 0.9)",
            channels - 1,
            result["ratio_fast_channels"]
        );
    }
    if all_fast.rejected + one_slow.rejected > 0 {
        bail!("{} messages were not accepted", all_fast.rejected + one_slow.rejected);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

struct Phase {
    acks: Vec<u64>,
    seconds: f64,
    rejected: u64,
}

impl Phase {
    /// Two runs of the same phase as one.
    fn join(self, other: Phase) -> Phase {
        let acks = self.acks.iter().zip(&other.acks).map(|(a, b)| a + b).collect();
        Phase {
            acks,
            seconds: self.seconds + other.seconds,
            rejected: self.rejected + other.rejected,
        }
    }
}

/// One xAgent socket with every channel signed in; one message in flight per channel.
struct Driver {
    socket: PacketSocket,
    channels: Vec<String>,
    index: HashMap<String, usize>,
    in_flight: Vec<bool>,
    next: u64,
}

impl Driver {
    async fn connect(url: &str, channels: usize) -> Result<Self> {
        let mut socket = PacketSocket::connect(url, Some(API_KEY)).await?;
        let mut ids = Vec::with_capacity(channels);
        for c in 0..channels {
            ids.push(socket.echo_session(c == 0, None).await?);
        }
        let index = ids.iter().enumerate().map(|(i, c)| (c.clone(), i)).collect();
        Ok(Self { socket, channels: ids, index, in_flight: vec![false; channels], next: 0 })
    }

    async fn send(&mut self, c: usize) -> Result<()> {
        self.next += 1;
        let n = self.next;
        let message = ChatMessage::text(format!("msg_iso_{n}"), "hello from the benchmark")
            .created_at(1_790_000_000_000);
        let packet =
            Packet::with_payload(format!("pkt_iso_{n}"), message).channel(self.channels[c].clone());
        self.socket.send_text(packet.to_json()?).await?;
        self.in_flight[c] = true;
        Ok(())
    }

    /// Waits for one ack; returns its channel and whether it was `accepted`.
    async fn ack(&mut self, within: Duration) -> Result<Option<(usize, bool)>> {
        let Some(text) = self.socket.recv_text(within).await? else {
            bail!("the Connector closed the socket");
        };
        let packet = Packet::decode_str(&text)?;
        if packet.type_str() != "chat.message.ack" {
            return Ok(None);
        }
        let Some(c) = packet.connector_channel_id.as_ref().and_then(|c| self.index.get(c.as_str()))
        else {
            return Ok(None);
        };
        let accepted = matches!(&packet.body,
            PacketBody::ChatMessageAck(ack) if ack.status.as_str() == "accepted");
        Ok(Some((*c, accepted)))
    }

    /// Keeps one message in flight on every channel for `phase` (after 300 ms of warm-up) and
    /// counts the acks per channel.
    async fn phase(&mut self, phase: Duration) -> Result<Phase> {
        for c in 0..self.channels.len() {
            if !self.in_flight[c] {
                self.send(c).await?;
            }
        }
        let warmup = Duration::from_millis(300);
        let started = Instant::now();
        let mut acks = vec![0u64; self.channels.len()];
        let mut rejected = 0;
        let mut measuring: Option<Instant> = None;
        loop {
            let now = Instant::now();
            match measuring {
                None if now - started >= warmup => measuring = Some(now),
                Some(since) if now - since >= phase => {
                    return Ok(Phase { acks, seconds: (now - since).as_secs_f64(), rejected });
                }
                _ => {}
            }
            let Some((c, accepted)) = self.ack(Duration::from_secs(30)).await? else { continue };
            self.in_flight[c] = false;
            if measuring.is_some() {
                acks[c] += 1;
                rejected += u64::from(!accepted);
            }
            self.send(c).await?;
        }
    }

    /// Collects the acks still outstanding, so the Connector is idle before it stops.
    async fn drain(&mut self) -> Result<()> {
        while self.in_flight.iter().any(|f| *f) {
            if let Some((c, _)) = self.ack(Duration::from_secs(30)).await? {
                self.in_flight[c] = false;
            }
        }
        Ok(())
    }
}
