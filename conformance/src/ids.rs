//! Ids the suite mints for its packets and calls: random, prefixed for humans, in the
//! project's one id format ([`xagent_protocol_types::mint_prefixed`]).

/// A random id with a prefix, e.g. `pkt_4f1c...`.
pub(crate) fn mint(prefix: &str) -> String {
    xagent_protocol_types::mint_prefixed(prefix, rand::random())
}
