//! The file store: bytes on disk, one JSON sidecar of metadata per file, TTL, capacity, cleanup.
//!
//! Layout of the storage directory (nothing else may write there):
//!
//! - `<file_ref>.bin`: the bytes of a finished file;
//! - `<file_ref>.json`: its [`FileRecord`] (written to `<file_ref>.json.tmp`, then renamed);
//! - `<file_ref>.part`: an upload still in progress.
//!
//! A file becomes visible only once its sidecar exists. [`FileStore::open`] reloads every
//! sidecar, drops expired or corrupt entries and deletes leftovers of interrupted uploads, so a
//! restart loses nothing that had been acknowledged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use xagent_protocol_types::{
    ChatFile, Clock, ConnectorChannelId, FileRef, FileType, UploadResponse,
};

use crate::TransferError;
use crate::ids::{is_well_formed, new_file_ref};
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
/// Largest sidecar read at startup; anything bigger is treated as corrupt.
const MAX_SIDECAR_BYTES: u64 = 256 * 1024;
/// Read buffer for [`FileStore::register_reader`].
const READ_CHUNK: usize = 64 * 1024;
/// Format tag written into every sidecar.
const SIDECAR_FORMAT: &str = "xagent.file-transfer.sidecar/v1";

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
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_FILE_TTL,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
            max_files: DEFAULT_MAX_FILES,
            cleanup_interval: DEFAULT_CLEANUP_INTERVAL,
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

/// Current occupancy of a [`FileStore`].
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

#[derive(Default)]
struct State {
    files: HashMap<FileRef, FileRecord>,
    stored_bytes: u64,
    pending_files: usize,
    pending_bytes: u64,
    /// Bumped by every [`FileStore::remove_channel`].
    removal_generation: u64,
    /// Channels removed while uploads were in progress, with the generation of the removal,
    /// so an upload that began before the removal is refused when it finishes. Cleared
    /// whenever no upload is in progress.
    removed_channels: HashMap<ConnectorChannelId, u64>,
}

impl State {
    /// Forgets an upload that ended (finished or dropped).
    fn end_pending(&mut self, written: u64) {
        self.pending_files = self.pending_files.saturating_sub(1);
        self.pending_bytes = self.pending_bytes.saturating_sub(written);
        if self.pending_files == 0 {
            self.removed_channels.clear();
        }
    }

    /// Removes every expired record from the index and returns them (files still on disk).
    fn take_expired(&mut self, now: u64) -> Vec<FileRecord> {
        let expired: Vec<FileRef> = self
            .files
            .values()
            .filter(|record| record.is_expired(now))
            .map(|record| record.file_ref.clone())
            .collect();
        expired.iter().filter_map(|file_ref| self.take(file_ref)).collect()
    }

    fn take(&mut self, file_ref: &FileRef) -> Option<FileRecord> {
        let record = self.files.remove(file_ref)?;
        self.stored_bytes = self.stored_bytes.saturating_sub(record.byte_size);
        Some(record)
    }
}

struct Shared {
    dir: PathBuf,
    config: StoreConfig,
    signer: UrlSigner,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// Directory `fsync`s done (tests check renames are followed by one).
    dir_syncs: std::sync::atomic::AtomicU64,
}

/// Files on disk under one directory, each bound to one channel, with TTL, capacity limits and
/// restart-safe metadata. Cheap to clone; clones share the store.
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
            .field("dir", &self.shared.dir)
            .field("config", &self.shared.config)
            .field("usage", &self.usage())
            .finish()
    }
}

