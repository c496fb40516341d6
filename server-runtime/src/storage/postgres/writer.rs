//! Group commit on PostgreSQL: one writer task takes every submission from a queue, runs what
//! is queued as one transaction and resolves each ticket only after `COMMIT` returned.
//!
//! The fast path sends a batch's statements pipelined (all of them on the wire before the
//! first answer, in submission order) inside one transaction. PostgreSQL aborts a whole
//! transaction at the first failing statement, so when one fails the writer rolls the batch
//! back and runs it again one submission per savepoint: the failing submission is rolled back
//! alone and reported failed, the others commit (the same outcome as the SQLite writer's).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_postgres::Transaction;
use futures_util::future::{MaybeDone, join_all, maybe_done};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;
use xagent_profile_im::{IdempotencyWrite, OutboxWrite};
use xagent_storage_postgres::{PgError, Pool};

use crate::storage::group::{CommitTicket, GroupCommitConfig, GroupCommitStats};
use crate::storage::write_op::to_i64;
use crate::storage::{StorageError, WriteOp};

/// One submission: its writes and where to report the outcome.
struct Job {
    ops: Vec<WriteOp>,
    done: oneshot::Sender<Result<(), StorageError>>,
}

#[derive(Default)]
pub(super) struct Counters {
    transactions: AtomicU64,
    jobs: AtomicU64,
    writes: AtomicU64,
}

impl Counters {
    pub(super) fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            transactions: self.transactions.load(Ordering::Relaxed),
            jobs: self.jobs.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
        }
    }
}

/// The submitting side of the writer task; the task ends (after committing what is queued)
/// when the last clone of the storage drops it.
pub(super) struct Writer {
    queue: mpsc::UnboundedSender<Job>,
    pub(super) counters: Arc<Counters>,
}

impl Writer {
    /// Starts the writer task on the current tokio runtime.
    pub(super) fn start(pool: Pool, config: GroupCommitConfig) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        tokio::spawn(run(pool, rx, config, Arc::clone(&counters)));
        Self { queue, counters }
    }

    /// Queues writes (applied in order, all or none); the ticket resolves after their
    /// transaction committed, or with the error that kept it from committing.
    pub(super) fn submit(&self, ops: Vec<WriteOp>) -> CommitTicket {
        if ops.is_empty() {
            return CommitTicket::ready(Ok(()));
        }
        let (done, ticket) = CommitTicket::pending();
        if let Err(refused) = self.queue.send(Job { ops, done }) {
            let _ = refused.0.done.send(Err(writer_gone()));
        }
        ticket
    }
}

fn writer_gone() -> StorageError {
    StorageError::new("group commit", "the storage writer stopped before committing this write")
}

async fn run(
    pool: Pool,
    mut rx: mpsc::UnboundedReceiver<Job>,
    config: GroupCommitConfig,
    counters: Arc<Counters>,
) {
    let max_batch = config.max_batch.max(1);
    let mut last_batch = 0usize;
    #[cfg(test)]
    let mut batches = 0u64;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // As on SQLite: wait a little for about as many again only when the previous
        // transaction carried several submissions; one writer alone never waits.
        let want = last_batch.min(max_batch);
        if last_batch > 1 && batch.len() < want && !config.max_wait.is_zero() {
            let deadline = tokio::time::Instant::now() + config.max_wait;
            while batch.len() < want {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(job)) => batch.push(job),
                    Ok(None) | Err(_) => break,
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
        let results = commit_batch(&pool, &batch, crash).await;
        counters.transactions.fetch_add(1, Ordering::Relaxed);
        counters.jobs.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let writes: usize = batch.iter().map(|j| j.ops.len()).sum();
        counters.writes.fetch_add(writes as u64, Ordering::Relaxed);
        // Only now, after COMMIT returned, does anyone hear about the batch.
        for (job, result) in batch.into_iter().zip(results) {
            let _ = job.done.send(result);
        }
    }
}

