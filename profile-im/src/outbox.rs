//! The sender's outbox: per-channel FIFO of complete messages that stay pending until a
//! terminal acknowledgement, redelivered with backoff and the same `message_id`, bounded by a
//! TTL counted from first responsibility and by a per-channel capacity.
//!
//! The runtime drives it:
//!
//! 1. [`Outbox::enqueue`] when it takes responsibility for a message;
//! 2. [`Outbox::next_ready`] whenever it can send: per channel, the pending messages in queue
//!    order up to [`OutboxConfig::window`] in flight at once (1 by default: the head waits for
//!    its ack before the next is sent). A message waiting for a backoff is never overtaken by
//!    a later one of its channel; other channels flow. Only channels something happened to
//!    since the last call are looked at (plus those whose backoff ran out), so a call costs
//!    O(changed channels x window), not O(all channels);
//! 3. [`Outbox::on_sent`] after writing the packet (with the fresh `packet_id`), or
//!    [`Outbox::on_send_failed`] when the write failed (an ack that overtakes `on_sent` is
//!    kept as [`AckOutcome::Deferred`] and applied by `on_sent`);
//! 4. [`Outbox::on_ack`] for each `chat.message.ack`;
//! 5. [`Outbox::on_disconnect`], [`Outbox::on_channel_closed`],
//!    [`Outbox::on_channel_reopened`] on transport and channel events;
//! 6. [`Outbox::maintain`] (ack timeouts and expiry) at least every
//!    [`OutboxConfig::effective_cleanup_interval_ms`], or at [`Outbox::next_wakeup`].
//!
//! Every terminal fact (delivered, failed, expired, evicted, discarded) is returned by the call
//! that caused it and also appended to an event log the runtime drains with
//! [`Outbox::drain_events`] for logs and metrics.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};
use xagent_protocol_types::{
    AckStatus, ChatMessage, ChatMessageAck, ConnectorChannelId, ErrorCode, MessageId, MessagePush,
    Packet, PacketBody, PacketId, Payload, Side,
};

use crate::store::{
    AttemptUpdate, MemoryStore, OutboxStore, OutboxWrite, PendingRecord, coalesce_outbox_writes,
};
use crate::{OutboxError, PayloadError, StoreError, validate_chat_message, validate_message_push};

/// Default TTL of a pending message: one hour from first responsibility.
pub const DEFAULT_TTL_MS: u64 = 60 * 60 * 1000;
/// Default per-channel capacity of pending messages.
pub const DEFAULT_CAPACITY_PER_CHANNEL: usize = 1000;
/// Default ack timeout after a write.
pub const DEFAULT_ACK_TIMEOUT_MS: u64 = 30_000;
/// Default cleanup interval (always capped at TTL/2).
pub const DEFAULT_CLEANUP_INTERVAL_MS: u64 = 60_000;
/// Default number of messages per channel in flight at once: one (strict order even when a
/// transmission fails; see [`OutboxConfig::window`]).
pub const DEFAULT_WINDOW: usize = 1;
/// How many past `packet_id`s of one message are remembered to match late acks.
const REMEMBERED_PACKETS: usize = 16;
/// How many acks that overtake `on_sent` are kept per message.
const MAX_EARLY_ACKS: usize = 4;

/// Exponential backoff between transmissions of one message. The n-th failed attempt waits
/// `min(initial_ms * multiplier^(n-1), max_ms)`; there is no jitter, so schedules are
/// reproducible. Retries are bounded by the TTL, not by a count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub initial_ms: u64,
    /// Growth factor per further failure.
    pub multiplier: u32,
    /// Upper bound of a delay.
    pub max_ms: u64,
}

impl Default for Backoff {
    /// 1 s, 2 s, 4 s, 8 s, 16 s, 32 s, then 60 s.
    fn default() -> Self {
        Self { initial_ms: 1_000, multiplier: 2, max_ms: 60_000 }
    }
}

impl Backoff {
    /// The delay after `failures` failed attempts (0 failures: no delay).
    pub fn delay_ms(&self, failures: u32) -> u64 {
        if failures == 0 {
            return 0;
        }
        let mut delay = self.initial_ms.min(self.max_ms);
        for _ in 1..failures {
            delay = delay.saturating_mul(u64::from(self.multiplier));
            if delay >= self.max_ms {
                return self.max_ms;
            }
        }
        delay
    }
}

