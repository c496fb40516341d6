//! Group commit on PostgreSQL: the runtime's writes go through the shared writer of
//! `xagent-storage-postgres` ([`GroupCommit`]), which takes every submission from a queue,
//! runs what is queued as one transaction on one long-lived connection and resolves each
//! ticket only after `COMMIT` returned. This module is its apply step: the runtime's SQL.
//!
//! The fast path sends a batch's statements pipelined (all of them on the wire before the
//! first answer, in submission order) inside one transaction. PostgreSQL aborts a whole
//! transaction at the first failing statement, so when one fails the writer rolls the batch
//! back and runs it again one submission per savepoint: the failing submission is rolled back
//! alone and reported failed, the others commit (the same outcome as the SQLite writer's). A
//! write a backend refuses by rule ([`WriteOp::check`]) fails the same way, before any of its
//! submission's statements run.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_postgres::Transaction;
use futures_util::future::{MaybeDone, join_all, maybe_done};
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;
use xagent_profile_im::{IdempotencyWrite, OutboxWrite};
use xagent_storage_postgres::{ApplyWrites, GroupCommit, PgError, Pool};

use crate::storage::group::{CommitTicket, GroupCommitConfig, GroupCommitStats};
use crate::storage::write_op::to_i64;
use crate::storage::{StorageError, WriteOp};

/// The submitting side of the writer task; the task ends (after committing what is queued)
/// when the last clone of the storage drops it.
pub(super) struct Writer(GroupCommit<WriteOp>);

impl Writer {
    /// Starts the writer task on the current tokio runtime.
    pub(super) fn start(pool: Pool, config: GroupCommitConfig) -> Self {
        let bounds = xagent_storage_postgres::GroupCommitConfig::default()
            .with_max_wait(config.max_wait)
            .with_max_batch(config.max_batch);
        let apply = RuntimeWrites {
            pool: pool.clone(),
            #[cfg(test)]
            crash_before_commit_of_batch: config.crash_before_commit_of_batch,
            #[cfg(test)]
            batches: AtomicU64::new(0),
        };
        Self(GroupCommit::start(pool, apply, bounds))
    }

    /// Queues writes (applied in order, all or none); the ticket resolves after their
    /// transaction committed, or with the error that kept it from committing.
    pub(super) fn submit(&self, ops: Vec<WriteOp>) -> CommitTicket {
        if ops.is_empty() {
            return CommitTicket::ready(Ok(()));
        }
        let (done, ticket) = CommitTicket::pending();
        self.0.submit_with(ops, move |result| {
            // The caller may have stopped waiting; the writes are committed all the same.
            let _ = done.send(result.map_err(|e| StorageError::new("group commit", e)));
        });
        ticket
    }

    /// Transactions, submissions and writes so far.
    pub(super) fn stats(&self) -> GroupCommitStats {
        let stats = self.0.stats();
        GroupCommitStats {
            transactions: stats.transactions,
            jobs: stats.submissions,
            writes: stats.writes,
        }
    }
}

/// The runtime's apply step: checks, prepares and runs [`WriteOp`]s in the writer's
/// transaction.
struct RuntimeWrites {
    /// Names the server in errors, never the password.
    pool: Pool,
    /// Test hook: abort the process after this many fast-path batches ran their statements,
    /// before `COMMIT`.
    #[cfg(test)]
    crash_before_commit_of_batch: Option<u64>,
    #[cfg(test)]
    batches: AtomicU64,
}

#[async_trait::async_trait]
impl ApplyWrites<WriteOp> for RuntimeWrites {
    fn committed(&self, submissions: usize, took: std::time::Duration) {
        crate::metrics::metrics().committed(submissions, took);
    }

    async fn apply(&self, tx: &Transaction<'_>, writes: &[WriteOp]) -> Result<(), PgError> {
        // A write refused by rule fails its submission before any statement runs (the writer
        // then retries the batch one submission per savepoint, so it fails alone).
        for op in writes {
            op.check().map_err(|e| PgError::apply("check a runtime write", e.to_string()))?;
        }
        let statements =
            prepare(tx, writes).await.map_err(|e| self.pool.error("prepare the writes", &e))?;
        let ops: Vec<&WriteOp> = writes.iter().collect();
        pipelined(tx, &statements, &ops)
            .await
            .map_err(|e| self.pool.error("a runtime write", &e))?;
        #[cfg(test)]
        {
            let batch = self.batches.fetch_add(1, Ordering::Relaxed) + 1;
            if self.crash_before_commit_of_batch == Some(batch) {
                // Statements executed, transaction not committed: what a crash here leaves.
                std::process::abort();
            }
        }
        Ok(())
    }
}

/// Prepares (through the connection's statement cache) every statement the batch uses, so
/// the pipelined executions that follow go out in order without a round trip in between.
async fn prepare(
    tx: &Transaction<'_>,
    writes: &[WriteOp],
) -> Result<HashMap<&'static str, Statement>, tokio_postgres::Error> {
    let mut statements = HashMap::new();
    for op in writes {
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
const NOTIFY: &str = "SELECT pg_notify($1, $2)";

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
        WriteOp::Notify(payload) => vec![text(super::schema::NOTIFY_CHANNEL), text(payload)],
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
