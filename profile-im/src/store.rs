//! Persistence seam. The state machines write through these traits before they change their
//! in-memory state, so a crash never loses a message the sender took responsibility for and
//! never forgets a message the receiver already accepted.
//!
//! The records are flat rows keyed by `(channel, message_id)` with plain integer and text
//! columns, so an SQLite backend is one table per trait:
//!
//! ```text
//! CREATE TABLE im_pending (channel TEXT, message_id TEXT, seq INTEGER, payload TEXT,
//!   attempts INTEGER, first_responsibility_at INTEGER, expires_at INTEGER,
//!   next_attempt_at INTEGER, last_error TEXT, PRIMARY KEY (channel, message_id));
//! CREATE TABLE im_completed (channel TEXT, message_id TEXT, fingerprint TEXT,
//!   completed_at INTEGER, PRIMARY KEY (channel, message_id));
//! CREATE INDEX im_completed_age ON im_completed (completed_at);
//! ```
//!
//! `save_*` is an upsert (`INSERT ... ON CONFLICT DO UPDATE`). Methods are synchronous because
//! the machines are sans-I/O and an embedded database call is short.
//!
//! The receiver's completed ids are read back one at a time
//! ([`IdempotencyStore::lookup_completed`], on every id its small in-memory cache does not
//! hold), so a backend should answer that with an indexed point read; its bounds arrive as
//! writes ([`IdempotencyWrite::Trim`] per channel, [`IdempotencyWrite::Expire`] by age).
//!
//! Batching: [`OutboxStore::apply`] takes several writes at once, and a backend makes them one
//! transaction (all or none). The outbox hands every pass over its channels to the store as one
//! batch; with [`crate::WriteMode::Deferred`] it does not touch the store at all when it
//! changes, and the runtime takes the writes ([`crate::Outbox::take_writes`]) to commit them
//! together with other work (group commit), acknowledging nothing before that commit.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use xagent_protocol_types::{ConnectorChannelId, MessageId};

use crate::{Fingerprint, StoreError};

/// One message the sender is responsible for, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingRecord {
    /// The channel.
    pub channel: ConnectorChannelId,
    /// The business id.
    pub message_id: MessageId,
    /// Enqueue order (global, increasing); restores the per-channel FIFO after a restart.
    pub seq: u64,
    /// The payload as JSON text: `{"type":"chat.message"|"message.push","payload":{...}}`.
    pub payload: String,
    /// Transmissions handed out so far.
    pub attempts: u32,
    /// When the sender first took responsibility (Unix ms). Never changes.
    pub first_responsibility_at: u64,
    /// `first_responsibility_at + TTL` (Unix ms). Never extended.
    pub expires_at: u64,
    /// Earliest time of the next transmission (Unix ms).
    pub next_attempt_at: u64,
    /// The most recent failure, for operators.
    pub last_error: Option<String>,
}

/// One message the receiver has completed, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletedRecord {
    /// The channel.
    pub channel: ConnectorChannelId,
    /// The business id.
    pub message_id: MessageId,
    /// Content fingerprint, to tell a duplicate from a conflict.
    pub fingerprint: Fingerprint,
    /// When the side effect completed (Unix ms); drives age-based eviction.
    pub completed_at: u64,
}

/// One write to the outbox's table, for [`OutboxStore::apply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutboxWrite {
    /// Insert or replace the record with the same `(channel, message_id)`.
    Save(PendingRecord),
    /// Delete one record (a missing one is not an error).
    Delete(ConnectorChannelId, MessageId),
    /// Change only the attempt bookkeeping of a stored record (a missing one is not an
    /// error): the payload is not written again for every transmission.
    Attempt(AttemptUpdate),
}

/// The attempt bookkeeping of one pending record, for [`OutboxWrite::Attempt`]: the columns of
/// a [`PendingRecord`] that change while it is pending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptUpdate {
    /// The channel.
    pub channel: ConnectorChannelId,
    /// The business id.
    pub message_id: MessageId,
    /// Transmissions handed out so far.
    pub attempts: u32,
    /// Earliest time of the next transmission (Unix ms).
    pub next_attempt_at: u64,
    /// The most recent failure, for operators.
    pub last_error: Option<String>,
}

impl AttemptUpdate {
    /// The bookkeeping of `record`, as it is now.
    pub fn of(record: &PendingRecord) -> Self {
        Self {
            channel: record.channel.clone(),
            message_id: record.message_id.clone(),
            attempts: record.attempts,
            next_attempt_at: record.next_attempt_at,
            last_error: record.last_error.clone(),
        }
    }

    /// Copies the bookkeeping into `record` (the same key).
    pub fn apply_to(&self, record: &mut PendingRecord) {
        record.attempts = self.attempts;
        record.next_attempt_at = self.next_attempt_at;
        record.last_error.clone_from(&self.last_error);
    }
}

