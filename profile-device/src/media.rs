//! Media results (screenshots, recordings, device files) leave the device only as a `file_ref`
//! with a download URL from the Transfer Plane, never as bytes in a packet.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use xagent_protocol_types::{ConnectorChannelId, FileRef, FileType, ToolId};

use crate::DeviceError;
use crate::tools::Confirmation;

/// Field names that would carry bytes in a Tool result.
pub const FORBIDDEN_MEDIA_FIELDS: &[&str] =
    &["bytes", "base64", "data", "image_data", "content_base64", "file_bytes", "local_path"];

/// Longest base64 string accepted in a result without a look inside: a longer one is refused
/// as smuggled bytes when it decodes to a known media or archive format
/// ([`MEDIA_SIGNATURES`]). Long text that merely uses base64's alphabet (a device's property
/// value, an id, a hash) passes.
pub const MAX_BASE64_LIKE_LEN: usize = 4096;

/// File signatures (leading bytes, with their offset) of the media and archive formats a
/// base64 string in a result is refused for.
pub const MEDIA_SIGNATURES: &[(usize, &[u8])] = &[
    (0, b"\x89PNG\r\n\x1a\n"),
    (0, &[0xff, 0xd8, 0xff]),
    (0, b"GIF87a"),
    (0, b"GIF89a"),
    (0, b"RIFF"),
    (0, b"%PDF-"),
    (4, b"ftyp"),
    (0, b"PK\x03\x04"),
    (0, &[0x1f, 0x8b]),
    (0, b"OggS"),
    (0, b"ID3"),
    (0, b"fLaC"),
    (0, &[0x1a, 0x45, 0xdf, 0xa3]),
    (0, b"II*\0"),
    (0, b"MM\0*"),
];

/// A media result: the reference returned by the Transfer Plane after upload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaResult {
    /// Kind of media.
    pub file_type: FileType,
    /// The Transfer Plane reference, bound to the channel.
    pub file_ref: FileRef,
    /// Where xAgent downloads it (absolute HTTP(S) or relative `/files/refs/...`).
    pub download_url: String,
    /// MIME type.
    pub mime_type: Option<String>,
    /// Size in bytes.
    pub byte_size: Option<u64>,
    /// Expiry of the reference (Unix ms).
    pub expires_at: Option<u64>,
}

impl MediaResult {
    /// A media result; refuses a `data:`/`file:` URL (bytes or local paths).
    pub fn new(
        file_type: FileType,
        file_ref: impl Into<FileRef>,
        download_url: impl Into<String>,
    ) -> Result<Self, DeviceError> {
        let download_url = download_url.into();
        let lower = download_url.trim().to_ascii_lowercase();
        let ok =
            lower.starts_with("https://") || lower.starts_with("http://") || lower.starts_with('/');
        if !ok || lower.starts_with("//") {
            return Err(DeviceError::MediaBytesForbidden("download_url".into()));
        }
        let file_ref = file_ref.into();
        if file_ref.is_empty() {
            return Err(DeviceError::MediaBytesForbidden("file_ref".into()));
        }
        Ok(Self {
            file_type,
            file_ref,
            download_url,
            mime_type: None,
            byte_size: None,
            expires_at: None,
        })
    }

    /// Sets MIME type, size and expiry.
    #[must_use]
    pub fn with_meta(
        mut self,
        mime_type: impl Into<String>,
        byte_size: u64,
        expires_at: u64,
    ) -> Self {
        self.mime_type = Some(mime_type.into());
        self.byte_size = Some(byte_size);
        self.expires_at = Some(expires_at);
        self
    }

    /// The JSON placed in `tool.invoke.ack.result`.
    pub fn to_value(&self) -> Value {
        let mut v = json!({
            "type": self.file_type.as_str(),
            "file_ref": self.file_ref.as_str(),
            "download_url": self.download_url,
        });
        if let Some(m) = &self.mime_type {
            v["mime_type"] = json!(m);
        }
        if let Some(s) = self.byte_size {
            v["byte_size"] = json!(s);
        }
        if let Some(e) = self.expires_at {
            v["expires_at"] = json!(e);
        }
        v
    }
}

/// True when `s` is a long base64 string (standard or URL-safe alphabet, line breaks allowed)
/// whose decoded bytes start like a media or archive file: the one home of the "media bytes
/// in a result" heuristic.
fn looks_like_base64_media(s: &str) -> bool {
    if s.len() <= MAX_BASE64_LIKE_LEN
        || !s.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(b, b'+' | b'/' | b'-' | b'_' | b'=' | b'\n' | b'\r')
        })
    {
        return false;
    }
    // The first 32 characters decode to 24 bytes: enough for every signature.
    let head: String =
        s.bytes().filter(|b| !matches!(b, b'\n' | b'\r')).take(32).map(char::from).collect();
    let engine = if head.bytes().any(|b| matches!(b, b'-' | b'_')) {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
    } else {
        base64::engine::general_purpose::STANDARD_NO_PAD
    };
    let Ok(bytes) = base64::Engine::decode(&engine, head.trim_end_matches('=')) else {
        return false;
    };
    MEDIA_SIGNATURES.iter().any(|(at, sig)| bytes.get(*at..).is_some_and(|b| b.starts_with(sig)))
}

