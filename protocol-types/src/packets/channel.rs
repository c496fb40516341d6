//! Channel lifecycle and Descriptor packets.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ConnectionDescriptor, ConnectorChannelId, Extra, OkStatus};

/// `channel.open` (xAgent -> Connector). The envelope carries the persisted channel id when
/// restoring, nothing on a first open; the payload is empty today.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ChannelOpen {
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `channel.open.ack` (Connector -> xAgent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ChannelOpenAck {
    /// The opened channel (also in the envelope).
    #[schemars(length(min = 1))]
    pub connector_channel_id: ConnectorChannelId,
    /// The channel's Descriptor (status `created` before authentication).
    pub connection_descriptor: ConnectionDescriptor,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChannelOpenAck {
    /// Channel id and Descriptor.
    pub fn new(
        connector_channel_id: ConnectorChannelId,
        connection_descriptor: ConnectionDescriptor,
    ) -> Self {
        Self { connector_channel_id, connection_descriptor, extra: Extra::new() }
    }
}

/// `channel.close` (xAgent -> Connector): closes the runtime route only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ChannelClose {
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `channel.close.ack` (Connector -> xAgent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ChannelCloseAck {
    /// `ok`.
    pub status: OkStatus,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl Default for ChannelCloseAck {
    fn default() -> Self {
        Self { status: OkStatus::Ok, extra: Extra::new() }
    }
}

/// `connection.descriptor.get` (xAgent -> Connector). Empty payload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct DescriptorGet {
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `connection.descriptor.get.ack` (Connector -> xAgent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct DescriptorGetAck {
    /// The channel's current Descriptor.
    pub connection_descriptor: ConnectionDescriptor,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl DescriptorGetAck {
    /// Wraps a Descriptor.
    pub fn new(connection_descriptor: ConnectionDescriptor) -> Self {
        Self { connection_descriptor, extra: Extra::new() }
    }
}

/// `connection.descriptor.push` (Connector -> xAgent): a state change the Connector reports
/// without being asked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct DescriptorPush {
    /// The channel's new Descriptor.
    pub connection_descriptor: ConnectionDescriptor,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl DescriptorPush {
    /// Wraps a Descriptor.
    pub fn new(connection_descriptor: ConnectionDescriptor) -> Self {
        Self { connection_descriptor, extra: Extra::new() }
    }
}