/// Commits the batch: pipelined in one transaction, or, when a statement fails, again one
/// submission per savepoint. One result per job; all errors when nothing could commit.
/// `crash` (a test hook) aborts the process after the statements ran, before `COMMIT`.
async fn commit_batch(pool: &Pool, batch: &[Job], crash: bool) -> Vec<Result<(), StorageError>> {
    let all_failed = |operation: &'static str, reason: String| -> Vec<Result<(), StorageError>> {
        batch.iter().map(|_| Err(StorageError::new(operation, reason.as_str()))).collect()
    };
    // A write a backend refuses by rule fails alone, before any statement runs.
    let checked: Vec<Result<(), StorageError>> =
        batch.iter().map(|job| job.ops.iter().try_for_each(WriteOp::check)).collect();
    // The pool bounds the wait (its wait timeout) and names the server, never the password.
    let mut client = match pool.get().await {
        Ok(client) => client,
        Err(e) => return all_failed("get a database connection", e.to_string()),
    };
    let tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => return all_failed("begin a transaction", pool.error("begin", &e).to_string()),
    };
    let statements = match prepare(&tx, batch).await {
        Ok(statements) => statements,
        Err(e) => return all_failed("prepare the writes", pool.error("prepare", &e).to_string()),
    };
    let runnable: Vec<&WriteOp> = batch
        .iter()
        .zip(&checked)
        .filter(|(_, check)| check.is_ok())
        .flat_map(|(job, _)| job.ops.iter())
        .collect();
    if pipelined(&tx, &statements, &runnable).await.is_ok() {
        if crash {
            // Statements executed, transaction not committed: what a crash here leaves behind.
            std::process::abort();
        }
        return match tx.commit().await {
            Ok(()) => checked,
            Err(e) => all_failed("commit", commit_error(pool, &e).to_string()),
        };
    }
    // Some statement failed and PostgreSQL aborted the transaction: start again with one
    // savepoint per submission.
    if let Err(e) = tx.rollback().await {
        return all_failed("roll back a failed batch", pool.error("rollback", &e).to_string());
    }
    let mut tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => return all_failed("begin a transaction", pool.error("begin", &e).to_string()),
    };
    let mut results = Vec::with_capacity(batch.len());
    for (job, check) in batch.iter().zip(checked) {
        if check.is_err() {
            results.push(check);
            continue;
        }
        results.push(in_savepoint(pool, &mut tx, &statements, &job.ops).await);
    }
    match tx.commit().await {
        Ok(()) => results,
        Err(e) => all_failed("commit", commit_error(pool, &e).to_string()),
    }
}

/// A failed `COMMIT`: refused by the server (nothing committed), or the connection broke and
/// the outcome is unknown. Either way no ticket of the batch is acknowledged.
fn commit_error(pool: &Pool, e: &tokio_postgres::Error) -> PgError {
    if e.is_closed() || e.as_db_error().is_none() {
        PgError::CommitOutcomeUnknown { context: "a batch of runtime writes".into() }
    } else {
        pool.error("commit a batch of runtime writes", e)
    }
}

/// Runs one submission's writes in a savepoint of `tx`; rolls them back on failure.
async fn in_savepoint(
    pool: &Pool,
    tx: &mut Transaction<'_>,
    statements: &HashMap<&'static str, Statement>,
    ops: &[WriteOp],
) -> Result<(), StorageError> {
    let savepoint = tx
        .savepoint("job")
        .await
        .map_err(|e| StorageError::new("open a savepoint", pool.error("savepoint", &e)))?;
    let mut outcome = Ok(());
    for op in ops {
        if let Err(e) = execute(&savepoint, statements, op).await {
            outcome = Err(StorageError::new("write", pool.error(format!("{op:?}"), &e)));
            break;
        }
    }
    match outcome {
        Ok(()) => savepoint
            .commit()
            .await
            .map_err(|e| StorageError::new("release a savepoint", pool.error("release", &e))),
        Err(error) => {
            // Dropping the savepoint would roll it back too, but without an answer to wait for.
            let _ = savepoint.rollback().await;
            Err(error)
        }
    }
}

