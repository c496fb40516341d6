//! The hello exchange and the Descriptors that set a channel's Profiles.

use xagent_protocol_types::{
    ConnectionDescriptor, ConnectorChannelId, ConnectorHello, ConnectorHelloAck, ErrorCode, Packet,
    PacketBody, Side,
};

use crate::catalog::{ChannelProfiles, Negotiated};
use crate::version::ProtocolVersion;

use super::*;

impl Session {
    pub(super) fn before_hello(
        &mut self,
        sender: Side,
        packet: &Packet,
    ) -> Result<Accepted, Rejection> {
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

    pub(super) fn on_hello(
        &mut self,
        packet: &Packet,
        hello: &ConnectorHello,
    ) -> Result<Accepted, Rejection> {
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

    pub(super) fn on_hello_ack(
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
    pub(super) fn check_descriptor(
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
    pub(super) fn profiles_for(&mut self, descriptor: &ConnectionDescriptor) -> ChannelProfiles {
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

    pub(super) fn refresh_profiles(
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
