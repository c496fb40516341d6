//! Requests, acks, messages and errors once the connection is established: each ack paired
//! with what it answers, each packet checked against the open channels.

use xagent_protocol_types::{
    ChatMessage, ChatMessageAck, ConnectorChannelId, ErrorCode, Packet, PacketBody, PacketSpec,
    RequestId, Role, Routing, Side,
};

use crate::catalog::Permission;

use super::*;

impl Session {
    pub(super) fn established_step(
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

    pub(super) fn check_open(
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

    pub(super) fn on_request(
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

    pub(super) fn on_ack(
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

    pub(super) fn take_request(
        &mut self,
        key: &(Side, RequestId),
    ) -> Result<PendingRequest, Rejection> {
        self.requests.remove(key).ok_or_else(|| {
            Rejection::ignore(ErrorCode::InvalidPacket, "no request is waiting for this ack")
        })
    }

    pub(super) fn on_message(
        &mut self,
        sender: Side,
        packet: &Packet,
    ) -> Result<Accepted, Rejection> {
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

    pub(super) fn on_message_ack(
        &mut self,
        sender: Side,
        packet: &Packet,
    ) -> Result<Accepted, Rejection> {
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

    pub(super) fn on_error(&mut self, sender: Side, packet: &Packet) -> Accepted {
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
}