/// Checks a Tool result before it is sent: no byte-carrying field names, no `data:` URLs, no
/// long base64-looking strings, anywhere in the value. The error names the JSON pointer.
pub fn check_result(value: &Value) -> Result<(), DeviceError> {
    fn walk(value: &Value, path: &mut String) -> Result<(), DeviceError> {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    let len = path.len();
                    path.push('/');
                    path.push_str(k);
                    if FORBIDDEN_MEDIA_FIELDS.contains(&k.to_ascii_lowercase().as_str()) {
                        return Err(DeviceError::MediaBytesForbidden(path.clone()));
                    }
                    walk(v, path)?;
                    path.truncate(len);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    let len = path.len();
                    path.push('/');
                    path.push_str(&i.to_string());
                    walk(v, path)?;
                    path.truncate(len);
                }
            }
            Value::String(s) => {
                let lower = s.get(..5).map(str::to_ascii_lowercase);
                if lower.as_deref() == Some("data:") || looks_like_base64_media(s) {
                    return Err(DeviceError::MediaBytesForbidden(path.clone()));
                }
            }
            _ => {}
        }
        Ok(())
    }
    walk(value, &mut String::new())
}

/// Default lifetime of a confirmation grant: 5 minutes.
pub const DEFAULT_CONFIRMATION_TTL_MS: u64 = 5 * 60 * 1000;

/// Most grants waiting on one channel (a Connector granting in a loop cannot grow the ledger).
pub const MAX_GRANTS_PER_CHANNEL: usize = 64;

/// What a grant is bound to: the fingerprint of the arguments (SHA-256 of their canonical
/// JSON, the runtime's one definition of "the same arguments", the one repeated calls use),
/// without the channel argument the runtime removes before a call is admitted. A grant thus
/// confirms exactly one call's arguments, whatever the order of their keys.
pub fn arguments_digest(arguments: &Map<String, Value>) -> String {
    let mut arguments = arguments.clone();
    arguments.remove(xagent_protocol_types::CHANNEL_ARGUMENT);
    xagent_profile_im::Fingerprint::of_value(&Value::Object(arguments)).as_str().to_owned()
}

/// One-shot confirmations of high-risk Tools, granted by the user out of band (a prompt on
/// the device, an approval page) for one call's exact arguments, and consumed by the next call
/// of that Tool on that channel with those arguments. A call with other arguments finds no
/// grant.
#[derive(Debug)]
pub struct ConfirmationLedger {
    ttl_ms: u64,
    grants: BTreeMap<(ConnectorChannelId, ToolId, String), u64>,
}

impl ConfirmationLedger {
    /// A ledger whose grants last `ttl_ms`.
    pub fn new(ttl_ms: u64) -> Self {
        Self { ttl_ms, grants: BTreeMap::new() }
    }

    /// The user confirmed the call of `tool` on `channel` with these `arguments`. Past
    /// [`MAX_GRANTS_PER_CHANNEL`] live grants on the channel, the one expiring first goes.
    pub fn grant(
        &mut self,
        channel: &ConnectorChannelId,
        tool: &ToolId,
        arguments: &Map<String, Value>,
        now: u64,
    ) {
        self.prune(now);
        let on_channel: Vec<_> = self
            .grants
            .iter()
            .filter(|((c, _, _), _)| c == channel)
            .map(|(k, u)| (k.clone(), *u))
            .collect();
        if on_channel.len() >= MAX_GRANTS_PER_CHANNEL
            && let Some((oldest, _)) = on_channel.into_iter().min_by_key(|(_, until)| *until)
        {
            self.grants.remove(&oldest);
        }
        let key = (channel.clone(), tool.clone(), arguments_digest(arguments));
        self.grants.insert(key, now.saturating_add(self.ttl_ms));
    }

    /// Consumes a live grant for exactly these arguments, if any.
    pub fn take(
        &mut self,
        channel: &ConnectorChannelId,
        tool: &ToolId,
        arguments: &Map<String, Value>,
        now: u64,
    ) -> Confirmation {
        let key = (channel.clone(), tool.clone(), arguments_digest(arguments));
        match self.grants.remove(&key) {
            Some(until) if now < until => Confirmation::Confirmed,
            _ => Confirmation::None,
        }
    }

    /// Drops expired grants.
    pub fn prune(&mut self, now: u64) {
        self.grants.retain(|_, until| now < *until);
    }
}

