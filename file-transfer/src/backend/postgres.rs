//! The PostgreSQL backend: records in `xagent_files`, bytes in `xagent_file_chunks` (rows of
//! at most [`CHUNK_BYTES`]), the capacity totals in the one row of `xagent_file_usage`, so
//! every replica sharing the database sees every file and the quotas hold across them.
//!
//! - An upload is a row with `complete = FALSE`; each write is one transaction that grows the
//!   row's `byte_size`, appends full chunks and raises the cluster totals only if they stay
//!   within the quota (the usage row is locked last, so it is held for a moment only).
//! - `finish` writes the last chunk and sets `complete` with the record in one transaction:
//!   until it commits nobody sees the file.
//! - A dropped upload is deleted by a background task; an upload whose process died is
//!   deleted by cleanup once it has been idle for [`StoreConfig::upload_idle_timeout`].
//! - Multi-row deletes lock rows in `file_ref` order, so two replicas cleaning up at once
//!   cannot deadlock.

use std::sync::Arc;

use bytes::Bytes;
use xagent_protocol_types::{ConnectorChannelId, FileRef};
use xagent_storage_postgres::tokio_postgres::Transaction;
use xagent_storage_postgres::{Migration, PgError, PgResultExt, Pool, migrate};

use super::{FileBackend, FileReader, Quota, UploadSink};
use crate::TransferError;
use crate::store::{CleanupReport, FileRecord, NOT_FOUND, StoreConfig, StoreUsage};

/// The schema component name of this backend in `xagent_schema`.
pub const COMPONENT: &str = "file-transfer";

/// Largest row of file bytes: a write or a read never holds more than this (plus one
/// incoming chunk) of a file in memory.
pub(crate) const CHUNK_BYTES: usize = 256 * 1024;

const MIGRATIONS: &[Migration] = &[Migration::new(
    1,
    "CREATE TABLE xagent_files (
        file_ref TEXT PRIMARY KEY,
        connector_channel_id TEXT NOT NULL,
        complete BOOLEAN NOT NULL DEFAULT FALSE,
        doomed BOOLEAN NOT NULL DEFAULT FALSE,
        byte_size BIGINT NOT NULL DEFAULT 0 CHECK (byte_size >= 0),
        chunk_bytes INTEGER NOT NULL CHECK (chunk_bytes > 0),
        expires_at BIGINT,
        touched_at BIGINT NOT NULL,
        record TEXT
    );
    CREATE INDEX xagent_files_by_channel ON xagent_files (connector_channel_id);
    CREATE INDEX xagent_files_by_expiry ON xagent_files (expires_at) WHERE complete;
    CREATE INDEX xagent_files_idle_uploads ON xagent_files (touched_at) WHERE NOT complete;
    CREATE TABLE xagent_file_chunks (
        file_ref TEXT NOT NULL REFERENCES xagent_files (file_ref) ON DELETE CASCADE,
        seq INTEGER NOT NULL CHECK (seq >= 0),
        data BYTEA NOT NULL,
        PRIMARY KEY (file_ref, seq)
    );
    ALTER TABLE xagent_file_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
    CREATE TABLE xagent_file_usage (
        id BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
        files BIGINT NOT NULL,
        bytes BIGINT NOT NULL
    );
    INSERT INTO xagent_file_usage (id, files, bytes) VALUES (TRUE, 0, 0);
    CREATE TABLE xagent_file_settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );",
)];

/// Deletes (in `file_ref` order) every finished file expired at `$1` and every upload idle
/// since `$2`, lowers the totals, and returns what went: `(complete, byte_size)` per file.
const RECLAIM: &str = "WITH doomed AS (
        SELECT file_ref FROM xagent_files
        WHERE (complete AND expires_at <= $1) OR (NOT complete AND touched_at <= $2)
        ORDER BY file_ref FOR UPDATE
    ), gone AS (
        DELETE FROM xagent_files f USING doomed d WHERE f.file_ref = d.file_ref
        RETURNING f.complete, f.byte_size
    ), totals AS (
        UPDATE xagent_file_usage
        SET files = files - (SELECT count(*) FROM gone),
            bytes = bytes - (SELECT coalesce(sum(byte_size), 0) FROM gone)
        WHERE id AND EXISTS (SELECT 1 FROM gone)
    )
    SELECT complete, byte_size FROM gone";

