//! `profile-im`'s outbox and receiver-idempotency stores on the SQLite storage: loads and the
//! receiver's point lookups read the reader connection, writes go through the group-commit
//! writer (a batch is one transaction).

use xagent_profile_im::{
    AttemptUpdate, CompletedRecord, IdempotencyStore, IdempotencyWrite, OutboxStore, OutboxWrite,
    PendingRecord, StoreError,
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

    /// A narrow `UPDATE` through the group-commit writer (the payload is not written again).
    fn save_attempt(&mut self, update: &AttemptUpdate) -> Result<(), StoreError> {
        OutboxStore::apply(self, &[OutboxWrite::Attempt(update.clone())])
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

    /// A point read on the reader connection (WAL: it never waits for the writer's commit).
    /// What it sees is committed; a completion still in the writer's batch is held in memory
    /// by the receiver until its commit (see `ReceiverIdempotency::committed`).
    fn lookup_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError> {
        xagent_im_sqlite::lookup_completed(&self.lock(), channel, message_id)
            .map_err(store_err("lookup_completed"))
    }

    /// One statement through the group-commit writer.
    fn trim_completed(
        &mut self,
        channel: &ConnectorChannelId,
        keep: usize,
    ) -> Result<(), StoreError> {
        IdempotencyStore::apply(self, &[IdempotencyWrite::Trim { channel: channel.clone(), keep }])
    }

    /// One statement through the group-commit writer.
    fn expire_completed(&mut self, before: u64) -> Result<(), StoreError> {
        IdempotencyStore::apply(self, &[IdempotencyWrite::Expire { before }])
    }
}
