//! Transport and channel events, expiry and maintenance, and what the outbox reports.

use std::collections::BTreeMap;

use xagent_protocol_types::{ConnectorChannelId, MessageId};

use super::state::*;
use super::types::*;
use crate::OutboxError;
use crate::store::{OutboxStore, PendingRecord};

impl<S: OutboxStore> Outbox<S> {
    /// The transport to the receiver dropped: every message in flight becomes pending again
    /// with backoff. Nothing is counted as delivered.
    pub fn on_disconnect(&mut self, now: u64) -> Result<(), OutboxError> {
        let in_flight: Vec<(ConnectorChannelId, MessageId)> = self
            .channels
            .iter()
            .flat_map(|(id, ch)| {
                ch.queue
                    .iter()
                    .filter(|e| e.state != State::Waiting)
                    .map(move |e| (id.clone(), e.rec.message_id.clone()))
            })
            .collect();
        for (channel, message_id) in in_flight {
            self.fail_in_flight(&channel, &message_id, "disconnected", now)?;
        }
        Ok(())
    }

    /// The channel closed: its message in flight becomes pending again with backoff and the
    /// channel is paused until [`Outbox::on_channel_reopened`]. TTLs keep running.
    pub fn on_channel_closed(
        &mut self,
        channel: &ConnectorChannelId,
        now: u64,
    ) -> Result<(), OutboxError> {
        let in_flight: Vec<MessageId> = self
            .channels
            .get(channel)
            .map(|ch| {
                ch.queue
                    .iter()
                    .filter(|e| e.state != State::Waiting)
                    .map(|e| e.rec.message_id.clone())
                    .collect()
            })
            .unwrap_or_default();
        for message_id in in_flight {
            self.fail_in_flight(channel, &message_id, "channel closed", now)?;
        }
        self.channels.entry(channel.clone()).or_default().closed = true;
        Ok(())
    }

    /// The channel is open again: it resumes, and its waiting messages are due at once (the
    /// backoff of a closed channel is not the receiver's fault). Expiry times are not changed.
    pub fn on_channel_reopened(
        &mut self,
        channel: &ConnectorChannelId,
        now: u64,
    ) -> Result<(), OutboxError> {
        let Some(ch) = self.channels.get_mut(channel) else { return Ok(()) };
        for entry in ch.queue.iter_mut() {
            if entry.state == State::Waiting && entry.rec.next_attempt_at > now {
                self.sink.attempt(&mut entry.rec, |u| u.next_attempt_at = now)?;
            }
        }
        self.dirty.insert(channel.clone());
        ch.closed = false;
        Ok(())
    }

    /// The Connector re-keyed the channel (a new `connector_channel_id` on reopen): its queue,
    /// counters and timers move to `to`, in memory only. The caller renames the stored rows
    /// first, in the same transaction as the rest of the channel's state (the records' channel
    /// is rewritten here to match). Refused, changing nothing, when `to` already has messages.
    pub fn on_channel_renamed(
        &mut self,
        from: &ConnectorChannelId,
        to: &ConnectorChannelId,
    ) -> Result<(), OutboxError> {
        if from == to {
            return Ok(());
        }
        if self.channels.get(to).is_some_and(|ch| !ch.queue.is_empty()) {
            return Err(OutboxError::RenameTargetTaken { from: from.clone(), to: to.clone() });
        }
        let Some(mut ch) = self.channels.remove(from) else { return Ok(()) };
        for entry in ch.queue.iter_mut() {
            entry.rec.channel = to.clone();
        }
        self.channels.insert(to.clone(), ch);
        if self.dirty.remove(from) {
            self.dirty.insert(to.clone());
        }
        let moved: Vec<u64> =
            self.timers.iter().filter(|(_, id)| id == from).map(|(at, _)| *at).collect();
        for at in moved {
            self.timers.remove(&(at, from.clone()));
            self.timers.insert((at, to.clone()));
        }
        Ok(())
    }

    /// Takes over stored records another process wrote (a replica sharing the database): the
    /// ones not already queued here join their channel's queue, in `seq` order, as waiting
    /// messages (an unreadable one is deleted and reported as discarded, as at open). Nothing
    /// is written for a record taken as it is. Returns how many joined.
    pub fn adopt(
        &mut self,
        mut records: Vec<PendingRecord>,
        now: u64,
    ) -> Result<usize, OutboxError> {
        records.sort_by_key(|r| r.seq);
        // What the queues hold already, looked up once (a backlog is read again and again).
        let mut known: std::collections::HashSet<(ConnectorChannelId, MessageId)> = records
            .iter()
            .map(|r| &r.channel)
            .collect::<std::collections::HashSet<_>>()
            .into_iter()
            .filter_map(|channel| Some((channel, self.channels.get(channel)?)))
            .flat_map(|(channel, ch)| {
                ch.queue.iter().map(move |e| (channel.clone(), e.rec.message_id.clone()))
            })
            .collect();
        let mut joined = 0;
        for rec in records {
            if !known.insert((rec.channel.clone(), rec.message_id.clone())) {
                continue;
            }
            self.next_seq = self.next_seq.max(rec.seq.saturating_add(1));
            let ch = self.channels.entry(rec.channel.clone()).or_default();
            match OutboundPayload::from_json(&rec.payload) {
                Ok(payload) if payload.message_id() == Some(&rec.message_id) => {
                    self.dirty.insert(rec.channel.clone());
                    ch.queue.push_back(Entry::waiting(rec, payload));
                    joined += 1;
                }
                _ => {
                    self.sink.delete(&rec.channel, &rec.message_id)?;
                    count(&mut ch.counters, &mut self.totals, |c| c.discarded += 1);
                    self.log.push(OutboxEvent::Discarded {
                        channel: rec.channel,
                        message_id: rec.message_id,
                        reason: "stored payload unreadable".into(),
                    });
                }
            }
        }
        self.expire(now)?;
        Ok(joined)
    }