impl FileStore {
    /// Opens (creating if needed) a store in `dir` and reloads the files stored there by an
    /// earlier run. Expired entries, corrupt sidecars and unfinished uploads are deleted.
    pub async fn open(
        dir: impl Into<PathBuf>,
        config: StoreConfig,
        signer: UrlSigner,
        clock: impl Clock,
    ) -> Result<Self, TransferError> {
        let dir = dir.into();
        create_private_dir(&dir).await?;
        let clock: Arc<dyn Clock> = Arc::new(clock);
        let state = load_dir(&dir, clock.now_millis()).await?;
        tracing::debug!(files = state.files.len(), bytes = state.stored_bytes, "file store opened");
        Ok(Self {
            shared: Arc::new(Shared {
                dir,
                config,
                signer,
                clock,
                state: Mutex::new(state),
                dir_syncs: std::sync::atomic::AtomicU64::new(0),
            }),
        })
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
    pub fn usage(&self) -> StoreUsage {
        let state = self.lock();
        StoreUsage {
            files: state.files.len(),
            bytes: state.stored_bytes,
            pending_files: state.pending_files,
            pending_bytes: state.pending_bytes,
        }
    }

    /// Starts a new file; write its bytes with [`PendingFile::write`] and make it visible with
    /// [`PendingFile::finish`]. Dropping the pending file discards it.
    pub async fn begin(&self, new_file: NewFile) -> Result<PendingFile, TransferError> {
        let now = self.now();
        let (expired, admitted, generation) = {
            let mut state = self.lock();
            let max = self.shared.config.max_files;
            let mut expired = Vec::new();
            if state.files.len() + state.pending_files >= max {
                expired = state.take_expired(now);
            }
            let admitted = state.files.len() + state.pending_files < max;
            if admitted {
                state.pending_files += 1;
            }
            (expired, admitted, state.removal_generation)
        };
        self.delete_data(&expired).await;
        if !admitted {
            return Err(TransferError::CapacityExceeded);
        }
        let file_ref = new_file_ref();
        let part = self.path(&file_ref, "part");
        let mut pending = PendingFile {
            store: self.clone(),
            limit: new_file.max_bytes.unwrap_or(self.shared.config.max_file_bytes),
            file_ref,
            new_file,
            file: None,
            written: 0,
            generation,
            done: false,
        };
        let mut options = tokio::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        options.mode(0o600);
        let file = options.open(&part).await?;
        pending.file = Some(file);
        Ok(pending)
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
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(std::io::Error::other)?;
            pending.write(chunk.as_ref()).await?;
        }
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
        let mut buffer = vec![0u8; READ_CHUNK];
        loop {
            let read = reader.read(&mut buffer).await?;
            if read == 0 {
                break;
            }
            pending.write(&buffer[..read]).await?;
        }
        pending.finish().await
    }

    /// The record of an unexpired file.
    pub fn get(&self, file_ref: &FileRef) -> Option<FileRecord> {
        let now = self.now();
        self.lock().files.get(file_ref).filter(|record| !record.is_expired(now)).cloned()
    }

