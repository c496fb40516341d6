//! Inbound downloads under a policy, the one place xAgent fetches a `download_url` a Connector
//! sent: only from the Connector's own origin (the Base URL's scheme, host and port) or an
//! origin the operator allowed ([`DownloadPolicy`]); never to a loopback, private, link-local,
//! unique-local, CGNAT or metadata address outside the Connector's own origin, checked on the
//! address actually connected to (a resolver that drops such addresses, plus a check of
//! address literals, which never reach a resolver); every redirect hop checked the same way;
//! the body read in chunks and given up once it passes the size limit.
//!
//! A Connector may be hostile. What it hears back ([`DownloadError::public_message`]) is only
//! "refused by policy" or "download failed"; the detail is for xAgent's own log.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use url::{Host, Origin, Url};
use xagent_protocol_types::ErrorCode;

use crate::BaseUrl;

/// The default size limit of one inbound file (32 MiB).
pub const DEFAULT_MAX_DOWNLOAD_BYTES: u64 = 32 * 1024 * 1024;
/// The default number of redirects followed (each hop is checked like the first URL).
pub const DEFAULT_MAX_REDIRECTS: usize = 3;
/// The default time one download may take, body included.
pub const DEFAULT_DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// The default number of inbound messages whose files are downloaded at the same time.
pub const DEFAULT_CONCURRENT_DOWNLOADS: usize = 4;
/// Inbound messages with files that may wait for a download slot; past that a message is
/// answered `channel_busy` (retryable) and the Connector redelivers it later.
pub const MAX_WAITING_DOWNLOADS: usize = 64;

/// Where and how much xAgent downloads from a Connector's `download_url`s.
///
/// The default takes files only from the Connector's own origin, at most
/// [`DEFAULT_MAX_DOWNLOAD_BYTES`] each, with [`DEFAULT_MAX_REDIRECTS`] redirects within the
/// policy. An origin added with [`DownloadPolicy::allow_origin`] (a CDN the Connector hands
/// out links to) must still resolve to public addresses: loopback, private, link-local,
/// unique-local, CGNAT and metadata addresses are reachable only as the Connector's own origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadPolicy {
    /// Origins other than the Connector's own that files may come from (scheme, host, port).
    pub allowed_origins: Vec<Origin>,
    /// Largest file taken, in bytes; a larger one is refused, not retryably.
    pub max_bytes: u64,
    /// Redirects followed; each hop must pass the same checks as the first URL.
    pub max_redirects: usize,
    /// Time one download may take, from the request to the last byte.
    pub timeout: Duration,
    /// Inbound messages whose files are downloaded at the same time (at least 1).
    pub max_concurrent: usize,
}

impl Default for DownloadPolicy {
    fn default() -> Self {
        Self {
            allowed_origins: Vec::new(),
            max_bytes: DEFAULT_MAX_DOWNLOAD_BYTES,
            max_redirects: DEFAULT_MAX_REDIRECTS,
            timeout: DEFAULT_DOWNLOAD_TIMEOUT,
            max_concurrent: DEFAULT_CONCURRENT_DOWNLOADS,
        }
    }
}

/// An origin given to [`DownloadPolicy::allow_origin`] that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{given:?} is not an origin to download from ({why}); give scheme, host and optional port, like https://files.example or https://files.example:8443"
)]
pub struct OriginError {
    /// What was given.
    pub given: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl DownloadPolicy {
    /// Also allows files from `origin` (`https://files.example[:port]`, nothing else).
    pub fn allow_origin(mut self, origin: &str) -> Result<Self, OriginError> {
        self.allowed_origins.push(parse_origin(origin)?);
        Ok(self)
    }

    /// Sets the size limit of one file.
    #[must_use]
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }
}

/// Parses an origin for the allow-list: http or https, a host, an optional port, no path,
/// query, fragment or user name.
pub fn parse_origin(text: &str) -> Result<Origin, OriginError> {
    let fail = |why| OriginError { given: text.to_owned(), why };
    let url = Url::parse(text.trim()).map_err(|_| fail("not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(fail("only http and https"));
    }
    if url.host().is_none() {
        return Err(fail("no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(fail("a user name or password"));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(fail("a path, query or fragment"));
    }
    Ok(url.origin())
}

/// Why an inbound file was not downloaded. `Display` carries the detail, for xAgent's own log;
/// the Connector gets only [`DownloadError::public_message`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DownloadError {
    /// The URL, a redirect or the resolved address is outside the policy. Not retryable.
    #[error("refused by policy: {0}")]
    Refused(String),
    /// The file is larger than the policy's limit (declared, or counted while reading). Not
    /// retryable.
    #[error("refused by policy: the file is larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// The request failed (network, status, timeout, the application's sink). Retryable.
    #[error("download failed: {0}")]
    Failed(String),
}

impl DownloadError {
    /// The stable code of the ack: `permission_denied`, `payload_too_large` or `channel_busy`.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Refused(_) => ErrorCode::PermissionDenied,
            Self::TooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::Failed(_) => ErrorCode::ChannelBusy,
        }
    }

    /// Whether the Connector may redeliver: a refusal is final (the same URL would be refused
    /// again), a failure may pass later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Failed(_))
    }

    /// What the Connector is told: never a status, a socket error or an address.
    pub fn public_message(&self) -> &'static str {
        match self {
            Self::Refused(_) => "refused by policy",
            Self::TooLarge { .. } => "refused by policy: the file is larger than this xAgent takes",
            Self::Failed(_) => "download failed",
        }
    }
}

