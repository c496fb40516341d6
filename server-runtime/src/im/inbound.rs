//! Packets from xAgent on the IM Profile: acks of our outbox (applied at once), and final
//! messages, deltas and activity (each channel's lane: in order per channel, concurrently
//! across channels), with receiver idempotency before the author's delivery.

use std::sync::Arc;

use xagent_profile_im::{AckOutcome, ActivityAction, Admission, DeltaAction, FinalAction};
use xagent_protocol_types::{
    ChatMessage, ChatMessageAck, ConnectorChannelId, ErrorCode, Packet, PacketBody, WireError,
};

use super::{ImHost, ImState};
use crate::author::{DeltaUpdate, FinalDelivery};
use crate::ids;

impl ImState {
    /// An IM packet from xAgent; returns the packet to answer with at once, if any (the
    /// connection writes it). Acks for our outbox are handled at once; final messages, deltas
    /// and activity go to the channel's lane (in order per channel, concurrently across
    /// channels), so the reader never waits for a target: their answers are sent on the
    /// channel's route when they are ready.
    pub(crate) async fn on_packet<H: ImHost>(
        &self,
        shared: &Arc<H>,
        packet: &Packet,
    ) -> Option<Packet> {
        let channel = packet.connector_channel_id.clone()?;
        if let PacketBody::ChatMessageAck(ack) = &packet.body {
            let reply_to = packet.reply_to.as_ref()?;
            let (outcome, events) = {
                let mut inner = self.inner();
                let outcome = inner.outbox.on_ack(&channel, ack, reply_to, shared.now());
                Self::submit_in_background(shared, &mut inner);
                (outcome, inner.take_events())
            };
            match outcome {
                Ok(AckOutcome::Failed { code, reason }) => {
                    tracing::warn!(%channel, message_id = %ack.message_id, %code, reason, "xAgent rejected a message for good");
                }
                Ok(outcome) => tracing::debug!(%channel, ?outcome, "message ack"),
                Err(error) => tracing::warn!(%error, "outbox ack failed"),
            }
            self.publish(events);
            self.pump(shared).await;
            return None;
        }
        if !matches!(
            packet.body,
            PacketBody::ChatMessage(_)
                | PacketBody::ChatMessageDelta(_)
                | PacketBody::ChatActivity(_)
        ) {
            return None;
        }
        let (job_shared, job_channel, job_packet) =
            (shared.clone(), channel.clone(), packet.clone());
        let job = async move {
            if let Some(im) = job_shared.im() {
                im.on_channel_packet(&job_shared, &job_channel, &job_packet).await;
            }
        };
        if self.lanes.submit(&channel, job).is_err() {
            let busy = format!(
                "this channel already has {} packets waiting for the target; retry later",
                super::LANE_CAPACITY
            );
            let reply = match &packet.body {
                PacketBody::ChatMessage(message) => Packet::with_payload(
                    ids::packet_id(),
                    ChatMessageAck::rejected(
                        message.message_id.clone(),
                        ErrorCode::ChannelBusy,
                        busy.as_str(),
                        true,
                    ),
                )
                .channel(channel)
                .reply_to(packet.packet_id.clone()),
                _ => Packet::error(ids::packet_id(), WireError::new(ErrorCode::ChannelBusy, busy))
                    .answering(packet),
            };
            return Some(reply);
        }
        None
    }

