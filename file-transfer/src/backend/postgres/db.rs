//! The backend's database: the schema, the shared handle ([`Inner`]) with the two deletes
//! that release capacity (expired files and idle uploads, one abandoned upload), and the
//! conversions to SQL integers.

use xagent_storage_postgres::tokio_postgres::Transaction;
use xagent_storage_postgres::{Migration, PgError, PgResultExt, Pool};

use crate::TransferError;
use crate::backend::Quota;
use crate::record::CleanupReport;

/// The schema component name of this backend in `xagent_schema`.
pub const COMPONENT: &str = "file-transfer";

/// Largest row of file bytes: a write or a read never holds more than this (plus one
/// incoming chunk) of a file in memory.
pub(crate) const CHUNK_BYTES: usize = 256 * 1024;

pub(super) const MIGRATIONS: &[Migration] = &[Migration::new(
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
pub(super) const RECLAIM: &str = "WITH doomed AS (
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

/// The database every handle of one backend shares, with its capacity and upload timeout.
pub(super) struct Inner {
    pub(super) pool: Pool,
    pub(super) quota: Quota,
    pub(super) idle_timeout_ms: u64,
}

impl Inner {
    /// Deletes expired finished files and idle uploads; reports the finished ones and counts
    /// the uploads.
    pub(super) async fn reclaim(&self, now: u64) -> Result<(CleanupReport, usize), TransferError> {
        let idle_since = now.saturating_sub(self.idle_timeout_ms);
        let client = self.pool.get().await?;
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
    pub(super) async fn discard(&self, file_ref: &str) -> Result<(), TransferError> {
        let mut client = self.pool.get().await?;
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
            release(&tx, 1, size).await?;
        }
        tx.commit().await.pg("commit discarding an upload")?;
        Ok(())
    }
}

/// Lowers the totals by `files` files of `bytes` bytes.
pub(super) async fn release(
    tx: &Transaction<'_>,
    files: i64,
    bytes: i64,
) -> Result<(), TransferError> {
    tx.execute(
        "UPDATE xagent_file_usage SET files = files - $1, bytes = bytes - $2 WHERE id",
        &[&files, &bytes],
    )
    .await
    .pg("release capacity")?;
    Ok(())
}

pub(super) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(super) fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl From<PgError> for TransferError {
    fn from(error: PgError) -> Self {
        Self::Database(error)
    }
}
