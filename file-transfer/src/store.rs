//! The file store: records and bytes on a [`FileBackend`] (a directory or PostgreSQL), each
//! file bound to one channel, with a TTL, capacity limits, cleanup and signed download URLs.
//!
//! The store owns what does not depend on where bytes live: file names, MIME types, the
//! per-file limit, the TTL and the URLs. The backend owns visibility and the capacity totals
//! (see [`FileBackend`]).

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};
use xagent_protocol_types::{
    ChatFile, Clock, ConnectorChannelId, FileRef, FileType, UploadResponse,
};

use crate::TransferError;
use crate::backend::{DirBackend, FileBackend, FileReader, Quota, UploadSink};
use crate::ids::new_file_ref;
use crate::signer::{SignedUrl, UrlSigner};

/// Default time a stored file stays available: 24 hours.
pub const DEFAULT_FILE_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Default largest single file: 100 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 100 * 1024 * 1024;
/// Default total size of all stored files: 10 GiB.
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 10 * 1024 * 1024 * 1024;
/// Default number of stored files (finished plus in progress): 10,000.
pub const DEFAULT_MAX_FILES: usize = 10_000;
/// Default upper bound of the cleanup period (it is also never longer than half the TTL).
pub const DEFAULT_CLEANUP_INTERVAL: Duration = Duration::from_secs(10 * 60);

/// Longest stored file name, in bytes.
const MAX_FILENAME_BYTES: usize = 255;
/// Default time after which an upload with no write is presumed abandoned by a dead process.
pub const DEFAULT_UPLOAD_IDLE_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Read buffer for [`FileStore::register_reader`], and the size streamed chunks are gathered
/// into before they reach the backend.
pub(crate) const WRITE_CHUNK: usize = 64 * 1024;

/// Policies of a [`FileStore`]. Start from `StoreConfig::default()` and change fields.
///
/// **Overflow policy:** when a new file would exceed `max_files` or `max_total_bytes`, the store
/// first deletes files whose TTL has passed; if that is not enough, the new file is refused with
/// [`TransferError::CapacityExceeded`] (HTTP 507, code `capacity_exceeded`). Unexpired files are
/// never evicted: a `file_ref` already handed to xAgent stays downloadable until its TTL.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StoreConfig {
    /// How long a file stays available after it is stored (default 24 h).
    pub ttl: Duration,
    /// Largest single file unless [`NewFile::with_max_bytes`] says otherwise (default 100 MiB).
    pub max_file_bytes: u64,
    /// Total bytes of all files, finished and in progress (default 10 GiB).
    pub max_total_bytes: u64,
    /// Number of files, finished and in progress (default 10,000).
    pub max_files: usize,
    /// Upper bound of the period of [`FileStore::spawn_cleanup`] (default 10 min; the period
    /// used is the smaller of this and half the TTL).
    pub cleanup_interval: Duration,
    /// On a shared database, an upload with no write for this long is presumed abandoned by a
    /// replica that died and is deleted by cleanup (default 15 min). A directory needs no
    /// timeout: its one process deletes unfinished uploads when it starts.
    pub upload_idle_timeout: Duration,
}

impl StoreConfig {
    /// Sets the file TTL.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the default per-file size limit.
    #[must_use]
    pub fn with_max_file_bytes(mut self, limit: u64) -> Self {
        self.max_file_bytes = limit;
        self
    }

    /// Sets the total size limit.
    #[must_use]
    pub fn with_max_total_bytes(mut self, limit: u64) -> Self {
        self.max_total_bytes = limit;
        self
    }

    /// Sets the file count limit.
    #[must_use]
    pub fn with_max_files(mut self, limit: usize) -> Self {
        self.max_files = limit;
        self
    }

    /// Sets the upper bound of the cleanup period.
    #[must_use]
    pub fn with_cleanup_interval(mut self, interval: Duration) -> Self {
        self.cleanup_interval = interval;
        self
    }

    /// Sets the time after which an idle upload on a shared database is presumed abandoned.
    #[must_use]
    pub fn with_upload_idle_timeout(mut self, timeout: Duration) -> Self {
        self.upload_idle_timeout = timeout;
        self
    }

