//! Group commit: one writer thread owns the write connection and commits whatever callers
//! queued in one transaction (one `fsync` under `synchronous=FULL` for the group), each
//! caller's batch inside its own savepoint, so a batch that fails is rolled back alone and
//! the others commit. A caller hears about its batch only after the `COMMIT` of the
//! transaction holding it returned: anything acknowledged on the strength of that answer is
//! on disk.
//!
//! How long a group waits: never while only one caller is writing (one write in flight pays
//! no extra latency). When the previous transaction carried several callers' batches, it waits
//! up to [`GroupCommitConfig::max_wait`] for about as many to arrive before it commits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// One caller's writes, as the writer sees them.
pub trait Batch: Send + 'static {
    /// What a failed batch answers.
    type Error: Send + 'static;

    /// Runs the batch's statements on `conn`, inside the group's transaction.
    fn apply(&self, conn: &Connection) -> Result<(), Self::Error>;

    /// How many single writes the batch carries (for the counters).
    fn writes(&self) -> usize;

    /// Whether the batch is one statement, atomic by itself: it then runs without a savepoint
    /// of its own.
    fn single_statement(&self) -> bool {
        false
    }

    /// The answer of every batch of a group whose transaction could not begin or commit, or
    /// of a batch submitted after the writer stopped.
    fn failed(operation: &'static str, reason: &str) -> Self::Error;

    /// Called after each group's transaction with the number of batches it carried and how
    /// long it took (e.g. for metrics).
    fn committed(_batches: usize, _took: Duration) {}
}

/// Batching bounds of the writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupCommitConfig {
    /// Longest time a group waits for more batches before it commits (only when the previous
    /// transaction showed concurrent writers). Default 1 ms.
    pub max_wait: Duration,
    /// Most callers' batches in one transaction. Default 1,024.
    pub max_batch: usize,
    /// Fault injection for crash tests: abort the process after executing this many
    /// transactions' statements, before their `COMMIT` (1 = the first). `None` in production.
    pub crash_before_commit_of_batch: Option<u64>,
}

impl Default for GroupCommitConfig {
    fn default() -> Self {
        Self {
            max_wait: Duration::from_millis(1),
            max_batch: 1024,
            crash_before_commit_of_batch: None,
        }
    }
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

type Done<B> = Box<dyn FnOnce(Result<(), <B as Batch>::Error>) + Send>;

struct Job<B: Batch> {
    batch: B,
    done: Done<B>,
}

/// The writer: one thread that owns the write connection and commits groups of batches.
pub struct GroupCommit<B: Batch> {
    queue: Mutex<Option<Sender<Job<B>>>>,
    counters: Arc<Counters>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl<B: Batch> std::fmt::Debug for GroupCommit<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").field("stats", &self.stats()).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

const STOPPED: &str = "the storage writer stopped before committing this write";

impl<B: Batch> GroupCommit<B> {
    /// Starts the writer thread over `conn` (for a file database a connection of its own, so
    /// readers on other connections never wait for a commit's `fsync`; it may also be shared
    /// with readers, who then wait for the writer's turn).
    pub fn start(conn: Arc<Mutex<Connection>>, config: GroupCommitConfig) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let thread_counters = counters.clone();
        let thread = std::thread::Builder::new()
            .name("storage-writer".into())
            .spawn(move || writer(&conn, &rx, config, &thread_counters))?;
        Ok(Self { queue: Mutex::new(Some(tx)), counters, thread: Mutex::new(Some(thread)) })
    }

    /// Queues a batch (applied all or none) and calls `done` once its transaction committed
    /// or failed. Never blocks.
    pub fn submit_with(&self, batch: B, done: impl FnOnce(Result<(), B::Error>) + Send + 'static) {
        let job = Job { batch, done: Box::new(done) };
        let sent = match lock(&self.queue).as_ref() {
            Some(queue) => queue.send(job).map_err(|e| e.0),
            None => Err(job),
        };
        if let Err(job) = sent {
            (job.done)(Err(B::failed("group commit", STOPPED)));
        }
    }

    /// Queues a batch now, behind every batch queued before it, and returns the wait for its
    /// answer (which may run on another thread, e.g. an async runtime's blocking pool).
    pub fn submit(&self, batch: B) -> Committing<B> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.submit_with(batch, move |result| {
            let _ = tx.send(result);
        });
        Committing(rx)
    }

    /// Queues a batch and blocks the calling thread until it is committed (for synchronous
    /// callers).
    pub fn write_blocking(&self, batch: B) -> Result<(), B::Error> {
        self.submit(batch).wait()
    }