/// A URL as it may be logged: scheme, host, port and path, without the query (a signature)
/// or user name.
pub fn loggable_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) => {
            parsed.set_query(None);
            parsed.set_fragment(None);
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Err(_) => url.split(['?', '#']).next().unwrap_or_default().to_owned(),
    }
}

/// The refusal a resolver or redirect hook hands back through reqwest; found again by
/// walking the error's sources.
#[derive(Debug)]
struct Refusal(String);

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

/// Which targets the policy admits, shared by the first URL, every redirect hop and the
/// resolver.
#[derive(Debug)]
struct Gate {
    own: Origin,
    /// The Base URL's host when it is a name (the resolver admits its private addresses).
    own_name: Option<String>,
    allowed: Vec<Origin>,
    max_redirects: usize,
}

impl Gate {
    fn new(base: &BaseUrl, policy: &DownloadPolicy) -> Self {
        let own_name = match base.url().host() {
            Some(Host::Domain(name)) => Some(name.to_ascii_lowercase()),
            _ => None,
        };
        Self {
            own: base.url().origin(),
            own_name,
            allowed: policy.allowed_origins.clone(),
            max_redirects: policy.max_redirects,
        }
    }

    /// The checks every URL passes before a connection is made to it.
    fn check(&self, url: &Url) -> Result<(), Refusal> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refusal(format!("scheme {} is not http(s)", url.scheme())));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Refusal("the URL carries a user name or password".into()));
        }
        let origin = url.origin();
        if origin == self.own {
            return Ok(());
        }
        if !self.allowed.contains(&origin) {
            return Err(Refusal(format!(
                "{} is neither the Connector's origin nor an allowed one",
                origin.ascii_serialization()
            )));
        }
        let literal = match url.host() {
            Some(Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
            _ => None,
        };
        match literal {
            Some(ip) if !is_public(ip) => Err(Refusal(format!("{ip} is not a public address"))),
            _ => Ok(()),
        }
    }

    /// Whether a resolved address may be connected to for `name`.
    fn admits(&self, name: &str, ip: IpAddr) -> bool {
        if self.own_name.as_deref() == Some(name) {
            return !is_metadata(ip);
        }
        is_public(ip)
    }
}