    /// The capacity totals a backend enforces.
    pub fn quota(&self) -> Quota {
        Quota { max_total_bytes: self.max_total_bytes, max_files: self.max_files }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_FILE_TTL,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
            max_files: DEFAULT_MAX_FILES,
            cleanup_interval: DEFAULT_CLEANUP_INTERVAL,
            upload_idle_timeout: DEFAULT_UPLOAD_IDLE_TIMEOUT,
        }
    }
}

/// Metadata of one stored file. Bound to exactly one channel for its whole life.
///
/// `recipient_ref` and `reply_token` are target-system references given with an upload; they
/// are kept opaque and never printed (`Debug` redacts them).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FileRecord {
    /// The reference handed out (`file_` + 32 hex digits).
    pub file_ref: FileRef,
    /// The channel the file belongs to.
    pub connector_channel_id: ConnectorChannelId,
    /// File name (metadata only, never used as a path).
    pub filename: String,
    /// MIME type, from the uploader or guessed from the file name.
    pub mime_type: String,
    /// Kind of file derived from the MIME type.
    pub file_type: FileType,
    /// Size in bytes.
    pub byte_size: u64,
    /// When it was stored (Unix ms).
    pub created_at: u64,
    /// When it stops being available (Unix ms); expired when `now >= expires_at`.
    pub expires_at: u64,
    /// Target-system recipient reference from an upload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient_ref: Option<String>,
    /// Target-system reply reference from an upload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_token: Option<String>,
}

impl std::fmt::Debug for FileRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redact = |value: &Option<String>| value.as_ref().map(|_| "<redacted>");
        f.debug_struct("FileRecord")
            .field("file_ref", &self.file_ref)
            .field("connector_channel_id", &self.connector_channel_id)
            .field("filename", &self.filename)
            .field("mime_type", &self.mime_type)
            .field("file_type", &self.file_type)
            .field("byte_size", &self.byte_size)
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .field("recipient_ref", &redact(&self.recipient_ref))
            .field("reply_token", &redact(&self.reply_token))
            .finish()
    }
}

impl FileRecord {
    /// True when the file is no longer available at `now` (Unix ms).
    pub fn is_expired(&self, now: u64) -> bool {
        now >= self.expires_at
    }

    /// The `POST /files/uploads` answer for this file.
    pub fn upload_response(&self) -> UploadResponse {
        UploadResponse::new(
            self.file_ref.clone(),
            self.file_type.clone(),
            self.filename.clone(),
            self.byte_size,
            self.expires_at,
        )
    }

    /// A `chat.message.files[]` item for this file with the given download URL.
    pub fn to_chat_file(&self, download_url: impl Into<String>) -> ChatFile {
        ChatFile::new(self.file_type.clone(), self.file_ref.clone())
            .with_filename(self.filename.clone())
            .with_mime_type(self.mime_type.clone())
            .with_byte_size(self.byte_size)
            .with_expires_at(self.expires_at)
            .with_download_url(download_url)
    }
}

/// A file that was just stored, with a signed download URL ready to put in a message.
#[derive(Clone, Debug)]
pub struct RegisteredFile {
    /// The stored metadata.
    pub record: FileRecord,
    /// A signed URL for it, valid for the signer's lifetime (never past the file's expiry).
    pub download: SignedUrl,
}

impl RegisteredFile {
    /// The `chat.message.files[]` item, carrying the signed download URL.
    pub fn chat_file(&self) -> ChatFile {
        self.record.to_chat_file(self.download.url.clone())
    }
}

/// What a new file is: its channel, name, type and optional target-system references.
#[derive(Clone)]
pub struct NewFile {
    channel: ConnectorChannelId,
    filename: String,
    mime_type: Option<String>,
    recipient_ref: Option<String>,
    reply_token: Option<String>,
    max_bytes: Option<u64>,
}

