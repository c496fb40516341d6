//! Completing, abandoning and pruning admitted messages, channel renames, and the counters.

use std::sync::Arc;

use xagent_protocol_types::{ChatMessageAck, ConnectorChannelId, ErrorCode, MessageId};

use crate::IdempotencyError;
use crate::store::{CompletedRecord, IdempotencyStore, IdempotencyWrite};

use super::config::*;
use super::state::*;

impl<S: IdempotencyStore> ReceiverIdempotency<S> {
    /// The side effect is done: records the id in the store (one batch, with a capacity trim
    /// when one is due) and returns the `accepted` ack. If the store fails the id is still
    /// remembered in memory (the effect happened, a repeat in this process must stay a
    /// duplicate) and the error is returned for the caller to log; the caller should still
    /// send `accepted`.
    pub fn complete(
        &mut self,
        ticket: Ticket,
        now: u64,
    ) -> Result<ChatMessageAck, IdempotencyError> {
        let (channel, message_id) = (ticket.channel.clone(), ticket.message_id.clone());
        let (ack, writes) = self.complete_deferred(ticket, now);
        self.store.apply(&writes)?;
        self.committed(&channel, &message_id);
        Ok(ack)
    }

    /// [`ReceiverIdempotency::complete`] without touching the store: returns the ack and the
    /// writes that record it. The caller commits the writes (grouped with other work) and
    /// sends the ack only after that commit succeeded, so a crash never leaves an `accepted`
    /// ack whose id the restarted receiver does not know. Until the caller reports the
    /// commit with [`ReceiverIdempotency::committed`] the id is held in memory (a redelivery
    /// meanwhile is a `duplicate`, though the store does not show the id yet); after a failed
    /// commit, do not report it: the id then stays in memory for the life of the process.
    pub fn complete_deferred(
        &mut self,
        ticket: Ticket,
        now: u64,
    ) -> (ChatMessageAck, Vec<IdempotencyWrite>) {
        let Ticket { channel, message_id, fingerprint } = ticket;
        let channel = self.ticket_channel(channel, &message_id);
        let digest = Digest::of(&fingerprint);
        let mut writes = vec![IdempotencyWrite::Save(CompletedRecord {
            channel: channel.clone(),
            message_id: message_id.clone(),
            fingerprint,
            completed_at: now,
        })];
        let trim_every = self.config.trim_every();
        let state = self.channels.entry(channel.clone()).or_default();
        state.in_progress.remove(&message_id);
        state.since_trim += 1;
        if state.since_trim >= trim_every {
            state.since_trim = 0;
            self.stats.capacity_trims += 1;
            writes.push(IdempotencyWrite::Trim {
                channel: channel.clone(),
                keep: self.config.capacity_per_channel.max(1),
            });
        }
        self.stats.completed += 1;
        self.uncommitted.insert((channel, message_id.clone()), (digest, now));
        (ChatMessageAck::accepted(message_id), writes)
    }

    /// The writes of [`ReceiverIdempotency::complete_deferred`] for this id are committed:
    /// the store answers for it now, so it moves to the bounded recent cache.
    pub fn committed(&mut self, channel: &ConnectorChannelId, message_id: &MessageId) {
        let key = (channel.clone(), message_id.clone());
        if let Some(value) = self.uncommitted.remove(&key) {
            self.stats.cache_evictions +=
                self.recent.insert(Arc::new(key), value, self.config.cache_capacity) as u64;
        }
    }

    /// The side effect failed: nothing is recorded and the `rejected` ack is returned. Use
    /// `retryable: true` for temporary failures (rate limit, network, busy) and `false` for
    /// deterministic ones (invalid payload, permission denied, target refused).
    pub fn abandon(
        &mut self,
        ticket: Ticket,
        code: ErrorCode,
        message: impl Into<String>,
        retryable: bool,
    ) -> ChatMessageAck {
        let channel = self.ticket_channel(ticket.channel, &ticket.message_id);
        if let Some(state) = self.channels.get_mut(&channel) {
            state.in_progress.remove(&ticket.message_id);
        }
        ChatMessageAck::rejected(ticket.message_id, code, message, retryable)
    }

    /// True when the id is completed on the channel: held in memory or stored (regardless of
    /// age until the store's next expiry).
    pub fn is_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<bool, IdempotencyError> {
        Ok(self.completed_digest(channel, message_id, None, Lookup::Store)?.is_some())
    }