/// Resolves with the system resolver and keeps only the addresses the gate admits, so what
/// is connected to is what was checked (a name that resolves elsewhere later is checked again).
struct GuardedResolver(Arc<Gate>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let gate = self.0.clone();
        let name = name.as_str().to_ascii_lowercase();
        Box::pin(async move {
            let found = tokio::net::lookup_host((name.as_str(), 0)).await?;
            let kept: Vec<SocketAddr> =
                found.filter(|addr| gate.admits(&name, addr.ip())).collect();
            if kept.is_empty() {
                return Err(Box::new(Refusal(format!(
                    "{name} resolves to no address the policy admits"
                ))) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// A file downloaded under the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    /// `Content-Type` of the response.
    pub content_type: Option<String>,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// The download client of one Connector: its own HTTP client (no proxy, the guarded
/// resolver, redirects through the gate) and the policy.
#[derive(Clone)]
pub(crate) struct Downloader {
    base: BaseUrl,
    gate: Arc<Gate>,
    max_bytes: u64,
    /// `Err` when the client could not be built: every download then fails (never an
    /// unguarded client in its place).
    http: Result<reqwest::Client, String>,
}

impl Downloader {
    pub(crate) fn new(base: &BaseUrl, policy: &DownloadPolicy, tls: &crate::TlsTrust) -> Self {
        let gate = Arc::new(Gate::new(base, policy));
        let hops = gate.clone();
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > hops.max_redirects {
                return attempt
                    .error(Refusal(format!("more than {} redirects", hops.max_redirects)));
            }
            match hops.check(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(refusal) => attempt.error(Refusal(format!("a redirect: {refusal}"))),
            }
        });
        let http = tls
            .http(reqwest::Client::builder())
            .no_proxy()
            .dns_resolver(GuardedResolver(gate.clone()))
            .redirect(redirects)
            .referer(false)
            .connect_timeout(Duration::from_secs(5))
            .timeout(policy.timeout)
            .build()
            .map_err(|e| format!("the download client could not be built: {e}"));
        Self { base: base.clone(), gate, max_bytes: policy.max_bytes, http }
    }

    /// Downloads `download_url` (relative ones resolve under the Base URL) under the policy.
    pub(crate) async fn fetch(&self, download_url: &str) -> Result<Downloaded, DownloadError> {
        let resolved =
            self.base.resolve(download_url).map_err(|e| DownloadError::Refused(e.to_string()))?;
        let url = Url::parse(&resolved).map_err(|e| DownloadError::Refused(e.to_string()))?;
        self.gate.check(&url).map_err(|r| DownloadError::Refused(r.0))?;
        let http = self.http.as_ref().map_err(|e| DownloadError::Failed(e.clone()))?;
        let mut response = http.get(url).send().await.map_err(classify)?;
        let status = response.status();
        if !status.is_success() {
            return Err(DownloadError::Failed(format!("answered HTTP {}", status.as_u16())));
        }
        let limit = self.max_bytes;
        if response.content_length().is_some_and(|declared| declared > limit) {
            return Err(DownloadError::TooLarge { limit });
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let cap = usize::try_from(limit).unwrap_or(usize::MAX);
        let declared = response.content_length().and_then(|n| usize::try_from(n).ok());
        let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(cap));
        while let Some(chunk) = response.chunk().await.map_err(classify)? {
            let needed = bytes.len().saturating_add(chunk.len());
            if needed > cap {
                return Err(DownloadError::TooLarge { limit });
            }
            if needed > bytes.capacity() {
                // Grow by doubling, but never past the limit: memory stays within it.
                let target = needed.max(bytes.capacity().saturating_mul(2)).min(cap);
                bytes.reserve_exact(target - bytes.len());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(Downloaded { content_type, bytes })
    }
}

/// A reqwest error as a download error: a refusal from the resolver or a redirect hop stays a
/// refusal; anything else is a failure (the detail without the URL).
fn classify(error: reqwest::Error) -> DownloadError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(current) = source {
        if let Some(refusal) = current.downcast_ref::<Refusal>() {
            return DownloadError::Refused(refusal.0.clone());
        }
        source = current.source();
    }
    if error.is_timeout() {
        return DownloadError::Failed("timed out".into());
    }
    let error = error.without_url();
    match crate::tls::TlsProblem::find(&error) {
        Some(problem) => DownloadError::Failed(format!("TLS failed: {problem}")),
        None => DownloadError::Failed(crate::tls::error_chain(&error)),
    }
}

/// Whether an address is on the public internet: not unspecified, loopback, private,
/// link-local, unique-local, CGNAT, multicast, documentation, benchmarking or reserved; an
/// IPv6 address that embeds an IPv4 one (mapped, compatible, NAT64, 6to4) is judged by it.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let refused = a == 0 // "this network"
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b)) // CGNAT
        || (a == 169 && b == 254) // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation
        || (a == 192 && b == 88 && c == 99) // 6to4 relay
        || (a == 192 && b == 168)
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || (a == 198 && b == 51 && c == 100) // documentation
        || (a == 203 && b == 0 && c == 113) // documentation
        || a >= 224; // multicast, reserved, broadcast
    !refused
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    let refused = ip.is_unspecified()
        || ip.is_loopback()
        || (s[0] & 0xfe00) == 0xfc00 // unique local (fd00:ec2::254 among them)
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] & 0xff00) == 0xff00 // multicast
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x2001 && s[1] < 0x0200) // Teredo, benchmarking, ORCHID and other IETF blocks
        || (s[0] == 0x0100 && s[1] == 0 && s[2] == 0 && s[3] == 0) // discard
        || (s[0] == 0x0064 && s[1] == 0xff9b && s[2] == 0x0001) // local-use NAT64
        || s[0] == 0; // the rest of ::/16 (reserved)
    !refused
}

