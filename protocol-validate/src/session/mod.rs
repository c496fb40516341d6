//! Data-plane sequencing as a sans-I/O state machine.
//!
//! A [`Session`] follows one WebSocket connection from one side's point of view. The runtime
//! feeds it every packet it decodes ([`Session::on_received`]) and every packet it is about to
//! write ([`Session::on_sent`]); the session answers with what the packet meant ([`Accepted`])
//! or with the spec's error code ([`Rejection`]) and what to do about it. It keeps:
//!
//! - the hello state: nothing but `connector.hello` (and `error`) may flow before
//!   `connector.hello.ack`; the hello's version, card id and `supported_profiles` are checked,
//!   and the Profiles are negotiated into a [`Negotiated`];
//! - the open channels: a channel opens with the `channel.open.ack` the Connector sends and
//!   closes with `channel.close`; each carries its [`ChannelProfiles`] from its Descriptor and is
//!   re-negotiated whenever a Descriptor for it is seen;
//! - pending requests by `request_id` (keyed by the requesting side) and pending
//!   `chat.message`s by `packet_id`, so every ack is paired with what it answers.
//!
//! Channels that are not open on this connection are looked up through an optional
//! [`ChannelOwnership`] hook, which tells `channel_not_open` apart from
//! `connector_channel_not_owned` and `connector_channel_connector_mismatch`.

use std::collections::HashMap;

/// The hasher of the sequencing maps, touched several times per packet. Their keys are chosen
/// by the peer (request and packet ids), so it is the randomly seeded foldhash, not SipHash
/// (slower) and not an unseeded hasher such as FxHash (a peer could force collisions); see
/// docs/DECISIONS.md, "Hashers of internal maps".
type Hasher = foldhash::fast::RandomState;

use xagent_protocol_types::{
    ConnectionDescriptor, ConnectorCard, ConnectorCardId, ConnectorChannelId, ConnectorId,
    ErrorCode, Packet, PacketBody, PacketId, PacketType, ProfileId, RequestId, Side,
};

use crate::catalog::{ChannelProfiles, Negotiated, Permission};
use crate::version::{AdmissionWindow, ProtocolVersion};

mod exchange;
mod hello;
mod types;

pub use types::{
    Accepted, ChannelOwner, ChannelOwnership, Established, OpenChannel, PendingMessage,
    PendingRequest, RejectAction, Rejection,
};

#[derive(Clone, Debug)]
enum HelloState {
    Awaiting,
    /// xAgent: hello sent; Connector: hello received and accepted, ack not yet sent.
    InProgress {
        request_id: RequestId,
        requested_connector_id: Option<ConnectorId>,
        peer_version: ProtocolVersion,
        negotiated: Negotiated,
    },
    Established(Established),
}

/// The sequencing state of one data-plane connection, seen from one side.
pub struct Session {
    side: Side,
    card_id: ConnectorCardId,
    card_profiles: Vec<ProfileId>,
    window: AdmissionWindow,
    hello: HelloState,
    /// Open channels and their Profiles; the id is the key only (no second copy per channel).
    channels: HashMap<ConnectorChannelId, ChannelProfiles, Hasher>,
    /// One shared value per distinct Profile set, so channels with the same Profiles (usually
    /// all of a connection's) hold a reference count each instead of their own lists.
    profile_sets: Vec<ChannelProfiles>,
    requests: HashMap<(Side, RequestId), PendingRequest, Hasher>,
    messages: HashMap<(Side, PacketId), PendingMessage, Hasher>,
    ownership: Option<Box<dyn ChannelOwnership>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("side", &self.side)
            .field("card_id", &self.card_id)
            .field("hello", &self.hello)
            .field("channels", &self.channels.len())
            .field("requests", &self.requests.len())
            .field("messages", &self.messages.len())
            .finish()
    }
}