    /// One packet from the channel's lane.
    async fn on_channel_packet<H: ImHost>(
        &self,
        shared: &Arc<H>,
        channel: &ConnectorChannelId,
        packet: &Packet,
    ) {
        let send = |reply: Packet| {
            let reply = shared.packet(reply);
            async move {
                // On the channel's route (the socket it is open on). A channel no longer
                // routed drops the reply; xAgent repeats the message and gets `duplicate`.
                let _ = shared.send_on_route(channel, reply).await;
            }
        };
        let channel = channel.clone();
        match &packet.body {
            PacketBody::ChatMessage(message) => {
                let ack = self.on_chat_message(shared, &channel, message).await;
                let reply = Packet::with_payload(ids::packet_id(), ack)
                    .channel(channel)
                    .reply_to(packet.packet_id.clone());
                send(reply).await;
            }
            PacketBody::ChatMessageDelta(delta) => {
                let action = self.inner().deltas.on_delta(&channel, delta, shared.now());
                if action.is_ok() {
                    let shown = self.inner().activity.on_delta(&channel, delta);
                    self.show(shared, &channel, shown).await;
                }
                let (first, text, handle) = match action {
                    Err(error) => {
                        let wire = WireError::new(error.code(), error.to_string());
                        send(Packet::error(ids::packet_id(), wire).answering(packet)).await;
                        return;
                    }
                    Ok(DeltaAction::CreateTarget { text }) => (true, text, None),
                    Ok(DeltaAction::UpdateTarget { text, handle }) => (false, text, handle),
                    Ok(_) => return,
                };
                let Some(ctx) = shared.channel_context(&channel) else { return };
                let Some(im) = shared.im_target() else { return };
                let update = DeltaUpdate {
                    message_id: delta.message_id.clone(),
                    first,
                    text_so_far: text,
                    handle,
                };
                if let Some(handle) = im.delta(ctx, update).await {
                    self.inner().deltas.set_target_handle(&channel, &delta.message_id, handle);
                }
            }
            PacketBody::ChatActivity(activity) => {
                let action = self.inner().activity.on_activity(&channel, activity, shared.now());
                match action {
                    Ok(action) => self.show(shared, &channel, action).await,
                    Err(error) => {
                        let wire = WireError::new(error.code(), error.to_string());
                        send(Packet::error(ids::packet_id(), wire).answering(packet)).await;
                    }
                }
            }
            _ => {}
        }
    }

    async fn on_chat_message<H: ImHost>(
        &self,
        shared: &Arc<H>,
        channel: &ConnectorChannelId,
        message: &ChatMessage,
    ) -> ChatMessageAck {
        // The IM payload rules ran once, in the connection core's judgement of the packet.
        let id = message.message_id.clone();
        let (Some(ctx), Some(im)) = (shared.channel_context(channel), shared.im_target()) else {
            return ChatMessageAck::rejected(
                id,
                ErrorCode::ConnectionNotAuthenticated,
                "the channel is not signed in to the target system",
                false,
            );
        };
        // An id the receiver does not hold in memory is looked up in the storage first.
        let stored = if self.inner().receiver.needs_lookup(channel, &id) {
            match shared.storage().lookup_completed(channel, &id).await {
                Ok(stored) => stored,
                Err(error) => {
                    tracing::error!(%error, "idempotency check failed");
                    return ChatMessageAck::rejected(
                        id,
                        ErrorCode::InternalError,
                        "try again later",
                        true,
                    );
                }
            }
        } else {
            None
        };
        let admission =
            self.inner().receiver.begin_chat_with_stored(channel, message, stored, shared.now());
        let ticket = match admission {
            Admission::Process(ticket) => ticket,
            Admission::Duplicate(ack) | Admission::Conflict(ack) | Admission::InProgress(ack) => {
                return ack;
            }
        };
        let how = match self.inner().deltas.on_final(channel, &id) {
            FinalAction::SendNew => FinalDelivery::New,
            FinalAction::EditTarget { handle } => FinalDelivery::Edit { handle },
        };
        let cleared = self.inner().activity.on_final_message(channel);
        self.show(shared, channel, cleared).await;
        match im.deliver(ctx, message.clone(), how).await {
            Ok(()) => {
                // `accepted` goes out only once the completed id is durable, so a restarted
                // Connector answers a repeat with `duplicate`, never with a second delivery.
                let (ack, commit) = {
                    let mut inner = self.inner();
                    let (ack, writes) = inner.receiver.complete_deferred(ticket, shared.now());
                    (ack, Self::submit(shared, &mut inner, writes))
                };
                match commit.committed().await {
                    // Committed: the store answers for the id now; it leaves the memory (for
                    // the bounded recent cache).
                    Ok(()) => self.inner().receiver.committed(channel, &id),
                    // The effect happened: still `accepted`; the id stays in this process's
                    // memory, so a repeat is still a duplicate.
                    Err(error) => {
                        tracing::error!(%error, "could not persist a completed message id");
                    }
                }
                ack
            }
            Err(error) => {
                tracing::info!(%channel, code = %error.code, retryable = error.retryable, "target refused a message");
                self.inner().receiver.abandon(ticket, error.code, error.message, error.retryable)
            }
        }
    }

    /// Shows an activity action on the target (a `Noop` shows nothing).
    pub(super) async fn show<H: ImHost>(
        &self,
        shared: &Arc<H>,
        channel: &ConnectorChannelId,
        action: ActivityAction,
    ) {
        if action == ActivityAction::Noop {
            return;
        }
        let (Some(ctx), Some(im)) = (shared.channel_context(channel), shared.im_target()) else {
            return;
        };
        im.activity(ctx, action).await;
    }
}
