//! The default storage: one SQLite file (WAL) under the state directory. Reads go through
//! one connection; every write goes through the group-commit writer ([`GroupCommit`]) on a
//! connection of its own, so concurrent writes share transactions and a reader never waits
//! for a commit's `fsync`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, params};
use xagent_profile_im::{IdempotencyStore, IdempotencyWrite, OutboxStore, OutboxWrite};
use xagent_protocol_types::{
    ConnectionStatus, ConnectorChannelId, ConnectorId, DescriptorTarget, DescriptorTool, Secret,
    TargetType,
};

use super::group::{self, CommitTicket, GroupCommit, GroupCommitConfig, Synchronous};
use super::write_op::WriteOp;
use super::{ChannelRecord, Storage, StorageError, ToolCallRecord};
use crate::binding::Binding;

/// The default storage: one SQLite file in WAL mode. Clones share the connections and the
/// writer.
#[derive(Clone)]
pub struct SqliteStorage {
    conn: Arc<Mutex<Connection>>,
    writer: Arc<Writer>,
    path: Option<PathBuf>,
    synchronous: Synchronous,
}

/// Stops the writer thread (after it committed what is queued) when the last clone goes.
struct Writer(GroupCommit);

impl Drop for Writer {
    fn drop(&mut self) {
        self.0.shutdown();
    }
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

/// Creates `dir` 0700 and the SQLite `database` 0600 before SQLite opens it, and tightens both
/// (and the WAL files) when an earlier version left them readable by others (M6). Public so a
/// Connector keeping its own database (im.webchat) gets the same protection from one place.
pub fn private_database_files(dir: &Path, database: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        builder.mode(0o700);
        builder.create(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(database)?;
        for suffix in ["", "-wal", "-shm"] {
            let mut name = database.as_os_str().to_owned();
            name.push(suffix);
            let path = std::path::PathBuf::from(name);
            if path.exists() {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            }
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        let _ = database;
        builder.create(dir)
    }
}

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
        let dir = state_dir.as_ref();
        let path = dir.join(DATABASE_FILE);
        private_database_files(dir, &path).map_err(|e| StorageError::new("create state dir", e))?;
        let reader = group::open_connection(&path, options.synchronous)?;
        reader
            .pragma_update(None, "cache_size", -READER_CACHE_KIB)
            .map_err(|e| StorageError::new("set reader cache size", e))?;
        let writer = group::open_connection(&path, options.synchronous)?;
        let group = GroupCommit::start(Arc::new(Mutex::new(writer)), options.group_commit)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(reader)),
            writer: Arc::new(Writer(group)),
            path: Some(path),
            synchronous: options.synchronous,
        })
    }

    /// An in-memory database (tests, ephemeral connectors). Its writer shares the one
    /// connection.
    pub fn in_memory() -> Result<Self, StorageError> {
        let conn = Connection::open_in_memory().map_err(|e| StorageError::new("open", e))?;
        group::create_schema(&conn).map_err(|e| StorageError::new("create schema", e))?;
        let conn = Arc::new(Mutex::new(conn));
        let group = GroupCommit::start(conn.clone(), GroupCommitConfig::default())?;
        Ok(Self {
            conn,
            writer: Arc::new(Writer(group)),
            path: None,
            synchronous: Synchronous::default(),
        })
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
        self.writer.0.stats()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes and waits for the commit (synchronous callers).
    pub(super) fn write(&self, ops: Vec<WriteOp>) -> Result<(), StorageError> {
        self.writer.0.write_blocking(ops)
    }
}

fn tool_call_op(
    channel: &ConnectorChannelId,
    key: &str,
    record: &ToolCallRecord,
) -> Result<WriteOp, StorageError> {
    let result = record
        .result
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StorageError::new("encode tool result", e))?;
    Ok(WriteOp::ToolCall {
        channel: channel.as_str().to_owned(),
        key: key.to_owned(),
        fingerprint: record.fingerprint.clone(),
        result,
        error: record.error.clone(),
        completed_at: to_i64(record.completed_at),
    })
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

fn binding_to_json(binding: &Binding) -> Result<String, StorageError> {
    let secrets: BTreeMap<&str, &str> = binding.secrets().map(|(k, v)| (k, v.expose())).collect();
    let mut stored = serde_json::json!({ "target": binding.target, "secrets": secrets });
    if let Some(target_type) = binding.target_type() {
        stored["target_type"] = serde_json::json!(target_type);
    }
    serde_json::to_string(&stored).map_err(|e| StorageError::new("encode binding", e))
}

pub(super) fn binding_from_json(text: &str) -> Result<Binding, StorageError> {
    #[derive(serde::Deserialize)]
    struct Stored {
        target: DescriptorTarget,
        #[serde(default)]
        secrets: BTreeMap<String, String>,
        /// Absent in bindings stored before channels kept their flow's target type.
        #[serde(default)]
        target_type: Option<TargetType>,
    }
    let stored: Stored =
        serde_json::from_str(text).map_err(|e| StorageError::new("decode binding", e))?;
    let mut binding = Binding::new(stored.target);
    if let Some(target_type) = stored.target_type {
        binding = binding.with_target_type(target_type);
    }
    for (name, value) in stored.secrets {
        binding = binding.with_secret(name, Secret::new(value));
    }
    Ok(binding)
}

pub(super) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(super) fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

