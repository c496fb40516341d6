//! The one judgement of a packet, for both sides: `protocol-validate`'s validator over the
//! Admission's facts, and the answer to a refused packet chosen by its role in the packet
//! table.

use std::sync::Arc;

use xagent_protocol_types::{ChatMessageAck, Packet, PacketBody, RequestId, Role, Side, WireError};
use xagent_protocol_validate::{AdmissionWindow, CardFacts, PacketContext, Report, Validator};

use crate::{Admission, OutboundJudge, OutboundRefusal};

/// The packet rules one end applies to what its peer sent (and, on the xAgent side, to what it
/// is about to send): the validator that `check packet` and the C ABI run, with the admitted
/// window and Card facts.
#[derive(Clone, Debug)]
pub struct Rules {
    validator: Validator,
    sender: Side,
}

impl Rules {
    /// The rules for packets sent by `sender`, admitting versions of `window`.
    pub fn new(sender: Side, window: AdmissionWindow) -> Self {
        Self { validator: Validator::new().with_window(window), sender }
    }

    /// Judges a decoded packet (`text` is its JSON) against `facts`; the report names every
    /// broken rule. The hot-path verdict runs on the typed packet; only a refused packet is
    /// parsed again for its report.
    pub fn check(
        &self,
        packet: &Packet,
        text: &str,
        facts: Option<&CardFacts>,
    ) -> Result<(), Report> {
        let context = PacketContext { card: facts, sender: Some(self.sender) };
        self.validator.check_decoded(packet, text.as_bytes(), context)
    }

    /// Judges the text of one frame: the typed packet, or the report naming every broken rule
    /// (a text that does not decode gets the report form's report).
    pub fn judge(&self, text: &str, facts: Option<&CardFacts>) -> Result<Packet, Report> {
        match Packet::decode_str(text) {
            Ok(packet) => self.check(&packet, text, facts).map(|()| packet),
            Err(_) => {
                let context = PacketContext { card: facts, sender: Some(self.sender) };
                Err(self.validator.packet_bytes(text.as_bytes(), context))
            }
        }
    }
}

/// The wire error of a packet the rules refused: the report's code, every violation named.
pub fn broken_rules(report: &Report) -> WireError {
    let problems: Vec<String> = report.errors().map(ToString::to_string).collect();
    WireError::new(
        report.error_code(),
        format!("the packet breaks the protocol: {}", problems.join("; ")),
    )
}

/// The send rules the writer runs before a packet leaves: the receive rules of the peer, with
/// the Card admitted when the packet is written, so a packet the peer would refuse never goes
/// out.
pub struct SendRules {
    rules: Rules,
    admission: Arc<Admission>,
}

impl SendRules {
    /// Send rules for packets `sender` writes, judged by `admission`.
    pub fn new(sender: Side, admission: Arc<Admission>) -> Self {
        Self { rules: Rules::new(sender, admission.window()), admission }
    }
}

impl OutboundJudge for SendRules {
    fn judge(&self, packet: &Packet, text: &str) -> Result<(), OutboundRefusal> {
        let Err(report) = self.rules.check(packet, text, self.admission.facts().as_deref()) else {
            return Ok(());
        };
        let errors: Vec<_> = report.errors().collect();
        if errors.is_empty() {
            return Ok(());
        }
        Err(OutboundRefusal {
            rules: errors.iter().map(|v| v.rule.clone()).collect(),
            message: errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
        })
    }
}

/// How a packet that the rules refused is answered, by its role in the packet table.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// An answer (an ack, or an `error` naming a request) to one of this side's requests: the
    /// request fails with this error and nothing is sent.
    FailPending(RequestId, WireError),
    /// Send this packet: a request's error ack, a `chat.message`'s `rejected` ack, or an
    /// `error` naming the packet.
    Answer(Packet),
    /// Dropped without an answer: an `error` packet (so two peers cannot loop) or a pushed
    /// Descriptor.
    Drop,
}

/// The answer to `packet`, refused with `error` (see [`Refusal`]).
pub fn refusal(packet: &Packet, error: WireError) -> Refusal {
    tracing::debug!(packet_type = packet.type_str(), code = %error.code, "packet refused by the rules");
    let role = packet.packet_type().spec().map(|s| s.role);
    let answers = matches!(role, Some(Role::Ack { .. } | Role::Error))
        || matches!(packet.body, PacketBody::Error(_));
    match &packet.body {
        _ if answers => match &packet.request_id {
            Some(request_id) => Refusal::FailPending(request_id.clone(), error),
            None => Refusal::Drop,
        },
        PacketBody::DescriptorPush(_) => Refusal::Drop,
        PacketBody::ChatMessage(message) => {
            let ack = ChatMessageAck::rejected(
                message.message_id.clone(),
                error.code.clone(),
                error.message().to_owned(),
                false,
            );
            Refusal::Answer(Packet::with_payload(crate::packet_id(), ack).answering(packet))
        }
        _ if matches!(role, Some(Role::Request { .. })) => {
            Refusal::Answer(error_ack(packet, error))
        }
        _ => Refusal::Answer(Packet::error(crate::packet_id(), error).answering(packet)),
    }
}

/// The ack of `request` carrying `error` (the ack type from the one request-to-ack table of
/// `protocol-types`; `error` for a packet that has none).
pub fn error_ack(request: &Packet, error: WireError) -> Packet {
    let body = PacketBody::empty_ack_for(&request.body).unwrap_or(PacketBody::Error(None));
    Packet::new(crate::packet_id(), body).with_error(error).answering(request)
}