    /// Forgets a channel's messages in memory only, writing nothing: another process (a
    /// replica holding the channel's socket) is responsible for them now. Unlike
    /// [`Outbox::remove_channel`] the stored records stay.
    pub fn forget_channel(&mut self, channel: &ConnectorChannelId) {
        self.channels.remove(channel);
        self.dirty.remove(channel);
        self.timers.retain(|(_, id)| id != channel);
    }

    /// Makes the next message's `seq` at least `floor` (replicas sharing a database pass a
    /// clock-based floor, so records enqueued on different replicas keep a rough time order).
    pub fn raise_seq(&mut self, floor: u64) {
        self.next_seq = self.next_seq.max(floor);
    }

    /// The channel was permanently deleted: its pending messages are dropped (recorded as
    /// discarded, never as delivered) and its state forgotten.
    pub fn remove_channel(&mut self, channel: &ConnectorChannelId) -> Result<(), OutboxError> {
        let Some(ch) = self.channels.get_mut(channel) else { return Ok(()) };
        while let Some(entry) = ch.queue.front() {
            let message_id = entry.rec.message_id.clone();
            self.sink.delete(channel, &message_id)?;
            ch.queue.pop_front();
            self.totals.discarded += 1;
            self.log.push(OutboxEvent::Discarded {
                channel: channel.clone(),
                message_id,
                reason: "channel deleted".into(),
            });
        }
        self.channels.remove(channel);
        self.dirty.remove(channel);
        self.timers.retain(|(_, id)| id != channel);
        Ok(())
    }

    /// Expires every pending message (not in flight) whose TTL has passed; returns them.
    /// A message in flight is judged when its ack, timeout or disconnect arrives.
    pub fn expire(
        &mut self,
        now: u64,
    ) -> Result<Vec<(ConnectorChannelId, MessageId)>, OutboxError> {
        let ids: Vec<ConnectorChannelId> = self.channels.keys().cloned().collect();
        let mut out = Vec::new();
        for id in ids {
            for message_id in self.expire_channel(&id, now)? {
                out.push((id.clone(), message_id));
            }
        }
        self.last_cleanup_at = now;
        Ok(out)
    }

    /// Periodic maintenance: ack timeouts, then expiry. Call it at least every
    /// [`OutboxConfig::effective_cleanup_interval_ms`](crate::OutboxConfig::effective_cleanup_interval_ms).
    pub fn maintain(&mut self, now: u64) -> Result<(), OutboxError> {
        self.poll_timeouts(now)?;
        self.expire(now)?;
        Ok(())
    }

    /// The earliest time something becomes due (a retry, an ack deadline, an expiry, the
    /// next cleanup); a runtime sleeps until then.
    pub fn next_wakeup(&self) -> u64 {
        let mut wake =
            self.last_cleanup_at.saturating_add(self.config.effective_cleanup_interval_ms());
        for ch in self.channels.values() {
            if let Some(head) = ch.queue.front()
                && !ch.closed
                && head.state == State::Waiting
            {
                wake = wake.min(head.rec.next_attempt_at);
            }
            for e in &ch.queue {
                match e.state {
                    State::InFlight { deadline, .. } => wake = wake.min(deadline),
                    State::Waiting => wake = wake.min(e.rec.expires_at),
                }
            }
        }
        wake
    }

    /// Drains the event log.
    pub fn drain_events(&mut self) -> Vec<OutboxEvent> {
        self.log.events.drain(..).collect()
    }

    /// True when the message is pending on the channel.
    pub fn is_pending(&self, channel: &ConnectorChannelId, message_id: &MessageId) -> bool {
        self.channels
            .get(channel)
            .is_some_and(|ch| ch.queue.iter().any(|e| &e.rec.message_id == message_id))
    }

    /// The pending message ids of a channel, in delivery order.
    pub fn pending_ids(&self, channel: &ConnectorChannelId) -> Vec<MessageId> {
        self.channels
            .get(channel)
            .map(|ch| ch.queue.iter().map(|e| e.rec.message_id.clone()).collect())
            .unwrap_or_default()
    }

    /// The stored record of a pending message (attempts, expiry, last error).
    pub fn record(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Option<&PendingRecord> {
        self.channels
            .get(channel)?
            .queue
            .iter()
            .find(|e| &e.rec.message_id == message_id)
            .map(|e| &e.rec)
    }

    /// Counters and the effective policy.
    pub fn stats(&self) -> OutboxStats {
        let channels: BTreeMap<ConnectorChannelId, ChannelStats> = self
            .channels
            .iter()
            .map(|(id, ch)| {
                let in_flight = ch.queue.iter().filter(|e| e.state != State::Waiting).count();
                (
                    id.clone(),
                    ChannelStats {
                        pending: ch.queue.len(),
                        in_flight: in_flight > 0,
                        in_flight_count: in_flight,
                        closed: ch.closed,
                        counters: ch.counters.clone(),
                    },
                )
            })
            .collect();
        OutboxStats {
            ttl_ms: self.config.ttl_ms,
            capacity_per_channel: self.config.capacity_per_channel,
            cleanup_interval_ms: self.config.effective_cleanup_interval_ms(),
            pending: channels.values().map(|c| c.pending).sum(),
            in_flight: channels.values().map(|c| c.in_flight_count).sum(),
            totals: self.totals.clone(),
            events_dropped: self.log.dropped,
            channels,
        }
    }
}
