//! The visitor side: the chat page (HTML, CSS and JS compiled into the binary) and its small
//! JSON API under `/chat/api/`, with Server-Sent Events for live updates. It is separate from
//! xAgent's `/ws` and never needs the system API key: a visitor holds a room token obtained
//! with the room's access code (or by confirming a pairing link).
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/chat/`, `/chat/r/{room}`, `/chat/pair/{token}` | the page |
//! | POST | `/chat/api/rooms/{room}/join` `{access_code}` | `{token, room_id, room_name, expires_at}` + the session cookie |
//! | GET | `/chat/api/rooms/{room}/session` | `{room_id, room_name}` while the session is valid |
//! | DELETE | `/chat/api/rooms/{room}/session` | ends the session (revokes the token) |
//! | GET | `/chat/api/rooms/{room}/events` | SSE: a `snapshot`, then `message`, `draft`, `activity`, `agent` |
//! | POST | `/chat/api/rooms/{room}/messages` `{text, client_id}` | the stored message |
//! | POST | `/chat/api/rooms/{room}/uploads` multipart `file`, `text`, `client_id` | the stored message |
//! | GET | `/chat/api/rooms/{room}/files/{file_ref}` | a file of the room |
//! | POST | `/chat/api/pair/{token}/scan` | marks the pairing `scanned` |
//! | POST | `/chat/api/pair/{token}/confirm` `{room_name}` | creates the room: `{token, room_id, room_name, access_code}` + the session cookie |
//!
//! The token travels as `Authorization: Bearer` (API clients) or in the `HttpOnly`,
//! `SameSite=Strict` cookie `wcv` scoped to the room's API path (the page, `EventSource`,
//! `<img>`); never in a URL. Every limit is a field of [`VisitorLimits`].

mod admission;
mod guard;

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::multipart::{Field, MultipartError};
use axum::extract::{DefaultBodyLimit, Multipart, Path, State};
use axum::http::{Extensions, HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use xagent_protocol_types::{ChatMessage, ConnectorChannelId, FileRef};
use xagent_server_runtime::{ConnectorHandle, HandleError, StorageError};

use crate::connector::App;
use crate::error::WebchatError;
use crate::guess::Refused;
use crate::hub::{RoomEvent, StreamCaps, StreamLimit};
use crate::messages::Sent;
use crate::store::{
    Author, ChatEntry, EntryFile, EntryStatus, QuotaRefusal, RoomClaim, UploadReservation,
    hash_token, random_hex,
};
pub use admission::JoinRate;
pub use guard::{JoinThrottle, MAX_PAGE_UPLOAD_BYTES, MAX_TEXT_CHARS, VisitorLimits};

/// Name of the visitor session cookie.
const SESSION_COOKIE: &str = "wcv";
/// Longest access code looked at (longer ones are wrong without hashing them).
const MAX_ACCESS_CODE_BYTES: usize = 256;
/// Longest `client_id`.
const MAX_CLIENT_ID_BYTES: usize = 100;
/// How often a live event stream re-checks that its token is still valid.
const SESSION_RECHECK: Duration = Duration::from_secs(30);

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");
const ICON_SVG: &str = include_str!("../assets/icon.svg");

#[derive(Clone)]
struct Web {
    app: Arc<App>,
    handle: ConnectorHandle,
    shutdown: CancellationToken,
    limits: Arc<VisitorLimits>,
    throttle: Arc<tokio::sync::Mutex<JoinThrottle>>,
    /// Visitor sessions started per address (F12).
    join_rate: Arc<Mutex<JoinRate>>,
    uploads: Arc<Semaphore>,
    /// `Secure` on the session cookie (the public URL is https).
    secure_cookie: bool,
    /// The path the Connector is served under, from the public URL (`""` at a host's root,
    /// `/connectors/webchat` behind a proxy serving it there): the page's links, its API calls,
    /// the session cookie's path and redirects start with it.
    root: Arc<str>,
    /// The public URL's origin (`https://host[:port]`): a write whose `Origin` is it is
    /// same-site even when a proxy rewrote `Host` (nginx's `$host` drops the port).
    public_origin: Arc<str>,
}

impl Web {
    fn handle(&self) -> Result<&ConnectorHandle, WebchatError> {
        Ok(&self.handle)
    }

    fn now(&self) -> u64 {
        self.handle.now_millis()
    }

