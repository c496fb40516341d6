//! Identifiers this runtime mints: opaque, 128 random bits, with a human prefix.

use xagent_protocol_types::{AuthSessionId, ConnectorChannelId, ConnectorId, PacketId};

fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// A fresh `packet_id` (`pkt_...`).
pub fn packet_id() -> PacketId {
    PacketId::new(format!("pkt_{}", random_hex()))
}

/// A fresh `connector_channel_id` (`cch_...`).
pub fn channel_id() -> ConnectorChannelId {
    ConnectorChannelId::new(format!("cch_{}", random_hex()))
}

/// A fresh `auth_session_id` (`auth_...`).
pub fn auth_session_id() -> AuthSessionId {
    AuthSessionId::new(format!("auth_{}", random_hex()))
}

/// A fresh `connector_id`: `conn_<card id with every character other than ASCII letters and
/// digits as _>_<random>`, e.g. `conn_im_echo_3f...`.
pub fn connector_id(card_id: &str) -> ConnectorId {
    let card: String =
        card_id.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    ConnectorId::new(format!("conn_{card}_{}", random_hex()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_ids_have_prefix_and_128_random_bits() {
        let a = packet_id();
        let b = packet_id();
        assert!(a.as_str().starts_with("pkt_"));
        assert_eq!(a.as_str().len(), 4 + 32);
        assert_ne!(a, b);
        assert!(channel_id().as_str().starts_with("cch_"));
        assert!(auth_session_id().as_str().starts_with("auth_"));
    }

    #[test]
    fn connector_id_maps_dots_and_underscores() {
        let id = connector_id("im.echo_test");
        assert!(id.as_str().starts_with("conn_im_echo_test_"), "{id}");
    }
}
