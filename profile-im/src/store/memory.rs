//! [`MemoryStore`]: both stores in memory, shared by clones (tests, ephemeral processes).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use xagent_protocol_types::{ConnectorChannelId, MessageId};

use super::records::*;
use super::traits::*;
use crate::StoreError;

type Key = (ConnectorChannelId, MessageId);

#[derive(Debug, Default)]
struct Tables {
    pending: BTreeMap<Key, PendingRecord>,
    completed: BTreeMap<Key, CompletedRecord>,
    failing: bool,
    /// Write calls (each would be one transaction in a database).
    transactions: u64,
}

/// An in-memory store for tests and single-process use. Clones share the same tables, so a
/// test can drop a machine and restore a new one from a clone to simulate a restart.
/// [`MemoryStore::set_failing`] makes every call fail, to test storage errors.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore(Arc<Mutex<Tables>>);

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        // A poisoned lock only means another thread panicked mid-call; the maps are still
        // consistent because every operation is a single insert/remove.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes every following call fail (true) or succeed again (false).
    pub fn set_failing(&self, failing: bool) {
        self.tables().failing = failing;
    }

    /// How many write calls reached the store (single writes and batches alike): each would
    /// be one transaction in a database.
    pub fn transactions(&self) -> u64 {
        self.tables().transactions
    }

    /// Number of stored pending records.
    pub fn pending_len(&self) -> usize {
        self.tables().pending.len()
    }

    /// Number of stored completed records.
    pub fn completed_len(&self) -> usize {
        self.tables().completed.len()
    }

    /// A copy of one pending record.
    pub fn pending(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Option<PendingRecord> {
        self.tables().pending.get(&(channel.clone(), message_id.clone())).cloned()
    }

    /// Moves every pending and completed record of channel `from` to `to` (the Connector
    /// re-keyed it), all or none: refused, changing nothing, when `to` already has records.
    pub fn rename_channel(
        &self,
        from: &ConnectorChannelId,
        to: &ConnectorChannelId,
    ) -> Result<(), StoreError> {
        let mut t = self.check("rename_channel")?;
        if from == to {
            return Ok(());
        }
        let taken = t.pending.keys().chain(t.completed.keys()).any(|(channel, _)| channel == to);
        if taken {
            return Err(StoreError::new(
                "rename_channel",
                format!("channel {to} already has stored messages; {from} cannot take its id"),
            ));
        }
        t.transactions += 1;
        let tables = &mut *t;
        rename_keys(&mut tables.pending, from, to, |r| r.channel = to.clone());
        rename_keys(&mut tables.completed, from, to, |r| r.channel = to.clone());
        Ok(())
    }

    fn check(&self, operation: &'static str) -> Result<MutexGuard<'_, Tables>, StoreError> {
        let tables = self.tables();
        if tables.failing {
            return Err(StoreError::new(operation, "the memory store is set to fail"));
        }
        Ok(tables)
    }
}

/// Moves the records of channel `from` to `to` in one table, rewriting each record's channel.
fn rename_keys<R>(
    table: &mut BTreeMap<Key, R>,
    from: &ConnectorChannelId,
    to: &ConnectorChannelId,
    retag: impl Fn(&mut R),
) {
    let keys: Vec<Key> = table.keys().filter(|(channel, _)| channel == from).cloned().collect();
    for key in keys {
        if let Some(mut record) = table.remove(&key) {
            retag(&mut record);
            table.insert((to.clone(), key.1), record);
        }
    }
}

impl OutboxStore for MemoryStore {
    fn save_pending(&mut self, record: &PendingRecord) -> Result<(), StoreError> {
        let mut t = self.check("save_pending")?;
        t.transactions += 1;
        t.pending.insert((record.channel.clone(), record.message_id.clone()), record.clone());
        Ok(())
    }

    fn delete_pending(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError> {
        let mut t = self.check("delete_pending")?;
        t.transactions += 1;
        t.pending.remove(&(channel.clone(), message_id.clone()));
        Ok(())
    }

    fn save_attempt(&mut self, update: &AttemptUpdate) -> Result<(), StoreError> {
        OutboxStore::apply(self, std::slice::from_ref(&OutboxWrite::Attempt(update.clone())))
    }

    fn apply(&mut self, writes: &[OutboxWrite]) -> Result<(), StoreError> {
        // All or none: the failing switch is checked once, before any change.
        let mut t = self.check("apply")?;
        t.transactions += 1;
        for write in writes {
            match write {
                OutboxWrite::Save(r) => {
                    t.pending.insert((r.channel.clone(), r.message_id.clone()), r.clone());
                }
                OutboxWrite::Delete(c, m) => {
                    t.pending.remove(&(c.clone(), m.clone()));
                }
                OutboxWrite::Attempt(a) => {
                    if let Some(r) = t.pending.get_mut(&(a.channel.clone(), a.message_id.clone())) {
                        a.apply_to(r);
                    }
                }
            }
        }
        Ok(())
    }

    fn load_pending(&mut self) -> Result<Vec<PendingRecord>, StoreError> {
        let t = self.check("load_pending")?;
        Ok(t.pending.values().cloned().collect())
    }
}

impl IdempotencyStore for MemoryStore {
    fn save_completed(&mut self, record: &CompletedRecord) -> Result<(), StoreError> {
        let mut t = self.check("save_completed")?;
        t.transactions += 1;
        t.completed.insert((record.channel.clone(), record.message_id.clone()), record.clone());
        Ok(())
    }

    fn delete_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError> {
        let mut t = self.check("delete_completed")?;
        t.transactions += 1;
        t.completed.remove(&(channel.clone(), message_id.clone()));
        Ok(())
    }

    fn apply(&mut self, writes: &[IdempotencyWrite]) -> Result<(), StoreError> {
        let mut t = self.check("apply")?;
        t.transactions += 1;
        for write in writes {
            match write {
                IdempotencyWrite::Save(r) => {
                    t.completed.insert((r.channel.clone(), r.message_id.clone()), r.clone());
                }
                IdempotencyWrite::Delete(c, m) => {
                    t.completed.remove(&(c.clone(), m.clone()));
                }
                IdempotencyWrite::Trim { channel, keep } => t.trim(channel, *keep),
                IdempotencyWrite::Expire { before } => {
                    t.completed.retain(|_, r| r.completed_at >= *before);
                }
            }
        }
        Ok(())
    }

    fn load_completed(&mut self) -> Result<Vec<CompletedRecord>, StoreError> {
        let t = self.check("load_completed")?;
        Ok(t.completed.values().cloned().collect())
    }

    /// From the map (no scan).
    fn lookup_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError> {
        let t = self.check("lookup_completed")?;
        Ok(t.completed.get(&(channel.clone(), message_id.clone())).cloned())
    }

    fn trim_completed(
        &mut self,
        channel: &ConnectorChannelId,
        keep: usize,
    ) -> Result<(), StoreError> {
        IdempotencyStore::apply(self, &[IdempotencyWrite::Trim { channel: channel.clone(), keep }])
    }

    fn expire_completed(&mut self, before: u64) -> Result<(), StoreError> {
        IdempotencyStore::apply(self, &[IdempotencyWrite::Expire { before }])
    }
}

impl Tables {
    /// Keeps the channel's `keep` newest completed records (latest `completed_at` first).
    fn trim(&mut self, channel: &ConnectorChannelId, keep: usize) {
        let mut ids: Vec<(u64, MessageId)> = self
            .completed
            .values()
            .filter(|r| &r.channel == channel)
            .map(|r| (r.completed_at, r.message_id.clone()))
            .collect();
        if ids.len() <= keep {
            return;
        }
        ids.sort_by_key(|id| std::cmp::Reverse(id.0));
        for (_, id) in ids.into_iter().skip(keep) {
            self.completed.remove(&(channel.clone(), id));
        }
    }
}
