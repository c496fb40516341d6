//! The stored records and the writes the state machines hand to a store.

use xagent_protocol_types::{ConnectorChannelId, MessageId};

use crate::Fingerprint;

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

/// One write to the outbox's table, for [`OutboxStore::apply`](crate::OutboxStore::apply).
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

/// One write to the receiver's idempotency table, for [`IdempotencyStore::apply`](crate::IdempotencyStore::apply).
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