impl Session {
    /// A session for `side` of a connection to the Connector described by `card`.
    pub fn new(side: Side, card: &ConnectorCard, window: AdmissionWindow) -> Self {
        Self::from_parts(
            side,
            card.connector_card_id.clone(),
            card.supports.profiles.clone(),
            window,
        )
    }

    /// A session from the Card's id and `supports.profiles` only.
    pub fn from_parts(
        side: Side,
        card_id: ConnectorCardId,
        card_profiles: Vec<ProfileId>,
        window: AdmissionWindow,
    ) -> Self {
        Self {
            side,
            card_id,
            card_profiles,
            window,
            hello: HelloState::Awaiting,
            channels: HashMap::default(),
            profile_sets: Vec::new(),
            requests: HashMap::default(),
            messages: HashMap::default(),
            ownership: None,
        }
    }

    /// Adds the lookup for channels not open on this connection.
    #[must_use]
    pub fn with_ownership(mut self, ownership: impl ChannelOwnership + 'static) -> Self {
        self.ownership = Some(Box::new(ownership));
        self
    }

    /// This session's side.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The Card id the session checks against.
    pub fn card_id(&self) -> &ConnectorCardId {
        &self.card_id
    }

    /// True once `connector.hello.ack` has gone through.
    pub fn is_established(&self) -> bool {
        matches!(self.hello, HelloState::Established(_))
    }

    /// The hello outcome, once established.
    pub fn established(&self) -> Option<&Established> {
        match &self.hello {
            HelloState::Established(established) => Some(established),
            _ => None,
        }
    }