impl Default for ConfirmationLedger {
    fn default() -> Self {
        Self::new(DEFAULT_CONFIRMATION_TTL_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::ErrorCode;

    #[test]
    fn media_result_is_a_reference() {
        let r = MediaResult::new(FileType::Image, "file_1", "/files/refs/file_1?exp=1&sig=ab")
            .unwrap()
            .with_meta("image/png", 10, 99);
        let v = r.to_value();
        assert_eq!(v["file_ref"], "file_1");
        assert_eq!(v["type"], "image");
        check_result(&v).unwrap();
    }

    #[test]
    fn rule_media_never_as_bytes() {
        for url in ["data:image/png;base64,AAAA", "file:///sdcard/x.png", "//cdn/x", ""] {
            let err = MediaResult::new(FileType::Image, "f", url).unwrap_err();
            assert_eq!(err.code(), ErrorCode::ToolInvokeFailed, "{url}");
        }
        let err = check_result(&json!({"screenshot": {"base64": "AAAA"}})).unwrap_err();
        assert_eq!(err, DeviceError::MediaBytesForbidden("/screenshot/base64".into()));
        assert!(check_result(&json!({"items": ["data:image/png;base64,AAAA"]})).is_err());
        // A PNG's bytes in base64, however long the rest: refused.
        let png = format!("iVBORw0KGgoAAAANSUhEUgAA{}", "A".repeat(MAX_BASE64_LIKE_LEN));
        assert!(check_result(&json!({"blob": png})).is_err());
        let jpeg = format!("/9j/4AAQSkZJRgABAQ{}", "A".repeat(MAX_BASE64_LIKE_LEN));
        assert!(check_result(&json!({"nested": [{"x": jpeg}]})).is_err());
        check_result(&json!({"text": "a normal reply with spaces", "n": 3})).unwrap();
    }

    #[test]
    fn long_property_value_is_not_media() {
        // A device's long value in base64's alphabet (a token, a hex dump, a repeated letter)
        // is text, not a picture.
        for value in [
            "A".repeat(MAX_BASE64_LIKE_LEN * 2),
            "abcdef0123456789".repeat(600),
            "xK9/Zq+3".repeat(1_000),
        ] {
            check_result(&json!({"nodes": [{"properties": [{"value": value}]}]})).unwrap();
        }
    }

    #[test]
    fn confirmation_grant_is_one_shot_and_expires() {
        let mut l = ConfirmationLedger::new(1_000);
        let (c, t) = (ConnectorChannelId::new("c"), ToolId::new("factory_reset"));
        let none = Map::new();
        assert_eq!(l.take(&c, &t, &none, 0), Confirmation::None);
        l.grant(&c, &t, &none, 0);
        assert_eq!(l.take(&c, &ToolId::new("other"), &none, 1), Confirmation::None);
        assert_eq!(l.take(&c, &t, &none, 1), Confirmation::Confirmed);
        assert_eq!(l.take(&c, &t, &none, 2), Confirmation::None, "one shot");
        l.grant(&c, &t, &none, 0);
        assert_eq!(l.take(&c, &t, &none, 1_000), Confirmation::None, "expired");
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn confirmation_grant_is_bound_to_its_arguments() {
        let mut l = ConfirmationLedger::new(60_000);
        let (c, t) = (ConnectorChannelId::new("c"), ToolId::new("unlock_door"));
        l.grant(&c, &t, &args(json!({"door": "front", "minutes": 1})), 0);
        // Another call of the same Tool is not confirmed by it.
        assert_eq!(
            l.take(&c, &t, &args(json!({"door": "back", "minutes": 1})), 1),
            Confirmation::None
        );
        assert_eq!(
            l.take(&c, &t, &args(json!({"door": "front", "minutes": 60})), 1),
            Confirmation::None
        );
        // The confirmed call is, whatever the order of its keys.
        assert_eq!(
            l.take(&c, &t, &args(json!({"minutes": 1, "door": "front"})), 2),
            Confirmation::Confirmed
        );
        assert_eq!(
            arguments_digest(&args(json!({"a": {"x": 1, "y": [1, 2]}, "b": "s"}))),
            arguments_digest(&args(json!({"b": "s", "a": {"y": [1, 2], "x": 1}})))
        );
        assert_ne!(
            arguments_digest(&args(json!({"a": [1, 2]}))),
            arguments_digest(&args(json!({"a": [2, 1]})))
        );
        // The channel argument is not part of what was confirmed.
        assert_eq!(
            arguments_digest(&args(json!({"door": "front", "connector_channel_id": "cch_1"}))),
            arguments_digest(&args(json!({"door": "front"})))
        );
    }

    #[test]
    fn grants_per_channel_are_bounded() {
        let mut l = ConfirmationLedger::new(60_000);
        let (c, t) = (ConnectorChannelId::new("c"), ToolId::new("t"));
        for i in 0..(MAX_GRANTS_PER_CHANNEL as u64 + 10) {
            l.grant(&c, &t, &args(json!({"i": i})), i);
        }
        assert_eq!(l.grants.len(), MAX_GRANTS_PER_CHANNEL);
        assert_eq!(l.take(&c, &t, &args(json!({"i": 0})), 100), Confirmation::None, "oldest went");
    }
}
