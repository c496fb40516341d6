//! The database URL: a secret. Its password is shown as `***` wherever it is printed.

use std::fmt;
use std::str::FromStr;

use tokio_postgres::config::{Host, SslMode};

use crate::error::PgError;

/// What a password is replaced with in every printed form of a URL.
const MASK: &str = "***";

/// A PostgreSQL connection URL (`postgres://USER:PASSWORD@HOST:PORT/DATABASE?OPTIONS`).
///
/// A secret: `Debug` and `Display` show it with the password replaced by `***`; only
/// [`DatabaseUrl::expose`] gives the full text, for handing it to a driver or child process.
#[derive(Clone)]
pub struct DatabaseUrl {
    text: String,
    redacted: String,
    config: tokio_postgres::Config,
}

impl DatabaseUrl {
    /// Reads a `postgres://` or `postgresql://` URL; any other form (another scheme, the
    /// `key=value` form) is refused with an error that says which form to write.
    pub fn parse(text: &str) -> Result<Self, PgError> {
        let text = text.trim();
        let scheme_end = text.find("://").ok_or_else(|| {
            PgError::invalid_url(
                "it is not a URL: write postgres://USER:PASSWORD@HOST:PORT/DATABASE",
            )
        })?;
        let scheme = &text[..scheme_end];
        if !scheme.eq_ignore_ascii_case("postgres") && !scheme.eq_ignore_ascii_case("postgresql") {
            // The scheme itself is printed: it holds no secret (it is before `://`).
            return Err(PgError::invalid_url(format!(
                "its scheme is `{}`, but only postgres:// and postgresql:// are accepted",
                scheme.chars().take(32).collect::<String>()
            )));
        }
        let redacted = redact(text);
        let secrets = secrets_of(text);
        // tokio-postgres reads the rest (hosts, port, options, percent-decoding); its
        // messages name the option at fault, and are scrubbed of the secrets all the same.
        let config = tokio_postgres::Config::from_str(text).map_err(|e| {
            PgError::invalid_url(scrub_with(
                &format!("{e}: write postgres://USER:PASSWORD@HOST:PORT/DATABASE"),
                &secrets,
            ))
        })?;
        if config.get_hosts().is_empty() {
            return Err(PgError::invalid_url(
                "it names no host: write postgres://USER:PASSWORD@HOST:PORT/DATABASE",
            ));
        }
        if config.get_user().is_none() {
            return Err(PgError::invalid_url(
                "it names no user: write postgres://USER:PASSWORD@HOST:PORT/DATABASE",
            ));
        }
        match config.get_ssl_mode() {
            SslMode::Disable | SslMode::Prefer => {}
            _ => {
                return Err(PgError::invalid_url(
                    "it asks for TLS (sslmode=require), which this build does not speak to the \
                     database yet: reach PostgreSQL over a private network, a Unix socket or an \
                     encrypting tunnel, and drop sslmode from the URL (see docs/DECISIONS.md)",
                ));
            }
        }
        Ok(Self { text: text.to_owned(), redacted, config })
    }

    /// The URL with its password replaced by `***`: the form to log.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// The full URL, password included: hand it only to a driver or a child process's
    /// environment, never to a log or an error message.
    pub fn expose(&self) -> &str {
        &self.text
    }

    /// The parsed connection settings (tokio-postgres's form).
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// The database it names (PostgreSQL's default, the user's name, when none is given).
    pub fn database(&self) -> &str {
        self.config.get_dbname().or(self.config.get_user()).unwrap_or_default()
    }

    /// The first host and port, for messages (`127.0.0.1:5432`, or a socket directory).
    pub fn target(&self) -> String {
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        match self.config.get_hosts().first() {
            Some(Host::Tcp(host)) => format!("{host}:{port}"),
            Some(Host::Unix(path)) => format!("{} (port {port})", path.display()),
            None => "no host".to_owned(),
        }
    }

    /// The same server and credentials, another database: `name` is a plain identifier
    /// (letters, digits, `_`, `-`; at most 63 bytes, PostgreSQL's limit).
    pub fn with_database(&self, name: &str) -> Result<Self, PgError> {
        let plain = !name.is_empty()
            && name.len() <= 63
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !plain {
            return Err(PgError::invalid_url(
                "a database name for with_database is 1 to 63 letters, digits, `_` or `-`",
            ));
        }
        let after_scheme = self.text.find("://").map_or(0, |i| i + 3);
        let rest = &self.text[after_scheme..];
        let authority_end = rest.find(['/', '?', '#']).map_or(rest.len(), |i| i);
        let tail = &rest[authority_end..];
        let query = tail.find('?').map(|i| &tail[i + 1..]).unwrap_or_default();
        // A `dbname=` option would override the path: drop it.
        let kept: Vec<&str> = query
            .split('&')
            .filter(|p| !p.is_empty() && !p.to_ascii_lowercase().starts_with("dbname="))
            .collect();
        let mut text = format!("{}{}/{name}", &self.text[..after_scheme], &rest[..authority_end]);
        if !kept.is_empty() {
            text.push('?');
            text.push_str(&kept.join("&"));
        }
        Self::parse(&text)
    }

