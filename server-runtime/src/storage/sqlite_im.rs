//! `profile-im`'s outbox and receiver-idempotency stores on the SQLite storage: loads read
//! the reader connection, writes go through the group-commit writer (a batch is one
//! transaction).

use xagent_profile_im::{
    CompletedRecord, IdempotencyStore, IdempotencyWrite, OutboxStore, OutboxWrite, PendingRecord,
    StoreError,
};
use xagent_protocol_types::{ConnectorChannelId, MessageId};

use super::WriteOp;
use super::sqlite::SqliteStorage;

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
        xagent_im_sqlite::load_pending(&self.lock()).map_err(store_err("load_pending"))
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
        xagent_im_sqlite::load_completed(&self.lock()).map_err(store_err("load_completed"))
    }
}
