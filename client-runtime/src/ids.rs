//! Identifiers this side mints: opaque, random (128 bits), prefixed for humans. The format is
//! the project's one id helper ([`xagent_protocol_types::mint_prefixed`]); this side supplies
//! the randomness.

/// A random id with a prefix, e.g. `pkt_4f1c...`.
pub fn mint(prefix: &str) -> String {
    xagent_protocol_types::mint_prefixed(prefix, rand::random())
}
