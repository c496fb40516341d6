//! Taking responsibility for messages and handing them out: enqueue, the ready set, sends.

use std::collections::BTreeSet;

use xagent_protocol_types::{ConnectorChannelId, MessageId, PacketId};

use super::config::*;
use super::state::*;
use super::types::*;
use crate::store::{
    AttemptUpdate, OutboxStore, OutboxWrite, PendingRecord, coalesce_outbox_writes,
};
use crate::{OutboxError, PayloadError};

impl<S: OutboxStore> Outbox<S> {
    /// Takes responsibility for a message: checks its payload, refuses a reused `message_id`
    /// with different content, applies the capacity policy, stores it, and queues it at the
    /// tail of its channel. Its TTL starts now.
    pub fn enqueue(
        &mut self,
        channel: &ConnectorChannelId,
        payload: impl Into<OutboundPayload>,
        now: u64,
    ) -> Result<EnqueueOutcome, OutboxError> {
        self.enqueue_inner(channel, payload.into(), None, now)
    }

    /// [`Outbox::enqueue`] with the payload's stored form already made: `json` must be
    /// `payload.to_json()`. For a runtime that needed the encoding anyway (to check the
    /// packet's size before taking responsibility), so the payload is serialised once.
    pub fn enqueue_encoded(
        &mut self,
        channel: &ConnectorChannelId,
        payload: OutboundPayload,
        json: String,
        now: u64,
    ) -> Result<EnqueueOutcome, OutboxError> {
        self.enqueue_inner(channel, payload, Some(json), now)
    }

    fn enqueue_inner(
        &mut self,
        channel: &ConnectorChannelId,
        payload: OutboundPayload,
        json: Option<String>,
        now: u64,
    ) -> Result<EnqueueOutcome, OutboxError> {
        payload.validate(self.config.sender)?;
        let message_id = match payload.message_id() {
            Some(id) if !id.is_empty() => id.clone(),
            _ => return Err(PayloadError::MissingMessageId.into()),
        };
        self.expire_channel(channel, now)?;
        if let Some(existing) = self
            .channels
            .get(channel)
            .and_then(|ch| ch.queue.iter().find(|e| e.rec.message_id == message_id))
        {
            return if existing.payload == payload {
                Ok(EnqueueOutcome::AlreadyPending)
            } else {
                Err(OutboxError::MessageConflict { channel: channel.clone(), message_id })
            };
        }
        let capacity = self.config.capacity_per_channel;
        let ch = self.channels.entry(channel.clone()).or_default();
        let mut evicted = None;
        if ch.queue.len() >= capacity {
            let victim = match self.config.overflow {
                OverflowPolicy::RejectNew => None,
                OverflowPolicy::EvictOldest => {
                    ch.queue.iter().position(|e| e.state == State::Waiting)
                }
            };
            let Some(index) = victim else {
                let reason = format!("capacity_exceeded: channel holds {capacity} messages");
                count(&mut ch.counters, &mut self.totals, |c| {
                    c.capacity_rejected += 1;
                    c.last_error = Some(reason.clone());
                });
                self.log
                    .push(OutboxEvent::CapacityRejected { channel: channel.clone(), message_id });
                return Err(OutboxError::CapacityExceeded { channel: channel.clone(), capacity });
            };
            let victim_id = ch.queue[index].rec.message_id.clone();
            let reason = format!("capacity_exceeded: evicted {victim_id}");
            let event =
                OutboxEvent::Evicted { channel: channel.clone(), message_id: victim_id.clone() };
            let tally = |c: &mut OutboxCounters| {
                c.evicted += 1;
                c.last_error = Some(reason.clone());
            };
            self.end_entry(channel, index, tally, event)?;
            evicted = Some(victim_id);
        }
        let expires_at = now.saturating_add(self.config.ttl_ms);
        let rec = PendingRecord {
            channel: channel.clone(),
            message_id,
            seq: self.next_seq,
            payload: match json {
                Some(json) => json,
                None => payload.to_json()?,
            },
            attempts: 0,
            first_responsibility_at: now,
            expires_at,
            next_attempt_at: now,
            last_error: None,
        };
        self.sink.write(OutboxWrite::Save(rec.clone()))?;
        self.next_seq += 1;
        self.dirty.insert(channel.clone());
        let ch = self.channels.entry(channel.clone()).or_default();
        ch.queue.push_back(Entry::waiting(rec, payload));
        Ok(EnqueueOutcome::Queued { expires_at, evicted })
    }