impl std::fmt::Debug for NewFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewFile")
            .field("channel", &self.channel)
            .field("filename", &self.filename)
            .field("mime_type", &self.mime_type)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl NewFile {
    /// A file for `channel` named `filename` (path components and control characters are
    /// removed; an empty name becomes `file`).
    pub fn new(channel: ConnectorChannelId, filename: impl AsRef<str>) -> Self {
        Self {
            channel,
            filename: clean_filename(filename.as_ref()),
            mime_type: None,
            recipient_ref: None,
            reply_token: None,
            max_bytes: None,
        }
    }

    /// Declares the MIME type; without it (or with `application/octet-stream`) the type is
    /// guessed from the file name's extension.
    #[must_use]
    pub fn with_mime_type(mut self, mime: impl Into<String>) -> Self {
        self.mime_type = Some(mime.into());
        self
    }

    /// Keeps a target-system recipient reference on the record.
    #[must_use]
    pub fn with_recipient_ref(mut self, value: impl Into<String>) -> Self {
        self.recipient_ref = Some(value.into());
        self
    }

    /// Keeps a target-system reply reference on the record.
    #[must_use]
    pub fn with_reply_token(mut self, value: impl Into<String>) -> Self {
        self.reply_token = Some(value.into());
        self
    }

    /// Overrides the store's per-file size limit for this file.
    #[must_use]
    pub fn with_max_bytes(mut self, limit: u64) -> Self {
        self.max_bytes = Some(limit);
        self
    }
}

/// Counts returned by [`FileStore::cleanup`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Files deleted.
    pub files: usize,
    /// Bytes freed.
    pub bytes: u64,
}

/// Current occupancy of a [`FileStore`] (on a shared database: of every replica's files).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreUsage {
    /// Finished files (including expired ones not yet cleaned up).
    pub files: usize,
    /// Bytes of finished files.
    pub bytes: u64,
    /// Uploads in progress.
    pub pending_files: usize,
    /// Bytes written by uploads in progress.
    pub pending_bytes: u64,
}

struct Shared {
    backend: Arc<dyn FileBackend>,
    config: StoreConfig,
    signer: UrlSigner,
    clock: Arc<dyn Clock>,
}

