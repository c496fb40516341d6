//! `profile-im`'s outbox and receiver-idempotency stores on the SQLite storage: loads read
//! the reader connection, writes go through the group-commit writer (a batch is one
//! transaction).

use xagent_profile_im::{
    CompletedRecord, Fingerprint, IdempotencyStore, IdempotencyWrite, OutboxStore, OutboxWrite,
    PendingRecord, StoreError,
};
use xagent_protocol_types::{ConnectorChannelId, MessageId};

use super::WriteOp;
use super::sqlite::{SqliteStorage, to_u64};

fn store_err(operation: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError::from_source(operation, e)
}

impl OutboxStore for SqliteStorage {
    fn save_pending(&mut self, r: &PendingRecord) -> Result<(), StoreError> {
        OutboxStore::apply(self, &[OutboxWrite::Save(r.clone())])
    }

    fn delete_pending(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError> {
        OutboxStore::apply(self, &[OutboxWrite::Delete(channel.clone(), message_id.clone())])
    }

    /// One transaction through the group-commit writer.
    fn apply(&mut self, writes: &[OutboxWrite]) -> Result<(), StoreError> {
        let ops = writes.iter().cloned().map(WriteOp::Outbox).collect();
        self.write(ops).map_err(|e| StoreError::from_source("outbox write", e))
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
        IdempotencyStore::apply(self, &[IdempotencyWrite::Save(r.clone())])
    }

    fn delete_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError> {
        IdempotencyStore::apply(
            self,
            &[IdempotencyWrite::Delete(channel.clone(), message_id.clone())],
        )
    }

    /// One transaction through the group-commit writer.
    fn apply(&mut self, writes: &[IdempotencyWrite]) -> Result<(), StoreError> {
        let ops = writes.iter().cloned().map(WriteOp::Idempotency).collect();
        self.write(ops).map_err(|e| StoreError::from_source("idempotency write", e))
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
