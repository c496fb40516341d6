//! The default storage: one SQLite file (WAL) under the state directory. Reads go through
//! one connection; every write goes through the group-commit writer ([`GroupCommit`]) on a
//! connection of its own, so concurrent writes share transactions and a reader never waits
//! for a commit's `fsync`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, params};
use xagent_profile_im::{CompletedRecord, PendingRecord};
use xagent_protocol_types::{ConnectorChannelId, ConnectorId, MessageId};
use xagent_storage_sqlite::im;

use super::group::{self, CommitTicket, GroupCommit, GroupCommitConfig, Synchronous};
use super::write_op::{
    ChannelRow, ToolCallRow, WriteOp, author_record, prefix_upper_bound, to_i64,
};
use super::{ChannelRecord, Storage, StorageError, ToolCallRecord};

/// The default storage: one SQLite file in WAL mode. Clones share the connections and the
/// writer.
#[derive(Clone)]
pub struct SqliteStorage {
    conn: Arc<Mutex<Connection>>,
    writer: Arc<GroupCommit>,
    path: Option<PathBuf>,
    synchronous: Synchronous,
}

impl std::fmt::Debug for SqliteStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStorage")
            .field("path", &self.path)
            .field("synchronous", &self.synchronous)
            .finish()
    }
}

/// How the SQLite storage commits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Durability of each commit: `Full` (default) survives an OS crash or power loss,
    /// `Normal` only a killed process.
    pub synchronous: Synchronous,
    /// Batching bounds of the group-commit writer.
    pub group_commit: GroupCommitConfig,
}

/// Page cache of the reader connection, in KiB (SQLite's default is 2,000 KiB per
/// connection). The reader serves point reads (the receiver's completed-id lookup on every new
/// `chat.message`, tool-call records, meta) and the loads at startup: the upper levels of the
/// B-trees stay cached, leaves come from the operating system's page cache. The default would
/// fill with `im_completed` leaves as the id set grows and hold 2 MiB per process for nothing.
pub(crate) const READER_CACHE_KIB: i64 = 512;

/// File name of the database inside the state directory.
pub const DATABASE_FILE: &str = "connector.sqlite3";

impl SqliteStorage {
    /// Opens (creating if needed) `<state_dir>/connector.sqlite3` in WAL mode with
    /// `synchronous=FULL` and group commit. The directory is made 0700 and the database 0600
    /// (it holds the URL signing secret; SQLite gives its `-wal` and `-shm` files the
    /// database's mode).
    pub fn open(state_dir: impl AsRef<Path>) -> Result<Self, StorageError> {
        Self::open_with(state_dir, SqliteOptions::default())
    }

    /// [`SqliteStorage::open`] with explicit options (e.g. `synchronous=NORMAL`).
    pub fn open_with(
        state_dir: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<Self, StorageError> {
        let path = xagent_storage_sqlite::private_database(state_dir.as_ref(), DATABASE_FILE)
            .map_err(|e| StorageError::new("create state dir", e))?;
        let reader = group::open_connection(&path, options.synchronous)?;
        reader
            .pragma_update(None, "cache_size", -READER_CACHE_KIB)
            .map_err(|e| StorageError::new("set reader cache size", e))?;
        let writer = group::open_connection(&path, options.synchronous)?;
        let group = GroupCommit::start(Arc::new(Mutex::new(writer)), options.group_commit)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(reader)),
            writer: Arc::new(group),
            path: Some(path),
            synchronous: options.synchronous,
        })
    }

    /// An in-memory database (tests, ephemeral connectors). Its writer shares the one
    /// connection.
    pub fn in_memory() -> Result<Self, StorageError> {
        let mut conn =
            xagent_storage_sqlite::open_in_memory().map_err(|e| StorageError::new("open", e))?;
        group::create_schema(&mut conn)?;
        let conn = Arc::new(Mutex::new(conn));
        let group = GroupCommit::start(conn.clone(), GroupCommitConfig::default())?;
        Ok(Self { conn, writer: Arc::new(group), path: None, synchronous: Synchronous::default() })
    }

    /// The database file, if not in memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The durability setting in force.
    pub fn synchronous(&self) -> Synchronous {
        self.synchronous
    }

    /// The SQLite journal mode in force (`wal` for a file database).
    pub fn journal_mode(&self) -> Result<String, StorageError> {
        query_row(&self.lock(), "PRAGMA journal_mode", [], |row| row.get::<_, String>(0))
            .map_err(|e| StorageError::new("read journal mode", e))
    }

    /// Counters of the group-commit writer (transactions, writes), for tests and benchmarks.
    pub fn group_commit_stats(&self) -> super::GroupCommitStats {
        self.writer.stats()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Runs a statement through SQLite's statement cache: the SQL text is parsed once per
/// connection, not on every call (the tool-call record is written on every `tool.invoke`).
pub(super) fn exec<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// `query_row` through the statement cache.
fn query_row<T, P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
    map: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached(sql)?.query_row(params, map)
}

