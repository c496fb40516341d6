//! Tests of the group commit: batching, durability, savepoint isolation, crash recovery.

use super::*;
use std::sync::mpsc;
use std::time::Instant;
use xagent_profile_im::{
    CompletedRecord, Fingerprint, IdempotencyWrite, OutboxWrite, PendingRecord,
};
use xagent_protocol_types::{ConnectorChannelId, MessageId};

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("xsr-group-{name}-{}", crate::ids::packet_id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn pending(channel: &str, id: u64) -> WriteOp {
    WriteOp::Outbox(OutboxWrite::Save(PendingRecord {
        channel: ConnectorChannelId::new(channel),
        message_id: MessageId::new(format!("m{id}")),
        seq: id,
        payload: "{}".into(),
        attempts: 0,
        first_responsibility_at: 1,
        expires_at: 2,
        next_attempt_at: 1,
        last_error: None,
    }))
}

fn tool_call(key: &str) -> WriteOp {
    WriteOp::ToolCall {
        channel: "cch_1".into(),
        key: key.into(),
        fingerprint: "f".into(),
        result: Some("{\"ok\":true}".into()),
        error: None,
        completed_at: 10,
    }
}

fn count(conn: &Connection, table: &str) -> i64 {
    conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |row| row.get(0)).unwrap()
}

fn writer_at(dir: &Path, synchronous: Synchronous, config: GroupCommitConfig) -> GroupCommit {
    let conn = open_connection(&dir.join("db.sqlite3"), synchronous).unwrap();
    GroupCommit::start(Arc::new(Mutex::new(conn)), config).unwrap()
}

#[test]
fn synchronous_defaults_to_full_and_normal_is_a_setting() {
    let dir = temp_dir("sync");
    for (setting, expected) in [(Synchronous::default(), 2), (Synchronous::Normal, 1)] {
        let conn = open_connection(&dir.join("db.sqlite3"), setting).unwrap();
        let value: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
        assert_eq!(value, expected, "{setting:?}");
        let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
    }
    assert_eq!(Synchronous::parse("Normal"), Some(Synchronous::Normal));
    assert_eq!(Synchronous::parse("off"), None, "only the two documented settings");
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_transactions_and_all_are_durable_when_acknowledged() {
    let dir = temp_dir("share");
    let group = writer_at(&dir, Synchronous::Full, GroupCommitConfig::default());
    // 200 callers submit at once (none waits for another before submitting).
    let tickets: Vec<CommitTicket> =
        (0..200).map(|i| group.submit(vec![tool_call(&format!("k{i}"))])).collect();
    for ticket in tickets {
        ticket.committed().await.unwrap();
    }
    let stats = group.stats();
    assert_eq!(stats.jobs, 200);
    assert!(stats.transactions < 200, "no batching happened: {stats:?}");
    group.shutdown();
    // Reopened from the file: every acknowledged write is there.
    let conn = open_connection(&dir.join("db.sqlite3"), Synchronous::Full).unwrap();
    assert_eq!(count(&conn, "tool_calls"), 200);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn one_writer_at_a_time_never_waits_and_writes_apply_in_order() {
    let dir = temp_dir("order");
    let config = GroupCommitConfig { max_wait: Duration::from_secs(5), ..Default::default() };
    let group = writer_at(&dir, Synchronous::Normal, config);
    let channel = ConnectorChannelId::new("cch_1");
    // Save then delete then save again, each waited for: one transaction each, no lingering
    // (a 5 s wait would make this test take 15 s).
    let started = Instant::now();
    group.write_blocking(vec![pending("cch_1", 1)]).unwrap();
    group
        .write_blocking(vec![WriteOp::Outbox(OutboxWrite::Delete(
            channel.clone(),
            MessageId::new("m1"),
        ))])
        .unwrap();
    group.write_blocking(vec![pending("cch_1", 2)]).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "a lone writer waited for company");
    assert_eq!(group.stats().transactions, 3);
    group.shutdown();
    let conn = open_connection(&dir.join("db.sqlite3"), Synchronous::Normal).unwrap();
    assert_eq!(count(&conn, "im_pending"), 1);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn every_kind_of_write_lands_and_a_channel_delete_cascades() {
    let dir = temp_dir("kinds");
    let group = writer_at(&dir, Synchronous::Full, GroupCommitConfig::default());
    let completed = WriteOp::Idempotency(IdempotencyWrite::Save(CompletedRecord {
        channel: ConnectorChannelId::new("cch_1"),
        message_id: MessageId::new("in1"),
        fingerprint: Fingerprint::from_hex("ab"),
        completed_at: 3,
    }));
    let channel = WriteOp::Channel {
        id: "cch_1".into(),
        connector_id: "conn_a".into(),
        status: "connected".into(),
        binding: Some("{\"secrets\":{\"token\":\"t0k\"}}".into()),
        tool_overrides: "[]".into(),
        created_at: 1,
    };
    let meta = WriteOp::Meta { key: "connector_id".into(), value: Some("conn_a".into()) };
    // One caller's several writes: one unit.
    group
        .write_blocking(vec![channel.clone(), pending("cch_1", 1), completed, tool_call("k")])
        .unwrap();
    group.write_blocking(vec![meta]).unwrap();
    assert!(!format!("{channel:?}").contains("t0k"), "Debug must not show the binding");
    // A reader on its own connection sees what was acknowledged.
    let reader = open_connection(&dir.join("db.sqlite3"), Synchronous::Full).unwrap();
    assert_eq!(count(&reader, "channels"), 1);
    assert_eq!(count(&reader, "im_completed"), 1);
    drop(reader);
    group.write_blocking(vec![WriteOp::DeleteChannel("cch_1".into())]).unwrap();
    group.write_blocking(vec![WriteOp::PruneToolCalls { before: 100 }]).unwrap();
    group.shutdown();
    let conn = open_connection(&dir.join("db.sqlite3"), Synchronous::Full).unwrap();
    for table in ["channels", "im_pending", "im_completed", "tool_calls"] {
        assert_eq!(count(&conn, table), 0, "{table}");
    }
    assert_eq!(count(&conn, "meta"), 1);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_failing_job_fails_alone_and_the_rest_of_its_batch_commits() {
    let dir = temp_dir("fail");
    let conn = open_connection(&dir.join("db.sqlite3"), Synchronous::Normal).unwrap();
    // A trigger refusing one key stands in for a write that breaks a constraint.
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON tool_calls WHEN NEW.key = 'bad'
         BEGIN SELECT RAISE(ABORT, 'refused'); END;",
    )
    .unwrap();
    let group =
        GroupCommit::start(Arc::new(Mutex::new(conn)), GroupCommitConfig::default()).unwrap();
    let good = group.submit(vec![tool_call("good")]);
    let bad = group.submit(vec![tool_call("bad-neighbour"), tool_call("bad")]);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        assert!(bad.committed().await.is_err());
        good.committed().await.unwrap();
    });
    group.shutdown();
    let conn = open_connection(&dir.join("db.sqlite3"), Synchronous::Normal).unwrap();
    let keys: Vec<String> = conn
        .prepare("SELECT key FROM tool_calls")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(keys, vec!["good".to_owned()], "the failing job left nothing behind");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn writes_after_shutdown_fail_instead_of_being_acknowledged() {
    let dir = temp_dir("closed");
    let group = writer_at(&dir, Synchronous::Normal, GroupCommitConfig::default());
    group.shutdown();
    assert!(group.write_blocking(vec![tool_call("late")]).is_err());
    std::fs::remove_dir_all(dir).ok();
}

const CRASH_DIR: &str = "XSR_GROUP_COMMIT_CRASH_DIR";

/// The child half of the crash test: commits one write, then submits more and aborts the
/// process inside the second batch, after its statements and before its `COMMIT`. Prints
/// `ACK <key>` for every write it was told is committed.
#[test]
#[ignore = "run by crash_between_batching_and_commit_acknowledges_nothing in a child process"]
fn crash_child() {
    use std::io::Write;
    let Ok(dir) = std::env::var(CRASH_DIR) else { return };
    let config =
        GroupCommitConfig { crash_before_commit_of_batch: Some(2), ..GroupCommitConfig::default() };
    let group = writer_at(Path::new(&dir), Synchronous::Full, config);
    let ack = |key: &str| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ACK {key}").unwrap();
        out.flush().unwrap();
    };
    group.write_blocking(vec![tool_call("before")]).unwrap();
    ack("before");
    let (tx, rx) = mpsc::channel();
    for i in 0..20 {
        let tx = tx.clone();
        let key = format!("during{i}");
        group.submit_with(vec![tool_call(&key), pending("cch_1", i)], move |result| {
            let _ = tx.send((key, result.is_ok()));
        });
    }
    drop(tx);
    for (key, ok) in rx {
        if ok {
            ack(&key);
        }
    }
}

