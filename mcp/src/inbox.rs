//! The bridge's durable inbox: every inbound chat message the bridge accepted, with the files
//! it downloaded for it, in one SQLite database in the state directory.
//!
//! A message is acked `accepted` to the Connector only after [`Inbox::store`] returned, so an
//! acked message is never lost; the `(channel, message_id)` key makes a redelivered message
//! land once; and [`Inbox::take_next`] marks a message handed to the agent in the same
//! statement that selects it, so no message is handed twice, across restarts included.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

/// Why the inbox could not do something.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The database failed.
    #[error("the bridge's inbox database failed: {0}; check the state directory")]
    Database(#[from] rusqlite::Error),
    /// The state directory could not be prepared.
    #[error("the state directory {path} cannot be used: {reason}")]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A stored row does not decode (written by an incompatible version).
    #[error("a stored message does not decode: {0}")]
    Corrupt(String),
}

/// A file that came with an inbound message, downloaded into the state directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFile {
    /// The bridge's id of the file (also in its resource URI).
    pub id: String,
    /// The name the sender gave it.
    pub filename: String,
    /// Its MIME type.
    pub mime_type: String,
    /// Its size in bytes.
    pub byte_size: u64,
}

/// One inbound message as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// Arrival order in this inbox (1, 2, 3, ...).
    pub seq: i64,
    /// The channel it arrived on (the id the bridge persisted).
    pub channel: String,
    /// The sender's `message_id`.
    pub message_id: String,
    /// Its text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Its files.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub files: Vec<StoredFile>,
    /// When the sender created it (Unix ms), if said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<u64>,
    /// When the bridge stored it (Unix ms).
    pub received_at: u64,
    /// Whether the waiting Tool already handed it to the agent.
    pub taken: bool,
}

/// What [`Inbox::store`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// A new message, with its sequence number.
    New(i64),
    /// The message was already stored (a redelivery); nothing changed.
    Known(i64),
}

/// A new inbound message, before it gets its sequence number.
#[derive(Debug, Clone)]
pub struct NewMessage<'a> {
    /// The channel (persisted id).
    pub channel: &'a str,
    /// The sender's `message_id`.
    pub message_id: &'a str,
    /// Text.
    pub text: Option<&'a str>,
    /// Downloaded files.
    pub files: &'a [StoredFile],
    /// Sender's creation time.
    pub created_at: Option<u64>,
    /// Now (Unix ms).
    pub received_at: u64,
}

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
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
";

/// The durable inbox (see the module docs).
pub struct Inbox {
    db: Mutex<Connection>,
    files_dir: PathBuf,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").field("files_dir", &self.files_dir).finish()
    }
}

/// Creates `dir` (and parents) readable only by its owner.
pub(crate) fn private_dir(dir: &Path) -> Result<(), InboxError> {
    let failed =
        |e: std::io::Error| InboxError::StateDir { path: dir.to_path_buf(), reason: e.to_string() };
    std::fs::create_dir_all(dir).map_err(failed)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)?;
    }
    Ok(())
}

