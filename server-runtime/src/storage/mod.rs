//! Persistence behind one trait, with an embedded SQLite implementation (WAL, one file under a
//! state directory) as the default.
//!
//! What is stored: the registered `connector_id`; every channel with its owner, status,
//! binding (Descriptor target + private material) and Tool overrides; the IM outbox and the
//! receiver idempotency set (`profile-im`'s records, committed as [`WriteOp`]s); tool-call
//! idempotency; the Connector's own records (the author store, [`crate::AuthorStore`]).
//! File references are persisted by `file-transfer` itself. Open auth sessions are kept in
//! memory only: an interrupted sign-in is restarted by the user.

//!
//! - `sqlite`: [`SqliteStorage`], the default;
//! - `group`: its group-commit writer ([`GroupCommit`]): concurrent writes share one
//!   transaction, and nothing is acknowledged before that transaction committed;
//! - `write_op`: [`WriteOp`], one durable write, the stored form of records (shared by every
//!   backend), and how the SQLite writer executes a write;
//! - `postgres` (cargo feature `postgres`): [`PostgresStorage`], the same facts in a
//!   PostgreSQL database, with a group-commit writer task of its own.

pub(crate) mod author;
mod author_rules;
mod cluster;
mod group;
#[cfg(feature = "postgres")]
mod postgres;
mod sqlite;
mod write_op;

pub use author_rules::{AuthorRecord, AuthorScan};
pub(crate) use cluster::Notice;
pub use cluster::{
    Cluster, ClusterEvent, ClusterStorage, DATA_PLANE_LEASE, LeaseState,
    MAX_BROADCAST_MESSAGE_BYTES, MAX_BROADCAST_TOPIC_BYTES,
};
pub use group::{CommitTicket, GroupCommit, GroupCommitConfig, GroupCommitStats, Synchronous};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresOptions, PostgresStorage};
pub use sqlite::{DATABASE_FILE, ExportCounts, SqliteOptions, SqliteStorage};
#[cfg(test)]
pub(crate) use write_op::prefix_upper_bound as write_op_prefix_upper_bound;
pub use write_op::{MAX_NOTIFY_BYTES, MAX_STORED_KEY_BYTES, MAX_STORED_VALUE_BYTES, WriteOp};

use std::collections::BTreeMap;

use serde_json::Value;
use xagent_profile_im::{CompletedRecord, IdempotencyWrite, OutboxWrite, PendingRecord};
use xagent_protocol_types::{
    ConnectionStatus, ConnectorChannelId, ConnectorId, DescriptorTool, MessageId, ToolId,
};

use crate::binding::Binding;

/// A storage failure: the operation and the backend's error as its source. The message
/// names the operation, never a stored value.
#[derive(Debug, thiserror::Error)]
#[error("storage failed during {operation}: {source}")]
pub struct StorageError {
    /// What was being done.
    pub operation: &'static str,
    /// The backend's error.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl StorageError {
    /// A failure of `operation` caused by `source` (for [`Storage`] implementations).
    pub fn new(
        operation: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self { operation, source: source.into() }
    }
}

/// One channel as persisted.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelRecord {
    /// The channel id.
    pub id: ConnectorChannelId,
    /// The runtime instance that owns it.
    pub connector_id: ConnectorId,
    /// Its status.
    pub status: ConnectionStatus,
    /// The binding, once signed in.
    pub binding: Option<Binding>,
    /// Author-reported Tool availability overriding the default (available when signed in).
    pub tool_overrides: BTreeMap<ToolId, DescriptorTool>,
    /// Creation time (Unix ms).
    pub created_at: u64,
}

/// The stored outcome of a `tool.invoke`, for repeated calls with the same key.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCallRecord {
    /// Fingerprint of `tool_id` + arguments, to tell a repeat from a conflict.
    pub fingerprint: String,
    /// The result on success.
    pub result: Option<Value>,
    /// `(code, message)` on failure.
    pub error: Option<(String, String)>,
    /// When it completed (Unix ms).
    pub completed_at: u64,
}

