//! IM Profile v2 from the xAgent side: inbound user messages through receiver idempotency with
//! acks after the application's verdict; assistant messages through the outbox (pending until
//! `accepted` or `duplicate`, redelivered with the same `message_id`); deltas and activity sent
//! as they come.

use std::sync::Arc;

use tokio::sync::oneshot;
use xagent_profile_im::{Admission, Delivery, DeltaAction, IdempotencyWrite};
use xagent_protocol_types::{
    ChatMessage, ChatMessageAck, ChatMessageDelta, ConnectorChannelId, ErrorCode, Packet,
    PacketBody, PacketId,
};

use crate::connection::{ClientEvent, InboundMessage, Shared, Verdict, lock, send_on};
use crate::download::{DownloadError, loggable_url};
use crate::im_state::ImState;
use crate::{ClientError, ids};

/// Sends every outbox delivery that is due. Safe to call at any time. The IM lock is not held
/// while packets are written: deliveries are marked sent first (their attempt counts committed
/// under the holder lease before a packet leaves, so a fenced process delivers nothing) and
/// marked failed if the write did not happen.
pub(crate) async fn pump(shared: &Arc<Shared>) {
    let now = shared.now();
    let mut ready = Vec::new();
    let ticket = {
        let mut im = shared.im.lock().await;
        if !im.may_act() {
            return;
        }
        if let Err(error) = im.outbox.poll_timeouts(now) {
            tracing::warn!(error = %error, "outbox timeout check failed");
        }
        let deliveries = match im.outbox.next_ready(now) {
            Ok(deliveries) => deliveries,
            Err(error) => {
                tracing::warn!(error = %error, "outbox could not produce deliveries");
                return;
            }
        };
        for Delivery { channel, message_id, payload, .. } in deliveries {
            let route = im.current(&channel);
            let packet_id = PacketId::new(ids::mint("pkt_"));
            let packet = Packet::new(packet_id.clone(), payload.into_body()).channel(route);
            if let Err(error) = im.outbox.on_sent(&channel, &message_id, packet_id, now) {
                tracing::warn!(error = %error, "outbox bookkeeping failed");
                continue;
            }
            ready.push((channel, message_id, packet));
        }
        im.flush(Vec::new())
    };
    if let Err(error) = ticket.await {
        shared.commit_failed("the outbox's delivery attempts", &error);
        // Nothing leaves: the messages wait for the next attempt (or for the next holder).
        let mut im = shared.im.lock().await;
        for (channel, message_id, _) in &ready {
            if let Err(error) =
                im.outbox.on_send_failed(channel, message_id, &error.to_string(), shared.now())
            {
                tracing::warn!(error = %error, "outbox bookkeeping failed");
            }
        }
        let ticket = im.flush(Vec::new());
        drop(im);
        shared.watch_commit("the outbox's unsent deliveries", ticket);
        return;
    }
    let mut failed = false;
    for (channel, message_id, packet) in ready {
        if let Err(error) = send_on(shared, &packet).await {
            let mut im = shared.im.lock().await;
            if let Err(error) =
                im.outbox.on_send_failed(&channel, &message_id, &error.to_string(), shared.now())
            {
                tracing::warn!(error = %error, "outbox bookkeeping failed");
            }
            failed = true;
        }
    }
    if failed {
        let ticket = shared.im.lock().await.flush(Vec::new());
        shared.watch_commit("the outbox's failed sends", ticket);
    }
}

/// Keeps the outbox moving: redeliveries after backoff, ack timeouts, expiry.
pub(crate) async fn run_pump(shared: Arc<Shared>) {
    let mut ticker = tokio::time::interval(std::time::Duration::from_millis(100));
    loop {
        ticker.tick().await;
        pump(&shared).await;
        let now = shared.now();
        let ticket = {
            let mut im = shared.im.lock().await;
            if !im.may_act() {
                continue;
            }
            if let Err(error) = im.outbox.maintain(now) {
                tracing::warn!(error = %error, "outbox maintenance failed");
            }
            let expiry = im.receiver.prune_deferred(now);
            im.flush(ImState::idempotency(expiry))
        };
        if let Err(error) = ticket.await {
            shared.commit_failed("the outbox's maintenance", &error);
        }
    }
}

