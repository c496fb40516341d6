//! Group commit for the SQLite storage: durable writes from many callers (tool-call records,
//! outbox inserts, attempt counts and removals, receiver idempotency, channel records) are
//! queued to one writer thread, which commits whatever is queued as one transaction and only
//! then tells each caller that its write is durable.
//!
//! The promise does not weaken with batching: a caller hears `Ok` only after the `COMMIT` of
//! the transaction holding its write returned, so anything the runtime acknowledges on the
//! strength of that `Ok` (a `tool.invoke` result, an enqueued message, an `accepted` ack) is
//! on disk. A crash between batching and commit acknowledges nothing of that batch (see the
//! test `crash_between_batching_and_commit_acknowledges_nothing`).
//!
//! How long a batch waits: the writer never waits while only one caller is writing (one write
//! in flight pays no extra latency). When the previous transaction carried several callers'
//! writes, it waits up to [`GroupCommitConfig::max_wait`] for about as many to arrive before it
//! commits, so concurrent callers share one `fsync`.
//!
//! Durability: [`Synchronous::Full`] (the default) makes SQLite sync the WAL on every commit,
//! so a committed write survives an operating-system crash or power loss;
//! [`Synchronous::Normal`] survives a killed process but may lose the last commits on an OS
//! crash, and is the documented setting for those who choose speed over that.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::{Connection, params};
use xagent_profile_im::{IdempotencyWrite, OutboxWrite};

use super::StorageError;

/// The tables of the runtime's SQLite database (created when missing).
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS channels (
  id TEXT PRIMARY KEY, connector_id TEXT NOT NULL, status TEXT NOT NULL,
  binding TEXT, tool_overrides TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tool_calls (
  channel TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, result TEXT,
  error_code TEXT, error_message TEXT, completed_at INTEGER NOT NULL,
  PRIMARY KEY (channel, key));
CREATE TABLE IF NOT EXISTS im_pending (
  channel TEXT NOT NULL, message_id TEXT NOT NULL, seq INTEGER NOT NULL, payload TEXT NOT NULL,
  attempts INTEGER NOT NULL, first_responsibility_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL, next_attempt_at INTEGER NOT NULL, last_error TEXT,
  PRIMARY KEY (channel, message_id));
CREATE TABLE IF NOT EXISTS im_completed (
  channel TEXT NOT NULL, message_id TEXT NOT NULL, fingerprint TEXT NOT NULL,
  completed_at INTEGER NOT NULL, PRIMARY KEY (channel, message_id));
";

/// How hard SQLite makes each commit durable (`PRAGMA synchronous`, in WAL mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Sync the WAL on every commit: a committed write survives an OS crash or power loss.
    /// The default.
    #[default]
    Full,
    /// Sync only at checkpoints: survives a killed process, but an OS crash or power loss
    /// may lose the last commits. Faster; choose it knowingly.
    Normal,
}

impl Synchronous {
    /// The pragma value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }

    /// Reads `full` / `normal` (any case), e.g. from a configuration file or flag.
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "full" => Some(Self::Full),
            "normal" => Some(Self::Normal),
            _ => None,
        }
    }
}

/// Opens (creating if needed) an SQLite file in WAL mode with the given durability, a busy
/// timeout and the runtime's tables: the settings every connection of the storage shares.
pub(crate) fn open_connection(
    path: &Path,
    synchronous: Synchronous,
) -> Result<Connection, StorageError> {
    let conn = Connection::open(path).map_err(|e| storage_error("open", e))?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(|e| storage_error("enable WAL", e))?;
    conn.pragma_update(None, "synchronous", synchronous.as_str())
        .map_err(|e| storage_error("set synchronous", e))?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(|e| storage_error("set busy timeout", e))?;
    conn.execute_batch(SCHEMA).map_err(|e| storage_error("create schema", e))?;
    Ok(conn)
}

/// Batching bounds of the writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupCommitConfig {
    /// Longest time a batch waits for more writes before it commits (only when the previous
    /// transaction showed concurrent writers). Default 1 ms.
    pub max_wait: Duration,
    /// Most callers' writes in one transaction. Default 1,024.
    pub max_batch: usize,
    /// Test hook: abort the process after executing this many batches' statements, before
    /// their `COMMIT` (1 = the first batch).
    #[cfg(test)]
    pub(crate) crash_before_commit_of_batch: Option<u64>,
}

impl Default for GroupCommitConfig {
    fn default() -> Self {
        Self {
            max_wait: Duration::from_millis(1),
            max_batch: 1024,
            #[cfg(test)]
            crash_before_commit_of_batch: None,
        }
    }
}

