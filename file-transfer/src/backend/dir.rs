//! The directory backend: bytes on disk, one JSON sidecar of metadata per file, the index and
//! the capacity totals in this process's memory (one process owns the directory).
//!
//! Layout of the storage directory (nothing else may write there):
//!
//! - `<file_ref>.bin`: the bytes of a finished file;
//! - `<file_ref>.json`: its [`FileRecord`] (written to `<file_ref>.json.tmp`, then renamed);
//! - `<file_ref>.part`: an upload still in progress.
//!
//! A file becomes visible only once its sidecar exists. [`DirBackend::open`] reloads every
//! sidecar, drops expired or corrupt entries and deletes leftovers of interrupted uploads, so a
//! restart loses nothing that had been acknowledged.

use std::collections::HashMap;
use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use xagent_protocol_types::{ConnectorChannelId, FileRef};

use super::{FileBackend, FileReader, Quota, UploadSink};
use crate::TransferError;
use crate::ids::is_well_formed;
use crate::record::{CleanupReport, FileRecord, NOT_FOUND, StoreUsage};

/// Largest sidecar read at startup; anything bigger is treated as corrupt.
const MAX_SIDECAR_BYTES: u64 = 256 * 1024;
/// Format tag written into every sidecar.
const SIDECAR_FORMAT: &str = "xagent.file-transfer.sidecar/v1";

#[derive(Default)]
struct State {
    files: HashMap<FileRef, FileRecord>,
    stored_bytes: u64,
    pending_files: usize,
    pending_bytes: u64,
    /// Bumped by every [`DirBackend::remove_channel`].
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
    quota: Quota,
    state: Mutex<State>,
    /// Directory `fsync`s done (tests check renames are followed by one).
    dir_syncs: AtomicU64,
}

/// Files under one directory of this machine, as the toolkit always kept them (the layout is
/// unchanged, so existing state directories keep working). Cheap to clone.
#[derive(Clone)]
pub struct DirBackend {
    shared: Arc<Shared>,
}

impl DirBackend {
    /// Opens (creating it 0700 if needed) the directory and reloads the files an earlier run
    /// stored there. Expired entries, corrupt sidecars and unfinished uploads are deleted.
    pub async fn open(
        dir: impl Into<PathBuf>,
        quota: Quota,
        now: u64,
    ) -> Result<Self, TransferError> {
        let dir = dir.into();
        create_private_dir(&dir).await?;
        let state = load_dir(&dir, now).await?;
        tracing::debug!(files = state.files.len(), bytes = state.stored_bytes, "file store opened");
        Ok(Self {
            shared: Arc::new(Shared {
                dir,
                quota,
                state: Mutex::new(state),
                dir_syncs: AtomicU64::new(0),
            }),
        })
    }