    /// Opens an unexpired file for reading. The handle stays readable even if the file is
    /// removed or cleaned up meanwhile.
    pub async fn open_file(
        &self,
        file_ref: &FileRef,
    ) -> Result<(FileRecord, tokio::fs::File), TransferError> {
        let record = self.get(file_ref).ok_or(NOT_FOUND)?;
        match tokio::fs::File::open(self.path(&record.file_ref, "bin")).await {
            Ok(file) => Ok((record, file)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(NOT_FOUND),
            Err(error) => Err(error.into()),
        }
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
    pub async fn remove(&self, file_ref: &FileRef) -> bool {
        let removed = self.lock().take(file_ref);
        match removed {
            Some(record) => {
                self.delete_data(std::slice::from_ref(&record)).await;
                true
            }
            None => false,
        }
    }

    /// Deletes every file of a channel (call it when the channel is unregistered); returns how
    /// many were deleted. Uploads to that channel still in progress are refused when they
    /// finish, with [`TransferError::UnknownChannel`].
    pub async fn remove_channel(&self, channel: &ConnectorChannelId) -> usize {
        let removed: Vec<FileRecord> = {
            let mut state = self.lock();
            state.removal_generation += 1;
            if state.pending_files > 0 {
                let generation = state.removal_generation;
                state.removed_channels.insert(channel.clone(), generation);
            }
            let refs: Vec<FileRef> = state
                .files
                .values()
                .filter(|record| &record.connector_channel_id == channel)
                .map(|record| record.file_ref.clone())
                .collect();
            refs.iter().filter_map(|file_ref| state.take(file_ref)).collect()
        };
        self.delete_data(&removed).await;
        removed.len()
    }

    /// Deletes every file expired at `now` (Unix ms).
    pub async fn cleanup(&self, now: u64) -> CleanupReport {
        let expired = self.lock().take_expired(now);
        self.delete_data(&expired).await;
        let report = CleanupReport {
            files: expired.len(),
            bytes: expired.iter().map(|record| record.byte_size).sum(),
        };
        if report.files > 0 {
            tracing::debug!(files = report.files, bytes = report.bytes, "expired files deleted");
        }
        report
    }

    /// The period [`FileStore::spawn_cleanup`] uses: the configured interval, but never more
    /// than half the TTL (and at least one second).
    pub fn cleanup_period(&self) -> Duration {
        let config = &self.shared.config;
        config.cleanup_interval.min(config.ttl / 2).max(Duration::from_secs(1))
    }

    /// Runs [`FileStore::cleanup`] every [`FileStore::cleanup_period`] on the current tokio
    /// runtime, with the store's clock. The task ends by itself once every clone of the store
    /// is dropped; abort the handle to stop it earlier.
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
                store.cleanup(store.now()).await;
            }
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Flushes the storage directory itself, so renames in it survive a power cut.
    async fn sync_dir(&self) -> std::io::Result<()> {
        self.shared.dir_syncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.shared.dir.clone();
        tokio::task::spawn_blocking(move || sync_dir_blocking(&dir))
            .await
            .map_err(std::io::Error::other)?
    }

    fn path(&self, file_ref: &FileRef, extension: &str) -> PathBuf {
        self.shared.dir.join(format!("{}.{extension}", file_ref.as_str()))
    }

    async fn delete_data(&self, records: &[FileRecord]) {
        for record in records {
            // Sidecar first: without it a leftover `.bin` is an orphan the next start deletes.
            for extension in ["json", "bin"] {
                remove_quietly(&self.path(&record.file_ref, extension)).await;
            }
        }
    }

    /// Reserves `len` more bytes for a pending file, deleting expired files if that makes room.
    async fn reserve_bytes(&self, len: u64) -> Result<(), TransferError> {
        let max = self.shared.config.max_total_bytes;
        let fits = |state: &State| {
            state.stored_bytes.saturating_add(state.pending_bytes).saturating_add(len) <= max
        };
        let (expired, admitted) = {
            let mut state = self.lock();
            let mut expired = Vec::new();
            if !fits(&state) {
                expired = state.take_expired(self.now());
            }
            let admitted = fits(&state);
            if admitted {
                state.pending_bytes += len;
            }
            (expired, admitted)
        };
        self.delete_data(&expired).await;
        if admitted { Ok(()) } else { Err(TransferError::CapacityExceeded) }
    }
}

const NOT_FOUND: TransferError =
    TransferError::FileNotFound("the file does not exist or has expired");

/// A file being written. Dropping it before [`PendingFile::finish`] deletes what was written
/// and releases its share of the store's capacity.
pub struct PendingFile {
    store: FileStore,
    file_ref: FileRef,
    new_file: NewFile,
    file: Option<tokio::fs::File>,
    limit: u64,
    written: u64,
    /// `State::removal_generation` when the upload began.
    generation: u64,
    done: bool,
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
    /// [`TransferError::CapacityExceeded`] when the store is full; the file is then unusable.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), TransferError> {
        if chunk.is_empty() {
            return Ok(());
        }
        let len = chunk.len() as u64;
        if self.written.saturating_add(len) > self.limit {
            return Err(TransferError::TooLarge { limit: self.limit });
        }
        self.store.reserve_bytes(len).await?;
        self.written += len;
        let file =
            self.file.as_mut().ok_or_else(|| std::io::Error::other("pending file closed"))?;
        file.write_all(chunk).await?;
        Ok(())
    }

