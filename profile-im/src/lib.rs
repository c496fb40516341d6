//! # xagent-profile-im
//!
//! The IM Profiles' (v1 and v2) delivery guarantees as sans-I/O state machines. No sockets,
//! no async runtime, no sleeping: every call takes the current time (Unix ms, from an injected
//! [`xagent_protocol_types::Clock`]) and returns what the caller must do. Both ends use it:
//! a Connector runtime for inbound target messages, the xAgent side for assistant messages.

mod activity;
mod delta;
mod error;
mod idempotency;
mod outbox;
mod payload;
pub mod store;
mod v1;

pub use activity::*;
pub use delta::*;
pub use error::*;
pub use idempotency::*;
pub use outbox::*;
pub use payload::*;
pub use store::{
    CompletedRecord, IdempotencyStore, MemoryStore, NoStore, OutboxStore, PendingRecord,
};
pub use v1::*;