struct Inner {
    pool: Pool,
    quota: Quota,
    idle_timeout_ms: u64,
}

/// Files in a PostgreSQL database shared by every replica of a Connector. Cheap to clone.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("database", &self.inner.pool.url())
            .field("quota", &self.inner.quota)
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// Applies the `file-transfer` schema migrations (refusing a newer schema) and deletes
    /// files expired at `now` and uploads abandoned by a dead process. Capacity is `config`'s.
    pub async fn open(pool: Pool, config: &StoreConfig, now: u64) -> Result<Self, TransferError> {
        migrate(&pool, COMPONENT, MIGRATIONS).await?;
        let backend = Self {
            inner: Arc::new(Inner {
                pool,
                quota: config.quota(),
                idle_timeout_ms: millis(config.upload_idle_timeout),
            }),
        };
        let (report, _) = backend.reclaim(now).await?;
        tracing::debug!(
            expired = report.files,
            bytes = report.bytes,
            database = %backend.inner.pool.url(),
            "file store opened on PostgreSQL"
        );
        Ok(backend)
    }

    /// The URL signing secret every replica shares: `candidate` if none is stored yet, else
    /// the stored one (replicas starting at once agree on the first that was stored).
    pub async fn signing_secret(&self, candidate: &str) -> Result<String, TransferError> {
        let client = self.inner.pool.get().await?;
        client
            .execute(
                "INSERT INTO xagent_file_settings (key, value) VALUES ('url_signing_secret', $1)
                 ON CONFLICT (key) DO NOTHING",
                &[&candidate],
            )
            .await
            .pg("store the URL signing secret")?;
        let row = client
            .query_one(
                "SELECT value FROM xagent_file_settings WHERE key = 'url_signing_secret'",
                &[],
            )
            .await
            .pg("read the URL signing secret")?;
        Ok(row.try_get(0).pg("read the URL signing secret")?)
    }

    /// Deletes expired finished files and idle uploads; reports the finished ones and counts
    /// the uploads.
    async fn reclaim(&self, now: u64) -> Result<(CleanupReport, usize), TransferError> {
        let idle_since = now.saturating_sub(self.inner.idle_timeout_ms);
        let client = self.inner.pool.get().await?;
        let rows = client
            .query(RECLAIM, &[&to_i64(now), &to_i64(idle_since)])
            .await
            .pg("delete expired files")?;
        let mut report = CleanupReport::default();
        let mut abandoned = 0usize;
        for row in rows {
            let complete: bool = row.try_get(0).pg("read a deleted file")?;
            let size: i64 = row.try_get(1).pg("read a deleted file")?;
            if complete {
                report.files += 1;
                report.bytes += u64::try_from(size).unwrap_or(0);
            } else {
                abandoned += 1;
            }
        }
        if abandoned > 0 {
            tracing::info!(uploads = abandoned, "abandoned uploads deleted");
        }
        Ok((report, abandoned))
    }

    /// Deletes an unfinished upload and returns its share of the totals.
    async fn discard(inner: &Inner, file_ref: &str) -> Result<(), TransferError> {
        let mut client = inner.pool.get().await?;
        let tx = client.transaction().await.pg("begin discarding an upload")?;
        let row = tx
            .query_opt(
                "DELETE FROM xagent_files WHERE file_ref = $1 AND NOT complete RETURNING byte_size",
                &[&file_ref],
            )
            .await
            .pg("discard an upload")?;
        if let Some(row) = row {
            let size: i64 = row.try_get(0).pg("discard an upload")?;
            tx.execute(
                "UPDATE xagent_file_usage SET files = files - 1, bytes = bytes - $1 WHERE id",
                &[&size],
            )
            .await
            .pg("release an upload's capacity")?;
        }
        tx.commit().await.pg("commit discarding an upload")?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl FileBackend for PostgresBackend {
    fn describe(&self) -> String {
        format!("PostgreSQL {}", self.inner.pool.url())
    }

    async fn begin(
        &self,
        file_ref: &FileRef,
        channel: &ConnectorChannelId,
        now: u64,
    ) -> Result<Box<dyn UploadSink>, TransferError> {
        let max_files = i64::try_from(self.inner.quota.max_files).unwrap_or(i64::MAX);
        let chunk_bytes = CHUNK_BYTES as i32;
        for attempt in 0..2 {
            let mut client = self.inner.pool.get().await?;
            let tx = client.transaction().await.pg("begin an upload")?;
            tx.execute(
                "INSERT INTO xagent_files (file_ref, connector_channel_id, chunk_bytes, touched_at)
                 VALUES ($1, $2, $3, $4)",
                &[&file_ref.as_str(), &channel.as_str(), &chunk_bytes, &to_i64(now)],
            )
            .await
            .pg("record an upload")?;
            let admitted = tx
                .query_opt(
                    "UPDATE xagent_file_usage SET files = files + 1
                     WHERE id AND files + 1 <= $1 RETURNING files",
                    &[&max_files],
                )
                .await
                .pg("count an upload")?
                .is_some();
            if admitted {
                tx.commit().await.pg("commit an upload's start")?;
                return Ok(Box::new(PgUpload {
                    inner: self.inner.clone(),
                    file_ref: file_ref.as_str().to_owned(),
                    buffer: Vec::with_capacity(CHUNK_BYTES),
                    next_seq: 0,
                    done: false,
                }));
            }
            drop(tx);
            if attempt == 0 && self.reclaim(now).await? == (CleanupReport::default(), 0) {
                break;
            }
        }
        Err(TransferError::CapacityExceeded)
    }

    async fn get(&self, file_ref: &FileRef, now: u64) -> Result<Option<FileRecord>, TransferError> {
        let client = self.inner.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT record FROM xagent_files
                 WHERE file_ref = $1 AND complete AND expires_at > $2",
                &[&file_ref.as_str(), &to_i64(now)],
            )
            .await
            .pg("look up a file")?;
        let Some(row) = row else { return Ok(None) };
        let text: Option<String> = row.try_get(0).pg("read a file record")?;
        Ok(text.as_deref().and_then(|text| parse_record(file_ref, text)))
    }

    async fn read(
        &self,
        record: &FileRecord,
        start: u64,
        len: u64,
    ) -> Result<FileReader, TransferError> {
        let client = self.inner.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT chunk_bytes FROM xagent_files WHERE file_ref = $1 AND complete",
                &[&record.file_ref.as_str()],
            )
            .await
            .pg("open a file")?;
        drop(client);
        let Some(row) = row else { return Err(NOT_FOUND) };
        let chunk_bytes: i32 = row.try_get(0).pg("open a file")?;
        let chunk_bytes = u64::try_from(chunk_bytes).unwrap_or(0).max(1);
        let cursor = ReadCursor {
            inner: self.inner.clone(),
            file_ref: record.file_ref.as_str().to_owned(),
            seq: start / chunk_bytes,
            skip: start % chunk_bytes,
            left: len,
        };
        let stream = futures_util::stream::try_unfold(cursor, ReadCursor::next);
        Ok(FileReader::new(tokio_util::io::StreamReader::new(stream)))
    }

    async fn remove(&self, file_ref: &FileRef) -> Result<Option<FileRecord>, TransferError> {
        let mut client = self.inner.pool.get().await?;
        let tx = client.transaction().await.pg("begin removing a file")?;
        let row = tx
            .query_opt(
                "DELETE FROM xagent_files WHERE file_ref = $1 AND complete
                 RETURNING byte_size, record",
                &[&file_ref.as_str()],
            )
            .await
            .pg("remove a file")?;
        let Some(row) = row else { return Ok(None) };
        let size: i64 = row.try_get(0).pg("remove a file")?;
        let text: Option<String> = row.try_get(1).pg("remove a file")?;
        release(&tx, 1, size).await?;
        tx.commit().await.pg("commit removing a file")?;
        Ok(text.as_deref().and_then(|text| parse_record(file_ref, text)))
    }

    async fn remove_channel(&self, channel: &ConnectorChannelId) -> Result<usize, TransferError> {
        let mut client = self.inner.pool.get().await?;
        let tx = client.transaction().await.pg("begin removing a channel's files")?;
        // Uploads under way are refused when they finish (whichever replica runs them).
        tx.execute(
            "UPDATE xagent_files SET doomed = TRUE
             WHERE connector_channel_id = $1 AND NOT complete",
            &[&channel.as_str()],
        )
        .await
        .pg("refuse a channel's uploads")?;
        let row = tx
            .query_one(
                "WITH doomed AS (
                    SELECT file_ref FROM xagent_files
                    WHERE connector_channel_id = $1 AND complete
                    ORDER BY file_ref FOR UPDATE
                 ), gone AS (
                    DELETE FROM xagent_files f USING doomed d WHERE f.file_ref = d.file_ref
                    RETURNING f.byte_size
                 )
                 SELECT count(*), coalesce(sum(byte_size), 0)::BIGINT FROM gone",
                &[&channel.as_str()],
            )
            .await
            .pg("remove a channel's files")?;
        let count: i64 = row.try_get(0).pg("remove a channel's files")?;
        let bytes: i64 = row.try_get(1).pg("remove a channel's files")?;
        if count > 0 {
            release(&tx, count, bytes).await?;
        }
        tx.commit().await.pg("commit removing a channel's files")?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    async fn cleanup(&self, now: u64) -> Result<CleanupReport, TransferError> {
        Ok(self.reclaim(now).await?.0)
    }

    async fn list(&self, now: u64) -> Result<Vec<FileRecord>, TransferError> {
        let client = self.inner.pool.get().await?;
        let rows = client
            .query(
                "SELECT file_ref, record FROM xagent_files
                 WHERE complete AND expires_at > $1 ORDER BY file_ref",
                &[&to_i64(now)],
            )
            .await
            .pg("list the files")?;
        let mut records = Vec::with_capacity(rows.len());
        for row in rows {
            let file_ref: String = row.try_get(0).pg("list the files")?;
            let text: Option<String> = row.try_get(1).pg("list the files")?;
            if let Some(record) =
                text.as_deref().and_then(|t| parse_record(&FileRef::new(file_ref), t))
            {
                records.push(record);
            }
        }
        Ok(records)
    }

    async fn usage(&self) -> Result<StoreUsage, TransferError> {
        let client = self.inner.pool.get().await?;
        let rows = client
            .query(
                "SELECT complete, count(*), coalesce(sum(byte_size), 0)::BIGINT
                 FROM xagent_files GROUP BY complete",
                &[],
            )
            .await
            .pg("read the file store's usage")?;
        let mut usage = StoreUsage::default();
        for row in rows {
            let complete: bool = row.try_get(0).pg("read the usage")?;
            let files =
                usize::try_from(row.try_get::<_, i64>(1).pg("read the usage")?).unwrap_or(0);
            let bytes = u64::try_from(row.try_get::<_, i64>(2).pg("read the usage")?).unwrap_or(0);
            if complete {
                (usage.files, usage.bytes) = (files, bytes);
            } else {
                (usage.pending_files, usage.pending_bytes) = (files, bytes);
            }
        }
        Ok(usage)
    }
}