    /// Appends an owned chunk; see [`PendingFile::write`].
    pub async fn write_bytes(&mut self, chunk: Bytes) -> Result<(), TransferError> {
        self.write(&chunk).await
    }

    /// Flushes the bytes to disk, writes the sidecar and makes the file visible.
    pub async fn finish(mut self) -> Result<RegisteredFile, TransferError> {
        let mut file =
            self.file.take().ok_or_else(|| std::io::Error::other("pending file closed"))?;
        file.flush().await?;
        file.sync_all().await?;
        drop(file);

        let store = self.store.clone();
        let now = store.now();
        let ttl = u64::try_from(store.shared.config.ttl.as_millis()).unwrap_or(u64::MAX);
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

        let bin = store.path(&self.file_ref, "bin");
        tokio::fs::rename(store.path(&self.file_ref, "part"), &bin).await?;
        if let Err(error) = write_sidecar(&store, &record).await {
            remove_quietly(&bin).await;
            return Err(error);
        }
        // Both renames are durable only once the directory entry itself is on disk.
        store.sync_dir().await?;
        let accepted = {
            let mut state = store.lock();
            state.end_pending(self.written);
            let channel_removed = state
                .removed_channels
                .get(&record.connector_channel_id)
                .is_some_and(|removed_at| *removed_at > self.generation);
            if !channel_removed {
                state.stored_bytes += record.byte_size;
                state.files.insert(record.file_ref.clone(), record.clone());
            }
            !channel_removed
        };
        self.done = true;
        if !accepted {
            store.delete_data(std::slice::from_ref(&record)).await;
            return Err(TransferError::UnknownChannel);
        }
        let download = store.download_url(&record);
        Ok(RegisteredFile { record, download })
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.store.lock().end_pending(self.written);
        self.file = None;
        // Drop cannot await; deleting one directory entry is quick.
        let _ = std::fs::remove_file(self.store.path(&self.file_ref, "part"));
    }
}

/// Sidecar file content: the record plus a format tag.
#[derive(Serialize, Deserialize)]
struct Sidecar {
    format: String,
    #[serde(flatten)]
    record: FileRecord,
}

async fn write_sidecar(store: &FileStore, record: &FileRecord) -> Result<(), TransferError> {
    let sidecar = Sidecar { format: SIDECAR_FORMAT.to_owned(), record: record.clone() };
    let text = serde_json::to_vec_pretty(&sidecar).map_err(std::io::Error::other)?;
    let tmp = store.path(&record.file_ref, "json.tmp");
    let mut options = tokio::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut file = options.open(&tmp).await?;
    file.write_all(&text).await?;
    file.sync_all().await?;
    drop(file);
    tokio::fs::rename(&tmp, store.path(&record.file_ref, "json")).await?;
    Ok(())
}

/// Creates the storage directory readable by this user only (it holds target-system
/// references in the sidecars); an existing directory is left as it is.
async fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = tokio::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    builder.mode(0o700);
    builder.create(dir).await
}

/// `fsync` of a directory (a no-op where directories cannot be opened as files).
pub(crate) fn sync_dir_blocking(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::fs::File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

async fn remove_quietly(path: &Path) {
    if let Err(error) = tokio::fs::remove_file(path).await
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(%error, "could not delete a stored file");
    }
}