impl Inbox {
    /// Opens (or creates) the inbox in `state_dir`: `mcp-inbox.sqlite3` and `files/`, both
    /// readable only by the owner.
    pub fn open(state_dir: &Path) -> Result<Self, InboxError> {
        private_dir(state_dir)?;
        let files_dir = state_dir.join("files");
        private_dir(&files_dir)?;
        let path = state_dir.join("mcp-inbox.sqlite3");
        let db = Connection::open(&path)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| InboxError::StateDir { path: path.clone(), reason: e.to_string() })?;
        }
        // FULL: a row is on disk when the statement returns, before the ack goes out.
        db.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;")?;
        db.execute_batch(SCHEMA)?;
        Ok(Self { db: Mutex::new(db), files_dir })
    }

    fn db(&self) -> MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Where a file's bytes live.
    pub fn file_path(&self, id: &str) -> PathBuf {
        self.files_dir.join(id)
    }

    /// Stores a message (and its file records) in one transaction, unless a message with the
    /// same `(channel, message_id)` is already stored.
    pub fn store(&self, message: &NewMessage<'_>) -> Result<Stored, InboxError> {
        let mut db = self.db();
        let tx = db.transaction()?;
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
        let files =
            serde_json::to_string(message.files).map_err(|e| InboxError::Corrupt(e.to_string()))?;
        tx.execute(
            "INSERT INTO messages (channel, message_id, text, files, created_at, received_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                message.channel,
                message.message_id,
                message.text,
                files,
                message.created_at.map(|t| t as i64),
                message.received_at as i64
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
                    file.byte_size as i64
                ],
            )?;
        }
        tx.commit()?;
        Ok(Stored::New(seq))
    }

    /// Whether `(channel, message_id)` is stored.
    pub fn contains(&self, channel: &str, message_id: &str) -> Result<bool, InboxError> {
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

    /// Hands the oldest message not yet handed (on `channel`, or on any channel) to the agent:
    /// selects and marks it in one statement, so it is handed once.
    pub fn take_next(&self, channel: Option<&str>) -> Result<Option<StoredMessage>, InboxError> {
        let db = self.db();
        let row = db
            .query_row(
                "UPDATE messages SET taken = 1
                 WHERE seq = (SELECT seq FROM messages
                              WHERE taken = 0 AND (?1 IS NULL OR channel = ?1)
                              ORDER BY seq LIMIT 1)
                 RETURNING seq, channel, message_id, text, files, created_at, received_at, taken",
                params![channel],
                read_message,
            )
            .optional()?;
        row.transpose()
    }

    /// The latest `limit` messages of a channel, oldest first (the channel's resource).
    pub fn recent(&self, channel: &str, limit: usize) -> Result<Vec<StoredMessage>, InboxError> {
        let db = self.db();
        let mut statement = db.prepare(
            "SELECT seq, channel, message_id, text, files, created_at, received_at, taken
             FROM messages WHERE channel = ?1 ORDER BY seq DESC LIMIT ?2",
        )?;
        let rows = statement.query_map(params![channel, limit as i64], read_message)?;
        let mut messages = Vec::new();
        for row in rows {
            messages.push(row??);
        }
        messages.reverse();
        Ok(messages)
    }

    /// Forgets messages handed to the agent before `cutoff` (Unix ms), with their files, and
    /// returns how many went. Messages not yet handed are never pruned.
    pub fn prune_taken(&self, cutoff: u64) -> Result<usize, InboxError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let ids: Vec<String> = {
            let mut statement = tx.prepare(
                "SELECT f.id FROM files f JOIN messages m
                 ON m.channel = f.channel AND m.message_id = f.message_id
                 WHERE m.taken = 1 AND m.received_at < ?1",
            )?;
            let rows = statement.query_map(params![cutoff as i64], |row| row.get(0))?;
            rows.collect::<Result<Vec<String>, _>>()?
        };
        tx.execute(
            "DELETE FROM files WHERE id IN (SELECT f.id FROM files f JOIN messages m
             ON m.channel = f.channel AND m.message_id = f.message_id
             WHERE m.taken = 1 AND m.received_at < ?1)",
            params![cutoff as i64],
        )?;
        let pruned = tx.execute(
            "DELETE FROM messages WHERE taken = 1 AND received_at < ?1",
            params![cutoff as i64],
        )?;
        tx.commit()?;
        for id in ids {
            let _ = std::fs::remove_file(self.file_path(&id));
        }
        Ok(pruned)
    }

    /// Number of messages not yet handed to the agent.
    pub fn pending(&self, channel: Option<&str>) -> Result<u64, InboxError> {
        let count: i64 = self.db().query_row(
            "SELECT COUNT(*) FROM messages WHERE taken = 0 AND (?1 IS NULL OR channel = ?1)",
            params![channel],
            |row| row.get(0),
        )?;
        Ok(count.max(0) as u64)
    }

    /// A stored file's record.
    pub fn file(&self, id: &str) -> Result<Option<StoredFile>, InboxError> {
        Ok(self
            .db()
            .query_row(
                "SELECT id, filename, mime_type, byte_size FROM files WHERE id = ?1",
                params![id],
                read_file,
            )
            .optional()?)
    }

    /// Every stored file, newest first, at most `limit`.
    pub fn files(&self, limit: usize) -> Result<Vec<StoredFile>, InboxError> {
        let db = self.db();
        let mut statement = db.prepare(
            "SELECT f.id, f.filename, f.mime_type, f.byte_size FROM files f
             JOIN messages m ON m.channel = f.channel AND m.message_id = f.message_id
             ORDER BY m.seq DESC LIMIT ?1",
        )?;
        let rows = statement.query_map(params![limit as i64], read_file)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Reads a remembered value (the channel the bridge opened, the Connector's runtime id).
    pub fn meta(&self, key: &str) -> Result<Option<String>, InboxError> {
        Ok(self
            .db()
            .query_row("SELECT value FROM meta WHERE key = ?1", params![key], |row| row.get(0))
            .optional()?)
    }

    /// Remembers a value.
    pub fn set_meta(&self, key: &str, value: &str) -> Result<(), InboxError> {
        self.db().execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
        Ok(())
    }
}

type Row = Result<StoredMessage, InboxError>;

fn read_message(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let files: String = row.get(4)?;
    let created_at: Option<i64> = row.get(5)?;
    let received_at: i64 = row.get(6)?;
    let taken: i64 = row.get(7)?;
    let message = (|| -> Row {
        Ok(StoredMessage {
            seq: row.get(0)?,
            channel: row.get(1)?,
            message_id: row.get(2)?,
            text: row.get(3)?,
            files: serde_json::from_str(&files).map_err(|e| InboxError::Corrupt(e.to_string()))?,
            created_at: created_at.map(|t| t.max(0) as u64),
            received_at: received_at.max(0) as u64,
            taken: taken != 0,
        })
    })();
    Ok(message)
}

fn read_file(row: &rusqlite::Row<'_>) -> rusqlite::Result<StoredFile> {
    let byte_size: i64 = row.get(3)?;
    Ok(StoredFile {
        id: row.get(0)?,
        filename: row.get(1)?,
        mime_type: row.get(2)?,
        byte_size: byte_size.max(0) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message<'a>(channel: &'a str, id: &'a str, text: &'a str) -> NewMessage<'a> {
        NewMessage {
            channel,
            message_id: id,
            text: Some(text),
            files: &[],
            created_at: Some(1),
            received_at: 2,
        }
    }

    #[test]
    fn a_redelivered_message_is_stored_once() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let inbox = Inbox::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let first = inbox.store(&message("cch_1", "m1", "hello")).unwrap_or_else(|e| panic!("{e}"));
        let again = inbox.store(&message("cch_1", "m1", "hello")).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(first, Stored::New(_)));
        assert_eq!(
            again,
            Stored::Known(match first {
                Stored::New(seq) | Stored::Known(seq) => seq,
            })
        );
        // The same message_id on another channel is another message.
        let other = inbox.store(&message("cch_2", "m1", "hi")).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(other, Stored::New(_)));
        assert_eq!(inbox.recent("cch_1", 10).map(|m| m.len()).ok(), Some(1));
    }

    #[test]
    fn a_message_is_handed_once_even_after_reopening() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        {
            let inbox = Inbox::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
            inbox.store(&message("cch_1", "m1", "one")).unwrap_or_else(|e| panic!("{e}"));
            inbox.store(&message("cch_1", "m2", "two")).unwrap_or_else(|e| panic!("{e}"));
            let taken = inbox.take_next(None).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(taken.map(|m| m.message_id), Some("m1".to_owned()));
        }
        let inbox = Inbox::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inbox.pending(None).ok(), Some(1));
        let next = inbox.take_next(Some("cch_1")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(next.as_ref().map(|m| m.message_id.as_str()), Some("m2"));
        assert!(next.is_some_and(|m| m.taken));
        assert_eq!(inbox.take_next(None).ok(), Some(None));
        let recent = inbox.recent("cch_1", 10).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(recent.iter().map(|m| m.message_id.as_str()).collect::<Vec<_>>(), ["m1", "m2"]);
        assert!(recent.iter().all(|m| m.taken));
    }

    #[test]
    fn concurrent_waiters_never_get_the_same_message() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let inbox = std::sync::Arc::new(Inbox::open(dir.path()).unwrap_or_else(|e| panic!("{e}")));
        let ids: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
        for id in &ids {
            inbox.store(&message("cch_1", id, "x")).unwrap_or_else(|e| panic!("{e}"));
        }
        let takers: Vec<_> = (0..4)
            .map(|_| {
                let inbox = std::sync::Arc::clone(&inbox);
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while let Ok(Some(m)) = inbox.take_next(None) {
                        got.push(m.message_id);
                    }
                    got
                })
            })
            .collect();
        let mut all: Vec<String> =
            takers.into_iter().flat_map(|t| t.join().unwrap_or_default()).collect();
        all.sort();
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!(all, expected, "each message handed exactly once");
    }

    #[test]
    fn take_next_filters_by_channel() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let inbox = Inbox::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        inbox.store(&message("cch_1", "m1", "one")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inbox.take_next(Some("cch_2")).ok(), Some(None));
        assert!(inbox.take_next(Some("cch_1")).ok().flatten().is_some());
    }

    #[test]
    fn pruning_forgets_only_old_handed_messages_and_their_files() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let inbox = Inbox::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let file = StoredFile {
            id: "f_old".into(),
            filename: "a.txt".into(),
            mime_type: "text/plain".into(),
            byte_size: 1,
        };
        std::fs::write(inbox.file_path("f_old"), b"a").unwrap_or_else(|e| panic!("{e}"));
        let old =
            NewMessage { files: std::slice::from_ref(&file), ..message("cch_1", "m1", "old") };
        inbox.store(&old).unwrap_or_else(|e| panic!("{e}"));
        inbox.store(&message("cch_1", "m2", "old, not handed")).unwrap_or_else(|e| panic!("{e}"));
        inbox
            .store(&NewMessage { received_at: 50, ..message("cch_1", "m3", "new") })
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(inbox.take_next(None).ok().flatten().is_some_and(|m| m.message_id == "m1"));
        assert!(inbox.take_next(None).ok().flatten().is_some_and(|m| m.message_id == "m2"));
        assert!(inbox.take_next(None).ok().flatten().is_some_and(|m| m.message_id == "m3"));
        inbox.store(&message("cch_1", "m4", "old, pending")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inbox.prune_taken(10).ok(), Some(2));
        let left: Vec<String> = inbox
            .recent("cch_1", 10)
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.message_id)
            .collect();
        assert_eq!(left, ["m3", "m4"]);
        assert_eq!(inbox.file("f_old").ok(), Some(None));
        assert!(!inbox.file_path("f_old").exists());
    }

    #[cfg(unix)]
    #[test]
    fn the_state_is_readable_only_by_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let state = dir.path().join("state");
        let _inbox = Inbox::open(&state).unwrap_or_else(|e| panic!("{e}"));
        let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777).ok();
        assert_eq!(mode(&state), Some(0o700));
        assert_eq!(mode(&state.join("files")), Some(0o700));
        assert_eq!(mode(&state.join("mcp-inbox.sqlite3")), Some(0o600));
    }
}
