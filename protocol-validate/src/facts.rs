//! The facts of a Card that other documents are checked against, and the contexts of a check.

use serde_json::Value;
use xagent_protocol_types::{ConnectorCard, Direction, Side};

/// The facts of a Card that other documents are checked against. Built from a parsed value
/// (which may itself be invalid: missing facts just skip the cross-checks that need them) or
/// from a typed Card.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct CardFacts {
    /// `connector_card_id`.
    pub card_id: Option<String>,
    /// `protocol_version`.
    pub protocol_version: Option<String>,
    /// `connector.version`.
    pub connector_version: Option<String>,
    /// `build`.
    pub build: Option<Value>,
    /// `supports.profiles`.
    pub profiles: Vec<String>,
    /// `supports.target_types`.
    pub target_types: Vec<String>,
    /// `tools[].tool_id`.
    pub tool_ids: Vec<String>,
    /// `auth_flows[].id`.
    pub flow_ids: Vec<String>,
    /// Every `tools[].related_skill_ids` entry, each once, in Card order.
    pub related_skill_ids: Vec<String>,
}

impl CardFacts {
    /// Reads what it can from a Card document.
    pub fn from_value(card: &Value) -> Self {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        let list = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|items| items.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default()
        };
        let ids = |v: Option<&Value>, key: &str| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|item| item.get(key).and_then(Value::as_str))
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        Self {
            card_id: text(card.get("connector_card_id")),
            protocol_version: text(card.get("protocol_version")),
            connector_version: text(card.pointer("/connector/version")),
            build: card.get("build").cloned(),
            profiles: list(card.pointer("/supports/profiles")),
            target_types: list(card.pointer("/supports/target_types")),
            tool_ids: ids(card.get("tools"), "tool_id"),
            flow_ids: ids(card.get("auth_flows"), "id"),
            related_skill_ids: unique(
                card.get("tools")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|tool| tool.get("related_skill_ids").and_then(Value::as_array))
                    .flatten()
                    .filter_map(Value::as_str),
            ),
        }
    }

    /// The facts of a typed Card.
    pub fn from_card(card: &ConnectorCard) -> Self {
        Self {
            card_id: Some(card.connector_card_id.as_str().to_owned()),
            protocol_version: Some(card.protocol_version.clone()),
            connector_version: Some(card.connector.version.clone()),
            build: serde_json::to_value(&card.build).ok(),
            profiles: card.supports.profiles.iter().map(|p| p.as_str().to_owned()).collect(),
            target_types: card
                .supports
                .target_types
                .iter()
                .map(|t| t.as_str().to_owned())
                .collect(),
            tool_ids: card.tools.iter().map(|t| t.tool_id.as_str().to_owned()).collect(),
            flow_ids: card.auth_flows.iter().map(|f| f.id.as_str().to_owned()).collect(),
            related_skill_ids: unique(
                card.tools.iter().flat_map(|t| t.related_skill_ids.iter()).map(|s| s.as_str()),
            ),
        }
    }
}

/// The names, each once, in first-seen order.
fn unique<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in names {
        if !out.iter().any(|n| n == name) {
            out.push(name.to_owned());
        }
    }
    out
}

/// What a Descriptor is checked against.
#[derive(Clone, Copy, Debug, Default)]
pub struct DescriptorContext<'a> {
    /// The Card of the Connector.
    pub card: Option<&'a CardFacts>,
    /// The channel the Descriptor must describe.
    pub channel: Option<&'a str>,
}

impl<'a> DescriptorContext<'a> {
    /// A context with a Card.
    pub fn with_card(card: &'a CardFacts) -> Self {
        Self { card: Some(card), channel: None }
    }
}

/// What a packet is checked against.
#[derive(Clone, Copy, Debug, Default)]
pub struct PacketContext<'a> {
    /// The Card of the Connector, for cross-checks (Profiles, Tools, flows, hello identity).
    pub card: Option<&'a CardFacts>,
    /// Who sent the packet, when known (direction-dependent rules need it).
    pub sender: Option<Side>,
}

impl<'a> PacketContext<'a> {
    /// A context with a Card.
    pub fn with_card(card: &'a CardFacts) -> Self {
        Self { card: Some(card), sender: None }
    }
}

/// The one side that may send a packet of this direction, or `None` when both may.
pub(crate) fn only_sender(direction: Direction) -> Option<Side> {
    match direction {
        Direction::XagentToConnector => Some(Side::Xagent),
        Direction::ConnectorToXagent => Some(Side::Connector),
        Direction::Both => None,
    }
}