/// One durable write. Rows are given as their stored columns (JSON text already encoded), so
/// the writer thread only binds parameters.
#[derive(Clone, PartialEq)]
pub enum WriteOp {
    /// An IM outbox write (`profile-im`).
    Outbox(OutboxWrite),
    /// An IM receiver idempotency write (`profile-im`).
    Idempotency(IdempotencyWrite),
    /// Stores a completed tool call (insert or replace by `(channel, key)`).
    ToolCall {
        /// Channel id.
        channel: String,
        /// Idempotency key (tool_call_id or request_id).
        key: String,
        /// Fingerprint of tool id + arguments.
        fingerprint: String,
        /// The result as JSON text, on success.
        result: Option<String>,
        /// `(code, message)` on failure.
        error: Option<(String, String)>,
        /// Completion time (Unix ms).
        completed_at: i64,
    },
    /// Inserts or updates a channel record.
    Channel {
        /// Channel id.
        id: String,
        /// Owning runtime instance.
        connector_id: String,
        /// Status text.
        status: String,
        /// The binding as JSON text (holds secrets: never logged).
        binding: Option<String>,
        /// Tool overrides as JSON text.
        tool_overrides: String,
        /// Creation time (Unix ms).
        created_at: i64,
    },
    /// Deletes a channel and everything kept for it.
    DeleteChannel(String),
    /// Sets (`Some`) or removes (`None`) a meta value.
    Meta {
        /// Key.
        key: String,
        /// Value.
        value: Option<String>,
    },
    /// Deletes tool calls completed before the time (Unix ms).
    PruneToolCalls {
        /// Cut-off.
        before: i64,
    },
}

impl std::fmt::Debug for WriteOp {
    /// Names the operation and its keys, never a stored value (bindings hold secrets).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Outbox(OutboxWrite::Save(r)) => {
                write!(f, "Outbox::Save({}, {})", r.channel, r.message_id)
            }
            Self::Outbox(OutboxWrite::Delete(c, m)) => write!(f, "Outbox::Delete({c}, {m})"),
            Self::Idempotency(IdempotencyWrite::Save(r)) => {
                write!(f, "Idempotency::Save({}, {})", r.channel, r.message_id)
            }
            Self::Idempotency(IdempotencyWrite::Delete(c, m)) => {
                write!(f, "Idempotency::Delete({c}, {m})")
            }
            Self::ToolCall { channel, key, .. } => write!(f, "ToolCall({channel}, {key})"),
            Self::Channel { id, .. } => write!(f, "Channel({id})"),
            Self::DeleteChannel(id) => write!(f, "DeleteChannel({id})"),
            Self::Meta { key, .. } => write!(f, "Meta({key})"),
            Self::PruneToolCalls { before } => write!(f, "PruneToolCalls({before})"),
        }
    }
}

