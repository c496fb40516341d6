//! # xagent-profile-im
//!
//! The IM Profiles' (v1 and v2) delivery guarantees as sans-I/O state machines, one layer above
//! `xagent-protocol-types`. No sockets, no async runtime, no sleeping: every call takes the
//! current time (Unix ms, read by the caller from an injected
//! [`Clock`](xagent_protocol_types::Clock)) and returns what the caller must do. Both ends of
//! the wire use it: a Connector runtime for inbound target messages and for assistant output,
//! the xAgent side for assistant messages it sends.
//!
//! | piece | side | promise |
//! |---|---|---|
//! | [`Outbox`] | sender | a complete message stays pending until `accepted`/`duplicate`, is redelivered with the same `message_id`, expires honestly |
//! | [`ReceiverIdempotency`] | receiver | a repeat is `duplicate` without side effects, a reused id with other content is `message_conflict` |
//! | [`DeltaAssembler`] | Connector | deltas never append twice; gaps and conflicting replays are `sequence_conflict` |
//! | [`ActivityTracker`] | Connector | snapshots replace each other, are cleared in time, degrade per target |
//! | [`MessagePushBuilder`] | Connector (v1) | a `message.push` with the standard fields and layout |
//! | [`ReplyRefKey`] | Connector | an opaque `reply_ref`, valid only for its channel and reply Tool, that shows the model no target id |
//! | [`validate_chat_message`], [`validate_activity`], [`ChatMessageBuilder`] | both | payload rules before anything is sent |
//!
//! ```
//! use xagent_profile_im::{AckOutcome, Outbox, OutboxConfig};
//! use xagent_protocol_types::{
//!     AckStatus, ChatMessage, ChatMessageAck, Clock, ConnectorChannelId, ManualClock, PacketId,
//!     Side,
//! };
//!
//! let clock = ManualClock::new(1_790_000_000_000);
//! let mut outbox = Outbox::in_memory(OutboxConfig::new(Side::Connector), clock.now_millis());
//! let channel = ConnectorChannelId::new("cch_1");
//! outbox.enqueue(&channel, ChatMessage::text("msg_1", "hello"), clock.now_millis())?;
//!
//! // The runtime sends what is ready, then reports the write and the ack.
//! for delivery in outbox.next_ready(clock.now_millis())? {
//!     let packet_id = PacketId::new("pkt_1"); // a fresh id per transmission
//!     outbox.on_sent(&delivery.channel, &delivery.message_id, packet_id.clone(), clock.now_millis())?;
//!     let ack = ChatMessageAck::accepted(delivery.message_id.clone());
//!     let outcome = outbox.on_ack(&delivery.channel, &ack, &packet_id, clock.now_millis())?;
//!     assert_eq!(outcome, AckOutcome::Delivered { status: AckStatus::Accepted });
//! }
//! assert_eq!(outbox.stats().pending, 0);
//! # Ok::<(), xagent_profile_im::OutboxError>(())
//! ```
//!
//! ## Effective defaults (all configurable)
//!
//! | setting | default | where |
//! |---|---|---|
//! | pending-message TTL | 1 h from first responsibility (enqueue); never extended by retries, restarts or reopening | [`OutboxConfig::ttl_ms`] |
//! | pending capacity | 1,000 messages per channel (in flight included) | [`OutboxConfig::capacity_per_channel`] |
//! | overflow policy | reject the new message with `capacity_exceeded` (backpressure); `EvictOldest` drops the oldest message not in flight and records it | [`OverflowPolicy`] |
//! | cleanup interval | 60 s, and never more than TTL/2; expiry is also checked at startup, enqueue and every send | [`OutboxConfig::effective_cleanup_interval_ms`] |
//! | backoff | 1 s, 2 s, 4 s, 8 s, 16 s, 32 s, then 60 s; no jitter; bounded by the TTL, not by a count | [`Backoff`] |
//! | ack timeout | 30 s after the write | [`OutboxConfig::ack_timeout_ms`] |
//! | idempotency set | 10,000 completed ids per channel in the store, forgotten after 24 h (longer than any sender's 1 h TTL plus backoff; expired in the store once a minute); in memory only 4,096 recent ids over all channels, plus uncommitted completions; unfinished admissions forgotten after 10 min | [`IdempotencyConfig`] |
//! | delta state | 10 min after the last delta; 32 unfinished messages per channel; 1 MiB of text per message; the 4,096 most recently finished ids over all channels remembered (as hashes) to ignore late deltas | [`DeltaConfig`] |
//! | delta strategy | buffer until the final (works on every target); `StreamEdit` for targets that can edit a message | [`DeltaStrategy`] |
//! | activity timeout | 2 min without a new snapshot; typing-only targets by default | [`ActivityConfig`] |
//!
//! ## Decisions where the Profiles are silent
//!
//! - **Overflow** rejects the new message by default: the caller still owns it and can apply
//!   backpressure to the target system; eviction is available and is recorded as
//!   `capacity_exceeded`, never as delivery.
//! - **Ack matching**: an ack must name one of the (last 16) `packet_id`s sent for the message
//!   in `reply_to`. `accepted`/`duplicate` from an older transmission still ends the message (it
//!   is a fact about the `message_id`); a retryable rejection of an older transmission is
//!   ignored. After a restart the old `packet_id`s are unknown, so the message is simply
//!   redelivered and the receiver answers `duplicate`.
//! - **`rejected` without `retryable`** is treated as not retryable: the sender must not repeat a
//!   request the receiver may have refused for good. An unknown ack status changes nothing.
//! - **In flight at expiry**: a message already written before its TTL ran out waits for its
//!   ack; if it times out (or the transport drops) after the TTL, it expires and is never
//!   written again. Nothing is handed out at or after `expires_at`.
//! - **Channel reopened**: the head is due at once (the closure was not the receiver's
//!   refusal); expiry times are untouched. A permanently deleted channel discards its pending
//!   messages as `discarded`, never as delivered.
//! - **IM v1** has no business ack: a successful write of `message.push` is the delivery
//!   boundary ([`SentOutcome::DeliveredByWrite`]); see [`MessagePushBuilder`].
//! - **Content fingerprint** of a message: its complete text and ordered file list by type,
//!   `file_ref`, name, MIME type and size; `download_url` and `expires_at` are left out so a
//!   re-signed URL on redelivery is the same message.
//! - **In-progress repeats**: a repeat that arrives while the first copy is still being
//!   processed is answered `rejected` / `channel_busy` / `retryable: true`, so the sender retries
//!   and then gets `duplicate`.
//! - **Deltas**: sequence 0 is a gap (`sequence_conflict`); a new message beyond the per-channel
//!   limit is refused with `capacity_exceeded` rather than evicting a stream in progress (its
//!   final still works); deltas after the final (or after expiry) are ignored; a streamed
//!   message whose state expired keeps its target handle so a late final edits it instead of
//!   posting the text twice.
//! - **Storage** is written before memory changes (a failed write changes nothing), except
//!   [`ReceiverIdempotency::complete`], which remembers the id in memory even when the store
//!   fails because the side effect already happened.

mod activity;
mod delta;
mod error;
mod fifo;
mod idempotency;
mod outbox;
mod payload;
mod reply_ref;
pub mod store;
mod v1;

pub use activity::*;
pub use delta::*;
pub use error::*;
pub use idempotency::*;
pub use outbox::*;
pub use payload::*;
pub use reply_ref::*;
pub use store::{
    AttemptUpdate, CompletedRecord, DeferredStore, IdempotencyStore, IdempotencyWrite, MemoryStore,
    NoStore, OutboxStore, OutboxWrite, PendingRecord, coalesce_outbox_writes,
};
pub use v1::*;