    fn join_rate(&self) -> MutexGuard<'_, JoinRate> {
        self.join_rate.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The page routes and the visitor API with these limits, built with the runtime's handle
/// (the runtime serves them next to its own routes).
pub(crate) fn router(
    app: Arc<App>,
    handle: ConnectorHandle,
    shutdown: CancellationToken,
    limits: VisitorLimits,
) -> Router {
    let secure_cookie = app.public_url.starts_with("https://");
    let app_url = app.public_url.clone();
    let root: Arc<str> = root_path(&app.public_url).into();
    let upload_body = usize::try_from(limits.max_upload_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(limits.max_text_chars.saturating_mul(4))
        .saturating_add(64 * 1024);
    let json_body = limits.max_json_bytes;
    let throttle = Arc::new(tokio::sync::Mutex::new(JoinThrottle::new(&limits)));
    let web = Web {
        app,
        handle,
        shutdown,
        uploads: Arc::new(Semaphore::new(limits.concurrent_uploads.max(1))),
        limits: Arc::new(limits),
        throttle,
        join_rate: Arc::new(Mutex::new(JoinRate::default())),
        secure_cookie,
        root: Arc::clone(&root),
        public_origin: public_origin(&app_url).into(),
    };
    let home = format!("{root}/chat/");
    let again = home.clone();
    Router::new()
        .route("/", get(move || async move { Redirect::to(&home) }))
        .route("/chat", get(move || async move { Redirect::to(&again) }))
        .route("/chat/", get(page))
        .route("/chat/r/{room}", get(page))
        .route("/chat/pair/{token}", get(page))
        .route(
            "/chat/assets/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route("/chat/assets/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
        .route("/chat/assets/icon.svg", get(|| async { asset("image/svg+xml", ICON_SVG) }))
        .route("/chat/api/rooms/{room}/join", post(join))
        .route("/chat/api/rooms/{room}/session", get(session).delete(leave))
        .route("/chat/api/rooms/{room}/events", get(events))
        .route("/chat/api/rooms/{room}/messages", post(send_text))
        .route(
            "/chat/api/rooms/{room}/uploads",
            post(send_file).layer(DefaultBodyLimit::max(upload_body)),
        )
        .route("/chat/api/rooms/{room}/files/{file_ref}", get(file))
        .route("/chat/api/pair/{token}/scan", post(pair_scan))
        .route("/chat/api/pair/{token}/confirm", post(pair_confirm))
        // One body limit for every other visitor route.
        .layer(DefaultBodyLimit::max(json_body))
        .with_state(web)
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

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body)
        .into_response()
}

async fn page(State(web): State<Web>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
            ),
        ],
        INDEX_HTML.replace("{{ROOT}}", &web.root),
    )
        .into_response()
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
fn public_origin(public_url: &str) -> String {
    let Some((scheme, rest)) = public_url.split_once("://") else { return String::new() };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() { String::new() } else { format!("{scheme}://{authority}") }
}

/// Checks the visitor token (bearer header or session cookie) against the room and returns
/// it. Tokens in the URL are not looked at.
async fn visitor(web: &Web, room_id: &str, headers: &HeaderMap) -> Result<String, WebchatError> {
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
async fn visitor_write(
    web: &Web,
    room_id: &str,
    headers: &HeaderMap,
) -> Result<String, WebchatError> {
    if !same_origin(headers, &web.public_origin) {
        return Err(WebchatError::Forbidden);
    }
    visitor(web, room_id, headers).await
}

fn session_cookie(web: &Web, room_id: &str, token: &str, max_age_secs: u64) -> Option<HeaderValue> {
    let secure = if web.secure_cookie { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={token}; Path={}/chat/api/rooms/{room_id}/; Max-Age={max_age_secs}; HttpOnly; SameSite=Strict{secure}",
        web.root
    ))
    .ok()
}

