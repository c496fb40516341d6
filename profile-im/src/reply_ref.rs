//! Opaque reply references (IM v1 §4, §6): how a reply Tool names the message it answers
//! without the model ever seeing, or being able to forge, a target-system id.
//!
//! A Connector that pushes a message seals the platform reference it needs to answer it (the
//! platform's message id, a thread handle, ...) into a `reply_ref` with [`ReplyRefKey::seal`],
//! and puts it in the push's `reply` hint ([`ReplyRefKey::reply_hint`]). The model copies the
//! string into the reply Tool's arguments; the Tool opens it with [`ReplyRefKey::open`] for
//! the channel and Tool of the call. A reference:
//!
//! - is opaque: the platform reference is encrypted, so the text shows no chat, contact or
//!   message id;
//! - is valid only for the channel and the Tool it was sealed for: both are authenticated with
//!   it, so a reference copied to another channel or handed to another Tool is refused;
//! - expires: the expiry (the message's own, typically) is authenticated too, so a reference
//!   outlives neither its message nor the temporary reply target;
//! - needs no state: any replica holding the key opens it, and nothing has to be cleaned up.
//!
//! The construction uses HMAC-SHA256 only, as a PRF: the synthetic IV is the HMAC (under a
//! MAC key) of the channel, the Tool, the expiry and the platform reference, truncated to 16
//! bytes; the reference is encrypted with the keystream HMAC(encryption key, IV || counter);
//! opening decrypts and recomputes the IV in constant time. Both keys are derived from the
//! Connector's secret with domain separation. Sealing the same inputs twice gives the same
//! string (the IV is deterministic), which reveals only that two references are equal.
//!
//! ```
//! use xagent_profile_im::{ReplyRefError, ReplyRefKey};
//! use xagent_protocol_types::{ConnectorChannelId, ToolId};
//!
//! let key = ReplyRefKey::new(b"a secret of at least sixteen bytes")?;
//! let channel = ConnectorChannelId::new("cch_1");
//! let reply = ToolId::new("telegram_message_reply");
//! let sealed = key.seal(&channel, &reply, "chat 42 / message 7", 2_000);
//! assert!(!sealed.contains("42"));
//! assert_eq!(key.open(&sealed, &channel, &reply, 1_000)?, "chat 42 / message 7");
//! let other = ConnectorChannelId::new("cch_2");
//! assert_eq!(key.open(&sealed, &other, &reply, 1_000), Err(ReplyRefError::Invalid));
//! assert_eq!(key.open(&sealed, &channel, &reply, 2_001), Err(ReplyRefError::Expired));
//! # Ok::<(), ReplyRefError>(())
//! ```

use hmac::{Hmac, Mac};
use sha2::Sha256;
use xagent_protocol_types::{ConnectorChannelId, ErrorCode, ReplyHint, ToolId};

type HmacSha256 = Hmac<Sha256>;

/// What every reply reference starts with (the format's version).
pub const REPLY_REF_PREFIX: &str = "rr1.";

/// Shortest accepted secret, in bytes.
pub const REPLY_REF_MIN_SECRET_BYTES: usize = 16;

/// Longest platform reference [`ReplyRefKey::seal`] accepts, in bytes: a reference is a
/// handle, not a message.
pub const REPLY_REF_MAX_TARGET_BYTES: usize = 1024;

/// Bytes of the synthetic IV (and authentication tag).
const IV_BYTES: usize = 16;

/// Domain separators of the two derived keys.
const ENCRYPTION_DOMAIN: &[u8] = b"xagent.profile-im.reply-ref.v1/encrypt";
const MAC_DOMAIN: &[u8] = b"xagent.profile-im.reply-ref.v1/mac";

/// Why a reply reference was refused. Each is a wrong Tool argument (`invalid_arguments`):
/// the model should reply with the reference the message gave, unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyRefError {
    /// The key was built from a secret shorter than [`REPLY_REF_MIN_SECRET_BYTES`].
    #[error("the reply_ref secret is too short; use at least 16 random bytes")]
    ShortSecret,
    /// The string is not a reply reference (wrong prefix, not hex, too short).
    #[error("reply_ref is malformed; copy it unchanged from the message being answered")]
    Malformed,
    /// The reference was altered, made with another key, or sealed for another channel or
    /// Tool.
    #[error("reply_ref does not belong to this channel and Tool; use the one the message gave")]
    Invalid,
    /// The reference is genuine but its message expired.
    #[error("reply_ref has expired; the message it answers can no longer be replied to")]
    Expired,
}

impl ReplyRefError {
    /// The wire code a Tool answers the refusal with: `invalid_arguments` for a reference the
    /// model passed, `internal_error` for a key the Connector misconfigured.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::ShortSecret => ErrorCode::InternalError,
            Self::Malformed | Self::Invalid | Self::Expired => ErrorCode::InvalidArguments,
        }
    }
}

