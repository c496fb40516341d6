//! Access control of the streamable HTTP transport (`--http`): a bearer token on every request,
//! compared in constant time; repeated wrong tokens rate-limited; the listener on a loopback
//! address only. The token is generated into the state directory (owner-only, shown once) or
//! read from a file the operator gives (refused when others may read it).
//!
//! The `Host` and `Origin` checks against DNS rebinding and cross-site requests stay rmcp's
//! (its defaults: `Host` must be `localhost`, `127.0.0.1` or `::1`); they are no access
//! control, since any local client can send `Host: localhost`. The token is.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use xagent_protocol_types::Secret;

/// The file in the state directory that holds the generated token.
pub const TOKEN_FILE_NAME: &str = "mcp-http-token";
/// Shortest token accepted from a token file (characters).
pub const MIN_TOKEN_CHARS: usize = 32;
/// Longest token file read (bytes).
pub const MAX_TOKEN_FILE_BYTES: u64 = 4096;
/// Default number of wrong or missing tokens answered per minute before the rest get 429.
pub const DEFAULT_AUTH_FAILURES_PER_MINUTE: u32 = 60;

/// Why the HTTP transport cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpSetupError {
    /// `--http` names an address other machines could reach.
    #[error(
        "--http {0} is not a loopback address; the bridge serves MCP over plain HTTP on 127.0.0.1 or [::1] only. To reach it from another machine, forward the port over SSH (ssh -L) or put a TLS reverse proxy in front of the loopback address (see docs/MCP.md)"
    )]
    NotLoopback(SocketAddr),
    /// The token file could not be used.
    #[error("the HTTP token file {path}: {problem}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        problem: String,
    },
}

/// The listener must be on a loopback address (plain HTTP leaves the machine otherwise).
pub fn check_loopback(addr: SocketAddr) -> Result<(), HttpSetupError> {
    if addr.ip().is_loopback() { Ok(()) } else { Err(HttpSetupError::NotLoopback(addr)) }
}

/// Where the bearer token comes from.
#[derive(Debug, Clone)]
pub enum TokenSource {
    /// Generated once into `STATE_DIR/mcp-http-token` (0600) and reused after.
    StateDir(PathBuf),
    /// Read from a file the operator keeps (mode 0600 or stricter).
    File(PathBuf),
}

/// The token and whether it was just generated (then the caller shows it once).
#[derive(Debug)]
pub struct LoadedToken {
    /// The token.
    pub token: Secret,
    /// The file it is kept in.
    pub path: PathBuf,
    /// True on the first start: the token was generated now.
    pub generated: bool,
}

impl TokenSource {
    /// Reads the token, generating it into the state directory on first use.
    pub fn load(&self) -> Result<LoadedToken, HttpSetupError> {
        match self {
            Self::File(path) => Ok(LoadedToken {
                token: read_token_file(path)?,
                path: path.clone(),
                generated: false,
            }),
            Self::StateDir(dir) => {
                let path = dir.join(TOKEN_FILE_NAME);
                if path.exists() {
                    return Ok(LoadedToken {
                        token: read_token_file(&path)?,
                        path,
                        generated: false,
                    });
                }
                let token = generate_token_file(dir, &path)?;
                Ok(LoadedToken { token, path, generated: true })
            }
        }
    }
}

fn token_file_error(path: &Path, problem: impl Into<String>) -> HttpSetupError {
    HttpSetupError::TokenFile { path: path.to_path_buf(), problem: problem.into() }
}

/// Reads a token file: a regular file readable by its owner only, of at most
/// [`MAX_TOKEN_FILE_BYTES`], its first line the token (at least [`MIN_TOKEN_CHARS`] printable
/// characters).
pub fn read_token_file(path: &Path) -> Result<Secret, HttpSetupError> {
    let read = xagent_client_runtime::secret_file::read_secret_file(path, MAX_TOKEN_FILE_BYTES)
        .map_err(|e| token_file_error(path, e.to_string()))?;
    if read.shared {
        return Err(token_file_error(path, "is readable by other users; chmod 600 it"));
    }
    let token = read.value.expose();
    if token.chars().count() < MIN_TOKEN_CHARS || token.chars().any(char::is_control) {
        return Err(token_file_error(
            path,
            format!(
                "must hold one line of at least {MIN_TOKEN_CHARS} printable characters (e.g. openssl rand -hex 32)"
            ),
        ));
    }
    Ok(read.value)
}

