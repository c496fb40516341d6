//! A generic group commit on PostgreSQL: many callers submit writes, one writer task applies
//! whatever is queued in one transaction and tells each caller only after `COMMIT` returned.
//!
//! The promise is the SQLite writer's (server-runtime's `storage::group`): a ticket resolves
//! `Ok` only once the transaction holding its writes committed, so anything acknowledged on
//! the strength of it is durable. Each submission is all or nothing: a submission whose own
//! writes fail is rolled back alone (the batch is applied again with a savepoint around each
//! submission) and the others commit; when the transaction itself fails (the connection
//! breaks, `COMMIT` is refused) every ticket of the batch gets the error and nothing of the
//! batch is visible.
//!
//! Batching: the writer never waits while one caller is writing; after a transaction that
//! carried several submissions it waits up to [`GroupCommitConfig::max_wait`] for about as
//! many before it commits, so concurrent callers share one commit.

use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use deadpool_postgres::Transaction;
use futures_util::FutureExt;
use tokio::sync::{mpsc, oneshot};

use crate::error::PgError;
use crate::pool::Pool;

/// Applies one submission's writes, in order, inside the writer's transaction: the backend's
/// own SQL. It may be called more than once for a submission (a retry of the batch with
/// savepoints after another submission failed), so it must act only through `tx`.
#[async_trait::async_trait]
pub trait ApplyWrites<W>: Send + Sync + 'static {
    /// Runs the statements of `writes` in `tx`; an error rolls back this submission only.
    async fn apply(&self, tx: &Transaction<'_>, writes: &[W]) -> Result<(), PgError>;
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
        let writer =
            Writer { pool, apply, config, counters: counters.clone(), _writes: PhantomData };
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
    apply: A,
    config: GroupCommitConfig,
    counters: Arc<Counters>,
    _writes: PhantomData<fn(W)>,
}

/// How one attempt at a batch ended.
enum Attempt {
    /// Committed; one result per submission (failed ones were rolled back alone).
    Committed(Vec<Result<(), PgError>>),
    /// A submission's writes failed without savepoints: retry with them.
    SubmissionFailed,
    /// The transaction failed as a whole: every submission gets this error.
    Failed(PgError),
}

impl<W: Send + Sync + 'static, A: ApplyWrites<W>> Writer<W, A> {
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Submission<W>>) {
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
            let (writes, dones): (Vec<Vec<W>>, Vec<Done>) =
                batch.into_iter().map(|s| (s.writes, s.done)).unzip();
            let results = self.commit_batch(&writes).await;
            // Only now, after COMMIT returned, does anyone hear about the batch.
            for (done, result) in dones.into_iter().zip(results) {
                done(result);
            }
        }
    }

    async fn commit_batch(&self, batch: &[Vec<W>]) -> Vec<Result<(), PgError>> {
        let all = |e: PgError| batch.iter().map(|_| Err(e.clone())).collect();
        let mut client = match self.pool.get().await {
            Ok(client) => client,
            Err(e) => return all(e),
        };
        // One submission, or a first try: no savepoints (one round trip less per submission).
        let isolated = batch.len() == 1;
        match self.attempt(&mut client, batch, isolated).await {
            Attempt::Committed(results) => results,
            Attempt::Failed(e) => all(e),
            Attempt::SubmissionFailed => match self.attempt(&mut client, batch, true).await {
                Attempt::Committed(results) => results,
                Attempt::Failed(e) => all(e),
                Attempt::SubmissionFailed => {
                    all(PgError::apply("group commit", "a submission failed outside its savepoint"))
                }
            },
        }
    }

    /// One transaction over the batch. With `savepoints`, each submission runs inside its
    /// own (or alone, for a one-submission batch) and its failure is its result; without,
    /// the first failure ends the attempt.
    async fn attempt(
        &self,
        client: &mut deadpool_postgres::Object,
        batch: &[Vec<W>],
        savepoints: bool,
    ) -> Attempt {
        self.counters.transactions.fetch_add(1, Ordering::Relaxed);
        self.counters.submissions.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let writes: usize = batch.iter().map(Vec::len).sum();
        self.counters.writes.fetch_add(writes as u64, Ordering::Relaxed);
        let tx = match client.transaction().await {
            Ok(tx) => tx,
            Err(e) => return Attempt::Failed(self.pool.error("begin a transaction", &e)),
        };
        let one = batch.len() == 1;
        let mut results = Vec::with_capacity(batch.len());
        for submission in batch {
            let wrap = savepoints && !one;
            if wrap && let Err(e) = tx.batch_execute("SAVEPOINT submission").await {
                return Attempt::Failed(self.pool.error("open a savepoint", &e));
            }
            let applied = AssertUnwindSafe(self.apply.apply(&tx, submission))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    Err(PgError::apply("group commit", "the apply function panicked"))
                });
            match applied {
                Ok(()) => {
                    if wrap && let Err(e) = tx.batch_execute("RELEASE submission").await {
                        return Attempt::Failed(self.pool.error("release a savepoint", &e));
                    }
                    results.push(Ok(()));
                }
                Err(e) if is_session_failure(&e) => {
                    return Attempt::Failed(e);
                }
                Err(e) if one => return Attempt::Failed(e),
                Err(_) if !savepoints => return Attempt::SubmissionFailed,
                Err(e) => {
                    if let Err(e) = tx
                        .batch_execute("ROLLBACK TO SAVEPOINT submission; RELEASE submission")
                        .await
                    {
                        return Attempt::Failed(self.pool.error("roll back a savepoint", &e));
                    }
                    results.push(Err(e));
                }
            }
        }
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

/// Whether an error means the session itself failed (no point in retrying the batch).
fn is_session_failure(e: &PgError) -> bool {
    matches!(
        e,
        PgError::ConnectionLost { .. }
            | PgError::Connect { .. }
            | PgError::PoolClosed
            | PgError::PoolTimeout { .. }
            | PgError::CommitOutcomeUnknown { .. }
    )
}
