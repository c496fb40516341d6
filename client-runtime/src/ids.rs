//! Identifiers this side mints: opaque, random (128 bits), prefixed for humans.

/// A random id with a prefix, e.g. `pkt_4f1c...`.
pub fn mint(prefix: &str) -> String {
    format!("{prefix}{:032x}", rand::random::<u128>())
}
