//! The runtime's storage on PostgreSQL (cargo feature `postgres`): every durable fact the
//! SQLite storage keeps, in the `server_*` tables of a shared database, with the same group
//! commit promise (a ticket resolves only after the `COMMIT` of the transaction holding its
//! writes).
//!
//! [`PostgresStorage::connect`] opens a bounded pool (through `xagent-storage-postgres`),
//! applies the schema migrations of the component `server-runtime` (refusing a database whose
//! schema is newer than this binary knows) and starts the writer task. Reads take a pooled
//! connection each; every write goes through the writer, except the maintenance prune of old
//! tool calls (one statement of its own, as on SQLite).

mod cluster;
mod rows;
mod schema;
mod storage;
mod writer;

use std::sync::Arc;

use deadpool_postgres::Object;
use tokio_postgres::Row;
use xagent_profile_im::{CompletedRecord, Fingerprint, PendingRecord};
use xagent_protocol_types::{ConnectorChannelId, ConnectorId, MessageId};
use xagent_storage_postgres::{DatabaseUrl, Pool, PoolOptions};

use rows::{
    CHANNEL_COLUMNS, LOAD_CHANNELS, LOAD_PENDING, PENDING_COLUMNS, channel_of, get, pending_of,
    text_of,
};
use schema::COMPONENT;

use super::group::{CommitTicket, GroupCommitConfig, GroupCommitStats};
use super::write_op::{
    CONNECTOR_ID_KEY, ToolCallRow, author_record, prefix_upper_bound, to_i64, to_u64,
};
use super::{ChannelRecord, Storage, StorageError, ToolCallRecord, WriteOp};

/// How the PostgreSQL storage connects and commits.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// Pool size and timeouts (`xagent-storage-postgres`).
    pub pool: PoolOptions,
    /// Batching bounds of the group-commit writer (the same as SQLite's).
    pub group_commit: GroupCommitConfig,
}

impl PostgresOptions {
    /// Sets the pool options.
    #[must_use]
    pub fn with_pool(mut self, pool: PoolOptions) -> Self {
        self.pool = pool;
        self
    }

    /// Sets the group-commit bounds.
    #[must_use]
    pub fn with_group_commit(mut self, group_commit: GroupCommitConfig) -> Self {
        self.group_commit = group_commit;
        self
    }
}

/// The runtime's storage on PostgreSQL. Clones share the pool and the writer; the writer
/// commits what is queued and stops when the last clone is dropped.
#[derive(Clone)]
pub struct PostgresStorage {
    pool: Pool,
    writer: Arc<writer::Writer>,
    url: DatabaseUrl,
    /// Leases and wake-ups of the replicas sharing the database (its listener runs while a
    /// clone lives).
    cluster: Arc<cluster::PgCluster>,
}

impl std::fmt::Debug for PostgresStorage {
    /// Shows the database URL with its password redacted.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStorage").field("url", &self.url).finish_non_exhaustive()
    }
}

impl PostgresStorage {
    /// Connects to `url`, applies the runtime's schema migrations and starts the group-commit
    /// writer (call it inside a tokio runtime). Fails with a clear error, never showing the
    /// password, when the server cannot be reached or its schema is newer than this binary's.
    pub async fn connect(
        url: &DatabaseUrl,
        options: PostgresOptions,
    ) -> Result<Self, StorageError> {
        let pool = xagent_storage_postgres::connect(url, options.pool.clone())
            .await
            .map_err(|e| StorageError::new("connect to PostgreSQL", e))?;
        xagent_storage_postgres::migrate(&pool, COMPONENT, schema::MIGRATIONS)
            .await
            .map_err(|e| StorageError::new("migrate the PostgreSQL schema", e))?;
        let writer = writer::Writer::start(pool.clone(), options.group_commit);
        let cluster = Arc::new(cluster::PgCluster::start(pool.clone(), url.clone(), options.pool)?);
        Ok(Self { pool, writer: Arc::new(writer), url: url.clone(), cluster })
    }

    /// The database URL (its Display and Debug redact the password).
    pub fn url(&self) -> &DatabaseUrl {
        &self.url
    }

