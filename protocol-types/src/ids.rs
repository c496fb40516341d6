//! Opaque identifiers as distinct types, so a channel id can never be passed where a packet id
//! is expected. None of them is a credential.

id_newtype!(
    /// `packet_id`: one transmission of one packet.
    PacketId
);
id_newtype!(
    /// `request_id`: chosen by the requester and echoed unchanged by the ack.
    RequestId
);
id_newtype!(
    /// `connector_channel_id`: the user-level channel, assigned by the Connector.
    ConnectorChannelId
);
id_newtype!(
    /// `connector_id`: the Connector Server runtime instance, issued in `connector.hello.ack`.
    ConnectorId
);
id_newtype!(
    /// `connector_card_id`: the stable identity of a Connector implementation (e.g. `im.wechat`).
    ConnectorCardId
);
id_newtype!(
    /// `auth_session_id`: one authentication attempt.
    AuthSessionId
);
id_newtype!(
    /// `flow_id` / `auth_flows[].id`: an authentication flow declared in the Card.
    FlowId
);
id_newtype!(
    /// `file_ref`: a Connector-internal file key bound to one channel.
    FileRef
);
id_newtype!(
    /// `message_id`: the business idempotency key of an IM message within a channel.
    MessageId
);
id_newtype!(
    /// `tool_id`: a Tool declared in the Card; also the model function name.
    ToolId
);
id_newtype!(
    /// `context.tool_call_id`: xAgent's correlation id for one model Tool call.
    ToolCallId
);
id_newtype!(
    /// A Profile id such as `xagent.im.v2`.
    ProfileId
);
id_newtype!(
    /// A Skill name such as `connector-im-wechat`.
    SkillId
);

/// Random bytes behind every identifier this project mints (128 bits; the notes ask for at
/// least 96).
pub const ID_ENTROPY_BYTES: usize = 16;

/// The kinds of identifier a side mints, each with its human prefix. The one home of the
/// minting format: `<prefix><32 lowercase hex digits>`.
///
/// This crate does no I/O, so the caller supplies the random bytes (e.g.
/// `rand::random::<[u8; 16]>()`): the format lives here, the entropy source with the caller,
/// and tests can mint deterministic ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdKind<'a> {
    /// `packet_id`: `pkt_...`.
    Packet,
    /// `request_id`: `req_...`.
    Request,
    /// `connector_channel_id`: `cch_...`.
    Channel,
    /// `auth_session_id`: `auth_...`.
    AuthSession,
    /// `file_ref`: `file_...`.
    File,
    /// `connector_id`: `conn_<card id, every non-alphanumeric ASCII character as _>_...`.
    Connector {
        /// The Card id the runtime serves.
        card_id: &'a str,
    },
}

impl IdKind<'_> {
    /// The fixed prefix of this kind (for a connector id, `conn_` only; the card part follows).
    pub fn prefix(&self) -> &'static str {
        match self {
            Self::Packet => "pkt_",
            Self::Request => "req_",
            Self::Channel => "cch_",
            Self::AuthSession => "auth_",
            Self::File => "file_",
            Self::Connector { .. } => "conn_",
        }
    }

    /// Mints an id of this kind from caller-supplied random bytes.
    pub fn mint(&self, entropy: [u8; ID_ENTROPY_BYTES]) -> String {
        mint_id(*self, entropy)
    }

    /// True when `value` has exactly the shape [`mint_id`] gives this kind, so a value read
    /// back from a file or a peer can be trusted to be one of ours before it is used as a key
    /// or a path component.
    pub fn is_minted(&self, value: &str) -> bool {
        let Some(rest) = value.strip_prefix(self.prefix()) else { return false };
        let rest = match self {
            Self::Connector { card_id } => {
                let card = connector_card_part(card_id);
                match rest.strip_prefix(card.as_str()).and_then(|r| r.strip_prefix('_')) {
                    Some(r) => r,
                    None => return false,
                }
            }
            _ => rest,
        };
        rest.len() == ID_ENTROPY_BYTES * 2
            && rest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }
}

fn connector_card_part(card_id: &str) -> String {
    card_id.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// Mints an identifier: the kind's prefix (plus the mapped card id for a connector id) and the
/// entropy as 32 lowercase hex digits. See [`IdKind`] for why the randomness comes from the
/// caller.
///
/// ```
/// use xagent_protocol_types::{IdKind, mint_id};
/// assert_eq!(mint_id(IdKind::Packet, [0xab; 16]), format!("pkt_{}", "ab".repeat(16)));
/// let conn = mint_id(IdKind::Connector { card_id: "im.echo_x" }, [0; 16]);
/// assert!(conn.starts_with("conn_im_echo_x_"));
/// ```
pub fn mint_id(kind: IdKind<'_>, entropy: [u8; ID_ENTROPY_BYTES]) -> String {
    match kind {
        IdKind::Connector { card_id } => {
            mint_prefixed(&format!("conn_{}_", connector_card_part(card_id)), entropy)
        }
        _ => mint_prefixed(kind.prefix(), entropy),
    }
}

/// The general form behind [`mint_id`], for ids the protocol leaves to the minting side
/// (`request_id`s with a test's prefix, `message_id`s): `prefix` followed by the entropy as 32
/// lowercase hex digits.
pub fn mint_prefixed(prefix: &str, entropy: [u8; ID_ENTROPY_BYTES]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(prefix.len() + ID_ENTROPY_BYTES * 2);
    out.push_str(prefix);
    for byte in entropy {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod mint_tests {
    use super::*;

    #[test]
    fn every_kind_has_its_prefix_and_128_bits() {
        let entropy = [0x5a; ID_ENTROPY_BYTES];
        for (kind, prefix) in [
            (IdKind::Packet, "pkt_"),
            (IdKind::Request, "req_"),
            (IdKind::Channel, "cch_"),
            (IdKind::AuthSession, "auth_"),
            (IdKind::File, "file_"),
        ] {
            let id = kind.mint(entropy);
            assert_eq!(id, format!("{prefix}{}", "5a".repeat(16)));
            assert!(kind.is_minted(&id), "{id}");
        }
    }

    #[test]
    fn connector_ids_map_every_non_alphanumeric_to_underscore() {
        let kind = IdKind::Connector { card_id: "im.echo_test-x" };
        let id = kind.mint([1; ID_ENTROPY_BYTES]);
        assert_eq!(id, format!("conn_im_echo_test_x_{}", "01".repeat(16)));
        assert!(kind.is_minted(&id));
        assert!(!IdKind::Connector { card_id: "other" }.is_minted(&id));
    }

    #[test]
    fn odd_values_are_not_minted_ids() {
        // Each case is one change away from a minted id: a recogniser that accepted it would
        // let a stored name be turned into a path outside its directory.
        let good = IdKind::File.mint([0x0f; ID_ENTROPY_BYTES]);
        assert!(IdKind::File.is_minted(&good));
        let hex = &good["file_".len()..];
        for bad in [
            String::new(),
            String::from("file_"),
            String::from("../etc/passwd"),
            format!("file_../../{}", &hex[..26]),
            good.to_uppercase().replacen("FILE_", "file_", 1),
            good[..good.len() - 1].to_owned(),
            format!("{good}0"),
            format!("pkt_{hex}"),
        ] {
            assert!(!IdKind::File.is_minted(&bad), "{bad}");
        }
    }
}
