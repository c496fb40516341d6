//! The identifiers this runtime mints, through the one minting helper of `protocol-types`
//! ([`IdKind::mint`]): the formats live there, the randomness (128 bits) comes from here.

use xagent_protocol_types::{AuthSessionId, ConnectorChannelId, ConnectorId, IdKind, PacketId};

/// A fresh `packet_id` (`pkt_...`).
pub fn packet_id() -> PacketId {
    PacketId::new(IdKind::Packet.mint(rand::random()))
}

/// A fresh `connector_channel_id` (`cch_...`).
pub fn channel_id() -> ConnectorChannelId {
    ConnectorChannelId::new(IdKind::Channel.mint(rand::random()))
}

/// A fresh `auth_session_id` (`auth_...`).
pub fn auth_session_id() -> AuthSessionId {
    AuthSessionId::new(IdKind::AuthSession.mint(rand::random()))
}

/// A fresh `connector_id` (`conn_<card id>_...`).
pub fn connector_id(card_id: &str) -> ConnectorId {
    ConnectorId::new(IdKind::Connector { card_id }.mint(rand::random()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_ids_are_the_shared_formats() {
        assert!(IdKind::Packet.is_minted(packet_id().as_str()));
        assert!(IdKind::Channel.is_minted(channel_id().as_str()));
        assert!(IdKind::AuthSession.is_minted(auth_session_id().as_str()));
        let card_id = "im.echo_test";
        let id = connector_id(card_id);
        assert!(IdKind::Connector { card_id }.is_minted(id.as_str()), "{id}");
        assert_ne!(packet_id(), packet_id());
    }
}
