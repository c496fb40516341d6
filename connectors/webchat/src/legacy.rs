//! The move of an older version's `webchat.sqlite3` into the runtime's storage: rooms,
//! visitor sessions, the day's uploads and the conversations, once, then the file is renamed
//! `webchat.sqlite3.migrated`. Every record gets the key it would have had (rooms by id,
//! sessions by token hash, uploads by row, messages by their old order), so a move repeated
//! after a crash rewrites the same records.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, params};
use xagent_server_runtime::storage::StorageError;
use xagent_server_runtime::{AuthorStore, AuthorWrite};

use crate::error::WebchatError;
use crate::messages::Messages;
use crate::store::{
    Author, ChatEntry, DAY_MILLIS, EntryStatus, LegacyMessage, RoomRecord, UploadRecord,
    VisitorRecord, WEBCHAT_DATABASE_FILE, room_writes, upload_key, upload_write, visitor_writes,
};

/// How long a session of a version without token lifetimes lives after its creation (the
/// default [`crate::VisitorLimits::token_lifetime_millis`]).
const LEGACY_SESSION_LIFETIME_MILLIS: u64 = 7 * 24 * 60 * 60 * 1_000;

/// Records committed per transaction of the move.
const BATCH: usize = 400;

/// What [`import_legacy_state`] moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LegacyImport {
    /// Rooms.
    pub rooms: usize,
    /// Visitor sessions still open (revoked ones are not moved).
    pub visitors: usize,
    /// Uploads of the last day that count against the quota.
    pub uploads: usize,
    /// Messages of every room.
    pub messages: usize,
}

fn db(error: rusqlite::Error) -> WebchatError {
    WebchatError::Storage(StorageError::new("reading the older webchat.sqlite3", error))
}

/// The name the moved file gets.
pub fn migrated_path(state_dir: &Path) -> PathBuf {
    state_dir.join(format!("{WEBCHAT_DATABASE_FILE}.migrated"))
}

/// Moves the state an older version kept in `<state_dir>/webchat.sqlite3` (rooms, visitor
/// sessions, the day's uploads, messages) into `store` (the runtime's author store, SQLite or
/// PostgreSQL), then renames the file `webchat.sqlite3.migrated`. `Ok(None)` when there is no
/// such file. `now` (Unix ms) decides which uploads still count. Safe to repeat after a crash
/// part-way: the same records are written again.
pub async fn import_legacy_state(
    state_dir: &Path,
    store: &AuthorStore,
    now: u64,
) -> Result<Option<LegacyImport>, WebchatError> {
    let path = state_dir.join(WEBCHAT_DATABASE_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let rows = {
        let conn =
            Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_WRITE).map_err(db)?;
        read_all(&conn, now)?
    };
    let mut import = LegacyImport::default();
    let mut writes: Vec<AuthorWrite> = Vec::new();
    for (room_id, record) in &rows.rooms {
        writes.extend(room_writes(room_id, record)?);
        import.rooms += 1;
        flush(store, &mut writes, BATCH).await?;
    }
    for (token_hash, visitor) in &rows.visitors {
        writes.extend(visitor_writes(token_hash, visitor)?);
        import.visitors += 1;
        flush(store, &mut writes, BATCH).await?;
    }
    for (rowid, upload) in &rows.uploads {
        writes
            .push(upload_write(&upload_key(upload.created_at, &format!("legacy{rowid}")), upload)?);
        import.uploads += 1;
        flush(store, &mut writes, BATCH).await?;
    }
    flush(store, &mut writes, 0).await?;
    import.messages = Messages::new(store.clone()).move_legacy(rows.messages).await?;
    // Everything is committed: the old file is set aside (its journal files with it).
    std::fs::rename(&path, migrated_path(state_dir))
        .map_err(|e| StorageError::new("renaming the moved webchat.sqlite3", e))?;
    for suffix in ["-wal", "-shm"] {
        let journal = state_dir.join(format!("{WEBCHAT_DATABASE_FILE}{suffix}"));
        if journal.exists() {
            let _ = std::fs::rename(
                &journal,
                state_dir.join(format!("{WEBCHAT_DATABASE_FILE}.migrated{suffix}")),
            );
        }
    }
    Ok(Some(import))
}