/// What to do when a channel already holds `capacity_per_channel` pending messages (after
/// expired messages have been removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OverflowPolicy {
    /// Refuse the new message with `capacity_exceeded` (backpressure: the caller still owns
    /// it and may stop advancing the target system's cursor). The default.
    #[default]
    RejectNew,
    /// Drop the oldest message that is not in flight, record it as evicted with
    /// `capacity_exceeded`, and accept the new one.
    EvictOldest,
}

/// When the outbox's writes reach its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// Every call writes through to the store before it changes the outbox (one store batch
    /// per call: a pass of [`Outbox::next_ready`] over many channels is one batch). A store
    /// failure leaves the outbox unchanged. The default.
    #[default]
    Through,
    /// Calls change the outbox and collect their writes; the runtime takes them with
    /// [`Outbox::take_writes`] and commits them, grouped with other work, before it
    /// acknowledges anything that depends on them (the enqueue of a message). Attempt counts
    /// and removals then cost no transaction of their own: they ride along with the next
    /// commit. A crash before that commit forgets them, which only means a redelivery the
    /// receiver answers with `duplicate` (a removal) or one transmission not counted (an
    /// attempt); a message the caller was told is queued is never lost.
    Deferred,
}

/// Outbox policy. All values are documented defaults and may be changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutboxConfig {
    /// Which side sends (decides e.g. whether files need `download_url`).
    pub sender: Side,
    /// Lifetime of a pending message from first responsibility.
    pub ttl_ms: u64,
    /// Pending messages per channel (in flight included).
    pub capacity_per_channel: usize,
    /// Behaviour when a channel is full.
    pub overflow: OverflowPolicy,
    /// Delay schedule between transmissions.
    pub backoff: Backoff,
    /// How long to wait for a `chat.message.ack` (or for `on_sent` after `next_ready`).
    pub ack_timeout_ms: u64,
    /// Desired cleanup interval; the effective one is capped at TTL/2.
    pub cleanup_interval_ms: u64,
    /// Maximum undrained events kept; older ones are dropped and counted.
    pub event_log_capacity: usize,
    /// When writes reach the store.
    pub write_mode: WriteMode,
    /// Messages of one channel that may be in flight (sent, ack not yet received) at once; 0
    /// is read as 1. They are handed out in queue order, so on one ordered transport the
    /// receiver sees first transmissions in order. With a window above 1 a message whose
    /// transmission fails (timeout, retryable rejection, lost write) is sent again after later
    /// messages that were already in flight and may have been accepted meanwhile: order then
    /// holds for everything not yet sent, not for what was in flight. With 1, order is strict.
    pub window: usize,
}

impl OutboxConfig {
    /// Defaults for the given sender: TTL 1 h, 1,000 per channel, reject-new on overflow,
    /// backoff 1 s doubling to 60 s, ack timeout 30 s, cleanup every 60 s.
    pub fn new(sender: Side) -> Self {
        Self {
            sender,
            ttl_ms: DEFAULT_TTL_MS,
            capacity_per_channel: DEFAULT_CAPACITY_PER_CHANNEL,
            overflow: OverflowPolicy::RejectNew,
            backoff: Backoff::default(),
            ack_timeout_ms: DEFAULT_ACK_TIMEOUT_MS,
            cleanup_interval_ms: DEFAULT_CLEANUP_INTERVAL_MS,
            event_log_capacity: 10_000,
            write_mode: WriteMode::Through,
            window: DEFAULT_WINDOW,
        }
    }

    /// The cleanup interval actually used: the configured one, at most TTL/2, at least 1 ms.
    pub fn effective_cleanup_interval_ms(&self) -> u64 {
        self.cleanup_interval_ms.min(self.ttl_ms / 2).max(1)
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self::new(Side::Connector)
    }
}

/// A payload the outbox can carry: an IM v2 `chat.message` (acknowledged) or an IM v1
/// `message.push` (delivered by the write).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "payload")]
#[non_exhaustive]
pub enum OutboundPayload {
    /// IM v2.
    #[serde(rename = "chat.message")]
    ChatMessage(ChatMessage),
    /// IM v1.
    #[serde(rename = "message.push")]
    MessagePush(Box<MessagePush>),
}

