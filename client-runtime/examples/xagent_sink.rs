//! An xAgent-side process that receives IM v2 messages on the runtime's own durable store,
//! for the chaos harness (`cargo xtask chaos`): it can be killed with `kill -9` and restarted
//! on the same state directory.
//!
//! ```text
//! cargo run --release -p xagent-client-runtime --example xagent_sink -- \
//!     --url http://127.0.0.1:8080 --state-dir /tmp/sink [--channels 100] [--api-key KEY]
//! ```
//!
//! - The runtime keeps its state in `<state-dir>/xagent.sqlite3` ([`SqliteXagentStore`]): the
//!   remembered channels (reopened by the runtime itself after a restart) and the receiver
//!   idempotency set, which is the only authority on "seen before": a redelivered message
//!   the runtime completed is answered `duplicate` and never reaches this program again.
//! - First start: opens and signs in `--channels` channels on the echo Connector and writes
//!   their ids to `<state-dir>/channels.txt` for the harness.
//! - The effect of a message is a line `<message_id> <created_at> <received_at>` in
//!   `<state-dir>/accepted.log`, appended and fsync'ed before the message is accepted (the
//!   runtime then records its completion durably, then acks). A kill between the two leaves a
//!   line whose message the runtime never completed: on start the log is reconciled with the
//!   store (lines of messages not completed are dropped, the Connector redelivers them), so
//!   the log holds exactly the completed messages, each once.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use xagent_client_runtime::store::{SqliteXagentStore, XagentStore};
use xagent_client_runtime::{BaseUrl, ClientConfig, ClientEvent, DataPlane, InboundMessage};
use xagent_protocol_types::{AuthInput, AuthStart, AuthStartAck, Secret};

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

/// Keeps only the log lines of messages the runtime completed (a torn last line, or a line
/// written just before a kill whose message was never completed, is dropped: the Connector
/// redelivers that message).
fn reconcile(path: &std::path::Path, completed: &HashSet<String>) -> std::io::Result<()> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let kept: String = text
        .split_inclusive('\n')
        .filter(|line| line.ends_with('\n') && line.split(' ').count() == 3)
        .filter(|line| line.split(' ').next().is_some_and(|id| completed.contains(id)))
        .collect();
    if kept.len() == text.len() {
        return Ok(());
    }
    let staging = path.with_extension("log.new");
    write_synced(&staging, &kept)?;
    std::fs::rename(&staging, path)
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
    let store = SqliteXagentStore::open(&args.state_dir)?;
    let completed: HashSet<String> =
        store.completed_ids()?.into_iter().map(|(_, id)| id.as_str().to_owned()).collect();
    let log_path = args.state_dir.join("accepted.log");
    reconcile(&log_path, &completed)?;
    let mut log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
    let first_start = store.load_channels().await?.is_empty();

    let config =
        ClientConfig::new(BaseUrl::parse(&args.url)?, "im.echo", vec!["xagent.im.v2".into()])
            .with_api_key(Secret::new(args.api_key.clone()))
            .with_store(Arc::new(store));
    // The runtime reopens the remembered channels by itself.
    let (plane, mut events) = DataPlane::connect(config).await?;
    plane.connected().await?;

    if first_start {
        let mut ids = String::new();
        for _ in 0..args.channels {
            let opened = plane.open_channel_for("sink", None).await?;
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
        std::fs::rename(&staging, args.state_dir.join("channels.txt"))?;
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
        // Every message here is new to the runtime's store: record the effect, then accept.
        let received_at = now_millis();
        let mut lines = String::new();
        for inbound in &batch {
            let id = inbound.message.message_id.as_str();
            let created = inbound.message.created_at.unwrap_or(0);
            lines.push_str(&format!("{id} {created} {received_at}\n"));
        }
        log.write_all(lines.as_bytes())?;
        log.sync_data()?;
        for inbound in batch {
            inbound.accept();
        }
    }
    Ok(())
}
