//! The outbox's state (channels, entries, the event log), opening it over a store, and how
//! an entry is retried, failed or expired.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use xagent_protocol_types::{ChatMessageAck, ConnectorChannelId, MessageId, PacketId};

use super::config::*;
use super::types::*;
use crate::store::{AttemptUpdate, MemoryStore, OutboxStore, OutboxWrite, PendingRecord};
use crate::{OutboxError, StoreError};

#[derive(Clone, Debug, PartialEq)]
pub(super) enum State {
    Waiting,
    /// Handed out by `next_ready`; `packet_id` is known after `on_sent`.
    InFlight {
        packet_id: Option<PacketId>,
        deadline: u64,
    },
}

#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub(super) rec: PendingRecord,
    pub(super) payload: OutboundPayload,
    pub(super) state: State,
    pub(super) packets: VecDeque<PacketId>,
    /// Acks that arrived before `on_sent` named the packet (the write raced the reply).
    pub(super) early: Vec<(ChatMessageAck, PacketId)>,
}

impl Entry {
    /// A message waiting for its first (or next) transmission.
    pub(super) fn waiting(rec: PendingRecord, payload: OutboundPayload) -> Self {
        Self { rec, payload, state: State::Waiting, packets: VecDeque::new(), early: Vec::new() }
    }
}

#[derive(Debug, Default)]
pub(super) struct Channel {
    pub(super) queue: VecDeque<Entry>,
    pub(super) closed: bool,
    pub(super) counters: OutboxCounters,
}

#[derive(Debug)]
pub(super) struct EventLog {
    pub(super) events: VecDeque<OutboxEvent>,
    pub(super) capacity: usize,
    pub(super) dropped: u64,
}

impl EventLog {
    pub(super) fn push(&mut self, event: OutboxEvent) {
        if self.events.len() >= self.capacity.max(1) {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(event);
    }
}

/// The outbox's store and how it is written: straight through, or collected for
/// [`Outbox::take_writes`].
#[derive(Debug)]
pub(super) struct Sink<S> {
    pub(super) store: S,
    pub(super) mode: WriteMode,
    /// Writes collected in [`WriteMode::Deferred`], in order.
    pub(super) writes: Vec<OutboxWrite>,
}

impl<S: OutboxStore> Sink<S> {
    /// Writes through to the store, or collects the write.
    pub(super) fn write(&mut self, write: OutboxWrite) -> Result<(), StoreError> {
        match self.mode {
            WriteMode::Through => self.store.apply(std::slice::from_ref(&write)),
            WriteMode::Deferred => {
                self.writes.push(write);
                Ok(())
            }
        }
    }

