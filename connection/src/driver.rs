//! The frame driver: the read loop both sides run, generic over the stream of frames and over
//! the side (the shape of an RPC connection parameterised by its local and remote ends). It
//! applies the frame rules (size limit with close 1009, invalid UTF-8 with close 1007), hands
//! each text frame to the side's [`FrameHandler`], and [`judge_received`] gives every side the
//! same verdict on a decoded packet: a Profile not in effect is dropped, then the sequencing
//! [`Session`] decides.

use std::future::Future;
use std::marker::PhantomData;

use futures_util::{Stream, StreamExt};
use xagent_protocol_types::{Packet, Side};
use xagent_protocol_validate::{Accepted, Permission, Rejection, Session};

use crate::{CLOSE_INVALID_DATA, CLOSE_TOO_BIG, Frame, FrameError};

/// One end of the data plane, as a type: the driver and the judge are written once and
/// instantiated for each side.
pub trait Endpoint: Send + Sync + 'static {
    /// This end.
    const LOCAL: Side;
    /// The end packets are read from.
    const REMOTE: Side;
}

/// The Connector's end.
#[derive(Debug, Clone, Copy)]
pub enum ConnectorEnd {}

/// The xAgent's end.
#[derive(Debug, Clone, Copy)]
pub enum XagentEnd {}

impl Endpoint for ConnectorEnd {
    const LOCAL: Side = Side::Connector;
    const REMOTE: Side = Side::Xagent;
}

impl Endpoint for XagentEnd {
    const LOCAL: Side = Side::Xagent;
    const REMOTE: Side = Side::Connector;
}

/// What a handler wants after a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flow {
    /// Keep reading.
    Continue,
    /// Close the connection with this code and reason.
    Close(u16, String),
}

/// How a read loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The peer sent a close frame (its code and reason, if any) or the stream ended (`None`).
    PeerClosed(Option<(u16, String)>),
    /// Reading failed (the socket broke).
    Failed(String),
    /// The stop signal fired.
    Stopped,
    /// The frame rules or the handler asked to close with this code and reason; the caller
    /// queues the close frame (after its in-flight work, if it has any).
    Close(u16, String),
}

/// The side-specific half of a connection: what to do with a text frame within the size limit.
pub trait FrameHandler: Send {
    /// Handles one text frame (one JSON packet, not yet decoded).
    fn on_text(&mut self, text: String) -> impl Future<Output = Flow> + Send;
    /// Handles a binary frame (not part of the protocol).
    fn on_binary(&mut self) -> impl Future<Output = Flow> + Send;
}

/// The read loop of one connection of `E`: frames from `stream` until it ends, `stop`
/// resolves, or a frame or the handler closes. Text frames over `max_packet_bytes` close with
/// 1009, text frames that are not UTF-8 with 1007; pings and pongs are the WebSocket layer's.
pub struct Driver<E: Endpoint> {
    max_packet_bytes: usize,
    end: PhantomData<E>,
}

impl<E: Endpoint> Driver<E> {
    /// A driver whose text frames may be at most `max_packet_bytes` long.
    pub fn new(max_packet_bytes: usize) -> Self {
        Self { max_packet_bytes, end: PhantomData }
    }

    /// The side this driver reads for.
    pub fn side(&self) -> Side {
        E::LOCAL
    }

    /// Runs the loop; see [`Driver`].
    pub async fn run<St, Er, H>(
        &self,
        stream: &mut St,
        handler: &mut H,
        stop: impl Future<Output = ()>,
    ) -> Ended
    where
        St: Stream<Item = Result<Frame, Er>> + Unpin,
        Er: Into<FrameError>,
        H: FrameHandler,
    {
        let mut stop = std::pin::pin!(stop);
        loop {
            let frame = tokio::select! {
                biased;
                () = &mut stop => return Ended::Stopped,
                frame = stream.next() => frame,
            };
            let flow = match frame {
                None => return Ended::PeerClosed(None),
                Some(Err(error)) => {
                    let error: FrameError = error.into();
                    if error.too_large {
                        Flow::Close(CLOSE_TOO_BIG, "packet larger than the size limit".into())
                    } else if error.invalid_utf8 {
                        Flow::Close(CLOSE_INVALID_DATA, "text frames must be UTF-8".into())
                    } else {
                        return Ended::Failed(error.message);
                    }
                }
                Some(Ok(Frame::Text(text))) if text.len() > self.max_packet_bytes => {
                    Flow::Close(CLOSE_TOO_BIG, "packet larger than the size limit".into())
                }
                Some(Ok(Frame::Text(text))) => handler.on_text(text).await,
                Some(Ok(Frame::Binary(_))) => handler.on_binary().await,
                Some(Ok(Frame::Close(close))) => return Ended::PeerClosed(close),
                Some(Ok(Frame::Ping(_) | Frame::Pong(_))) => Flow::Continue,
            };
            if let Flow::Close(code, reason) = flow {
                return Ended::Close(code, reason);
            }
        }
    }
}

