//! Media results (screenshots, recordings, device files) leave the device only as a `file_ref`
//! with a download URL from the Transfer Plane, never as bytes in a packet.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use xagent_protocol_types::{ConnectorChannelId, FileRef, FileType, ToolId};

use crate::DeviceError;
use crate::tools::Confirmation;

/// Field names that would carry bytes in a Tool result.
pub const FORBIDDEN_MEDIA_FIELDS: &[&str] =
    &["bytes", "base64", "data", "image_data", "content_base64", "file_bytes", "local_path"];

/// Longest string accepted in a result that looks like base64 (longer ones are refused as
/// smuggled bytes).
pub const MAX_BASE64_LIKE_LEN: usize = 4096;

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

fn looks_like_base64(s: &str) -> bool {
    s.len() > MAX_BASE64_LIKE_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'\n' | b'\r'))
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
                if lower.as_deref() == Some("data:") || looks_like_base64(s) {
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

/// One-shot confirmations of high-risk Tools, granted by the user out of band (a prompt on
/// the device, an approval page) and consumed by the next call of that Tool on that channel.
#[derive(Debug)]
pub struct ConfirmationLedger {
    ttl_ms: u64,
    grants: BTreeMap<(ConnectorChannelId, ToolId), u64>,
}

impl ConfirmationLedger {
    /// A ledger whose grants last `ttl_ms`.
    pub fn new(ttl_ms: u64) -> Self {
        Self { ttl_ms, grants: BTreeMap::new() }
    }

    /// The user confirmed the next call of `tool` on `channel`.
    pub fn grant(&mut self, channel: &ConnectorChannelId, tool: &ToolId, now: u64) {
        self.grants.insert((channel.clone(), tool.clone()), now.saturating_add(self.ttl_ms));
    }

    /// Consumes a live grant, if any.
    pub fn take(&mut self, channel: &ConnectorChannelId, tool: &ToolId, now: u64) -> Confirmation {
        match self.grants.remove(&(channel.clone(), tool.clone())) {
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
        assert!(check_result(&json!({"blob": "A".repeat(MAX_BASE64_LIKE_LEN + 1)})).is_err());
        check_result(&json!({"text": "a normal reply with spaces", "n": 3})).unwrap();
    }

    #[test]
    fn confirmation_grant_is_one_shot_and_expires() {
        let mut l = ConfirmationLedger::new(1_000);
        let (c, t) = (ConnectorChannelId::new("c"), ToolId::new("factory_reset"));
        assert_eq!(l.take(&c, &t, 0), Confirmation::None);
        l.grant(&c, &t, 0);
        assert_eq!(l.take(&c, &ToolId::new("other"), 1), Confirmation::None);
        assert_eq!(l.take(&c, &t, 1), Confirmation::Confirmed);
        assert_eq!(l.take(&c, &t, 2), Confirmation::None, "one shot");
        l.grant(&c, &t, 0);
        assert_eq!(l.take(&c, &t, 1_000), Confirmation::None, "expired");
    }
}