/// The IPv4 address inside an IPv4-mapped, IPv4-compatible, NAT64 (64:ff9b::/96) or 6to4
/// (2002::/16) address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0, 0, 0, 0, 0, 0] && !ip.is_loopback() && !ip.is_unspecified() {
        return Some(low(s[6], s[7]));
    }
    if s[..6] == [0x0064, 0xff9b, 0, 0, 0, 0] {
        return Some(low(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return Some(low(s[1], s[2]));
    }
    None
}

/// Cloud metadata endpoints (and the link-local block most of them live in): refused even
/// when the Connector's own host name resolves to one. Only a Base URL naming the address
/// itself reaches it.
fn is_metadata(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            (a == 169 && b == 254)
                || v4 == Ipv4Addr::new(100, 100, 100, 200)
                || v4 == Ipv4Addr::new(192, 0, 0, 192)
        }
        IpAddr::V6(v6) => {
            v6 == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)
                || embedded_v4(v6).is_some_and(|v4| is_metadata(IpAddr::V4(v4)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn only_public_addresses_are_public() {
        for public in ["93.184.215.14", "8.8.8.8", "2606:4700::1111", "64:ff9b::808:808"] {
            assert!(is_public(ip(public)), "{public}");
        }
        for private in [
            "127.0.0.1",
            "127.0.0.2",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "192.0.0.192",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
            "fd00:ec2::254",
            "fc00::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "2001::1",
        ] {
            assert!(!is_public(ip(private)), "{private}");
        }
    }

    #[test]
    fn metadata_addresses_are_refused_even_for_the_connectors_own_name() {
        let base = BaseUrl::parse("http://connector.lan:8080").expect("base");
        let gate = Gate::new(&base, &DownloadPolicy::default());
        assert!(gate.admits("connector.lan", ip("10.0.0.5")), "its own name may be private");
        assert!(gate.admits("connector.lan", ip("127.0.0.1")));
        assert!(!gate.admits("connector.lan", ip("169.254.169.254")));
        assert!(!gate.admits("connector.lan", ip("fd00:ec2::254")));
        assert!(!gate.admits("connector.lan", ip("::ffff:169.254.169.254")));
        assert!(!gate.admits("other.lan", ip("10.0.0.5")), "another name may not");
        assert!(gate.admits("other.example", ip("93.184.215.14")));
    }

    #[test]
    fn only_the_connectors_origin_and_allowed_origins_pass() {
        let base = BaseUrl::parse("http://127.0.0.1:8080/im").expect("base");
        let policy = DownloadPolicy::default()
            .allow_origin("https://cdn.example")
            .expect("origin")
            .allow_origin("https://10.0.0.9")
            .expect("origin");
        let gate = Gate::new(&base, &policy);
        let check = |url: &str| gate.check(&Url::parse(url).expect("url")).is_ok();
        assert!(check("http://127.0.0.1:8080/im/files/refs/f?sig=1"), "own origin, loopback");
        assert!(!check("http://127.0.0.1:8081/x"), "another port is another origin");
        assert!(!check("https://127.0.0.1:8080/x"), "another scheme is another origin");
        assert!(!check("http://127.0.0.2:8080/x"));
        assert!(!check("http://localhost:8080/x"), "a name is not the literal origin");
        assert!(check("https://cdn.example/f"));
        assert!(check("https://cdn.example:443/f"), "the default port is the same origin");
        assert!(!check("http://cdn.example/f"), "the allowed origin is https only");
        assert!(!check("https://cdn.example:8443/f"));
        assert!(!check("https://10.0.0.9/f"), "an allowed origin on a private address");
        assert!(!check("http://user:pw@127.0.0.1:8080/im/x"), "userinfo");
        assert!(!check("ftp://127.0.0.1:8080/x"));
    }

    #[test]
    fn allowed_origins_are_origins_only() {
        assert!(parse_origin("https://files.example").is_ok());
        assert!(parse_origin("https://files.example:8443/").is_ok());
        for bad in [
            "files.example",
            "ftp://files.example",
            "https://files.example/path",
            "https://files.example/?q=1",
            "https://u@files.example",
            "https://",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_connector_hears_only_refused_or_failed() {
        let cases = [
            DownloadError::Refused("127.0.0.2:22 is not a public address".into()),
            DownloadError::TooLarge { limit: 5 },
            DownloadError::Failed("answered HTTP 404".into()),
        ];
        for error in &cases {
            let said = error.public_message();
            assert!(said == "download failed" || said.starts_with("refused by policy"), "{said}");
            assert!(!said.contains("127.0.0") && !said.contains("404"), "{said}");
        }
        assert!(!cases[0].is_retryable() && !cases[1].is_retryable() && cases[2].is_retryable());
        assert_eq!(cases[1].code(), ErrorCode::PayloadTooLarge);
    }

    #[test]
    fn logged_urls_lose_their_signature() {
        assert_eq!(
            loggable_url("http://127.0.0.1:8080/files/refs/f1?exp=9&sig=abcd"),
            "http://127.0.0.1:8080/files/refs/f1"
        );
        assert_eq!(loggable_url("/files/refs/f1?sig=abcd"), "/files/refs/f1");
    }
}
