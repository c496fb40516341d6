//! The axum router of the Transfer Plane: `POST /files/uploads` and `GET /files/refs/{file_ref}`.

mod disposition;
mod range;

use std::future::Future;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::multipart::{Field, MultipartError, MultipartRejection};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use tokio_util::io::ReaderStream;
use xagent_protocol_types::{
    CHANNEL_HEADER, ConnectorChannelId, FileRef, Secret, UploadResponse, paths,
};

use crate::TransferError;
use crate::pending::{Gather, NewFile, PendingFile};
use crate::record::FileRecord;
use crate::store::FileStore;
use range::RangeAnswer;

/// Default largest upload: 100 MiB.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 100 * 1024 * 1024;

/// Room allowed in a multipart body beyond the file itself (boundaries, headers, text fields).
const FORM_OVERHEAD_BYTES: u64 = 1024 * 1024;
/// Largest `recipient_ref` / `reply_token` value.
const MAX_TEXT_FIELD_BYTES: u64 = 8 * 1024;
/// Chunk size when streaming a file to the client.
const STREAM_CHUNK: usize = 64 * 1024;

/// Answers whether a channel exists; implemented by the server runtime over its channel table.
///
/// Implementations may be written as `async fn channel_exists(...)`; the future must be `Send`.
pub trait ChannelDirectory: Send + Sync + 'static {
    /// True when `channel` is a known, registered channel of this Connector.
    fn channel_exists(&self, channel: &ConnectorChannelId) -> impl Future<Output = bool> + Send;
}

impl<T: ChannelDirectory> ChannelDirectory for Arc<T> {
    fn channel_exists(&self, channel: &ConnectorChannelId) -> impl Future<Output = bool> + Send {
        (**self).channel_exists(channel)
    }
}

/// Everything the Transfer Plane handlers need: the store (with its signer), the channel
/// directory, the system API key and the upload limit. Turn it into a router with
/// [`TransferState::into_router`].
pub struct TransferState<D> {
    store: FileStore,
    directory: D,
    api_key: Option<Secret>,
    max_upload_bytes: u64,
}

impl<D> std::fmt::Debug for TransferState<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferState")
            .field("store", &self.store)
            .field("api_key", &self.api_key)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .finish_non_exhaustive()
    }
}

impl<D: ChannelDirectory> TransferState<D> {
    /// State with no API key and the default upload limit (100 MiB).
    pub fn new(store: FileStore, directory: D) -> Self {
        Self { store, directory, api_key: None, max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES }
    }

    /// Sets the system API key. With a key, uploads require `Authorization: Bearer <key>` and
    /// downloads accept it instead of a signature. An empty key counts as no key.
    #[must_use]
    pub fn with_api_key(mut self, api_key: Option<Secret>) -> Self {
        self.api_key = api_key.filter(|key| !key.is_empty());
        self
    }

    /// Sets the largest accepted upload, in bytes (default 100 MiB); larger ones get 413.
    #[must_use]
    pub fn with_max_upload_bytes(mut self, limit: u64) -> Self {
        self.max_upload_bytes = limit;
        self
    }

    /// The store the handlers use.
    pub fn store(&self) -> &FileStore {
        &self.store
    }

    /// The router with both endpoints at their fixed paths; mount it under the Base URL prefix.
    pub fn into_router(self) -> Router {
        router(self)
    }
}

/// The Transfer Plane router: `POST /files/uploads` and `GET /files/refs/{file_ref}` (HEAD too).
pub fn router<D: ChannelDirectory>(state: TransferState<D>) -> Router {
    let body_limit = state.max_upload_bytes.saturating_add(FORM_OVERHEAD_BYTES);
    let body_limit = usize::try_from(body_limit).unwrap_or(usize::MAX);
    let download_path = format!("{}{{file_ref}}", paths::FILE_REFS_PREFIX);
    Router::new()
        .route(paths::FILE_UPLOADS, post(upload::<D>).layer(DefaultBodyLimit::max(body_limit)))
        .route(&download_path, get(download::<D>))
        .with_state(Arc::new(state))
}