/// A session answer: the JSON body plus the cookie that carries the token for the page.
fn with_session(web: &Web, room_id: &str, token: &str, body: serde_json::Value) -> Response {
    let mut response = Json(body).into_response();
    let max_age = web.limits.token_lifetime_millis / 1_000;
    if let Some(cookie) = session_cookie(web, room_id, token, max_age) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The 429 of a refused join: whose wrong codes, and when to try again.
fn throttled(refused: Refused) -> WebchatError {
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

/// Takes one of the address's joins (F12): a new visitor session costs a database row, so an
/// address may start [`VisitorLimits::joins_per_address_burst`] at once and then
/// [`VisitorLimits::joins_per_address_per_minute`]; beyond that 429 with `Retry-After`.
fn take_join(web: &Web, peer: Option<IpAddr>, now: u64) -> Result<(), WebchatError> {
    web.join_rate().take(peer, now, &web.limits).map_err(|wait_millis| {
        let secs = wait_millis.div_ceil(1_000).max(1);
        WebchatError::TooManyRequests {
            message: format!("too many new chat sessions from your address; try again in {secs} s"),
            retry_after_secs: secs,
        }
    })
}

#[derive(Deserialize)]
struct JoinBody {
    access_code: String,
}

async fn join(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    extensions: Extensions,
    Json(body): Json<JoinBody>,
) -> Result<Response, WebchatError> {
    let now = web.now();
    let peer: Option<IpAddr> = xagent_server_runtime::peer_ip(&extensions);
    take_join(&web, peer, now)?;
    if let Err(error) = check_join_code(&web, &room_id, peer, &body.access_code, now).await {
        // A wrong or refused code starts no session: the join throttle counts it instead.
        web.join_rate().refund(peer, now, &web.limits);
        return Err(error);
    }
    let room = web.app.store()?.room(&room_id).await?.ok_or(WebchatError::Forbidden)?;
    let expires_at = now.saturating_add(web.limits.token_lifetime_millis);
    let token = web.app.store()?.add_visitor(&room_id, now, expires_at).await?;
    let body = json!({
        "token": token, "room_id": room.room_id, "room_name": room.name, "expires_at": expires_at,
    });
    Ok(with_session(&web, &room_id, &token, body))
}

/// Checks a visitor's access code under the join throttle (F5): the address's backoff in
/// this process, the room's budget in the storage (shared by every replica). The admission,
/// the check and its count happen under one lock of this process, so parallel tries cannot
/// slip past the limits.
async fn check_join_code(
    web: &Web,
    room_id: &str,
    peer: Option<IpAddr>,
    code: &str,
    now: u64,
) -> Result<(), WebchatError> {
    let store = web.app.store()?;
    let mut throttle = web.throttle.lock().await;
    throttle.admit(peer, now).map_err(throttled)?;
    if !crate::store::is_room_id(room_id) {
        // No room has this id: a wrong code, kept by the address alone.
        throttle.failed(peer, now);
        return Err(WebchatError::Forbidden);
    }
    let guess = match store.begin_guess("join", room_id, throttle.room_rate(), now).await? {
        Ok(guess) => guess,
        Err(wait) => return Err(throttled(throttle.refused_by_room(peer, wait, now))),
    };
    let right = code.len() <= MAX_ACCESS_CODE_BYTES && store.check_code(room_id, code).await?;
    if right {
        throttle.succeeded(peer);
        drop(throttle);
        store.forget_guess(guess).await?;
        return Ok(());
    }
    throttle.failed(peer, now);
    drop(throttle);
    tracing::warn!(room = ?room_id, peer = ?peer, "wrong access code for a room");
    Err(WebchatError::Forbidden)
}

async fn session(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, WebchatError> {
    visitor(&web, &room_id, &headers).await?;
    let room = web.app.store()?.room(&room_id).await?.ok_or(WebchatError::Forbidden)?;
    Ok(Json(json!({ "room_id": room.room_id, "room_name": room.name })).into_response())
}

/// Ends the session: the token stops working and the cookie is cleared.
async fn leave(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, WebchatError> {
    let token = visitor_write(&web, &room_id, &headers).await?;
    web.app.end_visitor_session(&token).await?;
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(cookie) = session_cookie(&web, &room_id, "", 0) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    Ok(response)
}

/// The snapshot a page gets on (re)connecting: the newest messages that fit in
/// [`VisitorLimits::snapshot_bytes`].
async fn snapshot(web: &Web, room_id: &str) -> Result<RoomEvent, WebchatError> {
    let room = web.app.store()?.room(room_id).await?.ok_or(WebchatError::Forbidden)?;
    let (_, drafts, activity) = web.app.hub.subscribe(room_id);
    let online = room.channel.as_ref().is_some_and(|channel| web.handle.is_routed(channel));
    let mut messages = web.app.messages()?.history(room_id).await?;
    let mut budget = web.limits.snapshot_bytes;
    let mut keep = 0;
    for entry in messages.iter().rev() {
        let size = serde_json::to_vec(entry).map_or(usize::MAX, |bytes| bytes.len());
        if size > budget {
            break;
        }
        budget -= size;
        keep += 1;
    }
    messages.drain(..messages.len() - keep);
    Ok(RoomEvent::Snapshot {
        room_id: room.room_id,
        room_name: room.name,
        agent_online: online,
        messages,
        drafts,
        activity,
    })
}

fn sse_event(event: &RoomEvent) -> Event {
    Event::default().data(serde_json::to_string(event).unwrap_or_else(|_| "{}".into()))
}

/// What a live stream carries besides the room's broadcast receiver.
struct Live {
    web: Web,
    room_id: String,
    token: String,
    rx: tokio::sync::broadcast::Receiver<RoomEvent>,
    /// Cancelled when the session ends (leave, code change): the stream ends at once (F4).
    ended: CancellationToken,
    /// When the session expires (Unix ms, the injected clock).
    expires_at: u64,
    _place: crate::hub::StreamGuard,
}

/// The stream caps of [`VisitorLimits`] as the hub takes them.
fn stream_caps(limits: &VisitorLimits) -> StreamCaps {
    StreamCaps {
        per_token: limits.streams_per_token,
        per_address: limits.streams_per_address,
        per_room: limits.streams_per_room,
        total: limits.streams_total,
    }
}

impl Live {
    /// Whether the session may still see events: checked before each one (F4).
    fn session_open(&self) -> bool {
        !self.ended.is_cancelled() && self.web.now() < self.expires_at
    }

    /// How long to wait for the next event before looking at the session again.
    fn recheck_in(&self) -> Duration {
        let left = self.expires_at.saturating_sub(self.web.now());
        SESSION_RECHECK.min(Duration::from_millis(left.max(1)))
    }

    /// The next event for the page, or `None` when the stream ends: the session ended or
    /// expired, the reader is too slow, or the room's broadcast closed.
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if !self.session_open() {
                return None;
            }
            let wait = self.recheck_in();
            let next = tokio::select! {
                biased;
                () = self.ended.cancelled() => return None,
                next = tokio::time::timeout(wait, self.rx.recv()) => next,
            };
            match next {
                Ok(Ok(event)) if self.session_open() => return Some(sse_event(&event)),
                Ok(Ok(_)) => return None,
                // Too slow a reader: the stream ends and the page reconnects to a fresh
                // snapshot, instead of the Connector buffering for it.
                Ok(Err(RecvError::Lagged(_) | RecvError::Closed)) => return None,
                Err(_) => {
                    let now = self.web.now();
                    let room = match self.web.app.store() {
                        Ok(store) => store.visitor_room(&self.token, now).await,
                        Err(error) => Err(error),
                    };
                    match room {
                        Ok(Some(room)) if room == self.room_id => {}
                        // Expired or revoked: the page learns it when it reconnects.
                        _ => return None,
                    }
                }
            }
        }
    }
}

async fn events(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    headers: HeaderMap,
    extensions: Extensions,
) -> Result<impl axum::response::IntoResponse, WebchatError> {
    let token = visitor(&web, &room_id, &headers).await?;
    // Counted per address too (F6), so one address never holds a room's streams.
    let address = xagent_server_runtime::peer_ip(&extensions).map(guard::addr_key);
    let caps = stream_caps(&web.limits);
    let opened = web.app.hub.open_stream(&room_id, &hash_token(&token), address, caps);
    let place = opened.map_err(|limit| {
        let message = match limit {
            StreamLimit::Token => "this session has too many open pages; close one",
            StreamLimit::Address => {
                "too many chat pages are open from your address; close one and try again"
            }
            StreamLimit::Room => "this room has too many open pages right now; try again later",
            StreamLimit::Total => "the chat is too busy right now; try again later",
        };
        WebchatError::TooManyRequests { message: message.into(), retry_after_secs: 10 }
    })?;
    // F4: the session is looked at again now that its end signal is registered, so an end
    // between the first check and the registration is not missed.
    let ended = place.session_ended();
    let session = web
        .app
        .store()?
        .visitor_session(&token, web.now())
        .await?
        .filter(|session| session.room_id == room_id && !ended.is_cancelled())
        .ok_or(WebchatError::Forbidden)?;
    // Subscribe before reading the snapshot so nothing falls between them.
    let (rx, _, _) = web.app.hub.subscribe(&room_id);
    let first = sse_event(&snapshot(&web, &room_id).await?).retry(Duration::from_millis(1_000));
    let shutdown = web.shutdown.clone();
    let expires_at = session.expires_at;
    let live = Live { web, room_id, token, rx, ended, expires_at, _place: place };
    let live = futures_util::stream::unfold(live, |mut live| async move {
        live.next_event().await.map(|event| (event, live))
    });
    let stream = futures_util::stream::once(async move { first })
        .chain(live)
        .map(Ok::<Event, Infallible>)
        .take_until(shutdown.cancelled_owned());
    let sse = Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)));
    // nginx buffers proxied responses by default, which would hold events back until a
    // buffer fills: this header turns that off for the stream alone.
    Ok(([(axum::http::header::HeaderName::from_static("x-accel-buffering"), "no")], sse))
}

