//! The SQLite inbox: `mcp-inbox.sqlite3` in the state directory and each file's bytes in
//! `files/`, all readable only by the owner. Statements run on one connection behind a mutex
//! (each is short; `synchronous = FULL` puts a row on disk before the statement returns).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::{
    FILES_DIR, InboxError, NewMessage, SQLITE_FILE, Stored, StoredFile, StoredMessage,
    decode_files, encode_files, limit_i64, to_i64, to_u64,
};
use xagent_storage_sqlite::{Migration, Synchronous};

/// The component name of the inbox's tables in `xagent_schema`.
const COMPONENT: &str = "mcp-inbox";

/// Version 1: the tables (an older inbox has them already), and the `meta` table of older
/// versions goes: it kept the Connector's `connector_id`, which the runtime's own store keeps
/// (one home per fact).
const MIGRATIONS: &[Migration] = &[Migration::new(1, SCHEMA)];

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL,
    message_id TEXT NOT NULL,
    text TEXT,
    files TEXT NOT NULL,
    created_at INTEGER,
    received_at INTEGER NOT NULL,
    taken INTEGER NOT NULL DEFAULT 0,
    UNIQUE (channel, message_id)
);
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY,
    channel TEXT NOT NULL,
    message_id TEXT NOT NULL,
    filename TEXT NOT NULL,
    mime_type TEXT NOT NULL,
    byte_size INTEGER NOT NULL
);
DROP TABLE IF EXISTS meta;
";

const MESSAGE_COLUMNS: &str =
    "seq, channel, message_id, text, files, created_at, received_at, taken";

pub(super) struct SqliteInbox {
    db: Mutex<Connection>,
    files_dir: PathBuf,
}

impl SqliteInbox {
    pub(super) fn open(state_dir: &Path) -> Result<Self, InboxError> {
        let path = xagent_storage_sqlite::private_database(state_dir, SQLITE_FILE)?;
        let files_dir = state_dir.join(FILES_DIR);
        xagent_storage_sqlite::private_dir(&files_dir)?;
        // FULL: a row is on disk when the statement returns, before the ack goes out; another
        // process on the same file (a second bridge on one machine) waits its turn.
        let mut db = xagent_storage_sqlite::open(&path, Synchronous::Full)?;
        xagent_storage_sqlite::migrate(&mut db, COMPONENT, MIGRATIONS)?;
        Ok(Self { db: Mutex::new(db), files_dir })
    }

    pub(super) fn files_dir(&self) -> &Path {
        &self.files_dir
    }

    fn db(&self) -> MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn file_path(&self, id: &str) -> PathBuf {
        self.files_dir.join(id)
    }

    pub(super) async fn save_file(&self, id: &str, bytes: Vec<u8>) -> Result<(), InboxError> {
        let path = self.file_path(id);
        let failed = |reason: String| InboxError::File { id: id.to_owned(), reason };
        tokio::task::spawn_blocking(move || write_durably(&path, &bytes))
            .await
            .map_err(|e| failed(e.to_string()))?
            .map_err(|e| failed(e.to_string()))
    }