/// Files each bound to one channel, with TTL, capacity limits and restart-safe metadata, kept
/// by a [`FileBackend`]. Cheap to clone; clones share the store.
///
/// Connectors register inbound files with [`FileStore::register_bytes`],
/// [`FileStore::register_stream`] or [`FileStore::register_reader`]; the HTTP upload handler
/// uses the lower-level [`FileStore::begin`] / [`PendingFile`].
#[derive(Clone)]
pub struct FileStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("backend", &self.shared.backend.describe())
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl FileStore {
    /// Opens (creating if needed) a store in the directory `dir` and reloads the files stored
    /// there by an earlier run. Expired entries, corrupt sidecars and unfinished uploads are
    /// deleted.
    pub async fn open(
        dir: impl Into<PathBuf>,
        config: StoreConfig,
        signer: UrlSigner,
        clock: impl Clock,
    ) -> Result<Self, TransferError> {
        let clock: Arc<dyn Clock> = Arc::new(clock);
        let backend = DirBackend::open(dir, config.quota(), clock.now_millis()).await?;
        Ok(Self::with_backend(Arc::new(backend), config, signer, clock))
    }

    /// A store over an opened backend (see [`FileBackend`]); the backend enforces the capacity
    /// it was opened with.
    pub fn with_backend(
        backend: Arc<dyn FileBackend>,
        config: StoreConfig,
        signer: UrlSigner,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self { shared: Arc::new(Shared { backend, config, signer, clock }) }
    }

    /// Opens a store on PostgreSQL: records in one table, bytes in chunks of at most 256 KiB in
    /// another, capacity enforced in the database so it holds across replicas. Applies the
    /// `file-transfer` schema migrations and deletes expired files and abandoned uploads.
    #[cfg(feature = "postgres")]
    pub async fn open_postgres(
        pool: xagent_storage_postgres::Pool,
        config: StoreConfig,
        signer: UrlSigner,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, TransferError> {
        let backend =
            crate::backend::PostgresBackend::open(pool, &config, clock.now_millis()).await?;
        Ok(Self::with_backend(Arc::new(backend), config, signer, clock))
    }

    /// The signer that issues this store's download URLs.
    pub fn signer(&self) -> &UrlSigner {
        &self.shared.signer
    }

    /// The store's policies.
    pub fn config(&self) -> &StoreConfig {
        &self.shared.config
    }

    /// Now, according to the store's clock (Unix ms).
    pub fn now(&self) -> u64 {
        self.shared.clock.now_millis()
    }

    /// Current occupancy.
    pub async fn usage(&self) -> Result<StoreUsage, TransferError> {
        self.shared.backend.usage().await
    }

    /// Starts a new file; write its bytes with [`PendingFile::write`] and make it visible with
    /// [`PendingFile::finish`]. Dropping the pending file discards it.
    pub async fn begin(&self, new_file: NewFile) -> Result<PendingFile, TransferError> {
        self.begin_as(new_file_ref(), new_file, None).await
    }

    async fn begin_as(
        &self,
        file_ref: FileRef,
        new_file: NewFile,
        imported: Option<FileRecord>,
    ) -> Result<PendingFile, TransferError> {
        let sink = self.shared.backend.begin(&file_ref, &new_file.channel, self.now()).await?;
        Ok(PendingFile {
            store: self.clone(),
            limit: new_file.max_bytes.unwrap_or(self.shared.config.max_file_bytes),
            file_ref,
            new_file,
            sink: Some(sink),
            written: 0,
            imported,
        })
    }

    /// Every unexpired file, in `file_ref` order.
    pub async fn list(&self) -> Result<Vec<FileRecord>, TransferError> {
        self.shared.backend.list(self.now()).await
    }

    /// Copies every unexpired file of `self` into `target` (for moving a state directory's
    /// files to a database), keeping each one's reference, channel, names and times, so links
    /// and messages that name them stay valid. Files `target` already holds are skipped;
    /// `target`'s limits apply. Returns how many files were copied.
    pub async fn copy_into(&self, target: &FileStore) -> Result<usize, TransferError> {
        let mut copied = 0;
        for record in self.list().await? {
            if target.get(&record.file_ref).await?.is_some() {
                continue;
            }
            let new_file = NewFile::new(record.connector_channel_id.clone(), &record.filename)
                .with_max_bytes(record.byte_size);
            let mut pending =
                target.begin_as(record.file_ref.clone(), new_file, Some(record.clone())).await?;
            let mut reader = self.shared.backend.read(&record, 0, record.byte_size).await?;
            let mut buffer = vec![0u8; WRITE_CHUNK];
            loop {
                let read = reader.read(&mut buffer).await?;
                if read == 0 {
                    break;
                }
                pending.write(&buffer[..read]).await?;
            }
            pending.finish().await?;
            copied += 1;
        }
        Ok(copied)
    }

    /// Stores bytes already in memory (small inbound files such as thumbnails).
    pub async fn register_bytes(
        &self,
        new_file: NewFile,
        bytes: impl AsRef<[u8]>,
    ) -> Result<RegisteredFile, TransferError> {
        let mut pending = self.begin(new_file).await?;
        pending.write(bytes.as_ref()).await?;
        pending.finish().await
    }

    /// Stores a stream of chunks (for example a target-system download) without holding it
    /// whole in memory. A stream error aborts the file and is returned as an I/O error.
    pub async fn register_stream<S, B, E>(
        &self,
        new_file: NewFile,
        stream: S,
    ) -> Result<RegisteredFile, TransferError>
    where
        S: Stream<Item = Result<B, E>>,
        B: AsRef<[u8]>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut pending = self.begin(new_file).await?;
        let mut stream = std::pin::pin!(stream);
        let mut gathered = Gather::default();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(std::io::Error::other)?;
            gathered.write(&mut pending, chunk.as_ref()).await?;
        }
        gathered.flush(&mut pending).await?;
        pending.finish().await
    }

    /// Stores everything an async reader yields, chunk by chunk.
    pub async fn register_reader<R>(
        &self,
        new_file: NewFile,
        reader: R,
    ) -> Result<RegisteredFile, TransferError>
    where
        R: AsyncRead,
    {
        let mut pending = self.begin(new_file).await?;
        let mut reader = std::pin::pin!(reader);
        let mut buffer = vec![0u8; WRITE_CHUNK];
        loop {
            let read = reader.read(&mut buffer).await?;
            if read == 0 {
                break;
            }
            pending.write(&buffer[..read]).await?;
        }
        pending.finish().await
    }

    /// The record of an unexpired file, `None` when there is none.
    pub async fn get(&self, file_ref: &FileRef) -> Result<Option<FileRecord>, TransferError> {
        self.shared.backend.get(file_ref, self.now()).await
    }

    /// Opens an unexpired file for reading. On a directory the reader stays readable even if
    /// the file is removed or cleaned up meanwhile; on a database a removal ends it with an
    /// I/O error.
    pub async fn open_file(
        &self,
        file_ref: &FileRef,
    ) -> Result<(FileRecord, FileReader), TransferError> {
        let record = self.get(file_ref).await?.ok_or(NOT_FOUND)?;
        let reader = self.shared.backend.read(&record, 0, record.byte_size).await?;
        Ok((record, reader))
    }

    /// Reads `len` bytes of a stored file from byte `start` (an HTTP `Range`); the range is
    /// clipped to the file.
    pub async fn open_range(
        &self,
        record: &FileRecord,
        start: u64,
        len: u64,
    ) -> Result<FileReader, TransferError> {
        let start = start.min(record.byte_size);
        let len = len.min(record.byte_size - start);
        self.shared.backend.read(record, start, len).await
    }

    /// A fresh signed download URL for a stored, unexpired file.
    pub fn download_url(&self, record: &FileRecord) -> SignedUrl {
        self.shared.signer.signed_url(
            &record.file_ref,
            &record.connector_channel_id,
            self.now(),
            record.expires_at,
        )
    }

    /// A `chat.message.files[]` item with a fresh signed download URL (use this when a message
    /// is (re)sent later than the file was registered).
    pub fn chat_file(&self, record: &FileRecord) -> ChatFile {
        record.to_chat_file(self.download_url(record).url)
    }

    /// Deletes one file; false when it was not stored.
    pub async fn remove(&self, file_ref: &FileRef) -> Result<bool, TransferError> {
        Ok(self.shared.backend.remove(file_ref).await?.is_some())
    }

    /// Deletes every file of a channel (call it when the channel is unregistered); returns how
    /// many were deleted. Uploads to that channel still in progress are refused when they
    /// finish, with [`TransferError::UnknownChannel`].
    pub async fn remove_channel(
        &self,
        channel: &ConnectorChannelId,
    ) -> Result<usize, TransferError> {
        self.shared.backend.remove_channel(channel).await
    }

    /// Deletes every file expired at `now` (Unix ms), and on a shared database the uploads
    /// idle for longer than [`StoreConfig::upload_idle_timeout`].
    pub async fn cleanup(&self, now: u64) -> Result<CleanupReport, TransferError> {
        let report = self.shared.backend.cleanup(now).await?;
        if report.files > 0 {
            tracing::debug!(files = report.files, bytes = report.bytes, "expired files deleted");
        }
        Ok(report)
    }

    /// The period [`FileStore::spawn_cleanup`] uses: the configured interval, but never more
    /// than half the TTL (and at least one second).
    pub fn cleanup_period(&self) -> Duration {
        let config = &self.shared.config;
        config.cleanup_interval.min(config.ttl / 2).max(Duration::from_secs(1))
    }

    /// Runs [`FileStore::cleanup`] every [`FileStore::cleanup_period`] on the current tokio
    /// runtime, with the store's clock. The task ends by itself once every clone of the store
    /// is dropped; abort the handle to stop it earlier. A failed round is logged and retried
    /// at the next period.
    pub fn spawn_cleanup(&self) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        let period = self.cleanup_period();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(period);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(shared) = weak.upgrade() else { break };
                let store = FileStore { shared };
                if let Err(error) = store.cleanup(store.now()).await {
                    tracing::warn!(%error, "file cleanup failed; retrying at the next period");
                }
            }
        })
    }
}

