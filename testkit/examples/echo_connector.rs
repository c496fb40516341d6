//! The echo IM v2 Connector as a process, for the chaos harness (`cargo xtask chaos`) and the
//! scale benchmark: it can be killed with `kill -9` and restarted on the same state directory.
//!
//! ```text
//! cargo run --release -p xagent-testkit --example echo_connector -- \
//!     --state-dir /tmp/echo --port 8080 [--api-key KEY] [--per-channel N] [--rate R] [--loop] \
//!     [--max-channels N]
//! ```
//!
//! `--max-channels N` raises the runtime's channel limits (per socket and in total; defaults
//! 4,096 and 16,384) to N, for the scale benchmark's 100,000 channels on one socket.
//!
//! Besides serving, it plays the target system's inbound side: every signed-in channel is fed
//! messages `m.<channel>.<i>` (i < `--per-channel`) at `--rate` messages per second in total,
//! through `ConnectorHandle::send_message` (the outbox takes responsibility durably before it
//! returns). After each accepted hand-over the feed appends `<channel> <i>` to
//! `<state-dir>/feed.log`, which is how far the "target system" got; after a restart the feed
//! resumes from there, so a hand-over whose log line was lost is handed over again with the
//! same message id, as a real target system that redelivers would. With `--loop` the feed
//! never ends (i grows forever), for soak runs. Prints `listening <addr>` when ready.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use xagent_protocol_types::{ChatMessage, ConnectorChannelId, MessageId, Secret};
use xagent_server_runtime::{ConnectorHandle, ConnectorServer, RuntimeConfig};
use xagent_testkit::echo_connector;

struct Args {
    state_dir: PathBuf,
    port: u16,
    api_key: String,
    per_channel: u64,
    rate: f64,
    forever: bool,
    max_channels: Option<usize>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        state_dir: PathBuf::from("echo-state"),
        port: 0,
        api_key: "sk-bench-loopback-7d2f91c4".into(),
        per_channel: 0,
        rate: 1000.0,
        forever: false,
        max_channels: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--state-dir" => args.state_dir = PathBuf::from(value()?),
            "--port" => args.port = value()?.parse().map_err(|_| "--port: a number")?,
            "--api-key" => args.api_key = value()?,
            "--per-channel" => {
                args.per_channel = value()?.parse().map_err(|_| "--per-channel: a number")?
            }
            "--rate" => args.rate = value()?.parse().map_err(|_| "--rate: a number")?,
            "--loop" => args.forever = true,
            "--max-channels" => {
                args.max_channels = Some(value()?.parse().map_err(|_| "--max-channels: a number")?)
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let (connector, echo) = echo_connector();
    // The echo target keeps a log of everything it saw (for tests); as a long-running process
    // it forgets it every second, so only the runtime's own memory remains to be measured.
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        loop {
            ticker.tick().await;
            let mut log = echo.log();
            log.delivered.clear();
            log.sent.clear();
            log.activities.clear();
            log.restored.clear();
            log.signed_out.clear();
        }
    });
    let mut config = RuntimeConfig::default();
    if let Some(limit) = args.max_channels {
        config = config.with_channel_limits(limit, limit);
    }
    let server = ConnectorServer::builder(connector)
        .config(config)
        .state_dir(&args.state_dir)?
        .api_key(Secret::new(args.api_key.clone()))
        .build()
        .await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    println!("listening {}", listener.local_addr()?);
    if args.per_channel > 0 || args.forever {
        tokio::spawn(feed(
            server.handle(),
            args.state_dir.join("feed.log"),
            args.per_channel,
            args.rate,
            args.forever,
        ));
    }
    server.serve(listener, std::future::pending::<()>()).await?;
    Ok(())
}

/// How far the feed got per channel, from `feed.log` (a torn last line is ignored).
fn load_cursor(path: &std::path::Path) -> HashMap<ConnectorChannelId, u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut cursor = HashMap::new();
    for line in text.lines() {
        let mut parts = line.split(' ');
        let (Some(channel), Some(Ok(i)), None) =
            (parts.next(), parts.next().map(str::parse::<u64>), parts.next())
        else {
            continue;
        };
        let next = cursor.entry(ConnectorChannelId::new(channel)).or_insert(0);
        *next = (*next).max(i + 1);
    }
    cursor
}

async fn feed(handle: ConnectorHandle, log: PathBuf, per_channel: u64, rate: f64, forever: bool) {
    let mut cursor = load_cursor(&log);
    let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(&log) else {
        eprintln!("cannot open {}", log.display());
        return;
    };
    let tick = Duration::from_millis(10);
    let mut budget = 0.0f64;
    let mut ticker = tokio::time::interval(tick);
    let mut turn = 0usize;
    loop {
        ticker.tick().await;
        budget = (budget + rate * tick.as_secs_f64()).min(rate);
        let channels: Vec<ConnectorChannelId> =
            handle.channels().into_iter().filter(|c| handle.binding(c).is_some()).collect();
        if channels.is_empty() {
            continue;
        }
        let mut lines = String::new();
        let mut idle = 0usize;
        while budget >= 1.0 && idle < channels.len() {
            turn = turn.wrapping_add(1);
            let channel = &channels[turn % channels.len()];
            let next = cursor.get(channel).copied().unwrap_or(0);
            if !forever && next >= per_channel {
                idle += 1;
                continue;
            }
            idle = 0;
            let id = format!("m.{}.{next}", channel.as_str());
            let message = ChatMessage::text(MessageId::new(id), format!("inbound {next}"))
                .created_at(handle.now_millis());
            if handle.send_message(channel, message).await.is_err() {
                idle += 1;
                continue;
            }
            cursor.insert(channel.clone(), next + 1);
            lines.push_str(&format!("{} {next}\n", channel.as_str()));
            budget -= 1.0;
        }
        if !lines.is_empty() && file.write_all(lines.as_bytes()).is_err() {
            eprintln!("cannot write {}", log.display());
        }
    }
}
