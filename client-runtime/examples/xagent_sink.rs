//! An xAgent-side process that receives IM v2 messages and records every accepted one
//! durably, for the chaos harness (`cargo xtask chaos`): it can be killed with `kill -9` and
//! restarted on the same state directory.
//!
//! ```text
//! cargo run --release -p xagent-client-runtime --example xagent_sink -- \
//!     --url http://127.0.0.1:8080 --state-dir /tmp/sink [--channels 100] [--api-key KEY]
//! ```
//!
//! - First start: opens and signs in `--channels` channels on the echo Connector and writes
//!   their ids to `<state-dir>/channels.txt` (fsync'ed). Later starts reopen those ids.
//! - Every inbound `chat.message` not in `<state-dir>/accepted.log` gets a line
//!   `<message_id> <created_at> <received_at>` appended and fsync'ed **before** it is accepted
//!   (acked), in groups (one fsync for every message waiting at that moment). The log is the
//!   sink's idempotency authority across its own restarts: a message already in it is acked
//!   again without a second line, so "accepted twice" means two lines with one id.
//!
//! The data plane's own receiver idempotency (in memory) covers duplicates within one process
//! lifetime; this log covers the restarts.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;

use xagent_client_runtime::{BaseUrl, ClientConfig, ClientEvent, DataPlane, InboundMessage};
use xagent_protocol_types::{AuthInput, AuthStart, AuthStartAck, ConnectorChannelId, Secret};

struct Args {
    url: String,
    state_dir: PathBuf,
    channels: usize,
    api_key: String,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        url: String::new(),
        state_dir: PathBuf::from("sink-state"),
        channels: 100,
        api_key: "sk-bench-loopback-7d2f91c4".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => args.url = value()?,
            "--state-dir" => args.state_dir = PathBuf::from(value()?),
            "--channels" => args.channels = value()?.parse().map_err(|_| "--channels: a number")?,
            "--api-key" => args.api_key = value()?,
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    if args.url.is_empty() {
        return Err("--url is required".into());
    }
    Ok(args)
}

fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Ids already accepted, from the log (a torn last line, never acked, is ignored).
fn load_accepted(path: &std::path::Path) -> HashSet<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split_inclusive('\n')
        .filter(|line| line.ends_with('\n') && line.split(' ').count() == 3)
        .filter_map(|line| line.split(' ').next().map(str::to_string))
        .collect()
}

fn write_synced(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    std::fs::create_dir_all(&args.state_dir)?;
    let log_path = args.state_dir.join("accepted.log");
    let mut accepted = load_accepted(&log_path);
    let mut log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;

    let config =
        ClientConfig::new(BaseUrl::parse(&args.url)?, "im.echo", vec!["xagent.im.v2".into()])
            .with_api_key(Secret::new(args.api_key.clone()));
    let (plane, mut events) = DataPlane::start(config);
    plane.connected().await?;

    let channels_path = args.state_dir.join("channels.txt");
    match std::fs::read_to_string(&channels_path) {
        Ok(text) => {
            for id in text.lines().filter(|l| !l.is_empty()) {
                let channel = ConnectorChannelId::new(id);
                plane.remember_channel(channel.clone()).await;
                let opened = plane.open_channel(Some(&channel)).await?;
                if opened.connector_channel_id != channel {
                    eprintln!("channel {id} came back as {}", opened.connector_channel_id);
                }
            }
        }
        Err(_) => {
            let mut ids = String::new();
            for _ in 0..args.channels {
                let opened = plane.open_channel(None).await?;
                let channel = opened.connector_channel_id.clone();
                let _: AuthStartAck = plane
                    .request(
                        Some(&channel),
                        AuthStart::new("echo_token")
                            .with_input(AuthInput::default().with("token", "sink-token")),
                    )
                    .await?;
                plane.remember_channel(channel.clone()).await;
                ids.push_str(channel.as_str());
                ids.push('\n');
            }
            let staging = args.state_dir.join("channels.txt.new");
            write_synced(&staging, &ids)?;
            std::fs::rename(&staging, &channels_path)?;
        }
    }
    println!("ready");

    while let Some(event) = events.recv().await {
        let mut batch: Vec<InboundMessage> = Vec::new();
        if let ClientEvent::ChatMessage(inbound) = event {
            batch.push(inbound);
        }
        while let Ok(event) = events.try_recv() {
            if let ClientEvent::ChatMessage(inbound) = event {
                batch.push(inbound);
            }
        }
        if batch.is_empty() {
            continue;
        }
        let received_at = now_millis();
        let mut lines = String::new();
        let mut fresh = HashSet::new();
        for inbound in &batch {
            let id = inbound.message.message_id.as_str().to_string();
            if !accepted.contains(&id) && fresh.insert(id.clone()) {
                let created = inbound.message.created_at.unwrap_or(0);
                lines.push_str(&format!("{id} {created} {received_at}\n"));
            }
        }
        if !lines.is_empty() {
            log.write_all(lines.as_bytes())?;
            log.sync_data()?;
        }
        accepted.extend(fresh);
        for inbound in batch {
            inbound.accept();
        }
    }
    Ok(())
}
