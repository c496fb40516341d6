//! The PostgreSQL inbox: the same records as the SQLite inbox in tables of the runtime's
//! database (prefix `xagent_mcp_`, component [`POSTGRES_COMPONENT`]), every row under a scope
//! (the Connector Card id, as the runtime's own tables), and each file's bytes in a `bytea`
//! column, so the bridges of one Card share one inbox and no disk.
//!
//! Across bridges: a store is `INSERT ... ON CONFLICT DO NOTHING` on `(scope, channel,
//! message_id)`, so two bridges storing one redelivered message at once land it once (the
//! second waits for the first's commit and finds the row); a take is one `UPDATE` whose
//! subquery picks the oldest row not taken `FOR UPDATE SKIP LOCKED`, so two takers never get
//! the same message and neither waits for the other.

use xagent_storage_postgres::deadpool_postgres::Object;
use xagent_storage_postgres::tokio_postgres::Row;
use xagent_storage_postgres::tokio_postgres::types::ToSql;
use xagent_storage_postgres::{Migration, PgError, Pool, migrate};

use super::{
    InboxError, NewMessage, Stored, StoredFile, StoredMessage, decode_files, encode_files,
    limit_i64, to_i64, to_u64,
};

/// The component name of the inbox's schema in `xagent_schema`.
pub const POSTGRES_COMPONENT: &str = "mcp-inbox";

/// The schema, one migration per version (never edited once released).
const MIGRATIONS: &[Migration] = &[Migration::new(
    1,
    "CREATE TABLE xagent_mcp_messages (
       scope TEXT NOT NULL, channel TEXT NOT NULL, message_id TEXT NOT NULL,
       seq BIGINT GENERATED ALWAYS AS IDENTITY,
       text TEXT, files TEXT NOT NULL, created_at BIGINT, received_at BIGINT NOT NULL,
       taken BOOLEAN NOT NULL DEFAULT FALSE,
       PRIMARY KEY (scope, channel, message_id));
     CREATE UNIQUE INDEX xagent_mcp_messages_seq ON xagent_mcp_messages (scope, seq);
     CREATE INDEX xagent_mcp_messages_pending ON xagent_mcp_messages (scope, seq)
       WHERE NOT taken;
     CREATE TABLE xagent_mcp_files (
       scope TEXT NOT NULL, id TEXT NOT NULL, channel TEXT NOT NULL, message_id TEXT NOT NULL,
       filename TEXT NOT NULL, mime_type TEXT NOT NULL, byte_size BIGINT NOT NULL,
       PRIMARY KEY (scope, id));
     CREATE INDEX xagent_mcp_files_message ON xagent_mcp_files (scope, channel, message_id);
     CREATE TABLE xagent_mcp_file_bytes (
       scope TEXT NOT NULL, id TEXT NOT NULL, bytes BYTEA NOT NULL, saved_at BIGINT NOT NULL,
       PRIMARY KEY (scope, id));",
)];

const MESSAGE_COLUMNS: &str =
    "seq, channel, message_id, text, files, created_at, received_at, taken";

pub(super) struct PostgresInbox {
    pool: Pool,
    scope: String,
}

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

impl PostgresInbox {
    pub(super) async fn open(pool: Pool, scope: &str) -> Result<Self, InboxError> {
        migrate(&pool, POSTGRES_COMPONENT, MIGRATIONS).await?;
        Ok(Self { pool, scope: scope.to_owned() })
    }

    pub(super) fn scope(&self) -> &str {
        &self.scope
    }

    async fn client(&self) -> Result<Object, InboxError> {
        Ok(self.pool.get().await?)
    }

    fn failed(&self, context: &str, e: &xagent_storage_postgres::tokio_postgres::Error) -> PgError {
        self.pool.error(context, e)
    }

