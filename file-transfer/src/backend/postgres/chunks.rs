//! The bytes of a file as chunk rows: an upload in progress ([`PgUpload`]) and a read
//! ([`ReadCursor`]), each holding a connection only for one statement or transaction.

use std::sync::Arc;

use bytes::Bytes;
use xagent_protocol_types::FileRef;
use xagent_storage_postgres::PgResultExt;
use xagent_storage_postgres::tokio_postgres::Transaction;

use super::db::{CHUNK_BYTES, Inner, to_i64};
use crate::TransferError;
use crate::backend::UploadSink;
use crate::record::{CleanupReport, FileRecord};

const ABANDONED: &str = "the upload was abandoned (idle past the upload idle timeout); retry it";

/// An upload in progress: the last, partial chunk waits in `buffer`.
pub(super) struct PgUpload {
    inner: Arc<Inner>,
    file_ref: String,
    buffer: Vec<u8>,
    next_seq: i32,
    done: bool,
}

impl PgUpload {
    /// An empty upload of `file_ref`, whose row was just inserted and counted.
    pub(super) fn new(inner: Arc<Inner>, file_ref: &FileRef) -> Self {
        Self {
            inner,
            file_ref: file_ref.as_str().to_owned(),
            buffer: Vec::with_capacity(CHUNK_BYTES),
            next_seq: 0,
            done: false,
        }
    }

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
        if self.inner.reclaim(now).await? != (CleanupReport::default(), 0)
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
        self.inner.discard(&self.file_ref).await?;
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
            if let Err(error) = inner.discard(&file_ref).await {
                tracing::warn!(%error, "could not delete an unfinished upload; cleanup will");
            }
        });
    }
}

/// Where a read is: the next chunk, bytes to skip in it, bytes still to send.
pub(super) struct ReadCursor {
    pub(super) inner: Arc<Inner>,
    pub(super) file_ref: String,
    pub(super) seq: u64,
    pub(super) skip: u64,
    pub(super) left: u64,
}

impl ReadCursor {
    /// The next piece of the file, one chunk row per query (no connection is held between).
    pub(super) async fn next(mut self) -> Result<Option<(Bytes, Self)>, std::io::Error> {
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
