//! # xagent-connection
//!
//! The connection core of the **xAgent Connector Protocol 3.0**: what a data-plane connection
//! is, written once and run by both sides (`xagent-server-runtime` on the Connector side,
//! `xagent-client-runtime` on the xAgent side). The loops use no WebSocket library: a connection
//! is a `Stream`/`Sink` of [`Frame`]s, so it runs over axum, tungstenite or in-memory channels.
//! The one WebSocket fact here is the client's upgrade request ([`upgrade_request`]).
//!
//! - [`Driver`]: the read loop, generic over the frame stream; the frame rules (size limit
//!   with close 1009, invalid UTF-8 with close 1007, typed [`FrameError`]s); [`judge_received`]
//!   gives both sides one verdict on a decoded packet, in one order (a Profile not in effect is
//!   dropped, then `protocol-validate`'s `Session` decides, then the packet [`Rules`] over the
//!   admitted Card's facts), and [`refusal`] answers a refused packet by its role; the side's
//!   [`PacketHandler`] receives only judged, typed packets.
//! - [`write_loop`] and [`Outbound`]: one bounded writer per connection; every packet passes the
//!   optional [`OutboundJudge`], `Session::on_sent` and the outbound size rule
//!   ([`within_limit`]) before a byte leaves; packets are stamped with the injected clock.
//! - [`Requests`]: the one request/ack correlation, keyed by `request_id`, with timeouts that
//!   make the session forget the request.
//! - [`Admission`]: the one home of the admitted Card's facts, the announced Profiles and the
//!   version window; every connection reads it when it starts.
//!
//! ```
//! use xagent_connection::{Admission, Rules};
//! use xagent_protocol_types::Side;
//! use xagent_protocol_validate::AdmissionWindow;
//!
//! let admission =
//!     Admission::from_parts("im.example".into(), vec!["xagent.im.v2".into()], None, AdmissionWindow::default());
//! let hello = admission.current().hello(None);
//! assert_eq!(hello.supported_profiles.as_deref().map(<[_]>::len), Some(1));
//! let rules = Rules::new(Side::Connector, admission.window());
//! assert!(rules.judge("{}", None).is_err(), "not a packet");
//! ```

mod admission;
mod driver;
mod frame;
mod judge;
mod outbound;
mod upgrade;
mod writer;

pub use admission::{Admission, Admitted};
pub use driver::{
    Driver, Ended, Flow, PacketHandler, Received, judge_received, profile_not_in_effect,
};
pub use frame::{
    CLOSE_GOING_AWAY, CLOSE_INVALID_DATA, CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TOO_BIG, Frame,
    FrameError,
};
pub use judge::{Refusal, Rules, SendRules, broken_rules, error_ack, refusal};
pub use outbound::{Outbound, RequestError, Requests};
pub use upgrade::{UpgradeRequestError, upgrade_request};
pub use writer::{
    OutboundJudge, OutboundRefusal, Outgoing, SendError, WriteTap, WriterOptions, encode_outgoing,
    within_limit, write_loop,
};

/// Locks a mutex, taking the value of a poisoned one (a panicked holder leaves consistent
/// state behind in every lock of this crate: each update is one assignment).
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A fresh `packet_id` for packets the core makes itself (a substituted oversized ack).
pub(crate) fn packet_id() -> xagent_protocol_types::PacketId {
    xagent_protocol_types::PacketId::new(xagent_protocol_types::IdKind::Packet.mint(rand::random()))
}
