//! The Connector Base URL and the fixed endpoints under it.

use url::Url;
use xagent_protocol_types::paths;

/// Why a Base URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BaseUrlError {
    /// Not a URL at all.
    #[error(
        "the Base URL is not a valid URL ({0}); give one like https://connector.example/prefix"
    )]
    Unparsable(String),
    /// Scheme other than http/https.
    #[error("the Base URL scheme is {0:?}; only http and https are allowed")]
    Scheme(String),
    /// No host.
    #[error("the Base URL has no host")]
    MissingHost,
    /// Userinfo present.
    #[error("the Base URL must not carry a user name or password; send the API key separately")]
    Userinfo,
    /// Query present.
    #[error("the Base URL must not carry a query string")]
    Query,
    /// Fragment present.
    #[error("the Base URL must not carry a fragment")]
    Fragment,
}

/// A validated Base URL: http or https, a host, an optional path prefix, and nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    url: Url,
}

impl BaseUrl {
    /// Parses and checks a Base URL.
    pub fn parse(text: &str) -> Result<Self, BaseUrlError> {
        let url = Url::parse(text.trim()).map_err(|e| BaseUrlError::Unparsable(e.to_string()))?;
        match url.scheme() {
            "http" | "https" => {}
            other => return Err(BaseUrlError::Scheme(other.to_owned())),
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(BaseUrlError::MissingHost);
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(BaseUrlError::Userinfo);
        }
        if url.query().is_some() {
            return Err(BaseUrlError::Query);
        }
        if url.fragment().is_some() {
            return Err(BaseUrlError::Fragment);
        }
        Ok(Self { url })
    }

    /// The Base URL as given (normalised).
    pub fn as_str(&self) -> &str {
        self.url.as_str()
    }

    /// The parsed URL, for the download policy's origin checks.
    pub(crate) fn url(&self) -> &Url {
        &self.url
    }

    /// The path prefix without a trailing slash (`""` when there is none).
    pub fn prefix(&self) -> &str {
        self.url.path().trim_end_matches('/')
    }

    /// An endpoint under the prefix, e.g. `endpoint("/health")`.
    pub fn endpoint(&self, path: &str) -> String {
        let mut url = self.url.clone();
        url.set_path(&format!("{}/{}", self.prefix(), path.trim_start_matches('/')));
        url.to_string()
    }

    /// `/connector-card.json`.
    pub fn card_url(&self) -> String {
        self.endpoint(paths::CONNECTOR_CARD)
    }

    /// `/skill.md`.
    pub fn skill_url(&self) -> String {
        self.endpoint(paths::SKILL)
    }

    /// `/health`.
    pub fn health_url(&self) -> String {
        self.endpoint(paths::HEALTH)
    }

    /// `/files/uploads`.
    pub fn uploads_url(&self) -> String {
        self.endpoint(paths::FILE_UPLOADS)
    }

    /// The data-plane URL: `/ws` with `ws` or `wss`.
    pub fn ws_url(&self) -> String {
        let endpoint = self.endpoint(paths::WS);
        match endpoint.strip_prefix("https://") {
            Some(rest) => format!("wss://{rest}"),
            None => format!("ws://{}", endpoint.trim_start_matches("http://")),
        }
    }

    /// Resolves a `download_url` from a message as a browser would: absolute http(s) URLs are
    /// kept (whether one may be fetched is the download policy's decision,
    /// [`crate::DownloadPolicy`], checked by every download); a root-relative path (`/prefix/files/refs/...`, what a Connector behind a path
    /// prefix signs) is resolved against the origin, so the prefix is not added twice; a
    /// path without a leading slash is resolved under the Base URL's prefix.
    pub fn resolve(&self, download_url: &str) -> Result<String, BaseUrlError> {
        if let Ok(absolute) = Url::parse(download_url) {
            return match absolute.scheme() {
                "http" | "https" => Ok(absolute.to_string()),
                other => Err(BaseUrlError::Scheme(other.to_owned())),
            };
        }
        if download_url.starts_with("//") {
            return Err(BaseUrlError::Unparsable(
                "a protocol-relative download_url is not accepted; use a path or an http(s) URL"
                    .into(),
            ));
        }
        let mut base = self.url.clone();
        base.set_path(&format!("{}/", self.prefix()));
        let resolved =
            base.join(download_url).map_err(|e| BaseUrlError::Unparsable(e.to_string()))?;
        if resolved.origin() != self.url.origin() {
            return Err(BaseUrlError::Unparsable("the download_url leaves the Connector".into()));
        }
        Ok(resolved.to_string())
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_rule_scheme_must_be_http_or_https() {
        assert_eq!(BaseUrl::parse("ftp://x.example"), Err(BaseUrlError::Scheme("ftp".into())));
        assert!(BaseUrl::parse("http://x.example").is_ok());
        assert!(BaseUrl::parse("https://x.example").is_ok());
    }

    #[test]
    fn base_url_rule_host_required() {
        assert!(BaseUrl::parse("http://").is_err());
        assert!(BaseUrl::parse("not a url").is_err());
    }

    #[test]
    fn base_url_rule_no_userinfo_query_or_fragment() {
        assert_eq!(BaseUrl::parse("http://u:p@x.example"), Err(BaseUrlError::Userinfo));
        assert_eq!(BaseUrl::parse("http://u@x.example"), Err(BaseUrlError::Userinfo));
        assert_eq!(BaseUrl::parse("http://x.example/?a=1"), Err(BaseUrlError::Query));
        assert_eq!(BaseUrl::parse("http://x.example/#f"), Err(BaseUrlError::Fragment));
    }

    #[test]
    fn path_prefix_is_kept_for_every_endpoint() {
        let base = BaseUrl::parse("https://x.example/connectors/wechat/").expect("valid");
        assert_eq!(base.card_url(), "https://x.example/connectors/wechat/connector-card.json");
        assert_eq!(base.health_url(), "https://x.example/connectors/wechat/health");
        assert_eq!(base.ws_url(), "wss://x.example/connectors/wechat/ws");
        let plain = BaseUrl::parse("http://127.0.0.1:8080").expect("valid");
        assert_eq!(plain.ws_url(), "ws://127.0.0.1:8080/ws");
        assert_eq!(plain.skill_url(), "http://127.0.0.1:8080/skill.md");
    }

    #[test]
    fn download_url_rule_root_relative_paths_resolve_against_the_origin() {
        let base = BaseUrl::parse("https://x.example/p").expect("valid");
        // The Connector signs the full path, prefix included: it must not be doubled.
        assert_eq!(
            base.resolve("/p/files/refs/file_1?exp=5&sig=ab").expect("resolves"),
            "https://x.example/p/files/refs/file_1?exp=5&sig=ab"
        );
        assert_eq!(
            base.resolve("files/refs/file_1").expect("relative"),
            "https://x.example/p/files/refs/file_1"
        );
        assert!(base.resolve("//evil.example/x").is_err());
        assert_eq!(
            base.resolve("https://cdn.example/f").expect("absolute"),
            "https://cdn.example/f"
        );
        assert!(base.resolve("file:///etc/passwd").is_err());
    }
}