    /// Deletes the channel's record of `message_id`.
    pub(super) fn delete(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError> {
        self.write(OutboxWrite::Delete(channel.clone(), message_id.clone()))
    }

    /// Changes a record's attempt bookkeeping through `change`, stores that narrow write, and
    /// only then updates `record` (a failed write leaves it as it was); the payload is not
    /// copied.
    pub(super) fn attempt(
        &mut self,
        record: &mut PendingRecord,
        change: impl FnOnce(&mut AttemptUpdate),
    ) -> Result<(), StoreError> {
        let mut update = AttemptUpdate::of(record);
        change(&mut update);
        self.write(OutboxWrite::Attempt(update.clone()))?;
        update.apply_to(record);
        Ok(())
    }
}

pub(super) fn count(
    ch: &mut OutboxCounters,
    totals: &mut OutboxCounters,
    f: impl Fn(&mut OutboxCounters),
) {
    f(ch);
    f(totals);
}

/// The sender-side state machine. See the module docs for how a runtime drives it.
#[derive(Debug)]
pub struct Outbox<S: OutboxStore = MemoryStore> {
    pub(super) config: OutboxConfig,
    pub(super) sink: Sink<S>,
    pub(super) channels: BTreeMap<ConnectorChannelId, Channel>,
    pub(super) next_seq: u64,
    pub(super) totals: OutboxCounters,
    pub(super) log: EventLog,
    pub(super) last_cleanup_at: u64,
    /// Channels [`Outbox::next_ready`] has to look at: something happened to them (a message
    /// queued or ended, a reopen) since it last did.
    pub(super) dirty: BTreeSet<ConnectorChannelId>,
    /// Channels whose next message waits for a backoff, by the time it is due (an entry may be
    /// stale; looking at a channel once too often is harmless).
    pub(super) timers: BTreeSet<(u64, ConnectorChannelId)>,
}

impl Outbox<MemoryStore> {
    /// An outbox over a fresh in-memory store.
    pub fn in_memory(config: OutboxConfig, now: u64) -> Self {
        Self::empty(config, MemoryStore::new(), now, 1)
    }
}

impl<S: OutboxStore> Outbox<S> {
    /// An outbox over `store` with no channels yet, numbering messages from `next_seq`.
    fn empty(config: OutboxConfig, store: S, now: u64, next_seq: u64) -> Self {
        Self {
            config,
            sink: Sink { store, mode: config.write_mode, writes: Vec::new() },
            channels: BTreeMap::new(),
            next_seq,
            totals: OutboxCounters::default(),
            log: EventLog {
                events: VecDeque::new(),
                capacity: config.event_log_capacity,
                dropped: 0,
            },
            last_cleanup_at: now,
            dirty: BTreeSet::new(),
            timers: BTreeSet::new(),
        }
    }

    /// Opens the outbox over a store, loading every pending record (restart). Loaded messages
    /// keep their `first_responsibility_at`, `expires_at`, attempt count and backoff; messages
    /// that were in flight become pending again (the receiver's idempotency turns a repeat into
    /// `duplicate`); messages already past their TTL expire at once and are reported.
    /// Unreadable records are deleted and reported as discarded.
    pub fn open(config: OutboxConfig, mut store: S, now: u64) -> Result<Self, OutboxError> {
        let mut records = store.load_pending()?;
        records.sort_by_key(|r| r.seq);
        let next_seq = records.last().map_or(1, |r| r.seq.saturating_add(1));
        let mut outbox = Self::empty(config, store, now, next_seq);
        for rec in records {
            outbox.dirty.insert(rec.channel.clone());
            let ch = outbox.channels.entry(rec.channel.clone()).or_default();
            match OutboundPayload::from_json(&rec.payload) {
                Ok(payload) if payload.message_id() == Some(&rec.message_id) => {
                    ch.queue.push_back(Entry::waiting(rec, payload));
                }
                other => {
                    let reason = match other {
                        Err(e) => format!("stored payload unreadable: {e}"),
                        Ok(_) => "stored payload has another message_id".to_owned(),
                    };
                    outbox.sink.delete(&rec.channel, &rec.message_id)?;
                    count(&mut ch.counters, &mut outbox.totals, |c| {
                        c.discarded += 1;
                        c.last_error = Some(reason.clone());
                    });
                    outbox.log.push(OutboxEvent::Discarded {
                        channel: rec.channel,
                        message_id: rec.message_id,
                        reason,
                    });
                }
            }
        }
        outbox.expire(now)?;
        Ok(outbox)
    }

    /// The policy in force.
    pub fn config(&self) -> &OutboxConfig {
        &self.config
    }

    /// The store (e.g. to inspect it in tests).
    pub fn store(&self) -> &S {
        &self.sink.store
    }

    pub(super) fn fail_in_flight(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        reason: &str,
        now: u64,
    ) -> Result<Option<RetryOutcome>, OutboxError> {
        let Some(index) = self.channels.get(channel).and_then(|ch| {
            ch.queue
                .iter()
                .position(|e| &e.rec.message_id == message_id && e.state != State::Waiting)
        }) else {
            return Ok(None);
        };
        self.retry(channel, index, reason.to_owned(), now).map(Some)
    }

