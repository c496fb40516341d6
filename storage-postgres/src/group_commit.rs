//! A generic group commit on PostgreSQL: many callers submit writes, one writer task applies
//! whatever is queued in one transaction and tells each caller only after `COMMIT` returned.
//!
//! The promise is the SQLite writer's (server-runtime's `storage::group`): a ticket resolves
//! `Ok` only once the transaction holding its writes committed, so anything acknowledged on
//! the strength of it is durable. Each submission is all or nothing: the batch's writes are
//! first applied in one call (a backend may pipeline them with [`execute_in_order`]); if that
//! fails, the batch is applied again one submission at a time, each in a savepoint, so only a
//! submission whose own writes fail is rolled back and the others commit. When the
//! transaction itself fails (the connection breaks, `COMMIT` is refused) every ticket of the
//! batch gets the error and nothing of the batch is visible.
//!
//! The writer keeps one connection of the pool for itself, for as long as it works: no pool
//! round trip per batch, and the connection's prepared statements stay cached. When that
//! connection fails (it closed, or a batch ended with a session failure) it is dropped and the
//! next batch takes a new one from the pool.
//!
//! Batching: the writer never waits while one caller is writing; after a transaction that
//! carried several submissions it waits up to [`GroupCommitConfig::max_wait`] for about as
//! many before it commits, so concurrent callers share one commit.

use std::future::Future;
use std::marker::PhantomData;
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use deadpool_postgres::Transaction;
use futures_util::FutureExt;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;

use crate::error::PgError;
use crate::pool::Pool;

/// Applies writes, in order, inside the writer's transaction: the backend's own SQL.
///
/// `writes` holds one submission's writes or, on the fast path, the writes of every
/// submission of the batch one after another in submission order: a call is not one
/// submission. After a failure the batch is applied again one submission at a time (each in a
/// savepoint), so `apply` may see a write twice and must act only through `tx`. To send many
/// statements without waiting for each answer, see [`execute_in_order`].
#[async_trait::async_trait]
pub trait ApplyWrites<W>: Send + Sync + 'static {
    /// Runs the statements of `writes` in `tx`; an error rolls back this call's writes.
    async fn apply(&self, tx: &Transaction<'_>, writes: &[W]) -> Result<(), PgError>;

    /// Hears about each transaction once it ended: how many submissions it carried and how
    /// long it took, for metrics (nothing by default).
    fn committed(&self, submissions: usize, took: std::time::Duration) {
        let _ = (submissions, took);
    }
}

/// Runs prepared statements in the given order without waiting for each answer before
/// sending the next (one round trip for the lot), and returns each one's row count. The
/// statements must be prepared already ([`Transaction::prepare_cached`]): a statement given
/// as SQL text would be parsed first and could run after the ones behind it. The first
/// failure in order is returned (the statements after it fail too: the transaction is
/// aborted).
pub async fn execute_in_order(
    tx: &tokio_postgres::Transaction<'_>,
    context: &str,
    statements: &[(&Statement, &[&(dyn ToSql + Sync)])],
) -> Result<Vec<u64>, PgError> {
    type Pending<'a> =
        Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send + 'a>>;
    let mut pending: Vec<Pending<'_>> = statements
        .iter()
        .map(|(statement, params)| Box::pin(tx.execute(*statement, params)) as Pending<'_>)
        .collect();
    let mut results: Vec<Option<Result<u64, tokio_postgres::Error>>> =
        pending.iter().map(|_| None).collect();
    // The first poll of each future sends its statement: polling in index order sends them
    // in that order, and the server runs them in the order it receives them.
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (future, result) in pending.iter_mut().zip(results.iter_mut()) {
            if result.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(r) => *result = Some(r),
                    Poll::Pending => done = false,
                }
            }
        }
        if done { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    let mut counts = Vec::with_capacity(results.len());
    for result in results.into_iter().flatten() {
        counts.push(result.map_err(|e| PgError::from_driver(context, &e))?);
    }
    Ok(counts)
}