pub(crate) async fn on_chat_message(shared: &Arc<Shared>, mut packet: Packet) {
    let Some(channel) = packet.connector_channel_id.clone() else { return };
    // The message moves out of the packet (no copy); what is left is the envelope the ack
    // answers (its ids and channel).
    let message = match std::mem::replace(&mut packet.body, PacketBody::Pong(None)) {
        PacketBody::ChatMessage(message) => *message,
        _ => return,
    };
    // The IM payload rules ran once, in the connection core's judgement of the packet.
    let now = shared.now();
    let Some(admission) = admit(shared, &channel, &message, now).await else {
        // Standing by: the holder answers the redelivery.
        return;
    };
    let ack = match admission {
        Ok(Admission::Process(ticket)) => {
            let sink = lock(&shared.sink).clone();
            if sink.is_none() || message.files.is_empty() {
                let (responder, verdict) = oneshot::channel();
                let inbound =
                    InboundMessage::with_responder(channel.clone(), message, responder, Vec::new());
                crate::connection::emit(shared, ClientEvent::ChatMessage(inbound)).await;
                tokio::spawn(finish(shared.clone(), packet, ticket, verdict));
                return;
            }
            // Files go to the application's sink first, off the reader, a bounded number at a
            // time; a message that finds every waiting place taken is redelivered later.
            let Ok(place) = shared.waiting.clone().try_acquire_owned() else {
                let ack = {
                    let mut im = shared.im.lock().await;
                    im.receiver.abandon(
                        ticket,
                        ErrorCode::ChannelBusy,
                        "too many files are being downloaded; redeliver later",
                        true,
                    )
                };
                send_ack(shared, &packet, ack).await;
                return;
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let saved = {
                    let _slot = shared.downloading.clone().acquire_owned().await;
                    save_files(&shared, &channel, &message).await
                };
                drop(place);
                let saved = match saved {
                    Ok(saved) => saved,
                    Err(error) => {
                        // The detail stays in xAgent's log; the Connector hears only whether
                        // it was refused by policy (final) or failed (retryable).
                        tracing::warn!(
                            channel = %channel,
                            message_id = %message.message_id,
                            error = %error,
                            "an inbound message's file was not downloaded"
                        );
                        let ack = {
                            let mut im = shared.im.lock().await;
                            im.receiver.abandon(
                                ticket,
                                error.code(),
                                error.public_message(),
                                error.is_retryable(),
                            )
                        };
                        send_ack(&shared, &packet, ack).await;
                        return;
                    }
                };
                let (responder, verdict) = oneshot::channel();
                let inbound = InboundMessage::with_responder(channel, message, responder, saved);
                crate::connection::emit(&shared, ClientEvent::ChatMessage(inbound)).await;
                finish(shared, packet, ticket, verdict).await;
            });
            return;
        }
        Ok(Admission::Duplicate(ack) | Admission::Conflict(ack) | Admission::InProgress(ack)) => {
            ack
        }
        Err(error) => ChatMessageAck::rejected(
            message.message_id.clone(),
            ErrorCode::ChannelBusy,
            format!("could not check the message: {error}"),
            true,
        ),
    };
    send_ack(shared, &packet, ack).await;
}

/// Downloads every file of an inbound message through its resolved `download_url`, under the
/// download policy, into the application's sink, returning the application's references in
/// order. One file is held in memory at a time.
async fn save_files(
    shared: &Arc<Shared>,
    channel: &ConnectorChannelId,
    message: &ChatMessage,
) -> Result<Vec<String>, DownloadError> {
    let Some(sink) = lock(&shared.sink).clone() else {
        return Ok(Vec::new());
    };
    let control = shared.control();
    let mut saved = Vec::with_capacity(message.files.len());
    for file in &message.files {
        let Some(url) = &file.download_url else {
            return Err(DownloadError::Refused(format!(
                "file {} has no download_url",
                file.file_ref
            )));
        };
        let downloaded = control.download(url).await.inspect_err(|_| {
            tracing::debug!(url = %loggable_url(url), file_ref = %file.file_ref, "download not taken");
        })?;
        let reference = sink
            .save(channel, file, downloaded.bytes)
            .await
            .map_err(|reason| DownloadError::Failed(format!("the application's sink: {reason}")))?;
        saved.push(reference);
    }
    Ok(saved)
}

/// Waits for the application's verdict, records it and acks.
async fn finish(
    shared: Arc<Shared>,
    packet: Packet,
    ticket: xagent_profile_im::Ticket,
    verdict: oneshot::Receiver<Verdict>,
) {
    let verdict = verdict.await.unwrap_or(Verdict::Reject {
        code: ErrorCode::ChannelBusy,
        message: "the message was not handled".into(),
        retryable: true,
    });
    let (ack, commit) = {
        let mut im = shared.im.lock().await;
        match verdict {
            Verdict::Accept => {
                let (ack, writes) = im.receiver.complete_deferred(ticket, shared.now());
                let key = writes.iter().find_map(|write| match write {
                    IdempotencyWrite::Save(record) => {
                        Some((record.channel.clone(), record.message_id.clone()))
                    }
                    _ => None,
                });
                let commit = im.submit(ImState::idempotency(writes));
                (ack, Some((key, commit)))
            }
            Verdict::Reject { code, message, retryable } => {
                (im.receiver.abandon(ticket, code, message, retryable), None)
            }
        }
    };
    if let Some((key, commit)) = commit {
        // `accepted` leaves only once the id is stored: a crash (or a takeover) before that
        // makes the Connector redeliver, and the next process processes it again.
        if let Err(error) = commit.await {
            shared.commit_failed("a completed message", &error);
            return;
        }
        if let Some((channel, message_id)) = key {
            shared.im.lock().await.receiver.committed(&channel, &message_id);
        }
    }
    send_ack(&shared, &packet, ack).await;
}

