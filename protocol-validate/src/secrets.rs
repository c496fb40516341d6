//! The secret-leak scanner.
//!
//! A program knows some of its secrets (the system API key, target-system tokens, the values
//! a user typed into secret form fields). Give them to a [`SecretScanner`] and it reports
//! where any of them, or a string shaped like a well-known credential, appears in a Card,
//! Skill, Descriptor, Tool result, payload or log line. Findings name the place and the kind
//! of secret, never the secret itself.

use serde_json::Value;
use xagent_protocol_types::Secret;

use crate::report::{child, index};

/// Known secrets shorter than this are not searched for (they would match everywhere).
pub const MIN_KNOWN_SECRET_LEN: usize = 6;

/// What was found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeakKind {
    /// One of the secrets the program gave the scanner, by its label.
    Known(String),
    /// A string shaped like a well-known credential (`bearer token`, `JWT`, ...).
    Shape(&'static str),
    /// A non-empty string under a key that only ever holds secrets (`api_key`, `bot_token`, ...).
    SensitiveField(String),
}

impl std::fmt::Display for LeakKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Known(label) => write!(f, "the {label}"),
            Self::Shape(shape) => write!(f, "something shaped like a {shape}"),
            Self::SensitiveField(key) => write!(f, "a value under the sensitive key {key:?}"),
        }
    }
}

/// One place where a secret appears.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leak {
    /// JSON pointer of the value (for JSON input) or `line:column` (for text).
    pub location: String,
    /// What it is.
    pub kind: LeakKind,
}

/// One step of a JSON pointer, kept unformatted until a finding needs it.
enum Segment<'v> {
    Key(&'v str),
    Index(usize),
}

fn pointer(path: &[Segment<'_>]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Key(key) => out = child(&out, key),
            Segment::Index(i) => out = index(&out, *i),
        }
    }
    out
}

/// Shortest token any shape below can match (an AWS key id has 20 characters).
const MIN_SHAPE_LEN: usize = 20;

/// Keys whose string values are always credentials.
const SENSITIVE_KEYS: &[&str] = &[
    "api_key",
    "apikey",
    "access_token",
    "refresh_token",
    "bot_token",
    "context_token",
    "auth_token",
    "id_token",
    "client_secret",
    "secret_key",
    "private_key",
    "password",
    "passwd",
    "cookie",
    "set-cookie",
    "authorization",
    "oauth_state",
];

/// Finds known secrets and credential-shaped strings.
#[derive(Clone, Debug, Default)]
pub struct SecretScanner {
    known: Vec<(String, Secret)>,
    shapes: bool,
    sensitive_keys: bool,
}

impl SecretScanner {
    /// A scanner that looks for common token shapes and sensitive keys, and no known secret.
    pub fn new() -> Self {
        Self { known: Vec::new(), shapes: true, sensitive_keys: true }
    }

    /// Adds a secret the program knows, with a label used in findings (e.g. `system API key`).
    /// Secrets shorter than [`MIN_KNOWN_SECRET_LEN`] are ignored.
    #[must_use]
    pub fn with_secret(mut self, label: impl Into<String>, secret: &Secret) -> Self {
        if secret.expose().len() >= MIN_KNOWN_SECRET_LEN {
            self.known.push((label.into(), secret.clone()));
        }
        self
    }

    /// Turns token-shape detection on or off.
    #[must_use]
    pub fn with_token_shapes(mut self, enabled: bool) -> Self {
        self.shapes = enabled;
        self
    }

    /// Turns sensitive-key detection on or off (off for documents that legitimately carry
    /// form input, such as `auth.start`).
    #[must_use]
    pub fn with_sensitive_keys(mut self, enabled: bool) -> Self {
        self.sensitive_keys = enabled;
        self
    }

    /// Scans every string (and object key) in a JSON value.
    pub fn scan_value(&self, value: &Value) -> Vec<Leak> {
        let mut out = Vec::new();
        self.walk(value, &mut Vec::new(), None, &mut out);
        out
    }

