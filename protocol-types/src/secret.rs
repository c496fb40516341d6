//! A string that must never be shown: system API keys, target-system tokens, secret form values.

use serde::{Deserialize, Deserializer};

/// A secret string. `Debug` and `Display` print `<redacted>`, it has no `Serialize`, so it cannot
/// end up in a log line or on the wire by accident; [`Secret::expose`] is the one explicit way
/// to read it. Comparison is constant-time.
#[derive(Clone, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself; call only where the value is really needed (a comparison, a request
    /// to the target system).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Compares with a candidate in time that does not depend on where they differ.
    pub fn matches(&self, candidate: &str) -> bool {
        constant_time_eq(self.0.as_bytes(), candidate.as_bytes())
    }
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    let longest = a.len().max(b.len());
    for i in 0..longest {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.matches(&other.0)
    }
}

impl Eq for Secret {}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self)
    }
}

/// A secret's JSON Schema: a string marked `writeOnly` with format `password`, so a form
/// generated from a struct with a `Secret` field shows it as a password input.
impl schemars::JsonSchema for Secret {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Secret".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "format": "password", "writeOnly": true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_redact() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
        assert_eq!(format!("{secret}"), "<redacted>");
        assert!(!format!("{secret:?} {secret}").contains("hunter2"));
    }

    #[test]
    fn schema_is_a_write_only_password_string() {
        let schema = schemars::schema_for!(Secret).to_value();
        assert_eq!(schema["type"], "string");
        assert_eq!(schema["format"], "password");
        assert_eq!(schema["writeOnly"], true);
    }

    #[test]
    fn comparison() {
        let secret = Secret::new("abc");
        assert!(secret.matches("abc"));
        assert!(!secret.matches("abd"));
        assert!(!secret.matches("ab"));
        assert!(!secret.matches("abcd"));
        assert!(!secret.matches(""));
    }
}
