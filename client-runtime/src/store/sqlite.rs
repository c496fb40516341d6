//! The default store: SQLite, one file under the state directory, with group commit.
//!
//! Writes go through `xagent-storage-sqlite`'s group commit: one writer thread applies every
//! batch queued at that moment in one transaction (one `fsync` under `synchronous=FULL` for
//! the group), each batch inside its own savepoint: a batch that fails is rolled back alone
//! and its ticket fails; the others commit. Reads share the writer's connection. Several
//! processes may share the file (WAL); the holder lease and the fence check run inside
//! `BEGIN IMMEDIATE` transactions, so a takeover and a fenced batch never interleave.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};
use xagent_profile_im::{CompletedRecord, PendingRecord, StoreError};
use xagent_protocol_types::{ConnectorChannelId, ConnectorId, MessageId};
use xagent_storage_sqlite::{GroupCommit, GroupCommitConfig};
use xagent_storage_sqlite::{Migration, Synchronous, im};

use super::{
    AdmissionSnapshot, CommitError, CommitTicket, Fence, LeaseRequest, LeaseState, META_ADMISSION,
    RememberedChannel, Submitted, XagentStore, XagentWrite, check_rename, ready,
    rename_onto_messages, renewed_lease, taken_lease, to_i64, to_u64,
};

const DATABASE_FILE: &str = "xagent.sqlite3";

/// The component name of the store's own tables in `xagent_schema`.
const COMPONENT: &str = "client-runtime";

/// The store's own tables (step 1 creates them when missing, so a database made before
/// versioning takes it as it is); the IM tables are `xagent-storage-sqlite`'s.
const MIGRATIONS: &[Migration] = &[Migration::new(1, SCHEMA_1)];

const SCHEMA_1: &str = "
CREATE TABLE IF NOT EXISTS channels (
  id TEXT PRIMARY KEY, owner TEXT);
CREATE TABLE IF NOT EXISTS xagent_meta (
  key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS xagent_lease (
  card TEXT PRIMARY KEY, holder TEXT NOT NULL, fencing INTEGER NOT NULL,
  expires_at INTEGER NOT NULL);
";

/// The `xagent_meta` key of the last accepted `connector_id`.
const META_CONNECTOR_ID: &str = "connector_id";

/// One submitted batch: the fence it is written under and its writes.
struct Batch {
    fence: Option<Fence>,
    writes: Vec<XagentWrite>,
}

impl xagent_storage_sqlite::Batch for Batch {
    type Error = CommitError;

    fn apply(&self, conn: &Connection) -> Result<(), CommitError> {
        apply_batch(conn, self.fence.as_ref(), &self.writes)
    }

    fn writes(&self) -> usize {
        self.writes.len()
    }

    fn failed(operation: &'static str, reason: &str) -> CommitError {
        StoreError::new(operation, reason.to_owned()).into()
    }
}

/// The default store: one SQLite file (WAL, synchronous commits) under a state directory
/// readable only by its owner. Clones share one connection and one writer thread.
#[derive(Clone, Debug)]
pub struct SqliteXagentStore {
    conn: Arc<Mutex<Connection>>,
    writer: Arc<GroupCommit<Batch>>,
    path: Option<PathBuf>,
}

fn err(operation: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError::from_source(operation, e)
}

impl SqliteXagentStore {
    /// Opens (creating if needed) `<state_dir>/xagent.sqlite3`. Every commit is synced: an
    /// acknowledged message is on disk before its ack leaves.
    pub fn open(state_dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = xagent_storage_sqlite::private_database(state_dir.as_ref(), DATABASE_FILE)
            .map_err(|e| StoreError::from_source("create state dir", e))?;
        let conn = xagent_storage_sqlite::open(&path, Synchronous::Full)
            .map_err(|e| StoreError::from_source("open", e))?;
        Self::init(conn, Some(path))
    }

    /// An in-memory database (tests).
    pub fn in_memory() -> Result<Self, StoreError> {
        let conn = xagent_storage_sqlite::open_in_memory()
            .map_err(|e| StoreError::from_source("open", e))?;
        Self::init(conn, None)
    }

    fn init(mut conn: Connection, path: Option<PathBuf>) -> Result<Self, StoreError> {
        for (component, steps) in [(COMPONENT, MIGRATIONS), (im::COMPONENT, im::MIGRATIONS)] {
            xagent_storage_sqlite::migrate(&mut conn, component, steps)
                .map_err(|e| StoreError::from_source("migrate the schema", e))?;
        }
        let conn = Arc::new(Mutex::new(conn));
        let writer = GroupCommit::start(conn.clone(), GroupCommitConfig::default())
            .map_err(|e| StoreError::from_source("start the store's writer", e))?;
        Ok(Self { conn, writer: Arc::new(writer), path })
    }

    /// The database file, if not in memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Message ids the receiver completed on a channel (for operators and tests).
    pub fn completed_ids(&self) -> Result<Vec<(ConnectorChannelId, MessageId)>, StoreError> {
        let conn = lock(&self.conn);
        let mut stmt = conn
            .prepare("SELECT channel, message_id FROM im_completed ORDER BY completed_at")
            .map_err(err("completed_ids"))?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    ConnectorChannelId::new(row.get::<_, String>(0)?),
                    MessageId::new(row.get::<_, String>(1)?),
                ))
            })
            .map_err(err("completed_ids"))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(err("completed_ids"))
    }

    /// Runs `read` on the connection.
    fn read<T>(
        &self,
        operation: &'static str,
        read: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        read(&mut lock(&self.conn)).map_err(err(operation))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The fence check (a condition on the lease row, in this transaction), then every write.
fn apply_batch(
    conn: &Connection,
    fence: Option<&Fence>,
    writes: &[XagentWrite],
) -> Result<(), CommitError> {
    if let Some(fence) = fence {
        let held: bool = conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM xagent_lease
                   WHERE card = ?1 AND holder = ?2 AND fencing = ?3)",
            )
            .and_then(|mut stmt| {
                stmt.query_row(
                    params![fence.card.as_str(), fence.holder, to_i64(fence.number)],
                    |row| row.get(0),
                )
            })
            .map_err(err("check the holder lease"))?;
        if !held {
            return Err(CommitError::fenced(fence));
        }
    }
    for write in writes {
        apply(conn, write)?;
    }
    Ok(())
}

