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

use rusqlite::Connection;

use super::StorageError;
use super::write_op::{WriteOp, execute};

/// The runtime's own tables (created when missing); the IM tables come from `xagent-im-sqlite`.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS channels (
  id TEXT PRIMARY KEY, connector_id TEXT NOT NULL, status TEXT NOT NULL,
  binding TEXT, tool_overrides TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tool_calls (
  channel TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, result TEXT,
  error_code TEXT, error_message TEXT, completed_at INTEGER NOT NULL,
  PRIMARY KEY (channel, key));
CREATE TABLE IF NOT EXISTS author_records (
  namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL,
  PRIMARY KEY (namespace, key)) WITHOUT ROWID;
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
    let conn = Connection::open(path).map_err(|e| StorageError::new("open", e))?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(|e| StorageError::new("enable WAL", e))?;
    conn.pragma_update(None, "synchronous", synchronous.as_str())
        .map_err(|e| StorageError::new("set synchronous", e))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| StorageError::new("set busy timeout", e))?;
    create_schema(&conn).map_err(|e| StorageError::new("create schema", e))?;
    // Room for every write statement plus the transaction's own (BEGIN, SAVEPOINT, ...), so
    // the hot ones are never evicted and parsed again.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// Prepared statements kept per connection (rusqlite's default is 16).
const STATEMENT_CACHE: usize = 64;

/// Runs one statement without parameters from the connection's statement cache: the
/// transaction control of every batch is parsed once, not once per batch.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Creates every table of the runtime's database that is missing: its own and the IM stores'.
pub(crate) fn create_schema(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(SCHEMA)?;
    conn.execute_batch(xagent_im_sqlite::SCHEMA)
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

    /// A ticket and the sender that resolves it (for a backend's own writer).
    #[cfg(feature = "postgres")]
    pub(crate) fn pending() -> (tokio::sync::oneshot::Sender<Result<(), StorageError>>, Self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (tx, Self(rx))
    }

    /// Waits for the commit.
    pub async fn committed(self) -> Result<(), StorageError> {
        self.0.await.unwrap_or_else(|_| Err(writer_gone()))
    }
}

fn writer_gone() -> StorageError {
    StorageError::new("group commit", "the storage writer stopped before committing this write")
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
            .map_err(|e| StorageError::new("start the storage writer", e))?;
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
        let begun = Instant::now();
        let results = commit_batch(&lock(&conn), &batch, crash);
        crate::metrics::metrics().committed(batch.len(), begun.elapsed());
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
        batch.iter().map(|_| Err(StorageError::new(operation, reason.as_str()))).collect()
    };
    if let Err(e) = run_cached(conn, "BEGIN IMMEDIATE") {
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
        results.push(result.map_err(|e| StorageError::new("write", e)));
    }
    if crash {
        // Statements executed, transaction not committed: what a crash here leaves behind.
        std::process::abort();
    }
    if let Err(e) = run_cached(conn, "COMMIT") {
        let _ = run_cached(conn, "ROLLBACK");
        return all_failed("commit", e);
    }
    results
}

fn run_in_savepoint(conn: &Connection, ops: &[WriteOp]) -> rusqlite::Result<()> {
    run_cached(conn, "SAVEPOINT job")?;
    let result = ops.iter().try_for_each(|op| execute(conn, op));
    match result {
        Ok(()) => run_cached(conn, "RELEASE job"),
        Err(e) => {
            let _ = run_cached(conn, "ROLLBACK TO job");
            let _ = run_cached(conn, "RELEASE job");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests;