/// Batching bounds of the writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupCommitConfig {
    /// Longest time a batch waits for more submissions (only after a transaction that
    /// carried several). Default 1 ms.
    pub max_wait: Duration,
    /// Most submissions in one transaction. Default 1,024.
    pub max_batch: usize,
}

impl Default for GroupCommitConfig {
    fn default() -> Self {
        Self { max_wait: Duration::from_millis(1), max_batch: 1024 }
    }
}

impl GroupCommitConfig {
    /// Sets [`GroupCommitConfig::max_wait`].
    #[must_use]
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Sets [`GroupCommitConfig::max_batch`] (at least 1).
    #[must_use]
    pub fn with_max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }
}

/// Counters of the writer, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupCommitStats {
    /// Transactions committed or attempted (a retry with savepoints counts again).
    pub transactions: u64,
    /// Submissions carried by them.
    pub submissions: u64,
    /// Single writes carried by them.
    pub writes: u64,
}

#[derive(Default)]
struct Counters {
    transactions: AtomicU64,
    submissions: AtomicU64,
    writes: AtomicU64,
}

type Done = Box<dyn FnOnce(Result<(), PgError>) + Send>;

struct Submission<W> {
    writes: Vec<W>,
    done: Done,
}

/// The waiting side of one submission: resolves once the transaction holding its writes
/// committed (`Ok`) or failed. Dropping it does not cancel the writes.
#[derive(Debug)]
#[must_use = "await the ticket before acknowledging anything that depends on the writes"]
pub struct PgCommitTicket(oneshot::Receiver<Result<(), PgError>>);

impl PgCommitTicket {
    /// Waits for the commit.
    pub async fn committed(self) -> Result<(), PgError> {
        self.await
    }
}

impl Future for PgCommitTicket {
    type Output = Result<(), PgError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|r| r.unwrap_or(Err(PgError::WriterStopped)))
    }
}

/// The writer: one task on the runtime that started it, committing batches of `W`.
pub struct GroupCommit<W> {
    queue: Mutex<Option<mpsc::UnboundedSender<Submission<W>>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    counters: Arc<Counters>,
    _writes: PhantomData<fn(W)>,
}

impl<W> std::fmt::Debug for GroupCommit<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").field("stats", &self.stats()).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<W: Send + Sync + 'static> GroupCommit<W> {
    /// Starts the writer task (on the current tokio runtime) over `pool`, applying writes
    /// with `apply`.
    pub fn start(pool: Pool, apply: impl ApplyWrites<W>, config: GroupCommitConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let writer = Writer {
            pool,
            connection: None,
            apply,
            config,
            counters: counters.clone(),
            _writes: PhantomData,
        };
        let task = tokio::spawn(writer.run(rx));
        Self {
            queue: Mutex::new(Some(tx)),
            task: Mutex::new(Some(task)),
            counters,
            _writes: PhantomData,
        }
    }

    /// Queues `writes` (applied in order, all or none) and calls `done` once their
    /// transaction committed or failed. Never blocks; an empty list is done at once.
    pub fn submit_with(
        &self,
        writes: Vec<W>,
        done: impl FnOnce(Result<(), PgError>) + Send + 'static,
    ) {
        if writes.is_empty() {
            done(Ok(()));
            return;
        }
        let submission = Submission { writes, done: Box::new(done) };
        let sent = match lock(&self.queue).as_ref() {
            Some(queue) => queue.send(submission).map_err(|e| e.0),
            None => Err(submission),
        };
        if let Err(submission) = sent {
            (submission.done)(Err(PgError::WriterStopped));
        }
    }

    /// Queues `writes`; await the ticket before acknowledging anything that depends on them.
    pub fn submit(&self, writes: Vec<W>) -> PgCommitTicket {
        let (tx, rx) = oneshot::channel();
        self.submit_with(writes, move |result| {
            // The caller may have stopped waiting; the writes are committed all the same.
            let _ = tx.send(result);
        });
        PgCommitTicket(rx)
    }

    /// Commits what is queued, then stops the writer and waits for it. Later submissions
    /// fail with [`PgError::WriterStopped`].
    pub async fn shutdown(&self) {
        drop(lock(&self.queue).take());
        let task = lock(&self.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl<W> GroupCommit<W> {
    /// Counters so far.
    pub fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            transactions: self.counters.transactions.load(Ordering::Relaxed),
            submissions: self.counters.submissions.load(Ordering::Relaxed),
            writes: self.counters.writes.load(Ordering::Relaxed),
        }
    }
}