    /// The transmissions to perform now: per open channel, its pending messages in queue order
    /// while fewer than [`OutboxConfig::window`] are in flight, stopping at the first one that
    /// is not due (a backoff is never overtaken). Expired messages met on the way are expired
    /// instead, so a message is never handed out at or after its expiry. Only channels that
    /// changed since the last call, or whose backoff ran out, are looked at.
    pub fn next_ready(&mut self, now: u64) -> Result<Vec<Delivery>, OutboxError> {
        while let Some((at, _)) = self.timers.first()
            && *at <= now
        {
            if let Some((_, id)) = self.timers.pop_first() {
                self.dirty.insert(id);
            }
        }
        let window = self.config.window.max(1);
        // The channels to look at leave the dirty set now and go back into it if anything
        // fails, so a failure hands out nothing and the next call looks at them again.
        let ids = std::mem::take(&mut self.dirty);
        // First the messages that are due and their attempt counts (one store batch), then
        // the state change: a store failure changes nothing.
        let mut due: Vec<(ConnectorChannelId, usize)> = Vec::new();
        let mut writes: Vec<OutboxWrite> = Vec::new();
        let mut timers = Vec::new();
        let collected = self.collect_due(&ids, now, window, &mut due, &mut writes, &mut timers);
        let stored = collected.and_then(|()| match self.sink.mode {
            WriteMode::Through if !writes.is_empty() => Ok(self.sink.store.apply(&writes)?),
            WriteMode::Through => Ok(()),
            WriteMode::Deferred => {
                self.sink.writes.append(&mut writes);
                Ok(())
            }
        });
        if let Err(error) = stored {
            self.dirty.extend(ids);
            return Err(error);
        }
        self.timers.extend(timers);
        let mut out = Vec::with_capacity(due.len());
        for (id, index) in due {
            let Some(ch) = self.channels.get_mut(&id) else { continue };
            let Some(entry) = ch.queue.get_mut(index) else { continue };
            entry.rec.attempts = entry.rec.attempts.saturating_add(1);
            entry.state = State::InFlight {
                packet_id: None,
                deadline: now.saturating_add(self.config.ack_timeout_ms),
            };
            count(&mut ch.counters, &mut self.totals, |c| c.attempts += 1);
            out.push(Delivery {
                channel: id,
                message_id: entry.rec.message_id.clone(),
                payload: entry.payload.clone(),
                attempt: entry.rec.attempts,
                expires_at: entry.rec.expires_at,
            });
        }
        Ok(out)
    }

    /// The scan of [`Outbox::next_ready`]: per channel of `ids`, the due messages (channel and
    /// queue index) and the write of each one's next attempt count; expires what it meets past
    /// its TTL; notes the channels whose next message waits for a backoff.
    fn collect_due(
        &mut self,
        ids: &BTreeSet<ConnectorChannelId>,
        now: u64,
        window: usize,
        due: &mut Vec<(ConnectorChannelId, usize)>,
        writes: &mut Vec<OutboxWrite>,
        timers: &mut Vec<(u64, ConnectorChannelId)>,
    ) -> Result<(), OutboxError> {
        for id in ids {
            let mut in_flight = 0;
            let mut index = 0;
            while let Some(ch) = self.channels.get(id) {
                if ch.closed {
                    break;
                }
                let Some(entry) = ch.queue.get(index) else { break };
                if entry.state != State::Waiting {
                    in_flight += 1;
                    index += 1;
                    continue;
                }
                if entry.rec.expires_at <= now {
                    self.expire_at(id, index)?;
                    continue;
                }
                if in_flight >= window {
                    break;
                }
                if entry.rec.next_attempt_at > now {
                    timers.push((entry.rec.next_attempt_at, id.clone()));
                    break;
                }
                // Only the attempt count is written (not the payload); the entry's count is bumped
                // in place once the batch is stored.
                let mut update = AttemptUpdate::of(&entry.rec);
                update.attempts = update.attempts.saturating_add(1);
                writes.push(OutboxWrite::Attempt(update));
                due.push((id.clone(), index));
                in_flight += 1;
                index += 1;
            }
        }
        Ok(())
    }

