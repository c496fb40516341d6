//! Bodies of the HTTP planes: `/health`, `/files/uploads`, and the JSON error body.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{BuildInfo, ConnectorCardId, Extra, FileRef, FileType, WireError};

/// `GET /health` success body. `protocol_version` and `build` must equal the Card's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct HealthResponse {
    /// `ok` when healthy.
    pub status: String,
    /// Card id; when present must equal the integrated Card's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector_card_id: Option<ConnectorCardId>,
    /// The Card's `connector.version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector_card_version: Option<String>,
    /// The Card's `protocol_version`.
    pub protocol_version: String,
    /// The Card's `build`.
    pub build: BuildInfo,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl HealthResponse {
    /// The health body that matches a Card exactly.
    pub fn for_card(card: &crate::ConnectorCard) -> Self {
        Self {
            status: "ok".into(),
            connector_card_id: Some(card.connector_card_id.clone()),
            connector_card_version: Some(card.connector.version.clone()),
            protocol_version: card.protocol_version.clone(),
            build: card.build.clone(),
            extra: Extra::new(),
        }
    }
}

/// `POST /files/uploads` success body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct UploadResponse {
    /// Opaque key, bound to the uploading channel.
    #[schemars(length(min = 1))]
    pub file_ref: FileRef,
    /// Kind of file.
    pub file_type: FileType,
    /// Original file name.
    pub filename: String,
    /// Size in bytes.
    pub byte_size: u64,
    /// When the reference expires (Unix ms).
    pub expires_at: u64,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl UploadResponse {
    /// All fields.
    pub fn new(
        file_ref: FileRef,
        file_type: FileType,
        filename: String,
        byte_size: u64,
        expires_at: u64,
    ) -> Self {
        Self { file_ref, file_type, filename, byte_size, expires_at, extra: Extra::new() }
    }
}

/// The JSON body of an HTTP error from our endpoints: `{"error": {"code", "message"}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HttpErrorBody {
    /// The error.
    pub error: WireError,
}

/// The credentials of an `Authorization: Bearer <token>` header value, or `None` when the value
/// uses another scheme or carries no token. The one Bearer parser of the project: the scheme
/// name is case-insensitive (RFC 7235 section 2.1, so `Bearer`, `bearer` and `BEARER` all work),
/// one or more spaces separate it from the token, and the token is one word (no whitespace or
/// control characters; stricter token68 syntax is not demanded, so a configured key with other
/// printable characters still works). Surrounding spaces are ignored.
///
/// ```
/// use xagent_protocol_types::bearer_token;
/// assert_eq!(bearer_token("Bearer k1"), Some("k1"));
/// assert_eq!(bearer_token("BEARER k1"), Some("k1"));
/// assert_eq!(bearer_token("bearer   k1 "), Some("k1"));
/// assert_eq!(bearer_token("Basic dXNlcjpwYXNz"), None);
/// assert_eq!(bearer_token("Bearer"), None);
/// ```
pub fn bearer_token(header_value: &str) -> Option<&str> {
    let text = header_value.trim_matches(|c| c == ' ' || c == '\t');
    let (scheme, rest) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = rest.trim_start_matches(' ');
    let word = |c: char| !c.is_whitespace() && !c.is_control();
    (!token.is_empty() && token.chars().all(word)).then_some(token)
}

#[cfg(test)]
mod bearer_tests {
    use super::bearer_token;

    #[test]
    fn scheme_is_case_insensitive_per_rfc_7235() {
        for value in ["Bearer k", "bearer k", "BEARER k", "bEaReR k", "  Bearer  k  "] {
            assert_eq!(bearer_token(value), Some("k"), "{value:?}");
        }
    }

    #[test]
    fn other_schemes_and_malformed_values_carry_no_token() {
        for value in [
            "",
            "Bearer",
            "Bearer ",
            "Basic a",
            "Bearerk",
            "k",
            "Bearer a b",
            "Bearer\tk",
            "Bearer k\u{7}",
        ] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
    }
}