    async fn rows(
        &self,
        context: &str,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, InboxError> {
        let client = self.client().await?;
        Ok(client.query(sql, params).await.map_err(|e| self.failed(context, &e))?)
    }

    async fn execute(
        &self,
        context: &str,
        sql: &str,
        params: Params<'_>,
    ) -> Result<u64, InboxError> {
        let client = self.client().await?;
        Ok(client.execute(sql, params).await.map_err(|e| self.failed(context, &e))?)
    }

    pub(super) async fn save_file(
        &self,
        id: &str,
        bytes: Vec<u8>,
        now: u64,
    ) -> Result<(), InboxError> {
        self.execute(
            "save a file's bytes",
            "INSERT INTO xagent_mcp_file_bytes (scope, id, bytes, saved_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (scope, id) DO UPDATE
               SET bytes = excluded.bytes, saved_at = excluded.saved_at",
            &[&self.scope, &id, &bytes, &to_i64(now)],
        )
        .await?;
        Ok(())
    }

    pub(super) async fn saved_size(&self, id: &str) -> Result<Option<u64>, InboxError> {
        let rows = self
            .rows(
                "read a file's size",
                "SELECT octet_length(bytes)::BIGINT FROM xagent_mcp_file_bytes
                 WHERE scope = $1 AND id = $2",
                &[&self.scope, &id],
            )
            .await?;
        Ok(rows.first().map(|row| to_u64(row.get(0))))
    }

    pub(super) async fn read_file(&self, id: &str) -> Result<Option<Vec<u8>>, InboxError> {
        let rows = self
            .rows(
                "read a file's bytes",
                "SELECT bytes FROM xagent_mcp_file_bytes WHERE scope = $1 AND id = $2",
                &[&self.scope, &id],
            )
            .await?;
        Ok(rows.first().map(|row| row.get(0)))
    }

    pub(super) async fn store(&self, message: &NewMessage<'_>) -> Result<Stored, InboxError> {
        let context = "store an inbound message";
        let files = encode_files(message.files)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.failed(context, &e))?;
        let inserted = tx
            .query_opt(
                "INSERT INTO xagent_mcp_messages
                   (scope, channel, message_id, text, files, created_at, received_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (scope, channel, message_id) DO NOTHING RETURNING seq",
                &[
                    &self.scope,
                    &message.channel,
                    &message.message_id,
                    &message.text,
                    &files,
                    &message.created_at.map(to_i64),
                    &to_i64(message.received_at),
                ],
            )
            .await
            .map_err(|e| self.failed(context, &e))?;
        let Some(row) = inserted else {
            // Stored before (by this bridge or another, committed: the insert waited for it).
            let known = tx
                .query_one(
                    "SELECT seq FROM xagent_mcp_messages
                     WHERE scope = $1 AND channel = $2 AND message_id = $3",
                    &[&self.scope, &message.channel, &message.message_id],
                )
                .await
                .map_err(|e| self.failed(context, &e))?;
            return Ok(Stored::Known(known.get(0)));
        };
        let seq: i64 = row.get(0);
        for file in message.files {
            tx.execute(
                "INSERT INTO xagent_mcp_files
                   (scope, id, channel, message_id, filename, mime_type, byte_size)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (scope, id) DO UPDATE SET channel = excluded.channel,
                   message_id = excluded.message_id, filename = excluded.filename,
                   mime_type = excluded.mime_type, byte_size = excluded.byte_size",
                &[
                    &self.scope,
                    &file.id,
                    &message.channel,
                    &message.message_id,
                    &file.filename,
                    &file.mime_type,
                    &to_i64(file.byte_size),
                ],
            )
            .await
            .map_err(|e| self.failed(context, &e))?;
        }
        tx.commit().await.map_err(|e| self.failed(context, &e))?;
        Ok(Stored::New(seq))
    }

    pub(super) async fn contains(
        &self,
        channel: &str,
        message_id: &str,
    ) -> Result<bool, InboxError> {
        let rows = self
            .rows(
                "look up an inbound message",
                "SELECT 1 FROM xagent_mcp_messages
                 WHERE scope = $1 AND channel = $2 AND message_id = $3",
                &[&self.scope, &channel, &message_id],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    pub(super) async fn take_next(
        &self,
        channel: Option<&str>,
    ) -> Result<Option<StoredMessage>, InboxError> {
        let rows = self
            .rows(
                "take the next inbound message",
                &format!(
                    "UPDATE xagent_mcp_messages SET taken = TRUE
                     WHERE scope = $1 AND NOT taken AND seq = (
                       SELECT seq FROM xagent_mcp_messages
                       WHERE scope = $1 AND NOT taken AND ($2::TEXT IS NULL OR channel = $2)
                       ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED)
                     RETURNING {MESSAGE_COLUMNS}"
                ),
                &[&self.scope, &channel],
            )
            .await?;
        rows.first().map(message_of).transpose()
    }

    pub(super) async fn mark_taken(
        &self,
        channel: &str,
        message_id: &str,
    ) -> Result<(), InboxError> {
        self.execute(
            "mark a message handed",
            "UPDATE xagent_mcp_messages SET taken = TRUE
             WHERE scope = $1 AND channel = $2 AND message_id = $3",
            &[&self.scope, &channel, &message_id],
        )
        .await?;
        Ok(())
    }

    pub(super) async fn recent(
        &self,
        channel: &str,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, InboxError> {
        let rows = self
            .rows(
                "read a channel's messages",
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM xagent_mcp_messages
                     WHERE scope = $1 AND channel = $2 ORDER BY seq DESC LIMIT $3"
                ),
                &[&self.scope, &channel, &limit_i64(limit)],
            )
            .await?;
        let mut messages = rows.iter().map(message_of).collect::<Result<Vec<_>, _>>()?;
        messages.reverse();
        Ok(messages)
    }

    pub(super) async fn all(&self) -> Result<Vec<StoredMessage>, InboxError> {
        let rows = self
            .rows(
                "read every message",
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM xagent_mcp_messages
                     WHERE scope = $1 ORDER BY seq"
                ),
                &[&self.scope],
            )
            .await?;
        rows.iter().map(message_of).collect()
    }

    /// One transaction: the file bytes and records of the messages pruned, the messages, and
    /// bytes saved before `cutoff` that no record names (a message refused after its files
    /// were saved).
    pub(super) async fn prune_taken(&self, cutoff: u64) -> Result<usize, InboxError> {
        let context = "prune handed messages";
        let cutoff = to_i64(cutoff);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.failed(context, &e))?;
        let params: Params<'_> = &[&self.scope, &cutoff];
        tx.execute(
            "DELETE FROM xagent_mcp_file_bytes b USING xagent_mcp_files f, xagent_mcp_messages m
             WHERE b.scope = $1 AND f.scope = $1 AND m.scope = $1 AND b.id = f.id
               AND m.channel = f.channel AND m.message_id = f.message_id
               AND m.taken AND m.received_at < $2",
            params,
        )
        .await
        .map_err(|e| self.failed(context, &e))?;
        tx.execute(
            "DELETE FROM xagent_mcp_files f USING xagent_mcp_messages m
             WHERE f.scope = $1 AND m.scope = $1
               AND m.channel = f.channel AND m.message_id = f.message_id
               AND m.taken AND m.received_at < $2",
            params,
        )
        .await
        .map_err(|e| self.failed(context, &e))?;
        let pruned = tx
            .execute(
                "DELETE FROM xagent_mcp_messages WHERE scope = $1 AND taken AND received_at < $2",
                params,
            )
            .await
            .map_err(|e| self.failed(context, &e))?;
        tx.execute(
            "DELETE FROM xagent_mcp_file_bytes b WHERE b.scope = $1 AND b.saved_at < $2
               AND NOT EXISTS (SELECT 1 FROM xagent_mcp_files f WHERE f.scope = $1 AND f.id = b.id)",
            params,
        )
        .await
        .map_err(|e| self.failed(context, &e))?;
        tx.commit().await.map_err(|e| self.failed(context, &e))?;
        Ok(usize::try_from(pruned).unwrap_or(usize::MAX))
    }

    pub(super) async fn pending(&self, channel: Option<&str>) -> Result<u64, InboxError> {
        let rows = self
            .rows(
                "count pending messages",
                "SELECT COUNT(*) FROM xagent_mcp_messages
                 WHERE scope = $1 AND NOT taken AND ($2::TEXT IS NULL OR channel = $2)",
                &[&self.scope, &channel],
            )
            .await?;
        Ok(rows.first().map_or(0, |row| to_u64(row.get(0))))
    }

    pub(super) async fn count(&self) -> Result<u64, InboxError> {
        let rows = self
            .rows(
                "count messages",
                "SELECT COUNT(*) FROM xagent_mcp_messages WHERE scope = $1",
                &[&self.scope],
            )
            .await?;
        Ok(rows.first().map_or(0, |row| to_u64(row.get(0))))
    }

    pub(super) async fn file(&self, id: &str) -> Result<Option<StoredFile>, InboxError> {
        let rows = self
            .rows(
                "read a file's record",
                "SELECT id, filename, mime_type, byte_size FROM xagent_mcp_files
                 WHERE scope = $1 AND id = $2",
                &[&self.scope, &id],
            )
            .await?;
        Ok(rows.first().map(file_of))
    }

    pub(super) async fn files(&self, limit: usize) -> Result<Vec<StoredFile>, InboxError> {
        let rows = self
            .rows(
                "list files",
                "SELECT f.id, f.filename, f.mime_type, f.byte_size FROM xagent_mcp_files f
                 JOIN xagent_mcp_messages m ON m.scope = f.scope AND m.channel = f.channel
                   AND m.message_id = f.message_id
                 WHERE f.scope = $1 ORDER BY m.seq DESC LIMIT $2",
                &[&self.scope, &limit_i64(limit)],
            )
            .await?;
        Ok(rows.iter().map(file_of).collect())
    }
}

fn message_of(row: &Row) -> Result<StoredMessage, InboxError> {
    let files: String = row.try_get(4).map_err(|e| InboxError::Corrupt(e.to_string()))?;
    Ok(StoredMessage {
        seq: row.get(0),
        channel: row.get(1),
        message_id: row.get(2),
        text: row.get(3),
        files: decode_files(&files)?,
        created_at: row.get::<_, Option<i64>>(5).map(to_u64),
        received_at: to_u64(row.get(6)),
        taken: row.get(7),
    })
}

fn file_of(row: &Row) -> StoredFile {
    StoredFile {
        id: row.get(0),
        filename: row.get(1),
        mime_type: row.get(2),
        byte_size: to_u64(row.get(3)),
    }
}
