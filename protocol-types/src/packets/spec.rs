//! The facts the packet table states about each type: who sends it, where it is routed, and
//! what role it plays.

/// Which side sends a packet type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Sent by xAgent, received by the Connector.
    XagentToConnector,
    /// Sent by the Connector, received by xAgent.
    ConnectorToXagent,
    /// Either side may send it.
    Both,
}

impl Direction {
    /// True when a packet of this direction may be sent by `sender`.
    pub fn allows(self, sender: Side) -> bool {
        matches!(
            (self, sender),
            (Self::Both, _)
                | (Self::XagentToConnector, Side::Xagent)
                | (Self::ConnectorToXagent, Side::Connector)
        )
    }
}

/// One end of the data plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The xAgent backend.
    Xagent,
    /// The Connector Server.
    Connector,
}

impl Side {
    /// The other end.
    pub fn peer(self) -> Self {
        match self {
            Self::Xagent => Self::Connector,
            Self::Connector => Self::Xagent,
        }
    }
}

/// Whether a packet travels on a user channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Routing {
    /// System level; no channel.
    System,
    /// User level; the envelope must carry `connector_channel_id`.
    Channel,
    /// `channel.open`: the envelope carries the persisted channel id, or none on a first open.
    ChannelOpen,
    /// May carry a channel or not (`ping`, `pong`, `error`).
    Either,
}

/// How a packet type takes part in request/response pairing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// A request answered by the named ack, correlated by `request_id`.
    Request {
        /// The ack type.
        ack: &'static str,
    },
    /// The ack of the named request: echoes `request_id`, `reply_to` = request `packet_id`.
    Ack {
        /// The request type.
        request: &'static str,
    },
    /// An IM v2 `chat.message`, acknowledged by `chat.message.ack` through `reply_to`.
    Message,
    /// An IM v2 `chat.message.ack`; `reply_to` is required.
    MessageAck,
    /// A one-way push.
    Push,
    /// The `error` packet.
    Error,
}

/// Static facts about one packet type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PacketSpec {
    /// Wire `type`.
    pub packet_type: &'static str,
    /// Who sends it.
    pub direction: Direction,
    /// Routing level.
    pub routing: Routing,
    /// Pairing role.
    pub role: Role,
    /// Whether a payload must be present.
    pub payload_required: bool,
}