/// Seals and opens reply references with keys derived from one Connector secret. Cheap to
/// clone; give every replica the same secret.
#[derive(Clone)]
pub struct ReplyRefKey {
    encryption: [u8; 32],
    mac: [u8; 32],
}

impl std::fmt::Debug for ReplyRefKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplyRefKey(<redacted>)")
    }
}

/// An HMAC-SHA256 state keyed with `key`.
fn keyed(key: &[u8]) -> HmacSha256 {
    match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        // HMAC takes a key of any length: `new_from_slice` never refuses one.
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    }
}

/// HMAC-SHA256 of `parts` under `key`.
fn mac_of(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = keyed(key);
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// A length-prefixed field, so no two different inputs authenticate the same bytes.
fn framed(field: &[u8]) -> [u8; 8] {
    (field.len() as u64).to_be_bytes()
}

impl ReplyRefKey {
    /// Keys derived from `secret` (at least [`REPLY_REF_MIN_SECRET_BYTES`] bytes).
    pub fn new(secret: &[u8]) -> Result<Self, ReplyRefError> {
        if secret.len() < REPLY_REF_MIN_SECRET_BYTES {
            return Err(ReplyRefError::ShortSecret);
        }
        Ok(Self {
            encryption: mac_of(secret, &[ENCRYPTION_DOMAIN]),
            mac: mac_of(secret, &[MAC_DOMAIN]),
        })
    }

    fn iv(
        &self,
        channel: &ConnectorChannelId,
        tool: &ToolId,
        expires_at: u64,
        target: &[u8],
    ) -> [u8; IV_BYTES] {
        let (channel, tool) = (channel.as_str().as_bytes(), tool.as_str().as_bytes());
        let full = mac_of(
            &self.mac,
            &[&framed(channel), channel, &framed(tool), tool, &expires_at.to_be_bytes(), target],
        );
        let mut iv = [0u8; IV_BYTES];
        iv.copy_from_slice(&full[..IV_BYTES]);
        iv
    }

    /// XORs `data` with the keystream of `iv`.
    fn apply_keystream(&self, iv: &[u8; IV_BYTES], data: &mut [u8]) {
        for (counter, chunk) in data.chunks_mut(32).enumerate() {
            let block = mac_of(&self.encryption, &[iv, &(counter as u64).to_be_bytes()]);
            for (byte, key) in chunk.iter_mut().zip(block) {
                *byte ^= key;
            }
        }
    }

    /// The opaque reference to `target` (the platform reference the reply Tool needs), valid
    /// for `channel` and `tool` until `expires_at` (Unix ms; use the message's expiry). A
    /// `target` longer than [`REPLY_REF_MAX_TARGET_BYTES`] is cut there (at a character
    /// boundary): a reference is a handle, keep it short.
    pub fn seal(
        &self,
        channel: &ConnectorChannelId,
        tool: &ToolId,
        target: &str,
        expires_at: u64,
    ) -> String {
        let mut end = target.len().min(REPLY_REF_MAX_TARGET_BYTES);
        while !target.is_char_boundary(end) {
            end -= 1;
        }
        let mut body = target.as_bytes()[..end].to_vec();
        let iv = self.iv(channel, tool, expires_at, &body);
        self.apply_keystream(&iv, &mut body);
        let mut bytes = Vec::with_capacity(8 + IV_BYTES + body.len());
        bytes.extend_from_slice(&expires_at.to_be_bytes());
        bytes.extend_from_slice(&iv);
        bytes.extend_from_slice(&body);
        format!("{REPLY_REF_PREFIX}{}", hex::encode(bytes))
    }

    /// The platform reference sealed in `reply_ref`, when it was sealed with this key for
    /// `channel` and `tool` and has not expired at `now` (Unix ms).
    pub fn open(
        &self,
        reply_ref: &str,
        channel: &ConnectorChannelId,
        tool: &ToolId,
        now: u64,
    ) -> Result<String, ReplyRefError> {
        let hex_part = reply_ref.strip_prefix(REPLY_REF_PREFIX).ok_or(ReplyRefError::Malformed)?;
        let bytes = hex::decode(hex_part).map_err(|_| ReplyRefError::Malformed)?;
        if bytes.len() < 8 + IV_BYTES {
            return Err(ReplyRefError::Malformed);
        }
        let (expiry, rest) = bytes.split_at(8);
        let (iv, body) = rest.split_at(IV_BYTES);
        let mut expiry_bytes = [0u8; 8];
        expiry_bytes.copy_from_slice(expiry);
        let expires_at = u64::from_be_bytes(expiry_bytes);
        let mut given = [0u8; IV_BYTES];
        given.copy_from_slice(iv);
        let mut target = body.to_vec();
        self.apply_keystream(&given, &mut target);
        let (channel_bytes, tool_bytes) = (channel.as_str().as_bytes(), tool.as_str().as_bytes());
        let mut check = keyed(&self.mac);
        for part in [
            &framed(channel_bytes)[..],
            channel_bytes,
            &framed(tool_bytes),
            tool_bytes,
            &expires_at.to_be_bytes(),
            &target,
        ] {
            check.update(part);
        }
        // Constant-time comparison of the recomputed IV's first bytes with the given one.
        check.verify_truncated_left(&given).map_err(|_| ReplyRefError::Invalid)?;
        if now > expires_at {
            return Err(ReplyRefError::Expired);
        }
        String::from_utf8(target).map_err(|_| ReplyRefError::Invalid)
    }

    /// A push's `reply` hint: the reply Tool and a reference to `target` sealed for `channel`
    /// and that Tool until `expires_at` ([`ReplyRefKey::seal`]).
    pub fn reply_hint(
        &self,
        channel: &ConnectorChannelId,
        tool: &ToolId,
        target: &str,
        expires_at: u64,
    ) -> ReplyHint {
        let mut hint = ReplyHint::default();
        hint.required = Some(true);
        hint.reply_ref = Some(self.seal(channel, tool, target, expires_at));
        hint.tool_id = Some(tool.clone());
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ReplyRefKey {
        ReplyRefKey::new(b"0123456789abcdef0123").unwrap()
    }

    fn ids() -> (ConnectorChannelId, ToolId) {
        (ConnectorChannelId::new("cch_1"), ToolId::new("im_message_reply"))
    }

    #[test]
    fn rule_reply_ref_round_trips_and_hides_the_target() {
        let (channel, tool) = ids();
        let target = "chat_id=-100123456789;message_id=42";
        let sealed = key().seal(&channel, &tool, target, 10);
        assert!(sealed.starts_with(REPLY_REF_PREFIX));
        for part in ["100123456789", "chat_id", "message_id"] {
            assert!(!sealed.contains(part), "{sealed} shows {part}");
            assert!(!sealed.contains(&hex::encode(part)), "{sealed} shows {part} in hex");
        }
        assert_eq!(key().open(&sealed, &channel, &tool, 10).unwrap(), target);
        // Deterministic: the same inputs seal to the same string (no state, any replica).
        assert_eq!(sealed, key().seal(&channel, &tool, target, 10));
    }

    #[test]
    fn rule_reply_ref_is_valid_only_for_its_channel_and_tool() {
        let (channel, tool) = ids();
        let sealed = key().seal(&channel, &tool, "m1", 10);
        let other_channel = ConnectorChannelId::new("cch_2");
        let other_tool = ToolId::new("im_message_send");
        assert_eq!(key().open(&sealed, &other_channel, &tool, 0), Err(ReplyRefError::Invalid));
        assert_eq!(key().open(&sealed, &channel, &other_tool, 0), Err(ReplyRefError::Invalid));
        let other_key = ReplyRefKey::new(b"another secret of enough bytes").unwrap();
        assert_eq!(other_key.open(&sealed, &channel, &tool, 0), Err(ReplyRefError::Invalid));
    }

    #[test]
    fn rule_reply_ref_refuses_tampering_and_expiry() {
        let (channel, tool) = ids();
        let sealed = key().seal(&channel, &tool, "m1", 10);
        // Flip one hex digit of the body, then of the expiry (moving it later).
        let mut body = sealed.clone().into_bytes();
        let last = body.len() - 1;
        body[last] = if body[last] == b'0' { b'1' } else { b'0' };
        let body = String::from_utf8(body).unwrap();
        assert_eq!(key().open(&body, &channel, &tool, 0), Err(ReplyRefError::Invalid));
        let later = format!(
            "{REPLY_REF_PREFIX}{}{}",
            "ff".repeat(8),
            &sealed[REPLY_REF_PREFIX.len() + 16..]
        );
        assert_eq!(key().open(&later, &channel, &tool, 0), Err(ReplyRefError::Invalid));
        assert_eq!(key().open(&sealed, &channel, &tool, 11), Err(ReplyRefError::Expired));
        for bad in ["", "rr1.", "rr1.zz", "m1", "rr1.00"] {
            assert_eq!(key().open(bad, &channel, &tool, 0), Err(ReplyRefError::Malformed), "{bad}");
        }
        assert_eq!(ReplyRefError::Invalid.code(), ErrorCode::InvalidArguments);
    }

    #[test]
    fn rule_reply_ref_secret_has_a_minimum_length() {
        assert_eq!(ReplyRefKey::new(b"short").map(|_| ()), Err(ReplyRefError::ShortSecret));
        assert_eq!(ReplyRefError::ShortSecret.code(), ErrorCode::InternalError);
    }

    #[test]
    fn reply_hint_names_the_tool_and_carries_the_sealed_reference() {
        let (channel, tool) = ids();
        let hint = key().reply_hint(&channel, &tool, "m1", 10);
        assert_eq!(hint.tool_id.as_ref(), Some(&tool));
        let sealed = hint.reply_ref.unwrap();
        assert_eq!(key().open(&sealed, &channel, &tool, 10).unwrap(), "m1");
    }
}