    /// Makes the entry pending again after a temporary failure, or expires it if its TTL has
    /// passed.
    pub(super) fn retry(
        &mut self,
        channel: &ConnectorChannelId,
        index: usize,
        reason: String,
        now: u64,
    ) -> Result<RetryOutcome, OutboxError> {
        let backoff = self.config.backoff;
        let Some(ch) = self.channels.get_mut(channel) else {
            return Ok(RetryOutcome::Expired);
        };
        let Some(entry) = ch.queue.get_mut(index) else { return Ok(RetryOutcome::Expired) };
        if entry.rec.expires_at <= now {
            entry.state = State::Waiting;
            count(&mut ch.counters, &mut self.totals, |c| c.last_error = Some(reason.clone()));
            self.expire_channel(channel, now)?;
            return Ok(RetryOutcome::Expired);
        }
        self.sink.attempt(&mut entry.rec, |u| {
            u.next_attempt_at = now.saturating_add(backoff.delay_ms(u.attempts));
            u.last_error = Some(reason.clone());
        })?;
        let next_attempt_at = entry.rec.next_attempt_at;
        entry.state = State::Waiting;
        entry.early.clear();
        self.timers.insert((next_attempt_at, channel.clone()));
        self.dirty.insert(channel.clone());
        count(&mut ch.counters, &mut self.totals, |c| {
            c.retries += 1;
            c.last_error = Some(reason.clone());
        });
        self.log.push(OutboxEvent::Retrying {
            channel: channel.clone(),
            message_id: entry.rec.message_id.clone(),
            next_attempt_at,
            reason,
        });
        Ok(RetryOutcome::Scheduled { next_attempt_at })
    }

    /// Removes the channel's pending (not in flight) messages whose TTL has passed.
    pub(super) fn expire_channel(
        &mut self,
        channel: &ConnectorChannelId,
        now: u64,
    ) -> Result<Vec<MessageId>, OutboxError> {
        let mut expired = Vec::new();
        let mut index = 0;
        while let Some(entry) = self.channels.get(channel).and_then(|ch| ch.queue.get(index)) {
            if entry.state == State::Waiting && entry.rec.expires_at <= now {
                expired.push(self.expire_at(channel, index)?);
            } else {
                index += 1;
            }
        }
        Ok(expired)
    }

    /// Ends the channel's entry at `index` (the caller found it there): its record is deleted,
    /// it leaves the queue, `tally` counts it and `event` is logged.
    pub(super) fn end_entry(
        &mut self,
        channel: &ConnectorChannelId,
        index: usize,
        tally: impl Fn(&mut OutboxCounters),
        event: OutboxEvent,
    ) -> Result<(), OutboxError> {
        let Some(ch) = self.channels.get_mut(channel) else { return Ok(()) };
        let Some(entry) = ch.queue.get(index) else { return Ok(()) };
        self.sink.delete(channel, &entry.rec.message_id)?;
        ch.queue.remove(index);
        self.dirty.insert(channel.clone());
        count(&mut ch.counters, &mut self.totals, tally);
        self.log.push(event);
        Ok(())
    }

    /// Expires the channel's message at `index` (the caller checked that it is waiting and
    /// past its TTL): removed, counted, reported.
    pub(super) fn expire_at(
        &mut self,
        channel: &ConnectorChannelId,
        index: usize,
    ) -> Result<MessageId, OutboxError> {
        let Some(ch) = self.channels.get_mut(channel).filter(|ch| index < ch.queue.len()) else {
            return Err(OutboxError::NotPending {
                channel: channel.clone(),
                message_id: MessageId::new(""),
                expected: "pending",
            });
        };
        let entry = &ch.queue[index];
        let (message_id, attempts, expires_at) =
            (entry.rec.message_id.clone(), entry.rec.attempts, entry.rec.expires_at);
        let reason = format!("message_expired: {message_id}");
        let event = OutboxEvent::Expired {
            channel: channel.clone(),
            message_id: message_id.clone(),
            attempts,
            expires_at,
        };
        let tally = |c: &mut OutboxCounters| {
            c.expired += 1;
            c.last_error = Some(reason.clone());
        };
        self.end_entry(channel, index, tally, event)?;
        Ok(message_id)
    }
}