async fn flush(
    store: &AuthorStore,
    writes: &mut Vec<AuthorWrite>,
    at_least: usize,
) -> Result<(), WebchatError> {
    if !writes.is_empty() && writes.len() >= at_least {
        store
            .commit(std::mem::take(writes))
            .await
            .map_err(|e| StorageError::new("storing the moved webchat state", e))?;
    }
    Ok(())
}

/// Everything of the old file that moves.
struct Rows {
    rooms: Vec<(String, RoomRecord)>,
    visitors: Vec<(String, VisitorRecord)>,
    uploads: Vec<(i64, UploadRecord)>,
    messages: Vec<LegacyMessage>,
}

/// Whether the old table `table` has `column` (older releases lack later columns).
fn has_column(conn: &Connection, table: &str, column: &str) -> Result<bool, WebchatError> {
    let n: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = ?2",
            params![table, column],
            |r| r.get(0),
        )
        .map_err(db)?;
    Ok(n > 0)
}

fn has_table(conn: &Connection, table: &str) -> Result<bool, WebchatError> {
    let n: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            params![table],
            |r| r.get(0),
        )
        .map_err(db)?;
    Ok(n > 0)
}

/// A column of a later release, or NULL where the file is older.
fn column(conn: &Connection, table: &str, name: &str) -> Result<String, WebchatError> {
    Ok(if has_column(conn, table, name)? { name.to_owned() } else { "NULL".to_owned() })
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn read_all(conn: &Connection, now: u64) -> Result<Rows, WebchatError> {
    let mut rows =
        Rows { rooms: Vec::new(), visitors: Vec::new(), uploads: Vec::new(), messages: Vec::new() };
    if has_table(conn, "rooms")? {
        let sql = format!(
            "SELECT room_id, name, code_salt, code_hash, channel, created_at, {}, {}, {} FROM rooms",
            column(conn, "rooms", "owner_salt")?,
            column(conn, "rooms", "owner_hash")?,
            column(conn, "rooms", "holder")?,
        );
        let mut stmt = conn.prepare(&sql).map_err(db)?;
        let found = stmt
            .query_map([], |r| {
                let channel: Option<String> = r.get(4)?;
                let owner: (Option<String>, Option<String>) = (r.get(6)?, r.get(7)?);
                // F7: rooms from before holders existed are held by the channel serving them.
                let holder: Option<String> = r.get::<_, Option<String>>(8)?.or(channel.clone());
                Ok((
                    r.get::<_, String>(0)?,
                    RoomRecord {
                        name: r.get(1)?,
                        code_salt: r.get(2)?,
                        code_hash: r.get(3)?,
                        channel,
                        owner: owner.0.zip(owner.1),
                        holder,
                        created_at: unsigned(r.get(5)?),
                    },
                ))
            })
            .map_err(db)?;
        for room in found {
            let (room_id, record) = room.map_err(db)?;
            // Only ids this version can address (every release made them the same way).
            if crate::store::is_room_id(&room_id) {
                rows.rooms.push((room_id, record));
            }
        }
    }
    if has_table(conn, "visitors")? {
        let sql = format!(
            "SELECT token_hash, room_id, created_at, {}, {} FROM visitors",
            column(conn, "visitors", "expires_at")?,
            column(conn, "visitors", "revoked")?,
        );
        let mut stmt = conn.prepare(&sql).map_err(db)?;
        let found = stmt
            .query_map([], |r| {
                let created_at = unsigned(r.get(2)?);
                let expires_at = r
                    .get::<_, Option<i64>>(3)?
                    .map_or(created_at.saturating_add(LEGACY_SESSION_LIFETIME_MILLIS), unsigned);
                let revoked = r.get::<_, Option<i64>>(4)?.unwrap_or(0) != 0;
                let visitor = VisitorRecord { room_id: r.get(1)?, created_at, expires_at };
                Ok((r.get::<_, String>(0)?, visitor, revoked))
            })
            .map_err(db)?;
        for visitor in found {
            let (token_hash, visitor, revoked) = visitor.map_err(db)?;
            let usable =
                token_hash.len() == 64 && token_hash.bytes().all(|b| b.is_ascii_hexdigit());
            if !revoked
                && visitor.expires_at > now
                && usable
                && crate::store::is_room_id(&visitor.room_id)
            {
                rows.visitors.push((token_hash, visitor));
            }
        }
    }
    if has_table(conn, "visitor_uploads")? {
        let sql = format!(
            "SELECT rowid, room_id, bytes, created_at FROM visitor_uploads WHERE created_at >= ?1 AND {} = 0",
            if has_column(conn, "visitor_uploads", "pending")? { "pending" } else { "0" },
        );
        let mut stmt = conn.prepare(&sql).map_err(db)?;
        let since = i64::try_from(now.saturating_sub(DAY_MILLIS)).unwrap_or(i64::MAX);
        let found = stmt
            .query_map(params![since], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    UploadRecord {
                        room_id: r.get(1)?,
                        bytes: unsigned(r.get(2)?),
                        created_at: unsigned(r.get(3)?),
                        pending: false,
                    },
                ))
            })
            .map_err(db)?;
        for upload in found {
            rows.uploads.push(upload.map_err(db)?);
        }
    }
    if has_table(conn, "messages")? {
        let sql = format!(
            "SELECT message_id, author, text, files, status, error, client_id, created_at, room_id, seq, {}
             FROM messages ORDER BY seq ASC",
            column(conn, "messages", "outbound")?,
        );
        let mut stmt = conn.prepare(&sql).map_err(db)?;
        let found = stmt
            .query_map([], |r| {
                let author: String = r.get(1)?;
                let files: String = r.get(3)?;
                let status: String = r.get(4)?;
                let entry = ChatEntry {
                    message_id: r.get(0)?,
                    author: if author == "assistant" { Author::Assistant } else { Author::Visitor },
                    text: r.get(2)?,
                    files: serde_json::from_str(&files).unwrap_or_default(),
                    status: EntryStatus::parse(&status),
                    error: r.get(5)?,
                    client_id: r.get(6)?,
                    created_at: unsigned(r.get(7)?),
                };
                Ok((
                    r.get::<_, String>(8)?,
                    r.get::<_, i64>(9)?,
                    entry,
                    r.get::<_, Option<String>>(10)?,
                ))
            })
            .map_err(db)?;
        for message in found {
            let message = message.map_err(db)?;
            if crate::store::is_room_id(&message.0) {
                rows.messages.push(message);
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use xagent_protocol_types::ConnectorChannelId;
    use xagent_server_runtime::storage::SqliteStorage;

    use super::*;
    use crate::store::{Store, hash_token};

    /// A state directory as an older version left it: the tables of its last release (the
    /// first release's, plus the columns added later), one row of each kind and a few that
    /// must not move.
    fn legacy_dir(name: &str, now: i64) -> std::path::PathBuf {
        let dir = std::env::temp_dir()
            .join(format!("webchat-legacy-{name}-{}", crate::store::random_hex(6)));
        std::fs::create_dir_all(&dir).unwrap();
        let conn = Connection::open(dir.join(WEBCHAT_DATABASE_FILE)).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE rooms (room_id TEXT PRIMARY KEY, name TEXT NOT NULL,
               code_salt TEXT NOT NULL, code_hash TEXT NOT NULL, channel TEXT,
               created_at INTEGER NOT NULL, owner_salt TEXT, owner_hash TEXT, holder TEXT);
             CREATE TABLE visitors (token_hash TEXT PRIMARY KEY, room_id TEXT NOT NULL,
               created_at INTEGER NOT NULL, expires_at INTEGER, revoked INTEGER NOT NULL DEFAULT 0);
             CREATE TABLE visitor_uploads (room_id TEXT NOT NULL, bytes INTEGER NOT NULL,
               created_at INTEGER NOT NULL, pending INTEGER NOT NULL DEFAULT 0);
             CREATE TABLE messages (room_id TEXT NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT,
               message_id TEXT NOT NULL UNIQUE, author TEXT NOT NULL, text TEXT,
               files TEXT NOT NULL, status TEXT NOT NULL, error TEXT, client_id TEXT,
               created_at INTEGER NOT NULL, outbound TEXT);",
        )
        .unwrap();
        // The code `lobby-code-1` salted with `salt` (how every release stored codes).
        let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"salt\0lobby-code-1"));
        conn.execute(
            "INSERT INTO rooms VALUES ('lobby', 'Lobby', 'salt', ?1, 'cch_a', 1, NULL, NULL, NULL)",
            params![hash],
        )
        .unwrap();
        let day = i64::try_from(DAY_MILLIS).unwrap();
        for (token, expires, revoked) in [
            ("wcv_open", Some(now + 1_000), 0),
            ("wcv_old", None, 0),
            ("wcv_gone", Some(now + 1_000), 1),
        ] {
            conn.execute(
                "INSERT INTO visitors VALUES (?1, 'lobby', ?2, ?3, ?4)",
                params![hash_token(token), now - 10, expires, revoked],
            )
            .unwrap();
        }
        for (bytes, at, pending) in [(10, now - 5, 0), (20, now - 2 * day, 0), (30, now - 5, 1)] {
            conn.execute(
                "INSERT INTO visitor_uploads VALUES ('lobby', ?1, ?2, ?3)",
                params![bytes, at, pending],
            )
            .unwrap();
        }
        for (id, status, outbound) in
            [("msg_1", "delivered", None), ("msg_2", "sending", Some("{\"out\":2}"))]
        {
            conn.execute(
                "INSERT INTO messages (room_id, message_id, author, text, files, status,
                   client_id, created_at, outbound)
                 VALUES ('lobby', ?1, 'visitor', 'hi', '[]', ?2, ?1, 5, ?3)",
                params![id, status, outbound],
            )
            .unwrap();
        }
        dir
    }

    fn authors() -> AuthorStore {
        AuthorStore::new(Arc::new(SqliteStorage::in_memory().unwrap()))
    }

    #[tokio::test]
    async fn an_older_state_directory_moves_once_and_reads_as_before() {
        let now = 10 * DAY_MILLIS;
        let dir = legacy_dir("once", i64::try_from(now).unwrap());
        let authors = authors();
        let moved = import_legacy_state(&dir, &authors, now).await.unwrap().unwrap();
        assert_eq!(moved, LegacyImport { rooms: 1, visitors: 2, uploads: 1, messages: 2 });
        assert!(!dir.join(WEBCHAT_DATABASE_FILE).exists());
        assert!(migrated_path(&dir).exists());
        assert_eq!(import_legacy_state(&dir, &authors, now).await.unwrap(), None, "moved once");

        let store = Store::new(authors.clone());
        let room = store.room("lobby").await.unwrap().unwrap();
        assert_eq!(
            (room.name.as_str(), room.channel),
            ("Lobby", Some(ConnectorChannelId::new("cch_a")))
        );
        assert!(store.check_code("lobby", "lobby-code-1").await.unwrap());
        assert_eq!(
            store
                .room_by_channel(&ConnectorChannelId::new("cch_a"))
                .await
                .unwrap()
                .unwrap()
                .room_id,
            "lobby"
        );
        // F7: the channel serving it at the move holds it.
        let other = ConnectorChannelId::new("cch_b");
        assert_eq!(
            store
                .sign_in_room("Lobby", "lobby-code-1", Some("b-owner-code"), &other, now)
                .await
                .unwrap(),
            crate::store::SignIn::OwnerRequired
        );
        assert_eq!(store.visitor_room("wcv_open", now).await.unwrap().as_deref(), Some("lobby"));
        assert_eq!(store.visitor_room("wcv_old", now).await.unwrap().as_deref(), Some("lobby"));
        assert_eq!(store.visitor_room("wcv_gone", now).await.unwrap(), None, "revoked stays so");
        assert_eq!(
            store.visitor_room("wcv_old", now - 10 + LEGACY_SESSION_LIFETIME_MILLIS).await.unwrap(),
            None,
            "a session without a lifetime ends a default lifetime after it began"
        );
        let usage = store.upload_usage("lobby", now).await.unwrap();
        assert_eq!((usage.room_bytes, usage.room_files), (10, 1), "only the day's settled upload");
        let messages = Messages::new(authors);
        let ids: Vec<String> =
            messages.history("lobby").await.unwrap().into_iter().map(|e| e.message_id).collect();
        assert_eq!(ids, ["msg_1", "msg_2"]);
        assert_eq!(messages.sending().await.unwrap().len(), 1, "the pending send is kept");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_move_repeated_after_a_crash_writes_the_same_records() {
        let now = 10 * DAY_MILLIS;
        let dir = legacy_dir("twice", i64::try_from(now).unwrap());
        let authors = authors();
        import_legacy_state(&dir, &authors, now).await.unwrap().unwrap();
        // The process stopped after the commits, before the rename: the file is back.
        std::fs::rename(migrated_path(&dir), dir.join(WEBCHAT_DATABASE_FILE)).unwrap();
        let again = import_legacy_state(&dir, &authors, now).await.unwrap().unwrap();
        assert_eq!(again.messages, 2);
        let history = Messages::new(authors.clone()).history("lobby").await.unwrap();
        assert_eq!(history.len(), 2, "no message twice");
        let usage = Store::new(authors).upload_usage("lobby", now).await.unwrap();
        assert_eq!(usage.room_files, 1, "no upload twice");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_first_releases_tables_move_too() {
        let dir = std::env::temp_dir()
            .join(format!("webchat-legacy-first-{}", crate::store::random_hex(6)));
        std::fs::create_dir_all(&dir).unwrap();
        {
            // The first release's tables, without any later column.
            let conn = Connection::open(dir.join(WEBCHAT_DATABASE_FILE)).unwrap();
            conn.execute_batch(
                "CREATE TABLE rooms (room_id TEXT PRIMARY KEY, name TEXT NOT NULL,
                   code_salt TEXT NOT NULL, code_hash TEXT NOT NULL, channel TEXT,
                   created_at INTEGER NOT NULL);
                 CREATE TABLE visitors (token_hash TEXT PRIMARY KEY, room_id TEXT NOT NULL,
                   created_at INTEGER NOT NULL);
                 CREATE TABLE visitor_uploads (room_id TEXT NOT NULL, bytes INTEGER NOT NULL,
                   created_at INTEGER NOT NULL);
                 INSERT INTO rooms VALUES ('lobby', 'Lobby', 's', 'h', NULL, 1);
                 INSERT INTO visitor_uploads VALUES ('lobby', 5, 1);",
            )
            .unwrap();
        }
        let authors = authors();
        let moved = import_legacy_state(&dir, &authors, 2).await.unwrap().unwrap();
        assert_eq!(moved, LegacyImport { rooms: 1, visitors: 0, uploads: 1, messages: 0 });
        let store = Store::new(authors);
        assert!(store.room("lobby").await.unwrap().is_some());
        assert_eq!(
            store.upload_usage("lobby", 2).await.unwrap().room_bytes,
            5,
            "old uploads still count"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