impl Storage for SqliteStorage {
    fn load_connector_id(&self) -> Result<Option<ConnectorId>, StorageError> {
        query_row(&self.lock(), "SELECT value FROM meta WHERE key = 'connector_id'", [], |row| {
            row.get::<_, String>(0)
        })
        .optional()
        .map(|value| value.map(ConnectorId::new))
        .map_err(|e| StorageError::new("load connector_id", e))
    }

    fn save_connector_id(&self, id: Option<&ConnectorId>) -> Result<(), StorageError> {
        self.write(vec![WriteOp::Meta {
            key: "connector_id".into(),
            value: id.map(|id| id.as_str().to_owned()),
        }])
    }

    fn load_channels(&self) -> Result<Vec<ChannelRecord>, StorageError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare(
                "SELECT id, connector_id, status, binding, tool_overrides, created_at
                 FROM channels ORDER BY created_at, id",
            )
            .map_err(|e| StorageError::new("load channels", e))?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, i64>(5)?,
                ))
            })
            .map_err(|e| StorageError::new("load channels", e))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, connector_id, status, binding, overrides, created_at) =
                row.map_err(|e| StorageError::new("load channels", e))?;
            let binding = binding.as_deref().map(binding_from_json).transpose()?;
            let tools: Vec<DescriptorTool> = serde_json::from_str(&overrides)
                .map_err(|e| StorageError::new("decode tool overrides", e))?;
            out.push(ChannelRecord {
                id: ConnectorChannelId::new(id),
                connector_id: ConnectorId::new(connector_id),
                status: ConnectionStatus::parse(&status),
                binding,
                tool_overrides: tools.into_iter().map(|t| (t.tool_id.clone(), t)).collect(),
                created_at: to_u64(created_at),
            });
        }
        Ok(out)
    }

    fn save_channel(&self, record: &ChannelRecord) -> Result<(), StorageError> {
        let binding = record.binding.as_ref().map(binding_to_json).transpose()?;
        let overrides: Vec<&DescriptorTool> = record.tool_overrides.values().collect();
        let overrides = serde_json::to_string(&overrides)
            .map_err(|e| StorageError::new("encode tool overrides", e))?;
        self.write(vec![WriteOp::Channel {
            id: record.id.as_str().to_owned(),
            connector_id: record.connector_id.as_str().to_owned(),
            status: record.status.as_str().to_owned(),
            binding,
            tool_overrides: overrides,
            created_at: to_i64(record.created_at),
        }])
    }

    fn delete_channel(&self, id: &ConnectorChannelId) -> Result<(), StorageError> {
        self.write(vec![WriteOp::DeleteChannel(id.as_str().to_owned())])
    }

    fn load_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
    ) -> Result<Option<ToolCallRecord>, StorageError> {
        let row = query_row(
            &self.lock(),
            "SELECT fingerprint, result, error_code, error_message, completed_at
                 FROM tool_calls WHERE channel = ?1 AND key = ?2",
            params![channel.as_str(), key],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, Option<String>>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, i64>(4)?,
                ))
            },
        )
        .optional()
        .map_err(|e| StorageError::new("load tool call", e))?;
        let Some((fingerprint, result, code, message, completed_at)) = row else {
            return Ok(None);
        };
        let result = result
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|e| StorageError::new("decode tool result", e))?;
        Ok(Some(ToolCallRecord {
            fingerprint,
            result,
            error: code.map(|code| (code, message.unwrap_or_default())),
            completed_at: to_u64(completed_at),
        }))
    }

    fn save_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
        record: &ToolCallRecord,
    ) -> Result<(), StorageError> {
        self.write(vec![tool_call_op(channel, key, record)?])
    }

    fn prune_tool_calls(&self, before: u64) -> Result<usize, StorageError> {
        exec(
            &self.lock(),
            "DELETE FROM tool_calls WHERE completed_at < ?1",
            params![to_i64(before)],
        )
        .map_err(|e| StorageError::new("prune tool calls", e))
    }

    fn load_meta(&self, key: &str) -> Result<Option<String>, StorageError> {
        query_row(&self.lock(), "SELECT value FROM meta WHERE key = ?1", params![key], |row| {
            row.get::<_, String>(0)
        })
        .optional()
        .map_err(|e| StorageError::new("load meta", e))
    }

    fn save_meta(&self, key: &str, value: &str) -> Result<(), StorageError> {
        self.write(vec![WriteOp::Meta { key: key.to_owned(), value: Some(value.to_owned()) }])
    }

    fn outbox_store(&self) -> Box<dyn OutboxStore + Send> {
        Box::new(self.clone())
    }

    fn idempotency_store(&self) -> Box<dyn IdempotencyStore + Send> {
        Box::new(self.clone())
    }

    fn commit_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
        record: &ToolCallRecord,
    ) -> CommitTicket {
        match tool_call_op(channel, key, record) {
            Ok(op) => self.writer.0.submit(vec![op]),
            Err(error) => CommitTicket::ready(Err(error)),
        }
    }

    fn commit_im(
        &self,
        outbox: Vec<OutboxWrite>,
        idempotency: Vec<IdempotencyWrite>,
    ) -> CommitTicket {
        let ops = outbox
            .into_iter()
            .map(WriteOp::Outbox)
            .chain(idempotency.into_iter().map(WriteOp::Idempotency))
            .collect();
        self.writer.0.submit(ops)
    }
}

#[cfg(test)]
mod tests;
