//! The frame driver: the read loop both sides run, generic over the stream of frames. It
//! applies the frame rules (size limit with close 1009, invalid UTF-8 with close 1007), decodes
//! each text frame, judges the packet in one order for both sides ([`judge_received`]: a
//! Profile not in effect is dropped, then the sequencing [`Session`], then the packet
//! [`Rules`] on what the session accepted, so every refusal is a paired answer), answers a
//! refused packet by its role ([`refusal`]) and hands the side's [`PacketHandler`] only
//! judged, typed packets.

use std::future::Future;
use std::sync::Mutex;

use futures_util::{Stream, StreamExt};
use xagent_protocol_types::{Packet, PacketBody, RequestId, Role, WireError};
use xagent_protocol_validate::{Accepted, CardFacts, Permission, RejectAction, Rejection, Session};

use crate::judge::{Refusal, Rules, broken_rules, refusal};
use crate::{Admission, CLOSE_INVALID_DATA, CLOSE_POLICY, CLOSE_TOO_BIG, Frame, FrameError};

/// What a handler wants after a packet.
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
    /// The frame rules, a refusal or the handler asked to close with this code and reason; the
    /// caller queues the close frame (after its in-flight work, if it has any).
    Close(u16, String),
}

/// The side-specific half of a connection: what to do with a judged packet, and the side's
/// means to answer (its writer queue) and to fail its own pending requests.
pub trait PacketHandler: Send {
    /// Runs a packet the core accepted (the session's verdict on it alongside).
    fn on_packet(
        &mut self,
        packet: Packet,
        accepted: Accepted,
    ) -> impl Future<Output = Flow> + Send;
    /// Queues a packet the core answers a refused one with, through the connection's writer.
    fn send(&mut self, packet: Packet) -> impl Future<Output = ()> + Send;
    /// A refused answer to this side's request `request_id`: the request fails with `error`.
    fn fail_pending(&mut self, request_id: &RequestId, error: WireError);
    /// Handles a binary frame (not part of the protocol).
    fn on_binary(&mut self) -> impl Future<Output = Flow> + Send;
    /// Sees every text frame read within the size limit, and its packet when it decoded
    /// (traffic taps, metrics). Does nothing by default.
    fn saw(&mut self, text: &str, packet: Option<&Packet>) {
        let _ = (text, packet);
    }
}

/// The read loop of one connection: frames from a stream until it ends, `stop` resolves, or a
/// frame, a refusal or the handler closes. Text frames over `max_packet_bytes` close with
/// 1009, text frames that are not UTF-8 with 1007; pings and pongs are the WebSocket layer's.
/// The side is the session's; the rules judge what its peer sends by the admitted Card.
pub struct Driver<'a> {
    max_packet_bytes: usize,
    session: &'a Mutex<Session>,
    admission: &'a Admission,
    rules: Rules,
}