impl<W> Drop for GroupCommit<W> {
    fn drop(&mut self) {
        // The writer finishes what is queued and exits when the queue closes.
        drop(lock(&self.queue).take());
    }
}

struct Writer<W, A> {
    pool: Pool,
    /// The writer's own connection, taken from the pool at the first batch and kept until it
    /// fails.
    connection: Option<deadpool_postgres::Object>,
    apply: A,
    config: GroupCommitConfig,
    counters: Arc<Counters>,
    _writes: PhantomData<fn(W)>,
}

/// How one attempt at a batch ended.
enum Attempt {
    /// Committed; one result per submission (failed ones were rolled back alone).
    Committed(Vec<Result<(), PgError>>),
    /// The batch's writes failed without savepoints: retry one submission at a time.
    SubmissionFailed,
    /// The transaction failed as a whole: every submission gets this error.
    Failed(PgError),
}

impl<W: Send + Sync + 'static, A: ApplyWrites<W>> Writer<W, A> {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Submission<W>>) {
        let max_batch = self.config.max_batch.max(1);
        let mut last_batch = 0usize;
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while batch.len() < max_batch {
                match rx.try_recv() {
                    Ok(s) => batch.push(s),
                    Err(_) => break,
                }
            }
            let target = last_batch.min(max_batch);
            if last_batch > 1 && batch.len() < target && !self.config.max_wait.is_zero() {
                let deadline = tokio::time::Instant::now() + self.config.max_wait;
                while batch.len() < target {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(s)) => batch.push(s),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
            last_batch = batch.len();
            let mut writes = Vec::with_capacity(batch.iter().map(|s| s.writes.len()).sum());
            let mut ranges = Vec::with_capacity(batch.len());
            let mut dones = Vec::with_capacity(batch.len());
            for submission in batch {
                let start = writes.len();
                writes.extend(submission.writes);
                ranges.push(start..writes.len());
                dones.push(submission.done);
            }
            let begun = std::time::Instant::now();
            let results = self.commit_batch(&writes, &ranges).await;
            self.apply.committed(dones.len(), begun.elapsed());
            // Only now, after COMMIT returned, does anyone hear about the batch.
            for (done, result) in dones.into_iter().zip(results) {
                done(result);
            }
        }
    }

    async fn commit_batch(
        &mut self,
        writes: &[W],
        ranges: &[Range<usize>],
    ) -> Vec<Result<(), PgError>> {
        let all = |e: PgError| ranges.iter().map(|_| Err(e.clone())).collect();
        if self.connection.as_ref().is_some_and(|c| c.is_closed()) {
            self.connection = None;
        }
        let mut client = match self.connection.take() {
            Some(client) => client,
            None => match self.pool.get().await {
                Ok(client) => client,
                Err(e) => return all(e),
            },
        };
        // Fast path: every submission's writes in one call, no savepoints.
        let attempt = match self.attempt(&mut client, writes, ranges, false).await {
            Attempt::SubmissionFailed => self.attempt(&mut client, writes, ranges, true).await,
            other => other,
        };
        let session_failed = matches!(&attempt, Attempt::Failed(e) if is_session_failure(e));
        let results = match attempt {
            Attempt::Committed(results) => results,
            Attempt::Failed(e) => all(e),
            Attempt::SubmissionFailed => {
                all(PgError::apply("group commit", "a submission failed outside its savepoint"))
            }
        };
        if session_failed || client.is_closed() {
            // Its state is unknown: close it rather than hand it back to the pool. The next
            // batch takes a fresh connection.
            drop(deadpool_postgres::Object::take(client));
        } else {
            // Still good: it keeps serving the writer (a transaction that failed was rolled
            // back by its drop, which the server runs before the next BEGIN).
            self.connection = Some(client);
        }
        results
    }

    /// Applies `writes` through `apply`, a panic becoming an error.
    async fn apply(&self, tx: &Transaction<'_>, writes: &[W]) -> Result<(), PgError> {
        AssertUnwindSafe(self.apply.apply(tx, writes))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(PgError::apply("group commit", "the apply function panicked")))
    }

    /// One transaction over the batch. Without `isolate`, all writes go in one call and a
    /// failure ends the attempt (as the whole batch's error when it is one submission); with
    /// it, each submission runs in its own savepoint and its failure is its own result.
    async fn attempt(
        &self,
        client: &mut deadpool_postgres::Object,
        writes: &[W],
        ranges: &[Range<usize>],
        isolate: bool,
    ) -> Attempt {
        self.counters.transactions.fetch_add(1, Ordering::Relaxed);
        self.counters.submissions.fetch_add(ranges.len() as u64, Ordering::Relaxed);
        self.counters.writes.fetch_add(writes.len() as u64, Ordering::Relaxed);
        let tx = match client.transaction().await {
            Ok(tx) => tx,
            Err(e) => return Attempt::Failed(self.pool.error("begin a transaction", &e)),
        };
        let results = if isolate {
            let mut results = Vec::with_capacity(ranges.len());
            for range in ranges {
                if let Err(e) = tx.batch_execute("SAVEPOINT submission").await {
                    return Attempt::Failed(self.pool.error("open a savepoint", &e));
                }
                match self.apply(&tx, &writes[range.clone()]).await {
                    Ok(()) => {
                        if let Err(e) = tx.batch_execute("RELEASE submission").await {
                            return Attempt::Failed(self.pool.error("release a savepoint", &e));
                        }
                        results.push(Ok(()));
                    }
                    Err(e) if is_session_failure(&e) => return Attempt::Failed(e),
                    Err(e) => {
                        let undo = "ROLLBACK TO SAVEPOINT submission; RELEASE submission";
                        if let Err(e) = tx.batch_execute(undo).await {
                            return Attempt::Failed(self.pool.error("roll back a savepoint", &e));
                        }
                        results.push(Err(e));
                    }
                }
            }
            results
        } else {
            match self.apply(&tx, writes).await {
                Ok(()) => ranges.iter().map(|_| Ok(())).collect(),
                Err(e) if is_session_failure(&e) || ranges.len() == 1 => {
                    return Attempt::Failed(e);
                }
                Err(_) => return Attempt::SubmissionFailed,
            }
        };
        match tx.commit().await {
            Ok(()) => Attempt::Committed(results),
            Err(e) if e.is_closed() || e.as_db_error().is_none() => {
                Attempt::Failed(PgError::CommitOutcomeUnknown {
                    context: "a batch of writes".into(),
                })
            }
            Err(e) => Attempt::Failed(self.pool.error("commit a batch of writes", &e)),
        }
    }
}

/// Whether an error means the session itself failed (no point in retrying the batch): the
/// connection broke, or the server ended the session (SQLSTATE class 08, connection exception,
/// and 57P0x, e.g. `57P01` when an administrator terminated the backend).
fn is_session_failure(e: &PgError) -> bool {
    let ended_by_server =
        e.sqlstate().is_some_and(|code| code.starts_with("08") || code.starts_with("57P0"));
    ended_by_server
        || matches!(
            e,
            PgError::ConnectionLost { .. }
                | PgError::Connect { .. }
                | PgError::PoolClosed
                | PgError::PoolTimeout { .. }
                | PgError::CommitOutcomeUnknown { .. }
        )
}
