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

mod ack;
mod channels;
mod config;
mod send;
mod state;
mod types;

pub use config::*;
pub use state::Outbox;
pub use types::*;
