//! The IM payload rules (IM v1 file items, IM v2 `chat.*`), in one place. Every judge calls
//! these functions: the report form of this crate (`xagent-connector check`, the C ABI), the
//! single-pass form on the typed packet, and the typed IM checks of `xagent-profile-im` (which
//! both runtimes apply before a message is queued, sent or handed on). Each function walks one
//! payload, seen through a small view ([`FileItem`], [`Field`]), so the `serde_json::Value` form
//! and the typed form go through the same code, and reports each broken rule as a [`Break`]
//! (its rule, where, and for which sender) to a visitor that may stop the walk. Nothing here
//! allocates.
//!
//! - A `download_url` (or a file item's `url`) is an absolute `http`/`https` URL or a relative
//!   Connector URI (IM v2 §5). Any other scheme (`file:`, `data:`, `ftp:`, a Windows drive
//!   `C:`), a UNC or backslash path, whitespace or control characters, or an empty value is
//!   refused: such a value would point xAgent at a local file or carry bytes in the packet.
//! - File bytes, base64 and local paths never travel in an IM payload (IM v2 §5, Device §4):
//!   a message or file item with a field named in [`FORBIDDEN_BYTE_FIELDS`] is refused.
//! - xAgent-internal identities ([`FORBIDDEN_IDENTITY_FIELDS`]) never appear in an IM payload
//!   (IM v1 §10, IM v2 §3), at its top level or in a file item (a file item is part of the
//!   payload).
//! - A Connector-sent `chat.message` file carries `download_url` (IM v2 §5). Judged without a
//!   sender, the rule is applied for the Connector direction and the break names that sender.
//!
//! The generated schema of `chat.message` files expresses the URL and byte rules too
//! (`download_url` pattern [`xagent_protocol_types::DOWNLOAD_URL_PATTERN`], `propertyNames`);
//! a test keeps that pattern and [`download_url_allowed`] in agreement.

use std::ops::ControlFlow;

/// xAgent-internal identities no IM payload may carry.
pub const FORBIDDEN_IDENTITY_FIELDS: &[&str] =
    &["session_id", "user_connector_id", "user_id", "connector_id", "role"];

/// Field names that would carry file bytes or local paths, refused in messages and file items.
/// Files travel only as a `file_ref` through the Transfer Plane.
pub const FORBIDDEN_BYTE_FIELDS: &[&str] = xagent_protocol_types::FORBIDDEN_FILE_BYTE_FIELDS;

/// Argument names of IM Tools that would let the model pick where a message goes or hand the
/// Connector a platform credential (IM v1 §4, §6): conversation, room and contact ids, user
/// and sender ids, phone numbers, bot and context tokens. The channel's binding decides the
/// target; a reply to one message takes an opaque `reply_ref`. Compared without case, `_` and
/// `-` ([`crate::argument_name_in`]), so `chatId` and `CHAT-ID` are refused as `chat_id` is.
pub const FORBIDDEN_TOOL_ARGUMENTS: &[&str] = &[
    "chat",
    "chat_id",
    "chat_ids",
    "conversation",
    "conversation_id",
    "room",
    "room_id",
    "thread_id",
    "group_id",
    "channel_id",
    "contact",
    "contact_id",
    "contact_name",
    "contacts",
    "recipient",
    "recipient_id",
    "recipients",
    "receiver",
    "receiver_id",
    "to",
    "to_user",
    "to_user_id",
    "target",
    "target_id",
    "peer",
    "peer_id",
    "user",
    "user_id",
    "open_id",
    "union_id",
    "sender_id",
    "phone",
    "phone_number",
    "bot_token",
    "token",
    "access_token",
    "context_token",
    "api_key",
    "app_secret",
    "secret",
    "password",
];

/// True when an IM Tool argument named `name` would be a send target or a platform credential
/// ([`FORBIDDEN_TOOL_ARGUMENTS`]).
pub fn is_forbidden_tool_argument(name: &str) -> bool {
    crate::argument_name_in(name, FORBIDDEN_TOOL_ARGUMENTS)
}

/// Fields no `chat.activity` may carry (IM v2 §8): the model's reasoning, a Tool call's
/// arguments or result, error details. (Identities and byte fields have their own rules.)
pub const FORBIDDEN_ACTIVITY_FIELDS: &[&str] = &[
    "reasoning",
    "reasoning_content",
    "thought",
    "thoughts",
    "arguments",
    "args",
    "input",
    "result",
    "results",
    "output",
    "error",
    "error_message",
    "errors",
    "stack",
    "url",
];

/// True when a `chat.activity` field named `key` would leak reasoning, a Tool call's
/// arguments or result, or error details ([`FORBIDDEN_ACTIVITY_FIELDS`]).
pub fn is_forbidden_activity_field(key: &str) -> bool {
    FORBIDDEN_ACTIVITY_FIELDS.contains(&key)
}

/// True when an activity's `tool_name` is a path or a URL rather than a name: it contains a
/// slash or a backslash, or starts with a drive letter (`C:`) or a URL scheme such as `https:`,
/// `file:` or `data:`. (`server:tool`-style names with another prefix pass.)
pub fn tool_name_is_path_or_url(name: &str) -> bool {
    const URL_SCHEMES: &[&str] =
        &["http", "https", "file", "data", "ftp", "ftps", "mailto", "javascript", "ws", "wss"];
    name.contains(['/', '\\'])
        || scheme_of(name).is_some_and(|scheme| {
            scheme.len() == 1 || URL_SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme))
        })
}

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

mod chat;
mod push;
mod view;

pub use chat::*;
pub use push::*;
pub use view::*;

/// True when `visit`-style walking of `walk` finds no error: the verdict alone, stopping at
/// the first error (the single-pass form).
pub fn passes(walk: impl FnOnce(&mut Visit<'_>) -> ControlFlow<()>) -> bool {
    let mut visit = |b: Break<'_>| {
        if b.is_error() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    };
    walk(&mut visit).is_continue()
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
