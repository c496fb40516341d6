//! The data plane's state and handle, below the IM and Tool layers that use them: how to reach
//! a Connector (`config`), what the application observes (`events`), an inbound message and
//! its verdict (`inbound`), the state a data plane shares (`shared`), the [`DataPlane`] handle
//! (`plane`) and the one request/ack path on the connection core (`request`); the packet rules
//! of both directions are the core's. The driver that runs a connection (reader, reconnect loop,
//! dispatch to the IM and Tool layers) is `crate::driver`, above them.
//!
//! Nothing but `connector.hello` leaves before `connector.hello.ack`, and nothing
//! channel-scoped before that channel's `channel.open.ack` on the current connection (the
//! session withholds it). Reconnecting never stops: the delay grows to a cap and the state says
//! what is going on ([`ConnectionState`]).
mod config;
mod events;
mod inbound;
mod plane;
mod request;
mod shared;

pub use config::{ClientConfig, DEFAULT_WRITE_QUEUE, PacketTap, TapDirection};
pub use events::{ClientEvent, ConnectionState, Events, next_event_matching};
pub use inbound::{InboundMessage, Verdict};
pub use plane::DataPlane;
pub(crate) use request::{request_on, request_typed, send_on, send_quietly};
pub(crate) use shared::{Shared, emit, fail_pending, lock};