impl OutboxWrite {
    /// The `(channel, message_id)` the write is about.
    pub fn key(&self) -> (&ConnectorChannelId, &MessageId) {
        match self {
            Self::Save(r) => (&r.channel, &r.message_id),
            Self::Delete(c, m) => (c, m),
            Self::Attempt(a) => (&a.channel, &a.message_id),
        }
    }
}

/// One write to the receiver's idempotency table, for [`IdempotencyStore::apply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdempotencyWrite {
    /// Insert or replace the record with the same `(channel, message_id)`.
    Save(CompletedRecord),
    /// Delete one record (a missing one is not an error).
    Delete(ConnectorChannelId, MessageId),
    /// Keep only the channel's `keep` most recently completed records (latest `completed_at`
    /// first); `keep: 0` forgets the channel's whole set. The capacity bound, applied in the
    /// store.
    Trim {
        /// The channel.
        channel: ConnectorChannelId,
        /// How many of its newest records stay.
        keep: usize,
    },
    /// Delete every record completed before `before` (Unix ms): the age bound, applied in the
    /// store.
    Expire {
        /// Cut-off (exclusive).
        before: u64,
    },
}

/// Drops writes that a later write in the same batch makes pointless: an earlier write of a
/// key that is saved again or deleted later, or an earlier attempt update followed by
/// another. An attempt update after a save of the same key is folded into that save (the
/// insert must not be lost); one after a delete is dropped (there is no row to update). What
/// is left has the same effect per key, with at most one write per key.
pub fn coalesce_outbox_writes(writes: Vec<OutboxWrite>) -> Vec<OutboxWrite> {
    if writes.len() < 2 {
        return writes;
    }
    // Per key: its last save or delete, and the last attempt update after that.
    type Key<'a> = (&'a ConnectorChannelId, &'a MessageId);
    let mut last: std::collections::HashMap<Key<'_>, (Option<usize>, Option<usize>)> =
        std::collections::HashMap::with_capacity(writes.len());
    for (index, write) in writes.iter().enumerate() {
        let slot = last.entry(write.key()).or_default();
        match write {
            OutboxWrite::Attempt(_) => slot.1 = Some(index),
            OutboxWrite::Save(_) | OutboxWrite::Delete(..) => *slot = (Some(index), None),
        }
    }
    let mut keep = vec![false; writes.len()];
    let mut folds = Vec::new();
    for (anchor, attempt) in last.into_values() {
        match (anchor, attempt) {
            (Some(at), Some(update)) => {
                keep[at] = true;
                if matches!(writes[at], OutboxWrite::Save(_)) {
                    folds.push((at, update));
                }
            }
            (Some(at), None) | (None, Some(at)) => keep[at] = true,
            (None, None) => {}
        }
    }
    let mut slots: Vec<Option<OutboxWrite>> = writes.into_iter().map(Some).collect();
    for (save, update) in folds {
        if let Some(OutboxWrite::Attempt(update)) = slots[update].take()
            && let Some(OutboxWrite::Save(record)) = slots[save].as_mut()
        {
            update.apply_to(record);
        }
    }
    slots.into_iter().zip(keep).filter_map(|(w, keep)| if keep { w } else { None }).collect()
}

