//! The page's shared state ([`Web`]) and what every handler asks of a request: the visitor's
//! session (cookie or bearer token, rechecked), the same-origin rule for writes, the public
//! origin, and the answer to a throttled request.

use super::admission::JoinRate;
use super::guard::{JoinThrottle, VisitorLimits};
use crate::app::App;
use crate::error::WebchatError;
use crate::guess::Refused;
use axum::Json;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use xagent_server_runtime::ConnectorHandle;

/// Name of the visitor session cookie.
const SESSION_COOKIE: &str = "wcv";

/// Longest access code looked at (longer ones are wrong without hashing them).
pub(crate) const MAX_ACCESS_CODE_BYTES: usize = 256;

/// Longest `client_id`.
pub(crate) const MAX_CLIENT_ID_BYTES: usize = 100;

/// How often a live event stream re-checks that its token is still valid.
pub(crate) const SESSION_RECHECK: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub(crate) struct Web {
    pub(crate) app: Arc<App>,
    pub(crate) handle: ConnectorHandle,
    pub(crate) shutdown: CancellationToken,
    pub(crate) limits: Arc<VisitorLimits>,
    pub(crate) throttle: Arc<tokio::sync::Mutex<JoinThrottle>>,
    /// Visitor sessions started per address (F12).
    pub(crate) join_rate: Arc<Mutex<JoinRate>>,
    pub(crate) uploads: Arc<Semaphore>,
    /// `Secure` on the session cookie (the public URL is https).
    pub(crate) secure_cookie: bool,
    /// The path the Connector is served under, from the public URL (`""` at a host's root,
    /// `/connectors/webchat` behind a proxy serving it there): the page's links, its API calls,
    /// the session cookie's path and redirects start with it.
    pub(crate) root: Arc<str>,
    /// The public URL's origin (`https://host[:port]`): a write whose `Origin` is it is
    /// same-site even when a proxy rewrote `Host` (nginx's `$host` drops the port).
    pub(crate) public_origin: Arc<str>,
}

impl Web {
    pub(crate) fn handle(&self) -> Result<&ConnectorHandle, WebchatError> {
        Ok(&self.handle)
    }

    pub(crate) fn now(&self) -> u64 {
        self.handle.now_millis()
    }

    pub(crate) fn join_rate(&self) -> MutexGuard<'_, JoinRate> {
        self.join_rate.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The path of a public URL without its trailing `/`: `""` for `https://chat.example.org`,
/// `/connectors/webchat` for `https://host/connectors/webchat/`. Only the characters a path
/// prefix needs are kept (it goes into HTML and a cookie).
pub(crate) fn root_path(public_url: &str) -> String {
    let after_scheme = public_url.split_once("://").map_or(public_url, |(_, rest)| rest);
    let path = after_scheme.find('/').map_or("", |i| &after_scheme[i..]);
    let path = path.split(['?', '#']).next().unwrap_or_default().trim_end_matches('/');
    path.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.' | '~'))
        .collect()
}

/// The bearer token, or the session cookies (several when paths overlap), in that order.
fn presented_tokens(headers: &HeaderMap) -> Vec<String> {
    let mut tokens = Vec::new();
    if let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        tokens.push(bearer.to_owned());
    }
    for value in headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()) {
        for pair in value.split(';') {
            if let Some((name, token)) = pair.trim().split_once('=')
                && name == SESSION_COOKIE
                && !token.is_empty()
            {
                tokens.push(token.to_owned());
            }
        }
    }
    tokens
}

/// A cookie-authenticated write from another site is refused even if a browser sent the
/// cookie (it is `SameSite=Strict`, so none should).
fn same_origin(headers: &HeaderMap, public_origin: &str) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    if !public_origin.is_empty() && origin.eq_ignore_ascii_case(public_origin) {
        return true;
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    origin.split_once("://").is_some_and(|(_, rest)| rest == host)
}