#[derive(Deserialize)]
struct SendBody {
    text: String,
    #[serde(default)]
    client_id: Option<String>,
}

fn check_client_id(client_id: Option<&str>) -> Result<(), WebchatError> {
    match client_id {
        Some(id) if id.is_empty() || id.len() > MAX_CLIENT_ID_BYTES => {
            Err(WebchatError::InvalidInput("client_id must have 1-100 characters".into()))
        }
        _ => Ok(()),
    }
}

/// The one text rule of every visitor route (H3): trimmed, at most
/// [`VisitorLimits::max_text_chars`] characters; `None` when empty.
fn check_text(text: &str, limits: &VisitorLimits) -> Result<Option<String>, WebchatError> {
    let text = text.trim();
    if text.chars().count() > limits.max_text_chars {
        return Err(WebchatError::InvalidInput(format!(
            "the text must have 1-{} characters",
            limits.max_text_chars
        )));
    }
    Ok(Some(text.to_owned()).filter(|t| !t.is_empty()))
}

/// Hands a stored visitor message (`outbound`, its exact `chat.message`) to the runtime's
/// outbox unless the runtime holds it already (the process stopped between storing and
/// queueing it, or a failover left it `sending`). `when` says in the log which path found it.
pub(crate) async fn requeue(
    handle: &ConnectorHandle,
    channel: &ConnectorChannelId,
    message_id: &str,
    outbound: &str,
    when: &str,
) {
    if handle.pending_messages(channel).iter().any(|id| id.as_str() == message_id) {
        return;
    }
    let Ok(message) = serde_json::from_str::<ChatMessage>(outbound) else { return };
    if let Err(error) = handle.send_message(channel, message).await {
        tracing::info!(%error, when, "a stored visitor message could not be queued again");
    }
}

