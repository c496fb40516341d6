//! IM Profile v2 from the xAgent side: inbound user messages through receiver idempotency with
//! acks after the application's verdict; assistant messages through the outbox (pending until
//! `accepted` or `duplicate`, redelivered with the same `message_id`); deltas and activity sent
//! as they come.

use std::sync::Arc;

use tokio::sync::oneshot;
use xagent_profile_im::{
    Admission, Delivery, DeltaAction, EnqueueOutcome, IdempotencyWrite, OutboxStats,
    validate_chat_message,
};
use xagent_protocol_types::{
    ChatActivity, ChatFile, ChatMessage, ChatMessageAck, ChatMessageDelta, ConnectorChannelId,
    ErrorCode, MessageId, Packet, PacketBody, PacketId, Payload, Side, UploadResponse,
};

use crate::connection::{ClientEvent, InboundMessage, Shared, Verdict, lock, send_on};
use crate::download::{DownloadError, loggable_url};
use crate::im_state::ImState;
use crate::store::CommitError;
use crate::stream::MessageStream;
use crate::uploads::message_file;
use crate::{ClientError, DataPlane, FileContent, ids};

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
    let now = shared.now();
    // Profile payload rules before anything else: a malformed message is refused for good.
    if let Err(error) = validate_chat_message(&message, Side::Connector) {
        let ack = ChatMessageAck::rejected(
            message.message_id.clone(),
            error.code(),
            error.to_string(),
            false,
        );
        send_ack(shared, &packet, ack).await;
        return;
    }
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