/// `scheme://authority` of a public URL (`""` when it has none).
pub(crate) fn public_origin(public_url: &str) -> String {
    let Some((scheme, rest)) = public_url.split_once("://") else { return String::new() };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() { String::new() } else { format!("{scheme}://{authority}") }
}

/// Checks the visitor token (bearer header or session cookie) against the room and returns
/// it. Tokens in the URL are not looked at.
pub(crate) async fn visitor(
    web: &Web,
    room_id: &str,
    headers: &HeaderMap,
) -> Result<String, WebchatError> {
    let now = web.now();
    for token in presented_tokens(headers) {
        if let Some(room) = web.app.store()?.visitor_room(&token, now).await?
            && room == room_id
        {
            return Ok(token);
        }
    }
    Err(WebchatError::Forbidden)
}

/// [`visitor`] for requests that change something: also refuses cross-site origins.
pub(crate) async fn visitor_write(
    web: &Web,
    room_id: &str,
    headers: &HeaderMap,
) -> Result<String, WebchatError> {
    if !same_origin(headers, &web.public_origin) {
        return Err(WebchatError::Forbidden);
    }
    visitor(web, room_id, headers).await
}

pub(crate) fn session_cookie(
    web: &Web,
    room_id: &str,
    token: &str,
    max_age_secs: u64,
) -> Option<HeaderValue> {
    let secure = if web.secure_cookie { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={token}; Path={}/chat/api/rooms/{room_id}/; Max-Age={max_age_secs}; HttpOnly; SameSite=Strict{secure}",
        web.root
    ))
    .ok()
}

/// A session answer: the JSON body plus the cookie that carries the token for the page.
pub(crate) fn with_session(
    web: &Web,
    room_id: &str,
    token: &str,
    body: serde_json::Value,
) -> Response {
    let mut response = Json(body).into_response();
    let max_age = web.limits.token_lifetime_millis / 1_000;
    if let Some(cookie) = session_cookie(web, room_id, token, max_age) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The 429 of a refused join: whose wrong codes, and when to try again.
pub(crate) fn throttled(refused: Refused) -> WebchatError {
    let secs = refused.wait_millis().div_ceil(1_000).max(1);
    let message = match refused {
        Refused::Key { .. } => {
            format!("too many wrong access codes from your address; try again in {secs} s")
        }
        Refused::Room { .. } => {
            format!("this room had too many wrong access codes; try again in {secs} s")
        }
    };
    WebchatError::TooManyRequests { message, retry_after_secs: secs }
}

#[cfg(test)]
mod tests {
    use super::{public_origin, root_path, same_origin};

    #[test]
    fn a_write_from_the_public_origin_is_same_site_whatever_host_the_proxy_sent() {
        let origin = public_origin("https://127.0.0.1:8443/connectors/webchat");
        assert_eq!(origin, "https://127.0.0.1:8443");
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("origin", "https://127.0.0.1:8443".parse().unwrap());
        // nginx's `proxy_set_header Host $host` drops the port.
        headers.insert("host", "127.0.0.1".parse().unwrap());
        assert!(same_origin(&headers, &origin));
        assert!(!same_origin(&headers, ""), "without the public origin only Host could tell");
        headers.insert("origin", "https://evil.example".parse().unwrap());
        assert!(!same_origin(&headers, &origin), "another site is refused");
    }

    #[test]
    fn the_root_is_the_public_urls_path_without_its_last_slash() {
        assert_eq!(root_path("https://chat.example.org"), "");
        assert_eq!(root_path("https://chat.example.org/"), "");
        assert_eq!(root_path("http://127.0.0.1:8080"), "");
        assert_eq!(root_path("https://host/connectors/webchat/"), "/connectors/webchat");
        assert_eq!(root_path("https://host/connectors/webchat?x=1"), "/connectors/webchat");
        // Nothing that could leave an HTML attribute or a cookie attribute.
        assert_eq!(root_path("https://host/a\"><script>;Path=/"), "/ascriptPath");
    }
}