impl OutboundPayload {
    /// The business id.
    pub fn message_id(&self) -> Option<&MessageId> {
        match self {
            Self::ChatMessage(m) => Some(&m.message_id),
            Self::MessagePush(p) => p.message_id.as_ref(),
        }
    }

    /// The wire packet type.
    pub fn packet_type(&self) -> &'static str {
        match self {
            Self::ChatMessage(_) => ChatMessage::TYPE,
            Self::MessagePush(_) => MessagePush::TYPE,
        }
    }

    /// True when the receiver answers with a business ack (IM v2); false when the write is the
    /// delivery boundary (IM v1).
    pub fn expects_ack(&self) -> bool {
        matches!(self, Self::ChatMessage(_))
    }

    /// The packet body to put into an envelope.
    pub fn to_body(&self) -> PacketBody {
        match self {
            Self::ChatMessage(m) => m.clone().into_body(),
            Self::MessagePush(p) => (**p).clone().into_body(),
        }
    }

    /// The packet body, taking the payload (no copy): for a [`Delivery`] the runtime owns.
    pub fn into_body(self) -> PacketBody {
        match self {
            Self::ChatMessage(m) => m.into_body(),
            Self::MessagePush(p) => (*p).into_body(),
        }
    }

    /// Checks the Profile rules for the sender.
    pub fn validate(&self, sender: Side) -> Result<(), PayloadError> {
        match self {
            Self::ChatMessage(m) => validate_chat_message(m, sender),
            Self::MessagePush(p) => validate_message_push(p),
        }
    }

    /// The JSON text stored in [`PendingRecord::payload`].
    pub fn to_json(&self) -> Result<String, StoreError> {
        serde_json::to_string(self).map_err(|e| StoreError::from_source("encode_payload", e))
    }

    /// Reads [`PendingRecord::payload`] back.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}

impl From<ChatMessage> for OutboundPayload {
    fn from(m: ChatMessage) -> Self {
        Self::ChatMessage(m)
    }
}

impl From<MessagePush> for OutboundPayload {
    fn from(p: MessagePush) -> Self {
        Self::MessagePush(Box::new(p))
    }
}

/// One transmission the runtime should perform now: wrap `payload` in a packet with a fresh
/// `packet_id` on `channel`, write it, then call [`Outbox::on_sent`].
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    /// The channel.
    pub channel: ConnectorChannelId,
    /// The business id (unchanged across attempts).
    pub message_id: MessageId,
    /// The payload.
    pub payload: OutboundPayload,
    /// 1 for the first transmission, 2 for the first redelivery, ...
    pub attempt: u32,
    /// When the message expires (Unix ms).
    pub expires_at: u64,
}

impl Delivery {
    /// The packet to write: this delivery's payload on its channel under a fresh `packet_id`
    /// (one per transmission; the `message_id` inside stays the same).
    pub fn to_packet(&self, packet_id: impl Into<PacketId>) -> Packet {
        Packet::new(packet_id, self.payload.to_body()).channel(self.channel.clone())
    }
}

/// Result of [`Outbox::enqueue`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// Now pending.
    Queued {
        /// Expiry (Unix ms).
        expires_at: u64,
        /// A message evicted to make room (only with [`OverflowPolicy::EvictOldest`]).
        evicted: Option<MessageId>,
    },
    /// The same message (same id and identical payload) is already pending; nothing changed.
    AlreadyPending,
}

/// Result of [`Outbox::on_sent`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SentOutcome {
    /// Waiting for `chat.message.ack` until the deadline (Unix ms).
    AwaitingAck {
        /// When [`Outbox::maintain`] will count it as timed out.
        ack_deadline: u64,
    },
    /// An IM v1 push: the write was the delivery boundary; the message left the outbox.
    DeliveredByWrite,
    /// The ack for this packet had already arrived (it overtook `on_sent`) and has now been
    /// applied, with this outcome.
    Acked(AckOutcome),
}

/// What the outbox did with a redelivery decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryOutcome {
    /// Pending again; next transmission not before the given time (Unix ms).
    Scheduled {
        /// Earliest next attempt.
        next_attempt_at: u64,
    },
    /// The TTL had passed: the message expired and will never be delivered.
    Expired,
}

