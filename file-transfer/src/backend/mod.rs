//! Where a [`FileStore`](crate::FileStore) keeps its records and bytes: the [`FileBackend`]
//! trait and its two implementations, a directory ([`DirBackend`]) and, with the `postgres`
//! feature, a PostgreSQL database (`PostgresBackend`).
//!
//! The store owns the rules that do not depend on where bytes live (file names, MIME types,
//! the per-file limit, the TTL, signed URLs); a backend owns what must be atomic with the bytes:
//! the visibility of a finished file, the capacity totals (file count and bytes, counting uploads
//! in progress), the reclaiming of expired files when full, and the refusal of an upload whose
//! channel was removed while it ran.

mod dir;
#[cfg(feature = "postgres")]
mod postgres;

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use xagent_protocol_types::{ConnectorChannelId, FileRef};

use crate::TransferError;
pub use crate::config::Quota;
use crate::record::{CleanupReport, FileRecord, StoreUsage};

pub use dir::DirBackend;
#[cfg(feature = "postgres")]
pub use postgres::{COMPONENT as POSTGRES_COMPONENT, PostgresBackend};

/// Persistence of a [`FileStore`](crate::FileStore): records, bytes, capacity and visibility.
///
/// Contract (checked by the shared suite in `file-transfer/tests/backend_contract.rs`):
/// - a file is visible to [`FileBackend::get`] only once [`UploadSink::finish`] returned `Ok`,
///   and only while `now < expires_at`;
/// - an upload dropped before `finish` (or whose writer died) is never visible and its share
///   of the capacity is released;
/// - [`FileBackend::begin`] counts against `max_files` and [`UploadSink::write`] against
///   `max_total_bytes` *before* accepting anything, deleting expired files first when full;
///   unexpired files are never evicted;
/// - an upload begun before [`FileBackend::remove_channel`] of its channel is refused by
///   `finish` with [`TransferError::UnknownChannel`].
#[async_trait::async_trait]
pub trait FileBackend: Send + Sync + 'static {
    /// Short description for logs and `Debug` (never a secret).
    fn describe(&self) -> String;

    /// Starts an upload of `file_ref` for `channel`, admitted against the file count at `now`.
    async fn begin(
        &self,
        file_ref: &FileRef,
        channel: &ConnectorChannelId,
        now: u64,
    ) -> Result<Box<dyn UploadSink>, TransferError>;

    /// The record of a finished file that has not expired at `now`.
    async fn get(&self, file_ref: &FileRef, now: u64) -> Result<Option<FileRecord>, TransferError>;

    /// Reads `len` bytes of a finished file from byte `start`.
    async fn read(
        &self,
        record: &FileRecord,
        start: u64,
        len: u64,
    ) -> Result<FileReader, TransferError>;

    /// Deletes one finished file; its record when it was stored.
    async fn remove(&self, file_ref: &FileRef) -> Result<Option<FileRecord>, TransferError>;

    /// Deletes every finished file of `channel` and dooms its uploads in progress; returns how
    /// many files were deleted.
    async fn remove_channel(&self, channel: &ConnectorChannelId) -> Result<usize, TransferError>;

    /// Deletes every file expired at `now` (and uploads abandoned by a dead writer).
    async fn cleanup(&self, now: u64) -> Result<CleanupReport, TransferError>;

    /// Current occupancy.
    async fn usage(&self) -> Result<StoreUsage, TransferError>;

    /// Every finished file not expired at `now`, in `file_ref` order.
    async fn list(&self, now: u64) -> Result<Vec<FileRecord>, TransferError>;
}

/// An upload in progress on a backend. Dropping it before [`UploadSink::finish`] discards it.
#[async_trait::async_trait]
pub trait UploadSink: Send {
    /// Reserves `chunk.len()` bytes of the total capacity at `now` and appends the chunk;
    /// [`TransferError::CapacityExceeded`] when the store stays full after reclaiming expired
    /// files, having kept nothing of the chunk (the upload stays usable). After any other
    /// error the store drops the upload.
    async fn write(&mut self, chunk: &[u8], now: u64) -> Result<(), TransferError>;

    /// Makes the file visible with `record` (whose `byte_size` is what was written).
    async fn finish(self: Box<Self>, record: &FileRecord) -> Result<(), TransferError>;
}

/// The bytes of a stored file, read as they are needed (never held whole in memory).
///
/// Implements [`AsyncRead`]; wrap it in `tokio_util::io::ReaderStream` to serve it.
pub struct FileReader {
    inner: Pin<Box<dyn AsyncRead + Send>>,
}

impl std::fmt::Debug for FileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileReader").finish_non_exhaustive()
    }
}

impl FileReader {
    /// A reader over any async source (for backends outside this crate).
    pub fn new(reader: impl AsyncRead + Send + 'static) -> Self {
        Self { inner: Box::pin(reader) }
    }
}

impl AsyncRead for FileReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.inner.as_mut().poll_read(cx, buf)
    }
}
