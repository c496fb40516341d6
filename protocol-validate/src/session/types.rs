//! What a [`Session`](super::Session)(super::Session) answers: accepted packets, rejections, the pending requests
//! and messages it pairs, and the channel-ownership hook.

use xagent_protocol_types::{
    ConnectorChannelId, ConnectorId, DecodeError, EnvelopeIds, ErrorCode, Packet, PacketId,
    RequestId, Side, WireError,
};

use crate::catalog::{ChannelProfiles, Negotiated};
use crate::version::ProtocolVersion;

/// What the rest of the system knows about a channel that is not open on this connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChannelOwner {
    /// Nothing known: the channel is simply not open (`channel_not_open`).
    Unknown,
    /// The channel exists and belongs here, but is not open on this connection
    /// (`channel_not_open`).
    Owned,
    /// The channel belongs to another xAgent user (`connector_channel_not_owned`).
    NotOwned,
    /// The channel belongs to another Connector Card or runtime
    /// (`connector_channel_connector_mismatch`).
    OtherConnector,
}

/// Looks up channels that are not open on this connection (e.g. the Connector's channel store
/// or xAgent's user ownership index).
pub trait ChannelOwnership: Send + Sync {
    /// Who owns `channel`.
    fn owner(&self, channel: &ConnectorChannelId) -> ChannelOwner;
}

impl<F> ChannelOwnership for F
where
    F: Fn(&ConnectorChannelId) -> ChannelOwner + Send + Sync,
{
    fn owner(&self, channel: &ConnectorChannelId) -> ChannelOwner {
        self(channel)
    }
}

/// What to do with a refused packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectAction {
    /// Answer with a `type = "error"` packet ([`Rejection::error_packet`]) and drop the packet.
    Reply,
    /// Answer with an error packet, then close the socket (close code 1008).
    ReplyAndClose,
    /// Drop the packet without an answer (a stale ack, a mismatching pushed Descriptor).
    Ignore,
}

/// A packet the session refuses, with the wire error and the action to take. For
/// [`Session::on_sent`](super::Session::on_sent) it means "do not send this": the local side has a bug.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{error}")]
#[non_exhaustive]
pub struct Rejection {
    /// The error to report; its code is one of the spec's.
    pub error: WireError,
    /// What to do.
    pub action: RejectAction,
}

impl Rejection {
    /// A rejection answered with an error packet.
    pub fn reply(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { error: WireError::new(code, message), action: RejectAction::Reply }
    }

    /// A rejection answered with an error packet and a close.
    pub fn close(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { error: WireError::new(code, message), action: RejectAction::ReplyAndClose }
    }

    /// A rejection that is dropped silently.
    pub fn ignore(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { error: WireError::new(code, message), action: RejectAction::Ignore }
    }

    /// The rejection of a packet that could not be decoded (`invalid_packet`, connection kept).
    pub fn from_decode(error: &DecodeError) -> Self {
        Self { error: error.to_wire(), action: RejectAction::Reply }
    }

    /// The error code.
    pub fn code(&self) -> &ErrorCode {
        &self.error.code
    }

    /// The `type = "error"` packet answering `about`: same `request_id` and channel,
    /// `reply_to` = its `packet_id`.
    pub fn error_packet(&self, packet_id: impl Into<PacketId>, about: &Packet) -> Packet {
        Packet::error(packet_id, self.error.clone()).answering(about)
    }

    /// The error packet answering a packet known only by the ids salvaged from it.
    pub fn error_packet_for(&self, packet_id: impl Into<PacketId>, ids: &EnvelopeIds) -> Packet {
        let mut packet = Packet::error(packet_id, self.error.clone());
        packet.request_id = ids.request_id.clone();
        packet.reply_to = ids.packet_id.clone();
        packet.connector_channel_id = ids.connector_channel_id.clone();
        packet
    }
}

/// A request waiting for its ack.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingRequest {
    /// Who sent the request.
    pub requester: Side,
    /// Its `request_id`.
    pub request_id: RequestId,
    /// Its `packet_id` (the ack's `reply_to`).
    pub packet_id: PacketId,
    /// The request type.
    pub packet_type: &'static str,
    /// The ack type that answers it.
    pub ack_type: &'static str,
    /// Its channel, if any.
    pub channel: Option<ConnectorChannelId>,
}

/// A `chat.message` waiting for its `chat.message.ack`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingMessage {
    /// Who sent the message.
    pub sender: Side,
    /// The message packet's `packet_id` (the ack's `reply_to`).
    pub packet_id: PacketId,
    /// Its `message_id`.
    pub message_id: String,
    /// Its channel.
    pub channel: ConnectorChannelId,
}

/// A channel open on this connection.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenChannel {
    /// The channel id.
    pub id: ConnectorChannelId,
    /// Profiles enabled on it (negotiated ∩ Descriptor `connection.profiles`).
    pub profiles: ChannelProfiles,
}

/// The outcome of a completed hello.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Established {
    /// The runtime id the Connector returned.
    pub connector_id: ConnectorId,
    /// The peer's protocol version.
    pub peer_version: ProtocolVersion,
    /// The Profiles negotiated for the connection.
    pub negotiated: Negotiated,
    /// The runtime id xAgent's hello asked to resume, if any.
    pub requested_connector_id: Option<ConnectorId>,
}

/// What an accepted packet meant.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Accepted {
    /// A `connector.hello` was accepted; the ack is due (Connector) or awaited (xAgent).
    Hello {
        /// xAgent's protocol version.
        version: ProtocolVersion,
        /// The Profiles the connection will have.
        negotiated: Negotiated,
        /// The runtime id xAgent asked to resume, if any.
        requested_connector_id: Option<ConnectorId>,
    },
    /// `connector.hello.ack`: the connection is established.
    Established(Established),
    /// A request; its ack is now awaited.
    Request(PendingRequest),
    /// An ack, paired with its request (`None` for a `pong` without `request_id`).
    Reply(Option<PendingRequest>),
    /// A `channel.open.ack` opened (or re-opened) a channel.
    ChannelOpened {
        /// The channel.
        channel: ConnectorChannelId,
        /// The `channel.open` it answers.
        request: PendingRequest,
    },
    /// A `channel.close` closed a channel; its ack is awaited.
    ChannelClosed {
        /// The channel.
        channel: ConnectorChannelId,
        /// The close request.
        request: PendingRequest,
    },
    /// A `chat.message`; its `chat.message.ack` is now awaited.
    Message(PendingMessage),
    /// A `chat.message.ack`, paired with its message.
    MessageAck(PendingMessage),
    /// A one-way push.
    Push,
    /// An `error` packet, paired with the request it answers when there is one.
    Error(Option<PendingRequest>),
}