/// Why an ack changed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IgnoredAck {
    /// No pending message with this channel and id (already terminal, expired, or unknown).
    UnknownMessage,
    /// `reply_to` names none of the packets sent for this message.
    ReplyToMismatch,
    /// A retryable rejection of an older transmission while a newer one is outstanding.
    StaleRetryable,
    /// An ack for an IM v1 push, which has no business ack.
    NoAckExpected,
    /// A status this version does not know; the message stays pending.
    UnknownStatus,
}

/// Result of [`Outbox::on_ack`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckOutcome {
    /// `accepted` or `duplicate`: delivered, removed from the outbox.
    Delivered {
        /// The status received.
        status: AckStatus,
    },
    /// `rejected` and not retryable: a failed terminal state, removed, reason kept.
    Failed {
        /// The receiver's code.
        code: ErrorCode,
        /// The kept reason.
        reason: String,
    },
    /// `rejected` with `retryable: true`: pending again.
    Retry(RetryOutcome),
    /// The ack arrived between [`Outbox::next_ready`] and [`Outbox::on_sent`], before the
    /// packet id was known; it is kept and applied by `on_sent` if it names that packet.
    Deferred,
    /// Nothing changed.
    Ignored(IgnoredAck),
}

/// How a message left the outbox successfully.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveredBy {
    /// `accepted`.
    Accepted,
    /// `duplicate`.
    Duplicate,
    /// An IM v1 write.
    Written,
}

/// A fact for logs and metrics, drained with [`Outbox::drain_events`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutboxEvent {
    /// Delivered (terminal).
    Delivered {
        /// Channel.
        channel: ConnectorChannelId,
        /// Message.
        message_id: MessageId,
        /// How.
        by: DeliveredBy,
        /// Transmissions it took.
        attempts: u32,
        /// Milliseconds from taking responsibility for the message to its delivery.
        after_ms: u64,
    },
    /// Rejected without retry (terminal failure).
    Failed {
        /// Channel.
        channel: ConnectorChannelId,
        /// Message.
        message_id: MessageId,
        /// Receiver's code.
        code: ErrorCode,
        /// Kept reason.
        reason: String,
    },
    /// TTL passed before delivery (terminal, code `message_expired`).
    Expired {
        /// Channel.
        channel: ConnectorChannelId,
        /// Message.
        message_id: MessageId,
        /// Transmissions tried.
        attempts: u32,
        /// Its expiry.
        expires_at: u64,
    },
    /// Dropped to make room (terminal, code `capacity_exceeded`).
    Evicted {
        /// Channel.
        channel: ConnectorChannelId,
        /// Message.
        message_id: MessageId,
    },
    /// A new message refused because the channel was full (`capacity_exceeded`).
    CapacityRejected {
        /// Channel.
        channel: ConnectorChannelId,
        /// Refused message.
        message_id: MessageId,
    },
    /// Dropped because the channel was deleted or its stored record was unreadable.
    Discarded {
        /// Channel.
        channel: ConnectorChannelId,
        /// Message.
        message_id: MessageId,
        /// Why.
        reason: String,
    },
    /// A temporary failure; redelivery scheduled.
    Retrying {
        /// Channel.
        channel: ConnectorChannelId,
        /// Message.
        message_id: MessageId,
        /// Earliest next attempt.
        next_attempt_at: u64,
        /// What failed.
        reason: String,
    },
}

/// Counters, per channel and in total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutboxCounters {
    /// Transmissions handed out.
    pub attempts: u64,
    /// Acked `accepted` (or written, for v1).
    pub delivered: u64,
    /// Acked `duplicate`.
    pub duplicates: u64,
    /// Rejected without retry.
    pub failed: u64,
    /// Expired before delivery.
    pub expired: u64,
    /// Evicted for capacity.
    pub evicted: u64,
    /// New messages refused for capacity.
    pub capacity_rejected: u64,
    /// Dropped by channel deletion or unreadable storage.
    pub discarded: u64,
    /// Temporary failures (timeouts, disconnects, retryable rejections, write errors).
    pub retries: u64,
    /// Acks that matched nothing.
    pub ignored_acks: u64,
    /// The most recent failure reason.
    pub last_error: Option<String>,
}

