//! Documents given as text: the library form of `xagent-connector check`.

use serde_json::Value;
use xagent_protocol_types::Side;

use super::validator::Validator;
use crate::facts::*;
use crate::report::Report;
use crate::rules::*;

/// The kinds of document `xagent-connector check` validates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DocumentKind {
    /// A Connector Card.
    Card,
    /// A Connection Descriptor.
    Descriptor,
    /// One data-plane packet.
    Packet,
    /// A `SKILL.md`.
    Skill,
}

/// Parses JSON text, or returns the report of a `document.not_json` violation.
pub fn parse_document(text: &str) -> Result<Value, Report> {
    serde_json::from_str(text).map_err(|e| {
        Report::new(vec![DOCUMENT_NOT_JSON.at(
            "",
            format!(
                "the input is not JSON (line {}, column {}); fix the syntax",
                e.line(),
                e.column()
            ),
        )])
    })
}

/// Checks a document given as text, optionally against a Card: the library form of
/// `xagent-connector check`. Non-JSON input yields `document.not_json`, a non-object
/// `document.not_object`.
pub fn check_text(kind: DocumentKind, text: &str, card: Option<&CardFacts>) -> Report {
    check_text_from(kind, text, card, None)
}

/// [`check_text`] for a packet sent by `sender` (`xagent-connector check packet --sender`):
/// the direction-dependent rules are applied for that sender. With `None`, a packet type only
/// one side sends is judged as sent by it, and one both sides send is judged for both (each
/// violation of a rule that holds for one sender only names it in `sender`). Other kinds of
/// document ignore `sender`.
pub fn check_text_from(
    kind: DocumentKind,
    text: &str,
    card: Option<&CardFacts>,
    sender: Option<Side>,
) -> Report {
    let validator = Validator::default();
    if kind == DocumentKind::Skill {
        let facts = card.cloned().unwrap_or_default();
        return validator.skill(text, &facts);
    }
    let value = match parse_document(text) {
        Ok(value) => value,
        Err(report) => return report,
    };
    match kind {
        DocumentKind::Card => validator.card(&value),
        DocumentKind::Descriptor => {
            validator.descriptor(&value, DescriptorContext { card, channel: None })
        }
        DocumentKind::Packet | DocumentKind::Skill => {
            validator.packet(&value, PacketContext { card, sender })
        }
    }
}
