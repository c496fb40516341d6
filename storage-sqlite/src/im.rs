//! The SQLite form of `profile-im`'s two stores, written once for both ends of the wire: the
//! Connector's runtime (which sends these writes through its group commit) and xAgent's
//! client runtime. It holds the two tables (the migrations of [`COMPONENT`]), the writes and
//! the loads; transactions and error wrapping stay with each caller.
//!
//! ```
//! use xagent_profile_im::{CompletedRecord, Fingerprint, IdempotencyWrite};
//! use xagent_protocol_types::{ConnectorChannelId, MessageId};
//! use xagent_storage_sqlite::{im, migrate, rusqlite::Connection};
//!
//! let mut conn = Connection::open_in_memory()?;
//! migrate(&mut conn, im::COMPONENT, im::MIGRATIONS)?;
//! let record = CompletedRecord {
//!     channel: ConnectorChannelId::new("cch_1"),
//!     message_id: MessageId::new("m_1"),
//!     fingerprint: Fingerprint::from_hex("00"),
//!     completed_at: 7,
//! };
//! im::write_idempotency(&conn, &IdempotencyWrite::Save(record.clone()))?;
//! assert_eq!(im::load_completed(&conn)?, vec![record]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use rusqlite::{Connection, params};
use xagent_profile_im::{
    AttemptUpdate, CompletedRecord, Fingerprint, IdempotencyWrite, OutboxWrite, PendingRecord,
};
use xagent_protocol_types::{ConnectorChannelId, MessageId};

use crate::migrate::Migration;
use crate::{to_i64, to_u64};

/// The component name of the IM tables in `xagent_schema`.
pub const COMPONENT: &str = "im";

/// The IM tables' migrations, in order.
pub const MIGRATIONS: &[Migration] = &[Migration::new(1, SCHEMA)];

/// Version 1: the outbox's pending messages and the receiver's completed ids (created when
/// missing, so databases made before versioning take it as they are). `im_completed` is read
/// by its primary key (the receiver's point lookup on a cache miss) and pruned by age through
/// the `completed_at` index.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS im_pending (
  channel TEXT NOT NULL, message_id TEXT NOT NULL, seq INTEGER NOT NULL, payload TEXT NOT NULL,
  attempts INTEGER NOT NULL, first_responsibility_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL, next_attempt_at INTEGER NOT NULL, last_error TEXT,
  PRIMARY KEY (channel, message_id));
CREATE TABLE IF NOT EXISTS im_completed (
  channel TEXT NOT NULL, message_id TEXT NOT NULL, fingerprint TEXT NOT NULL,
  completed_at INTEGER NOT NULL, PRIMARY KEY (channel, message_id));
CREATE INDEX IF NOT EXISTS im_completed_age ON im_completed (completed_at);
";

fn exec(conn: &Connection, sql: &str, params: &[&dyn rusqlite::ToSql]) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute(params).map(|_| ())
}

/// Inserts or replaces one pending message.
pub fn save_pending(conn: &Connection, r: &PendingRecord) -> rusqlite::Result<()> {
    exec(
        conn,
        "INSERT OR REPLACE INTO im_pending (channel, message_id, seq, payload, attempts,
           first_responsibility_at, expires_at, next_attempt_at, last_error)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            r.channel.as_str(),
            r.message_id.as_str(),
            to_i64(r.seq),
            r.payload,
            r.attempts,
            to_i64(r.first_responsibility_at),
            to_i64(r.expires_at),
            to_i64(r.next_attempt_at),
            r.last_error
        ],
    )
}

/// Changes only the attempt bookkeeping of one pending message (the payload is not written
/// again); a missing one is not an error.
pub fn update_attempt(conn: &Connection, a: &AttemptUpdate) -> rusqlite::Result<()> {
    exec(
        conn,
        "UPDATE im_pending SET attempts = ?1, next_attempt_at = ?2, last_error = ?3
         WHERE channel = ?4 AND message_id = ?5",
        params![
            a.attempts,
            to_i64(a.next_attempt_at),
            a.last_error,
            a.channel.as_str(),
            a.message_id.as_str()
        ],
    )
}