    /// The connection's negotiated Profiles, once established.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.established().map(|e| &e.negotiated)
    }

    /// The runtime id, once established.
    pub fn connector_id(&self) -> Option<&ConnectorId> {
        self.established().map(|e| &e.connector_id)
    }

    /// A channel open on this connection.
    pub fn channel(&self, channel: &ConnectorChannelId) -> Option<OpenChannel> {
        self.channels
            .get_key_value(channel)
            .map(|(id, profiles)| OpenChannel { id: id.clone(), profiles: profiles.clone() })
    }

    /// The Profiles enabled on a channel open on this connection (no copy).
    pub fn channel_profiles(&self, channel: &ConnectorChannelId) -> Option<&ChannelProfiles> {
        self.channels.get(channel)
    }

    /// True when the channel is open on this connection.
    pub fn is_open(&self, channel: &ConnectorChannelId) -> bool {
        self.channels.contains_key(channel)
    }

    /// Every open channel.
    pub fn open_channels(&self) -> impl Iterator<Item = OpenChannel> + '_ {
        self.channels
            .iter()
            .map(|(id, profiles)| OpenChannel { id: id.clone(), profiles: profiles.clone() })
    }

    /// Requests still waiting for their ack.
    pub fn pending_requests(&self) -> impl Iterator<Item = &PendingRequest> {
        self.requests.values()
    }

    /// `chat.message`s still waiting for their ack.
    pub fn pending_messages(&self) -> impl Iterator<Item = &PendingMessage> {
        self.messages.values()
    }

    /// Forgets a request sent by `requester` (e.g. after a timeout); a late ack is then ignored.
    pub fn forget_request(
        &mut self,
        requester: Side,
        request_id: &RequestId,
    ) -> Option<PendingRequest> {
        self.requests.remove(&(requester, request_id.clone()))
    }

    /// Forgets a `chat.message` sent by `sender` (e.g. after a timeout).
    pub fn forget_message(&mut self, sender: Side, packet_id: &PacketId) -> Option<PendingMessage> {
        self.messages.remove(&(sender, packet_id.clone()))
    }

    /// Whether `packet_type`, sent by `sender`, may flow now on `channel` (or at connection
    /// level when `None`). False before the hello completes and for channels not open.
    pub fn allows(
        &self,
        packet_type: &str,
        sender: Side,
        channel: Option<&ConnectorChannelId>,
    ) -> bool {
        let Some(negotiated) = self.negotiated() else { return false };
        match channel {
            None => negotiated.allows(packet_type, sender, None),
            Some(id) => self
                .channels
                .get(id)
                .is_some_and(|profiles| negotiated.allows(packet_type, sender, Some(profiles))),
        }
    }

    /// The packet type an xAgent outbound payload kind becomes on `channel`, or `None` when the
    /// channel's Profiles do not permit it (drop the signal silently).
    pub fn outbound_packet(
        &self,
        channel: &ConnectorChannelId,
        kind: &str,
    ) -> Option<&'static str> {
        self.channels.get(channel).and_then(|profiles| profiles.outbound_packet(kind))
    }

    /// Feeds a packet received from the peer.
    pub fn on_received(&mut self, packet: &Packet) -> Result<Accepted, Rejection> {
        self.step(self.side.peer(), packet)
    }

    /// Feeds a packet this side is about to send. A rejection means it must not be sent.
    pub fn on_sent(&mut self, packet: &Packet) -> Result<Accepted, Rejection> {
        self.step(self.side, packet)
    }

    fn step(&mut self, sender: Side, packet: &Packet) -> Result<Accepted, Rejection> {
        let packet_type = packet.type_str();
        let spec = PacketType::spec_of(packet_type);
        if matches!(packet.body, PacketBody::Error(_)) {
            return Ok(self.on_error(sender, packet));
        }
        if !self.is_established() {
            return self.before_hello(sender, packet);
        }
        let Some(spec) = spec else {
            return Err(Rejection::reply(
                ErrorCode::UnsupportedPacket,
                format!("packet type {packet_type:?} is not supported"),
            ));
        };
        if matches!(packet.body, PacketBody::ConnectorHello(_) | PacketBody::ConnectorHelloAck(_)) {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                format!("{packet_type} after the hello completed; send it once per connection"),
            ));
        }
        let negotiated = match self.negotiated() {
            Some(negotiated) => negotiated,
            None => return Err(hello_required(packet_type)),
        };
        match negotiated.decide(packet_type, sender, None) {
            Permission::Allowed => {}
            Permission::UnknownType => {
                return Err(Rejection::reply(
                    ErrorCode::UnsupportedPacket,
                    format!("packet type {packet_type:?} is not supported"),
                ));
            }
            Permission::WrongDirection => {
                return Err(Rejection::reply(
                    ErrorCode::UnsupportedPacket,
                    format!("{packet_type} may not be sent by the {}", side_name(sender)),
                ));
            }
            Permission::ProfileNotNegotiated { profile }
            | Permission::ProfileNotOnChannel { profile } => {
                return Err(Rejection::reply(
                    ErrorCode::UnsupportedPacket,
                    format!(
                        "{packet_type} needs Profile {profile}, which this connection did not negotiate"
                    ),
                ));
            }
        }
        self.established_step(sender, packet, spec)
    }
}

fn descriptor_of(body: &PacketBody) -> Option<&ConnectionDescriptor> {
    match body {
        PacketBody::DescriptorGetAck(Some(ack)) => Some(&ack.connection_descriptor),
        PacketBody::DescriptorPush(push) => Some(&push.connection_descriptor),
        PacketBody::AuthStartAck(Some(ack)) => ack.0.connection_descriptor.as_ref(),
        PacketBody::AuthStatusAck(Some(ack)) => ack.0.connection_descriptor.as_ref(),
        PacketBody::AuthCancelAck(Some(ack)) => ack.connection_descriptor.as_ref(),
        PacketBody::AuthLogoutAck(Some(ack)) => ack.connection_descriptor.as_ref(),
        _ => None,
    }
}

fn hello_required(packet_type: &str) -> Rejection {
    Rejection::reply(
        ErrorCode::HelloRequired,
        format!("{packet_type} before connector.hello completed; send connector.hello first"),
    )
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Xagent => "xAgent",
        Side::Connector => "Connector",
    }
}