    /// Counters so far.
    pub fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            transactions: self.counters.transactions.load(Ordering::Relaxed),
            jobs: self.counters.jobs.load(Ordering::Relaxed),
            writes: self.counters.writes.load(Ordering::Relaxed),
        }
    }

    /// Commits what is queued, stops the writer and waits for it (it drops its connection).
    /// Later submissions fail.
    pub fn shutdown(&self) {
        drop(lock(&self.queue).take());
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

/// A queued batch's answer, to wait for.
pub struct Committing<B: Batch>(Receiver<Result<(), B::Error>>);

impl<B: Batch> Committing<B> {
    /// Blocks until the batch's transaction committed or failed.
    pub fn wait(self) -> Result<(), B::Error> {
        self.0.recv().unwrap_or_else(|_| Err(B::failed("group commit", STOPPED)))
    }
}

/// Dropping the writer commits what is queued and waits for the thread (share it behind an
/// `Arc` so the last owner stops it).
impl<B: Batch> Drop for GroupCommit<B> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Takes the next group off the queue: whatever is there, and (when writers were concurrent
/// last time) up to `max_wait` more for about as many as the last group had.
fn next_group<B: Batch>(
    rx: &Receiver<Job<B>>,
    first: Job<B>,
    last: usize,
    config: &GroupCommitConfig,
) -> Vec<Job<B>> {
    let max_batch = config.max_batch.max(1);
    let mut group = vec![first];
    while group.len() < max_batch {
        match rx.try_recv() {
            Ok(job) => group.push(job),
            Err(_) => break,
        }
    }
    let wanted = last.min(max_batch);
    if last > 1 && group.len() < wanted && !config.max_wait.is_zero() {
        let deadline = Instant::now() + config.max_wait;
        while group.len() < wanted {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(job) => group.push(job),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    group
}

fn writer<B: Batch>(
    conn: &Mutex<Connection>,
    rx: &Receiver<Job<B>>,
    config: GroupCommitConfig,
    counters: &Counters,
) {
    let (mut last, mut groups) = (0usize, 0u64);
    while let Ok(first) = rx.recv() {
        let group = next_group(rx, first, last, &config);
        last = group.len();
        groups += 1;
        let abort = config.crash_before_commit_of_batch == Some(groups);
        let begun = Instant::now();
        let results = commit_group(&lock(conn), &group, abort);
        B::committed(group.len(), begun.elapsed());
        counters.transactions.fetch_add(1, Ordering::Relaxed);
        counters.jobs.fetch_add(group.len() as u64, Ordering::Relaxed);
        let writes: usize = group.iter().map(|job| job.batch.writes()).sum();
        counters.writes.fetch_add(writes as u64, Ordering::Relaxed);
        // Only now, after COMMIT returned, does anyone hear about the group.
        for (job, result) in group.into_iter().zip(results) {
            (job.done)(result);
        }
    }
}

/// Runs one statement without parameters from the connection's statement cache: the
/// transaction control of every group is parsed once.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Runs every batch of the group in one transaction; a batch whose own statements fail is
/// rolled back alone (savepoint) and reported failed, the others commit. Returns one result
/// per batch, all failed when the transaction itself could not commit.
fn commit_group<B: Batch>(
    conn: &Connection,
    group: &[Job<B>],
    abort: bool,
) -> Vec<Result<(), B::Error>> {
    let all_failed = |operation: &'static str, e: rusqlite::Error| {
        let reason = e.to_string();
        group.iter().map(|_| Err(B::failed(operation, &reason))).collect()
    };
    if let Err(e) = run_cached(conn, "BEGIN IMMEDIATE") {
        return all_failed("begin a transaction", e);
    }
    let results: Vec<_> = group.iter().map(|job| apply_alone(conn, &job.batch)).collect();
    if abort {
        // Statements executed, transaction not committed: what a crash here leaves behind.
        std::process::abort();
    }
    if let Err(e) = run_cached(conn, "COMMIT") {
        let _ = run_cached(conn, "ROLLBACK");
        return all_failed("commit", e);
    }
    results
}

/// Applies one batch so that a failure undoes only its own statements.
fn apply_alone<B: Batch>(conn: &Connection, batch: &B) -> Result<(), B::Error> {
    if batch.single_statement() {
        return batch.apply(conn);
    }
    let savepoint =
        |sql| run_cached(conn, sql).map_err(|e| B::failed("keep a batch apart", &e.to_string()));
    savepoint("SAVEPOINT batch")?;
    match batch.apply(conn) {
        Ok(()) => savepoint("RELEASE batch"),
        Err(error) => {
            let _ = run_cached(conn, "ROLLBACK TO batch");
            let _ = run_cached(conn, "RELEASE batch");
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statements run in order; an error is the failure's text.
    struct Sql(Vec<&'static str>);

    impl Batch for Sql {
        type Error = String;

        fn apply(&self, conn: &Connection) -> Result<(), String> {
            self.0.iter().try_for_each(|sql| conn.execute_batch(sql).map_err(|e| e.to_string()))
        }

        fn writes(&self) -> usize {
            self.0.len()
        }

        fn failed(operation: &'static str, reason: &str) -> String {
            format!("{operation}: {reason}")
        }
    }

    fn rows(conn: &Mutex<Connection>) -> Vec<i64> {
        let conn = lock(conn);
        let mut stmt = conn.prepare("SELECT id FROM t ORDER BY id").expect("prepares");
        stmt.query_map([], |row| row.get(0)).expect("reads").map(|r| r.expect("row")).collect()
    }

    #[test]
    fn a_failing_batch_is_rolled_back_alone_and_a_stopped_writer_refuses() {
        let conn = Connection::open_in_memory().expect("opens");
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY)").expect("creates");
        let conn = Arc::new(Mutex::new(conn));
        let group = GroupCommit::start(conn.clone(), GroupCommitConfig::default()).expect("starts");
        // Queued while the connection is busy, so the writer takes them as one group.
        let (tx, rx) = mpsc::channel();
        {
            let _busy = lock(&conn);
            for batch in [
                vec!["INSERT INTO t VALUES (1)"],
                vec!["INSERT INTO t VALUES (2)", "NOT SQL"],
                vec!["INSERT INTO t VALUES (3)"],
            ] {
                let tx = tx.clone();
                group.submit_with(Sql(batch), move |result| {
                    let _ = tx.send(result.is_ok());
                });
            }
        }
        let answers: Vec<bool> = rx.iter().take(3).collect();
        assert_eq!(answers, [true, false, true]);
        assert_eq!(rows(&conn), [1, 3], "the failed batch left nothing, not even its first row");
        assert_eq!(group.stats().jobs, 3);
        group.shutdown();
        let late = group.write_blocking(Sql(vec!["INSERT INTO t VALUES (4)"]));
        assert!(late.is_err_and(|e| e.contains("stopped")));
    }
}