fn apply(conn: &Connection, write: &XagentWrite) -> Result<(), StoreError> {
    let exec = |operation: &'static str, sql: &str, params: &[&dyn rusqlite::ToSql]| {
        conn.prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute(params))
            .map(|_| ())
            .map_err(err(operation))
    };
    match write {
        XagentWrite::SaveChannel { channel, owner } => exec(
            "save_channel",
            "INSERT INTO channels (id, owner) VALUES (?1, ?2)
             ON CONFLICT(id) DO UPDATE SET owner = COALESCE(excluded.owner, channels.owner)",
            params![channel.as_str(), owner],
        ),
        XagentWrite::DeleteChannel(channel) => {
            exec("delete_channel", "DELETE FROM channels WHERE id = ?1", params![channel.as_str()])
        }
        XagentWrite::RenameChannel { from, to } => rename(conn, from, to),
        XagentWrite::ConnectorId(id) => exec(
            "save_connector_id",
            "INSERT INTO xagent_meta (key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![META_CONNECTOR_ID, id.as_str()],
        ),
        XagentWrite::Admission(snapshot) => exec(
            "save_admission",
            "INSERT INTO xagent_meta (key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![META_ADMISSION, snapshot.encode()?],
        ),
        XagentWrite::Outbox(write) => {
            im::write_outbox(conn, write).map_err(err("write the outbox"))
        }
        XagentWrite::Idempotency(write) => {
            im::write_idempotency(conn, write).map_err(err("write the idempotency set"))
        }
    }
}

