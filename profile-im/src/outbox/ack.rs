//! Acknowledgements and ack timeouts.

use xagent_protocol_types::{
    AckStatus, ChatMessageAck, ConnectorChannelId, ErrorCode, MessageId, PacketId,
};

use super::config::*;
use super::state::*;
use super::types::*;
use crate::OutboxError;
use crate::store::OutboxStore;

impl<S: OutboxStore> Outbox<S> {
    /// A `chat.message.ack` arrived on `channel` with envelope `reply_to`.
    ///
    /// `accepted`/`duplicate` from any transmission of the message end it as delivered.
    /// `rejected` without `retryable: true` ends it as failed, keeping `code: message` as the
    /// reason (a missing `retryable` is read as `false`: the sender must not repeat a request
    /// the receiver may have refused for good). `rejected` with `retryable: true` for the
    /// transmission in flight schedules redelivery after backoff.
    pub fn on_ack(
        &mut self,
        channel: &ConnectorChannelId,
        ack: &ChatMessageAck,
        reply_to: &PacketId,
        now: u64,
    ) -> Result<AckOutcome, OutboxError> {
        let found = self.channels.get_mut(channel).and_then(|ch| {
            let index = ch.queue.iter().position(|e| e.rec.message_id == ack.message_id)?;
            Some((ch, index))
        });
        let Some((ch, index)) = found else {
            self.totals.ignored_acks += 1;
            if let Some(ch) = self.channels.get_mut(channel) {
                ch.counters.ignored_acks += 1;
            }
            return Ok(AckOutcome::Ignored(IgnoredAck::UnknownMessage));
        };
        let entry = &mut ch.queue[index];
        if entry.payload.expects_ack()
            && !entry.packets.contains(reply_to)
            && matches!(entry.state, State::InFlight { packet_id: None, .. })
            && entry.early.len() < MAX_EARLY_ACKS
        {
            entry.early.push((ack.clone(), reply_to.clone()));
            return Ok(AckOutcome::Deferred);
        }
        let ignored = if !entry.payload.expects_ack() {
            Some(IgnoredAck::NoAckExpected)
        } else if !entry.packets.contains(reply_to) {
            Some(IgnoredAck::ReplyToMismatch)
        } else {
            None
        };
        if let Some(why) = ignored {
            count(&mut ch.counters, &mut self.totals, |c| c.ignored_acks += 1);
            return Ok(AckOutcome::Ignored(why));
        }
        let current =
            matches!(&entry.state, State::InFlight { packet_id: Some(p), .. } if p == reply_to);
        let attempts = entry.rec.attempts;
        let after_ms = now.saturating_sub(entry.rec.first_responsibility_at);
        match &ack.status {
            AckStatus::Accepted | AckStatus::Duplicate => {
                let accepted = ack.status == AckStatus::Accepted;
                let by = if accepted { DeliveredBy::Accepted } else { DeliveredBy::Duplicate };
                let event = OutboxEvent::Delivered {
                    channel: channel.clone(),
                    message_id: ack.message_id.clone(),
                    by,
                    attempts,
                    after_ms,
                };
                let tally = |c: &mut OutboxCounters| match accepted {
                    true => c.delivered += 1,
                    false => c.duplicates += 1,
                };
                self.end_entry(channel, index, tally, event)?;
                Ok(AckOutcome::Delivered { status: ack.status.clone() })
            }
            AckStatus::Rejected => {
                let code = ack.code.clone().unwrap_or(ErrorCode::Other("unspecified".into()));
                let reason = format!(
                    "rejected {code}: {}",
                    ack.message.as_deref().unwrap_or("no message given")
                );
                if ack.retryable == Some(true) {
                    if !current {
                        count(&mut ch.counters, &mut self.totals, |c| c.ignored_acks += 1);
                        return Ok(AckOutcome::Ignored(IgnoredAck::StaleRetryable));
                    }
                    let outcome = self.retry(channel, index, reason, now)?;
                    return Ok(AckOutcome::Retry(outcome));
                }
                let event = OutboxEvent::Failed {
                    channel: channel.clone(),
                    message_id: ack.message_id.clone(),
                    code: code.clone(),
                    reason: reason.clone(),
                };
                let tally = |c: &mut OutboxCounters| {
                    c.failed += 1;
                    c.last_error = Some(reason.clone());
                };
                self.end_entry(channel, index, tally, event)?;
                Ok(AckOutcome::Failed { code, reason })
            }
            _ => {
                count(&mut ch.counters, &mut self.totals, |c| c.ignored_acks += 1);
                Ok(AckOutcome::Ignored(IgnoredAck::UnknownStatus))
            }
        }
    }

    /// No ack arrived in time for the message in flight: redelivery after backoff. Returns
    /// `None` when the message is not in flight.
    pub fn on_timeout(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        now: u64,
    ) -> Result<Option<RetryOutcome>, OutboxError> {
        self.fail_in_flight(channel, message_id, "ack timeout", now)
    }

    /// Applies [`Outbox::on_timeout`] to every transmission whose ack deadline has passed.
    pub fn poll_timeouts(
        &mut self,
        now: u64,
    ) -> Result<Vec<(ConnectorChannelId, MessageId, RetryOutcome)>, OutboxError> {
        let due: Vec<(ConnectorChannelId, MessageId)> = self
            .channels
            .iter()
            .flat_map(|(id, ch)| {
                ch.queue.iter().filter_map(move |e| match e.state {
                    State::InFlight { deadline, .. } if deadline <= now => {
                        Some((id.clone(), e.rec.message_id.clone()))
                    }
                    _ => None,
                })
            })
            .collect();
        let mut out = Vec::new();
        for (channel, message_id) in due {
            if let Some(outcome) = self.on_timeout(&channel, &message_id, now)? {
                out.push((channel, message_id, outcome));
            }
        }
        Ok(out)
    }
}