    /// Removes every secret of this URL (its password, raw and percent-decoded) from `text`:
    /// applied to every driver message before it becomes a [`PgError`].
    pub fn scrub(&self, text: &str) -> String {
        let mut secrets = secrets_of(&self.text);
        if let Some(password) = self.config.get_password() {
            secrets.push(String::from_utf8_lossy(password).into_owned());
        }
        scrub_with(text, &secrets)
    }
}

impl FromStr for DatabaseUrl {
    type Err = PgError;

    fn from_str(text: &str) -> Result<Self, PgError> {
        Self::parse(text)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DatabaseUrl").field(&self.redacted).finish()
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// Byte range of the password in the user-info part (`user:PASSWORD@`), if any.
fn userinfo_password(text: &str) -> Option<(usize, usize)> {
    let start = text.find("://")? + 3;
    let rest = &text[start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let at = authority.rfind('@')?;
    let colon = authority[..at].find(':')?;
    Some((start + colon + 1, start + at))
}

/// Byte ranges of `password=` values in the query.
fn query_passwords(text: &str) -> Vec<(usize, usize)> {
    let Some(q) = text.find('?') else { return Vec::new() };
    let mut ranges = Vec::new();
    let mut offset = q + 1;
    for part in text[q + 1..].split('&') {
        let key_len = part.find('=').unwrap_or(part.len());
        if part[..key_len].eq_ignore_ascii_case("password") && key_len < part.len() {
            ranges.push((offset + key_len + 1, offset + part.len()));
        }
        offset += part.len() + 1;
    }
    ranges
}

/// The URL with every password replaced by `***`.
fn redact(text: &str) -> String {
    let mut ranges = query_passwords(text);
    ranges.extend(userinfo_password(text));
    ranges.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in ranges {
        if start < at {
            continue;
        }
        out.push_str(&text[at..start]);
        out.push_str(MASK);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// The password texts of a URL, as written and percent-decoded.
fn secrets_of(text: &str) -> Vec<String> {
    let mut ranges = query_passwords(text);
    ranges.extend(userinfo_password(text));
    let mut secrets = Vec::new();
    for (start, end) in ranges {
        let raw = &text[start..end];
        if raw.is_empty() {
            continue;
        }
        secrets.push(raw.to_owned());
        let decoded = percent_decode(raw);
        if decoded != raw {
            secrets.push(decoded);
        }
    }
    secrets
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) =
                (bytes.get(i + 1).and_then(|&b| hex(b)), bytes.get(i + 2).and_then(|&b| hex(b)))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn scrub_with(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for secret in secrets {
        // A one-character password would mask half the message; it is masked all the same.
        if !secret.is_empty() {
            out = out.replace(secret.as_str(), MASK);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_mask_the_password() {
        let url = DatabaseUrl::parse("postgres://app:s3cr%40t@db.example:5433/xagent").unwrap();
        assert_eq!(url.redacted(), "postgres://app:***@db.example:5433/xagent");
        assert_eq!(url.to_string(), url.redacted());
        assert_eq!(
            format!("{url:?}"),
            "DatabaseUrl(\"postgres://app:***@db.example:5433/xagent\")"
        );
        assert_eq!(url.config().get_password(), Some(&b"s3cr@t"[..]));
        assert_eq!(url.database(), "xagent");
        assert_eq!(url.target(), "db.example:5433");
        assert_eq!(url.scrub("password s3cr@t and s3cr%40t"), "password *** and ***");
    }

    #[test]
    fn a_query_password_is_masked_too() {
        let url =
            DatabaseUrl::parse("postgresql://app@h/db?password=hunter2&connect_timeout=3").unwrap();
        assert_eq!(url.redacted(), "postgresql://app@h/db?password=***&connect_timeout=3");
    }

    #[test]
    fn other_forms_are_refused_without_echoing_the_secret() {
        for text in [
            "mysql://app:hunter2@h/db",
            "host=h user=app password=hunter2",
            "postgres://app:hunter2@h:notaport/db",
            "postgres://app:hunter2@h/db?sslmode=require",
            "postgres://app:hunter2@h/db?nosuchoption=1",
        ] {
            let err = DatabaseUrl::parse(text).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.to_lowercase().contains("postgres"), "it says what to write: {shown}");
        }
    }

    #[test]
    fn with_database_keeps_server_and_options() {
        let url =
            DatabaseUrl::parse("postgres://app:pw@h:1/one?dbname=x&connect_timeout=3").unwrap();
        let other = url.with_database("two").unwrap();
        assert_eq!(other.redacted(), "postgres://app:***@h:1/two?connect_timeout=3");
        assert_eq!(other.database(), "two");
        assert!(url.with_database("bad name;").is_err());
    }
}
