//! Persistence behind one trait, with an embedded SQLite implementation (WAL, one file under a
//! state directory) as the default.
//!
//! What is stored: the registered `connector_id`; every channel with its owner, status,
//! binding (Descriptor target + private material) and Tool overrides; the IM outbox and the
//! receiver idempotency set (through `profile-im`'s store traits); tool-call idempotency.
//! File references are persisted by `file-transfer` itself. Open auth sessions are kept in
//! memory only: an interrupted sign-in is restarted by the user.

//!
//! - `sqlite`: [`SqliteStorage`], the default; `sqlite_im`: the IM stores on it;
//! - `group`: its group-commit writer ([`GroupCommit`]): concurrent writes share one
//!   transaction, and nothing is acknowledged before that transaction committed;
//! - `write_op`: [`WriteOp`], one durable write, and how the writer executes it;
//! - `postgres` (cargo feature `postgres`): [`PostgresStorage`], the same facts in a
//!   PostgreSQL database, with a group-commit writer task of its own.

mod group;
#[cfg(feature = "postgres")]
mod postgres;
mod sqlite;
mod sqlite_im;
mod write_op;

pub use group::{CommitTicket, GroupCommit, GroupCommitConfig, GroupCommitStats, Synchronous};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresOptions, PostgresStorage};
pub use sqlite::{DATABASE_FILE, SqliteOptions, SqliteStorage, private_database_files};
pub use write_op::{MAX_STORED_KEY_BYTES, MAX_STORED_VALUE_BYTES, WriteOp};

use std::collections::BTreeMap;

use serde_json::Value;
use xagent_profile_im::{IdempotencyStore, IdempotencyWrite, OutboxStore, OutboxWrite};
use xagent_protocol_types::{
    ConnectionStatus, ConnectorChannelId, ConnectorId, DescriptorTool, ToolId,
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

/// Everything the runtime persists. Implementations must be cheap to call from async code
/// (short, local operations); the SQLite one is.
pub trait Storage: Send + Sync + 'static {
    /// The registered `connector_id`, if any.
    fn load_connector_id(&self) -> Result<Option<ConnectorId>, StorageError>;
    /// Records (or clears, with `None`) the registered `connector_id`.
    fn save_connector_id(&self, id: Option<&ConnectorId>) -> Result<(), StorageError>;
    /// Every stored channel.
    fn load_channels(&self) -> Result<Vec<ChannelRecord>, StorageError>;
    /// Inserts or replaces a channel.
    fn save_channel(&self, record: &ChannelRecord) -> Result<(), StorageError>;
    /// Deletes a channel and everything kept for it (outbox, idempotency, tool calls).
    fn delete_channel(&self, id: &ConnectorChannelId) -> Result<(), StorageError>;
    /// A stored tool call by `(channel, key)`.
    fn load_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
    ) -> Result<Option<ToolCallRecord>, StorageError>;
    /// Stores a completed tool call.
    fn save_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
        record: &ToolCallRecord,
    ) -> Result<(), StorageError>;
    /// Deletes tool calls completed before `before` (Unix ms); returns how many.
    fn prune_tool_calls(&self, before: u64) -> Result<usize, StorageError>;
    /// A small runtime value by key (e.g. the URL signing secret).
    fn load_meta(&self, key: &str) -> Result<Option<String>, StorageError>;
    /// Stores a small runtime value.
    fn save_meta(&self, key: &str, value: &str) -> Result<(), StorageError>;
    /// The IM outbox store (`profile-im`).
    fn outbox_store(&self) -> Box<dyn OutboxStore + Send>;
    /// The IM receiver idempotency store (`profile-im`).
    fn idempotency_store(&self) -> Box<dyn IdempotencyStore + Send>;

    /// Stores a completed tool call without blocking; the ticket resolves once it is durable
    /// (acknowledge the call only then). The SQLite storage commits it together with other
    /// callers' writes; the default writes it at once.
    fn commit_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
        record: &ToolCallRecord,
    ) -> CommitTicket {
        CommitTicket::ready(self.save_tool_call(channel, key, record))
    }

    /// Commits IM writes (outbox, then receiver idempotency) without blocking; the ticket
    /// resolves once they are durable. Submissions are applied in the order they were made.
    /// The default writes them at once through the two stores.
    fn commit_im(
        &self,
        outbox: Vec<OutboxWrite>,
        idempotency: Vec<IdempotencyWrite>,
    ) -> CommitTicket {
        let result = self
            .outbox_store()
            .apply(&outbox)
            .and_then(|()| self.idempotency_store().apply(&idempotency))
            .map_err(|e| StorageError::new("commit IM writes", e));
        CommitTicket::ready(result)
    }
}
