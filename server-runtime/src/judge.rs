//! The rules judgement of packets received from xAgent: the validator of
//! `xagent-protocol-validate` (the judge `xagent-connector check packet --sender xagent` and the C
//! ABI apply), run on every packet the sequencing session accepted, so a packet that breaks a
//! rule is refused here exactly as the other judges refuse it, with the same rule ids.

use std::sync::Arc;

use xagent_protocol_types::{ChatMessageAck, ConnectorCard, Packet, PacketBody, Role, Side};
use xagent_protocol_validate::{AdmissionWindow, CardFacts, PacketContext, Report, Validator};

/// Judges packets received from xAgent against this Connector's Card.
#[derive(Clone, Debug)]
pub struct InboundJudge {
    validator: Validator,
    card: Option<Arc<CardFacts>>,
}

impl InboundJudge {
    /// A judge for the Connector with this Card and hello admission window.
    pub fn new(card: &ConnectorCard, window: AdmissionWindow) -> Self {
        Self {
            validator: Validator::new().with_window(window),
            card: Some(Arc::new(CardFacts::from_card(card))),
        }
    }

    /// A judge over the connection core's admitted Card and window (read at every connect),
    /// the one home of those facts.
    pub(crate) fn from_admission(admission: &xagent_connection::Admission) -> Self {
        Self {
            validator: Validator::new().with_window(admission.window()),
            card: admission.facts(),
        }
    }

    fn context(&self) -> PacketContext<'_> {
        PacketContext { card: self.card.as_deref(), sender: Some(Side::Xagent) }
    }

    /// The verdict on one packet as received from xAgent (the text of one frame): the typed
    /// packet, or the report naming every broken rule. What the connection loop applies.
    pub fn judge(&self, text: &str) -> Result<Packet, Report> {
        match Packet::decode_str(text) {
            Ok(packet) => self.judge_decoded(&packet, text).map(|()| packet),
            Err(_) => Err(self.validator.packet_bytes(text.as_bytes(), self.context())),
        }
    }

    /// [`InboundJudge::judge`] on a packet the loop already decoded from `text`.
    pub(crate) fn judge_decoded(&self, packet: &Packet, text: &str) -> Result<(), Report> {
        self.validator.check_decoded(packet, text.as_bytes(), self.context())
    }
}

/// How a refused packet is answered.
pub(crate) enum Refusal {
    /// Send this packet.
    Send(Packet),
    /// Answer the request with its ack carrying this error.
    ErrorAck(xagent_protocol_types::WireError),
}

/// The answer to a packet the judge refused, if it gets one: a `rejected` ack for a
/// `chat.message` (IM v2 §7), the error ack for a request, an `error` packet for anything else
/// except an `error` (never answered, so two peers cannot loop).
pub(crate) fn refusal(packet: &Packet, report: &Report) -> Option<Refusal> {
    let problems: Vec<String> = report.errors().map(ToString::to_string).collect();
    let error = xagent_protocol_types::WireError::new(
        report.error_code(),
        format!("the packet breaks the protocol: {}", problems.join("; ")),
    );
    tracing::debug!(packet_type = packet.type_str(), code = %error.code, "packet breaks a rule");
    match &packet.body {
        PacketBody::Error(_) => None,
        PacketBody::ChatMessage(message) => {
            let ack = ChatMessageAck::rejected(
                message.message_id.clone(),
                error.code.clone(),
                error.message().to_owned(),
                false,
            );
            Some(Refusal::Send(
                Packet::with_payload(crate::ids::packet_id(), ack).answering(packet),
            ))
        }
        _ if matches!(packet.packet_type().spec().map(|s| s.role), Some(Role::Request { .. })) => {
            Some(Refusal::ErrorAck(error))
        }
        _ => Some(Refusal::Send(Packet::error(crate::ids::packet_id(), error).answering(packet))),
    }
}