/// Admits an inbound message through the receiver set: an id the set does not hold in memory
/// is looked up in the store (outside the IM lock). `None` while this process stands by.
async fn admit(
    shared: &Arc<Shared>,
    channel: &ConnectorChannelId,
    message: &ChatMessage,
    now: u64,
) -> Option<Result<Admission, String>> {
    let persisted = {
        let mut im = shared.im.lock().await;
        if !im.may_act() {
            return None;
        }
        let persisted = im.persisted(channel);
        if !im.receiver.needs_lookup(&persisted, &message.message_id) {
            return Some(Ok(im.receiver.begin_chat_with_stored(&persisted, message, None, now)));
        }
        persisted
    };
    let stored = match shared.store.lookup_completed(&persisted, &message.message_id).await {
        Ok(stored) => stored,
        Err(error) => return Some(Err(error.to_string())),
    };
    let mut im = shared.im.lock().await;
    if !im.may_act() {
        return None;
    }
    Some(Ok(im.receiver.begin_chat_with_stored(&persisted, message, stored, now)))
}

async fn send_ack(shared: &Shared, message: &Packet, ack: ChatMessageAck) {
    let packet = Packet::with_payload(ids::mint("pkt_"), ack).answering(message);
    if let Err(error) = send_on(shared, &packet).await {
        tracing::warn!(error = %error, "could not send chat.message.ack; the Connector will redeliver");
    }
}

pub(crate) async fn on_chat_message_ack(shared: &Arc<Shared>, packet: Packet) {
    let (Some(channel), Some(reply_to)) =
        (packet.connector_channel_id.clone(), packet.reply_to.clone())
    else {
        tracing::warn!("chat.message.ack without channel or reply_to ignored");
        return;
    };
    let Some(ack) = packet.payload::<ChatMessageAck>().cloned() else { return };
    let ticket = {
        let mut im = shared.im.lock().await;
        if !im.may_act() {
            return;
        }
        let persisted = im.persisted(&channel);
        match im.outbox.on_ack(&persisted, &ack, &reply_to, shared.now()) {
            Ok(outcome) => {
                if matches!(
                    outcome,
                    xagent_profile_im::AckOutcome::Delivered { .. }
                        | xagent_profile_im::AckOutcome::Failed { .. }
                ) {
                    shared.settled.settle(&persisted, &ack);
                }
                tracing::debug!(?outcome, "chat.message.ack applied");
            }
            Err(error) => tracing::warn!(error = %error, "chat.message.ack not applied"),
        }
        im.flush(Vec::new())
    };
    // A delivered message's record goes after the ack; a crash before that redelivers it and
    // the Connector answers `duplicate`.
    shared.watch_commit("an acknowledged message", ticket);
    crate::connection::emit(shared, ClientEvent::ChatMessageAcked { channel, ack }).await;
    pump(shared).await;
}

/// Judges a delta by the per-message sequence rule and records it: the next `sequence`, or
/// an identical repeat of one already sent; a gap or a changed repeat is refused, and so is
/// any delta after the message's final. `Ok(true)` when it was recorded as a new delta (to be
/// withdrawn if its write fails). A `sequence` of 0 is left to the payload rules the writer
/// runs on every packet, which refuse it naming their rule.
pub(crate) fn judge_delta(
    im: &mut ImState,
    channel: &ConnectorChannelId,
    delta: &ChatMessageDelta,
    now: u64,
) -> Result<bool, ClientError> {
    if delta.sequence == 0 {
        return Ok(false);
    }
    let persisted = im.persisted(channel);
    match im.deltas.on_delta(&persisted, delta, now) {
        Ok(DeltaAction::Late) => Err(ClientError::StreamClosed {
            channel: channel.clone(),
            message_id: delta.message_id.clone(),
        }),
        Ok(DeltaAction::Replay) => Ok(false),
        Ok(_) => Ok(true),
        Err(error) => Err(ClientError::Delta(error)),
    }
}