    /// The storage directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn path(&self, file_ref: &FileRef, extension: &str) -> PathBuf {
        self.shared.dir.join(format!("{}.{extension}", file_ref.as_str()))
    }

    /// Flushes the storage directory itself, so renames in it survive a power cut.
    async fn sync_dir(&self) -> std::io::Result<()> {
        self.shared.dir_syncs.fetch_add(1, Ordering::Relaxed);
        let dir = self.shared.dir.clone();
        tokio::task::spawn_blocking(move || sync_dir_blocking(&dir))
            .await
            .map_err(std::io::Error::other)?
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
    async fn reserve_bytes(&self, len: u64, now: u64) -> Result<(), TransferError> {
        let max = self.shared.quota.max_total_bytes;
        let fits = |state: &State| {
            state.stored_bytes.saturating_add(state.pending_bytes).saturating_add(len) <= max
        };
        let (expired, admitted) = {
            let mut state = self.lock();
            let mut expired = Vec::new();
            if !fits(&state) {
                expired = state.take_expired(now);
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

    async fn write_sidecar(&self, record: &FileRecord) -> Result<(), TransferError> {
        let sidecar = Sidecar { format: SIDECAR_FORMAT.to_owned(), record: record.clone() };
        let text = serde_json::to_vec_pretty(&sidecar).map_err(std::io::Error::other)?;
        let tmp = self.path(&record.file_ref, "json.tmp");
        let mut options = tokio::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        options.mode(0o600);
        let mut file = options.open(&tmp).await?;
        file.write_all(&text).await?;
        file.sync_all().await?;
        drop(file);
        tokio::fs::rename(&tmp, self.path(&record.file_ref, "json")).await?;
        Ok(())
    }
}

impl std::fmt::Debug for DirBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirBackend").field("dir", &self.shared.dir).finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl FileBackend for DirBackend {
    fn describe(&self) -> String {
        format!("directory {}", self.shared.dir.display())
    }

    async fn begin(
        &self,
        file_ref: &FileRef,
        _channel: &ConnectorChannelId,
        now: u64,
    ) -> Result<Box<dyn UploadSink>, TransferError> {
        let (expired, admitted, generation) = {
            let mut state = self.lock();
            let max = self.shared.quota.max_files;
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
        // From here on the sink's Drop releases the admission, whatever fails.
        let mut sink = DirUpload {
            backend: self.clone(),
            file_ref: file_ref.clone(),
            file: None,
            written: 0,
            generation,
            done: false,
        };
        let mut options = tokio::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        options.mode(0o600);
        sink.file = Some(options.open(self.path(file_ref, "part")).await?);
        Ok(Box::new(sink))
    }

    async fn get(&self, file_ref: &FileRef, now: u64) -> Result<Option<FileRecord>, TransferError> {
        Ok(self.lock().files.get(file_ref).filter(|record| !record.is_expired(now)).cloned())
    }

    async fn read(
        &self,
        record: &FileRecord,
        start: u64,
        len: u64,
    ) -> Result<FileReader, TransferError> {
        // The open handle stays readable even if the file is removed or cleaned up meanwhile.
        let mut file = match tokio::fs::File::open(self.path(&record.file_ref, "bin")).await {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Err(NOT_FOUND),
            Err(error) => return Err(error.into()),
        };
        if start > 0 {
            file.seek(SeekFrom::Start(start)).await?;
        }
        Ok(FileReader::new(file.take(len)))
    }

    async fn remove(&self, file_ref: &FileRef) -> Result<Option<FileRecord>, TransferError> {
        let removed = self.lock().take(file_ref);
        if let Some(record) = &removed {
            self.delete_data(std::slice::from_ref(record)).await;
        }
        Ok(removed)
    }

    async fn remove_channel(&self, channel: &ConnectorChannelId) -> Result<usize, TransferError> {
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
        Ok(removed.len())
    }

    async fn cleanup(&self, now: u64) -> Result<CleanupReport, TransferError> {
        let expired = self.lock().take_expired(now);
        self.delete_data(&expired).await;
        Ok(CleanupReport {
            files: expired.len(),
            bytes: expired.iter().map(|record| record.byte_size).sum(),
        })
    }

    async fn list(&self, now: u64) -> Result<Vec<FileRecord>, TransferError> {
        let mut records: Vec<FileRecord> =
            self.lock().files.values().filter(|record| !record.is_expired(now)).cloned().collect();
        records.sort_by(|a, b| a.file_ref.as_str().cmp(b.file_ref.as_str()));
        Ok(records)
    }

    async fn usage(&self) -> Result<StoreUsage, TransferError> {
        let state = self.lock();
        Ok(StoreUsage {
            files: state.files.len(),
            bytes: state.stored_bytes,
            pending_files: state.pending_files,
            pending_bytes: state.pending_bytes,
        })
    }
}

/// An upload into `<file_ref>.part`.
struct DirUpload {
    backend: DirBackend,
    file_ref: FileRef,
    file: Option<tokio::fs::File>,
    written: u64,
    /// `State::removal_generation` when the upload began.
    generation: u64,
    done: bool,
}

#[async_trait::async_trait]
impl UploadSink for DirUpload {
    async fn write(&mut self, chunk: &[u8], now: u64) -> Result<(), TransferError> {
        let len = chunk.len() as u64;
        self.backend.reserve_bytes(len, now).await?;
        self.written += len;
        let file =
            self.file.as_mut().ok_or_else(|| std::io::Error::other("pending file closed"))?;
        file.write_all(chunk).await?;
        Ok(())
    }

    async fn finish(mut self: Box<Self>, record: &FileRecord) -> Result<(), TransferError> {
        let mut file =
            self.file.take().ok_or_else(|| std::io::Error::other("pending file closed"))?;
        file.flush().await?;
        file.sync_all().await?;
        drop(file);

        let backend = self.backend.clone();
        let bin = backend.path(&self.file_ref, "bin");
        tokio::fs::rename(backend.path(&self.file_ref, "part"), &bin).await?;
        if let Err(error) = backend.write_sidecar(record).await {
            remove_quietly(&bin).await;
            return Err(error);
        }
        // Both renames are durable only once the directory entry itself is on disk.
        backend.sync_dir().await?;
        let accepted = {
            let mut state = backend.lock();
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
            backend.delete_data(std::slice::from_ref(record)).await;
            return Err(TransferError::UnknownChannel);
        }
        Ok(())
    }
}

impl Drop for DirUpload {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.backend.lock().end_pending(self.written);
        self.file = None;
        // Drop cannot await; deleting one directory entry is quick.
        let _ = std::fs::remove_file(self.backend.path(&self.file_ref, "part"));
    }
}

/// Sidecar file content: the record plus a format tag.
#[derive(Serialize, Deserialize)]
struct Sidecar {
    format: String,
    #[serde(flatten)]
    record: FileRecord,
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
fn sync_dir_blocking(dir: &Path) -> std::io::Result<()> {
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

#[cfg(test)]
mod tests {
    //! Rules of the directory layout itself; the behaviour every backend shares is checked by
    //! the contract suite (`tests/backend_contract.rs`).

    use super::*;
    use crate::{FileStore, NewFile, StoreConfig, UrlSigner};
    use xagent_protocol_types::{Clock, ManualClock, Secret};

    const START: u64 = 1_800_000_000_000;
    const HOUR: u64 = 60 * 60 * 1000;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            let mut bytes = [0u8; 8];
            rand::fill(&mut bytes[..]);
            Self(std::env::temp_dir().join(format!("xft-dir-{}", hex::encode(bytes))))
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

    fn channel(name: &str) -> ConnectorChannelId {
        ConnectorChannelId::new(name)
    }

    async fn backend_with(dir: &TempDir, clock: &ManualClock) -> (DirBackend, FileStore) {
        let config = StoreConfig::default();
        let backend = DirBackend::open(&dir.0, config.quota(), clock.now_millis()).await.unwrap();
        let store = FileStore::with_backend(
            Arc::new(backend.clone()),
            config,
            signer(),
            Arc::new(clock.clone()),
        );
        (backend, store)
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
    async fn i5_every_finished_file_syncs_its_directory_after_the_renames() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let (backend, store) = backend_with(&dir, &clock).await;
        let before = backend.shared.dir_syncs.load(Ordering::Relaxed);
        store.register_bytes(NewFile::new(channel("cch_a"), "a.txt"), b"a").await.unwrap();
        store.register_bytes(NewFile::new(channel("cch_a"), "b.txt"), b"b").await.unwrap();
        let after = backend.shared.dir_syncs.load(Ordering::Relaxed);
        assert_eq!(after - before, 2, "one directory fsync per finished file");
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn m6_stored_files_and_sidecars_are_readable_by_their_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let (_, store) = backend_with(&dir, &clock).await;
        store.register_bytes(NewFile::new(channel("cch_a"), "a.txt"), b"a").await.unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.0), 0o700, "a new storage directory is private");
        let names = dir_names(&dir);
        assert_eq!(names.len(), 2);
        for name in names {
            assert_eq!(mode(&dir.0.join(&name)), 0o600, "{name}");
        }
    }

    #[tokio::test]
    async fn the_layout_is_one_data_file_and_one_sidecar_and_nothing_is_left_by_failures() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let (_, store) = backend_with(&dir, &clock).await;
        let chunks = futures_util::stream::iter(vec![
            Ok(bytes::Bytes::from_static(b"ab")),
            Err(std::io::Error::other("connection reset")),
        ]);
        assert!(store.register_stream(NewFile::new(channel("c"), "a"), chunks).await.is_err());
        let mut pending =
            store.begin(NewFile::new(channel("c"), "b").with_max_bytes(1)).await.unwrap();
        assert!(pending.write(b"12").await.is_err());
        drop(pending);
        assert!(dir_names(&dir).is_empty(), "{:?}", dir_names(&dir));
        let kept = store.register_bytes(NewFile::new(channel("c"), "k"), b"k").await.unwrap();
        let file_ref = kept.record.file_ref;
        assert_eq!(dir_names(&dir), vec![format!("{file_ref}.bin"), format!("{file_ref}.json")]);
        assert!(store.remove(&file_ref).await.unwrap());
        assert!(dir_names(&dir).is_empty());
    }

    #[tokio::test]
    async fn restart_reloads_files_and_drops_expired_orphans_corrupt_sidecars_and_partials() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let (kept, expiring) = {
            let (_, store) = backend_with(&dir, &clock).await;
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
            let config = StoreConfig::default().with_ttl(std::time::Duration::from_secs(60));
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
        let (_, store) = backend_with(&dir, &clock).await;
        assert_eq!(store.get(&kept.file_ref).await.unwrap().as_ref(), Some(&kept));
        assert!(store.get(&expiring.file_ref).await.unwrap().is_none());
        let usage = store.usage().await.unwrap();
        assert_eq!((usage.files, usage.bytes), (1, 3));
        let mut expected = vec![
            format!("{}.bin", kept.file_ref),
            format!("{}.json", kept.file_ref),
            "unrelated.txt".to_owned(),
        ];
        expected.sort();
        assert_eq!(dir_names(&dir), expected);
    }

    #[tokio::test]
    async fn a_sidecar_whose_data_has_another_size_is_dropped_at_start() {
        let dir = TempDir::new();
        let clock = ManualClock::new(START);
        let file_ref = {
            let (_, store) = backend_with(&dir, &clock).await;
            store
                .register_bytes(NewFile::new(channel("c"), "a"), b"abc")
                .await
                .unwrap()
                .record
                .file_ref
        };
        std::fs::write(dir.0.join(format!("{file_ref}.bin")), b"abcd").unwrap();
        let (_, store) = backend_with(&dir, &clock).await;
        assert!(store.get(&file_ref).await.unwrap().is_none());
        assert!(dir_names(&dir).is_empty(), "{:?}", dir_names(&dir));
    }
}