impl SqliteStorage {
    /// Runs a read on the reader connection off the async runtime's threads (SQLite calls
    /// block; a reader never waits for the writer's commit in WAL mode).
    async fn read<T: Send + 'static>(
        &self,
        operation: &'static str,
        read: impl FnOnce(&Connection) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            read(&conn)
        })
        .await
        .map_err(|e| StorageError::new(operation, e))?
    }
}

#[async_trait::async_trait]
impl Storage for SqliteStorage {
    async fn load_connector_id(&self) -> Result<Option<ConnectorId>, StorageError> {
        self.read("load connector_id", |conn| {
            query_row(conn, "SELECT value FROM meta WHERE key = 'connector_id'", [], |row| {
                row.get::<_, String>(0)
            })
            .optional()
            .map(|value| value.map(ConnectorId::new))
            .map_err(|e| StorageError::new("load connector_id", e))
        })
        .await
    }

    async fn load_channels(&self) -> Result<Vec<ChannelRecord>, StorageError> {
        self.read("load channels", |conn| {
            let failed = |e| StorageError::new("load channels", e);
            let rows = channel_rows(conn).map_err(failed)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row.decode()?);
            }
            Ok(out)
        })
        .await
    }

    async fn load_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
    ) -> Result<Option<ToolCallRecord>, StorageError> {
        let (channel, key) = (channel.as_str().to_owned(), key.to_owned());
        self.read("load tool call", move |conn| {
            let row = query_row(
                conn,
                "SELECT fingerprint, result, error_code, error_message, completed_at
                     FROM tool_calls WHERE channel = ?1 AND key = ?2",
                params![channel, key],
                |row| {
                    Ok(ToolCallRow {
                        fingerprint: row.get(0)?,
                        result: row.get(1)?,
                        error_code: row.get(2)?,
                        error_message: row.get(3)?,
                        completed_at: row.get(4)?,
                    })
                },
            )
            .optional()
            .map_err(|e| StorageError::new("load tool call", e))?;
            row.map(ToolCallRow::decode).transpose()
        })
        .await
    }

    async fn load_meta(&self, key: &str) -> Result<Option<String>, StorageError> {
        let key = key.to_owned();
        self.read("load meta", move |conn| {
            query_row(conn, "SELECT value FROM meta WHERE key = ?1", params![key], |row| {
                row.get::<_, String>(0)
            })
            .optional()
            .map_err(|e| StorageError::new("load meta", e))
        })
        .await
    }

    async fn load_pending(&self) -> Result<Vec<PendingRecord>, StorageError> {
        self.read("load outbox", |conn| {
            im::load_pending(conn).map_err(|e| StorageError::new("load outbox", e))
        })
        .await
    }

    /// A point read on the reader connection: what it sees is committed; a completion still
    /// in the writer's batch is held in memory by the receiver until its commit.
    async fn lookup_completed(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StorageError> {
        let (channel, message_id) = (channel.clone(), message_id.clone());
        self.read("look up a received message", move |conn| {
            im::lookup_completed(conn, &channel, &message_id)
                .map_err(|e| StorageError::new("look up a received message", e))
        })
        .await
    }

    async fn prune_tool_calls(&self, before: u64) -> Result<usize, StorageError> {
        self.read("prune tool calls", move |conn| {
            exec(conn, "DELETE FROM tool_calls WHERE completed_at < ?1", params![to_i64(before)])
                .map_err(|e| StorageError::new("prune tool calls", e))
        })
        .await
    }

    async fn author_get(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let (namespace, key) = (namespace.to_owned(), key.to_owned());
        self.read("read an author record", move |conn| {
            query_row(
                conn,
                "SELECT value FROM author_records WHERE namespace = ?1 AND key = ?2",
                params![namespace, key.as_bytes()],
                |row| row.get::<_, Vec<u8>>(0),
            )
            .optional()
            .map_err(|e| StorageError::new("read an author record", e))
        })
        .await
    }

    async fn author_scan(
        &self,
        namespace: &str,
        scan: &crate::AuthorScan,
    ) -> Result<Vec<crate::AuthorRecord>, StorageError> {
        let (namespace, scan) = (namespace.to_owned(), scan.clone());
        self.read("scan author records", move |conn| {
            let failed = |e| StorageError::new("scan author records", e);
            let upper = prefix_upper_bound(scan.prefix.as_bytes());
            let after = scan.after.as_deref().map(str::as_bytes);
            let sql = if scan.reverse {
                "SELECT key, value FROM author_records WHERE namespace = ?1 AND key >= ?2
                   AND (?3 IS NULL OR key < ?3) AND (?4 IS NULL OR key < ?4)
                 ORDER BY key DESC LIMIT ?5"
            } else {
                "SELECT key, value FROM author_records WHERE namespace = ?1 AND key >= ?2
                   AND (?3 IS NULL OR key < ?3) AND (?4 IS NULL OR key > ?4)
                 ORDER BY key ASC LIMIT ?5"
            };
            let limit = i64::try_from(scan.limit).unwrap_or(i64::MAX);
            let mut stmt = conn.prepare_cached(sql).map_err(failed)?;
            let rows = stmt
                .query_map(params![namespace, scan.prefix.as_bytes(), upper, after, limit], |row| {
                    Ok((row.get::<_, Vec<u8>>(0)?, row.get::<_, Vec<u8>>(1)?))
                })
                .map_err(failed)?;
            let mut out = Vec::new();
            for row in rows {
                let (key, value) = row.map_err(failed)?;
                out.push(author_record(key, value)?);
            }
            Ok(out)
        })
        .await
    }

    async fn author_count(&self, namespace: &str, prefix: &str) -> Result<u64, StorageError> {
        let (namespace, prefix) = (namespace.to_owned(), prefix.to_owned());
        self.read("count author records", move |conn| {
            let upper = prefix_upper_bound(prefix.as_bytes());
            query_row(
                conn,
                "SELECT COUNT(*) FROM author_records WHERE namespace = ?1 AND key >= ?2
                   AND (?3 IS NULL OR key < ?3)",
                params![namespace, prefix.as_bytes(), upper],
                |row| row.get::<_, i64>(0),
            )
            .map(|n| u64::try_from(n).unwrap_or(0))
            .map_err(|e| StorageError::new("count author records", e))
        })
        .await
    }

    fn commit(&self, writes: Vec<WriteOp>) -> CommitTicket {
        self.writer.submit(writes)
    }
}

/// Every channel row as stored, oldest first (the columns [`ChannelRow`] holds).
fn channel_rows(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<ChannelRow>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, connector_id, status, binding, tool_overrides, created_at
         FROM channels ORDER BY created_at, id",
    )?;
    let rows = stmt.query_map([], |row| {
        Ok(ChannelRow {
            id: row.get(0)?,
            connector_id: row.get(1)?,
            status: row.get(2)?,
            binding: row.get(3)?,
            tool_overrides: row.get(4)?,
            created_at: row.get(5)?,
        })
    })?;
    rows.collect()
}

mod export;
pub use export::ExportCounts;

#[cfg(test)]
mod tests;
