//! The policies of a [`FileStore`](crate::FileStore): TTL, size and capacity limits, cleanup
//! period, and the [`Quota`] a backend enforces.

use std::time::Duration;

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

/// Default time after which an upload with no write is presumed abandoned by a dead process.
pub const DEFAULT_UPLOAD_IDLE_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Read buffer for [`FileStore::register_reader`](crate::FileStore::register_reader), and the size
/// streamed chunks are gathered into before they reach the backend.
pub(crate) const WRITE_CHUNK: usize = 64 * 1024;

/// Policies of a [`FileStore`](crate::FileStore). Start from `StoreConfig::default()` and change
/// fields.
///
/// **Overflow policy:** when a new file would exceed `max_files` or `max_total_bytes`, the store
/// first deletes files whose TTL has passed; if that is not enough, the new file is refused with
/// [`TransferError::CapacityExceeded`](crate::TransferError::CapacityExceeded) (HTTP 507, code
/// `capacity_exceeded`). Unexpired files are never evicted: a `file_ref` already handed to xAgent
/// stays downloadable until its TTL.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StoreConfig {
    /// How long a file stays available after it is stored (default 24 h).
    pub ttl: Duration,
    /// Largest single file unless [`NewFile::with_max_bytes`](crate::NewFile::with_max_bytes) says
    /// otherwise (default 100 MiB).
    pub max_file_bytes: u64,
    /// Total bytes of all files, finished and in progress (default 10 GiB).
    pub max_total_bytes: u64,
    /// Number of files, finished and in progress (default 10,000).
    pub max_files: usize,
    /// Upper bound of the period of [`FileStore::spawn_cleanup`](crate::FileStore::spawn_cleanup)
    /// (default 10 min; the period used is the smaller of this and half the TTL).
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

/// Capacity totals a backend enforces over every file it holds, finished and in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Total bytes of all files.
    pub max_total_bytes: u64,
    /// Number of files.
    pub max_files: usize,
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