/// The channel row, its pending messages and its completed ids move together (the batch's
/// savepoint undoes all of it on a refusal).
fn rename(
    conn: &Connection,
    from: &ConnectorChannelId,
    to: &ConnectorChannelId,
) -> Result<(), StoreError> {
    let known = |id: &ConnectorChannelId| -> Result<bool, StoreError> {
        conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM channels WHERE id = ?1)")
            .and_then(|mut stmt| stmt.query_row(params![id.as_str()], |row| row.get(0)))
            .map_err(err("rename_channel"))
    };
    check_rename(from, to, known(from)?, known(to)?)?;
    if from == to {
        return Ok(());
    }
    if im::has_messages(conn, to).map_err(err("rename_channel"))? {
        return Err(rename_onto_messages(to));
    }
    conn.execute("UPDATE channels SET id = ?1 WHERE id = ?2", params![to.as_str(), from.as_str()])
        .map_err(err("rename_channel"))?;
    im::rename_channel(conn, from, to).map_err(err("rename_channel"))
}

/// The lease row of a card: (holder, fencing number, expires at).
fn lease_row(conn: &Connection, card: &str) -> rusqlite::Result<Option<(String, u64, u64)>> {
    conn.prepare_cached("SELECT holder, fencing, expires_at FROM xagent_lease WHERE card = ?1")?
        .query_row(params![card], |row| Ok((row.get(0)?, to_u64(row.get(1)?), to_u64(row.get(2)?))))
        .optional()
}

#[async_trait]
impl XagentStore for SqliteXagentStore {
    async fn load_channels(&self) -> Result<Vec<RememberedChannel>, StoreError> {
        self.read("load_channels", |conn| {
            let mut stmt = conn.prepare_cached("SELECT id, owner FROM channels ORDER BY rowid")?;
            let rows = stmt.query_map([], |row| {
                Ok(RememberedChannel {
                    channel: ConnectorChannelId::new(row.get::<_, String>(0)?),
                    owner: row.get(1)?,
                })
            })?;
            rows.collect()
        })
    }

    async fn load_connector_id(&self) -> Result<Option<ConnectorId>, StoreError> {
        self.read("load_connector_id", |conn| {
            conn.prepare_cached("SELECT value FROM xagent_meta WHERE key = ?1")?
                .query_row(params![META_CONNECTOR_ID], |row| row.get::<_, String>(0))
                .optional()
                .map(|id| id.map(ConnectorId::new))
        })
    }

    async fn load_admission(&self) -> Result<Option<AdmissionSnapshot>, StoreError> {
        let stored = self.read("load_admission", |conn| {
            conn.prepare_cached("SELECT value FROM xagent_meta WHERE key = ?1")?
                .query_row(params![META_ADMISSION], |row| row.get::<_, String>(0))
                .optional()
        })?;
        stored.as_deref().map(AdmissionSnapshot::decode).transpose()
    }

    async fn load_pending(&self) -> Result<Vec<PendingRecord>, StoreError> {
        self.read("load_pending", |conn| im::load_pending(conn))
    }

