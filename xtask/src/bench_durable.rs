//! `cargo xtask bench-durable`: IM v2 delivery Connector -> xAgent through the SQLite-backed
//! outbox, acked by `client-runtime`, in messages per second, against raw SQLite transactions
//! with the same durability settings (WAL, `synchronous` as `--synchronous full|normal`,
//! default `full` like the runtime; the outbox's row shape) in the same run.
//!
//! - `raw_commits`: single-row INSERT transactions per second, one after the other (what the
//!   disk commits for one writer): `ratio_vs_sqlite` is the outbox's messages per second over
//!   this (target >= 1.0, reachable only because the runtime commits many messages' writes
//!   together);
//! - `raw_txn`: per message one INSERT transaction and one DELETE transaction (the minimum a
//!   durable outbox needs: take responsibility, then forget after the ack);
//! - `raw_three`: INSERT, UPDATE, DELETE transactions per message: the writes the outbox
//!   actually makes (take responsibility, count the attempt when sending, forget after the ack);
//! - `raw_batched`: the same rows, 64 per transaction (what batching would buy);
//! - `outbox`: the echo Connector's `send_message` for every message, spread over `--channels`
//!   signed-in channels, one producer task per channel that waits for each `send_message`
//!   (the message is durable when it returns) before the next, as a bridge reading a target
//!   system's cursor would; the outbox keeps up to `--window` messages per channel in flight
//!   (default: the runtime's default, `RuntimeConfig::outbox_window`; 1 waits for each ack
//!   before the next message); a `client-runtime` data plane (in-memory state, on the same
//!   machine) accepts each one; timed from the first `send_message` until every message is
//!   acked and deleted on the Connector side.
//!
//! `--postgres` runs the outbox on `PostgresStorage` instead (testkit's PostgreSQL server, or
//! the one `XAGENT_TEST_DATABASE_URL` names) and compares it with raw single-row PostgreSQL
//! commits on the same server through the same driver and pool settings, measured before and
//! after the outbox run (`ratio_vs_postgres`); the SQLite-only rows are left out.
//!
//! `--quick` sends 2,000 messages over 16 channels; the full run 10,000 over 64.
//! `--messages N`, `--channels N`, `--window N` change the workload; `--max-wait-us N` the
//! group-commit writer's longest wait for company (`GroupCommitConfig::max_wait`, default
//! 1,000 µs). The JSON also gives how long the producers took to queue everything
//! (`enqueue_per_s`) and the transactions and submissions the writer committed per message.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rusqlite::{Connection, params};
use serde_json::json;
use xagent_client_runtime::{BaseUrl, ClientConfig, ClientEvent, DataPlane};
use xagent_protocol_types::{
    AuthInput, AuthStart, AuthStartAck, ChatMessage, ConnectorChannelId, MessageId, Secret,
};
use xagent_server_runtime::storage::{SqliteOptions, SqliteStorage, Synchronous};
use xagent_testkit::ECHO_FLOW;

use crate::bench_support::{
    API_KEY, BenchStorage, EchoConnector, Flags, bench_database, machine, print_table,
    raw_postgres_commits, temp_dir, warn_if_debug,
};