/// Everything the runtime persists, behind an async interface a networked backend can
/// implement without blocking a runtime thread.
///
/// Reads are `async fn`s. **Every write goes through [`Storage::commit`]**: the writes of one
/// call are applied in order in one transaction (all or none), calls are applied in the order
/// they were made, and the returned ticket resolves only once that transaction committed, so
/// the runtime acknowledges nothing before it is durable. `commit` itself never waits: it may
/// be called under a lock, which is how the runtime keeps its writes in the order of its state
/// changes. The convenience methods (`commit_tool_call`, `commit_im`, ...) build the
/// [`WriteOp`]s and call it.
#[async_trait::async_trait]
pub trait Storage: Send + Sync + 'static {
    /// The registered `connector_id`, if any.
    async fn load_connector_id(&self) -> Result<Option<ConnectorId>, StorageError>;
    /// Every stored channel.
    async fn load_channels(&self) -> Result<Vec<ChannelRecord>, StorageError>;
    /// One stored channel (a replica re-reads a row another replica wrote). The default reads
    /// every channel; a backend with an index on the id overrides it.
    async fn load_channel(
        &self,
        id: &ConnectorChannelId,
    ) -> Result<Option<ChannelRecord>, StorageError> {
        Ok(self.load_channels().await?.into_iter().find(|record| &record.id == id))
    }
    /// A stored tool call by `(channel, key)`.
    async fn load_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
    ) -> Result<Option<ToolCallRecord>, StorageError>;
    /// A small runtime value by key (e.g. the URL signing secret).
    async fn load_meta(&self, key: &str) -> Result<Option<String>, StorageError>;
    /// Every pending IM outbox record (the outbox loads them when it opens).
    async fn load_pending(&self) -> Result<Vec<PendingRecord>, StorageError>;
    /// The pending IM outbox records of one channel in `seq` order (a replica taking the
    /// channel's socket over, or woken by another replica's write). The default filters
    /// [`Storage::load_pending`]; a backend with an index overrides it.
    async fn load_pending_of(
        &self,
        channel: &ConnectorChannelId,
    ) -> Result<Vec<PendingRecord>, StorageError> {
        let mut all = self.load_pending().await?;
        all.retain(|record| &record.channel == channel);
        all.sort_by_key(|record| record.seq);
        Ok(all)
    }
    /// The pending IM outbox records of one channel among `ids`, in `seq` order (a replica
    /// woken by another's write of those records). The default filters
    /// [`Storage::load_pending_of`].
    async fn load_pending_ids(
        &self,
        channel: &ConnectorChannelId,
        ids: &[MessageId],
    ) -> Result<Vec<PendingRecord>, StorageError> {
        let mut all = self.load_pending_of(channel).await?;
        all.retain(|record| ids.contains(&record.message_id));
        Ok(all)
    }
    /// The receiver idempotency record of one `(channel, message_id)`, if stored: one point
    /// read, asked when the receiver does not hold the id in memory.
    async fn lookup_completed(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StorageError>;
    /// Deletes tool calls completed before `before` (Unix ms); returns how many.
    async fn prune_tool_calls(&self, before: u64) -> Result<usize, StorageError>;

    /// The author record `(namespace, key)`'s value, if stored ([`crate::AuthorStore`] checks
    /// the namespace and key first). Its writes are the `WriteOp::Author*` variants.
    async fn author_get(&self, namespace: &str, key: &str)
    -> Result<Option<Vec<u8>>, StorageError>;
    /// The values of several author records of one namespace, in the order of `keys` (`None`
    /// for one not stored): a batch of reads in one round trip where the backend has them. The
    /// default reads them one by one (an embedded database, where a read costs no trip).
    async fn author_get_many(
        &self,
        namespace: &str,
        keys: &[String],
    ) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        let mut values = Vec::with_capacity(keys.len());
        for key in keys {
            values.push(self.author_get(namespace, key).await?);
        }
        Ok(values)
    }
    /// The author records `scan` selects in `namespace`, in byte order of their keys (reversed
    /// when `scan.reverse`), keys after `scan.after` in that order, at most `scan.limit`.
    async fn author_scan(
        &self,
        namespace: &str,
        scan: &AuthorScan,
    ) -> Result<Vec<AuthorRecord>, StorageError>;
    /// How many author records of `namespace` have a key starting with `prefix`.
    async fn author_count(&self, namespace: &str, prefix: &str) -> Result<u64, StorageError>;

    /// The leases and wake-ups of a database several replicas share; `None` (the default) for
    /// a storage only one process uses, such as SQLite.
    fn cluster(&self) -> Option<std::sync::Arc<dyn Cluster>> {
        None
    }

    /// Checks that the storage answers (a replica's readiness); the default has nothing to
    /// check (an embedded database).
    async fn ping(&self) -> Result<(), StorageError> {
        Ok(())
    }

    /// Queues `writes` as one transaction without waiting; the ticket resolves once it
    /// committed (or with the error that rolled it back: then none of it happened).
    fn commit(&self, writes: Vec<WriteOp>) -> CommitTicket;

    /// Records (or clears, with `None`) the registered `connector_id`.
    fn commit_connector_id(&self, id: Option<&ConnectorId>) -> CommitTicket {
        self.commit(vec![WriteOp::connector_id(id)])
    }

    /// Inserts or replaces a channel.
    fn commit_channel(&self, record: &ChannelRecord) -> CommitTicket {
        match WriteOp::channel(record) {
            Ok(op) => self.commit(vec![op]),
            Err(error) => CommitTicket::ready(Err(error)),
        }
    }

    /// Deletes a channel and everything kept for it (outbox, idempotency, tool calls).
    fn commit_delete_channel(&self, id: &ConnectorChannelId) -> CommitTicket {
        self.commit(vec![WriteOp::DeleteChannel(id.as_str().to_owned())])
    }

    /// Stores a completed tool call (acknowledge the call only once the ticket resolved).
    fn commit_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
        record: &ToolCallRecord,
    ) -> CommitTicket {
        match WriteOp::tool_call(channel, key, record) {
            Ok(op) => self.commit(vec![op]),
            Err(error) => CommitTicket::ready(Err(error)),
        }
    }

    /// Stores a small runtime value.
    fn commit_meta(&self, key: &str, value: &str) -> CommitTicket {
        self.commit(vec![WriteOp::Meta { key: key.to_owned(), value: Some(value.to_owned()) }])
    }

    /// Commits IM writes (outbox, then receiver idempotency) in one transaction.
    fn commit_im(
        &self,
        outbox: Vec<OutboxWrite>,
        idempotency: Vec<IdempotencyWrite>,
    ) -> CommitTicket {
        self.commit(im_write_ops(outbox, idempotency))
    }
}

/// IM writes as storage writes, in the order [`Storage::commit_im`] commits them: the
/// outbox's, then the receiver's.
pub(crate) fn im_write_ops(
    outbox: Vec<OutboxWrite>,
    idempotency: Vec<IdempotencyWrite>,
) -> Vec<WriteOp> {
    outbox
        .into_iter()
        .map(WriteOp::Outbox)
        .chain(idempotency.into_iter().map(WriteOp::Idempotency))
        .collect()
}
