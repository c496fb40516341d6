//! Sending to xAgent: a message taken into the outbox (`enqueue`, size-checked at the source)
//! and the pump that writes what is due on each channel's route and books each write's outcome.

use std::sync::Arc;

use xagent_profile_im::{Delivery, EnqueueOutcome, OutboundPayload, OutboxWrite, SentOutcome};
use xagent_protocol_types::{ConnectorChannelId, MessageId, Packet, PacketBody};

use crate::error::HandleError;
use crate::ids;
use crate::storage::WriteOp;

use super::{ImHost, ImState, TryQueue};

impl ImState {
    /// Takes responsibility for a message to xAgent and sends it when the channel is routed.
    /// `extra` (already checked writes of the author's) commits in the same transaction as
    /// the message's outbox record, and only when the message was taken.
    pub(crate) async fn enqueue<H: ImHost>(
        &self,
        shared: &Arc<H>,
        channel: &ConnectorChannelId,
        payload: OutboundPayload,
        extra: Vec<WriteOp>,
    ) -> Result<(), HandleError> {
        shared.check_signed_in(channel)?;
        // One serialisation: the stored form is also what the size check measures.
        let json = payload.to_json().map_err(xagent_profile_im::OutboxError::from)?;
        check_packet_size(shared.as_ref(), channel, &json)?;
        let routed = shared.is_routed(channel);
        let (ticket, events) = {
            let mut inner = self.inner();
            let message_id = payload.message_id().cloned();
            if self.replicated {
                // Records enqueued on different replicas keep a rough time order.
                inner.outbox.raise_seq(shared.now().saturating_mul(1024));
            }
            let outcome = inner.outbox.enqueue_encoded(channel, payload, json, shared.now())?;
            // The same message again: perhaps because our earlier answer was a failed commit.
            // Its record is written again in the commit this answer waits for, so this answer
            // too means "durable".
            let again = match (outcome, message_id) {
                (EnqueueOutcome::AlreadyPending, Some(id)) => {
                    inner.outbox.record(channel, &id).cloned()
                }
                _ => None,
            };
            inner.pipeline.outbox_first.extend(again.map(OutboxWrite::Save));
            inner.pipeline.extra.extend(extra);
            if !routed && self.replicated {
                // The record is written (it is in the collected writes); whichever replica
                // holds, or later takes, the channel's socket delivers it, woken by the write.
                inner.outbox.forget_channel(channel);
            } else if !routed {
                inner.outbox.on_channel_closed(channel, shared.now())?;
            }
            let ticket = Self::submit(shared, &mut inner, Vec::new());
            (ticket, inner.take_events())
        };
        self.publish(events);
        // The caller hears "queued" only once the record is committed.
        ticket.committed().await?;
        self.pump(shared).await;
        Ok(())
    }