/// Per-channel snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Pending messages (in flight included).
    pub pending: usize,
    /// Whether any of its messages is in flight.
    pub in_flight: bool,
    /// How many of its messages are in flight (at most [`OutboxConfig::window`]).
    pub in_flight_count: usize,
    /// Whether the channel is closed (paused).
    pub closed: bool,
    /// Counters.
    pub counters: OutboxCounters,
}

/// Snapshot of the outbox with its effective policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxStats {
    /// Effective TTL.
    pub ttl_ms: u64,
    /// Effective per-channel capacity.
    pub capacity_per_channel: usize,
    /// Effective cleanup interval.
    pub cleanup_interval_ms: u64,
    /// Pending messages over all channels.
    pub pending: usize,
    /// Messages in flight over all channels.
    pub in_flight: usize,
    /// Totals.
    pub totals: OutboxCounters,
    /// Events dropped because the log was full.
    pub events_dropped: u64,
    /// Per channel.
    pub channels: BTreeMap<ConnectorChannelId, ChannelStats>,
}

#[derive(Clone, Debug, PartialEq)]
enum State {
    Waiting,
    /// Handed out by `next_ready`; `packet_id` is known after `on_sent`.
    InFlight {
        packet_id: Option<PacketId>,
        deadline: u64,
    },
}

#[derive(Clone, Debug)]
struct Entry {
    rec: PendingRecord,
    payload: OutboundPayload,
    state: State,
    packets: VecDeque<PacketId>,
    /// Acks that arrived before `on_sent` named the packet (the write raced the reply).
    early: Vec<(ChatMessageAck, PacketId)>,
}

#[derive(Debug, Default)]
struct Channel {
    queue: VecDeque<Entry>,
    closed: bool,
    counters: OutboxCounters,
}

#[derive(Debug)]
struct EventLog {
    events: VecDeque<OutboxEvent>,
    capacity: usize,
    dropped: u64,
}