    /// A [`Delivery`] could not be written because the transport had no room for it right now
    /// (nothing reached the receiver): it is pending again at once, its attempt not counted,
    /// and no backoff applies. The runtime calls [`Outbox::next_ready`] again when the
    /// transport has room. Returns false when the message was not being sent.
    pub fn on_not_sent(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<bool, OutboxError> {
        let Some(ch) = self.channels.get_mut(channel) else { return Ok(false) };
        let Some(entry) = ch.queue.iter_mut().find(|e| {
            &e.rec.message_id == message_id
                && matches!(e.state, State::InFlight { packet_id: None, .. })
        }) else {
            return Ok(false);
        };
        self.sink.attempt(&mut entry.rec, |u| u.attempts = u.attempts.saturating_sub(1))?;
        entry.state = State::Waiting;
        entry.early.clear();
        ch.counters.attempts = ch.counters.attempts.saturating_sub(1);
        self.totals.attempts = self.totals.attempts.saturating_sub(1);
        self.dirty.insert(channel.clone());
        Ok(true)
    }

    /// The writes collected since the last call in [`WriteMode::Deferred`] (empty in
    /// [`WriteMode::Through`]), in order, without writes a later one makes pointless. The
    /// caller commits them (one transaction, ideally with other work) and must not
    /// acknowledge an enqueue before the commit holding its record succeeded.
    pub fn take_writes(&mut self) -> Vec<OutboxWrite> {
        coalesce_outbox_writes(std::mem::take(&mut self.sink.writes))
    }

    /// True when writes wait for [`Outbox::take_writes`].
    pub fn has_writes(&self) -> bool {
        !self.sink.writes.is_empty()
    }

    /// The packet carrying a [`Delivery`] was written with `packet_id`. A v2 message now waits
    /// for its ack; a v1 push is delivered (the write is its delivery boundary).
    pub fn on_sent(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        packet_id: PacketId,
        now: u64,
    ) -> Result<SentOutcome, OutboxError> {
        let not_sending = || OutboxError::NotPending {
            channel: channel.clone(),
            message_id: message_id.clone(),
            expected: "being sent",
        };
        let ch = self.channels.get_mut(channel).ok_or_else(not_sending)?;
        let index = ch
            .queue
            .iter()
            .position(|e| &e.rec.message_id == message_id)
            .ok_or_else(not_sending)?;
        let entry = &mut ch.queue[index];
        if !matches!(entry.state, State::InFlight { .. }) {
            return Err(not_sending());
        }
        if !entry.payload.expects_ack() {
            let event = OutboxEvent::Delivered {
                channel: channel.clone(),
                message_id: message_id.clone(),
                by: DeliveredBy::Written,
                attempts: entry.rec.attempts,
                after_ms: now.saturating_sub(entry.rec.first_responsibility_at),
            };
            self.end_entry(channel, index, |c| c.delivered += 1, event)?;
            return Ok(SentOutcome::DeliveredByWrite);
        }
        let ack_deadline = now.saturating_add(self.config.ack_timeout_ms);
        if entry.packets.len() >= REMEMBERED_PACKETS {
            entry.packets.pop_front();
        }
        entry.packets.push_back(packet_id.clone());
        entry.state =
            State::InFlight { packet_id: Some(packet_id.clone()), deadline: ack_deadline };
        let early = std::mem::take(&mut entry.early);
        if let Some((ack, _)) = early.into_iter().find(|(_, reply_to)| *reply_to == packet_id) {
            let outcome = self.on_ack(channel, &ack, &packet_id, now)?;
            return Ok(SentOutcome::Acked(outcome));
        }
        Ok(SentOutcome::AwaitingAck { ack_deadline })
    }

    /// Writing the packet failed: a temporary failure, redelivery after backoff.
    pub fn on_send_failed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        reason: &str,
        now: u64,
    ) -> Result<Option<RetryOutcome>, OutboxError> {
        self.fail_in_flight(channel, message_id, &format!("write failed: {reason}"), now)
    }
}