/// Queues a repeated send's stored message again when the runtime does not hold it.
async fn resubmit(web: &Web, channel: &ConnectorChannelId, message_id: &str) {
    let Ok(handle) = web.handle() else { return };
    let Ok(messages) = web.app.messages() else { return };
    let Ok(Some((_, outbound))) = messages.outbound_of(message_id).await else { return };
    requeue(handle, channel, message_id, &outbound, "repeated send").await;
}

/// Queues every stored visitor message the runtime does not hold (called at start: a
/// message stored just before a crash is delivered after it).
pub(crate) async fn recover_pending(app: Arc<App>, handle: ConnectorHandle) {
    let Ok(messages) = app.messages() else { return };
    let Ok(sending) = messages.sending().await else { return };
    for (room_id, message_id, outbound) in sending {
        let Ok(store) = app.store() else { return };
        let Ok(Some(room)) = store.room(&room_id).await else { continue };
        let Some(channel) = room.channel else { continue };
        requeue(&handle, &channel, &message_id, &outbound, "start").await;
    }
}

/// Stores a visitor message, shows it, and hands it to xAgent through the runtime's outbox.
/// The stored row keeps the exact `chat.message`, so a repeat of the send (same
/// `client_id`) or the next start queues it again if it never reached the outbox (M4).
async fn relay(
    web: &Web,
    room_id: &str,
    entry: ChatEntry,
    message: ChatMessage,
) -> Result<ChatEntry, WebchatError> {
    let room = web.app.store()?.room(room_id).await?.ok_or(WebchatError::Forbidden)?;
    let channel = room.channel.ok_or(WebchatError::NoAgent)?;
    let outbound = serde_json::to_string(&message)
        .map_err(|e| StorageError::new("encoding an outbound message", e))?;
    let handle = web.handle()?;
    let sent = web
        .app
        .messages()?
        .insert_sent(
            room_id,
            &entry,
            &outbound,
            |writes| handle.send_message_with(&channel, message, writes),
            |error: &HandleError| {
                tracing::info!(%error, room = room_id, "the runtime did not take a visitor message");
                match error.code() {
                    xagent_protocol_types::ErrorCode::ConnectionNotAuthenticated
                    | xagent_protocol_types::ErrorCode::ConnectionNotFound => {
                        "the agent is not connected to this room right now; send it again later"
                            .to_owned()
                    }
                    _ => format!("not sent: {error}"),
                }
            },
        )
        .await?;
    let entry = match sent {
        Sent::Existing(existing) => {
            if existing.status == EntryStatus::Sending {
                resubmit(web, &channel, &existing.message_id).await;
            }
            return Ok(existing);
        }
        Sent::Queued(entry) | Sent::Refused(entry) => entry,
    };
    web.app.publish(room_id, entry.clone());
    Ok(entry)
}