/// Generates 256 random bits as hex into `path` (created 0600, the directory 0700).
fn generate_token_file(dir: &Path, path: &Path) -> Result<Secret, HttpSetupError> {
    use std::io::Write;
    let failed = |e: std::io::Error| token_file_error(path, format!("cannot be written ({e})"));
    std::fs::create_dir_all(dir).map_err(failed)?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)?;
        options.mode(0o600);
    }
    let token = hex::encode(rand::random::<[u8; 32]>());
    let mut file = options.open(path).map_err(failed)?;
    file.write_all(format!("{token}\n").as_bytes()).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    Ok(Secret::new(token))
}

/// How the HTTP transport checks its clients.
#[derive(Debug, Clone)]
pub struct HttpAuth {
    /// The bearer token every request must carry.
    pub token: Secret,
    /// Wrong or missing tokens answered 401 per minute; beyond it they get 429 (a client
    /// with the right token always gets in).
    pub failures_per_minute: u32,
}

impl HttpAuth {
    /// The token with the default failure rate.
    pub fn new(token: Secret) -> Self {
        Self { token, failures_per_minute: DEFAULT_AUTH_FAILURES_PER_MINUTE }
    }
}

/// A token bucket of refused requests: `per_minute` of them are answered 401 (with a burst of
/// as many), the rest 429 until the bucket refills. Clocked by tokio's (pausable) clock.
#[derive(Debug)]
pub(crate) struct FailureBudget {
    per_minute: f64,
    state: Mutex<(f64, Instant, u64)>,
}

impl FailureBudget {
    pub(crate) fn new(per_minute: u32) -> Self {
        let per_minute = f64::from(per_minute.max(1));
        Self { per_minute, state: Mutex::new((per_minute, Instant::now(), 0)) }
    }

    /// Takes one refusal from the budget: `true` when it may still be answered 401. Every
    /// hundredth refusal past the budget is logged (not each one).
    pub(crate) fn take(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(state.1).as_secs_f64();
        state.0 = (state.0 + elapsed * self.per_minute / 60.0).min(self.per_minute);
        state.1 = now;
        if state.0 >= 1.0 {
            state.0 -= 1.0;
            return true;
        }
        state.2 += 1;
        if state.2 % 100 == 1 {
            tracing::warn!(
                limited = state.2,
                "requests with a wrong or missing bearer token are over the limit; answering 429"
            );
        }
        false
    }

    /// Seconds until the next refusal may be answered 401.
    pub(crate) fn retry_after(&self) -> u64 {
        (60.0 / self.per_minute).ceil().max(1.0) as u64
    }
}

/// What the middleware holds.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    token: Secret,
    failures: Arc<FailureBudget>,
}

impl Gate {
    pub(crate) fn new(auth: &HttpAuth) -> Self {
        Self {
            token: auth.token.clone(),
            failures: Arc::new(FailureBudget::new(auth.failures_per_minute)),
        }
    }

    /// True when the request carries `Authorization: Bearer <the token>`.
    fn admits(&self, request: &Request) -> bool {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, rest) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then_some(rest.trim())
            })
            .unwrap_or("");
        // Constant-time, whatever is presented (an absent header compares an empty string).
        self.token.matches(presented) && !presented.is_empty()
    }
}

/// How long a refused request is held before its answer (slows a guessing loop down a bit).
const REFUSAL_DELAY: Duration = Duration::from_millis(50);

