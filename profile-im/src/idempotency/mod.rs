//! The receiver's idempotency set: which `message_id`s of a channel have already been
//! processed, so a redelivery returns `duplicate` without a second side effect and a reused id
//! with different content is refused with `message_conflict`.
//!
//! Two-phase: [`ReceiverIdempotency::begin`] admits a message and hands out a [`Ticket`]; the
//! caller performs the target-side effect (post to the IM, hand to the Brain) and only then
//! calls [`ReceiverIdempotency::complete`], which records the id durably and returns the
//! `accepted` ack. A failed effect is reported with [`ReceiverIdempotency::abandon`], which
//! records nothing, so a retryable redelivery is processed again.
//!
//! Memory: the store ([`IdempotencyStore`]) is the authority for completed ids. In memory are
//! only the admissions in progress (few), the completions whose write is not committed yet
//! (a redelivery must find them before the store does), and a small cache of recent ids
//! ([`IdempotencyConfig::cache_capacity`], over all channels). An id the cache does not hold
//! is looked up in the store (an indexed point read in the SQLite stores). The bounds are
//! applied in the store: every `capacity_per_channel / 16` completions of a channel add a
//! [`IdempotencyWrite::Trim`] to the channel's newest `capacity_per_channel` ids (so a channel
//! holds at most 1/16 more between trims), and [`ReceiverIdempotency::prune`] adds an
//! [`IdempotencyWrite::Expire`] of the ids past `max_age_ms` at most once per
//! `expire_interval_ms`. Memory therefore stays flat however many messages arrive.

mod complete;
mod config;
mod state;

pub use config::*;
pub use state::{Admission, IdempotencyStats, ReceiverIdempotency, Ticket};
