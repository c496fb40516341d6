//! Persistence seam. The state machines write through these traits before they change their
//! in-memory state, so a crash never loses a message the sender took responsibility for and
//! never forgets a message the receiver already accepted.
//!
//! The records are flat rows keyed by `(channel, message_id)` with plain integer and text
//! columns, so an SQLite backend is one table per trait:
//!
//! ```text
//! CREATE TABLE im_pending (channel TEXT, message_id TEXT, seq INTEGER, payload TEXT,
//!   attempts INTEGER, first_responsibility_at INTEGER, expires_at INTEGER,
//!   next_attempt_at INTEGER, last_error TEXT, PRIMARY KEY (channel, message_id));
//! CREATE TABLE im_completed (channel TEXT, message_id TEXT, fingerprint TEXT,
//!   completed_at INTEGER, PRIMARY KEY (channel, message_id));
//! CREATE INDEX im_completed_age ON im_completed (completed_at);
//! ```
//!
//! `save_*` is an upsert (`INSERT ... ON CONFLICT DO UPDATE`). Methods are synchronous because
//! the machines are sans-I/O and an embedded database call is short.
//!
//! The receiver's completed ids are read back one at a time
//! ([`IdempotencyStore::lookup_completed`], on every id its small in-memory cache does not
//! hold), so a backend should answer that with an indexed point read; its bounds arrive as
//! writes ([`IdempotencyWrite::Trim`] per channel, [`IdempotencyWrite::Expire`] by age).
//!
//! Batching: [`OutboxStore::apply`] takes several writes at once, and a backend makes them one
//! transaction (all or none). The outbox hands every pass over its channels to the store as one
//! batch; with [`crate::WriteMode::Deferred`] it does not touch the store at all when it
//! changes, and the runtime takes the writes ([`crate::Outbox::take_writes`]) to commit them
//! together with other work (group commit), acknowledging nothing before that commit.

mod memory;
mod null;
mod records;
mod traits;

pub use memory::MemoryStore;
pub use null::{DeferredStore, NoStore};
pub use records::*;
pub use traits::{IdempotencyStore, OutboxStore};