async fn send_text(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    headers: HeaderMap,
    Json(body): Json<SendBody>,
) -> Result<Response, WebchatError> {
    visitor_write(&web, &room_id, &headers).await?;
    check_client_id(body.client_id.as_deref())?;
    let text = check_text(&body.text, &web.limits)?.ok_or_else(|| {
        WebchatError::InvalidInput(format!(
            "the text must have 1-{} characters",
            web.limits.max_text_chars
        ))
    })?;
    let now = web.now();
    let message_id = format!("msg_web_{}", random_hex(12));
    let entry = ChatEntry {
        message_id: message_id.clone(),
        author: Author::Visitor,
        text: Some(text.clone()),
        files: vec![],
        status: EntryStatus::Sending,
        error: None,
        client_id: body.client_id,
        created_at: now,
    };
    let message = ChatMessage::text(message_id, text).created_at(now);
    Ok(Json(relay(&web, &room_id, entry, message).await?).into_response())
}

fn form_error(error: MultipartError, limits: &VisitorLimits) -> WebchatError {
    if error.status() == StatusCode::PAYLOAD_TOO_LARGE {
        too_large(limits)
    } else {
        WebchatError::Form(error)
    }
}

fn too_large(limits: &VisitorLimits) -> WebchatError {
    WebchatError::TooLarge(format!(
        "the file is too large: files up to {} MiB can be sent",
        limits.max_upload_bytes / (1024 * 1024)
    ))
}

/// Reads a small text field, refusing more than `limit` bytes.
async fn small_field(
    mut field: Field<'_>,
    limit: usize,
    limits: &VisitorLimits,
) -> Result<String, WebchatError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(|e| form_error(e, limits))? {
        if bytes.len() + chunk.len() > limit {
            return Err(WebchatError::InvalidInput(format!(
                "the text must have 1-{} characters",
                limits.max_text_chars
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    String::from_utf8(bytes).map_err(|_| WebchatError::InvalidInput("text must be UTF-8".into()))
}

/// An upload's hold on the day's visitor quota (F14): taken before the first byte is stored,
/// settled to the real size once the file is in the store, and given back when the upload
/// fails or is abandoned (the request dropped half-way drops the hold).
struct QuotaHold {
    app: Arc<App>,
    reservation: UploadReservation,
    settled: bool,
}

impl QuotaHold {
    /// The most bytes the upload may store.
    fn bytes(&self) -> u64 {
        self.reservation.bytes
    }

    /// The upload is stored with `bytes`: only those stay counted.
    async fn settle(mut self, bytes: u64) -> Result<(), WebchatError> {
        self.settled = true;
        self.app.store()?.settle_upload(&self.reservation.id, bytes).await
    }
}

impl Drop for QuotaHold {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        // Given back in the background (a drop cannot wait); a reservation whose give-back
        // is lost stops counting once it is stale.
        let (app, id) = (Arc::clone(&self.app), std::mem::take(&mut self.reservation.id));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let released = match app.store() {
                    Ok(store) => store.release_upload(&id).await,
                    Err(error) => Err(error),
                };
                if let Err(error) = released {
                    tracing::warn!(%error, "an unfinished upload's quota could not be given back");
                }
            });
        }
    }
}

/// Reserves a file and up to [`VisitorLimits::max_upload_bytes`] (less when the request's
/// `Content-Length` says the body is smaller) of the room's and everybody's daily allowance
/// (M3, F13: a room has at most its share), atomically with the check (F14). 507 when either
/// is used up.
async fn reserve_upload(
    web: &Web,
    room_id: &str,
    headers: &HeaderMap,
    now: u64,
) -> Result<QuotaHold, WebchatError> {
    let quota = web.limits.upload_quota();
    // The file is never larger than the whole body, so a declared length bounds it.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let want = declared.map_or(web.limits.max_upload_bytes, |n| n.min(web.limits.max_upload_bytes));
    match web.app.store()?.reserve_upload(room_id, want, &quota, now).await? {
        Ok(reservation) => Ok(QuotaHold { app: Arc::clone(&web.app), reservation, settled: false }),
        Err(QuotaRefusal::Room) => Err(WebchatError::StoreFull(
            "this room's upload allowance for today is used up; try again tomorrow".into(),
        )),
        Err(QuotaRefusal::Everybody) => Err(WebchatError::StoreFull(
            "the chat takes no more files today; try again later".into(),
        )),
    }
}

