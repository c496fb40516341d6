//! IM Profile wiring (`profile-im`): the outbox for messages from the target system to xAgent
//! (IM v2 `chat.message`, IM v1 `message.push`), redelivered when a channel reopens; receiver
//! idempotency for `chat.message` from xAgent; the delta assembler; activity validation.
//!
//! Decisions: `chat.message`s from xAgent (and deltas and activity) are handled in order per
//! channel and concurrently across channels ([`crate::lanes`]): a slow target delivery on one
//! channel never holds up another channel on the same socket. A channel with 64 packets
//! already waiting gets a retryable `channel_busy` refusal instead of a longer queue.
//! Redelivery happens when a channel is reopened and on maintenance ticks (backoff, ack
//! timeouts); completed history is never resent (the outbox only holds unfinished messages).
//!
//! Writes: the outbox and the receiver run in deferred write mode and their writes go to the
//! storage's group commit (`Storage::commit_im`), submitted under the IM lock so they commit
//! in the order they were made. What is acknowledged waits for its commit: `send_message`
//! returns only once the message's record is durable, and an `accepted` ack to xAgent is sent
//! only once the completed id is. Attempt counts and removals are not waited for; they ride
//! along with the next commit (a crash before it means a redelivery the receiver answers
//! `duplicate`).
//!
//! One IM submission is on its way to the writer at a time ([`Pipeline`]): writes made while
//! it commits are collected and go together, as one submission, the moment it has committed,
//! and whoever waits for them is told when that one has. So concurrent senders share one
//! submission (one queue hand-off, one writer wake-up, one savepoint) per transaction
//! instead of one each, and nobody waits longer than the commit in progress plus their own.
//!
//! Here: the outbox's state, its commit pipeline and the `ImHost` trait the wiring runs on;
//! `send`: taking a message (`enqueue`) and sending what is due (`pump`, its writes' outcomes); `channels`: a channel's outbox as it opens, loses its route, is adopted from
//! another replica or forgotten, and the maintenance ticks; `inbound`: packets from xAgent
//! (acks, final messages, deltas, activity).

use std::sync::{Arc, Mutex, MutexGuard};

use xagent_profile_im::{
    ActivityConfig, ActivityTracker, DeferredStore, DeltaAssembler, DeltaConfig, DeltaStrategy,
    IdempotencyConfig, IdempotencyWrite, Outbox, OutboxConfig, OutboxEvent, OutboxWrite,
    ReceiverIdempotency, WriteMode,
};
use xagent_protocol_types::{
    Clock, ConnectorChannelId, MessageId, PROFILE_IM_V1, PROFILE_IM_V2, Packet, Side,
};

use crate::author::ChannelContext;
use crate::author::call::ImCode;
use crate::connector::Connector;
use crate::error::HandleError;
use crate::storage::{Storage, StorageError, WriteOp};

mod channels;
mod inbound;
mod send;

/// What the IM wiring asks of the runtime it runs in (the runtime state implements it), so
/// this module does not depend on the state that holds it.
pub(crate) trait ImHost: Send + Sync + 'static {
    /// Now, from the injected clock (Unix ms).
    fn now(&self) -> u64;
    /// Stamps a packet with the current time.
    fn packet(&self, packet: Packet) -> Packet;
    /// The storage (its group commit takes the IM writes).
    fn storage(&self) -> &dyn Storage;
    /// The Transfer Plane's store, when enabled (download URLs are re-signed on redelivery).
    fn files(&self) -> Option<&xagent_file_transfer::FileStore>;
    /// The runtime's IM state (the one this wiring runs in).
    fn im(&self) -> Option<&ImState>;
    /// The author's IM target.
    fn im_target(&self) -> Option<&ImCode>;
    /// The largest packet the data plane takes.
    fn max_packet_bytes(&self) -> usize;
    /// `Ok` for a known, signed-in channel; why not otherwise.
    fn check_signed_in(&self, channel: &ConnectorChannelId) -> Result<(), HandleError>;
    /// True when the channel is routed to a live socket.
    fn is_routed(&self, channel: &ConnectorChannelId) -> bool;
    /// The context the author's IM code gets for a signed-in channel.
    fn channel_context(self: &Arc<Self>, channel: &ConnectorChannelId) -> Option<ChannelContext>;
    /// Queues a packet on the channel's route without waiting (see [`TryQueue`]).
    fn try_queue_tracked(&self, channel: &ConnectorChannelId, packet: Packet) -> TryQueue;
    /// Resolves once the write queue of the channel's route has room for a packet (at once
    /// when the channel has no route, or when its socket is gone).
    fn room_on_route(
        &self,
        channel: &ConnectorChannelId,
    ) -> impl std::future::Future<Output = ()> + Send + 'static;
    /// Sends a packet on the channel's route; false when not routed.
    fn send_on_route(
        &self,
        channel: &ConnectorChannelId,
        packet: Packet,
    ) -> impl std::future::Future<Output = bool> + Send;
}

