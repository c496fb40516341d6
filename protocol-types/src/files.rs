//! File items carried by IM messages. Only metadata and references: bytes travel through the
//! Transfer Plane, never through a packet.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Extra, FileRef, FileType};

/// Field names that would carry file bytes, base64 or a local path. No IM message or file item
/// may have one (files travel only as a `file_ref` through the Transfer Plane). The rule itself
/// lives in `xagent-protocol-validate` (module `im`); the list is here so the generated schemas
/// can state it too.
pub const FORBIDDEN_FILE_BYTE_FIELDS: &[&str] =
    &["bytes", "data", "base64", "content_base64", "file_bytes", "file_data", "local_path", "path"];

/// xAgent-internal identities no IM payload may carry (IM v2 §3).
pub const IM_FORBIDDEN_IDENTITY_FIELDS: &[&str] =
    &["session_id", "user_connector_id", "user_id", "connector_id", "role"];

/// ECMA-262 pattern of an allowed `download_url`: `http`/`https` (any case) or scheme-less (a
/// relative Connector URI), not starting with a backslash, no whitespace or control
/// characters. The schema form of `xagent_protocol_validate::im::download_url_allowed`, which
/// a test keeps in agreement with it. Written without look-around so every regex engine reads it.
pub const DOWNLOAD_URL_PATTERN: &str = concat!(
    r"^(?:[Hh][Tt][Tt][Pp][Ss]?:[^\s\u0000-\u001f\u007f-\u009f\ufeff]*",
    r"|[^A-Za-z\\\s\u0000-\u001f\u007f-\u009f\ufeff][^\s\u0000-\u001f\u007f-\u009f\ufeff]*",
    r"|[A-Za-z][A-Za-z0-9+.\-]*(?:[^A-Za-z0-9+.\-:\s\u0000-\u001f\u007f-\u009f\ufeff][^\s\u0000-\u001f\u007f-\u009f\ufeff]*)?)$"
);

/// Schema transform of a file item: the `download_url` pattern and no byte-carrying fields.
fn file_item_rules(schema: &mut schemars::Schema) {
    if let Some(properties) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for key in ["download_url", "url"] {
            if let Some(url) = properties.get_mut(key).and_then(|u| u.as_object_mut()) {
                url.insert("pattern".into(), DOWNLOAD_URL_PATTERN.into());
            }
        }
        for name in FORBIDDEN_FILE_BYTE_FIELDS {
            properties.insert((*name).into(), serde_json::Value::Bool(false));
        }
    }
}

/// `chat.message.files[]` (IM v2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = file_item_rules)]
#[non_exhaustive]
pub struct ChatFile {
    /// `image`, `video`, `audio` or `file`.
    #[serde(rename = "type")]
    pub file_type: FileType,
    /// Reference unique within the message.
    #[schemars(length(min = 1))]
    pub file_ref: FileRef,
    /// File name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub byte_size: Option<u64>,
    /// Expiry of the reference (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// Where xAgent downloads it (required Connector -> xAgent; absolute or relative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_url: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatFile {
    /// A file item with its type and reference.
    pub fn new(file_type: FileType, file_ref: impl Into<FileRef>) -> Self {
        Self {
            file_type,
            file_ref: file_ref.into(),
            filename: None,
            mime_type: None,
            byte_size: None,
            expires_at: None,
            download_url: None,
            extra: Extra::new(),
        }
    }

    setters! {
        /// Sets the file name.
        with_filename(filename: into String);
        /// Sets the MIME type.
        with_mime_type(mime_type: into String);
        /// Sets the size.
        with_byte_size(byte_size: u64);
        /// Sets the expiry.
        with_expires_at(expires_at: u64);
        /// Sets the download URL.
        with_download_url(download_url: into String);
    }
}

/// `message.push.files[]` (IM v1): like [`ChatFile`], with `type` optional and `url` accepted as
/// an alternative to `download_url`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = file_item_rules)]
#[non_exhaustive]
pub struct PushFile {
    /// Kind of file.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub file_type: Option<FileType>,
    /// Reference.
    #[schemars(length(min = 1))]
    pub file_ref: FileRef,
    /// File name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub byte_size: Option<u64>,
    /// Expiry (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// Download URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_url: Option<String>,
    /// Alternative download URL field of older Connectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl From<ChatFile> for PushFile {
    fn from(file: ChatFile) -> Self {
        Self {
            file_type: Some(file.file_type),
            file_ref: file.file_ref,
            filename: file.filename,
            mime_type: file.mime_type,
            byte_size: file.byte_size,
            expires_at: file.expires_at,
            download_url: file.download_url,
            url: None,
            extra: file.extra,
        }
    }
}