/// Lowers the totals by `files` files of `bytes` bytes.
async fn release(tx: &Transaction<'_>, files: i64, bytes: i64) -> Result<(), TransferError> {
    tx.execute(
        "UPDATE xagent_file_usage SET files = files - $1, bytes = bytes - $2 WHERE id",
        &[&files, &bytes],
    )
    .await
    .pg("release capacity")?;
    Ok(())
}

/// A stored record; a row that cannot be read is logged and treated as absent.
fn parse_record(file_ref: &FileRef, text: &str) -> Option<FileRecord> {
    match serde_json::from_str::<FileRecord>(text) {
        Ok(record) if &record.file_ref == file_ref => Some(record),
        Ok(_) => {
            tracing::warn!(%file_ref, "a file row names another file; ignored");
            None
        }
        Err(error) => {
            tracing::warn!(%file_ref, %error, "a corrupt file record; ignored");
            None
        }
    }
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

const ABANDONED: &str = "the upload was abandoned (idle past the upload idle timeout); retry it";

/// An upload in progress: the last, partial chunk waits in `buffer`.
struct PgUpload {
    inner: Arc<Inner>,
    file_ref: String,
    buffer: Vec<u8>,
    next_seq: i32,
    done: bool,
}

impl PgUpload {
    /// Inserts `pieces` as the next chunks.
    async fn insert_chunks(
        &self,
        tx: &Transaction<'_>,
        pieces: &[&[u8]],
    ) -> Result<(), TransferError> {
        for (index, piece) in pieces.iter().enumerate() {
            let seq = self.next_seq + i32::try_from(index).unwrap_or(i32::MAX);
            tx.execute(
                "INSERT INTO xagent_file_chunks (file_ref, seq, data) VALUES ($1, $2, $3)",
                &[&self.file_ref, &seq, piece],
            )
            .await
            .pg("store file bytes")?;
        }
        Ok(())
    }

    /// One attempt at a write: true when committed, false when the totals would overflow.
    async fn try_write(&self, chunk: &[u8], now: u64) -> Result<bool, TransferError> {
        let len = i64::try_from(chunk.len()).unwrap_or(i64::MAX);
        let max_bytes = to_i64(self.inner.quota.max_total_bytes);
        // The full chunks this write completes; the rest waits in the buffer.
        let total = self.buffer.len() + chunk.len();
        let full = total / CHUNK_BYTES * CHUNK_BYTES;
        let joined: Vec<u8>;
        let flushed: &[u8] = if full == 0 {
            &[]
        } else if self.buffer.is_empty() {
            // Nothing waits: the chunk's own bytes are the rows (no copy of a large write).
            &chunk[..full]
        } else {
            let mut bytes = Vec::with_capacity(full);
            bytes.extend_from_slice(&self.buffer);
            bytes.extend_from_slice(&chunk[..full - self.buffer.len()]);
            joined = bytes;
            &joined
        };
        let pieces: Vec<&[u8]> = flushed.chunks(CHUNK_BYTES).collect();

        let mut client = self.inner.pool.get().await?;
        let tx = client.transaction().await.pg("begin a file write")?;
        let grown = tx
            .execute(
                "UPDATE xagent_files SET byte_size = byte_size + $2, touched_at = $3
                 WHERE file_ref = $1 AND NOT complete",
                &[&self.file_ref, &len, &to_i64(now)],
            )
            .await
            .pg("grow an upload")?;
        if grown == 0 {
            return Err(TransferError::Io(std::io::Error::other(ABANDONED)));
        }
        self.insert_chunks(&tx, &pieces).await?;
        let admitted = tx
            .query_opt(
                "UPDATE xagent_file_usage SET bytes = bytes + $1
                 WHERE id AND bytes + $1 <= $2 RETURNING bytes",
                &[&len, &max_bytes],
            )
            .await
            .pg("reserve file capacity")?
            .is_some();
        if !admitted {
            return Ok(false);
        }
        tx.commit().await.pg("commit a file write")?;
        Ok(true)
    }

    /// Moves the buffer past what [`PgUpload::try_write`] committed.
    fn advance(&mut self, chunk: &[u8]) {
        let total = self.buffer.len() + chunk.len();
        let full = total / CHUNK_BYTES * CHUNK_BYTES;
        if full == 0 {
            self.buffer.extend_from_slice(chunk);
            return;
        }
        let used = full - self.buffer.len();
        self.next_seq += i32::try_from(full / CHUNK_BYTES).unwrap_or(i32::MAX);
        self.buffer.clear();
        self.buffer.extend_from_slice(&chunk[used..]);
    }
}

#[async_trait::async_trait]
impl UploadSink for PgUpload {
    async fn write(&mut self, chunk: &[u8], now: u64) -> Result<(), TransferError> {
        if self.try_write(chunk, now).await? {
            self.advance(chunk);
            return Ok(());
        }
        let backend = PostgresBackend { inner: self.inner.clone() };
        if backend.reclaim(now).await? != (CleanupReport::default(), 0)
            && self.try_write(chunk, now).await?
        {
            self.advance(chunk);
            return Ok(());
        }
        Err(TransferError::CapacityExceeded)
    }

    async fn finish(mut self: Box<Self>, record: &FileRecord) -> Result<(), TransferError> {
        let text = serde_json::to_string(record).map_err(std::io::Error::other)?;
        let size = to_i64(record.byte_size);
        let last = std::mem::take(&mut self.buffer);
        let mut client = self.inner.pool.get().await?;
        let tx = client.transaction().await.pg("begin finishing a file")?;
        if !last.is_empty() {
            self.insert_chunks(&tx, &[last.as_slice()]).await?;
        }
        let finished = tx
            .execute(
                "UPDATE xagent_files
                 SET complete = TRUE, expires_at = $2, record = $3, touched_at = $4
                 WHERE file_ref = $1 AND NOT complete AND NOT doomed AND byte_size = $5",
                &[
                    &self.file_ref,
                    &to_i64(record.expires_at),
                    &text,
                    &to_i64(record.created_at),
                    &size,
                ],
            )
            .await
            .pg("finish a file")?;
        if finished == 1 {
            tx.commit().await.pg("commit a finished file")?;
            self.done = true;
            return Ok(());
        }
        let doomed = tx
            .query_opt("SELECT doomed FROM xagent_files WHERE file_ref = $1", &[&self.file_ref])
            .await
            .pg("check an upload")?
            .map(|row| row.try_get::<_, bool>(0))
            .transpose()
            .pg("check an upload")?;
        drop(tx);
        drop(client);
        PostgresBackend::discard(&self.inner, &self.file_ref).await?;
        self.done = true;
        match doomed {
            Some(true) => Err(TransferError::UnknownChannel),
            Some(false) => Err(TransferError::Io(std::io::Error::other(
                "the upload's size does not match what was written",
            ))),
            None => Err(TransferError::Io(std::io::Error::other(ABANDONED))),
        }
    }
}

impl Drop for PgUpload {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Drop cannot await: a task deletes the upload; without a runtime (or if the task
        // fails) cleanup deletes it once it has been idle for the upload idle timeout.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let inner = self.inner.clone();
        let file_ref = std::mem::take(&mut self.file_ref);
        runtime.spawn(async move {
            if let Err(error) = PostgresBackend::discard(&inner, &file_ref).await {
                tracing::warn!(%error, "could not delete an unfinished upload; cleanup will");
            }
        });
    }
}

/// Where a read is: the next chunk, bytes to skip in it, bytes still to send.
struct ReadCursor {
    inner: Arc<Inner>,
    file_ref: String,
    seq: u64,
    skip: u64,
    left: u64,
}

impl ReadCursor {
    /// The next piece of the file, one chunk row per query (no connection is held between).
    async fn next(mut self) -> Result<Option<(Bytes, Self)>, std::io::Error> {
        if self.left == 0 {
            return Ok(None);
        }
        let gone = || std::io::Error::other("the file was removed while it was being read");
        let seq = i32::try_from(self.seq).map_err(|_| gone())?;
        let client = self.inner.pool.get().await.map_err(std::io::Error::other)?;
        let row = client
            .query_opt(
                "SELECT data FROM xagent_file_chunks WHERE file_ref = $1 AND seq = $2",
                &[&self.file_ref, &seq],
            )
            .await
            .pg("read file bytes")
            .map_err(std::io::Error::other)?;
        drop(client);
        let data: Vec<u8> = row
            .ok_or_else(gone)?
            .try_get(0)
            .pg("read file bytes")
            .map_err(std::io::Error::other)?;
        let skip = usize::try_from(self.skip).unwrap_or(usize::MAX).min(data.len());
        let take = usize::try_from(self.left).unwrap_or(usize::MAX).min(data.len() - skip);
        if take == 0 {
            return Err(gone());
        }
        let piece = Bytes::from(data).slice(skip..skip + take);
        self.seq += 1;
        self.skip = 0;
        self.left -= take as u64;
        Ok(Some((piece, self)))
    }
}

impl From<PgError> for TransferError {
    fn from(error: PgError) -> Self {
        Self::Database(error)
    }
}