/// Runs the benchmark with the given flags.
pub fn run(args: &[String]) -> Result<std::process::ExitCode> {
    let mut flags = Flags::parse(args);
    if flags.switch("--postgres") {
        return run_postgres(&flags);
    }
    flags.only(&["--messages", "--channels", "--synchronous", "--window", "--max-wait-us"])?;
    warn_if_debug();
    let synchronous = synchronous_flag(&flags)?;
    let messages: u64 =
        flags.value("--messages")?.unwrap_or(if flags.quick { 2_000 } else { 10_000 });
    let channels: usize = flags.value("--channels")?.unwrap_or(if flags.quick { 16 } else { 64 });
    let window: usize = flags
        .value("--window")?
        .unwrap_or(xagent_server_runtime::RuntimeConfig::default().outbox_window);
    let mut group_commit = xagent_server_runtime::storage::GroupCommitConfig::default();
    if let Some(us) = flags.value::<u64>("--max-wait-us")? {
        group_commit.max_wait = Duration::from_micros(us);
    }
    let dir = temp_dir("bench-durable")?;

    // Raw rows: fewer under FULL, where every commit waits for the disk.
    let raw_rows = if synchronous == Synchronous::Full { messages.min(2_000) } else { messages };
    let period = Duration::from_secs(if flags.quick { 1 } else { 3 });
    let cpu_before_commits = process_cpu_seconds();
    let started_commits = Instant::now();
    let commits = raw_commits(&dir.join("commits.sqlite3"), period, synchronous)?;
    let commits_cpu = cpu_since(cpu_before_commits)
        .map(|cpu| cpu / (commits * started_commits.elapsed().as_secs_f64()).max(1.0));
    let raw = raw_sqlite(&dir.join("raw.sqlite3"), raw_rows, 1, false, synchronous)?;
    let batched = raw_sqlite(&dir.join("batched.sqlite3"), raw_rows, 64, false, synchronous)?;
    let three = raw_sqlite(&dir.join("three.sqlite3"), raw_rows, 1, true, synchronous)?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let storage = SqliteStorage::open_with(
        dir.join("connector"),
        SqliteOptions { synchronous, group_commit },
    )
    .context("opening the storage")?;
    let outbox = runtime.block_on(outbox_delivery(
        &dir.join("connector"),
        messages,
        channels,
        window,
        BenchStorage::Sqlite(storage),
    ))?;
    let outbox_cpu = outbox.cpu_seconds.map(|cpu| cpu / messages as f64);
    // Raw again after the system run, so drift on a shared machine shows.
    let raw_after = raw_sqlite(&dir.join("raw2.sqlite3"), raw_rows, 1, false, synchronous)?;
    let commits_after = raw_commits(&dir.join("commits2.sqlite3"), period, synchronous)?;
    drop(runtime);
    let _ = std::fs::remove_dir_all(&dir);

    let raw_mean = (raw + raw_after) / 2.0;
    let commits_mean = (commits + commits_after) / 2.0;
    let ratio = |a: f64, b: f64| if b > 0.0 { (a / b * 1000.0).round() / 1000.0 } else { 0.0 };
    let result = json!({
        "bench": "durable",
        "quick": flags.quick,
        "messages": messages,
        "channels": channels,
        "window": window,
        "group_commit_max_wait_us": group_commit.max_wait.as_micros() as u64,
        "synchronous": synchronous.as_str(),
        "durability": match synchronous {
            Synchronous::Full => "WAL, synchronous=FULL (every commit synced: survives an OS crash or power loss)",
            Synchronous::Normal => "WAL, synchronous=NORMAL (survives a killed process; an OS crash may lose the last commits)",
        },
        "sqlite_commits_per_s": commits_mean.round(),
        "sqlite_commits_before_per_s": commits.round(),
        "sqlite_commits_after_per_s": commits_after.round(),
        "raw_txn_per_s": raw_mean.round(),
        "raw_txn_before_per_s": raw.round(),
        "raw_txn_after_per_s": raw_after.round(),
        "raw_batched_64_per_s": batched.round(),
        "raw_three_txn_per_s": three.round(),
        "outbox_per_s": outbox.rate.round(),
        "enqueue_per_s": outbox.enqueue_rate.round(),
        "cpu_us_per_message": outbox_cpu.map(|s| (s * 1e7).round() / 10.0),
        "cpu_us_per_raw_commit": commits_cpu.map(|s| (s * 1e7).round() / 10.0),
        "transactions_per_message": ratio(outbox.transactions as f64, messages as f64),
        "submissions_per_transaction": ratio(outbox.jobs as f64, outbox.transactions as f64),
        "ratio_vs_sqlite": ratio(outbox.rate, commits_mean),
        "target_ratio_vs_sqlite": 1.0,
        "ratio_vs_raw": ratio(outbox.rate, raw_mean),
        "batching_gain": ratio(batched, raw_mean),
        "machine": machine(),
    });
    if flags.json {
        println!("{result}");
    } else {
        print_table(
            &["path", "messages/s"],
            &[
                vec![
                    "raw SQLite: single-row INSERT commits".into(),
                    format!("{}", result["sqlite_commits_per_s"]),
                ],
                vec![
                    "raw SQLite: INSERT txn + DELETE txn per message".into(),
                    format!("{}", result["raw_txn_per_s"]),
                ],
                vec![
                    "raw SQLite: INSERT + UPDATE + DELETE txns (the outbox's writes)".into(),
                    format!("{}", result["raw_three_txn_per_s"]),
                ],
                vec![
                    "raw SQLite: 64 rows per txn".into(),
                    format!("{}", result["raw_batched_64_per_s"]),
                ],
                vec![
                    format!("outbox -> xAgent ack ({channels} channels, window {window})"),
                    format!("{}", result["outbox_per_s"]),
                ],
            ],
        );
        println!(
            "\nsynchronous={}: ratio outbox / single-row commits: {} (target >= 1.0); outbox / INSERT+DELETE txns: {}; batching 64 per txn buys x{}",
            synchronous.as_str(),
            result["ratio_vs_sqlite"],
            result["ratio_vs_raw"],
            result["batching_gain"]
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// `bench-durable --postgres`: the outbox on PostgreSQL against raw single-row PostgreSQL
/// commits on the same server, before and after it.
fn run_postgres(flags: &Flags) -> Result<std::process::ExitCode> {
    flags.only(&["--messages", "--channels", "--window", "--max-wait-us"])?;
    warn_if_debug();
    let messages: u64 =
        flags.value("--messages")?.unwrap_or(if flags.quick { 2_000 } else { 10_000 });
    let channels: usize = flags.value("--channels")?.unwrap_or(if flags.quick { 16 } else { 64 });
    let window: usize = flags
        .value("--window")?
        .unwrap_or(xagent_server_runtime::RuntimeConfig::default().outbox_window);
    let mut group_commit = xagent_server_runtime::storage::GroupCommitConfig::default();
    if let Some(us) = flags.value::<u64>("--max-wait-us")? {
        group_commit.max_wait = Duration::from_micros(us);
    }
    let period = Duration::from_secs(if flags.quick { 1 } else { 3 });
    let dir = temp_dir("bench-durable-pg")?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (commits, outbox, commits_after) = runtime.block_on(async {
        let raw_url = bench_database().await?;
        let commits = raw_postgres_commits(&raw_url, period).await?;
        let url = bench_database().await?;
        let storage = BenchStorage::postgres(&url, group_commit).await?;
        let outbox =
            outbox_delivery(&dir.join("connector"), messages, channels, window, storage).await?;
        let commits_after = raw_postgres_commits(&raw_url, period).await?;
        Ok::<_, anyhow::Error>((commits, outbox, commits_after))
    })?;
    drop(runtime);
    let _ = std::fs::remove_dir_all(&dir);
    let commits_mean = (commits + commits_after) / 2.0;
    let ratio = |a: f64, b: f64| if b > 0.0 { (a / b * 1000.0).round() / 1000.0 } else { 0.0 };
    let result = json!({
        "bench": "durable",
        "backend": "postgres",
        "quick": flags.quick,
        "messages": messages,
        "channels": channels,
        "window": window,
        "group_commit_max_wait_us": group_commit.max_wait.as_micros() as u64,
        "postgres_commits_per_s": commits_mean.round(),
        "postgres_commits_before_per_s": commits.round(),
        "postgres_commits_after_per_s": commits_after.round(),
        "outbox_per_s": outbox.rate.round(),
        "enqueue_per_s": outbox.enqueue_rate.round(),
        "cpu_us_per_message": outbox.cpu_seconds.map(|s| (s / messages as f64 * 1e7).round() / 10.0),
        "transactions_per_message": ratio(outbox.transactions as f64, messages as f64),
        "submissions_per_transaction": ratio(outbox.jobs as f64, outbox.transactions as f64),
        "ratio_vs_postgres": ratio(outbox.rate, commits_mean),
        "target_ratio_vs_postgres": 1.0,
        "machine": machine(),
    });
    if flags.json {
        println!("{result}");
    } else {
        print_table(
            &["path", "messages/s"],
            &[
                vec![
                    "raw PostgreSQL: single-row INSERT commits, one connection".into(),
                    format!("{}", result["postgres_commits_per_s"]),
                ],
                vec![
                    format!(
                        "outbox on PostgreSQL -> xAgent ack ({channels} channels, window {window})"
                    ),
                    format!("{}", result["outbox_per_s"]),
                ],
            ],
        );
        println!(
            "\nratio outbox / single-row PostgreSQL commits: {} (target >= 1.0); {} transactions per message",
            result["ratio_vs_postgres"], result["transactions_per_message"]
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// CPU time this process has used so far, in seconds; `None` where `/proc` is not available.
fn process_cpu_seconds() -> Option<f64> {
    std::fs::metadata("/proc/self/stat").ok()?;
    Some(crate::bench_support::cpu_ticks("self") as f64 / 100.0)
}

fn cpu_since(start: Option<f64>) -> Option<f64> {
    Some(process_cpu_seconds()? - start?)
}

/// `--synchronous full|normal` (default `full`).
pub fn synchronous_flag(flags: &Flags) -> Result<Synchronous> {
    match flags.value::<String>("--synchronous")? {
        None => Ok(Synchronous::Full),
        Some(text) => Synchronous::parse(&text)
            .ok_or_else(|| anyhow::anyhow!("--synchronous: full or normal, not {text:?}")),
    }
}

fn open_raw(path: &std::path::Path, synchronous: Synchronous) -> Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", synchronous.as_str())?;
    Ok(conn)
}

/// Single-row INSERT transactions per second for `window`, one writer, rows shaped like the
/// runtime's durable records, with the given durability: the rate the disk commits at.
pub fn raw_commits(
    path: &std::path::Path,
    window: Duration,
    synchronous: Synchronous,
) -> Result<f64> {
    let conn = open_raw(path, synchronous)?;
    conn.execute_batch(
        "CREATE TABLE tool_calls (
          channel TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, result TEXT,
          error_code TEXT, error_message TEXT, completed_at INTEGER NOT NULL,
          PRIMARY KEY (channel, key));",
    )?;
    let result = r#"{"status":"sent","message_id":"echo_1"}"#;
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < window {
        conn.prepare_cached(
            "INSERT INTO tool_calls (channel, key, fingerprint, result, completed_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![
            "cch_bench",
            format!("req_{n}"),
            "0123456789abcdef0123456789abcdef",
            result,
            1_790_000_000_000i64
        ])?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Rows like the outbox's `im_pending`, inserted then deleted, `batch` rows per transaction.
pub fn raw_sqlite(
    path: &std::path::Path,
    messages: u64,
    batch: u64,
    update: bool,
    synchronous: Synchronous,
) -> Result<f64> {
    let conn = open_raw(path, synchronous)?;
    conn.execute_batch(
        "CREATE TABLE im_pending (
          channel TEXT NOT NULL, message_id TEXT NOT NULL, seq INTEGER NOT NULL, payload TEXT NOT NULL,
          attempts INTEGER NOT NULL, first_responsibility_at INTEGER NOT NULL,
          expires_at INTEGER NOT NULL, next_attempt_at INTEGER NOT NULL, last_error TEXT,
          PRIMARY KEY (channel, message_id));",
    )?;
    let payload = r#"{"message_id":"msg_000000","text":"hello from the benchmark","created_at":1790000000000}"#;
    let started = Instant::now();
    let mut n = 0u64;
    while n < messages {
        let end = (n + batch).min(messages);
        conn.execute_batch("BEGIN")?;
        for i in n..end {
            conn.execute(
                "INSERT INTO im_pending (channel, message_id, seq, payload, attempts,
                   first_responsibility_at, expires_at, next_attempt_at, last_error)
                 VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, ?5, NULL)",
                params![
                    "cch_bench",
                    format!("msg_{i}"),
                    i as i64,
                    payload,
                    1_790_000_000_000i64,
                    1_790_000_600_000i64
                ],
            )?;
        }
        conn.execute_batch("COMMIT")?;
        if update {
            conn.execute_batch("BEGIN")?;
            for i in n..end {
                conn.execute(
                    "UPDATE im_pending SET attempts = attempts + 1 WHERE channel = ?1 AND message_id = ?2",
                    params!["cch_bench", format!("msg_{i}")],
                )?;
            }
            conn.execute_batch("COMMIT")?;
        }
        conn.execute_batch("BEGIN")?;
        for i in n..end {
            conn.execute(
                "DELETE FROM im_pending WHERE channel = ?1 AND message_id = ?2",
                params!["cch_bench", format!("msg_{i}")],
            )?;
        }
        conn.execute_batch("COMMIT")?;
        n = end;
    }
    Ok(messages as f64 / started.elapsed().as_secs_f64())
}

/// Opens and signs in `count` channels through a client-runtime data plane.
pub async fn signed_in_channels(
    plane: &DataPlane,
    count: usize,
) -> Result<Vec<ConnectorChannelId>> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let opened = plane.open_channel(None).await.context("channel.open")?;
        let channel = opened.connector_channel_id.clone();
        let _: AuthStartAck = plane
            .request(
                Some(&channel),
                AuthStart::new(ECHO_FLOW)
                    .with_input(AuthInput::default().with("token", "bench-token")),
            )
            .await
            .context("auth.start")?;
        plane.remember_channel(channel.clone()).await;
        out.push(channel);
    }
    Ok(out)
}