fn storage_error(
    operation: &'static str,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> StorageError {
    StorageError::new(operation, source)
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Executes one write through the statement cache.
pub(crate) fn execute(conn: &Connection, op: &WriteOp) -> rusqlite::Result<()> {
    let exec = |sql: &str, p: &[&dyn rusqlite::ToSql]| -> rusqlite::Result<()> {
        conn.prepare_cached(sql)?.execute(p).map(|_| ())
    };
    match op {
        WriteOp::Outbox(OutboxWrite::Save(r)) => exec(
            "INSERT OR REPLACE INTO im_pending (channel, message_id, seq, payload, attempts,
               first_responsibility_at, expires_at, next_attempt_at, last_error)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                r.channel.as_str(),
                r.message_id.as_str(),
                to_i64(r.seq),
                r.payload,
                r.attempts,
                to_i64(r.first_responsibility_at),
                to_i64(r.expires_at),
                to_i64(r.next_attempt_at),
                r.last_error
            ],
        ),
        WriteOp::Outbox(OutboxWrite::Delete(channel, message_id)) => exec(
            "DELETE FROM im_pending WHERE channel = ?1 AND message_id = ?2",
            params![channel.as_str(), message_id.as_str()],
        ),
        WriteOp::Idempotency(IdempotencyWrite::Save(r)) => exec(
            "INSERT OR REPLACE INTO im_completed (channel, message_id, fingerprint, completed_at)
             VALUES (?1, ?2, ?3, ?4)",
            params![
                r.channel.as_str(),
                r.message_id.as_str(),
                r.fingerprint.as_str(),
                to_i64(r.completed_at)
            ],
        ),
        WriteOp::Idempotency(IdempotencyWrite::Delete(channel, message_id)) => exec(
            "DELETE FROM im_completed WHERE channel = ?1 AND message_id = ?2",
            params![channel.as_str(), message_id.as_str()],
        ),
        WriteOp::ToolCall { channel, key, fingerprint, result, error, completed_at } => {
            let (code, message) = match error {
                Some((code, message)) => (Some(code.as_str()), Some(message.as_str())),
                None => (None, None),
            };
            exec(
                "INSERT OR REPLACE INTO tool_calls
                   (channel, key, fingerprint, result, error_code, error_message, completed_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![channel, key, fingerprint, result, code, message, completed_at],
            )
        }
        WriteOp::Channel { id, connector_id, status, binding, tool_overrides, created_at } => exec(
            "INSERT INTO channels (id, connector_id, status, binding, tool_overrides, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(id) DO UPDATE SET connector_id = excluded.connector_id,
                   status = excluded.status, binding = excluded.binding,
                   tool_overrides = excluded.tool_overrides",
            params![id, connector_id, status, binding, tool_overrides, created_at],
        ),
        WriteOp::DeleteChannel(id) => {
            for sql in [
                "DELETE FROM channels WHERE id = ?1",
                "DELETE FROM tool_calls WHERE channel = ?1",
                "DELETE FROM im_pending WHERE channel = ?1",
                "DELETE FROM im_completed WHERE channel = ?1",
            ] {
                exec(sql, params![id])?;
            }
            Ok(())
        }
        WriteOp::Meta { key, value: Some(value) } => exec(
            "INSERT INTO meta (key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![key, value],
        ),
        WriteOp::Meta { key, value: None } => exec("DELETE FROM meta WHERE key = ?1", params![key]),
        WriteOp::PruneToolCalls { before } => {
            exec("DELETE FROM tool_calls WHERE completed_at < ?1", params![before])
        }
    }
}

type Done = Box<dyn FnOnce(Result<(), StorageError>) + Send>;

struct Job {
    ops: Vec<WriteOp>,
    done: Done,
}

/// Counters of the writer, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupCommitStats {
    /// Transactions committed (or attempted).
    pub transactions: u64,
    /// Callers' submissions carried by them.
    pub jobs: u64,
    /// Single writes carried by them.
    pub writes: u64,
}

#[derive(Default)]
struct Counters {
    transactions: AtomicU64,
    jobs: AtomicU64,
    writes: AtomicU64,
}

/// The waiting side of one submission: resolves once the transaction holding the write has
/// committed (or failed).
#[derive(Debug)]
pub struct CommitTicket(tokio::sync::oneshot::Receiver<Result<(), StorageError>>);

impl CommitTicket {
    /// A ticket that is already resolved (a write made synchronously).
    pub fn ready(result: Result<(), StorageError>) -> Self {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = tx.send(result);
        Self(rx)
    }

    /// Waits for the commit.
    pub async fn committed(self) -> Result<(), StorageError> {
        self.0.await.unwrap_or_else(|_| Err(writer_gone()))
    }
}

fn writer_gone() -> StorageError {
    storage_error("group commit", "the storage writer stopped before committing this write")
}

/// The writer: one thread that owns the write connection and commits batches.
pub struct GroupCommit {
    queue: Mutex<Option<Sender<Job>>>,
    counters: Arc<Counters>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").field("stats", &self.stats()).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl GroupCommit {
    /// Starts the writer thread over `conn` (for a file database a connection of its own, so
    /// readers on other connections never wait for a commit's `fsync`; for an in-memory
    /// database the one shared connection).
    pub fn start(
        conn: Arc<Mutex<Connection>>,
        config: GroupCommitConfig,
    ) -> Result<Self, StorageError> {
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let thread_counters = counters.clone();
        let thread = std::thread::Builder::new()
            .name("storage-writer".into())
            .spawn(move || writer(conn, rx, config, thread_counters))
            .map_err(|e| storage_error("start the storage writer", e))?;
        Ok(Self { queue: Mutex::new(Some(tx)), counters, thread: Mutex::new(Some(thread)) })
    }

    /// Queues writes (applied in order, all or none) and calls `done` once their transaction
    /// committed or failed. Never blocks.
    pub fn submit_with(
        &self,
        ops: Vec<WriteOp>,
        done: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) {
        if ops.is_empty() {
            done(Ok(()));
            return;
        }
        let job = Job { ops, done: Box::new(done) };
        let sent = match lock(&self.queue).as_ref() {
            Some(queue) => queue.send(job).map_err(|e| e.0),
            None => Err(job),
        };
        if let Err(job) = sent {
            (job.done)(Err(writer_gone()));
        }
    }