/// Answers a `chat.message` the validator refused (`problems`: its rule ids and places) with a
/// `rejected` ack, not retryable: the same message would be refused again (IM v2 §7).
pub(crate) async fn refuse_chat_message(shared: &Shared, packet: &Packet, problems: &str) {
    let Some(message) = packet.payload::<ChatMessage>() else { return };
    let ack = ChatMessageAck::rejected(
        message.message_id.clone(),
        ErrorCode::InvalidPacket,
        format!("the message breaks the protocol: {problems}"),
        false,
    );
    send_ack(shared, packet, ack).await;
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
fn judge_delta(
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

impl DataPlane {
    /// Queues a complete assistant message for a channel. It stays pending until the Connector
    /// acks `accepted` or `duplicate`, and is redelivered with the same `message_id` after
    /// timeouts, disconnects and retryable rejections, until it expires. Every file must be
    /// one [`DataPlane::upload_message_file`] uploaded on this channel and not yet expired
    /// ([`crate::OutboundFileError`] otherwise, nothing queued). The message closes its delta
    /// stream: later deltas of the same `message_id` are refused.
    pub async fn send_chat_message(
        &self,
        channel: &ConnectorChannelId,
        message: ChatMessage,
    ) -> Result<EnqueueOutcome, ClientError> {
        let (outcome, ticket) = {
            let now = self.shared().now();
            let mut im = self.shared().im.lock().await;
            if !im.may_act() {
                return Err(CommitError::NotHolder.into());
            }
            im.uploads.check(channel, &message.files, now)?;
            let persisted = im.persisted(channel);
            let message_id = message.message_id.clone();
            let outcome = im
                .outbox
                .enqueue(&persisted, message, now)
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
            im.deltas.on_final(&persisted, &message_id);
            (outcome, im.flush(Vec::new()))
        };
        // Reported done only once its record is stored.
        if let Err(error) = ticket.await {
            self.shared().commit_failed("an enqueued message", &error);
            return Err(error.into());
        }
        pump(self.shared()).await;
        Ok(outcome)
    }

    /// Starts streaming an assistant message on `channel`: the runtime numbers its deltas from
    /// 1 ([`MessageStream::delta`]) and its final message closes it
    /// ([`MessageStream::finish`]).
    pub fn stream_message(
        &self,
        channel: &ConnectorChannelId,
        message_id: impl Into<MessageId>,
    ) -> MessageStream {
        MessageStream::new(self.clone(), channel.clone(), message_id.into())
    }

    /// Sends a text delta of an assistant message (no ack; the final message completes it).
    /// Its `sequence` must be the message's next one (1 for the first) or an identical repeat
    /// of one already sent: anything else is refused here with the Connector's own verdict and
    /// not sent (0: [`ClientError::Invalid`] from the payload rules; a gap or a changed
    /// repeat: [`ClientError::Delta`]; after the final: [`ClientError::StreamClosed`]).
    /// [`DataPlane::stream_message`] numbers the deltas itself.
    pub async fn send_delta(
        &self,
        channel: &ConnectorChannelId,
        delta: ChatMessageDelta,
    ) -> Result<(), ClientError> {
        let recorded = {
            let now = self.shared().now();
            let mut im = self.shared().im.lock().await;
            judge_delta(&mut im, channel, &delta, now)?
        };
        self.write_delta(channel, delta, recorded).await
    }

    /// Numbers and records the next delta of a streamed message.
    pub(crate) async fn next_delta(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        text: String,
    ) -> Result<ChatMessageDelta, ClientError> {
        let now = self.shared().now();
        let mut im = self.shared().im.lock().await;
        let persisted = im.persisted(channel);
        let Some(sequence) = im.deltas.next_sequence(&persisted, message_id) else {
            return Err(ClientError::StreamClosed {
                channel: channel.clone(),
                message_id: message_id.clone(),
            });
        };
        let delta = ChatMessageDelta::new(message_id.clone(), sequence, text);
        judge_delta(&mut im, channel, &delta, now)?;
        Ok(delta)
    }

    /// Writes a judged delta. When the write fails (refused by the writer's rules, withheld,
    /// not connected) the Connector never saw it: a delta `recorded` as new is withdrawn, so
    /// its number is used again rather than leaving a gap.
    pub(crate) async fn write_delta(
        &self,
        channel: &ConnectorChannelId,
        delta: ChatMessageDelta,
        recorded: bool,
    ) -> Result<(), ClientError> {
        let (message_id, sequence) = (delta.message_id.clone(), delta.sequence);
        let written = self.send_push(channel, delta).await;
        if written.is_err() && recorded {
            let mut im = self.shared().im.lock().await;
            let persisted = im.persisted(channel);
            im.deltas.withdraw(&persisted, &message_id, sequence);
        }
        written
    }

    /// Uploads a file for an assistant message on `channel` (`POST /files/uploads` with that
    /// channel) and returns the file item to put in the message's `files`. The client
    /// remembers the `file_ref` for this channel until the Connector's `expires_at`, which
    /// [`DataPlane::send_chat_message`] checks.
    pub async fn upload_message_file(
        &self,
        channel: &ConnectorChannelId,
        file: FileContent,
    ) -> Result<ChatFile, ClientError> {
        let mime_type = file.mime_type.clone();
        let answer = self.upload_on(channel, file).await?;
        Ok(message_file(&answer, &mime_type))
    }

    /// The one upload path (message files and Tool upload references): uploads on `channel`
    /// and records the answer.
    pub(crate) async fn upload_on(
        &self,
        channel: &ConnectorChannelId,
        file: FileContent,
    ) -> Result<UploadResponse, ClientError> {
        let answer =
            self.control().upload(channel, &file.filename, &file.mime_type, file.bytes).await?;
        let now = self.shared().now();
        self.shared().im.lock().await.uploads.record(channel, &answer, now);
        Ok(answer)
    }

    /// Sends an activity snapshot (no ack, not persisted).
    pub async fn send_activity(
        &self,
        channel: &ConnectorChannelId,
        activity: ChatActivity,
    ) -> Result<(), ClientError> {
        self.send_push(channel, activity).await
    }

    async fn send_push<P: Payload>(
        &self,
        channel: &ConnectorChannelId,
        payload: P,
    ) -> Result<(), ClientError> {
        let packet = Packet::with_payload(ids::mint("pkt_"), payload).channel(channel.clone());
        self.send(&packet).await
    }

    /// Whether an assistant message is still pending.
    pub async fn is_pending(&self, channel: &ConnectorChannelId, message_id: &MessageId) -> bool {
        let im = self.shared().im.lock().await;
        let persisted = im.persisted(channel);
        im.outbox.is_pending(&persisted, message_id)
    }

    /// Outbox counters (attempts, expirations, evictions, last error).
    pub async fn outbox_stats(&self) -> OutboxStats {
        self.shared().im.lock().await.outbox.stats()
    }
}