    /// Scans text (a Skill, a log line); locations are `line:column`, 1-based.
    pub fn scan_text(&self, text: &str) -> Vec<Leak> {
        let mut out = Vec::new();
        for (line_no, line) in text.lines().enumerate() {
            for (column, kind) in self.scan_str(line) {
                out.push(Leak { location: format!("{}:{}", line_no + 1, column + 1), kind });
            }
            if self.sensitive_keys
                && let Some(key) = sensitive_assignment(line)
            {
                out.push(Leak {
                    location: format!("{}:1", line_no + 1),
                    kind: LeakKind::SensitiveField(key),
                });
            }
        }
        out
    }

    /// True when `text` contains no finding.
    pub fn is_clean_text(&self, text: &str) -> bool {
        self.scan_text(text).is_empty()
    }

    fn walk<'v>(
        &self,
        value: &'v Value,
        path: &mut Vec<Segment<'v>>,
        key: Option<&str>,
        out: &mut Vec<Leak>,
    ) {
        match value {
            Value::String(text) => {
                for (_, kind) in self.scan_str(text) {
                    out.push(Leak { location: pointer(path), kind });
                }
                if self.sensitive_keys
                    && !text.is_empty()
                    && let Some(key) = key.filter(|k| is_sensitive_key(k))
                {
                    out.push(Leak {
                        location: pointer(path),
                        kind: LeakKind::SensitiveField(key.to_owned()),
                    });
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(Segment::Index(i));
                    self.walk(item, path, None, out);
                    path.pop();
                }
            }
            Value::Object(map) => {
                for (k, v) in map {
                    path.push(Segment::Key(k));
                    for (_, kind) in self.scan_str(k) {
                        out.push(Leak { location: pointer(path), kind });
                    }
                    self.walk(v, path, Some(k), out);
                    path.pop();
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// True when a JSON string `text` would produce a finding in [`SecretScanner::scan_value`]:
    /// as an object key (`as_key`), or as a value under the object key `key` (`None` for an
    /// array item or the root). The allocation-free test the single-pass validator runs on each
    /// string of the raw packet text; it matches the tree walk exactly.
    pub(crate) fn string_leaks(&self, text: &str, as_key: bool, key: Option<&str>) -> bool {
        if self.known.iter().any(|(_, secret)| text.contains(secret.expose())) {
            return true;
        }
        if self.shapes && !is_protocol_word(text) && has_shape(text) {
            return true;
        }
        !as_key && self.sensitive_keys && !text.is_empty() && key.is_some_and(is_sensitive_key)
    }

    /// Findings in one string, with their byte offsets.
    fn scan_str(&self, text: &str) -> Vec<(usize, LeakKind)> {
        let mut out = Vec::new();
        for (label, secret) in &self.known {
            if let Some(at) = text.find(secret.expose()) {
                out.push((at, LeakKind::Known(label.clone())));
            }
        }
        if self.shapes {
            scan_shapes(text, &mut out);
        }
        out
    }
}

fn is_sensitive_key(key: &str) -> bool {
    SENSITIVE_KEYS.iter().any(|k| k.eq_ignore_ascii_case(key))
}

/// `api_key: value` / `password = value` / `"bot_token": "value"` in a line of text.
fn sensitive_assignment(line: &str) -> Option<String> {
    let lower = line.to_ascii_lowercase();
    for key in SENSITIVE_KEYS {
        let mut start = 0;
        while let Some(found) = lower[start..].find(key) {
            let at = start + found;
            start = at + key.len();
            let before_ok = at == 0 || !is_word(lower.as_bytes()[at - 1]);
            let rest = &lower[start..];
            let rest_trimmed = rest.trim_start_matches(['"', '\'']).trim_start();
            let Some(after_sep) =
                rest_trimmed.strip_prefix(':').or_else(|| rest_trimmed.strip_prefix('='))
            else {
                continue;
            };
            let value = after_sep.trim().trim_matches(['"', '\'', ',', ';']).trim();
            let placeholder = value.is_empty()
                || value.contains('<')
                || value.starts_with('$')
                || value.starts_with('{')
                || value == "true"
                || value == "false"
                || value.chars().all(|c| c == '*' || c == '.' || c == 'x');
            if before_ok && !placeholder && value.len() >= MIN_KNOWN_SECRET_LEN {
                return Some((*key).to_owned());
            }
        }
    }
    None
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':' | b'+' | b'/' | b'=')
}

/// Field names and fixed values every packet repeats. None has a credential shape (a test
/// checks), so the hot path skips the shape scan for them.
const PROTOCOL_WORDS: &[&str] = &[
    xagent_protocol_types::PACKET_SCHEMA,
    "connector_channel_id",
    "connection_descriptor",
    "activation_message",
    "target_session_ref",
    "target_session_id",
];

fn is_protocol_word(text: &str) -> bool {
    text.len() >= 15 && PROTOCOL_WORDS.contains(&text)
}

/// True when [`scan_shapes`] would find something in `text`. Every shape needs a run of at
/// least 8 token characters (`bearer ` plus 8), and one of 20 unless the text has a space
/// (`bearer <token>`, `-----BEGIN ... PRIVATE KEY-----`), so most strings are ruled out by one
/// pass over their bytes.
fn has_shape(text: &str) -> bool {
    if text.len() < 15 {
        return false;
    }
    let (mut longest, mut run, mut space) = (0usize, 0usize, false);
    for &b in text.as_bytes() {
        if is_token_char(b) {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
            space |= b == b' ';
        }
    }
    if longest < 8 || (longest < MIN_SHAPE_LEN && !space) {
        return false;
    }
    let mut out = Vec::new();
    scan_shapes(text, &mut out);
    !out.is_empty()
}

/// Looks for credential shapes in `text` by splitting it into token-like runs.
fn scan_shapes(text: &str, out: &mut Vec<(usize, LeakKind)>) {
    if let Some(at) = text.find("-----BEGIN")
        && text[at..].contains("PRIVATE KEY-----")
    {
        out.push((at, LeakKind::Shape("private key")));
    }
    let bytes = text.as_bytes();
    // `Bearer <token>` in a header or a log line.
    for at in 0..bytes.len().saturating_sub(6) {
        if matches!(bytes[at], b'b' | b'B')
            && bytes[at..at + 7].eq_ignore_ascii_case(b"bearer ")
            && (at == 0 || !is_word(bytes[at - 1]))
        {
            let token = bytes[at + 7..].iter().take_while(|b| is_token_char(**b)).count();
            if token >= 8 && bytes.get(at + 7) != Some(&b'<') {
                out.push((at, LeakKind::Shape("bearer token")));
            }
        }
    }
    let mut i = 0;
    while i < bytes.len() {
        if !is_token_char(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_token_char(bytes[i]) {
            i += 1;
        }
        let token = &text[start..i];
        if token.len() < MIN_SHAPE_LEN {
            continue;
        }
        if let Some(shape) = token_shape(token) {
            out.push((start, LeakKind::Shape(shape)));
        }
    }
}

fn all_in(s: &str, ok: impl Fn(u8) -> bool) -> bool {
    !s.is_empty() && s.bytes().all(ok)
}

fn b64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// The credential shape a single token has, if any.
fn token_shape(token: &str) -> Option<&'static str> {
    let token = token.trim_matches(|c: char| matches!(c, '.' | ':' | '/' | '='));
    // JSON Web Token: three base64url parts, the first two starting with `eyJ` (`{"`).
    let mut parts = token.split('.');
    if token.len() >= 30
        && token.starts_with("eyJ")
        && token.split('.').count() == 3
        && parts.nth(1).is_some_and(|p| p.starts_with("eyJ"))
        && token.split('.').all(|p| all_in(p, b64url))
    {
        return Some("JSON Web Token");
    }
    // Telegram bot token: digits, a colon, 35 base64url characters.
    if let Some((id, secret)) = token.split_once(':')
        && (6..=12).contains(&id.len())
        && all_in(id, |b| b.is_ascii_digit())
        && secret.len() == 35
        && all_in(secret, b64url)
    {
        return Some("Telegram bot token");
    }
    let prefixed: &[(&str, usize, &str)] = &[
        ("ghp_", 36, "GitHub token"),
        ("gho_", 36, "GitHub token"),
        ("ghs_", 36, "GitHub token"),
        ("ghu_", 36, "GitHub token"),
        ("github_pat_", 40, "GitHub token"),
        ("glpat-", 20, "GitLab token"),
        ("xoxb-", 20, "Slack token"),
        ("xoxp-", 20, "Slack token"),
        ("xoxa-", 20, "Slack token"),
        ("sk-", 32, "API secret key"),
        ("sk_live_", 20, "Stripe secret key"),
        ("AIza", 35, "Google API key"),
    ];
    for (prefix, min_rest, name) in prefixed {
        if let Some(rest) = token.strip_prefix(prefix)
            && rest.len() >= *min_rest
            && all_in(rest, b64url)
        {
            return Some(name);
        }
    }
    // AWS access key id.
    if token.len() == 20
        && (token.starts_with("AKIA") || token.starts_with("ASIA"))
        && all_in(&token[4..], |b| b.is_ascii_uppercase() || b.is_ascii_digit())
    {
        return Some("AWS access key");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn protocol_words_have_no_shape_and_the_prefilter_is_exact() {
        for word in PROTOCOL_WORDS {
            let mut out = Vec::new();
            scan_shapes(word, &mut out);
            assert!(out.is_empty(), "{word}");
        }
        for text in [
            "Authorization: Bearer abcdefgh",
            "-----BEGIN RSA PRIVATE KEY----- x",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "see AKIAABCDEFGHIJKLMNOP here",
            "a plain sentence with words",
            "short_token_123",
        ] {
            let mut out = Vec::new();
            scan_shapes(text, &mut out);
            assert_eq!(has_shape(text), !out.is_empty(), "{text}");
        }
    }

    #[test]
    fn finds_known_secrets_without_printing_them() {
        let scanner =
            SecretScanner::new().with_secret("system API key", &Secret::new("k3y-abcdef"));
        let leaks = scanner.scan_value(&json!({"a": {"b": ["x", "prefix k3y-abcdef suffix"]}}));
        assert_eq!(leaks.len(), 1);
        assert_eq!(leaks[0].location, "/a/b/1");
        assert_eq!(leaks[0].kind, LeakKind::Known("system API key".into()));
        assert!(!format!("{:?} {}", leaks, leaks[0].kind).contains("k3y-abcdef"));
    }

    #[test]
    fn short_known_secrets_are_ignored() {
        let scanner = SecretScanner::new().with_secret("pin", &Secret::new("123"));
        assert!(scanner.scan_value(&json!({"a": "123"})).is_empty());
    }

    #[test]
    fn finds_token_shapes() {
        let scanner = SecretScanner::new();
        let samples = [
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abcdefghijklmnopqrstuv",
            "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "AKIAIOSFODNN7EXAMPLE",
            "Authorization: Bearer abcdef123456",
            "-----BEGIN RSA PRIVATE KEY-----",
            "sk-abcdefghijklmnopqrstuvwxyz0123456789",
        ];
        for sample in samples {
            assert!(!scanner.scan_text(sample).is_empty(), "{sample}");
        }
    }

    #[test]
    fn ordinary_text_is_clean() {
        let scanner = SecretScanner::new();
        for text in [
            "placeholder: 123456:ABC-DEF...",
            "Send text to the WeChat contact bound to the current channel.",
            "Authorization: Bearer <api_key>",
            "connector-im-wechat wechat_message_send cch_123 pkt_abc",
            "api_key_required: true",
            "password: <your password>",
        ] {
            assert!(scanner.scan_text(text).is_empty(), "{text}");
        }
    }

    #[test]
    fn sensitive_keys_in_json_and_text() {
        let scanner = SecretScanner::new();
        let leaks = scanner.scan_value(&json!({"bot_token": "123:abc", "name": "bot_token"}));
        assert_eq!(leaks.len(), 1);
        assert_eq!(leaks[0].location, "/bot_token");
        assert!(!scanner.scan_text("api_key = s3cr3t-value").is_empty());
        let relaxed = SecretScanner::new().with_sensitive_keys(false);
        assert!(relaxed.scan_value(&json!({"bot_token": "123:abc"})).is_empty());
    }
}
