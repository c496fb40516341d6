//! `profile-im`'s outbox and receiver-idempotency stores on the SQLite storage.

use rusqlite::params;
use xagent_profile_im::{
    CompletedRecord, Fingerprint, IdempotencyStore, OutboxStore, PendingRecord, StoreError,
};
use xagent_protocol_types::{ConnectorChannelId, MessageId};

use super::sqlite::{SqliteStorage, exec, to_i64, to_u64};

fn store_err(operation: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError::new(operation, e.to_string())
}

impl OutboxStore for SqliteStorage {
    fn save_pending(&mut self, r: &PendingRecord) -> Result<(), StoreError> {
        exec(
            &self.lock(),
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
        .map(|_| ())
        .map_err(store_err("save_pending"))
    }

    fn delete_pending(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError> {
        exec(
            &self.lock(),
            "DELETE FROM im_pending WHERE channel = ?1 AND message_id = ?2",
            params![channel.as_str(), message_id.as_str()],
        )
        .map(|_| ())
        .map_err(store_err("delete_pending"))
    }

    fn load_pending(&mut self) -> Result<Vec<PendingRecord>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare(
                "SELECT channel, message_id, seq, payload, attempts, first_responsibility_at,
                   expires_at, next_attempt_at, last_error FROM im_pending",
            )
            .map_err(store_err("load_pending"))?;
        let rows = stmt
            .query_map([], |row| {
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
            })
            .map_err(store_err("load_pending"))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(store_err("load_pending"))
    }
}

impl IdempotencyStore for SqliteStorage {
    fn save_completed(&mut self, r: &CompletedRecord) -> Result<(), StoreError> {
        exec(
            &self.lock(),
            "INSERT OR REPLACE INTO im_completed (channel, message_id, fingerprint, completed_at)
                 VALUES (?1, ?2, ?3, ?4)",
            params![
                r.channel.as_str(),
                r.message_id.as_str(),
                r.fingerprint.as_str(),
                to_i64(r.completed_at)
            ],
        )
        .map(|_| ())
        .map_err(store_err("save_completed"))
    }

    fn delete_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError> {
        exec(
            &self.lock(),
            "DELETE FROM im_completed WHERE channel = ?1 AND message_id = ?2",
            params![channel.as_str(), message_id.as_str()],
        )
        .map(|_| ())
        .map_err(store_err("delete_completed"))
    }

    fn load_completed(&mut self) -> Result<Vec<CompletedRecord>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare("SELECT channel, message_id, fingerprint, completed_at FROM im_completed")
            .map_err(store_err("load_completed"))?;
        let rows = stmt
            .query_map([], |row| {
                Ok(CompletedRecord {
                    channel: ConnectorChannelId::new(row.get::<_, String>(0)?),
                    message_id: MessageId::new(row.get::<_, String>(1)?),
                    fingerprint: Fingerprint::from_hex(row.get::<_, String>(2)?),
                    completed_at: to_u64(row.get(3)?),
                })
            })
            .map_err(store_err("load_completed"))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(store_err("load_completed"))
    }
}
