//! The IM file-item and payload-field rules, in one place. `xagent-connector check` (the
//! report validators of this crate), the typed IM checks of `xagent-profile-im` and therefore
//! both runtimes call these predicates, so the same input gets the same answer everywhere.
//!
//! - A `download_url` is an absolute `http`/`https` URL or a relative Connector URI (IM v2 §5).
//!   Any other scheme (`file:`, `data:`, `ftp:`, a Windows drive `C:`), a UNC or backslash path,
//!   whitespace or control characters, or an empty value is refused: such a value would point
//!   xAgent at a local file or carry bytes in the packet.
//! - File bytes, base64 and local paths never travel in an IM payload (IM v2 §5, Device §4):
//!   a message or file item with a field named in [`FORBIDDEN_BYTE_FIELDS`] is refused.
//! - xAgent-internal identities ([`FORBIDDEN_IDENTITY_FIELDS`]) never appear in an IM payload
//!   (IM v2 §3).
//!
//! The generated schema of `chat.message` files expresses the first two rules too
//! (`download_url` pattern [`xagent_protocol_types::DOWNLOAD_URL_PATTERN`], `propertyNames`);
//! a test keeps that pattern and [`download_url_allowed`] in agreement.

/// xAgent-internal identities no IM payload may carry.
pub const FORBIDDEN_IDENTITY_FIELDS: &[&str] =
    &["session_id", "user_connector_id", "user_id", "connector_id", "role"];

/// Field names that would carry file bytes or local paths, refused in messages and file items.
/// Files travel only as a `file_ref` through the Transfer Plane.
pub const FORBIDDEN_BYTE_FIELDS: &[&str] = xagent_protocol_types::FORBIDDEN_FILE_BYTE_FIELDS;

/// True when `key` names an xAgent-internal identity.
pub fn is_forbidden_identity_field(key: &str) -> bool {
    FORBIDDEN_IDENTITY_FIELDS.contains(&key)
}

/// True when `key` would carry file bytes, base64 or a local path.
pub fn is_forbidden_byte_field(key: &str) -> bool {
    FORBIDDEN_BYTE_FIELDS.contains(&key)
}

/// True when `url` may be a file item's `download_url`: non-empty, no whitespace, control
/// characters or U+FEFF, not starting with a backslash, and either scheme-less (a relative Connector
/// URI such as `/files/refs/file_1`) or with the scheme `http` or `https` (any case).
pub fn download_url_allowed(url: &str) -> bool {
    // U+FEFF counts as whitespace in ECMA-262 regular expressions (the schema pattern) though
    // not in Unicode's White_Space; refuse it here too so both forms agree.
    let invisible = |c: char| c.is_whitespace() || c.is_control() || c == '\u{feff}';
    if url.is_empty() || url.starts_with('\\') || url.chars().any(invisible) {
        return false;
    }
    match scheme_of(url) {
        None => true,
        Some(scheme) => scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"),
    }
}

/// The URI scheme `url` starts with (RFC 3986: a letter, then letters, digits, `+`, `-`, `.`,
/// then `:`), if any.
fn scheme_of(url: &str) -> Option<&str> {
    let (candidate, _) = url.split_once(':')?;
    let mut bytes = candidate.bytes();
    let first = bytes.next()?;
    (first.is_ascii_alphabetic()
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')))
    .then_some(candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples shared by this test and the schema-agreement test in `tests/im_rules.rs`.
    pub(crate) const ALLOWED: &[&str] = &[
        "/files/refs/file_1?exp=2&sig=ab",
        "files/refs/file_1",
        "https://cdn.example/x.png",
        "HTTP://h/x",
        "HtTpS://h:8080/a/b",
        "?x=1",
        "a/b:c",
    ];
    pub(crate) const REFUSED: &[&str] = &[
        "",
        "file:///etc/passwd",
        "FILE:///etc/passwd",
        "file:relative",
        "data:image/png;base64,AAAA",
        "ftp://h/x",
        "mailto:a@b",
        "javascript:alert(1)",
        "C:\\x.png",
        "c:/x.png",
        "\\\\server\\share\\x",
        "\\x",
        " file:///etc/passwd",
        "/files/refs/f 1",
        "/files/refs/f\n",
    ];

    #[test]
    fn rule_im_download_url_scheme() {
        for url in ALLOWED {
            assert!(download_url_allowed(url), "{url:?} should be allowed");
        }
        for url in REFUSED {
            assert!(!download_url_allowed(url), "{url:?} should be refused");
        }
    }

    #[test]
    fn rule_im_file_bytes_and_identities() {
        for key in ["base64", "bytes", "data", "content_base64", "local_path", "path"] {
            assert!(is_forbidden_byte_field(key), "{key}");
        }
        for key in ["filename", "mime_type", "download_url", "file_ref"] {
            assert!(!is_forbidden_byte_field(key), "{key}");
        }
        for key in ["session_id", "user_id", "user_connector_id", "connector_id", "role"] {
            assert!(is_forbidden_identity_field(key), "{key}");
        }
    }
}