    pub(super) fn saved_size(&self, id: &str) -> Result<Option<u64>, InboxError> {
        match std::fs::metadata(self.file_path(id)) {
            Ok(metadata) => Ok(Some(metadata.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(InboxError::File { id: id.to_owned(), reason: e.to_string() }),
        }
    }

    pub(super) async fn read_file(&self, id: &str) -> Result<Option<Vec<u8>>, InboxError> {
        match tokio::fs::read(self.file_path(id)).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(InboxError::File { id: id.to_owned(), reason: e.to_string() }),
        }
    }

    pub(super) fn store(&self, message: &NewMessage<'_>) -> Result<Stored, InboxError> {
        let mut db = self.db();
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let known: Option<i64> = tx
            .query_row(
                "SELECT seq FROM messages WHERE channel = ?1 AND message_id = ?2",
                params![message.channel, message.message_id],
                |row| row.get(0),
            )
            .optional()?;
        if let Some(seq) = known {
            return Ok(Stored::Known(seq));
        }
        tx.execute(
            "INSERT INTO messages (channel, message_id, text, files, created_at, received_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                message.channel,
                message.message_id,
                message.text,
                encode_files(message.files)?,
                message.created_at.map(to_i64),
                to_i64(message.received_at)
            ],
        )?;
        let seq = tx.last_insert_rowid();
        for file in message.files {
            tx.execute(
                "INSERT OR REPLACE INTO files (id, channel, message_id, filename, mime_type, byte_size)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    file.id,
                    message.channel,
                    message.message_id,
                    file.filename,
                    file.mime_type,
                    to_i64(file.byte_size)
                ],
            )?;
        }
        tx.commit()?;
        Ok(Stored::New(seq))
    }

    pub(super) fn contains(&self, channel: &str, message_id: &str) -> Result<bool, InboxError> {
        let found: Option<i64> = self
            .db()
            .query_row(
                "SELECT seq FROM messages WHERE channel = ?1 AND message_id = ?2",
                params![channel, message_id],
                |row| row.get(0),
            )
            .optional()?;
        Ok(found.is_some())
    }

    pub(super) fn take_next(
        &self,
        channel: Option<&str>,
    ) -> Result<Option<StoredMessage>, InboxError> {
        let row = self
            .db()
            .query_row(
                &format!(
                    "UPDATE messages SET taken = 1
                     WHERE seq = (SELECT seq FROM messages
                                  WHERE taken = 0 AND (?1 IS NULL OR channel = ?1)
                                  ORDER BY seq LIMIT 1)
                     RETURNING {MESSAGE_COLUMNS}"
                ),
                params![channel],
                read_message,
            )
            .optional()?;
        row.transpose()
    }

    pub(super) fn mark_taken(&self, channel: &str, message_id: &str) -> Result<(), InboxError> {
        self.db().execute(
            "UPDATE messages SET taken = 1 WHERE channel = ?1 AND message_id = ?2",
            params![channel, message_id],
        )?;
        Ok(())
    }

    fn messages(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<StoredMessage>, InboxError> {
        let db = self.db();
        let mut statement = db.prepare(sql)?;
        let rows = statement.query_map(params, read_message)?;
        let mut messages = Vec::new();
        for row in rows {
            messages.push(row??);
        }
        Ok(messages)
    }

    pub(super) fn recent(
        &self,
        channel: &str,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, InboxError> {
        let mut messages = self.messages(
            &format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages WHERE channel = ?1
                 ORDER BY seq DESC LIMIT ?2"
            ),
            params![channel, limit_i64(limit)],
        )?;
        messages.reverse();
        Ok(messages)
    }

    pub(super) fn all(&self) -> Result<Vec<StoredMessage>, InboxError> {
        self.messages(&format!("SELECT {MESSAGE_COLUMNS} FROM messages ORDER BY seq"), [])
    }

    pub(super) fn prune_taken(&self, cutoff: u64) -> Result<usize, InboxError> {
        let cutoff = to_i64(cutoff);
        let mut db = self.db();
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let ids: Vec<String> = {
            let mut statement = tx.prepare(
                "SELECT f.id FROM files f JOIN messages m
                 ON m.channel = f.channel AND m.message_id = f.message_id
                 WHERE m.taken = 1 AND m.received_at < ?1",
            )?;
            let rows = statement.query_map(params![cutoff], |row| row.get(0))?;
            rows.collect::<Result<Vec<String>, _>>()?
        };
        tx.execute(
            "DELETE FROM files WHERE id IN (SELECT f.id FROM files f JOIN messages m
             ON m.channel = f.channel AND m.message_id = f.message_id
             WHERE m.taken = 1 AND m.received_at < ?1)",
            params![cutoff],
        )?;
        let pruned = tx.execute(
            "DELETE FROM messages WHERE taken = 1 AND received_at < ?1",
            params![cutoff],
        )?;
        let kept: HashSet<String> = {
            let mut statement = tx.prepare("SELECT id FROM files")?;
            let rows = statement.query_map([], |row| row.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        tx.commit()?;
        drop(db);
        for id in ids {
            // Already gone is fine: the record, which is what the bridge reads by, went first.
            let _ = std::fs::remove_file(self.file_path(&id));
        }
        self.prune_orphans(&kept, cutoff);
        Ok(pruned)
    }

    /// Removes bytes no record names (a message refused after its files were saved, or a
    /// write cut short) written before `cutoff` (Unix ms, against the file's modification
    /// time). Best effort: what cannot be read or removed stays for the next round.
    fn prune_orphans(&self, kept: &HashSet<String>, cutoff: i64) {
        let Ok(entries) = std::fs::read_dir(&self.files_dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if kept.contains(&name) {
                continue;
            }
            let written = entry
                .metadata()
                .ok()
                .filter(std::fs::Metadata::is_file)
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            if written.is_some_and(|written| written < cutoff) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    pub(super) fn pending(&self, channel: Option<&str>) -> Result<u64, InboxError> {
        let count: i64 = self.db().query_row(
            "SELECT COUNT(*) FROM messages WHERE taken = 0 AND (?1 IS NULL OR channel = ?1)",
            params![channel],
            |row| row.get(0),
        )?;
        Ok(to_u64(count))
    }

    pub(super) fn count(&self) -> Result<u64, InboxError> {
        let count: i64 =
            self.db().query_row("SELECT COUNT(*) FROM messages", [], |row| row.get(0))?;
        Ok(to_u64(count))
    }

    pub(super) fn file(&self, id: &str) -> Result<Option<StoredFile>, InboxError> {
        Ok(self
            .db()
            .query_row(
                "SELECT id, filename, mime_type, byte_size FROM files WHERE id = ?1",
                params![id],
                read_file,
            )
            .optional()?)
    }

    pub(super) fn files(&self, limit: usize) -> Result<Vec<StoredFile>, InboxError> {
        let db = self.db();
        let mut statement = db.prepare(
            "SELECT f.id, f.filename, f.mime_type, f.byte_size FROM files f
             JOIN messages m ON m.channel = f.channel AND m.message_id = f.message_id
             ORDER BY m.seq DESC LIMIT ?1",
        )?;
        let rows = statement.query_map(params![limit_i64(limit)], read_file)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}

type Row = Result<StoredMessage, InboxError>;

fn read_message(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let files: String = row.get(4)?;
    let created_at: Option<i64> = row.get(5)?;
    let received_at: i64 = row.get(6)?;
    let taken: i64 = row.get(7)?;
    let (seq, channel, message_id, text) = (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
    Ok(decode_files(&files).map(|files| StoredMessage {
        seq,
        channel,
        message_id,
        text,
        files,
        created_at: created_at.map(to_u64),
        received_at: to_u64(received_at),
        taken: taken != 0,
    }))
}

fn read_file(row: &rusqlite::Row<'_>) -> rusqlite::Result<StoredFile> {
    let byte_size: i64 = row.get(3)?;
    Ok(StoredFile {
        id: row.get(0)?,
        filename: row.get(1)?,
        mime_type: row.get(2)?,
        byte_size: to_u64(byte_size),
    })
}

/// Writes a file readable only by its owner and syncs it (and its directory) before
/// returning; a crash leaves the old bytes or the new ones, never part of them.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let temporary = path.with_extension("partial");
    {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn the_state_is_readable_only_by_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let state = dir.path().join("state");
        let _inbox = SqliteInbox::open(&state).unwrap_or_else(|e| panic!("{e}"));
        let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777).ok();
        assert_eq!(mode(&state), Some(0o700));
        assert_eq!(mode(&state.join(FILES_DIR)), Some(0o700));
        assert_eq!(mode(&state.join(SQLITE_FILE)), Some(0o600));
    }

    #[tokio::test]
    async fn a_saved_file_is_readable_only_by_its_owner() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let inbox = SqliteInbox::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        inbox.save_file("f_1", b"abc".to_vec()).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inbox.saved_size("f_1").ok().flatten(), Some(3));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(FILES_DIR).join("f_1"))
                .map(|m| m.permissions().mode() & 0o777)
                .ok();
            assert_eq!(mode, Some(0o600));
        }
    }

    #[test]
    fn an_older_inbox_is_read_and_loses_only_its_meta_table() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        {
            let old =
                Connection::open(dir.path().join(SQLITE_FILE)).unwrap_or_else(|e| panic!("{e}"));
            old.execute_batch(SCHEMA).unwrap_or_else(|e| panic!("{e}"));
            old.execute_batch(
                "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                 INSERT INTO meta VALUES ('connector_id', 'conn_old');
                 INSERT INTO messages (channel, message_id, text, files, created_at, received_at)
                 VALUES ('cch_1', 'm1', 'from before', '[]', 1, 2);",
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
        let inbox = SqliteInbox::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inbox.pending(None).ok(), Some(1));
        let taken = inbox.take_next(None).ok().flatten();
        assert_eq!(taken.and_then(|m| m.text), Some("from before".to_owned()));
        let meta: Option<String> = inbox
            .db()
            .query_row("SELECT name FROM sqlite_master WHERE name = 'meta'", [], |r| r.get(0))
            .optional()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(meta, None, "the connector_id lives in the runtime's store only");
    }
}