impl EventLog {
    fn push(&mut self, event: OutboxEvent) {
        if self.events.len() >= self.capacity.max(1) {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(event);
    }
}

/// Writes through to the store, or collects the write for [`Outbox::take_writes`].
fn persist<S: OutboxStore>(
    store: &mut S,
    writes: &mut Vec<OutboxWrite>,
    mode: WriteMode,
    write: OutboxWrite,
) -> Result<(), StoreError> {
    match mode {
        WriteMode::Through => store.apply(std::slice::from_ref(&write)),
        WriteMode::Deferred => {
            writes.push(write);
            Ok(())
        }
    }
}

/// Changes a record's attempt bookkeeping through `change`, stores that narrow write, and only
/// then updates `record` (a failed write leaves it as it was); the payload is not copied.
fn persist_attempt<S: OutboxStore>(
    store: &mut S,
    writes: &mut Vec<OutboxWrite>,
    mode: WriteMode,
    record: &mut PendingRecord,
    change: impl FnOnce(&mut AttemptUpdate),
) -> Result<(), StoreError> {
    let mut update = AttemptUpdate::of(record);
    change(&mut update);
    persist(store, writes, mode, OutboxWrite::Attempt(update.clone()))?;
    update.apply_to(record);
    Ok(())
}

fn count(ch: &mut OutboxCounters, totals: &mut OutboxCounters, f: impl Fn(&mut OutboxCounters)) {
    f(ch);
    f(totals);
}

/// The sender-side state machine. See the module docs for how a runtime drives it.
#[derive(Debug)]
pub struct Outbox<S: OutboxStore = MemoryStore> {
    config: OutboxConfig,
    store: S,
    channels: BTreeMap<ConnectorChannelId, Channel>,
    next_seq: u64,
    totals: OutboxCounters,
    log: EventLog,
    last_cleanup_at: u64,
    /// Writes collected in [`WriteMode::Deferred`], in order.
    writes: Vec<OutboxWrite>,
    /// Channels [`Outbox::next_ready`] has to look at: something happened to them (a message
    /// queued or ended, a reopen) since it last did.
    dirty: BTreeSet<ConnectorChannelId>,
    /// Channels whose next message waits for a backoff, by the time it is due (an entry may be
    /// stale; looking at a channel once too often is harmless).
    timers: BTreeSet<(u64, ConnectorChannelId)>,
}

impl Outbox<MemoryStore> {
    /// An outbox over a fresh in-memory store.
    pub fn in_memory(config: OutboxConfig, now: u64) -> Self {
        Self {
            config,
            store: MemoryStore::new(),
            channels: BTreeMap::new(),
            next_seq: 1,
            totals: OutboxCounters::default(),
            log: EventLog {
                events: VecDeque::new(),
                capacity: config.event_log_capacity,
                dropped: 0,
            },
            last_cleanup_at: now,
            writes: Vec::new(),
            dirty: BTreeSet::new(),
            timers: BTreeSet::new(),
        }
    }
}

impl<S: OutboxStore> Outbox<S> {
    /// Opens the outbox over a store, loading every pending record (restart). Loaded messages
    /// keep their `first_responsibility_at`, `expires_at`, attempt count and backoff; messages
    /// that were in flight become pending again (the receiver's idempotency turns a repeat into
    /// `duplicate`); messages already past their TTL expire at once and are reported.
    /// Unreadable records are deleted and reported as discarded.
    pub fn open(config: OutboxConfig, mut store: S, now: u64) -> Result<Self, OutboxError> {
        let mut records = store.load_pending()?;
        records.sort_by_key(|r| r.seq);
        let mut outbox = Self {
            config,
            store,
            channels: BTreeMap::new(),
            next_seq: records.last().map_or(1, |r| r.seq.saturating_add(1)),
            totals: OutboxCounters::default(),
            log: EventLog {
                events: VecDeque::new(),
                capacity: config.event_log_capacity,
                dropped: 0,
            },
            last_cleanup_at: now,
            writes: Vec::new(),
            dirty: BTreeSet::new(),
            timers: BTreeSet::new(),
        };
        for rec in records {
            outbox.dirty.insert(rec.channel.clone());
            let ch = outbox.channels.entry(rec.channel.clone()).or_default();
            match OutboundPayload::from_json(&rec.payload) {
                Ok(payload) if payload.message_id() == Some(&rec.message_id) => {
                    ch.queue.push_back(Entry {
                        rec,
                        payload,
                        state: State::Waiting,
                        packets: VecDeque::new(),
                        early: Vec::new(),
                    });
                }
                other => {
                    let reason = match other {
                        Err(e) => format!("stored payload unreadable: {e}"),
                        Ok(_) => "stored payload has another message_id".to_owned(),
                    };
                    persist(
                        &mut outbox.store,
                        &mut outbox.writes,
                        outbox.config.write_mode,
                        OutboxWrite::Delete(rec.channel.clone(), rec.message_id.clone()),
                    )?;
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
        &self.store
    }

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
            persist(
                &mut self.store,
                &mut self.writes,
                self.config.write_mode,
                OutboxWrite::Delete(channel.clone(), victim_id.clone()),
            )?;
            ch.queue.remove(index);
            let reason = format!("capacity_exceeded: evicted {victim_id}");
            count(&mut ch.counters, &mut self.totals, |c| {
                c.evicted += 1;
                c.last_error = Some(reason.clone());
            });
            self.log.push(OutboxEvent::Evicted {
                channel: channel.clone(),
                message_id: victim_id.clone(),
            });
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
        persist(
            &mut self.store,
            &mut self.writes,
            self.config.write_mode,
            OutboxWrite::Save(rec.clone()),
        )?;
        self.next_seq += 1;
        self.dirty.insert(channel.clone());
        ch.queue.push_back(Entry {
            rec,
            payload,
            state: State::Waiting,
            packets: VecDeque::new(),
            early: Vec::new(),
        });
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
        let stored = collected.and_then(|()| match self.config.write_mode {
            WriteMode::Through if !writes.is_empty() => Ok(self.store.apply(&writes)?),
            WriteMode::Through => Ok(()),
            WriteMode::Deferred => {
                self.writes.append(&mut writes);
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
        persist_attempt(
            &mut self.store,
            &mut self.writes,
            self.config.write_mode,
            &mut entry.rec,
            |u| u.attempts = u.attempts.saturating_sub(1),
        )?;
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
        coalesce_outbox_writes(std::mem::take(&mut self.writes))
    }

    /// True when writes wait for [`Outbox::take_writes`].
    pub fn has_writes(&self) -> bool {
        !self.writes.is_empty()
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
            persist(
                &mut self.store,
                &mut self.writes,
                self.config.write_mode,
                OutboxWrite::Delete(channel.clone(), message_id.clone()),
            )?;
            let attempts = entry.rec.attempts;
            let after_ms = now.saturating_sub(entry.rec.first_responsibility_at);
            ch.queue.remove(index);
            self.dirty.insert(channel.clone());
            count(&mut ch.counters, &mut self.totals, |c| c.delivered += 1);
            self.log.push(OutboxEvent::Delivered {
                channel: channel.clone(),
                message_id: message_id.clone(),
                by: DeliveredBy::Written,
                attempts,
                after_ms,
            });
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
                persist(
                    &mut self.store,
                    &mut self.writes,
                    self.config.write_mode,
                    OutboxWrite::Delete(channel.clone(), ack.message_id.clone()),
                )?;
                ch.queue.remove(index);
                self.dirty.insert(channel.clone());
                let by = if ack.status == AckStatus::Accepted {
                    count(&mut ch.counters, &mut self.totals, |c| c.delivered += 1);
                    DeliveredBy::Accepted
                } else {
                    count(&mut ch.counters, &mut self.totals, |c| c.duplicates += 1);
                    DeliveredBy::Duplicate
                };
                self.log.push(OutboxEvent::Delivered {
                    channel: channel.clone(),
                    message_id: ack.message_id.clone(),
                    by,
                    attempts,
                    after_ms,
                });
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
                persist(
                    &mut self.store,
                    &mut self.writes,
                    self.config.write_mode,
                    OutboxWrite::Delete(channel.clone(), ack.message_id.clone()),
                )?;
                ch.queue.remove(index);
                self.dirty.insert(channel.clone());
                count(&mut ch.counters, &mut self.totals, |c| {
                    c.failed += 1;
                    c.last_error = Some(reason.clone());
                });
                self.log.push(OutboxEvent::Failed {
                    channel: channel.clone(),
                    message_id: ack.message_id.clone(),
                    code: code.clone(),
                    reason: reason.clone(),
                });
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
                persist_attempt(
                    &mut self.store,
                    &mut self.writes,
                    self.config.write_mode,
                    &mut entry.rec,
                    |u| u.next_attempt_at = now,
                )?;
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
                    ch.queue.push_back(Entry {
                        rec,
                        payload,
                        state: State::Waiting,
                        packets: VecDeque::new(),
                        early: Vec::new(),
                    });
                    joined += 1;
                }
                _ => {
                    persist(
                        &mut self.store,
                        &mut self.writes,
                        self.config.write_mode,
                        OutboxWrite::Delete(rec.channel.clone(), rec.message_id.clone()),
                    )?;
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
            persist(
                &mut self.store,
                &mut self.writes,
                self.config.write_mode,
                OutboxWrite::Delete(channel.clone(), message_id.clone()),
            )?;
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
    /// [`OutboxConfig::effective_cleanup_interval_ms`].
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

    fn fail_in_flight(
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
    fn retry(
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
        persist_attempt(
            &mut self.store,
            &mut self.writes,
            self.config.write_mode,
            &mut entry.rec,
            |u| {
                u.next_attempt_at = now.saturating_add(backoff.delay_ms(u.attempts));
                u.last_error = Some(reason.clone());
            },
        )?;
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
    fn expire_channel(
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

    /// Expires the channel's message at `index` (the caller checked that it is waiting and
    /// past its TTL): removed, counted, reported.
    fn expire_at(
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
        persist(
            &mut self.store,
            &mut self.writes,
            self.config.write_mode,
            OutboxWrite::Delete(channel.clone(), message_id.clone()),
        )?;
        ch.queue.remove(index);
        count(&mut ch.counters, &mut self.totals, |c| {
            c.expired += 1;
            c.last_error = Some(format!("message_expired: {message_id}"));
        });
        self.log.push(OutboxEvent::Expired {
            channel: channel.clone(),
            message_id: message_id.clone(),
            attempts,
            expires_at,
        });
        self.dirty.insert(channel.clone());
        Ok(message_id)
    }
}