pub(crate) const NOT_FOUND: TransferError =
    TransferError::FileNotFound("the file does not exist or has expired");

/// Gathers small streamed chunks into pieces of [`WRITE_CHUNK`] bytes, so a backend that
/// reserves capacity per write (a database round trip) sees few, bounded writes.
#[derive(Default)]
pub(crate) struct Gather {
    buffer: Vec<u8>,
}

impl Gather {
    /// Adds `chunk`, writing a full piece whenever one is ready.
    pub(crate) async fn write(
        &mut self,
        pending: &mut PendingFile,
        mut chunk: &[u8],
    ) -> Result<(), TransferError> {
        // A write past the per-file limit is refused now, not once the piece is full.
        let buffered = self.buffer.len() as u64;
        if pending.written.saturating_add(buffered).saturating_add(chunk.len() as u64)
            > pending.limit
        {
            return Err(TransferError::TooLarge { limit: pending.limit });
        }
        while !chunk.is_empty() {
            let room = WRITE_CHUNK - self.buffer.len();
            let (now, later) = chunk.split_at(room.min(chunk.len()));
            if self.buffer.is_empty() && now.len() == WRITE_CHUNK {
                pending.write(now).await?;
            } else {
                self.buffer.extend_from_slice(now);
                if self.buffer.len() == WRITE_CHUNK {
                    self.flush(pending).await?;
                }
            }
            chunk = later;
        }
        Ok(())
    }

