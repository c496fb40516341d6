//! What the outbox hands out and reports: payloads, deliveries, outcomes, events, counters.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use xagent_protocol_types::{
    AckStatus, ChatMessage, ConnectorChannelId, ErrorCode, MessageId, MessagePush, Packet,
    PacketBody, PacketId, Payload, Side,
};

use crate::{PayloadError, StoreError, validate_chat_message, validate_message_push};

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

    /// The JSON text stored in [`PendingRecord::payload`](crate::PendingRecord::payload).
    pub fn to_json(&self) -> Result<String, StoreError> {
        serde_json::to_string(self).map_err(|e| StoreError::from_source("encode_payload", e))
    }

    /// Reads [`PendingRecord::payload`](crate::PendingRecord::payload) back.
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
/// `packet_id` on `channel`, write it, then call [`Outbox::on_sent`](crate::Outbox::on_sent).
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

/// Result of [`Outbox::enqueue`](crate::Outbox::enqueue).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// Now pending.
    Queued {
        /// Expiry (Unix ms).
        expires_at: u64,
        /// A message evicted to make room (only with [`OverflowPolicy::EvictOldest`](crate::OverflowPolicy::EvictOldest)).
        evicted: Option<MessageId>,
    },
    /// The same message (same id and identical payload) is already pending; nothing changed.
    AlreadyPending,
}

/// Result of [`Outbox::on_sent`](crate::Outbox::on_sent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SentOutcome {
    /// Waiting for `chat.message.ack` until the deadline (Unix ms).
    AwaitingAck {
        /// When [`Outbox::maintain`](crate::Outbox::maintain) will count it as timed out.
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

/// Result of [`Outbox::on_ack`](crate::Outbox::on_ack).
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
    /// The ack arrived between [`Outbox::next_ready`](crate::Outbox::next_ready) and [`Outbox::on_sent`](crate::Outbox::on_sent), before the
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

/// A fact for logs and metrics, drained with [`Outbox::drain_events`](crate::Outbox::drain_events).
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
    /// How many of its messages are in flight (at most [`OutboxConfig::window`](crate::OutboxConfig::window)).
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