    /// Queues writes; await the ticket before acknowledging anything that depends on them.
    pub fn submit(&self, ops: Vec<WriteOp>) -> CommitTicket {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit_with(ops, move |result| {
            // The caller may have stopped waiting; the write is committed all the same.
            let _ = tx.send(result);
        });
        CommitTicket(rx)
    }

    /// Queues writes and blocks the calling thread until they are committed (for synchronous
    /// callers; async code awaits [`GroupCommit::submit`] instead).
    pub fn write_blocking(&self, ops: Vec<WriteOp>) -> Result<(), StorageError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.submit_with(ops, move |result| {
            let _ = tx.send(result);
        });
        rx.recv().unwrap_or_else(|_| Err(writer_gone()))
    }

    /// Counters so far.
    pub fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            transactions: self.counters.transactions.load(Ordering::Relaxed),
            jobs: self.counters.jobs.load(Ordering::Relaxed),
            writes: self.counters.writes.load(Ordering::Relaxed),
        }
    }

    /// Commits what is queued, stops the writer and waits for it (it closes its connection).
    /// Later submissions fail.
    pub fn shutdown(&self) {
        drop(lock(&self.queue).take());
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        // The writer finishes what is queued and exits when the queue closes.
        drop(lock(&self.queue).take());
    }
}

fn writer(
    conn: Arc<Mutex<Connection>>,
    rx: Receiver<Job>,
    config: GroupCommitConfig,
    counters: Arc<Counters>,
) {
    let max_batch = config.max_batch.max(1);
    let mut last_batch = 0usize;
    #[cfg(test)]
    let mut batches = 0u64;
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // Bounded wait, only when writers were concurrent last time: about as many again.
        if last_batch > 1 && batch.len() < last_batch.min(max_batch) && !config.max_wait.is_zero() {
            let deadline = Instant::now() + config.max_wait;
            while batch.len() < last_batch.min(max_batch) {
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(job) => batch.push(job),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                }
            }
        }
        last_batch = batch.len();
        #[cfg(test)]
        {
            batches += 1;
        }
        #[cfg(test)]
        let crash = config.crash_before_commit_of_batch == Some(batches);
        #[cfg(not(test))]
        let crash = false;
        let results = commit_batch(&lock(&conn), &batch, crash);
        counters.transactions.fetch_add(1, Ordering::Relaxed);
        counters.jobs.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let writes: usize = batch.iter().map(|j| j.ops.len()).sum();
        counters.writes.fetch_add(writes as u64, Ordering::Relaxed);
        // Only now, after COMMIT returned, does anyone hear about the batch.
        for (job, result) in batch.into_iter().zip(results) {
            (job.done)(result);
        }
    }
}

/// Runs every job of the batch in one transaction; a job whose own statements fail is rolled
/// back alone (savepoint) and reported failed, the others commit. Returns one result per job,
/// all errors when the transaction itself could not commit.
fn commit_batch(conn: &Connection, batch: &[Job], crash: bool) -> Vec<Result<(), StorageError>> {
    let all_failed = |operation: &'static str, e: rusqlite::Error| {
        let reason = e.to_string();
        batch.iter().map(|_| Err(storage_error(operation, reason.as_str()))).collect()
    };
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        return all_failed("begin a transaction", e);
    }
    let mut results = Vec::with_capacity(batch.len());
    for job in batch {
        let result = if job.ops.len() == 1 {
            // One statement is atomic by itself.
            execute(conn, &job.ops[0])
        } else {
            run_in_savepoint(conn, &job.ops)
        };
        results.push(result.map_err(|e| storage_error("write", e)));
    }
    if crash {
        // Statements executed, transaction not committed: what a crash here leaves behind.
        std::process::abort();
    }
    if let Err(e) = conn.execute_batch("COMMIT") {
        let _ = conn.execute_batch("ROLLBACK");
        return all_failed("commit", e);
    }
    results
}

fn run_in_savepoint(conn: &Connection, ops: &[WriteOp]) -> rusqlite::Result<()> {
    conn.execute_batch("SAVEPOINT job")?;
    let result = ops.iter().try_for_each(|op| execute(conn, op));
    match result {
        Ok(()) => conn.execute_batch("RELEASE job"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK TO job; RELEASE job");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_profile_im::{CompletedRecord, Fingerprint, PendingRecord};
    use xagent_protocol_types::{ConnectorChannelId, MessageId};

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("xsr-group-{name}-{}", crate::ids::packet_id()));
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
        let config = GroupCommitConfig {
            crash_before_commit_of_batch: Some(2),
            ..GroupCommitConfig::default()
        };
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
}