    /// Writes what is gathered.
    pub(crate) async fn flush(&mut self, pending: &mut PendingFile) -> Result<(), TransferError> {
        if !self.buffer.is_empty() {
            pending.write(&self.buffer).await?;
            self.buffer.clear();
        }
        Ok(())
    }
}

/// A file being written. Dropping it before [`PendingFile::finish`] deletes what was written
/// and releases its share of the store's capacity.
pub struct PendingFile {
    store: FileStore,
    file_ref: FileRef,
    new_file: NewFile,
    sink: Option<Box<dyn UploadSink>>,
    limit: u64,
    written: u64,
    /// The record of a file copied from another store, kept as it was.
    imported: Option<FileRecord>,
}

impl std::fmt::Debug for PendingFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFile")
            .field("file_ref", &self.file_ref)
            .field("new_file", &self.new_file)
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

impl PendingFile {
    /// The reference the file will have.
    pub fn file_ref(&self) -> &FileRef {
        &self.file_ref
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Sets the target-system recipient reference (an upload form field may come after the
    /// file itself).
    pub fn set_recipient_ref(&mut self, value: Option<String>) {
        self.new_file.recipient_ref = value;
    }

    /// Sets the target-system reply reference.
    pub fn set_reply_token(&mut self, value: Option<String>) {
        self.new_file.reply_token = value;
    }

    /// Appends a chunk. Fails with [`TransferError::TooLarge`] past the per-file limit and with
    /// [`TransferError::CapacityExceeded`] when the store is full; neither keeps any of the
    /// chunk, so a smaller one may follow. After any other error the file is unusable.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), TransferError> {
        if chunk.is_empty() {
            return Ok(());
        }
        let len = chunk.len() as u64;
        if self.written.saturating_add(len) > self.limit {
            return Err(TransferError::TooLarge { limit: self.limit });
        }
        let now = self.store.now();
        let sink =
            self.sink.as_mut().ok_or_else(|| std::io::Error::other("pending file closed"))?;
        match sink.write(chunk, now).await {
            Ok(()) => {
                self.written += len;
                Ok(())
            }
            Err(TransferError::CapacityExceeded) => Err(TransferError::CapacityExceeded),
            Err(error) => {
                // The backend may have kept part of the chunk: the file is unusable.
                self.sink = None;
                Err(error)
            }
        }
    }

    /// Appends an owned chunk; see [`PendingFile::write`].
    pub async fn write_bytes(&mut self, chunk: Bytes) -> Result<(), TransferError> {
        self.write(&chunk).await
    }

    /// Makes the file durable and visible, and returns it with a signed download URL.
    pub async fn finish(mut self) -> Result<RegisteredFile, TransferError> {
        let sink = self.sink.take().ok_or_else(|| std::io::Error::other("pending file closed"))?;
        let store = self.store.clone();
        let now = store.now();
        let ttl = u64::try_from(store.shared.config.ttl.as_millis()).unwrap_or(u64::MAX);
        if let Some(record) = self.imported.take() {
            if record.byte_size != self.written {
                return Err(TransferError::Io(std::io::Error::other(
                    "a copied file's size does not match its record",
                )));
            }
            sink.finish(&record).await?;
            let download = store.download_url(&record);
            return Ok(RegisteredFile { record, download });
        }
        let mime_type = resolve_mime(self.new_file.mime_type.as_deref(), &self.new_file.filename);
        let record = FileRecord {
            file_ref: self.file_ref.clone(),
            connector_channel_id: self.new_file.channel.clone(),
            filename: self.new_file.filename.clone(),
            file_type: FileType::from_mime(&mime_type),
            mime_type,
            byte_size: self.written,
            created_at: now,
            expires_at: now.saturating_add(ttl),
            recipient_ref: self.new_file.recipient_ref.take(),
            reply_token: self.new_file.reply_token.take(),
        };
        sink.finish(&record).await?;
        let download = store.download_url(&record);
        Ok(RegisteredFile { record, download })
    }
}

/// Keeps only the last path component, drops control characters, bounds the length.
fn clean_filename(raw: &str) -> String {
    let last = raw.rsplit(['/', '\\']).next().unwrap_or_default();
    let cleaned: String = last.chars().filter(|c| !c.is_control()).collect();
    let trimmed = cleaned.trim();
    if trimmed.is_empty() || trimmed == "." || trimmed == ".." {
        return "file".to_owned();
    }
    let mut end = trimmed.len().min(MAX_FILENAME_BYTES);
    while !trimmed.is_char_boundary(end) {
        end -= 1;
    }
    trimmed[..end].to_owned()
}

/// The declared MIME type when it is usable and specific, else a guess from the extension.
pub(crate) fn resolve_mime(declared: Option<&str>, filename: &str) -> String {
    let declared = declared.map(str::trim).filter(|mime| {
        !mime.is_empty()
            && mime.len() <= 255
            && mime.contains('/')
            && mime.bytes().all(|b| (0x20..0x7f).contains(&b))
            && !mime.eq_ignore_ascii_case("application/octet-stream")
    });
    match declared {
        Some(mime) => mime.to_owned(),
        None => mime_guess::from_path(filename)
            .first()
            .map(|mime| mime.essence_str().to_owned())
            .unwrap_or_else(|| "application/octet-stream".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::{ManualClock, Secret};

    const START: u64 = 1_800_000_000_000;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            let mut bytes = [0u8; 8];
            rand::fill(&mut bytes[..]);
            let path = std::env::temp_dir().join(format!("xft-unit-{}", hex::encode(bytes)));
            Self(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn signer() -> UrlSigner {
        UrlSigner::new(Secret::new("unit-test-secret-0123456789")).unwrap()
    }

    async fn store_with(dir: &TempDir, clock: &ManualClock, config: StoreConfig) -> FileStore {
        FileStore::open(&dir.0, config, signer(), clock.clone()).await.unwrap()
    }

    fn channel(name: &str) -> ConnectorChannelId {
        ConnectorChannelId::new(name)
    }

    #[tokio::test]
    async fn cleanup_period_is_at_most_half_the_ttl() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let config = StoreConfig::default().with_ttl(Duration::from_secs(60));
        let store = store_with(&dir, &clock, config).await;
        assert_eq!(store.cleanup_period(), Duration::from_secs(30));
        let dir2 = TempDir::new();
        let store = store_with(&dir2, &clock, StoreConfig::default()).await;
        assert_eq!(store.cleanup_period(), DEFAULT_CLEANUP_INTERVAL);
        assert!(store.cleanup_period() <= DEFAULT_FILE_TTL / 2);
    }

    #[tokio::test(start_paused = true)]
    async fn spawned_cleanup_runs_with_the_store_clock_and_stops_with_the_store() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let config = StoreConfig::default().with_ttl(Duration::from_secs(60));
        let store = store_with(&dir, &clock, config).await;
        store.register_bytes(NewFile::new(channel("c"), "a"), b"x").await.unwrap();
        let task = store.spawn_cleanup();
        clock.advance(60_000);
        // Paused tokio time: sleeping auto-advances to the next tick without waiting.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(31)).await;
            if store.usage().await.unwrap().files == 0 {
                break;
            }
        }
        assert_eq!(store.usage().await.unwrap().files, 0);
        drop(store);
        tokio::time::sleep(Duration::from_secs(31)).await;
        tokio::time::timeout(Duration::from_secs(60), task).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn gathered_chunks_reach_the_backend_whole_and_respect_the_limit_at_once() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let store = store_with(&dir, &clock, StoreConfig::default()).await;
        let mut pending =
            store.begin(NewFile::new(channel("c"), "a").with_max_bytes(10)).await.unwrap();
        let mut gathered = Gather::default();
        gathered.write(&mut pending, b"12345").await.unwrap();
        assert_eq!(pending.written(), 0, "small chunks wait in the gather buffer");
        assert!(matches!(
            gathered.write(&mut pending, b"123456").await,
            Err(TransferError::TooLarge { limit: 10 })
        ));
        gathered.flush(&mut pending).await.unwrap();
        assert_eq!(pending.written(), 5);

        let mut big = store.begin(NewFile::new(channel("c"), "b")).await.unwrap();
        let mut gathered = Gather::default();
        gathered.write(&mut big, &[7u8; WRITE_CHUNK + 3]).await.unwrap();
        assert_eq!(big.written(), WRITE_CHUNK as u64);
        gathered.flush(&mut big).await.unwrap();
        assert_eq!(big.finish().await.unwrap().record.byte_size, WRITE_CHUNK as u64 + 3);
    }

    #[test]
    fn debug_of_a_record_redacts_target_system_references() {
        let record = FileRecord {
            file_ref: FileRef::new("file_x"),
            connector_channel_id: channel("c"),
            filename: "f".into(),
            mime_type: "text/plain".into(),
            file_type: FileType::File,
            byte_size: 1,
            created_at: 0,
            expires_at: 1,
            recipient_ref: Some("wxid_secretish".into()),
            reply_token: Some("ctx-token".into()),
        };
        let text = format!("{record:?}");
        assert!(!text.contains("wxid_secretish") && !text.contains("ctx-token"), "{text}");
        let new_file = NewFile::new(channel("c"), "f").with_reply_token("ctx-token");
        assert!(!format!("{new_file:?}").contains("ctx-token"));
    }

    #[test]
    fn filenames_are_reduced_to_a_safe_last_component() {
        assert_eq!(clean_filename("../../etc/passwd"), "passwd");
        assert_eq!(clean_filename("C:\\Users\\me\\report.pdf"), "report.pdf");
        assert_eq!(clean_filename("a\u{0}b\nc.txt"), "abc.txt");
        assert_eq!(clean_filename(""), "file");
        assert_eq!(clean_filename(".."), "file");
        assert_eq!(clean_filename("dir/"), "file");
        let long = "é".repeat(200);
        let cleaned = clean_filename(&long);
        assert!(cleaned.len() <= MAX_FILENAME_BYTES && cleaned.chars().all(|c| c == 'é'));
    }

    #[test]
    fn mime_type_comes_from_the_declaration_or_the_extension() {
        assert_eq!(resolve_mime(Some("image/webp"), "x.bin"), "image/webp");
        assert_eq!(resolve_mime(Some("application/octet-stream"), "clip.mp4"), "video/mp4");
        assert_eq!(resolve_mime(None, "song.mp3"), "audio/mpeg");
        assert_eq!(resolve_mime(Some("garbage"), "noext"), "application/octet-stream");
        assert_eq!(resolve_mime(Some("text/plain\r\nX: y"), "a.txt"), "text/plain");
    }
}
