//! Group commit for the SQLite storage: durable writes from many callers (tool-call records,
//! outbox inserts, attempt counts and removals, receiver idempotency, channel records) are
//! queued to `xagent-storage-sqlite`'s writer thread, which commits whatever is queued as one
//! transaction and only then tells each caller that its write is durable.
//!
//! The promise does not weaken with batching: a caller hears `Ok` only after the `COMMIT` of
//! the transaction holding its write returned, so anything the runtime acknowledges on the
//! strength of that `Ok` (a `tool.invoke` result, an enqueued message, an `accepted` ack) is
//! on disk (see the test `crash_between_batching_and_commit_acknowledges_nothing`). Batching
//! bounds: [`GroupCommitConfig`]; durability: [`Synchronous`].

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;
use xagent_storage_sqlite::{Batch, Migration, im};
pub use xagent_storage_sqlite::{GroupCommitConfig, GroupCommitStats, Synchronous};

use super::StorageError;
use super::write_op::{WriteOp, execute};

/// The component name of the runtime's own tables in `xagent_schema`.
const COMPONENT: &str = "server-runtime";

/// The runtime's own tables (step 1 creates them when missing, so a database made before
/// versioning takes it as it is); the IM tables are `xagent-storage-sqlite`'s.
const MIGRATIONS: &[Migration] = &[Migration::new(
    1,
    "
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
",
)];

/// Opens (creating if needed) the private SQLite file at `path` with the given durability
/// (`xagent-storage-sqlite`'s settings) and brings its tables up to date.
pub(crate) fn open_connection(
    path: &Path,
    synchronous: Synchronous,
) -> Result<Connection, StorageError> {
    let mut conn =
        xagent_storage_sqlite::open(path, synchronous).map_err(|e| StorageError::new("open", e))?;
    create_schema(&mut conn)?;
    Ok(conn)
}

/// Brings every table of the runtime's database up to date: its own and the IM stores'.
pub(crate) fn create_schema(conn: &mut Connection) -> Result<(), StorageError> {
    let migrate = |conn: &mut Connection, component, steps| {
        xagent_storage_sqlite::migrate(conn, component, steps)
            .map_err(|e| StorageError::new("migrate the schema", e))
    };
    migrate(conn, COMPONENT, MIGRATIONS)?;
    migrate(conn, im::COMPONENT, im::MIGRATIONS)?;
    Ok(())
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

/// One caller's writes, applied in order, all or none.
struct Ops(Vec<WriteOp>);

impl Batch for Ops {
    type Error = StorageError;

    fn apply(&self, conn: &Connection) -> Result<(), StorageError> {
        self.0
            .iter()
            .try_for_each(|op| execute(conn, op))
            .map_err(|e| StorageError::new("write", e))
    }

    fn writes(&self) -> usize {
        self.0.len()
    }

    fn single_statement(&self) -> bool {
        self.0.len() == 1
    }

    fn failed(operation: &'static str, reason: &str) -> StorageError {
        StorageError::new(operation, reason)
    }

    fn committed(batches: usize, took: Duration) {
        crate::metrics::metrics().committed(batches, took);
    }
}

/// The writer: one thread that owns the write connection and commits batches.
#[derive(Debug)]
pub struct GroupCommit(xagent_storage_sqlite::GroupCommit<Ops>);

impl GroupCommit {
    /// Starts the writer thread over `conn` (for a file database a connection of its own, so
    /// readers on other connections never wait for a commit's `fsync`; for an in-memory
    /// database the one shared connection).
    pub fn start(
        conn: Arc<Mutex<Connection>>,
        config: GroupCommitConfig,
    ) -> Result<Self, StorageError> {
        xagent_storage_sqlite::GroupCommit::start(conn, config)
            .map(Self)
            .map_err(|e| StorageError::new("start the storage writer", e))
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
        } else {
            self.0.submit_with(Ops(ops), done);
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
        if ops.is_empty() {
            return Ok(());
        }
        self.0.write_blocking(Ops(ops))
    }

    /// Counters so far.
    pub fn stats(&self) -> GroupCommitStats {
        self.0.stats()
    }

    /// Commits what is queued, stops the writer and waits for it (it closes its connection).
    /// Later submissions fail.
    pub fn shutdown(&self) {
        self.0.shutdown();
    }
}

#[cfg(test)]
mod tests;