/// The outcome of queueing a packet on a route without waiting.
pub(crate) enum TryQueue {
    /// Queued; the receiver says whether the write succeeded.
    Queued(tokio::sync::oneshot::Receiver<Result<(), xagent_connection::SendError>>),
    /// The route's write queue is full.
    Full,
    /// The channel has no route.
    NotRouted,
}

/// Packets from xAgent a channel may have waiting for its target before new ones are refused
/// with a retryable `channel_busy`.
const LANE_CAPACITY: usize = 64;

struct Inner {
    outbox: Outbox<DeferredStore>,
    receiver: ReceiverIdempotency<DeferredStore>,
    deltas: DeltaAssembler,
    activity: ActivityTracker,
    /// The IM writes on their way to the storage.
    pipeline: Pipeline,
    /// Messages this outbox finished lately (replicas only).
    finished: Finished,
}

impl Inner {
    /// The outbox's new facts, noting the messages they finish (every drain goes through
    /// here, so [`Finished`] knows a message the moment it leaves the outbox).
    fn take_events(&mut self) -> Vec<OutboxEvent> {
        let events = self.outbox.drain_events();
        for event in &events {
            if let Some((channel, message_id)) = finished_by(event) {
                self.finished.note(channel, message_id);
            }
        }
        events
    }
}

/// The message an outbox fact takes out of the outbox for good, if it is such a fact.
fn finished_by(event: &OutboxEvent) -> Option<(&ConnectorChannelId, &MessageId)> {
    match event {
        OutboxEvent::Delivered { channel, message_id, .. }
        | OutboxEvent::Failed { channel, message_id, .. }
        | OutboxEvent::Expired { channel, message_id, .. }
        | OutboxEvent::Evicted { channel, message_id, .. }
        | OutboxEvent::Discarded { channel, message_id, .. } => Some((channel, message_id)),
        _ => None,
    }
}

/// How many finished messages a replica's outbox remembers: far more than the wake-ups a
/// replica can have queued before it falls behind and reads everything again.
const FINISHED_REMEMBERED: usize = 65_536;

/// The messages a replica's outbox finished lately, as hashes of `(channel, message_id)`,
/// oldest forgotten first: a record carried in a wake-up that arrives after its message was
/// delivered is not taken as it is but read (gone, unless queued again since; a hash that
/// collides only costs that read).
#[derive(Default)]
struct Finished {
    capacity: usize,
    seen: std::collections::HashSet<u64>,
    order: std::collections::VecDeque<u64>,
}

impl Finished {
    fn with_capacity(capacity: usize) -> Self {
        Self { capacity, ..Self::default() }
    }

    fn key(channel: &ConnectorChannelId, message_id: &MessageId) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (channel.as_str(), message_id.as_str()).hash(&mut hasher);
        hasher.finish()
    }

    fn note(&mut self, channel: &ConnectorChannelId, message_id: &MessageId) {
        if self.capacity == 0 {
            return;
        }
        let key = Self::key(channel, message_id);
        if self.seen.insert(key) {
            self.order.push_back(key);
            if self.order.len() > self.capacity
                && let Some(oldest) = self.order.pop_front()
            {
                self.seen.remove(&oldest);
            }
        }
    }

    fn contains(&self, channel: &ConnectorChannelId, message_id: &MessageId) -> bool {
        self.capacity != 0 && self.seen.contains(&Self::key(channel, message_id))
    }
}