/// Outcome of checking the `Authorization` header against the system API key.
#[derive(PartialEq, Eq)]
enum KeyCheck {
    /// No key is configured, or no header was sent.
    Absent,
    /// The header carries the configured key.
    Valid,
}

fn check_api_key(api_key: Option<&Secret>, headers: &HeaderMap) -> Result<KeyCheck, TransferError> {
    let Some(key) = api_key else { return Ok(KeyCheck::Absent) };
    let Some(value) = headers.get(header::AUTHORIZATION) else { return Ok(KeyCheck::Absent) };
    let token = value.to_str().ok().and_then(xagent_protocol_types::bearer_token).ok_or(
        TransferError::Unauthorized("send the system API key as Authorization: Bearer <key>"),
    )?;
    if key.matches(token) {
        Ok(KeyCheck::Valid)
    } else {
        Err(TransferError::Unauthorized("the system API key is wrong"))
    }
}

/// The channel named by the request header, if any (an empty or unreadable value counts as none).
fn channel_header(headers: &HeaderMap) -> Option<ConnectorChannelId> {
    headers
        .get(CHANNEL_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .map(ConnectorChannelId::new)
}

async fn upload<D: ChannelDirectory>(
    State(state): State<Arc<TransferState<D>>>,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Json<UploadResponse>, TransferError> {
    if state.api_key.is_some()
        && check_api_key(state.api_key.as_ref(), &headers)? != KeyCheck::Valid
    {
        return Err(TransferError::Unauthorized(
            "send the system API key as Authorization: Bearer <key>",
        ));
    }
    let channel = channel_header(&headers).ok_or(TransferError::ChannelRequired)?;
    if !state.directory.channel_exists(&channel).await {
        return Err(TransferError::UnknownChannel);
    }
    let limit = state.max_upload_bytes;
    let declared_length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared_length.is_some_and(|length| length > limit.saturating_add(FORM_OVERHEAD_BYTES)) {
        return Err(TransferError::TooLarge { limit });
    }
    let mut multipart = multipart.map_err(|rejection| {
        TransferError::InvalidUpload(format!(
            "send multipart/form-data ({})",
            rejection.body_text()
        ))
    })?;

    let multipart_error = |error: MultipartError| {
        if error.status() == StatusCode::PAYLOAD_TOO_LARGE {
            TransferError::TooLarge { limit }
        } else {
            TransferError::InvalidUpload(error.body_text())
        }
    };
    let mut pending: Option<PendingFile> = None;
    let mut recipient_ref = None;
    let mut reply_token = None;
    while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
        let name = field.name().unwrap_or_default().to_owned();
        match name.as_str() {
            "file" => {
                if pending.is_some() {
                    return Err(TransferError::InvalidUpload(
                        "send exactly one `file` field".into(),
                    ));
                }
                let filename = field.file_name().unwrap_or("file").to_owned();
                let mut new_file = NewFile::new(channel.clone(), filename).with_max_bytes(limit);
                if let Some(mime) = field.content_type() {
                    new_file = new_file.with_mime_type(mime);
                }
                let mut file = state.store.begin(new_file).await?;
                let mut gathered = Gather::default();
                while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                    gathered.write(&mut file, chunk.as_ref()).await?;
                }
                gathered.flush(&mut file).await?;
                pending = Some(file);
            }
            "recipient_ref" => recipient_ref = read_text_field(field, multipart_error).await?,
            "reply_token" => reply_token = read_text_field(field, multipart_error).await?,
            _ => {
                // Unknown fields are skipped; the body limit bounds how much can be skipped.
                while field.chunk().await.map_err(multipart_error)?.is_some() {}
            }
        }
    }
    let mut file = pending.ok_or_else(|| {
        TransferError::InvalidUpload("the form lacks the required `file` field".into())
    })?;
    file.set_recipient_ref(recipient_ref);
    file.set_reply_token(reply_token);
    let registered = file.finish().await?;
    tracing::debug!(
        file_ref = %registered.record.file_ref,
        channel = %registered.record.connector_channel_id,
        bytes = registered.record.byte_size,
        "file uploaded"
    );
    Ok(Json(registered.record.upload_response()))
}

