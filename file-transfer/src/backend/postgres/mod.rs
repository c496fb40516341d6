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

use xagent_protocol_types::{ConnectorChannelId, FileRef};
use xagent_storage_postgres::{PgResultExt, Pool, migrate};

mod chunks;
mod db;

pub use db::COMPONENT;

use chunks::{PgUpload, ReadCursor};
use db::{CHUNK_BYTES, Inner, MIGRATIONS, millis, release, to_i64};

use super::{FileBackend, FileReader, UploadSink};
use crate::TransferError;
use crate::config::StoreConfig;
use crate::record::{CleanupReport, FileRecord, NOT_FOUND, StoreUsage};

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
        let (report, _) = backend.inner.reclaim(now).await?;
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
                return Ok(Box::new(PgUpload::new(self.inner.clone(), file_ref)));
            }
            drop(tx);
            if attempt == 0 && self.inner.reclaim(now).await? == (CleanupReport::default(), 0) {
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
        Ok(self.inner.reclaim(now).await?.0)
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
