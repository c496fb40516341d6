//! The visitor side: the chat page (HTML, CSS and JS compiled into the binary) and its small
//! JSON API under `/chat/api/`, with Server-Sent Events for live updates. It is separate from
//! xAgent's `/ws` and never needs the system API key: a visitor holds a room token obtained
//! with the room's access code (or by confirming a pairing link).
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/chat/`, `/chat/r/{room}`, `/chat/pair/{token}` | the page |
//! | POST | `/chat/api/rooms/{room}/join` `{access_code}` | `{token, room_id, room_name}` |
//! | GET | `/chat/api/rooms/{room}/events?token=` | SSE: a `snapshot`, then `message`, `draft`, `activity`, `agent` |
//! | POST | `/chat/api/rooms/{room}/messages` `{text, client_id}` | the stored message |
//! | POST | `/chat/api/rooms/{room}/uploads` multipart `file`, `text`, `client_id` | the stored message |
//! | GET | `/chat/api/rooms/{room}/files/{file_ref}?token=` | a file of the room |
//! | POST | `/chat/api/pair/{token}/scan` | marks the pairing `scanned` |
//! | POST | `/chat/api/pair/{token}/confirm` `{room_name}` | creates the room: `{token, room_id, room_name, access_code}` |
//!
//! The token travels as `Authorization: Bearer` or, where a browser cannot set headers
//! (`EventSource`, `<img>`), as `?token=`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use futures_util::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use xagent_protocol_types::{ChatMessage, FileRef};
use xagent_server_runtime::ConnectorHandle;

use crate::connector::App;
use crate::error::WebchatError;
use crate::hub::RoomEvent;
use crate::store::{Author, ChatEntry, EntryFile, EntryStatus, Inserted, RoomClaim, random_hex};

/// Largest file a visitor can upload from the page (25 MiB).
pub const MAX_PAGE_UPLOAD_BYTES: usize = 25 * 1024 * 1024;
/// Longest text a visitor can send.
pub const MAX_TEXT_CHARS: usize = 16_000;

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");
const ICON_SVG: &str = include_str!("../assets/icon.svg");

#[derive(Clone)]
struct Web {
    app: Arc<App>,
    handle: ConnectorHandle,
    shutdown: CancellationToken,
}

impl Web {
    fn handle(&self) -> Result<&ConnectorHandle, WebchatError> {
        Ok(&self.handle)
    }

    fn now(&self) -> u64 {
        self.handle.now_millis()
    }
}

/// The page routes and the visitor API, built with the runtime's handle (the runtime serves
/// them next to its own routes).
pub(crate) fn router(
    app: Arc<App>,
    handle: ConnectorHandle,
    shutdown: CancellationToken,
) -> Router {
    let web = Web { app, handle, shutdown };
    Router::new()
        .route("/", get(|| async { Redirect::to("/chat/") }))
        .route("/chat", get(|| async { Redirect::to("/chat/") }))
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
        .route("/chat/api/rooms/{room}/events", get(events))
        .route("/chat/api/rooms/{room}/messages", post(send_text))
        .route(
            "/chat/api/rooms/{room}/uploads",
            post(send_file).layer(DefaultBodyLimit::max(MAX_PAGE_UPLOAD_BYTES + 64 * 1024)),
        )
        .route("/chat/api/rooms/{room}/files/{file_ref}", get(file))
        .route("/chat/api/pair/{token}/scan", post(pair_scan))
        .route("/chat/api/pair/{token}/confirm", post(pair_confirm))
        .with_state(web)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body)
        .into_response()
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; connect-src 'self'",
            ),
        ],
        INDEX_HTML,
    )
        .into_response()
}

#[derive(Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

/// Checks the visitor token (header or query) against the room.
fn visitor(
    web: &Web,
    room_id: &str,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<(), WebchatError> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let token = bearer.or(query).ok_or(WebchatError::Forbidden)?;
    match web.app.store.visitor_room(token)? {
        Some(room) if room == room_id => Ok(()),
        _ => Err(WebchatError::Forbidden),
    }
}

#[derive(Deserialize)]
struct JoinBody {
    access_code: String,
}

async fn join(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    Json(body): Json<JoinBody>,
) -> Result<Response, WebchatError> {
    if !web.app.store.check_code(&room_id, &body.access_code)? {
        return Err(WebchatError::Forbidden);
    }
    let room = web.app.store.room(&room_id)?.ok_or(WebchatError::Forbidden)?;
    let token = web.app.store.add_visitor(&room_id, web.now())?;
    Ok(Json(json!({ "token": token, "room_id": room.room_id, "room_name": room.name }))
        .into_response())
}

fn snapshot(web: &Web, room_id: &str) -> Result<RoomEvent, WebchatError> {
    let room = web.app.store.room(room_id)?.ok_or(WebchatError::Forbidden)?;
    let (_, drafts, activity) = web.app.hub.subscribe(room_id);
    let online = room.channel.as_ref().is_some_and(|channel| web.handle.is_routed(channel));
    Ok(RoomEvent::Snapshot {
        room_id: room.room_id,
        room_name: room.name,
        agent_online: online,
        messages: web.app.store.history(room_id)?,
        drafts,
        activity,
    })
}

fn sse_event(event: &RoomEvent) -> Event {
    Event::default().data(serde_json::to_string(event).unwrap_or_else(|_| "{}".into()))
}

async fn events(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    Query(query): Query<TokenQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, WebchatError> {
    visitor(&web, &room_id, &headers, query.token.as_deref())?;
    // Subscribe before reading the snapshot so nothing falls between them.
    let (rx, _, _) = web.app.hub.subscribe(&room_id);
    let first = sse_event(&snapshot(&web, &room_id)?).retry(Duration::from_millis(1_000));
    let shutdown = web.shutdown.clone();
    let live =
        futures_util::stream::unfold((web, room_id, rx), |(web, room_id, mut rx)| async move {
            match rx.recv().await {
                Ok(event) => Some((sse_event(&event), (web, room_id, rx))),
                // Too slow: start over from a fresh snapshot.
                Err(RecvError::Lagged(_)) => match snapshot(&web, &room_id) {
                    Ok(event) => Some((sse_event(&event), (web, room_id, rx))),
                    Err(_) => None,
                },
                Err(RecvError::Closed) => None,
            }
        });
    let stream = futures_util::stream::once(async move { first })
        .chain(live)
        .map(Ok)
        .take_until(shutdown.cancelled_owned());
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

#[derive(Deserialize)]
struct SendBody {
    text: String,
    #[serde(default)]
    client_id: Option<String>,
}

fn check_client_id(client_id: Option<&str>) -> Result<(), WebchatError> {
    match client_id {
        Some(id) if id.is_empty() || id.len() > 100 => {
            Err(WebchatError::InvalidInput("client_id must have 1-100 characters".into()))
        }
        _ => Ok(()),
    }
}

/// Stores a visitor message, shows it, and hands it to xAgent through the runtime's outbox.
async fn relay(
    web: &Web,
    room_id: &str,
    entry: ChatEntry,
    message: ChatMessage,
) -> Result<ChatEntry, WebchatError> {
    let room = web.app.store.room(room_id)?.ok_or(WebchatError::Forbidden)?;
    let channel = room.channel.ok_or(WebchatError::NoAgent)?;
    let entry = match web.app.store.insert_entry(room_id, &entry)? {
        Inserted::Existing(existing) => return Ok(existing),
        Inserted::New(entry) => entry,
    };
    web.app.hub.message(room_id, entry.clone());
    let handle = web.handle()?;
    if let Err(error) = handle.send_message(&channel, message).await {
        tracing::info!(%error, room = room_id, "the runtime did not take a visitor message");
        let reason = match error.code() {
            xagent_protocol_types::ErrorCode::ConnectionNotAuthenticated
            | xagent_protocol_types::ErrorCode::ConnectionNotFound => {
                "the agent is not connected to this room right now; send it again later".to_owned()
            }
            _ => format!("not sent: {error}"),
        };
        if let Some((_, updated)) =
            web.app.store.set_status(&entry.message_id, EntryStatus::Rejected, Some(&reason))?
        {
            web.app.hub.message(room_id, updated.clone());
            return Ok(updated);
        }
    }
    Ok(entry)
}

async fn send_text(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    headers: HeaderMap,
    Json(body): Json<SendBody>,
) -> Result<Response, WebchatError> {
    visitor(&web, &room_id, &headers, None)?;
    check_client_id(body.client_id.as_deref())?;
    let text = body.text.trim().to_owned();
    if text.is_empty() || text.chars().count() > MAX_TEXT_CHARS {
        return Err(WebchatError::InvalidInput(format!(
            "the text must have 1-{MAX_TEXT_CHARS} characters"
        )));
    }
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

async fn send_file(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    headers: HeaderMap,
    mut form: Multipart,
) -> Result<Response, WebchatError> {
    visitor(&web, &room_id, &headers, None)?;
    let bad = |e: axum::extract::multipart::MultipartError| {
        WebchatError::InvalidInput(format!("the upload is not a valid form: {e}"))
    };
    let mut file: Option<(String, Option<String>, axum::body::Bytes)> = None;
    let mut text: Option<String> = None;
    let mut client_id: Option<String> = None;
    while let Some(field) = form.next_field().await.map_err(bad)? {
        match field.name() {
            Some("file") if file.is_none() => {
                let name = field.file_name().unwrap_or("file").to_owned();
                let mime = field.content_type().map(str::to_owned);
                let data = field.bytes().await.map_err(bad)?;
                file = Some((name, mime, data));
            }
            Some("text") => text = Some(field.text().await.map_err(bad)?),
            Some("client_id") => client_id = Some(field.text().await.map_err(bad)?),
            _ => {}
        }
    }
    check_client_id(client_id.as_deref())?;
    let Some((filename, mime, data)) = file else {
        return Err(WebchatError::InvalidInput("add the file in a form field named file".into()));
    };
    if data.is_empty() {
        return Err(WebchatError::InvalidInput("the file is empty".into()));
    }
    if let Some(existing) = client_id
        .as_deref()
        .map(|c| web.app.store.entry_by_client(&room_id, c))
        .transpose()?
        .flatten()
    {
        return Ok(Json(existing).into_response());
    }
    let room = web.app.store.room(&room_id)?.ok_or(WebchatError::Forbidden)?;
    let channel = room.channel.ok_or(WebchatError::NoAgent)?;
    let mime = mime
        .filter(|m| m != "application/octet-stream")
        .or_else(|| mime_guess::from_path(&filename).first().map(|m| m.to_string()));
    let chat_file = web
        .handle()?
        .register_file(&channel, &filename, mime.as_deref(), &data)
        .await
        .map_err(|e| WebchatError::Runtime(e.to_string()))?;
    let text = text.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty());
    let now = web.now();
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

async fn file(
    State(web): State<Web>,
    Path((room_id, file_ref)): Path<(String, String)>,
    Query(query): Query<TokenQuery>,
    headers: HeaderMap,
) -> Result<Response, WebchatError> {
    visitor(&web, &room_id, &headers, query.token.as_deref())?;
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
    let room = web.app.store.room(&room_id)?.ok_or(WebchatError::Forbidden)?;
    let Some(channel) = room.channel else { return Ok(not_found()) };
    let Ok((record, handle)) = web.handle()?.open_file(&channel, &FileRef::new(file_ref)).await
    else {
        return Ok(not_found());
    };
    let inline = record.mime_type.starts_with("image/") && record.mime_type != "image/svg+xml";
    let ascii_name: String = record
        .filename
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' })
        .collect();
    let disposition =
        format!("{}; filename=\"{ascii_name}\"", if inline { "inline" } else { "attachment" });
    let mut response = Body::from_stream(tokio_util::io::ReaderStream::new(handle)).into_response();
    let headers = response.headers_mut();
    let content_type = if inline { record.mime_type.as_str() } else { "application/octet-stream" };
    if let Ok(value) = HeaderValue::from_str(content_type) {
        headers.insert(header::CONTENT_TYPE, value);
    }
    if let Ok(value) = HeaderValue::from_str(&disposition) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(record.byte_size));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, max-age=3600"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    Ok(response)
}

async fn pair_scan(
    State(web): State<Web>,
    Path(token): Path<String>,
) -> Result<Response, WebchatError> {
    let now = web.now();
    let pairing =
        web.app.pairings().scan(&token, now).map_err(|e| WebchatError::Pairing(e.to_string()))?;
    Ok(Json(json!({
        "state": "scanned",
        "expires_at": pairing.expires_at,
        "suggested_room_name": format!("Room {}", &pairing.token[..4]),
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
    let pairing = web
        .app
        .pairings()
        .confirmable(&token, now)
        .map_err(|e| WebchatError::Pairing(e.to_string()))?;
    let name = body
        .room_name
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("Room {}", &pairing.token[..4]));
    let access_code = random_hex(6);
    let room = match web.app.store.claim_room(&name, &access_code, now)? {
        RoomClaim::Created(room) => room,
        _ => {
            return Err(WebchatError::InvalidInput(
                "a room with this name exists already; choose another name".into(),
            ));
        }
    };
    web.app.store.set_room_channel(&room.room_id, Some(&pairing.channel))?;
    web.app.pairings().complete(&pairing.session, room.room_id.clone());
    let visitor_token = web.app.store.add_visitor(&room.room_id, now)?;
    Ok(Json(json!({
        "token": visitor_token,
        "room_id": room.room_id,
        "room_name": room.name,
        "access_code": access_code,
    }))
    .into_response())
}
