//! The file store: records and bytes on a [`FileBackend`] (a directory or PostgreSQL), each
//! file bound to one channel, with a TTL, capacity limits, cleanup and signed download URLs.
//!
//! The store owns what does not depend on where bytes live: file names, MIME types, the
//! per-file limit, the TTL and the URLs. The backend owns visibility and the capacity totals
//! (see [`FileBackend`]).

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt};
use xagent_protocol_types::{ChatFile, Clock, ConnectorChannelId, FileRef};

use crate::TransferError;
use crate::backend::{DirBackend, FileBackend, FileReader};
use crate::config::{StoreConfig, WRITE_CHUNK};
use crate::ids::new_file_ref;
use crate::pending::{Gather, NewFile, PendingFile, Shared};
use crate::record::{CleanupReport, FileRecord, NOT_FOUND, RegisteredFile, StoreUsage};
use crate::signer::{SignedUrl, UrlSigner};

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
        self.shared.now()
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
        PendingFile::begin(self.shared.clone(), file_ref, new_file, imported).await
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
            let reader = self.shared.backend.read(&record, 0, record.byte_size).await?;
            pour(reader, &mut pending).await?;
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
        pour(reader, &mut pending).await?;
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
        self.shared.download_url(record)
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

/// Writes everything `reader` yields into `pending`, chunk by chunk.
async fn pour(reader: impl AsyncRead, pending: &mut PendingFile) -> Result<(), TransferError> {
    let mut reader = std::pin::pin!(reader);
    let mut buffer = vec![0u8; WRITE_CHUNK];
    loop {
        let read = reader.read(&mut buffer).await?;
        if read == 0 {
            return Ok(());
        }
        pending.write(&buffer[..read]).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DEFAULT_CLEANUP_INTERVAL, DEFAULT_FILE_TTL};
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
}
