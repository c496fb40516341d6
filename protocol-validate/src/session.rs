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
    ChatMessage, ChatMessageAck, ConnectionDescriptor, ConnectorCard, ConnectorCardId,
    ConnectorChannelId, ConnectorHello, ConnectorHelloAck, ConnectorId, DecodeError, EnvelopeIds,
    ErrorCode, Packet, PacketBody, PacketId, PacketSpec, PacketType, ProfileId, RequestId, Role,
    Routing, Side, WireError,
};

use crate::catalog::{ChannelProfiles, Negotiated, Permission};
use crate::version::{AdmissionWindow, ProtocolVersion};

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
/// [`Session::on_sent`] it means "do not send this": the local side has a bug.
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

    fn established_step(
        &mut self,
        sender: Side,
        packet: &Packet,
        spec: &'static PacketSpec,
    ) -> Result<Accepted, Rejection> {
        let packet_type = spec.packet_type;
        // Channel routing.
        let channel = packet.connector_channel_id.as_ref().filter(|c| !c.is_empty());
        if spec.routing == Routing::Channel && channel.is_none() {
            return Err(Rejection::reply(
                ErrorCode::ConnectorChannelIdRequired,
                format!(
                    "{packet_type} is a user-level packet; set the envelope connector_channel_id"
                ),
            ));
        }
        let is_ack = matches!(spec.role, Role::Ack { .. });
        if spec.routing == Routing::Channel
            && !is_ack
            && let Some(channel) = channel
        {
            self.check_open(packet_type, channel, sender)?;
        }

        match spec.role {
            Role::Request { ack } => self.on_request(sender, packet, spec, ack),
            Role::Ack { request } => self.on_ack(sender, packet, request),
            Role::Message => self.on_message(sender, packet),
            Role::MessageAck => self.on_message_ack(sender, packet),
            Role::Push => {
                if let PacketBody::DescriptorPush(push) = &packet.body
                    && let Some(channel) = channel
                {
                    self.check_descriptor(channel, &push.connection_descriptor)
                        .map_err(|r| Rejection { action: RejectAction::Ignore, ..r })?;
                    self.refresh_profiles(channel, &push.connection_descriptor);
                }
                Ok(Accepted::Push)
            }
            Role::Error => Ok(self.on_error(sender, packet)),
        }
    }

    fn check_open(
        &self,
        packet_type: &str,
        channel: &ConnectorChannelId,
        sender: Side,
    ) -> Result<(), Rejection> {
        let Some(profiles) = self.channels.get(channel) else {
            let owner = self.ownership.as_ref().map_or(ChannelOwner::Unknown, |o| o.owner(channel));
            return Err(match owner {
                ChannelOwner::NotOwned => Rejection::reply(
                    ErrorCode::ConnectorChannelNotOwned,
                    "the channel does not belong to the current xAgent user",
                ),
                ChannelOwner::OtherConnector => Rejection::reply(
                    ErrorCode::ConnectorChannelConnectorMismatch,
                    "the channel belongs to another Connector",
                ),
                ChannelOwner::Unknown | ChannelOwner::Owned => Rejection::reply(
                    ErrorCode::ChannelNotOpen,
                    format!("channel.open must complete on this connection before {packet_type}"),
                ),
            });
        };
        if let Permission::ProfileNotOnChannel { profile } = profiles.decide(packet_type, sender) {
            return Err(Rejection::reply(
                ErrorCode::UnsupportedPacket,
                format!(
                    "{packet_type} needs Profile {profile}, which this channel does not enable"
                ),
            ));
        }
        Ok(())
    }

    fn on_request(
        &mut self,
        sender: Side,
        packet: &Packet,
        spec: &'static PacketSpec,
        ack: &'static str,
    ) -> Result<Accepted, Rejection> {
        let request_id = match &packet.request_id {
            Some(id) if !id.is_empty() => id.clone(),
            // A ping may go without request_id; its pong then cannot be paired.
            _ if spec.routing == Routing::Either => return Ok(Accepted::Push),
            _ => {
                return Err(Rejection::reply(
                    ErrorCode::InvalidPacket,
                    format!("{} is a request; set the envelope request_id", spec.packet_type),
                ));
            }
        };
        let key = (sender, request_id.clone());
        if self.requests.contains_key(&key) {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "request_id is already in use by a request waiting for its ack; use a fresh one",
            ));
        }
        let channel = packet.connector_channel_id.clone().filter(|c| !c.is_empty());
        let pending = PendingRequest {
            requester: sender,
            request_id,
            packet_id: packet.packet_id.clone(),
            packet_type: spec.packet_type,
            ack_type: ack,
            channel: channel.clone(),
        };
        self.requests.insert(key, pending.clone());
        if let (PacketBody::ChannelClose(_), Some(channel)) = (&packet.body, channel) {
            self.channels.remove(&channel);
            return Ok(Accepted::ChannelClosed { channel, request: pending });
        }
        Ok(Accepted::Request(pending))
    }

    fn on_ack(
        &mut self,
        sender: Side,
        packet: &Packet,
        request_type: &'static str,
    ) -> Result<Accepted, Rejection> {
        let packet_type = packet.type_str();
        let request_id = match &packet.request_id {
            Some(id) if !id.is_empty() => id.clone(),
            _ if packet_type == "pong" => return Ok(Accepted::Reply(None)),
            _ => {
                return Err(Rejection::reply(
                    ErrorCode::InvalidPacket,
                    format!("{packet_type} is an ack; echo the request's request_id"),
                ));
            }
        };
        let key = (sender.peer(), request_id);
        let Some(pending) = self.requests.get(&key) else {
            return Err(Rejection::ignore(
                ErrorCode::InvalidPacket,
                format!("no {request_type} is waiting for an ack with this request_id"),
            ));
        };
        if pending.ack_type != packet_type {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                format!(
                    "request_id belongs to a {} request; answer it with {}",
                    pending.packet_type, pending.ack_type
                ),
            ));
        }
        if let Some(reply_to) = &packet.reply_to
            && reply_to != &pending.packet_id
        {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "reply_to must be the packet_id of the request this ack answers",
            ));
        }
        let channel = packet.connector_channel_id.clone().filter(|c| !c.is_empty());
        let is_open_ack = matches!(packet.body, PacketBody::ChannelOpenAck(_));
        if !is_open_ack && pending.channel.is_some() && channel != pending.channel {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "an ack must carry the connector_channel_id of its request",
            ));
        }
        let failed = packet.error.is_some();
        match (&packet.body, failed) {
            (PacketBody::ChannelOpenAck(Some(ack)), false) => {
                let Some(channel) = channel else {
                    return Err(Rejection::reply(
                        ErrorCode::ConnectorChannelIdRequired,
                        "channel.open.ack must carry the opened channel in the envelope",
                    ));
                };
                if ack.connector_channel_id != channel {
                    return Err(Rejection::reply(
                        ErrorCode::InvalidPacket,
                        "payload.connector_channel_id must equal the envelope connector_channel_id",
                    ));
                }
                self.check_descriptor(&channel, &ack.connection_descriptor)?;
                let request = self.take_request(&key)?;
                let profiles = self.profiles_for(&ack.connection_descriptor);
                self.channels.insert(channel.clone(), profiles);
                return Ok(Accepted::ChannelOpened { channel, request });
            }
            (PacketBody::ChannelOpenAck(None), false) => {
                return Err(Rejection::reply(
                    ErrorCode::InvalidPacket,
                    "channel.open.ack needs a payload with connector_channel_id and connection_descriptor",
                ));
            }
            _ => {}
        }
        if let (Some(descriptor), Some(channel), false) =
            (descriptor_of(&packet.body), channel.as_ref(), failed)
        {
            self.check_descriptor(channel, descriptor)?;
            self.refresh_profiles(channel, descriptor);
        }
        let request = self.take_request(&key)?;
        Ok(Accepted::Reply(Some(request)))
    }

    fn take_request(&mut self, key: &(Side, RequestId)) -> Result<PendingRequest, Rejection> {
        self.requests.remove(key).ok_or_else(|| {
            Rejection::ignore(ErrorCode::InvalidPacket, "no request is waiting for this ack")
        })
    }

    fn on_message(&mut self, sender: Side, packet: &Packet) -> Result<Accepted, Rejection> {
        let Some(message) = packet.payload::<ChatMessage>() else {
            return Err(Rejection::reply(ErrorCode::InvalidPacket, "chat.message needs a payload"));
        };
        let Some(channel) = packet.connector_channel_id.clone() else {
            return Err(Rejection::reply(
                ErrorCode::ConnectorChannelIdRequired,
                "chat.message is a user-level packet; set the envelope connector_channel_id",
            ));
        };
        let key = (sender, packet.packet_id.clone());
        if self.messages.contains_key(&key) {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "packet_id reused: every transmission of a chat.message needs a fresh packet_id",
            ));
        }
        let pending = PendingMessage {
            sender,
            packet_id: packet.packet_id.clone(),
            message_id: message.message_id.as_str().to_owned(),
            channel,
        };
        self.messages.insert(key, pending.clone());
        Ok(Accepted::Message(pending))
    }

    fn on_message_ack(&mut self, sender: Side, packet: &Packet) -> Result<Accepted, Rejection> {
        let Some(ack) = packet.payload::<ChatMessageAck>() else {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "chat.message.ack needs a payload",
            ));
        };
        let Some(reply_to) = packet.reply_to.as_ref().filter(|r| !r.is_empty()) else {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "chat.message.ack must set reply_to to the acknowledged chat.message's packet_id",
            ));
        };
        let key = (sender.peer(), reply_to.clone());
        let Some(pending) = self.messages.get(&key) else {
            return Err(Rejection::ignore(
                ErrorCode::InvalidPacket,
                "no chat.message with this reply_to is waiting for an ack",
            ));
        };
        if packet.connector_channel_id.as_ref() != Some(&pending.channel) {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "chat.message.ack must carry the connector_channel_id of the message it acknowledges",
            ));
        }
        if ack.message_id.as_str() != pending.message_id {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "chat.message.ack must carry the message_id of the message it acknowledges",
            ));
        }
        let pending = self.messages.remove(&key).ok_or_else(|| {
            Rejection::ignore(ErrorCode::InvalidPacket, "no chat.message is waiting for this ack")
        })?;
        Ok(Accepted::MessageAck(pending))
    }

    fn on_error(&mut self, sender: Side, packet: &Packet) -> Accepted {
        let paired = packet
            .request_id
            .as_ref()
            .and_then(|id| self.requests.remove(&(sender.peer(), id.clone())));
        // A refused hello puts the connection back to waiting for one.
        if let (Some(request), HelloState::InProgress { .. }) = (&paired, &self.hello)
            && request.packet_type == "connector.hello"
        {
            self.hello = HelloState::Awaiting;
        }
        Accepted::Error(paired)
    }

    fn before_hello(&mut self, sender: Side, packet: &Packet) -> Result<Accepted, Rejection> {
        let in_progress = matches!(self.hello, HelloState::InProgress { .. });
        match (&packet.body, sender, in_progress) {
            (PacketBody::ConnectorHello(hello), Side::Xagent, false) => {
                self.on_hello(packet, hello)
            }
            (PacketBody::ConnectorHelloAck(ack), Side::Connector, true) => {
                self.on_hello_ack(packet, ack.as_deref())
            }
            (PacketBody::ConnectorHello(_), Side::Xagent, true) => Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "connector.hello was already sent on this connection; wait for its ack",
            )),
            (PacketBody::ConnectorHelloAck(_), Side::Connector, false) => Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "connector.hello.ack without a pending connector.hello",
            )),
            _ => Err(hello_required(packet.type_str())),
        }
    }

    fn on_hello(&mut self, packet: &Packet, hello: &ConnectorHello) -> Result<Accepted, Rejection> {
        let Some(request_id) = packet.request_id.clone().filter(|r| !r.is_empty()) else {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "connector.hello is a request; set the envelope request_id",
            ));
        };
        let version = match self.side {
            // The Connector admits xAgent's version by the same-major rule.
            Side::Connector => self.window.admit_hello(hello.protocol_version.as_deref()),
            Side::Xagent => ProtocolVersion::from_wire(hello.protocol_version.as_deref()),
        }
        .map_err(|e| Rejection::close(e.code(), e.to_string()))?;
        if hello.connector_card_id != self.card_id {
            return Err(Rejection::reply(
                ErrorCode::ConnectorCardIdMismatch,
                format!(
                    "hello names connector_card_id {:?} but this Connector is {:?}",
                    hello.connector_card_id.as_str(),
                    self.card_id.as_str()
                ),
            ));
        }
        let Some(supported) = &hello.supported_profiles else {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "connector.hello must list supported_profiles explicitly",
            ));
        };
        let negotiated = Negotiated::negotiate(&self.card_profiles, supported);
        let requested_connector_id = hello.connector_id.clone().filter(|c| !c.is_empty());
        self.requests.insert(
            (Side::Xagent, request_id.clone()),
            PendingRequest {
                requester: Side::Xagent,
                request_id: request_id.clone(),
                packet_id: packet.packet_id.clone(),
                packet_type: "connector.hello",
                ack_type: "connector.hello.ack",
                channel: None,
            },
        );
        self.hello = HelloState::InProgress {
            request_id,
            requested_connector_id: requested_connector_id.clone(),
            peer_version: version,
            negotiated: negotiated.clone(),
        };
        Ok(Accepted::Hello { version, negotiated, requested_connector_id })
    }

    fn on_hello_ack(
        &mut self,
        packet: &Packet,
        ack: Option<&ConnectorHelloAck>,
    ) -> Result<Accepted, Rejection> {
        let HelloState::InProgress { request_id, peer_version, negotiated, requested_connector_id } =
            &self.hello
        else {
            return Err(hello_required("connector.hello.ack"));
        };
        if packet.request_id.as_ref() != Some(request_id) {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "connector.hello.ack must echo the hello's request_id",
            ));
        }
        let key = (Side::Xagent, request_id.clone());
        if let Some(reply_to) = &packet.reply_to
            && self.requests.get(&key).is_some_and(|r| &r.packet_id != reply_to)
        {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "reply_to must be the packet_id of the connector.hello",
            ));
        }
        if packet.error.is_some() {
            let request = self.requests.remove(&key);
            self.hello = HelloState::Awaiting;
            return Ok(Accepted::Error(request));
        }
        let Some(ack) = ack else {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "connector.hello.ack needs a payload with connector_card_id and connector_id",
            ));
        };
        let version = match self.side {
            // xAgent admits the Connector by its window.
            Side::Xagent => self.window.admit(ack.protocol_version.as_deref()),
            // The Connector answers with its own version, which must be the one it implements.
            Side::Connector => ProtocolVersion::from_wire(ack.protocol_version.as_deref())
                .and_then(|v| {
                    if v == self.window.current {
                        Ok(v)
                    } else {
                        Err(crate::version::VersionError::NotAdmitted {
                            version: v,
                            accepted: format!("exactly {}", self.window.current),
                        })
                    }
                }),
        }
        .map_err(|e| Rejection::close(e.code(), e.to_string()))?;
        if ack.connector_card_id != self.card_id {
            return Err(Rejection::close(
                ErrorCode::ConnectorCardIdMismatch,
                format!(
                    "hello.ack names connector_card_id {:?} but the Card is {:?}",
                    ack.connector_card_id.as_str(),
                    self.card_id.as_str()
                ),
            ));
        }
        if ack.connector_id.is_empty() {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "connector.hello.ack must carry a non-empty connector_id",
            ));
        }
        let established = Established {
            connector_id: ack.connector_id.clone(),
            // On the Connector side the peer is xAgent, whose version came with the hello.
            peer_version: if self.side == Side::Xagent { version } else { *peer_version },
            negotiated: negotiated.clone(),
            requested_connector_id: requested_connector_id.clone(),
        };
        self.requests.remove(&key);
        self.hello = HelloState::Established(established.clone());
        Ok(Accepted::Established(established))
    }

    /// Checks that a Descriptor describes this Connector, runtime and channel.
    fn check_descriptor(
        &self,
        channel: &ConnectorChannelId,
        descriptor: &ConnectionDescriptor,
    ) -> Result<(), Rejection> {
        let connection = &descriptor.connection;
        if connection.connector_card_id != self.card_id {
            return Err(Rejection::reply(
                ErrorCode::ConnectorChannelConnectorMismatch,
                "the Descriptor's connector_card_id is not this Connector's Card id",
            ));
        }
        if let Some(connector_id) = self.connector_id()
            && &connection.connector_id != connector_id
        {
            return Err(Rejection::reply(
                ErrorCode::ConnectorIdMismatch,
                "the Descriptor's connector_id is not the one returned by connector.hello.ack",
            ));
        }
        if &connection.connector_channel_id != channel {
            return Err(Rejection::reply(
                ErrorCode::InvalidPacket,
                "the Descriptor's connector_channel_id must equal the envelope connector_channel_id",
            ));
        }
        Ok(())
    }

    /// The Profiles a channel with `descriptor` has, as the shared value for that set.
    fn profiles_for(&mut self, descriptor: &ConnectionDescriptor) -> ChannelProfiles {
        let profiles = self
            .negotiated()
            .map(|n| n.for_channel(&descriptor.connection.profiles))
            .unwrap_or_default();
        if let Some(shared) = self.profile_sets.iter().find(|known| **known == profiles) {
            return shared.clone();
        }
        // Distinct sets are subsets of the negotiated Profiles: a handful at most.
        self.profile_sets.push(profiles.clone());
        profiles
    }

    fn refresh_profiles(
        &mut self,
        channel: &ConnectorChannelId,
        descriptor: &ConnectionDescriptor,
    ) {
        if !self.channels.contains_key(channel) {
            return;
        }
        let profiles = self.profiles_for(descriptor);
        if let Some(open) = self.channels.get_mut(channel)
            && !open.ptr_eq(&profiles)
        {
            *open = profiles;
        }
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
