//! The two store traits the state machines write through.

use xagent_protocol_types::{ConnectorChannelId, MessageId};

use super::records::*;
use crate::StoreError;

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
