//! The packet rules of the xAgent side, one function for both directions: what the Connector
//! sent is judged with sender = Connector, what this side is about to send with sender =
//! xAgent, by the same validator (the configured version window) and the same admitted Card.

use std::sync::Arc;

use xagent_connection::{Admission, OutboundJudge, OutboundRefusal};
use xagent_protocol_types::{Packet, Side};
use xagent_protocol_validate::{PacketContext, Report, Validator};

use super::Shared;

/// The one judgement of a packet (`text` is its JSON): the hot-path verdict runs first on the
/// packet already decoded (no second decode, no `Value`); only a refused packet is parsed again
/// for the report that names its rules.
pub(crate) fn judge_packet(
    validator: &Validator,
    admission: &Admission,
    packet: &Packet,
    text: &str,
    sender: Side,
) -> Result<(), Report> {
    let facts = admission.facts();
    let context = PacketContext { card: facts.as_deref(), sender: Some(sender) };
    validator.check_decoded(packet, text.as_bytes(), context)
}

/// The validator's errors for a packet, rule ids first and joined, or `None` when it passes.
pub(crate) fn packet_problems(
    shared: &Shared,
    packet: &Packet,
    text: &str,
    sender: Side,
) -> Option<String> {
    let report = judge_packet(&shared.validator, &shared.admission, packet, text, sender).err()?;
    let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
    (!errors.is_empty()).then(|| errors.join("; "))
}

/// The send rules the core's writer runs on every packet before it leaves: the receive rules
/// of the Connector, applied here so a packet it would refuse never goes out.
pub(crate) struct SendRules {
    pub(crate) validator: Validator,
    pub(crate) admission: Arc<Admission>,
}

impl OutboundJudge for SendRules {
    fn judge(&self, packet: &Packet, text: &str) -> Result<(), OutboundRefusal> {
        let Err(report) =
            judge_packet(&self.validator, &self.admission, packet, text, Side::Xagent)
        else {
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