    async fn lookup_completed(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError> {
        let (channel, message_id) = (channel.clone(), message_id.clone());
        self.read("lookup_completed", move |conn| im::lookup_completed(conn, &channel, &message_id))
    }

    fn commit(&self, fence: Option<Fence>, writes: Vec<XagentWrite>) -> CommitTicket {
        if writes.is_empty() && fence.is_none() {
            return ready(Ok(()));
        }
        let (answer, ticket) = Submitted::pair();
        let batch = Batch { fence, writes };
        // The batch is queued now, so commits keep the order of the calls. Waiting for the disk
        // is blocking work: inside a runtime it waits on the blocking pool, which also keeps a
        // paused test clock from jumping ahead while the writer commits.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let committing = self.writer.submit(batch);
                runtime.spawn_blocking(move || answer.answer(committing.wait()));
            }
            Err(_) => self.writer.submit_with(batch, move |result| answer.answer(result)),
        }
        ticket
    }

    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseState, StoreError> {
        self.read("acquire_lease", |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.prepare_cached(
                "INSERT INTO xagent_lease (card, holder, fencing, expires_at) VALUES (?1, ?2, 1, ?3)
                 ON CONFLICT(card) DO UPDATE SET holder = excluded.holder,
                   fencing = xagent_lease.fencing + 1, expires_at = excluded.expires_at
                 WHERE xagent_lease.expires_at <= ?4 OR xagent_lease.holder = ?2",
            )?
            .execute(params![
                request.card.as_str(),
                request.holder,
                to_i64(request.expires_at()),
                to_i64(request.now)
            ])?;
            let row = lease_row(&tx, request.card.as_str())?;
            tx.commit()?;
            Ok(row)
        })
        .and_then(|row| taken_lease(request, row))
    }

    async fn renew_lease(
        &self,
        fence: &Fence,
        now: u64,
        ttl_ms: u64,
    ) -> Result<LeaseState, StoreError> {
        self.read("renew_lease", |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.prepare_cached(
                "UPDATE xagent_lease SET expires_at = ?4
                 WHERE card = ?1 AND holder = ?2 AND fencing = ?3",
            )?
            .execute(params![
                fence.card.as_str(),
                fence.holder,
                to_i64(fence.number),
                to_i64(now.saturating_add(ttl_ms))
            ])?;
            let row = lease_row(&tx, fence.card.as_str())?;
            tx.commit()?;
            Ok(renewed_lease(fence, row))
        })
    }

    async fn release_lease(&self, fence: &Fence) -> Result<(), StoreError> {
        self.read("release_lease", |conn| {
            conn.prepare_cached(
                "UPDATE xagent_lease SET expires_at = 0
                 WHERE card = ?1 AND holder = ?2 AND fencing = ?3",
            )?
            .execute(params![fence.card.as_str(), fence.holder, to_i64(fence.number)])
            .map(|_| ())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel(id: &str) -> XagentWrite {
        XagentWrite::SaveChannel { channel: ConnectorChannelId::new(id), owner: None }
    }

    /// A batch the store refuses: a channel, then the rename of a channel it does not know.
    fn refused_batch() -> Vec<XagentWrite> {
        let rename = XagentWrite::RenameChannel {
            from: ConnectorChannelId::new("cch_404"),
            to: ConnectorChannelId::new("cch_5"),
        };
        vec![channel("cch_2"), rename]
    }

    /// The ids of the remembered channels, in order.
    async fn channel_ids(store: &SqliteXagentStore) -> Vec<String> {
        let channels = store.load_channels().await.expect("loads");
        channels.into_iter().map(|c| c.channel.as_str().to_owned()).collect()
    }

    #[tokio::test]
    async fn durable_state_rule_the_state_directory_is_readable_only_by_its_owner() {
        let dir = std::env::temp_dir().join(format!("xagent-store-{}", rand::random::<u64>()));
        let store = SqliteXagentStore::open(&dir).expect("opens");
        store
            .commit(
                None,
                vec![XagentWrite::SaveChannel {
                    channel: ConnectorChannelId::new("cch_1"),
                    owner: None,
                }],
            )
            .await
            .expect("commits");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "state readable only by its owner");
        }
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn durable_state_rule_a_refused_batch_fails_alone() {
        let store = SqliteXagentStore::in_memory().expect("opens");
        // Three batches, the middle one refused: it leaves nothing, the other two commit.
        let first = store.commit(None, vec![channel("cch_1")]);
        let refused = store.commit(None, refused_batch());
        let third = store.commit(None, vec![channel("cch_3")]);
        first.await.expect("first commits");
        assert!(refused.await.is_err(), "the rename of an unknown channel is refused");
        third.await.expect("third commits");
        assert_eq!(channel_ids(&store).await, ["cch_1", "cch_3"], "the refused batch left nothing");
    }

    #[tokio::test]
    async fn durable_state_rule_batches_queued_while_the_connection_is_busy_commit_together() {
        let store = SqliteXagentStore::in_memory().expect("opens");
        // Three batches queued while a reader holds the connection, the middle one refused:
        // the writer commits the others and fails only the refused one.
        let (first, refused, third) = {
            let _busy = lock(&store.conn);
            (
                store.commit(None, vec![channel("cch_1")]),
                store.commit(None, refused_batch()),
                store.commit(None, vec![channel("cch_3")]),
            )
        };
        first.await.expect("first commits");
        assert!(refused.await.is_err());
        third.await.expect("third commits");
        assert_eq!(channel_ids(&store).await, ["cch_1", "cch_3"]);
        let stats = store.writer.stats();
        assert_eq!(stats.jobs, 3);
        assert!(
            stats.transactions <= 2,
            "the batches queued behind the first share one: {stats:?}"
        );
    }
}
