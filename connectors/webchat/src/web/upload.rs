//! A visitor's file: the multipart form, the room's daily quota held while the file streams
//! into the Transfer Plane, and the room's files served back to the page.

use super::guard::VisitorLimits;
use super::send::{check_client_id, check_text, relay, resubmit};
use super::visitor::{MAX_CLIENT_ID_BYTES, Web, visitor, visitor_write};
use crate::app::App;
use crate::error::WebchatError;
use crate::store::{
    Author, ChatEntry, EntryFile, EntryStatus, QuotaRefusal, UploadReservation, random_hex,
};
use axum::Json;
use axum::body::Body;
use axum::extract::multipart::{Field, MultipartError};
use axum::extract::{Multipart, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use xagent_protocol_types::{ChatMessage, FileRef};

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
    pub(crate) app: Arc<App>,
    pub(crate) reservation: UploadReservation,
    pub(crate) settled: bool,
}

impl QuotaHold {
    /// The most bytes the upload may store.
    pub(crate) fn bytes(&self) -> u64 {
        self.reservation.bytes
    }

    /// The upload is stored with `bytes`: only those stay counted.
    pub(crate) async fn settle(mut self, bytes: u64) -> Result<(), WebchatError> {
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
pub(crate) async fn repeated(
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

pub(crate) async fn send_file(
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

pub(crate) async fn file(
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