/// The stored message of a repeated send (same `client_id`), queued again if it never
/// reached the runtime.
async fn repeated(
    web: &Web,
    room_id: &str,
    client_id: Option<&str>,
) -> Result<Option<ChatEntry>, WebchatError> {
    let Some(client_id) = client_id else { return Ok(None) };
    let Some(existing) = web.app.messages()?.entry_by_client(room_id, client_id).await? else {
        return Ok(None);
    };
    if existing.status == EntryStatus::Sending
        && let Some(channel) = web.app.store()?.room(room_id).await?.and_then(|r| r.channel)
    {
        resubmit(web, &channel, &existing.message_id).await;
    }
    Ok(Some(existing))
}

async fn send_file(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    headers: HeaderMap,
    mut form: Multipart,
) -> Result<Response, WebchatError> {
    visitor_write(&web, &room_id, &headers).await?;
    // Bounds the uploads written at once.
    let _turn =
        Arc::clone(&web.uploads).acquire_owned().await.map_err(|_| WebchatError::ShuttingDown)?;
    let limits = Arc::clone(&web.limits);
    let mut stored: Option<(xagent_protocol_types::ChatFile, String, u64)> = None;
    let mut text: Option<String> = None;
    let mut client_id: Option<String> = None;
    while let Some(field) = form.next_field().await.map_err(|e| form_error(e, &limits))? {
        match field.name() {
            Some("file") if stored.is_none() => {
                check_client_id(client_id.as_deref())?;
                if let Some(existing) = repeated(&web, &room_id, client_id.as_deref()).await? {
                    return Ok(Json(existing).into_response());
                }
                let room = web.app.store()?.room(&room_id).await?.ok_or(WebchatError::Forbidden)?;
                let channel = room.channel.ok_or(WebchatError::NoAgent)?;
                let now = web.now();
                let hold = reserve_upload(&web, &room_id, &headers, now).await?;
                let filename: String =
                    field.file_name().unwrap_or("file").chars().take(255).collect();
                let mime = field
                    .content_type()
                    .map(|m| m.chars().take(255).collect::<String>())
                    .filter(|m| m != "application/octet-stream")
                    .or_else(|| mime_guess::from_path(&filename).first().map(|m| m.to_string()));
                let limit = hold.bytes().min(limits.max_upload_bytes);
                // Streamed into the file store as it arrives, never held whole (M2); a
                // failure gives the reservation back (the hold is dropped).
                let chat_file = web
                    .handle
                    .register_file_stream(&channel, &filename, mime.as_deref(), limit, field)
                    .await
                    .map_err(|e| upload_error(e, limit < limits.max_upload_bytes, &limits))?;
                let size = chat_file.byte_size.unwrap_or(0);
                hold.settle(size).await?;
                if size == 0 {
                    return Err(WebchatError::InvalidInput("the file is empty".into()));
                }
                stored = Some((chat_file, filename, now));
            }
            Some("text") => {
                let value = small_field(field, limits.max_text_chars * 4, &limits).await?;
                text = check_text(&value, &limits)?;
            }
            Some("client_id") => {
                client_id = Some(small_field(field, MAX_CLIENT_ID_BYTES, &limits).await?);
            }
            _ => {}
        }
    }
    check_client_id(client_id.as_deref())?;
    let Some((chat_file, filename, now)) = stored else {
        return Err(WebchatError::InvalidInput("add the file in a form field named file".into()));
    };
    let message_id = format!("msg_web_{}", random_hex(12));
    let entry = ChatEntry {
        message_id: message_id.clone(),
        author: Author::Visitor,
        text: text.clone(),
        files: vec![EntryFile {
            file_ref: chat_file.file_ref.to_string(),
            filename: chat_file.filename.clone().unwrap_or(filename),
            mime_type: chat_file.mime_type.clone(),
            byte_size: chat_file.byte_size,
        }],
        status: EntryStatus::Sending,
        error: None,
        client_id,
        created_at: now,
    };
    let message = ChatMessage::with_files(message_id, text, vec![chat_file]).created_at(now);
    Ok(Json(relay(&web, &room_id, entry, message).await?).into_response())
}