/// Inserts or replaces one completed id.
pub fn save_completed(conn: &Connection, r: &CompletedRecord) -> rusqlite::Result<()> {
    exec(
        conn,
        "INSERT OR REPLACE INTO im_completed (channel, message_id, fingerprint, completed_at)
         VALUES (?1, ?2, ?3, ?4)",
        params![
            r.channel.as_str(),
            r.message_id.as_str(),
            r.fingerprint.as_str(),
            to_i64(r.completed_at)
        ],
    )
}

/// Keeps only the channel's `keep` most recently completed ids (ties broken by insertion);
/// `keep: 0` deletes all of them. Reads the channel's rows through the primary key.
pub fn trim_completed(
    conn: &Connection,
    channel: &ConnectorChannelId,
    keep: usize,
) -> rusqlite::Result<()> {
    exec(
        conn,
        "DELETE FROM im_completed WHERE channel = ?1 AND rowid NOT IN (
           SELECT rowid FROM im_completed WHERE channel = ?1
           ORDER BY completed_at DESC, rowid DESC LIMIT ?2)",
        params![channel.as_str(), to_i64(keep as u64)],
    )
}

/// Deletes every completed id completed before `before` (through the `completed_at` index).
pub fn expire_completed(conn: &Connection, before: u64) -> rusqlite::Result<()> {
    exec(conn, "DELETE FROM im_completed WHERE completed_at < ?1", params![to_i64(before)])
}

/// One completed id by its key: a point read on the primary key, through the statement cache.
pub fn lookup_completed(
    conn: &Connection,
    channel: &ConnectorChannelId,
    message_id: &MessageId,
) -> rusqlite::Result<Option<CompletedRecord>> {
    use rusqlite::OptionalExtension as _;
    conn.prepare_cached(
        "SELECT fingerprint, completed_at FROM im_completed WHERE channel = ?1 AND message_id = ?2",
    )?
    .query_row(params![channel.as_str(), message_id.as_str()], |row| {
        Ok(CompletedRecord {
            channel: channel.clone(),
            message_id: message_id.clone(),
            fingerprint: Fingerprint::from_hex(row.get::<_, String>(0)?),
            completed_at: to_u64(row.get(1)?),
        })
    })
    .optional()
}

/// Whether `channel` has pending or completed rows.
pub fn has_messages(conn: &Connection, channel: &ConnectorChannelId) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM im_pending WHERE channel = ?1)
         OR EXISTS (SELECT 1 FROM im_completed WHERE channel = ?1)",
    )?
    .query_row(params![channel.as_str()], |row| row.get(0))
}

/// Moves every pending and completed row of channel `from` to `to` (the Connector re-keyed
/// it). Run it inside the transaction that renames the rest of the channel's state. Refused
/// with a constraint error, changing nothing, when `to` already has rows of its own (two
/// channels' messages are never merged).
pub fn rename_channel(
    conn: &Connection,
    from: &ConnectorChannelId,
    to: &ConnectorChannelId,
) -> rusqlite::Result<()> {
    if from == to {
        return Ok(());
    }
    if has_messages(conn, to)? {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT),
            Some(format!("channel {to} already has stored messages; {from} cannot take its id")),
        ));
    }
    let ids = params![to.as_str(), from.as_str()];
    exec(conn, "UPDATE im_pending SET channel = ?1 WHERE channel = ?2", ids)?;
    exec(conn, "UPDATE im_completed SET channel = ?1 WHERE channel = ?2", ids)
}

/// One write of the outbox.
pub fn write_outbox(conn: &Connection, write: &OutboxWrite) -> rusqlite::Result<()> {
    match write {
        OutboxWrite::Save(record) => save_pending(conn, record),
        // A missing message is not an error.
        OutboxWrite::Delete(channel, message_id) => exec(
            conn,
            "DELETE FROM im_pending WHERE channel = ?1 AND message_id = ?2",
            params![channel.as_str(), message_id.as_str()],
        ),
        OutboxWrite::Attempt(update) => update_attempt(conn, update),
    }
}

/// One write of the receiver's idempotency set.
pub fn write_idempotency(conn: &Connection, write: &IdempotencyWrite) -> rusqlite::Result<()> {
    match write {
        IdempotencyWrite::Save(record) => save_completed(conn, record),
        IdempotencyWrite::Delete(channel, message_id) => exec(
            conn,
            "DELETE FROM im_completed WHERE channel = ?1 AND message_id = ?2",
            params![channel.as_str(), message_id.as_str()],
        ),
        IdempotencyWrite::Trim { channel, keep } => trim_completed(conn, channel, *keep),
        IdempotencyWrite::Expire { before } => expire_completed(conn, *before),
    }
}

