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
mod events;
mod guard;
mod join;
mod pair;
mod send;
mod upload;
mod visitor;

use crate::app::App;
pub use admission::JoinRate;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use events::events;
pub use guard::{JoinThrottle, MAX_PAGE_UPLOAD_BYTES, MAX_TEXT_CHARS, VisitorLimits};
use join::{join, leave, session};
use pair::{pair_confirm, pair_scan};
use send::send_text;
pub(crate) use send::{recover_pending, requeue};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use upload::{file, send_file};
pub(crate) use visitor::root_path;
use visitor::{Web, public_origin};
use xagent_server_runtime::ConnectorHandle;

const INDEX_HTML: &str = include_str!("../assets/index.html");

const APP_JS: &str = include_str!("../assets/app.js");

const APP_CSS: &str = include_str!("../assets/app.css");

const ICON_SVG: &str = include_str!("../assets/icon.svg");

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

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body)
        .into_response()
}

pub(crate) async fn page(State(web): State<Web>) -> Response {
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