#[test]
fn crash_between_batching_and_commit_acknowledges_nothing() {
    let dir = temp_dir("crash");
    let exe = std::env::current_exe().unwrap();
    let output = std::process::Command::new(exe)
        .args(["--exact", "storage::group::tests::crash_child", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CRASH_DIR, &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "the child was meant to abort: {stdout}");
    // The harness prints its own text before the first line; every ACK ends its line.
    let acked: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.split_once("ACK ").map(|(_, key)| key.trim()))
        .collect();
    assert_eq!(acked, vec!["before"], "only the write committed before the crash is acked");
    // What is on disk after the crash: the acknowledged write, nothing of the batch.
    let conn = open_connection(&dir.join("db.sqlite3"), Synchronous::Full).unwrap();
    let keys: Vec<String> = conn
        .prepare("SELECT key FROM tool_calls")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(keys, vec!["before".to_owned()]);
    assert_eq!(count(&conn, "im_pending"), 0);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn an_attempt_update_after_its_insert_in_one_batch_lands_and_survives_a_reopen() {
    use xagent_profile_im::AttemptUpdate;
    let dir = temp_dir("attempt");
    let group = writer_at(&dir, Synchronous::Full, GroupCommitConfig::default());
    let update = AttemptUpdate {
        channel: ConnectorChannelId::new("cch_1"),
        message_id: MessageId::new("m1"),
        attempts: 3,
        next_attempt_at: 77,
        last_error: Some("ack timeout".into()),
    };
    let attempt = WriteOp::Outbox(OutboxWrite::Attempt(update.clone()));
    assert_eq!(format!("{attempt:?}"), "Outbox::Attempt(cch_1, m1)");
    // Insert then update in one job (one transaction), then an update of a missing row.
    group.write_blocking(vec![pending("cch_1", 1), attempt]).unwrap();
    let mut missing = update;
    missing.message_id = MessageId::new("m_gone");
    group.write_blocking(vec![WriteOp::Outbox(OutboxWrite::Attempt(missing))]).unwrap();
    group.shutdown();
    let conn = open_connection(&dir.join("db.sqlite3"), Synchronous::Full).unwrap();
    let rows = xagent_storage_sqlite::im::load_pending(&conn).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].attempts, 3);
    assert_eq!(rows[0].next_attempt_at, 77);
    assert_eq!(rows[0].last_error.as_deref(), Some("ack timeout"));
    assert_eq!(rows[0].payload, "{}");
    std::fs::remove_dir_all(dir).ok();
}
