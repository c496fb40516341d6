//! System-level packets: hello, ping, pong.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ConnectorCardId, ConnectorId, Extra, ProfileId};

/// `connector.hello` (xAgent -> Connector): the first packet on a socket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ConnectorHello {
    /// Must equal the Connector's Card id.
    #[schemars(length(min = 1))]
    pub connector_card_id: ConnectorCardId,
    /// The runtime id from an earlier session; empty or absent on a first connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector_id: Option<ConnectorId>,
    /// xAgent's protocol version; absent means 1.0 and is rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(required)]
    pub protocol_version: Option<String>,
    /// Profiles xAgent supports; a current Connector requires it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(required)]
    pub supported_profiles: Option<Vec<ProfileId>>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ConnectorHello {
    /// A current hello.
    pub fn new(
        connector_card_id: impl Into<ConnectorCardId>,
        supported_profiles: Vec<ProfileId>,
    ) -> Self {
        Self {
            connector_card_id: connector_card_id.into(),
            connector_id: None,
            protocol_version: Some(crate::PROTOCOL_VERSION.into()),
            supported_profiles: Some(supported_profiles),
            extra: Extra::new(),
        }
    }

    /// Asks to resume an earlier runtime id.
    #[must_use]
    pub fn with_connector_id(mut self, connector_id: impl Into<ConnectorId>) -> Self {
        self.connector_id = Some(connector_id.into());
        self
    }
}

/// `connector.hello.ack` (Connector -> xAgent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ConnectorHelloAck {
    /// Equals the hello's.
    #[schemars(length(min = 1))]
    pub connector_card_id: ConnectorCardId,
    /// The runtime id, required.
    #[schemars(length(min = 1))]
    pub connector_id: ConnectorId,
    /// The Connector's version; must equal the Card's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(required)]
    pub protocol_version: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ConnectorHelloAck {
    /// A current hello.ack.
    pub fn new(
        connector_card_id: impl Into<ConnectorCardId>,
        connector_id: impl Into<ConnectorId>,
    ) -> Self {
        Self {
            connector_card_id: connector_card_id.into(),
            connector_id: connector_id.into(),
            protocol_version: Some(crate::PROTOCOL_VERSION.into()),
            extra: Extra::new(),
        }
    }
}

/// `ping` (either direction). The payload is usually empty.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Ping {
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `pong` (either direction), answering a `ping` with its `request_id`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Pong {
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}