/// A small text field; empty values count as absent.
async fn read_text_field(
    mut field: Field<'_>,
    map_error: impl Fn(MultipartError) -> TransferError,
) -> Result<Option<String>, TransferError> {
    let mut value = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(&map_error)? {
        if (value.len() + chunk.len()) as u64 > MAX_TEXT_FIELD_BYTES {
            return Err(TransferError::TooLarge { limit: MAX_TEXT_FIELD_BYTES });
        }
        value.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(value)
        .map_err(|_| TransferError::InvalidUpload("text fields must be UTF-8".into()))?;
    Ok(Some(text).filter(|text| !text.is_empty()))
}

/// `exp` and `sig` of a signed download URL, kept as text so bad values are a 403, not a 400.
#[derive(Default, Deserialize)]
struct SignatureQuery {
    exp: Option<String>,
    sig: Option<String>,
}

const NO_CREDENTIAL: TransferError =
    TransferError::Unauthorized("use a signed download URL or send the system API key");
const NOT_FOUND: TransferError =
    TransferError::FileNotFound("the file does not exist or has expired");
const BAD_SIGNATURE: TransferError =
    TransferError::Forbidden("the download URL signature is invalid");

async fn download<D: ChannelDirectory>(
    State(state): State<Arc<TransferState<D>>>,
    file_ref: Result<Path<String>, PathRejection>,
    query: Result<Query<SignatureQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, TransferError> {
    let by_key = check_api_key(state.api_key.as_ref(), &headers)? == KeyCheck::Valid;
    let query = query.map(|Query(query)| query).unwrap_or_default();
    if !by_key && query.exp.is_none() && query.sig.is_none() {
        return Err(NO_CREDENTIAL);
    }
    let Ok(Path(file_ref)) = file_ref else { return Err(NOT_FOUND) };
    let file_ref = FileRef::new(file_ref);
    let record = state.store.get(&file_ref).await?.ok_or(NOT_FOUND)?;
    if channel_header(&headers).is_some_and(|channel| channel != record.connector_channel_id) {
        return Err(TransferError::Forbidden("the file belongs to another channel"));
    }
    if !by_key {
        let exp = query.exp.as_deref().and_then(|exp| exp.parse::<u64>().ok());
        let (Some(exp), Some(sig)) = (exp, query.sig.as_deref()) else { return Err(BAD_SIGNATURE) };
        state.store.signer().verify(
            &record.file_ref,
            &record.connector_channel_id,
            exp,
            sig,
            state.store.now(),
        )?;
    }
    serve_file(&state.store, &record, &headers).await
}

async fn serve_file(
    store: &FileStore,
    record: &FileRecord,
    headers: &HeaderMap,
) -> Result<Response, TransferError> {
    let size = record.byte_size;
    // Without validators an If-Range can never match, so it always means "send everything".
    let range_header = if headers.contains_key(header::IF_RANGE) {
        None
    } else {
        headers.get(header::RANGE).and_then(|value| value.to_str().ok())
    };
    let (status, start, length) = match range::parse(range_header, size) {
        RangeAnswer::Full => (StatusCode::OK, 0, size),
        RangeAnswer::Partial { start, end } => {
            (StatusCode::PARTIAL_CONTENT, start, end - start + 1)
        }
        RangeAnswer::Unsatisfiable => return Err(TransferError::RangeNotSatisfiable { size }),
    };
    let file = store.open_range(record, start, length).await?;
    let body = Body::from_stream(ReaderStream::with_capacity(file, STREAM_CHUNK));
    let mut response = (status, body).into_response();
    let out = response.headers_mut();
    let content_type = HeaderValue::from_str(&record.mime_type)
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
    out.insert(header::CONTENT_TYPE, content_type);
    out.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
    out.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    out.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(crate::media::DOWNLOAD_CSP),
    );
    if let Ok(value) = HeaderValue::from_str(&disposition::attachment(&record.filename)) {
        out.insert(header::CONTENT_DISPOSITION, value);
    }
    if status == StatusCode::PARTIAL_CONTENT {
        let range = format!("bytes {start}-{}/{size}", start + length - 1);
        if let Ok(value) = HeaderValue::from_str(&range) {
            out.insert(header::CONTENT_RANGE, value);
        }
    }
    Ok(response)
}