/// The file store's refusal as the page should see it (L5): too large is 413 (507 when the
/// day's allowance, not the file limit, was the bound), a full store 507.
fn upload_error(
    error: xagent_server_runtime::HandleError,
    allowance_bound: bool,
    limits: &VisitorLimits,
) -> WebchatError {
    use xagent_file_transfer::TransferError;
    use xagent_server_runtime::HandleError;
    match error {
        HandleError::File(TransferError::TooLarge { .. }) if allowance_bound => {
            WebchatError::StoreFull(
                "the file is larger than what this room may still upload today".into(),
            )
        }
        HandleError::File(TransferError::TooLarge { .. }) => too_large(limits),
        HandleError::File(TransferError::CapacityExceeded) => {
            WebchatError::StoreFull("the chat cannot take files right now; try again later".into())
        }
        HandleError::UnknownChannel(_) | HandleError::NotAuthenticated(_) => WebchatError::NoAgent,
        other => WebchatError::Runtime(other),
    }
}

async fn file(
    State(web): State<Web>,
    Path((room_id, file_ref)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, WebchatError> {
    visitor(&web, &room_id, &headers).await?;
    let not_found = || {
        xagent_server_runtime::error_response(
            StatusCode::NOT_FOUND,
            xagent_protocol_types::ErrorCode::FileNotFound,
            "the file is gone (files are kept for a limited time)",
        )
    };
    if !xagent_file_transfer::is_well_formed_file_ref(&file_ref) {
        return Ok(not_found());
    }
    let room = web.app.store()?.room(&room_id).await?.ok_or(WebchatError::Forbidden)?;
    let Some(channel) = room.channel else { return Ok(not_found()) };
    let Ok((record, handle)) = web.handle()?.open_file(&channel, &FileRef::new(file_ref)).await
    else {
        return Ok(not_found());
    };
    // Parsed, never compared as a string: only allow-listed raster types are inline (H1).
    let (content_type, inline) =
        xagent_file_transfer::media::served_type(Some(record.mime_type.as_str()));
    let ascii_name: String = record
        .filename
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' })
        .collect();
    let disposition =
        format!("{}; filename=\"{ascii_name}\"", if inline { "inline" } else { "attachment" });
    let mut response = Body::from_stream(tokio_util::io::ReaderStream::new(handle)).into_response();
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&content_type) {
        headers.insert(header::CONTENT_TYPE, value);
    }
    if let Ok(value) = HeaderValue::from_str(&disposition) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(record.byte_size));
    // Never kept by the browser or a proxy: a visitor's file must not outlive the session in a
    // cache (issue 23, X1).
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(xagent_file_transfer::media::DOWNLOAD_CSP),
    );
    Ok(response)
}

async fn pair_scan(
    State(web): State<Web>,
    Path(token): Path<String>,
) -> Result<Response, WebchatError> {
    let now = web.now();
    let opened = web.app.pairings()?.scan(&token, now).await?;
    Ok(Json(json!({
        "state": "scanned",
        "expires_at": opened.expires_at,
        "suggested_room_name": opened.suggested_room_name,
    }))
    .into_response())
}

#[derive(Deserialize)]
struct ConfirmBody {
    #[serde(default)]
    room_name: Option<String>,
}

async fn pair_confirm(
    State(web): State<Web>,
    Path(token): Path<String>,
    Json(body): Json<ConfirmBody>,
) -> Result<Response, WebchatError> {
    let now = web.now();
    // The link is this confirmation's from here on, on every replica (one-time).
    let claim = web.app.pairings()?.claim(&token, now).await?;
    let name = body
        .room_name
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| claim.suggested_room_name.clone());
    let access_code = random_hex(6);
    let created = match web.app.store()?.claim_room(&name, &access_code, now).await {
        Ok(RoomClaim::Created(room)) => Ok(room),
        Ok(_) => Err(WebchatError::InvalidInput(
            "a room with this name exists already; choose another name".into(),
        )),
        Err(error) => Err(error),
    };
    let room = match created {
        Ok(room) => room,
        Err(error) => {
            // No room was made: the link can be confirmed again (with another name).
            web.app.pairings()?.release(claim).await?;
            return Err(error);
        }
    };
    web.app.store()?.set_room_channel(&room.room_id, Some(&claim.channel)).await?;
    web.app.pairings()?.complete(claim, &room.room_id).await?;
    let expires_at = now.saturating_add(web.limits.token_lifetime_millis);
    let visitor_token = web.app.store()?.add_visitor(&room.room_id, now, expires_at).await?;
    let body = json!({
        "token": visitor_token,
        "room_id": room.room_id,
        "room_name": room.name,
        "access_code": access_code,
        "expires_at": expires_at,
    });
    Ok(with_session(&web, &room.room_id, &visitor_token, body))
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