/// IM writes on their way to the storage's group commit: at most one submission in flight;
/// what is collected meanwhile (the outbox's writes stay in the outbox) goes as the next one.
#[derive(Default)]
struct Pipeline {
    /// A submission is on its way to the writer.
    in_flight: bool,
    /// Outbox writes that go first in the next submission (a repeated enqueue's record).
    outbox_first: Vec<OutboxWrite>,
    /// Receiver writes for the next submission.
    receiver: Vec<IdempotencyWrite>,
    /// Other writes for the next submission: an author's records stored with the outbox
    /// record of the message they belong to ([`crate::ConnectorHandle::send_message_with`]).
    extra: Vec<WriteOp>,
    /// Who waits for the next submission's commit.
    waiters: Vec<tokio::sync::oneshot::Sender<Result<(), String>>>,
}

/// The waiting side of IM writes: resolves once the transaction holding them committed.
pub(crate) struct ImCommit(tokio::sync::oneshot::Receiver<Result<(), String>>);

impl ImCommit {
    /// Waits for the commit.
    pub(crate) async fn committed(self) -> Result<(), StorageError> {
        match self.0.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(StorageError::new("commit IM writes", reason)),
            Err(_) => Err(StorageError::new(
                "commit IM writes",
                "the runtime stopped before committing these writes",
            )),
        }
    }
}

/// The IM state of the runtime (present when the Card declares an IM Profile).
pub(crate) struct ImState {
    inner: Mutex<Inner>,
    pump: tokio::sync::Mutex<()>,
    /// Per-channel order, cross-channel concurrency for packets from xAgent.
    lanes: crate::lanes::Lanes<ConnectorChannelId>,
    /// Outbox facts for the author (see [`crate::ConnectorHandle::outbox_events`]).
    pub(crate) events: tokio::sync::broadcast::Sender<OutboxEvent>,
    /// Replicas share the database: this outbox holds only the channels routed here (the
    /// replica holding a channel's socket delivers its messages; the others only store them).
    replicated: bool,
}

fn storage_error(error: impl std::error::Error + Send + Sync + 'static) -> StorageError {
    StorageError::new("open IM state", error)
}