/// Storage of the sender's pending messages.
pub trait OutboxStore {
    /// Inserts or replaces the record with the same `(channel, message_id)`.
    fn save_pending(&mut self, record: &PendingRecord) -> Result<(), StoreError>;
    /// Deletes one record; deleting a missing record is not an error.
    fn delete_pending(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError>;
    /// Every stored record, in any order (the outbox sorts by `seq`).
    fn load_pending(&mut self) -> Result<Vec<PendingRecord>, StoreError>;
    /// Applies several writes in order, as one transaction where the backend has them (all
    /// or none). The default applies them one by one.
    fn apply(&mut self, writes: &[OutboxWrite]) -> Result<(), StoreError> {
        for write in writes {
            match write {
                OutboxWrite::Save(record) => self.save_pending(record)?,
                OutboxWrite::Delete(channel, message_id) => {
                    self.delete_pending(channel, message_id)?;
                }
                OutboxWrite::Attempt(update) => self.save_attempt(update)?,
            }
        }
        Ok(())
    }
    /// Changes only the attempt bookkeeping of a stored record; a missing record is not an
    /// error. The default reads the records back and saves the one it finds: a backend
    /// should override it with a narrow update.
    fn save_attempt(&mut self, update: &AttemptUpdate) -> Result<(), StoreError> {
        let found = self
            .load_pending()?
            .into_iter()
            .find(|r| r.channel == update.channel && r.message_id == update.message_id);
        match found {
            Some(mut record) => {
                update.apply_to(&mut record);
                self.save_pending(&record)
            }
            None => Ok(()),
        }
    }
}

/// Storage of the receiver's completed-message idempotency set.
pub trait IdempotencyStore {
    /// Inserts or replaces the record with the same `(channel, message_id)`.
    fn save_completed(&mut self, record: &CompletedRecord) -> Result<(), StoreError>;
    /// Deletes one record; deleting a missing record is not an error.
    fn delete_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError>;
    /// Every stored record, in any order.
    fn load_completed(&mut self) -> Result<Vec<CompletedRecord>, StoreError>;
    /// The stored record of one `(channel, message_id)`, if any: the receiver asks on every
    /// id its in-memory cache does not hold, so a backend answers with an indexed point read.
    /// The default scans [`IdempotencyStore::load_completed`] (correct, but slow).
    fn lookup_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError> {
        Ok(self
            .load_completed()?
            .into_iter()
            .find(|r| &r.channel == channel && &r.message_id == message_id))
    }
    /// Keeps only the channel's `keep` newest records (see [`IdempotencyWrite::Trim`]). The
    /// default works through [`IdempotencyStore::load_completed`] and single deletes.
    fn trim_completed(
        &mut self,
        channel: &ConnectorChannelId,
        keep: usize,
    ) -> Result<(), StoreError> {
        let mut records: Vec<CompletedRecord> =
            self.load_completed()?.into_iter().filter(|r| &r.channel == channel).collect();
        records.sort_by_key(|r| std::cmp::Reverse(r.completed_at));
        for r in records.iter().skip(keep) {
            self.delete_completed(&r.channel, &r.message_id)?;
        }
        Ok(())
    }
    /// Deletes every record completed before `before` (see [`IdempotencyWrite::Expire`]). The
    /// default works through [`IdempotencyStore::load_completed`] and single deletes.
    fn expire_completed(&mut self, before: u64) -> Result<(), StoreError> {
        for r in self.load_completed()? {
            if r.completed_at < before {
                self.delete_completed(&r.channel, &r.message_id)?;
            }
        }
        Ok(())
    }
    /// Applies several writes in order, as one transaction where the backend has them (all
    /// or none). The default applies them one by one.
    fn apply(&mut self, writes: &[IdempotencyWrite]) -> Result<(), StoreError> {
        for write in writes {
            match write {
                IdempotencyWrite::Save(record) => self.save_completed(record)?,
                IdempotencyWrite::Delete(channel, message_id) => {
                    self.delete_completed(channel, message_id)?;
                }
                IdempotencyWrite::Trim { channel, keep } => self.trim_completed(channel, *keep)?,
                IdempotencyWrite::Expire { before } => self.expire_completed(*before)?,
            }
        }
        Ok(())
    }
}

/// A boxed store is a store: the runtimes keep their backend behind `Box<dyn OutboxStore + Send>`
/// and every method, `apply` included, reaches the backend's own implementation.
impl<S: OutboxStore + ?Sized> OutboxStore for Box<S> {
    fn save_pending(&mut self, record: &PendingRecord) -> Result<(), StoreError> {
        (**self).save_pending(record)
    }
    fn delete_pending(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError> {
        (**self).delete_pending(channel, message_id)
    }
    fn load_pending(&mut self) -> Result<Vec<PendingRecord>, StoreError> {
        (**self).load_pending()
    }
    fn apply(&mut self, writes: &[OutboxWrite]) -> Result<(), StoreError> {
        (**self).apply(writes)
    }
    fn save_attempt(&mut self, update: &AttemptUpdate) -> Result<(), StoreError> {
        (**self).save_attempt(update)
    }
}

/// A boxed store is a store (see the `OutboxStore` impl for `Box`).
impl<S: IdempotencyStore + ?Sized> IdempotencyStore for Box<S> {
    fn save_completed(&mut self, record: &CompletedRecord) -> Result<(), StoreError> {
        (**self).save_completed(record)
    }
    fn delete_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError> {
        (**self).delete_completed(channel, message_id)
    }
    fn load_completed(&mut self) -> Result<Vec<CompletedRecord>, StoreError> {
        (**self).load_completed()
    }
    fn lookup_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError> {
        (**self).lookup_completed(channel, message_id)
    }
    fn trim_completed(
        &mut self,
        channel: &ConnectorChannelId,
        keep: usize,
    ) -> Result<(), StoreError> {
        (**self).trim_completed(channel, keep)
    }
    fn expire_completed(&mut self, before: u64) -> Result<(), StoreError> {
        (**self).expire_completed(before)
    }
    fn apply(&mut self, writes: &[IdempotencyWrite]) -> Result<(), StoreError> {
        (**self).apply(writes)
    }
}

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
