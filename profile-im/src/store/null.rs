//! Stores that keep nothing: [`NoStore`] and [`DeferredStore`].

use xagent_protocol_types::{ConnectorChannelId, MessageId};

use super::records::*;
use super::traits::*;
use crate::StoreError;

/// A store that keeps nothing: for a process that accepts losing state on restart. Loading
/// returns nothing and every write succeeds.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoStore;

impl OutboxStore for NoStore {
    fn save_pending(&mut self, _: &PendingRecord) -> Result<(), StoreError> {
        Ok(())
    }
    fn delete_pending(&mut self, _: &ConnectorChannelId, _: &MessageId) -> Result<(), StoreError> {
        Ok(())
    }
    fn load_pending(&mut self) -> Result<Vec<PendingRecord>, StoreError> {
        Ok(Vec::new())
    }
    fn save_attempt(&mut self, _: &AttemptUpdate) -> Result<(), StoreError> {
        Ok(())
    }
}

impl IdempotencyStore for NoStore {
    fn save_completed(&mut self, _: &CompletedRecord) -> Result<(), StoreError> {
        Ok(())
    }
    fn delete_completed(
        &mut self,
        _: &ConnectorChannelId,
        _: &MessageId,
    ) -> Result<(), StoreError> {
        Ok(())
    }
    fn load_completed(&mut self) -> Result<Vec<CompletedRecord>, StoreError> {
        Ok(Vec::new())
    }
    fn lookup_completed(
        &mut self,
        _: &ConnectorChannelId,
        _: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError> {
        Ok(None)
    }
    fn trim_completed(&mut self, _: &ConnectorChannelId, _: usize) -> Result<(), StoreError> {
        Ok(())
    }
    fn expire_completed(&mut self, _: u64) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The store of a machine driven by async code in [`crate::WriteMode::Deferred`]: the caller
/// loads the records itself (from an async backend) and hands them over once, and commits the
/// writes the machine returns. The outbox takes the records at open; the receiver's lookups are
/// the caller's ([`crate::ReceiverIdempotency::needs_lookup`]). Any write reaching this store
/// is a misuse and fails loudly, so nothing is silently dropped.
#[derive(Debug, Default)]
pub struct DeferredStore {
    pending: Vec<PendingRecord>,
}

impl DeferredStore {
    /// A store that hands `pending` (the outbox records the caller loaded) to the outbox once.
    pub fn with_pending(pending: Vec<PendingRecord>) -> Self {
        Self { pending }
    }
}

fn deferred_misuse(operation: &'static str) -> StoreError {
    StoreError::new(
        operation,
        "this machine runs deferred: commit the writes it returns (take_writes, \
         complete_deferred, prune_deferred) and look records up before admitting",
    )
}

impl OutboxStore for DeferredStore {
    fn save_pending(&mut self, _: &PendingRecord) -> Result<(), StoreError> {
        Err(deferred_misuse("save_pending"))
    }
    fn delete_pending(&mut self, _: &ConnectorChannelId, _: &MessageId) -> Result<(), StoreError> {
        Err(deferred_misuse("delete_pending"))
    }
    fn load_pending(&mut self) -> Result<Vec<PendingRecord>, StoreError> {
        Ok(std::mem::take(&mut self.pending))
    }
    fn save_attempt(&mut self, _: &AttemptUpdate) -> Result<(), StoreError> {
        Err(deferred_misuse("save_attempt"))
    }
}

impl IdempotencyStore for DeferredStore {
    fn save_completed(&mut self, _: &CompletedRecord) -> Result<(), StoreError> {
        Err(deferred_misuse("save_completed"))
    }
    fn delete_completed(
        &mut self,
        _: &ConnectorChannelId,
        _: &MessageId,
    ) -> Result<(), StoreError> {
        Err(deferred_misuse("delete_completed"))
    }
    fn load_completed(&mut self) -> Result<Vec<CompletedRecord>, StoreError> {
        Err(deferred_misuse("load_completed"))
    }
    fn lookup_completed(
        &mut self,
        _: &ConnectorChannelId,
        _: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError> {
        Err(deferred_misuse("lookup_completed"))
    }
    fn apply(&mut self, writes: &[IdempotencyWrite]) -> Result<(), StoreError> {
        if writes.is_empty() { Ok(()) } else { Err(deferred_misuse("apply")) }
    }
}