impl ImState {
    pub(crate) async fn new(
        connector: &Connector,
        storage: &dyn Storage,
        clock: &Arc<dyn Clock>,
        window: usize,
        replicated: bool,
    ) -> Result<Option<Self>, StorageError> {
        let profiles = &connector.card.supports.profiles;
        if !profiles.iter().any(|p| p.as_str() == PROFILE_IM_V2 || p.as_str() == PROFILE_IM_V1) {
            return Ok(None);
        }
        let now = clock.now_millis();
        let config = OutboxConfig {
            write_mode: WriteMode::Deferred,
            window,
            ..OutboxConfig::new(Side::Connector)
        };
        // A replica routes nothing yet and loads a channel's records when it is opened here.
        let pending = if replicated { Vec::new() } else { storage.load_pending().await? };
        let mut outbox = Outbox::open(config, DeferredStore::with_pending(pending), now)
            .map_err(storage_error)?;
        // Nothing is routed at startup: every channel waits for its channel.open.
        let channels: Vec<ConnectorChannelId> = outbox.stats().channels.keys().cloned().collect();
        for channel in channels {
            outbox.on_channel_closed(&channel, now).map_err(storage_error)?;
        }
        // What opening changed (unreadable records dropped, expiries, the receiver's first age
        // expiry) is written now.
        let mut receiver = ReceiverIdempotency::deferred(IdempotencyConfig::default());
        let expiry = receiver.prune_deferred(now);
        storage.commit_im(outbox.take_writes(), expiry).committed().await?;
        let streams = connector.im.as_ref().is_some_and(|im| im.streams_deltas());
        let strategy =
            if streams { DeltaStrategy::StreamEdit } else { DeltaStrategy::BufferUntilFinal };
        let deltas = DeltaAssembler::new(DeltaConfig::with_strategy(strategy));
        let capability =
            connector.im.as_ref().map(|im| im.activity_capability()).unwrap_or_default();
        let activity =
            ActivityTracker::new(ActivityConfig { capability, ..ActivityConfig::default() });
        let finished = Finished::with_capacity(if replicated { FINISHED_REMEMBERED } else { 0 });
        let inner =
            Inner { outbox, receiver, deltas, activity, pipeline: Pipeline::default(), finished };
        let (events, _) = tokio::sync::broadcast::channel(1024);
        Ok(Some(Self {
            inner: Mutex::new(inner),
            pump: tokio::sync::Mutex::new(()),
            lanes: crate::lanes::Lanes::new(LANE_CAPACITY),
            events,
            replicated,
        }))
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Submits what the outbox collected (and `receiver` writes) to the storage's group commit
    /// and returns the ticket to wait on before acknowledging anything they hold. Called with
    /// the IM lock held, so submissions keep the order the writes were made in. While another
    /// submission is on its way they wait for it and then go with everything else collected
    /// meanwhile ([`Pipeline`]).
    fn submit<H: ImHost>(
        shared: &Arc<H>,
        inner: &mut Inner,
        receiver: Vec<IdempotencyWrite>,
    ) -> ImCommit {
        let (tx, rx) = tokio::sync::oneshot::channel();
        inner.pipeline.receiver.extend(receiver);
        inner.pipeline.waiters.push(tx);
        Self::flush(shared, inner);
        ImCommit(rx)
    }

    /// Submits the outbox's collected writes without waiting for them (attempt counts,
    /// removals, pauses: nothing is acknowledged on their strength); a failure is logged.
    /// While a submission is on its way they ride along with the next one.
    fn submit_in_background<H: ImHost>(shared: &Arc<H>, inner: &mut Inner) {
        Self::flush(shared, inner);
    }

    /// Hands what is collected to the storage's group commit unless a submission is on its
    /// way (it then goes the moment that one has committed). Waiters hear the result of the
    /// commit that holds their writes; with nothing to write they hear `Ok` at once.
    ///
    /// The submitting task yields once before it takes the writes, so the tasks that are ready
    /// to run at that moment (typically the senders the last commit just released, about to
    /// queue their next message) add theirs to the same submission; with nobody else ready
    /// the yield returns at once.
    fn flush<H: ImHost>(shared: &Arc<H>, inner: &mut Inner) {
        if inner.pipeline.in_flight {
            return;
        }
        let nothing_to_write = inner.pipeline.outbox_first.is_empty()
            && inner.pipeline.receiver.is_empty()
            && inner.pipeline.extra.is_empty()
            && !inner.outbox.has_writes();
        if nothing_to_write {
            for waiter in std::mem::take(&mut inner.pipeline.waiters) {
                let _ = waiter.send(Ok(()));
            }
            return;
        }
        inner.pipeline.in_flight = true;
        let shared = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::task::yield_now().await;
                let Some(im) = shared.im() else { return };
                let (ticket, waiters) = {
                    let mut inner = im.inner();
                    let mut outbox = std::mem::take(&mut inner.pipeline.outbox_first);
                    outbox.extend(inner.outbox.take_writes());
                    let receiver = std::mem::take(&mut inner.pipeline.receiver);
                    let extra = std::mem::take(&mut inner.pipeline.extra);
                    let waiters = std::mem::take(&mut inner.pipeline.waiters);
                    if outbox.is_empty() && receiver.is_empty() && extra.is_empty() {
                        inner.pipeline.in_flight = false;
                        drop(inner);
                        for waiter in waiters {
                            let _ = waiter.send(Ok(()));
                        }
                        return;
                    }
                    let mut ops = crate::storage::im_write_ops(outbox, receiver);
                    ops.extend(extra);
                    (shared.storage().commit(ops), waiters)
                };
                let result = ticket.committed().await.map_err(|error| {
                    tracing::warn!(%error, "could not persist IM writes");
                    error.to_string()
                });
                for waiter in waiters {
                    // A waiter that stopped waiting is fine: the writes committed all the same.
                    let _ = waiter.send(result.clone());
                }
            }
        });
    }

    fn log_events(&self) {
        let events = self.inner().take_events();
        self.publish(events);
    }

    /// Logs drained outbox events and hands them to the author's subscribers (taken under the
    /// IM lock by the caller, published after it is released).
    fn publish(&self, events: Vec<OutboxEvent>) {
        for event in events {
            match &event {
                OutboxEvent::Delivered { channel, message_id, after_ms, .. } => {
                    crate::metrics::metrics().delivered(*after_ms);
                    tracing::debug!(%channel, %message_id, "message delivered to xAgent");
                }
                other => tracing::info!(event = ?other, "outbox event"),
            }
            // Nobody listening is fine: the events are facts, not commands (`send` then hands
            // the event back, uncopied).
            let _ = self.events.send(event);
        }
    }
}

/// How often the runtime looks whether the outbox has something due (see
/// [`ImState::run_due`]); a look with nothing due costs one pass over the pending heads.
pub(crate) const DUE_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