/// The client configuration for the echo Connector at `addr`.
pub fn client_config(addr: std::net::SocketAddr) -> Result<ClientConfig> {
    let base = BaseUrl::parse(&format!("http://{addr}"))?;
    Ok(ClientConfig::new(base, "im.echo", vec!["xagent.im.v2".into()])
        .with_api_key(Secret::new(API_KEY)))
}

async fn outbox_delivery(
    dir: &std::path::Path,
    messages: u64,
    channels: usize,
    window: usize,
    storage: BenchStorage,
) -> Result<OutboxRun> {
    let config = xagent_server_runtime::RuntimeConfig::default().with_outbox_window(window);
    let connector = match storage.clone() {
        BenchStorage::Sqlite(s) => EchoConnector::start_configured(dir, s, config).await?,
        BenchStorage::Postgres(s) => EchoConnector::start_configured(dir, *s, config).await?,
    };
    let (plane, mut events) = DataPlane::connect(client_config(connector.addr)?).await?;
    plane.connected().await?;
    let ids = signed_in_channels(&plane, channels).await?;
    let accepted = Arc::new(AtomicU64::new(0));
    let counter = accepted.clone();
    let acceptor = tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let ClientEvent::ChatMessage(inbound) = event {
                inbound.accept();
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let handle = connector.server.handle();
    let before = storage.group_commit_stats();
    let cpu_before = process_cpu_seconds();
    let started = Instant::now();
    let mut senders = Vec::new();
    for (c, channel) in ids.iter().enumerate() {
        let handle = handle.clone();
        let channel = channel.clone();
        let share = messages / channels as u64 + u64::from((c as u64) < messages % channels as u64);
        senders.push(tokio::spawn(async move {
            for i in 0..share {
                let message = ChatMessage::text(
                    MessageId::new(format!("msg_{c}_{i}")),
                    "hello from the benchmark",
                )
                .created_at(handle.now_millis());
                handle.send_message(&channel, message).await?;
            }
            Ok::<_, xagent_server_runtime::HandleError>(())
        }));
    }
    for sender in senders {
        sender.await??;
    }
    let enqueued = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let pending: usize = ids.iter().map(|c| handle.pending_messages(c).len()).sum();
        if pending == 0 && accepted.load(Ordering::Relaxed) >= messages {
            break;
        }
        if Instant::now() > deadline {
            bail!("{pending} messages still pending after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    let cpu_seconds = cpu_since(cpu_before);
    let after = storage.group_commit_stats();
    let got = accepted.load(Ordering::Relaxed);
    if got != messages {
        bail!("xAgent accepted {got} messages, expected {messages}");
    }
    plane.close().await;
    acceptor.abort();
    connector.stop().await;
    Ok(OutboxRun {
        rate,
        enqueue_rate: messages as f64 / enqueued.as_secs_f64(),
        transactions: after.transactions - before.transactions,
        jobs: after.jobs - before.jobs,
        cpu_seconds,
    })
}

/// What the outbox run measured.
struct OutboxRun {
    /// Messages per second, first `send_message` to last ack.
    rate: f64,
    /// Messages per second until every `send_message` had returned.
    enqueue_rate: f64,
    /// Group-commit transactions during the run.
    transactions: u64,
    /// Submissions they carried.
    jobs: u64,
    /// CPU time of the whole process (Connector, xAgent client, this driver) while timed.
    cpu_seconds: Option<f64>,
}