    /// Counters of the group-commit writer (transactions, submissions, writes).
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        self.writer.stats()
    }

    /// Queues writes for the group-commit writer: applied in submission order, all or none,
    /// in one transaction with other callers' writes; the ticket resolves after `COMMIT`.
    pub fn commit(&self, writes: Vec<WriteOp>) -> CommitTicket {
        self.writer.submit(writes)
    }

    /// A driver error met during `operation`, scrubbed of the URL's secrets.
    fn error(&self, operation: &'static str, e: &tokio_postgres::Error) -> StorageError {
        StorageError::new(operation, self.pool.error(operation, e))
    }

    async fn client(&self, operation: &'static str) -> Result<Object, StorageError> {
        self.pool.get().await.map_err(|e| StorageError::new(operation, e))
    }

    /// One row of `sql` with `params`, if any.
    async fn query_opt(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<Row>, StorageError> {
        let client = self.client(operation).await?;
        let statement = client.prepare_cached(sql).await.map_err(|e| self.error(operation, &e))?;
        client.query_opt(&statement, params).await.map_err(|e| self.error(operation, &e))
    }

    /// Every row of `sql` with `params`.
    async fn query(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, StorageError> {
        let client = self.client(operation).await?;
        let statement = client.prepare_cached(sql).await.map_err(|e| self.error(operation, &e))?;
        client.query(&statement, params).await.map_err(|e| self.error(operation, &e))
    }

    /// Whether the database holds any of the runtime's state (a meta value, a channel, a tool
    /// call, an outbox or idempotency record, an author record): `migrate-state` moves a state
    /// only into a database that holds none.
    pub async fn holds_state(&self) -> Result<bool, StorageError> {
        const OP: &str = "look for stored state";
        let row = self
            .query_opt(
                OP,
                "SELECT EXISTS (SELECT 1 FROM server_meta) OR EXISTS (SELECT 1 FROM server_channels)
                   OR EXISTS (SELECT 1 FROM server_tool_calls)
                   OR EXISTS (SELECT 1 FROM server_im_pending)
                   OR EXISTS (SELECT 1 FROM server_im_completed)
                   OR EXISTS (SELECT 1 FROM server_author_records)",
                &[],
            )
            .await?;
        match row {
            Some(row) => get(&row, 0, OP),
            None => Ok(false),
        }
    }

    /// The registered `connector_id`, if any.
    pub async fn load_connector_id(&self) -> Result<Option<ConnectorId>, StorageError> {
        Ok(self.load_meta(CONNECTOR_ID_KEY).await?.map(ConnectorId::new))
    }

    /// Every stored channel, oldest first.
    pub async fn load_channels(&self) -> Result<Vec<ChannelRecord>, StorageError> {
        let sql = format!("{CHANNEL_COLUMNS} ORDER BY created_at, id");
        let rows = self.query(LOAD_CHANNELS, &sql, &[]).await?;
        rows.iter().map(channel_of).collect()
    }

    /// One stored channel by id.
    pub async fn load_channel(
        &self,
        id: &ConnectorChannelId,
    ) -> Result<Option<ChannelRecord>, StorageError> {
        let sql = format!("{CHANNEL_COLUMNS} WHERE id = $1");
        let row = self.query_opt(LOAD_CHANNELS, &sql, &[&id.as_str()]).await?;
        row.as_ref().map(channel_of).transpose()
    }

    /// A stored tool call by `(channel, key)`.
    pub async fn load_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
    ) -> Result<Option<ToolCallRecord>, StorageError> {
        const OP: &str = "load tool call";
        let row = self
            .query_opt(
                OP,
                "SELECT fingerprint, result, error_code, error_message, completed_at
                 FROM server_tool_calls WHERE channel = $1 AND key = $2",
                &[&channel.as_str(), &key],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let message: Option<Vec<u8>> = get(&row, 3, OP)?;
        ToolCallRow {
            fingerprint: get(&row, 0, OP)?,
            result: get(&row, 1, OP)?,
            error_code: get(&row, 2, OP)?,
            error_message: message.map(text_of),
            completed_at: get(&row, 4, OP)?,
        }
        .decode()
        .map(Some)
    }

    /// Deletes tool calls completed before `before` (Unix ms) in a transaction of its own
    /// (as the SQLite storage does); returns how many.
    pub async fn prune_tool_calls(&self, before: u64) -> Result<usize, StorageError> {
        const OP: &str = "prune tool calls";
        let client = self.client(OP).await?;
        let statement = client
            .prepare_cached("DELETE FROM server_tool_calls WHERE completed_at < $1")
            .await
            .map_err(|e| self.error(OP, &e))?;
        let deleted =
            client.execute(&statement, &[&to_i64(before)]).await.map_err(|e| self.error(OP, &e))?;
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    /// The author record `(namespace, key)`'s value, if stored.
    pub async fn author_get(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        const OP: &str = "read an author record";
        let row = self
            .query_opt(
                OP,
                "SELECT value FROM server_author_records WHERE namespace = $1 AND key = $2",
                &[&namespace, &key.as_bytes()],
            )
            .await?;
        row.map(|row| get(&row, 0, OP)).transpose()
    }

    /// Several author records of one namespace in one query, in the order of `keys`.
    pub async fn author_get_many(
        &self,
        namespace: &str,
        keys: &[String],
    ) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        const OP: &str = "read author records";
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        let rows = self
            .query(
                OP,
                "SELECT key, value FROM server_author_records WHERE namespace = $1
                 AND key = ANY($2)",
                &[&namespace, &wanted],
            )
            .await?;
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let key: Vec<u8> = get(row, 0, OP)?;
            let value: Vec<u8> = get(row, 1, OP)?;
            found.insert(key, value);
        }
        Ok(keys.iter().map(|k| found.get(k.as_bytes()).cloned()).collect())
    }

    /// The author records `scan` selects (keys compared as bytes: `BYTEA`, as on SQLite).
    pub async fn author_scan(
        &self,
        namespace: &str,
        scan: &crate::AuthorScan,
    ) -> Result<Vec<crate::AuthorRecord>, StorageError> {
        const OP: &str = "scan author records";
        let upper = prefix_upper_bound(scan.prefix.as_bytes());
        let after = scan.after.as_deref().map(str::as_bytes);
        let limit = i64::try_from(scan.limit).unwrap_or(i64::MAX);
        let sql = if scan.reverse {
            "SELECT key, value FROM server_author_records WHERE namespace = $1 AND key >= $2
               AND ($3::BYTEA IS NULL OR key < $3) AND ($4::BYTEA IS NULL OR key < $4)
             ORDER BY key DESC LIMIT $5"
        } else {
            "SELECT key, value FROM server_author_records WHERE namespace = $1 AND key >= $2
               AND ($3::BYTEA IS NULL OR key < $3) AND ($4::BYTEA IS NULL OR key > $4)
             ORDER BY key ASC LIMIT $5"
        };
        let rows = self
            .query(OP, sql, &[&namespace, &scan.prefix.as_bytes(), &upper, &after, &limit])
            .await?;
        rows.iter().map(|row| author_record(get(row, 0, OP)?, get(row, 1, OP)?)).collect()
    }

    /// How many author records of `namespace` have a key starting with `prefix`.
    pub async fn author_count(&self, namespace: &str, prefix: &str) -> Result<u64, StorageError> {
        const OP: &str = "count author records";
        let upper = prefix_upper_bound(prefix.as_bytes());
        let row = self
            .query_opt(
                OP,
                "SELECT COUNT(*) FROM server_author_records WHERE namespace = $1 AND key >= $2
                   AND ($3::BYTEA IS NULL OR key < $3)",
                &[&namespace, &prefix.as_bytes(), &upper],
            )
            .await?;
        let count: i64 = row.map(|row| get(&row, 0, OP)).transpose()?.unwrap_or(0);
        Ok(to_u64(count))
    }

    /// A small runtime value by key (e.g. the URL signing secret).
    pub async fn load_meta(&self, key: &str) -> Result<Option<String>, StorageError> {
        const OP: &str = "load meta";
        let row =
            self.query_opt(OP, "SELECT value FROM server_meta WHERE key = $1", &[&key]).await?;
        row.map(|row| get(&row, 0, OP)).transpose()
    }

    /// Every pending outbox message, in `seq` order.
    pub async fn load_pending(&self) -> Result<Vec<PendingRecord>, StorageError> {
        let sql = format!("{PENDING_COLUMNS} ORDER BY seq");
        let rows = self.query(LOAD_PENDING, &sql, &[]).await?;
        rows.iter().map(pending_of).collect()
    }

    /// The pending outbox messages of one channel, in `seq` order (the primary key's prefix).
    pub async fn load_pending_of(
        &self,
        channel: &ConnectorChannelId,
    ) -> Result<Vec<PendingRecord>, StorageError> {
        let sql = format!("{PENDING_COLUMNS} WHERE channel = $1 ORDER BY seq");
        let rows = self.query(LOAD_PENDING, &sql, &[&channel.as_str()]).await?;
        rows.iter().map(pending_of).collect()
    }

    /// The pending records of one channel among `ids` (point reads on the primary key).
    pub async fn load_pending_ids(
        &self,
        channel: &ConnectorChannelId,
        ids: &[MessageId],
    ) -> Result<Vec<PendingRecord>, StorageError> {
        let ids: Vec<&str> = ids.iter().map(MessageId::as_str).collect();
        let sql =
            format!("{PENDING_COLUMNS} WHERE channel = $1 AND message_id = ANY($2) ORDER BY seq");
        let rows = self.query(LOAD_PENDING, &sql, &[&channel.as_str(), &ids]).await?;
        rows.iter().map(pending_of).collect()
    }

    /// One receiver idempotency record by its key (a point read on the primary key).
    pub async fn lookup_completed(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StorageError> {
        const OP: &str = "look up a completed message";
        let row = self
            .query_opt(
                OP,
                "SELECT fingerprint, completed_at FROM server_im_completed
                 WHERE channel = $1 AND message_id = $2",
                &[&channel.as_str(), &message_id.as_str()],
            )
            .await?;
        row.map(|row| {
            Ok(CompletedRecord {
                channel: channel.clone(),
                message_id: message_id.clone(),
                fingerprint: Fingerprint::from_hex(get::<String>(&row, 0, OP)?),
                completed_at: to_u64(get(&row, 1, OP)?),
            })
        })
        .transpose()
    }

    /// Every receiver idempotency record, in any order.
    pub async fn load_completed(&self) -> Result<Vec<CompletedRecord>, StorageError> {
        const OP: &str = "load completed messages";
        let rows = self
            .query(
                OP,
                "SELECT channel, message_id, fingerprint, completed_at FROM server_im_completed",
                &[],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(CompletedRecord {
                    channel: ConnectorChannelId::new(get::<String>(row, 0, OP)?),
                    message_id: MessageId::new(get::<String>(row, 1, OP)?),
                    fingerprint: Fingerprint::from_hex(get::<String>(row, 2, OP)?),
                    completed_at: to_u64(get(row, 3, OP)?),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