/// Reads every sidecar of `dir`, keeps the valid unexpired files and deletes the rest.
async fn load_dir(dir: &Path, now: u64) -> Result<State, TransferError> {
    let mut state = State::default();
    let mut data_files: Vec<(String, PathBuf)> = Vec::new();
    let mut entries = tokio::fs::read_dir(dir).await?;
    while let Some(entry) = entries.next_entry().await? {
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|name| name.to_str()).map(str::to_owned) else {
            continue;
        };
        if let Some(stem) = name.strip_suffix(".json") {
            match read_sidecar(&path, stem, dir, now).await {
                Some(record) => {
                    state.stored_bytes += record.byte_size;
                    state.files.insert(record.file_ref.clone(), record);
                }
                None => remove_quietly(&path).await,
            }
        } else if let Some(stem) = name.strip_suffix(".bin") {
            data_files.push((stem.to_owned(), path));
        } else if is_well_formed(name.split('.').next().unwrap_or_default())
            && (name.ends_with(".part") || name.ends_with(".json.tmp"))
        {
            // Leftover of an upload or sidecar write interrupted by a crash.
            remove_quietly(&path).await;
        }
    }
    for (stem, path) in data_files {
        if is_well_formed(&stem) && !state.files.contains_key(stem.as_str()) {
            remove_quietly(&path).await;
        }
    }
    Ok(state)
}