/// The axum middleware: a request without the right bearer token never reaches MCP.
pub(crate) async fn require_bearer(
    State(gate): State<Gate>,
    request: Request,
    next: Next,
) -> Response {
    if gate.admits(&request) {
        return next.run(request).await;
    }
    drop(request);
    tokio::time::sleep(REFUSAL_DELAY).await;
    if gate.failures.take() {
        tracing::debug!("refused an MCP HTTP request without the right bearer token");
        refusal(
            StatusCode::UNAUTHORIZED,
            "this MCP server needs the header `Authorization: Bearer <token>`; the token is in the bridge's state directory (mcp-http-token) or the file given with --http-token-file",
            None,
        )
    } else {
        refusal(
            StatusCode::TOO_MANY_REQUESTS,
            "too many requests with a wrong or missing bearer token; wait and send the right token",
            Some(gate.failures.retry_after()),
        )
    }
}

fn refusal(status: StatusCode, message: &str, retry_after: Option<u64>) -> Response {
    let body = serde_json::json!({"error": {"code": "unauthorized", "message": message}});
    let mut response = (status, Body::from(body.to_string())).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"xagent-connector-mcp\""),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(seconds) = retry_after
        && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
    {
        headers.insert(header::RETRY_AFTER, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(path).map(|m| m.permissions().mode() & 0o777).unwrap_or(0)
        }
        #[cfg(not(unix))]
        {
            let _ = path;
            0o600
        }
    }

    #[test]
    fn token_file_is_owner_only() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let state = root.path().join("state");
        let first = TokenSource::StateDir(state.clone()).load().unwrap_or_else(|e| panic!("{e}"));
        assert!(first.generated);
        assert_eq!(first.token.expose().len(), 64);
        assert_eq!(mode(&first.path), 0o600);
        assert_eq!(mode(&state), 0o700);
        // The second start reuses it and does not show it again.
        let again = TokenSource::StateDir(state).load().unwrap_or_else(|e| panic!("{e}"));
        assert!(!again.generated);
        assert_eq!(again.token, first.token);
        // The Debug and Display of the loaded token say nothing.
        let shown = format!("{again:?} {}", again.token);
        assert!(!shown.contains(first.token.expose()), "{shown}");

        // An operator's file readable by others is refused, with what to do.
        let given = root.path().join("token");
        std::fs::write(&given, "0123456789abcdef0123456789abcdef\n")
            .unwrap_or_else(|e| panic!("{e}"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&given, std::fs::Permissions::from_mode(0o644))
                .unwrap_or_else(|e| panic!("{e}"));
            let refused = TokenSource::File(given.clone()).load().err().map(|e| e.to_string());
            assert!(refused.as_deref().is_some_and(|m| m.contains("chmod 600")), "{refused:?}");
            std::fs::set_permissions(&given, std::fs::Permissions::from_mode(0o600))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let loaded = TokenSource::File(given.clone()).load().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded.token.expose(), "0123456789abcdef0123456789abcdef");
        // Too short a token is refused.
        std::fs::write(&given, "short\n").unwrap_or_else(|e| panic!("{e}"));
        assert!(TokenSource::File(given).load().is_err());
    }

    #[test]
    fn http_transport_refuses_a_non_loopback_address_without_tls() {
        for addr in ["0.0.0.0:8765", "192.168.1.10:8765", "[::]:8765"] {
            let addr: SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{e}"));
            let error = check_loopback(addr).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains("not a loopback address"), "{addr}: {error}");
        }
        for addr in ["127.0.0.1:0", "[::1]:8765", "127.0.0.2:1"] {
            let addr: SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{e}"));
            assert!(check_loopback(addr).is_ok(), "{addr}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn wrong_tokens_are_limited_and_refill_with_time() {
        let budget = FailureBudget::new(60);
        for n in 0..60 {
            assert!(budget.take(), "refusal {n} within the budget");
        }
        assert!(!budget.take(), "past the budget");
        assert_eq!(budget.retry_after(), 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(budget.take(), "one refilled after a second");
        assert!(!budget.take());
        tokio::time::advance(Duration::from_secs(3600)).await;
        for _ in 0..60 {
            assert!(budget.take());
        }
        assert!(!budget.take(), "the bucket holds at most a minute's worth");
    }
}
