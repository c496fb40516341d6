//! The data-plane client: the xAgent side's frame driver.
//!
//! It mirrors `server-runtime`'s loop: a [`crate::Transport`] yields one `Stream`/`Sink` of
//! [`crate::Frame`]s per connection; `protocol-validate`'s `Session` (xAgent side) judges
//! every packet read and every packet about to be written; requests of every type go through
//! one request/ack path keyed by `request_id`; writes go through one bounded queue and a writer
//! task that holds no lock while it writes; events reach the application through a bounded
//! channel. Nothing but `connector.hello` leaves before `connector.hello.ack`, and nothing
//! channel-scoped before that channel's `channel.open.ack` on the current connection (the
//! session withholds it). Reconnecting never stops: the delay grows to a cap and the state says
//! what is going on ([`ConnectionState`]).
//!
//! The modules: `config` (how to reach a Connector), `events` (what the application observes),
//! `inbound` (an inbound message and its verdict), `shared` (the state a data plane shares),
//! `plane` (the [`DataPlane`] handle), `request` (the request/ack path), `frames` (reader,
//! writer, dispatch) and `reconnect` (the driver).

mod config;
mod events;
mod frames;
mod inbound;
mod plane;
mod reconnect;
mod request;
mod shared;

pub use config::{ClientConfig, PacketTap, TapDirection};
pub use events::{ClientEvent, ConnectionState, EventSource, Events, next_event_matching};
pub use inbound::{InboundMessage, Verdict};
pub use plane::DataPlane;
pub(crate) use request::{request_typed, send_on};
pub(crate) use shared::{Shared, emit, lock};