/// One sidecar, if it is valid, names its own file, has its data and has not expired.
async fn read_sidecar(path: &Path, stem: &str, dir: &Path, now: u64) -> Option<FileRecord> {
    if !is_well_formed(stem) {
        return None;
    }
    let metadata = tokio::fs::metadata(path).await.ok()?;
    if metadata.len() > MAX_SIDECAR_BYTES {
        tracing::warn!(file_ref = stem, "oversized sidecar dropped");
        return None;
    }
    let text = tokio::fs::read(path).await.ok()?;
    let sidecar: Sidecar = match serde_json::from_slice(&text) {
        Ok(sidecar) => sidecar,
        Err(error) => {
            tracing::warn!(file_ref = stem, %error, "corrupt sidecar dropped");
            return None;
        }
    };
    let record = sidecar.record;
    if sidecar.format != SIDECAR_FORMAT || record.file_ref.as_str() != stem {
        tracing::warn!(file_ref = stem, "sidecar of another format or file dropped");
        return None;
    }
    let bin = dir.join(format!("{stem}.bin"));
    let data = tokio::fs::metadata(&bin).await.ok()?;
    if data.len() != record.byte_size || record.is_expired(now) {
        remove_quietly(&bin).await;
        return None;
    }
    Some(record)
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

    const HOUR: u64 = 60 * 60 * 1000;
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

    fn dir_names(dir: &TempDir) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn register_bytes_stores_record_data_and_signed_url() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let store = store_with(&dir, &clock, StoreConfig::default()).await;
        let new_file = NewFile::new(channel("cch_a"), "photo.JPG");
        let registered = store.register_bytes(new_file, b"jpeg bytes").await.unwrap();
        let record = &registered.record;
        assert_eq!(record.byte_size, 10);
        assert_eq!(record.mime_type, "image/jpeg");
        assert_eq!(record.file_type, FileType::Image);
        assert_eq!(record.expires_at, START + 24 * HOUR);
        assert_eq!(record.connector_channel_id, channel("cch_a"));
        assert!(
            registered.download.url.starts_with(&format!("/files/refs/{}?exp=", record.file_ref))
        );
        assert_eq!(registered.download.expires_at, START + 15 * 60 * 1000);

        let chat = registered.chat_file();
        assert_eq!(chat.file_ref, record.file_ref);
        assert_eq!(chat.download_url.as_deref(), Some(registered.download.url.as_str()));
        assert_eq!(chat.byte_size, Some(10));

        let (_, mut file) = store.open_file(&record.file_ref).await.unwrap();
        let mut content = Vec::new();
        file.read_to_end(&mut content).await.unwrap();
        assert_eq!(content, b"jpeg bytes");
        assert_eq!(store.get(&record.file_ref).as_ref(), Some(record));
    }

    #[tokio::test]
    async fn i5_every_finished_file_syncs_its_directory_after_the_renames() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let store = store_with(&dir, &clock, StoreConfig::default()).await;
        let before = store.shared.dir_syncs.load(std::sync::atomic::Ordering::Relaxed);
        store.register_bytes(NewFile::new(channel("cch_a"), "a.txt"), b"a").await.unwrap();
        store.register_bytes(NewFile::new(channel("cch_a"), "b.txt"), b"b").await.unwrap();
        let after = store.shared.dir_syncs.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(after - before, 2, "one directory fsync per finished file");
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn m6_stored_files_and_sidecars_are_readable_by_their_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let store = store_with(&dir, &clock, StoreConfig::default()).await;
        store.register_bytes(NewFile::new(channel("cch_a"), "a.txt"), b"a").await.unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.0), 0o700);
        for name in dir_names(&dir) {
            assert_eq!(mode(&dir.0.join(&name)), 0o600, "{name}");
        }
    }

    #[tokio::test]
    async fn register_stream_and_reader_store_every_chunk() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let store = store_with(&dir, &clock, StoreConfig::default()).await;
        let chunks = futures_util::stream::iter(vec![
            Ok::<_, std::io::Error>(Bytes::from_static(b"ab")),
            Ok(Bytes::from_static(b"cd")),
        ]);
        let streamed =
            store.register_stream(NewFile::new(channel("c"), "a.txt"), chunks).await.unwrap();
        assert_eq!(streamed.record.byte_size, 4);
        assert_eq!(streamed.record.mime_type, "text/plain");
        let read = store
            .register_reader(NewFile::new(channel("c"), "b.bin"), &b"0123456789"[..])
            .await
            .unwrap();
        assert_eq!(read.record.byte_size, 10);
        assert_eq!(read.record.mime_type, "application/octet-stream");
        assert_eq!(read.record.file_type, FileType::File);
    }

    #[tokio::test]
    async fn failing_stream_leaves_nothing_behind() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let store = store_with(&dir, &clock, StoreConfig::default()).await;
        let chunks = futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"ab")),
            Err(std::io::Error::other("connection reset")),
        ]);
        let result = store.register_stream(NewFile::new(channel("c"), "a"), chunks).await;
        assert!(matches!(result, Err(TransferError::Io(_))));
        assert_eq!(store.usage(), StoreUsage::default());
        assert!(dir_names(&dir).is_empty(), "{:?}", dir_names(&dir));
    }

    #[tokio::test]
    async fn ttl_expiry_hides_the_file_and_cleanup_deletes_it() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let config = StoreConfig::default().with_ttl(Duration::from_secs(3600));
        let store = store_with(&dir, &clock, config).await;
        let kept_until_later =
            store.register_bytes(NewFile::new(channel("c"), "a"), b"1").await.unwrap();
        clock.advance(HOUR / 2);
        let younger = store.register_bytes(NewFile::new(channel("c"), "b"), b"22").await.unwrap();
        clock.advance(HOUR / 2 - 1);
        assert!(store.get(&kept_until_later.record.file_ref).is_some());
        clock.advance(1);
        assert!(store.get(&kept_until_later.record.file_ref).is_none(), "expired at ttl");
        assert!(matches!(
            store.open_file(&kept_until_later.record.file_ref).await,
            Err(TransferError::FileNotFound(_))
        ));
        let report = store.cleanup(clock.now_millis()).await;
        assert_eq!(report, CleanupReport { files: 1, bytes: 1 });
        assert_eq!(store.usage().files, 1);
        assert_eq!(dir_names(&dir).len(), 2, "younger file's data and sidecar remain");
        assert!(store.get(&younger.record.file_ref).is_some());
        assert_eq!(store.cleanup(clock.now_millis()).await, CleanupReport::default());
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
            if store.usage().files == 0 {
                break;
            }
        }
        assert_eq!(store.usage().files, 0);
        drop(store);
        tokio::time::sleep(Duration::from_secs(31)).await;
        tokio::time::timeout(Duration::from_secs(60), task).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn capacity_by_count_refuses_new_files_but_keeps_unexpired_ones() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let config = StoreConfig::default().with_max_files(2);
        let store = store_with(&dir, &clock, config).await;
        let first = store.register_bytes(NewFile::new(channel("c"), "1"), b"1").await.unwrap();
        store.register_bytes(NewFile::new(channel("c"), "2"), b"2").await.unwrap();
        let third = store.register_bytes(NewFile::new(channel("c"), "3"), b"3").await;
        assert!(matches!(third, Err(TransferError::CapacityExceeded)));
        assert!(store.get(&first.record.file_ref).is_some(), "no unexpired file is evicted");
        // Once files expire, their room is reclaimed on demand.
        clock.advance(25 * HOUR);
        store.register_bytes(NewFile::new(channel("c"), "4"), b"4").await.unwrap();
        assert_eq!(store.usage().files, 1);
    }

    #[tokio::test]
    async fn capacity_by_bytes_refuses_while_streaming_and_releases_the_reservation() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let config = StoreConfig::default().with_max_total_bytes(10);
        let store = store_with(&dir, &clock, config).await;
        store.register_bytes(NewFile::new(channel("c"), "a"), [0u8; 6]).await.unwrap();
        let too_big = store.register_bytes(NewFile::new(channel("c"), "b"), [0u8; 5]).await;
        assert!(matches!(too_big, Err(TransferError::CapacityExceeded)));
        let usage = store.usage();
        assert_eq!(
            (usage.files, usage.bytes, usage.pending_files, usage.pending_bytes),
            (1, 6, 0, 0)
        );
        store.register_bytes(NewFile::new(channel("c"), "c"), [0u8; 4]).await.unwrap();
        assert_eq!(dir_names(&dir).len(), 4);
    }

    #[tokio::test]
    async fn concurrent_uploads_share_the_byte_capacity() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let config = StoreConfig::default().with_max_total_bytes(10);
        let store = store_with(&dir, &clock, config).await;
        let mut first = store.begin(NewFile::new(channel("c"), "1")).await.unwrap();
        let mut second = store.begin(NewFile::new(channel("c"), "2")).await.unwrap();
        first.write(&[0; 6]).await.unwrap();
        assert!(matches!(second.write(&[0; 5]).await, Err(TransferError::CapacityExceeded)));
        second.write(&[0; 4]).await.unwrap();
        assert_eq!(store.usage().pending_bytes, 10);
        first.finish().await.unwrap();
        second.finish().await.unwrap();
        assert_eq!((store.usage().bytes, store.usage().pending_bytes), (10, 0));
    }

    #[tokio::test]
    async fn upload_in_progress_when_its_channel_is_removed_is_refused() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let store = store_with(&dir, &clock, StoreConfig::default()).await;
        let mut doomed = store.begin(NewFile::new(channel("a"), "1")).await.unwrap();
        let mut other = store.begin(NewFile::new(channel("b"), "2")).await.unwrap();
        doomed.write(b"x").await.unwrap();
        other.write(b"y").await.unwrap();
        assert_eq!(store.remove_channel(&channel("a")).await, 0);
        // An upload that begins after the removal is a new registration and is accepted.
        let later = store.register_bytes(NewFile::new(channel("a"), "3"), b"z").await.unwrap();
        assert!(matches!(doomed.finish().await, Err(TransferError::UnknownChannel)));
        other.finish().await.unwrap();
        assert!(store.get(&later.record.file_ref).is_some());
        let usage = store.usage();
        assert_eq!((usage.files, usage.bytes, usage.pending_files), (2, 2, 0));
        assert_eq!(dir_names(&dir).len(), 4);
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_new_storage_directory_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        store_with(&dir, &clock, StoreConfig::default()).await;
        let mode = std::fs::metadata(&dir.0).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[tokio::test]
    async fn per_file_limit_is_enforced_while_writing() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let store = store_with(&dir, &clock, StoreConfig::default()).await;
        let mut pending =
            store.begin(NewFile::new(channel("c"), "a").with_max_bytes(5)).await.unwrap();
        pending.write(b"12345").await.unwrap();
        assert!(matches!(pending.write(b"6").await, Err(TransferError::TooLarge { limit: 5 })));
        drop(pending);
        assert!(dir_names(&dir).is_empty());
        assert_eq!(store.usage(), StoreUsage::default());
    }

    #[tokio::test]
    async fn restart_reloads_files_and_drops_expired_orphans_and_partials() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let (kept, expiring) = {
            let store = store_with(&dir, &clock, StoreConfig::default()).await;
            let kept = store
                .register_bytes(
                    NewFile::new(channel("c"), "k.png")
                        .with_recipient_ref("r1")
                        .with_reply_token("t1"),
                    b"png",
                )
                .await
                .unwrap();
            clock.advance(HOUR);
            let config = StoreConfig::default().with_ttl(Duration::from_secs(60));
            let short = FileStore::open(&dir.0, config, signer(), clock.clone()).await.unwrap();
            let expiring =
                short.register_bytes(NewFile::new(channel("c"), "e"), b"e").await.unwrap();
            // An interrupted upload and an orphan data file.
            let pending = short.begin(NewFile::new(channel("c"), "p")).await.unwrap();
            std::mem::forget(pending);
            std::fs::write(dir.0.join("file_00000000000000000000000000000000.bin"), b"o").unwrap();
            std::fs::write(dir.0.join("file_11111111111111111111111111111111.json"), b"{not json")
                .unwrap();
            std::fs::write(dir.0.join("unrelated.txt"), b"left alone").unwrap();
            (kept.record, expiring.record)
        };
        clock.advance(2 * 60 * 1000);
        let store = store_with(&dir, &clock, StoreConfig::default()).await;
        assert_eq!(store.get(&kept.file_ref).as_ref(), Some(&kept));
        assert_eq!(kept.recipient_ref.as_deref(), Some("r1"));
        assert_eq!(kept.reply_token.as_deref(), Some("t1"));
        assert!(store.get(&expiring.file_ref).is_none());
        assert_eq!(store.usage().files, 1);
        assert_eq!(store.usage().bytes, 3);
        let mut expected = vec![
            format!("{}.bin", kept.file_ref),
            format!("{}.json", kept.file_ref),
            "unrelated.txt".to_owned(),
        ];
        expected.sort();
        assert_eq!(dir_names(&dir), expected);
    }

    #[tokio::test]
    async fn files_are_bound_to_their_channel_and_removed_with_it() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let store = store_with(&dir, &clock, StoreConfig::default()).await;
        let a1 = store.register_bytes(NewFile::new(channel("a"), "1"), b"1").await.unwrap();
        store.register_bytes(NewFile::new(channel("a"), "2"), b"2").await.unwrap();
        let b1 = store.register_bytes(NewFile::new(channel("b"), "3"), b"3").await.unwrap();
        assert_eq!(a1.record.connector_channel_id, channel("a"));
        // The signed URL is only valid for the file's own channel.
        let url = &a1.download;
        let sig = url.url.rsplit("sig=").next().unwrap();
        let signer = store.signer();
        assert!(
            signer.verify(&a1.record.file_ref, &channel("a"), url.expires_at, sig, START).is_ok()
        );
        assert!(
            signer.verify(&a1.record.file_ref, &channel("b"), url.expires_at, sig, START).is_err()
        );

        assert_eq!(store.remove_channel(&channel("a")).await, 2);
        assert!(store.get(&a1.record.file_ref).is_none());
        assert!(store.get(&b1.record.file_ref).is_some());
        assert!(store.remove(&b1.record.file_ref).await);
        assert!(!store.remove(&b1.record.file_ref).await);
        assert!(dir_names(&dir).is_empty());
    }

    #[tokio::test]
    async fn fresh_download_url_never_outlives_the_file() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let store = store_with(&dir, &clock, StoreConfig::default()).await;
        let file = store.register_bytes(NewFile::new(channel("a"), "1"), b"1").await.unwrap();
        clock.advance(24 * HOUR - 60_000);
        let url = store.download_url(&file.record);
        assert_eq!(url.expires_at, file.record.expires_at);
        let chat = store.chat_file(&file.record);
        assert_eq!(chat.download_url.as_deref(), Some(url.url.as_str()));
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
