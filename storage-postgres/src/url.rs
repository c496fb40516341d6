//! The database URL: a secret. Its password is shown as `***` wherever it is printed.

use std::fmt;
use std::str::FromStr;

use tokio_postgres::config::{Host, SslMode};

use crate::error::{PgError, chain};

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
    tls: Tls,
}

/// Whether and how the connection is encrypted, from the URL's `sslmode` and `sslrootcert`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tls {
    /// Plain TCP (no `sslmode`, or `sslmode=disable`).
    Disabled,
    /// TLS, the server's certificate and name verified (`sslmode=require` or `verify-full`)
    /// against the roots in `root_cert` (`sslrootcert=FILE`, PEM) or else the system's.
    Verified {
        /// The PEM file of trusted roots, if given.
        root_cert: Option<std::path::PathBuf>,
    },
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
        // The TLS options are read here: tokio-postgres knows neither `sslrootcert` nor
        // `verify-full`, and its default (`prefer`) would fall back to plain text silently.
        let (driver_text, tls) = split_tls_options(text)?;
        // tokio-postgres reads the rest (hosts, port, options, percent-decoding); its
        // messages name the option at fault, and are scrubbed of the secrets all the same.
        let mut config = tokio_postgres::Config::from_str(&driver_text).map_err(|e| {
            PgError::invalid_url(scrub_with(
                &format!("{e}: write postgres://USER:PASSWORD@HOST:PORT/DATABASE"),
                &secrets,
            ))
        })?;
        config.ssl_mode(match tls {
            Tls::Disabled => SslMode::Disable,
            Tls::Verified { .. } => SslMode::Require,
        });
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
        Ok(Self { text: text.to_owned(), redacted, config, tls })
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

    /// Whether connections are encrypted, and against which roots.
    pub fn tls(&self) -> &Tls {
        &self.tls
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

impl DatabaseUrl {
    /// Maps a driver error met while doing `context`, scrubbed of this URL's secrets.
    pub fn error(&self, context: impl Into<String>, err: &tokio_postgres::Error) -> PgError {
        PgError::from_driver_scrubbed(context, err, |text| self.scrub(&text))
    }

    /// Maps a failure to open a connection to this URL, scrubbed of its secrets.
    pub(crate) fn connect_error(&self, err: &tokio_postgres::Error) -> PgError {
        PgError::Connect {
            target: self.target(),
            detail: self.scrub(&chain(err)),
            code: err.as_db_error().map(|db| db.code().code().to_owned()),
        }
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

/// Takes `sslmode` and `sslrootcert` out of the query (the driver gets the rest) and reads
/// them: `disable` (the default) or `require` / `verify-full` (both verify the certificate
/// and the name); the modes that may fall back to plain text or skip the name are refused.
fn split_tls_options(text: &str) -> Result<(String, Tls), PgError> {
    let Some(q) = text.find('?') else { return Ok((text.to_owned(), Tls::Disabled)) };
    let (base, query) = (&text[..q], &text[q + 1..]);
    let (mut mode, mut root_cert) = (None, None);
    let mut kept = Vec::new();
    for part in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = part.split_once('=').unwrap_or((part, ""));
        match key {
            "sslmode" => mode = Some(percent_decode(value)),
            "sslrootcert" => root_cert = Some(std::path::PathBuf::from(percent_decode(value))),
            _ => kept.push(part),
        }
    }
    let tls = match mode.as_deref() {
        None | Some("disable") if root_cert.is_none() => Tls::Disabled,
        None | Some("disable") => {
            return Err(PgError::invalid_url(
                "it names an sslrootcert but no sslmode: add sslmode=verify-full",
            ));
        }
        Some("require" | "verify-full") => Tls::Verified { root_cert },
        Some("prefer" | "allow") => {
            return Err(PgError::invalid_url(
                "sslmode=prefer and allow may fall back to an unencrypted connection: write \
                 sslmode=verify-full (with sslrootcert=FILE for a private CA) or \
                 sslmode=disable",
            ));
        }
        Some("verify-ca") => {
            return Err(PgError::invalid_url(
                "sslmode=verify-ca skips the server name check, which this build always makes: \
                 write sslmode=verify-full",
            ));
        }
        Some(other) => {
            return Err(PgError::invalid_url(format!(
                "sslmode={} is unknown: write disable, require or verify-full",
                other.chars().take(16).collect::<String>()
            )));
        }
    };
    let driver_text =
        if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    Ok((driver_text, tls))
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
            "postgres://app:hunter2@h/db?sslmode=prefer",
            "postgres://app:hunter2@h/db?sslmode=verify-ca",
            "postgres://app:hunter2@h/db?sslrootcert=/ca.pem",
            "postgres://app:hunter2@h/db?nosuchoption=1",
        ] {
            let err = DatabaseUrl::parse(text).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            let says_what = shown.contains("postgres://") || shown.contains(" sslmode=");
            assert!(says_what, "it says what to write: {shown}");
        }
    }

    #[test]
    fn tls_is_off_by_default_and_verified_when_asked_for() {
        let plain = DatabaseUrl::parse("postgres://app@h/db").unwrap();
        assert_eq!(plain.tls(), &Tls::Disabled);
        assert_eq!(plain.config().get_ssl_mode(), SslMode::Disable);
        let system = DatabaseUrl::parse("postgres://app@h/db?sslmode=require").unwrap();
        assert_eq!(system.tls(), &Tls::Verified { root_cert: None });
        let private = DatabaseUrl::parse(
            "postgres://app@h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(private.tls(), &Tls::Verified { root_cert: Some("/etc/ca.pem".into()) });
        assert_eq!(private.config().get_ssl_mode(), SslMode::Require);
        assert_eq!(
            private.config().get_connect_timeout(),
            Some(&std::time::Duration::from_secs(3))
        );
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