/// Prepares (through the connection's statement cache) every statement the batch uses, so
/// the pipelined executions that follow go out in order without a round trip in between.
async fn prepare(
    tx: &Transaction<'_>,
    batch: &[Job],
) -> Result<HashMap<&'static str, Statement>, tokio_postgres::Error> {
    let mut statements = HashMap::new();
    for op in batch.iter().flat_map(|job| job.ops.iter()) {
        let sql = sql_of(op);
        if !statements.contains_key(sql) {
            statements.insert(sql, tx.prepare_cached(sql).await?);
        }
    }
    Ok(statements)
}

type Execution<'a> = Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send + 'a>>;

/// Sends every write before reading the first answer. Each execution writes its request on
/// its first poll, so polling them once in order puts them on the wire in submission order;
/// PostgreSQL runs them in that order.
async fn pipelined(
    tx: &Transaction<'_>,
    statements: &HashMap<&'static str, Statement>,
    ops: &[&WriteOp],
) -> Result<(), tokio_postgres::Error> {
    let mut executions: Vec<Pin<Box<MaybeDone<Execution<'_>>>>> = ops
        .iter()
        .map(|op| Box::pin(maybe_done(Box::pin(execute(tx, statements, op)) as Execution<'_>)))
        .collect();
    std::future::poll_fn(|cx| {
        for execution in &mut executions {
            let _ = execution.as_mut().poll(cx);
        }
        std::task::Poll::Ready(())
    })
    .await;
    join_all(executions.iter_mut().map(|e| e.as_mut())).await;
    for execution in &mut executions {
        if let Some(Err(e)) = execution.as_mut().take_output() {
            return Err(e);
        }
    }
    Ok(())
}

const TOOL_CALL: &str = "INSERT INTO server_tool_calls
   (channel, key, fingerprint, result, error_code, error_message, completed_at)
 VALUES ($1, $2, $3, $4, $5, $6, $7)
 ON CONFLICT (channel, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
   result = EXCLUDED.result, error_code = EXCLUDED.error_code,
   error_message = EXCLUDED.error_message, completed_at = EXCLUDED.completed_at";
const CHANNEL: &str = "INSERT INTO server_channels
   (id, connector_id, status, binding, tool_overrides, created_at)
 VALUES ($1, $2, $3, $4, $5, $6)
 ON CONFLICT (id) DO UPDATE SET connector_id = EXCLUDED.connector_id,
   status = EXCLUDED.status, binding = EXCLUDED.binding,
   tool_overrides = EXCLUDED.tool_overrides";
/// One statement deletes the channel and everything kept for it.
const DELETE_CHANNEL: &str = "WITH calls AS (DELETE FROM server_tool_calls WHERE channel = $1),
   pending AS (DELETE FROM server_im_pending WHERE channel = $1),
   completed AS (DELETE FROM server_im_completed WHERE channel = $1)
 DELETE FROM server_channels WHERE id = $1";
const META_SET: &str = "INSERT INTO server_meta (key, value) VALUES ($1, $2)
 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value";
const META_DELETE: &str = "DELETE FROM server_meta WHERE key = $1";
const PRUNE_TOOL_CALLS: &str = "DELETE FROM server_tool_calls WHERE completed_at < $1";
const PENDING_SAVE: &str = "INSERT INTO server_im_pending (channel, message_id, seq, payload,
   attempts, first_responsibility_at, expires_at, next_attempt_at, last_error)
 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
 ON CONFLICT (channel, message_id) DO UPDATE SET seq = EXCLUDED.seq,
   payload = EXCLUDED.payload, attempts = EXCLUDED.attempts,
   first_responsibility_at = EXCLUDED.first_responsibility_at,
   expires_at = EXCLUDED.expires_at, next_attempt_at = EXCLUDED.next_attempt_at,
   last_error = EXCLUDED.last_error";
const PENDING_ATTEMPT: &str = "UPDATE server_im_pending
 SET attempts = $1, next_attempt_at = $2, last_error = $3
 WHERE channel = $4 AND message_id = $5";
const PENDING_DELETE: &str = "DELETE FROM server_im_pending WHERE channel = $1 AND message_id = $2";
/// A replaced id counts as newly inserted (SQLite's `INSERT OR REPLACE` gives it a new rowid).
const COMPLETED_SAVE: &str = "INSERT INTO server_im_completed
   (channel, message_id, fingerprint, completed_at) VALUES ($1, $2, $3, $4)
 ON CONFLICT (channel, message_id) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
   completed_at = EXCLUDED.completed_at, inserted = nextval('server_im_completed_order')";
const COMPLETED_DELETE: &str =
    "DELETE FROM server_im_completed WHERE channel = $1 AND message_id = $2";
/// Keeps the channel's `$2` most recently completed ids, ties broken by insertion.
const COMPLETED_TRIM: &str = "DELETE FROM server_im_completed WHERE channel = $1
 AND message_id NOT IN (SELECT message_id FROM server_im_completed WHERE channel = $1
   ORDER BY completed_at DESC, inserted DESC LIMIT $2)";
const COMPLETED_EXPIRE: &str = "DELETE FROM server_im_completed WHERE completed_at < $1";
const AUTHOR_PUT: &str = "INSERT INTO server_author_records (namespace, key, value)
 VALUES ($1, $2, $3) ON CONFLICT (namespace, key) DO UPDATE SET value = EXCLUDED.value";
const AUTHOR_DELETE: &str = "DELETE FROM server_author_records WHERE namespace = $1 AND key = $2";
/// Keys are `BYTEA`, so the prefix is one byte range (as on SQLite).
const AUTHOR_DELETE_PREFIX: &str = "DELETE FROM server_author_records
 WHERE namespace = $1 AND key >= $2 AND ($3::BYTEA IS NULL OR key < $3)";

/// Raises `fenced` (SQLSTATE `XAF01`) unless the data-plane lease still carries the number;
/// the row lock orders it against a take-over (schema migration 3).
const FENCE: &str = "SELECT server_check_fence($1)";
/// The wake-up, delivered to listening replicas when the transaction commits.
const NOTIFY: &str = "SELECT pg_notify('xagent_server', $1)";

/// The statement that carries `op`.
fn sql_of(op: &WriteOp) -> &'static str {
    match op {
        WriteOp::Outbox(OutboxWrite::Save(_)) => PENDING_SAVE,
        WriteOp::Outbox(OutboxWrite::Attempt(_)) => PENDING_ATTEMPT,
        WriteOp::Outbox(OutboxWrite::Delete(..)) => PENDING_DELETE,
        WriteOp::Idempotency(IdempotencyWrite::Save(_)) => COMPLETED_SAVE,
        WriteOp::Idempotency(IdempotencyWrite::Delete(..)) => COMPLETED_DELETE,
        WriteOp::Idempotency(IdempotencyWrite::Trim { .. }) => COMPLETED_TRIM,
        WriteOp::Idempotency(IdempotencyWrite::Expire { .. }) => COMPLETED_EXPIRE,
        WriteOp::ToolCall { .. } => TOOL_CALL,
        WriteOp::Channel { .. } => CHANNEL,
        WriteOp::DeleteChannel(_) => DELETE_CHANNEL,
        WriteOp::Meta { value: Some(_), .. } => META_SET,
        WriteOp::Meta { value: None, .. } => META_DELETE,
        WriteOp::PruneToolCalls { .. } => PRUNE_TOOL_CALLS,
        WriteOp::AuthorPut { .. } => AUTHOR_PUT,
        WriteOp::AuthorDelete { .. } => AUTHOR_DELETE,
        WriteOp::AuthorDeletePrefix { .. } => AUTHOR_DELETE_PREFIX,
        WriteOp::Fence(_) => FENCE,
        WriteOp::Notify(_) => NOTIFY,
    }
}

type Param = Box<dyn ToSql + Sync + Send>;

fn text(value: &str) -> Param {
    Box::new(value.to_owned())
}

fn opt_text(value: Option<&str>) -> Param {
    Box::new(value.map(str::to_owned))
}

/// Free text as UTF-8 bytes (a `BYTEA` column: PostgreSQL's `TEXT` cannot hold a NUL).
fn opt_bytes(value: Option<&str>) -> Param {
    Box::new(value.map(|v| v.as_bytes().to_vec()))
}

fn int(value: u64) -> Param {
    Box::new(to_i64(value))
}

/// The parameters of `op`'s statement, in order.
fn params_of(op: &WriteOp) -> Vec<Param> {
    match op {
        WriteOp::Outbox(OutboxWrite::Save(r)) => vec![
            text(r.channel.as_str()),
            text(r.message_id.as_str()),
            int(r.seq),
            text(&r.payload),
            int(u64::from(r.attempts)),
            int(r.first_responsibility_at),
            int(r.expires_at),
            int(r.next_attempt_at),
            opt_bytes(r.last_error.as_deref()),
        ],
        WriteOp::Outbox(OutboxWrite::Attempt(a)) => vec![
            int(u64::from(a.attempts)),
            int(a.next_attempt_at),
            opt_bytes(a.last_error.as_deref()),
            text(a.channel.as_str()),
            text(a.message_id.as_str()),
        ],
        WriteOp::Outbox(OutboxWrite::Delete(channel, message_id))
        | WriteOp::Idempotency(IdempotencyWrite::Delete(channel, message_id)) => {
            vec![text(channel.as_str()), text(message_id.as_str())]
        }
        WriteOp::Idempotency(IdempotencyWrite::Save(r)) => vec![
            text(r.channel.as_str()),
            text(r.message_id.as_str()),
            text(r.fingerprint.as_str()),
            int(r.completed_at),
        ],
        WriteOp::Idempotency(IdempotencyWrite::Trim { channel, keep }) => {
            vec![text(channel.as_str()), int(*keep as u64)]
        }
        WriteOp::Idempotency(IdempotencyWrite::Expire { before }) => vec![int(*before)],
        WriteOp::ToolCall { channel, key, fingerprint, result, error, completed_at } => vec![
            text(channel),
            text(key),
            text(fingerprint),
            opt_text(result.as_deref()),
            opt_text(error.as_ref().map(|(code, _)| code.as_str())),
            opt_bytes(error.as_ref().map(|(_, message)| message.as_str())),
            Box::new(*completed_at),
        ],
        WriteOp::Channel { id, connector_id, status, binding, tool_overrides, created_at } => vec![
            text(id),
            text(connector_id),
            text(status),
            opt_text(binding.as_deref()),
            text(tool_overrides),
            Box::new(*created_at),
        ],
        WriteOp::DeleteChannel(id) => vec![text(id)],
        WriteOp::Meta { key, value: Some(value) } => vec![text(key), text(value)],
        WriteOp::Meta { key, value: None } => vec![text(key)],
        WriteOp::PruneToolCalls { before } => vec![Box::new(*before)],
        WriteOp::AuthorPut { namespace, key, value } => {
            vec![text(namespace), Box::new(key.as_bytes().to_vec()), Box::new(value.clone())]
        }
        WriteOp::AuthorDelete { namespace, key } => {
            vec![text(namespace), Box::new(key.as_bytes().to_vec())]
        }
        WriteOp::AuthorDeletePrefix { namespace, prefix } => vec![
            text(namespace),
            Box::new(prefix.as_bytes().to_vec()),
            Box::new(super::super::write_op::prefix_upper_bound(prefix.as_bytes())),
        ],
        WriteOp::Fence(fence) => vec![int(*fence)],
        WriteOp::Notify(payload) => vec![text(payload)],
    }
}

/// Executes one write with its prepared statement.
async fn execute(
    client: &tokio_postgres::Transaction<'_>,
    statements: &HashMap<&'static str, Statement>,
    op: &WriteOp,
) -> Result<u64, tokio_postgres::Error> {
    let params = params_of(op);
    let refs: Vec<&(dyn ToSql + Sync)> =
        params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
    match statements.get(sql_of(op)) {
        Some(statement) => client.execute(statement, &refs).await,
        // Every statement of the batch was prepared; this only runs the text if not.
        None => client.execute(sql_of(op), &refs).await,
    }
}