impl<'a> Driver<'a> {
    /// A driver over `session` (whose side it reads for), judging by `admission`, whose text
    /// frames may be at most `max_packet_bytes` long.
    pub fn new(
        session: &'a Mutex<Session>,
        admission: &'a Admission,
        max_packet_bytes: usize,
    ) -> Self {
        let peer = crate::lock(session).side().peer();
        Self { max_packet_bytes, session, admission, rules: Rules::new(peer, admission.window()) }
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
        H: PacketHandler,
    {
        let mut stop = std::pin::pin!(stop);
        loop {
            let frame = tokio::select! {
                biased;
                () = &mut stop => return Ended::Stopped,
                frame = stream.next() => frame,
            };
            let flow = match frame.map(|f| f.map_err(Into::into)) {
                None => return Ended::PeerClosed(None),
                Some(Err(FrameError::TooLarge)) => too_big(),
                Some(Err(FrameError::InvalidUtf8)) => {
                    Flow::Close(CLOSE_INVALID_DATA, "text frames must be UTF-8".into())
                }
                Some(Err(FrameError::Read(error))) => return Ended::Failed(error),
                Some(Ok(Frame::Text(text))) if text.len() > self.max_packet_bytes => too_big(),
                Some(Ok(Frame::Text(text))) => self.on_text(handler, text).await,
                Some(Ok(Frame::Binary(_))) => handler.on_binary().await,
                Some(Ok(Frame::Close(close))) => return Ended::PeerClosed(close),
                Some(Ok(Frame::Ping(_) | Frame::Pong(_))) => Flow::Continue,
            };
            if let Flow::Close(code, reason) = flow {
                return Ended::Close(code, reason);
            }
        }
    }

    /// One text frame within the size limit: decoded, judged, answered or handed on.
    async fn on_text<H: PacketHandler>(&self, handler: &mut H, text: String) -> Flow {
        let packet = match Packet::decode_str(&text) {
            Ok(packet) => packet,
            Err(error) => {
                handler.saw(&text, None);
                tracing::debug!(%error, "a frame that is not a packet");
                let rejection = Rejection::from_decode(&error);
                if let Some(request_id) = &error.ids.request_id {
                    handler.fail_pending(request_id, rejection.error.clone());
                }
                handler.send(rejection.error_packet_for(crate::packet_id(), &error.ids)).await;
                return Flow::Continue;
            }
        };
        handler.saw(&text, Some(&packet));
        let facts = self.admission.facts();
        match judge_received(self.session, &packet, &text, &self.rules, facts.as_deref()) {
            Received::Accepted(accepted) => {
                drop(text);
                handler.on_packet(packet, accepted).await
            }
            Received::NotInEffect { .. } => Flow::Continue,
            Received::Invalid(error) => {
                match refusal(&packet, error) {
                    Refusal::FailPending(request_id, error) => {
                        handler.fail_pending(&request_id, error);
                    }
                    Refusal::Answer(answer) => handler.send(answer).await,
                    Refusal::Drop => {}
                }
                Flow::Continue
            }
            Received::Refused { rejection, error } => {
                refused(handler, &packet, rejection, error).await
            }
        }
    }
}

fn too_big() -> Flow {
    Flow::Close(CLOSE_TOO_BIG, "packet larger than the size limit".into())
}

/// A packet the session refused: a refused answer fails its request, then the session's action
/// says whether to answer, ignore or answer and close.
async fn refused<H: PacketHandler>(
    handler: &mut H,
    packet: &Packet,
    rejection: Rejection,
    error: WireError,
) -> Flow {
    tracing::debug!(packet_type = packet.type_str(), code = %rejection.error.code, "packet refused");
    let answers = matches!(packet.packet_type().spec().map(|s| s.role), Some(Role::Ack { .. }))
        || matches!(packet.body, PacketBody::Error(_));
    if answers && let Some(request_id) = &packet.request_id {
        handler.fail_pending(request_id, error.clone());
    }
    match rejection.action {
        RejectAction::Ignore => Flow::Continue,
        RejectAction::ReplyAndClose => {
            handler.send(rejection.error_packet(crate::packet_id(), packet)).await;
            Flow::Close(CLOSE_POLICY, error.message().to_owned())
        }
        _ => {
            handler.send(rejection.error_packet(crate::packet_id(), packet)).await;
            Flow::Continue
        }
    }
}

/// The verdict on a packet read from the peer.
#[derive(Debug)]
pub enum Received {
    /// The session accepted it and the rules passed it: run it.
    Accepted(Accepted),
    /// It belongs to a Profile that was not negotiated or that its channel does not enable:
    /// dropped without an answer, the same way on both sides.
    NotInEffect {
        /// The Profile.
        profile: &'static str,
    },
    /// The session accepted it (so its answer pairs) and the packet rules refused it, with
    /// this error naming every broken rule; answered by its role ([`refusal`]).
    Invalid(WireError),
    /// The session refused it; its action says whether to answer, ignore or close. `error`
    /// names the broken rules when the packet rules refuse it too (the session's error
    /// otherwise): what a failed request and a close report.
    Refused {
        /// The session's refusal.
        rejection: Rejection,
        /// The error reported locally.
        error: WireError,
    },
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

/// The verdict on a decoded packet (`text` is its JSON), in one order for both sides: a Profile
/// not in effect is dropped, then the session decides, then `rules` judge what it accepted
/// against `facts`. A `connector.hello` is judged by the session's hello rules alone (its
/// negotiation answers it).
pub fn judge_received(
    session: &Mutex<Session>,
    packet: &Packet,
    text: &str,
    rules: &Rules,
    facts: Option<&CardFacts>,
) -> Received {
    let verdict = {
        let mut session = crate::lock(session);
        if let Some(profile) = profile_not_in_effect(&session, packet) {
            return Received::NotInEffect { profile };
        }
        session.on_received(packet)
    };
    let hello = matches!(packet.body, PacketBody::ConnectorHello(_));
    let broken = || {
        let report = (!hello).then(|| rules.check(packet, text, facts).err()).flatten()?;
        let refuses = report.errors().next().is_some();
        refuses.then_some(report)
    };
    match verdict {
        Ok(accepted) => match broken() {
            None => Received::Accepted(accepted),
            Some(report) => Received::Invalid(broken_rules(&report)),
        },
        Err(rejection) => {
            let error = broken().map_or_else(|| rejection.error.clone(), |r| broken_rules(&r));
            Received::Refused { rejection, error }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use xagent_protocol_types::{
        BuildInfo, ChatMessage, ConnectorCard, ConnectorHello, ConnectorHelloAck, ConnectorInfo,
        MessagePush, PROFILE_IM_V1, PROFILE_IM_V2, RequestId, Side, Supports, TargetType,
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

    /// The core's verdict on `packet` as the peer would send it.
    fn judge(session: &Mutex<Session>, packet: &Packet, rules: &Rules) -> Received {
        let text = serde_json::to_string(packet).expect("a packet encodes");
        judge_received(session, packet, &text, rules, None)
    }

    #[test]
    fn profile_rule_a_packet_of_a_profile_not_negotiated_is_dropped_on_both_sides() {
        // The Connector offers IM v1 and v2; this xAgent takes IM v1 only: IM v2 is not in effect
        // on the Connector side.
        let connector = Admission::for_card(card(), AdmissionWindow::default());
        let connector = Mutex::new(connector.current().session(Side::Connector));
        let rules = Rules::new(Side::Xagent, AdmissionWindow::default());
        let (hello, ack) = handshake(&[PROFILE_IM_V1]);
        let verdict = judge(&connector, &hello, &rules);
        assert!(matches!(verdict, Received::Accepted(_)), "{verdict:?}");
        crate::lock(&connector).on_sent(&ack).expect("the ack goes out");
        let message =
            Packet::with_payload("pkt_m", ChatMessage::text("m_1", "hi")).channel("cch_1");
        let verdict = judge(&connector, &message, &rules);
        assert!(
            matches!(verdict, Received::NotInEffect { profile } if profile == PROFILE_IM_V2),
            "{verdict:?}"
        );

        // The other way round: an xAgent that took IM v2 only drops a pushed IM v1 message.
        let xagent = Admission::from_parts(
            "im.both".into(),
            vec![PROFILE_IM_V2.into()],
            None,
            AdmissionWindow::default(),
        );
        let xagent = Mutex::new(xagent.current().session(Side::Xagent));
        let rules = Rules::new(Side::Connector, AdmissionWindow::default());
        let (hello, ack) = handshake(&[PROFILE_IM_V2]);
        crate::lock(&xagent).on_sent(&hello).expect("hello goes out");
        let verdict = judge(&xagent, &ack, &rules);
        assert!(matches!(verdict, Received::Accepted(_)), "{verdict:?}");
        let push = Packet::with_payload("pkt_p", MessagePush::default()).channel("cch_1");
        let verdict = judge(&xagent, &push, &rules);
        assert!(
            matches!(verdict, Received::NotInEffect { profile } if profile == PROFILE_IM_V1),
            "{verdict:?}"
        );
    }
}