/// The verdict on a packet read from the peer.
#[derive(Debug)]
pub enum Received {
    /// The session accepted it: run it.
    Accepted(Accepted),
    /// It belongs to a Profile that was not negotiated or that its channel does not enable:
    /// dropped without an answer, the same way on both sides.
    NotInEffect {
        /// The Profile.
        profile: &'static str,
    },
    /// The side's packet rules refused it (their report, rule ids first); the session never
    /// saw it.
    Invalid(String),
    /// The session refused it; its action says whether to answer, ignore or close.
    Refused(Rejection),
}

/// Whether a packet read on a connection belongs to a Profile not in effect (not
/// negotiated, or not enabled on its channel), and which. The one place that decides it.
pub fn profile_not_in_effect(session: &Session, packet: &Packet) -> Option<&'static str> {
    let negotiated = session.negotiated()?;
    let channel = packet.connector_channel_id.as_ref().and_then(|c| session.channel_profiles(c));
    match negotiated.decide(packet.type_str(), session.side().peer(), channel) {
        Permission::ProfileNotNegotiated { profile }
        | Permission::ProfileNotOnChannel { profile } => {
            tracing::debug!(
                packet_type = packet.type_str(),
                profile,
                "dropped a packet of a Profile not in effect"
            );
            Some(profile)
        }
        _ => None,
    }
}

/// The verdict on a decoded packet, under one hold of the session: a Profile not in effect is
/// dropped first, then `rules` (the side's packet rules, `None` when the packet passes) and the
/// session decide. The Connector side passes no rules of its own (its handlers judge payloads).
pub fn judge_received(
    session: &std::sync::Mutex<Session>,
    packet: &Packet,
    rules: impl FnOnce(&Packet) -> Option<String>,
) -> Received {
    let mut session = crate::lock(session);
    if let Some(profile) = profile_not_in_effect(&session, packet) {
        return Received::NotInEffect { profile };
    }
    if let Some(problems) = rules(packet) {
        return Received::Invalid(problems);
    }
    match session.on_received(packet) {
        Ok(accepted) => Received::Accepted(accepted),
        Err(rejection) => Received::Refused(rejection),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use xagent_protocol_types::{
        BuildInfo, ChatMessage, ConnectorCard, ConnectorHello, ConnectorHelloAck, ConnectorInfo,
        MessagePush, PROFILE_IM_V1, PROFILE_IM_V2, RequestId, Supports, TargetType,
    };
    use xagent_protocol_validate::AdmissionWindow;

    use super::*;
    use crate::Admission;

    fn card() -> ConnectorCard {
        ConnectorCard::new(
            "im.both",
            BuildInfo::new("1"),
            ConnectorInfo::new("Both", "1.0.0"),
            Supports::new(vec![TargetType::Im], vec![PROFILE_IM_V1.into(), PROFILE_IM_V2.into()]),
        )
    }

    /// A hello for `profiles` and its ack, as the two sides see them.
    fn handshake(profiles: &[&str]) -> (Packet, Packet) {
        let hello = ConnectorHello::new("im.both", profiles.iter().map(|p| (*p).into()).collect());
        let hello = Packet::with_payload("pkt_h", hello).request_id(RequestId::from("req_h"));
        let ack = Packet::with_payload("pkt_a", ConnectorHelloAck::new("im.both", "conn_1"))
            .answering(&hello);
        (hello, ack)
    }

    #[test]
    fn profile_rule_a_packet_of_a_profile_not_negotiated_is_dropped_on_both_sides() {
        // The Connector offers IM v1 and v2; this xAgent takes IM v1 only: IM v2 is not in effect
        // on the Connector side.
        let connector = Admission::for_card(card(), AdmissionWindow::default());
        let connector = Mutex::new(connector.current().session(Side::Connector));
        let (hello, ack) = handshake(&[PROFILE_IM_V1]);
        assert!(matches!(judge_received(&connector, &hello, |_| None), Received::Accepted(_)));
        crate::lock(&connector).on_sent(&ack).expect("the ack goes out");
        let message =
            Packet::with_payload("pkt_m", ChatMessage::text("m_1", "hi")).channel("cch_1");
        let mut rules_ran = false;
        let verdict = judge_received(&connector, &message, |_| {
            rules_ran = true;
            Some("must not be asked".into())
        });
        assert!(
            matches!(verdict, Received::NotInEffect { profile } if profile == PROFILE_IM_V2),
            "{verdict:?}"
        );
        assert!(!rules_ran, "a packet not in effect is dropped before any packet rule");

        // The other way round: an xAgent that took IM v2 only drops a pushed IM v1 message.
        let xagent = Admission::from_parts(
            "im.both".into(),
            vec![PROFILE_IM_V2.into()],
            None,
            AdmissionWindow::default(),
        );
        let xagent = Mutex::new(xagent.current().session(Side::Xagent));
        let (hello, ack) = handshake(&[PROFILE_IM_V2]);
        crate::lock(&xagent).on_sent(&hello).expect("hello goes out");
        assert!(matches!(judge_received(&xagent, &ack, |_| None), Received::Accepted(_)));
        let push = Packet::with_payload("pkt_p", MessagePush::default()).channel("cch_1");
        let verdict = judge_received(&xagent, &push, |_| Some("must not be asked".into()));
        assert!(
            matches!(verdict, Received::NotInEffect { profile } if profile == PROFILE_IM_V1),
            "{verdict:?}"
        );
    }
}