    /// Sends every due message on its route; unrouted channels are paused until they reopen.
    /// A message whose socket's write queue is full goes back to the outbox at once (with the
    /// later ones of its channel from the same pass, so none overtakes it) and the pump runs
    /// again when that queue has room.
    pub(crate) async fn pump<H: ImHost>(&self, shared: &Arc<H>) {
        let _guard = self.pump.lock().await;
        loop {
            let ready = {
                let mut inner = self.inner();
                let ready = inner.outbox.next_ready(shared.now());
                Self::submit_in_background(shared, &mut inner);
                match ready {
                    Ok(ready) => ready,
                    Err(error) => {
                        tracing::error!(%error, "outbox failed");
                        return;
                    }
                }
            };
            if ready.is_empty() {
                break;
            }
            // Channels whose socket had no room in this pass: their later messages wait too.
            let mut blocked: Vec<ConnectorChannelId> = Vec::new();
            let mut not_sent: Vec<(ConnectorChannelId, MessageId)> = Vec::new();
            for delivery in ready {
                // The delivery is ours: its payload becomes the packet body without a copy.
                let Delivery { channel, message_id, payload, .. } = delivery;
                if blocked.contains(&channel) {
                    not_sent.push((channel, message_id));
                    continue;
                }
                let packet_id = ids::packet_id();
                let mut body = payload.into_body();
                if let (PacketBody::ChatMessage(message), Some(files)) = (&mut body, shared.files())
                {
                    crate::files::refresh_urls(files, message).await;
                }
                let packet =
                    shared.packet(Packet::new(packet_id.clone(), body)).channel(channel.clone());
                // Never wait on a socket here: the pump serves every channel.
                let now = shared.now();
                match shared.try_queue_tracked(&channel, packet) {
                    TryQueue::Queued(written) => {
                        let shared = shared.clone();
                        tokio::spawn(async move {
                            let written = matches!(written.await, Ok(Ok(())));
                            let Some(im) = shared.im() else { return };
                            // Pump again when the bookkeeping freed a place: an ack that
                            // overtook it was applied just now (the outbox keeps early acks;
                            // M5), an IM v1 push ended with its write, or the channel paused.
                            if im.record_write(&shared, &channel, &message_id, packet_id, written) {
                                pump_again(shared).await;
                            }
                        });
                    }
                    TryQueue::Full => {
                        blocked.push(channel.clone());
                        not_sent.push((channel, message_id));
                    }
                    TryQueue::NotRouted => {
                        // Not routed (or the route closed meanwhile): pause until channel.open.
                        let result = {
                            let mut inner = self.inner();
                            let result = inner.outbox.on_channel_closed(&channel, now);
                            Self::submit_in_background(shared, &mut inner);
                            result
                        };
                        if let Err(error) = result {
                            tracing::warn!(%error, "outbox bookkeeping failed");
                        }
                    }
                }
            }
            if !not_sent.is_empty() {
                {
                    let mut inner = self.inner();
                    for (channel, message_id) in &not_sent {
                        if let Err(error) = inner.outbox.on_not_sent(channel, message_id) {
                            tracing::warn!(%error, "outbox bookkeeping failed");
                        }
                    }
                    Self::submit_in_background(shared, &mut inner);
                }
                for channel in &blocked {
                    let room = shared.room_on_route(channel);
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        room.await;
                        pump_again(shared).await;
                    });
                }
                // Pumping again now would hand the same messages to the same full queues.
                break;
            }
        }
        self.log_events();
    }

    /// Records the outcome of a queued write: sent (awaiting the ack, or delivered for IM v1,
    /// whose write is the delivery boundary) or not written (paused until the channel reopens).
    /// True when the outbox may have something new to send (a place in the window freed).
    fn record_write<H: ImHost>(
        &self,
        shared: &Arc<H>,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        packet_id: xagent_protocol_types::PacketId,
        written: bool,
    ) -> bool {
        let now = shared.now();
        let (result, events) = {
            let mut inner = self.inner();
            let result = if written {
                inner
                    .outbox
                    .on_sent(channel, message_id, packet_id, now)
                    .map(|outcome| !matches!(outcome, SentOutcome::AwaitingAck { .. }))
            } else {
                inner.outbox.on_channel_closed(channel, now).map(|()| true)
            };
            Self::submit_in_background(shared, &mut inner);
            (result, inner.take_events())
        };
        self.publish(events);
        result.unwrap_or_else(|error| {
            tracing::warn!(%error, "outbox bookkeeping failed");
            true
        })
    }
}

/// Room left in a packet for the envelope around a payload (ids, type, timestamps, channel):
/// well above what the runtime's envelopes take.
const ENVELOPE_ALLOWANCE: usize = 2 * 1024;

/// Refuses at the source a message that could never be sent (H3): a packet over the peer's
/// size limit would be dropped by xAgent, which then reconnects, over and over. Download URLs
/// are re-signed on every attempt, so their length counts with a margin too.
///
/// `json` is the payload's stored form ([`OutboundPayload::to_json`]: the payload with its
/// type), which the packet carries with the envelope around it: its length plus the channel
/// id's is the packet's size up to the envelope's other fields, which the allowance covers.
fn check_packet_size<H: ImHost>(
    shared: &H,
    channel: &ConnectorChannelId,
    json: &str,
) -> Result<(), HandleError> {
    let size = json.len().saturating_add(channel.as_str().len());
    let limit = shared.max_packet_bytes();
    if size.saturating_add(ENVELOPE_ALLOWANCE) > limit {
        return Err(HandleError::TooLarge { size, limit });
    }
    Ok(())
}

/// [`ImState::pump`] behind a box: the pump's own write tasks call it, and an `async fn` cannot
/// contain its own future.
fn pump_again<H: ImHost>(
    shared: Arc<H>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        if let Some(im) = shared.im() {
            im.pump(&shared).await;
        }
    })
}