    /// Forgets stale admissions on every channel and, at most once per
    /// `expire_interval_ms`, deletes the ids past the age bound from the store.
    pub fn prune(&mut self, now: u64) -> Result<(), IdempotencyError> {
        let writes = self.prune_deferred(now);
        self.store.apply(&writes)?;
        Ok(())
    }

    /// [`ReceiverIdempotency::prune`] without touching the store: returns the expiry write
    /// (if one is due) for the caller to commit with other work.
    pub fn prune_deferred(&mut self, now: u64) -> Vec<IdempotencyWrite> {
        let timeout = self.config.in_progress_timeout_ms;
        self.channels.retain(|_, state| {
            state.in_progress.retain(|_, (_, at)| now.saturating_sub(*at) < timeout);
            !state.in_progress.is_empty() || state.since_trim > 0
        });
        let channels = &self.channels;
        self.moved_tickets.retain(|(_, message_id), to| {
            channels.get(to).is_some_and(|state| state.in_progress.contains_key(message_id))
        });
        let due = self
            .last_expiry
            .is_none_or(|at| now.saturating_sub(at) >= self.config.expire_interval_ms);
        if !due {
            return Vec::new();
        }
        self.last_expiry = Some(now);
        self.stats.age_expiries += 1;
        vec![IdempotencyWrite::Expire { before: now.saturating_sub(self.config.max_age_ms) }]
    }

    /// The Connector re-keyed the channel (a new `connector_channel_id` on reopen): its
    /// admissions and remembered ids move to `to`, in memory only. The caller renames the
    /// stored rows first, in one transaction with the rest of the channel's state.
    pub fn on_channel_renamed(&mut self, from: &ConnectorChannelId, to: &ConnectorChannelId) {
        if from == to {
            return;
        }
        if let Some(state) = self.channels.remove(from) {
            for message_id in state.in_progress.keys() {
                self.moved_tickets.insert((from.clone(), message_id.clone()), to.clone());
            }
            for target in self.moved_tickets.values_mut().filter(|c| *c == from) {
                *target = to.clone();
            }
            let target = self.channels.entry(to.clone()).or_default();
            target.in_progress.extend(state.in_progress);
            target.since_trim += state.since_trim;
        }
        let moved: Vec<Key> =
            self.uncommitted.keys().filter(|key| &key.0 == from).cloned().collect();
        for key in moved {
            if let Some(value) = self.uncommitted.remove(&key) {
                self.uncommitted.insert((to.clone(), key.1), value);
            }
        }
        self.recent.rekey(|key| (&key.0 == from).then(|| Arc::new((to.clone(), key.1.clone()))));
    }

    /// The channel a ticket's outcome belongs to: its own, or the one its channel was renamed
    /// to while it was in progress.
    fn ticket_channel(
        &mut self,
        channel: ConnectorChannelId,
        message_id: &MessageId,
    ) -> ConnectorChannelId {
        if self.moved_tickets.is_empty() {
            return channel;
        }
        let key = (channel, message_id.clone());
        match self.moved_tickets.remove(&key) {
            Some(moved) => moved,
            None => key.0,
        }
    }

    /// The channel was permanently deleted and the caller deletes its stored ids (with the
    /// channel's other rows): forget it in memory only.
    pub fn forget_channel(&mut self, channel: &ConnectorChannelId) {
        self.channels.remove(channel);
        self.uncommitted.retain(|key, _| &key.0 != channel);
        self.recent.retain(|key| &key.0 != channel);
    }

    /// The channel was permanently deleted: forget all its state, in memory and in the store.
    pub fn remove_channel(&mut self, channel: &ConnectorChannelId) -> Result<(), IdempotencyError> {
        self.channels.remove(channel);
        self.uncommitted.retain(|key, _| &key.0 != channel);
        self.recent.retain(|key| &key.0 != channel);
        self.store.apply(&[IdempotencyWrite::Trim { channel: channel.clone(), keep: 0 }])?;
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> IdempotencyStats {
        IdempotencyStats {
            remembered: self.recent.len() + self.uncommitted.len(),
            uncommitted: self.uncommitted.len(),
            in_progress: self.channels.values().map(|c| c.in_progress.len()).sum(),
            ..self.stats.clone()
        }
    }

    /// The bounds in force.
    pub fn config(&self) -> &IdempotencyConfig {
        &self.config
    }
}