/// Every pending message, in any order (the outbox sorts by `seq`).
pub fn load_pending(conn: &Connection) -> rusqlite::Result<Vec<PendingRecord>> {
    let mut stmt = conn.prepare(
        "SELECT channel, message_id, seq, payload, attempts, first_responsibility_at,
           expires_at, next_attempt_at, last_error FROM im_pending",
    )?;
    let rows = stmt.query_map([], |row| {
        Ok(PendingRecord {
            channel: ConnectorChannelId::new(row.get::<_, String>(0)?),
            message_id: MessageId::new(row.get::<_, String>(1)?),
            seq: to_u64(row.get(2)?),
            payload: row.get(3)?,
            attempts: row.get(4)?,
            first_responsibility_at: to_u64(row.get(5)?),
            expires_at: to_u64(row.get(6)?),
            next_attempt_at: to_u64(row.get(7)?),
            last_error: row.get(8)?,
        })
    })?;
    rows.collect()
}

/// Every completed id, in any order.
pub fn load_completed(conn: &Connection) -> rusqlite::Result<Vec<CompletedRecord>> {
    let mut stmt =
        conn.prepare("SELECT channel, message_id, fingerprint, completed_at FROM im_completed")?;
    let rows = stmt.query_map([], |row| {
        Ok(CompletedRecord {
            channel: ConnectorChannelId::new(row.get::<_, String>(0)?),
            message_id: MessageId::new(row.get::<_, String>(1)?),
            fingerprint: Fingerprint::from_hex(row.get::<_, String>(2)?),
            completed_at: to_u64(row.get(3)?),
        })
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(id: &str) -> PendingRecord {
        PendingRecord {
            channel: ConnectorChannelId::new("cch_1"),
            message_id: MessageId::new(id),
            seq: 3,
            payload: "{}".into(),
            attempts: 2,
            first_responsibility_at: 10,
            expires_at: u64::MAX,
            next_attempt_at: 12,
            last_error: Some("timeout".into()),
        }
    }

    fn completed(channel: &str, id: &str, at: u64) -> CompletedRecord {
        CompletedRecord {
            channel: ConnectorChannelId::new(channel),
            message_id: MessageId::new(id),
            fingerprint: Fingerprint::from_hex("ab"),
            completed_at: at,
        }
    }

    #[test]
    fn a_completed_id_is_found_by_a_point_read_on_its_key() -> rusqlite::Result<()> {
        let conn = Connection::open_in_memory()?;
        conn.execute_batch(SCHEMA)?;
        let record = completed("cch_1", "m_1", 5);
        write_idempotency(&conn, &IdempotencyWrite::Save(record.clone()))?;
        let (c1, c2) = (ConnectorChannelId::new("cch_1"), ConnectorChannelId::new("cch_2"));
        assert_eq!(lookup_completed(&conn, &c1, &MessageId::new("m_1"))?, Some(record));
        assert_eq!(lookup_completed(&conn, &c2, &MessageId::new("m_1"))?, None);
        assert_eq!(lookup_completed(&conn, &c1, &MessageId::new("m_2"))?, None);
        // The read uses the primary key, not a scan.
        let plan: String = conn.query_row(
            "EXPLAIN QUERY PLAN SELECT fingerprint, completed_at FROM im_completed
             WHERE channel = 'a' AND message_id = 'b'",
            [],
            |row| row.get(3),
        )?;
        assert!(plan.contains("USING INDEX"), "{plan}");
        Ok(())
    }

    #[test]
    fn trim_keeps_the_newest_per_channel_and_expire_deletes_by_age() -> rusqlite::Result<()> {
        let conn = Connection::open_in_memory()?;
        conn.execute_batch(SCHEMA)?;
        for (i, at) in [3u64, 1, 4, 2].into_iter().enumerate() {
            write_idempotency(
                &conn,
                &IdempotencyWrite::Save(completed("a", &format!("m{i}"), at)),
            )?;
        }
        write_idempotency(&conn, &IdempotencyWrite::Save(completed("b", "x", 1)))?;
        let a = ConnectorChannelId::new("a");
        write_idempotency(&conn, &IdempotencyWrite::Trim { channel: a.clone(), keep: 2 })?;
        let mut left: Vec<String> =
            load_completed(&conn)?.into_iter().map(|r| r.message_id.as_str().to_owned()).collect();
        left.sort();
        assert_eq!(left, ["m0", "m2", "x"], "a keeps its two newest (3 and 4); b untouched");
        write_idempotency(&conn, &IdempotencyWrite::Expire { before: 4 })?;
        let left: Vec<String> =
            load_completed(&conn)?.into_iter().map(|r| r.message_id.as_str().to_owned()).collect();
        assert_eq!(left, ["m2"]);
        write_idempotency(&conn, &IdempotencyWrite::Trim { channel: a, keep: 0 })?;
        assert!(load_completed(&conn)?.is_empty());
        Ok(())
    }

    #[test]
    fn pending_messages_round_trip_and_delete() -> rusqlite::Result<()> {
        let conn = Connection::open_in_memory()?;
        conn.execute_batch(SCHEMA)?;
        write_outbox(&conn, &OutboxWrite::Save(pending("m_1")))?;
        write_outbox(&conn, &OutboxWrite::Save(pending("m_2")))?;
        write_outbox(
            &conn,
            &OutboxWrite::Delete(ConnectorChannelId::new("cch_1"), MessageId::new("m_1")),
        )?;
        let mut expected = pending("m_2");
        // Stored as i64::MAX, read back as that.
        expected.expires_at = i64::MAX as u64;
        assert_eq!(load_pending(&conn)?, vec![expected]);
        Ok(())
    }

    #[test]
    fn attempt_update_changes_only_the_bookkeeping_and_survives_a_reopen() -> rusqlite::Result<()> {
        let dir =
            tempfile::tempdir().map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        let path = dir.path().join("state.db");
        let update = AttemptUpdate {
            channel: ConnectorChannelId::new("cch_1"),
            message_id: MessageId::new("m_1"),
            attempts: 5,
            next_attempt_at: 99,
            last_error: Some("ack timeout".into()),
        };
        {
            let conn = Connection::open(&path)?;
            conn.execute_batch(SCHEMA)?;
            write_outbox(&conn, &OutboxWrite::Save(pending("m_1")))?;
            write_outbox(&conn, &OutboxWrite::Attempt(update.clone()))?;
            // A missing record is not an error and creates nothing.
            let mut missing = update.clone();
            missing.message_id = MessageId::new("m_gone");
            write_outbox(&conn, &OutboxWrite::Attempt(missing))?;
        }
        let conn = Connection::open(&path)?;
        let mut expected = pending("m_1");
        expected.expires_at = i64::MAX as u64;
        expected.attempts = 5;
        expected.next_attempt_at = 99;
        expected.last_error = Some("ack timeout".into());
        assert_eq!(load_pending(&conn)?, vec![expected]);
        Ok(())
    }

    #[test]
    fn rename_moves_both_tables_and_refuses_a_target_with_rows() -> rusqlite::Result<()> {
        let conn = Connection::open_in_memory()?;
        conn.execute_batch(SCHEMA)?;
        write_outbox(&conn, &OutboxWrite::Save(pending("m_1")))?;
        write_idempotency(&conn, &IdempotencyWrite::Save(completed("cch_1", "in_1", 5)))?;
        write_idempotency(&conn, &IdempotencyWrite::Save(completed("cch_3", "in_3", 5)))?;
        let (old, new) = (ConnectorChannelId::new("cch_1"), ConnectorChannelId::new("cch_2"));
        rename_channel(&conn, &old, &new)?;
        let pending_channels: Vec<String> =
            load_pending(&conn)?.into_iter().map(|r| r.channel.as_str().to_owned()).collect();
        assert_eq!(pending_channels, ["cch_2"]);
        assert!(lookup_completed(&conn, &new, &MessageId::new("in_1"))?.is_some());
        assert!(lookup_completed(&conn, &old, &MessageId::new("in_1"))?.is_none());
        // Onto a channel that has rows of its own: refused, nothing moved.
        let third = ConnectorChannelId::new("cch_3");
        let refused = rename_channel(&conn, &new, &third);
        assert!(
            matches!(&refused, Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::ConstraintViolation),
            "{refused:?}"
        );
        assert!(lookup_completed(&conn, &new, &MessageId::new("in_1"))?.is_some());
        assert_eq!(load_pending(&conn)?.len(), 1);
        Ok(())
    }
}
