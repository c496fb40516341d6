//! [`WriteOp`]: one durable write, the same for every backend; how records become stored
//! columns and back (one home for the encoding, so every backend stores the same text); and
//! how the SQLite writer thread executes a write (through the statement cache).

use std::collections::BTreeMap;

use rusqlite::{Connection, params};
use xagent_profile_im::{IdempotencyWrite, OutboxWrite};
use xagent_protocol_types::{
    ConnectionStatus, ConnectorChannelId, ConnectorId, DescriptorTarget, DescriptorTool, Secret,
    TargetType,
};

use super::{ChannelRecord, StorageError, ToolCallRecord};
use crate::binding::Binding;

/// The meta key of the registered `connector_id`.
pub(crate) const CONNECTOR_ID_KEY: &str = "connector_id";

/// One durable write. Rows are given as their stored columns (JSON text already encoded), so
/// the writer thread only binds parameters.
#[derive(Clone, PartialEq)]
pub enum WriteOp {
    /// An IM outbox write (`profile-im`).
    Outbox(OutboxWrite),
    /// An IM receiver idempotency write (`profile-im`).
    Idempotency(IdempotencyWrite),
    /// Stores a completed tool call (insert or replace by `(channel, key)`).
    ToolCall {
        /// Channel id.
        channel: String,
        /// Idempotency key (tool_call_id or request_id).
        key: String,
        /// Fingerprint of tool id + arguments.
        fingerprint: String,
        /// The result as JSON text, on success.
        result: Option<String>,
        /// `(code, message)` on failure.
        error: Option<(String, String)>,
        /// Completion time (Unix ms).
        completed_at: i64,
    },
    /// Inserts or updates a channel record.
    Channel {
        /// Channel id.
        id: String,
        /// Owning runtime instance.
        connector_id: String,
        /// Status text.
        status: String,
        /// The binding as JSON text (holds secrets: never logged).
        binding: Option<String>,
        /// Tool overrides as JSON text.
        tool_overrides: String,
        /// Creation time (Unix ms).
        created_at: i64,
    },
    /// Deletes a channel and everything kept for it.
    DeleteChannel(String),
    /// Sets (`Some`) or removes (`None`) a meta value.
    Meta {
        /// Key.
        key: String,
        /// Value.
        value: Option<String>,
    },
    /// Deletes tool calls completed before the time (Unix ms).
    PruneToolCalls {
        /// Cut-off.
        before: i64,
    },
    /// Inserts or replaces one author record (a Connector's own state, see
    /// [`crate::AuthorStore`]). Build it with [`crate::AuthorWrite::put`], which checks the
    /// namespace and the sizes.
    AuthorPut {
        /// The author's namespace (e.g. `webchat.messages`).
        namespace: String,
        /// The record's key (UTF-8, compared as bytes).
        key: String,
        /// The record's value.
        value: Vec<u8>,
    },
    /// Deletes one author record, if present.
    AuthorDelete {
        /// Namespace.
        namespace: String,
        /// Key.
        key: String,
    },
    /// Deletes every author record of a namespace whose key starts with `prefix` (all of the
    /// namespace for an empty prefix).
    AuthorDeletePrefix {
        /// Namespace.
        namespace: String,
        /// Key prefix.
        prefix: String,
    },
    /// Fails the submission unless the data-plane lease still carries this fencing number
    /// (a replica whose lease was taken over can no longer commit). Put first by
    /// [`crate::storage::ClusterStorage`]; a single-process backend has one holder and checks nothing.
    Fence(u64),
    /// Wakes the replicas sharing the database with this text once the transaction commits
    /// (PostgreSQL `NOTIFY`); nothing on a single-process backend.
    Notify(String),
}

impl WriteOp {
    /// Records (`Some`) or clears (`None`) the registered `connector_id`.
    pub fn connector_id(id: Option<&ConnectorId>) -> Self {
        Self::Meta { key: CONNECTOR_ID_KEY.into(), value: id.map(|id| id.as_str().to_owned()) }
    }

    /// Inserts or updates a channel record (the binding encoded with its secrets).
    pub fn channel(record: &ChannelRecord) -> Result<Self, StorageError> {
        let binding = record.binding.as_ref().map(binding_to_json).transpose()?;
        let overrides: Vec<&DescriptorTool> = record.tool_overrides.values().collect();
        let overrides = serde_json::to_string(&overrides)
            .map_err(|e| StorageError::new("encode tool overrides", e))?;
        Ok(Self::Channel {
            id: record.id.as_str().to_owned(),
            connector_id: record.connector_id.as_str().to_owned(),
            status: record.status.as_str().to_owned(),
            binding,
            tool_overrides: overrides,
            created_at: to_i64(record.created_at),
        })
    }

    /// Stores a completed tool call.
    pub fn tool_call(
        channel: &ConnectorChannelId,
        key: &str,
        record: &ToolCallRecord,
    ) -> Result<Self, StorageError> {
        let result = record
            .result
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| StorageError::new("encode tool result", e))?;
        Ok(Self::ToolCall {
            channel: channel.as_str().to_owned(),
            key: key.to_owned(),
            fingerprint: record.fingerprint.clone(),
            result,
            error: record.error.clone(),
            completed_at: to_i64(record.completed_at),
        })
    }
}

/// A channel row as stored (the columns every backend keeps), before decoding.
pub(crate) struct ChannelRow {
    pub(crate) id: String,
    pub(crate) connector_id: String,
    pub(crate) status: String,
    pub(crate) binding: Option<String>,
    pub(crate) tool_overrides: String,
    pub(crate) created_at: i64,
}

impl ChannelRow {
    /// The record; a row that does not decode is an error naming what failed.
    pub(crate) fn decode(self) -> Result<ChannelRecord, StorageError> {
        let binding = self.binding.as_deref().map(binding_from_json).transpose()?;
        let tools: Vec<DescriptorTool> = serde_json::from_str(&self.tool_overrides)
            .map_err(|e| StorageError::new("decode tool overrides", e))?;
        Ok(ChannelRecord {
            id: ConnectorChannelId::new(self.id),
            connector_id: ConnectorId::new(self.connector_id),
            status: ConnectionStatus::parse(&self.status),
            binding,
            tool_overrides: tools.into_iter().map(|t| (t.tool_id.clone(), t)).collect(),
            created_at: to_u64(self.created_at),
        })
    }
}

/// A tool-call row as stored, before decoding.
pub(crate) struct ToolCallRow {
    pub(crate) fingerprint: String,
    pub(crate) result: Option<String>,
    pub(crate) error_code: Option<String>,
    pub(crate) error_message: Option<String>,
    pub(crate) completed_at: i64,
}

impl ToolCallRow {
    /// The record.
    pub(crate) fn decode(self) -> Result<ToolCallRecord, StorageError> {
        let result = self
            .result
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|e| StorageError::new("decode tool result", e))?;
        Ok(ToolCallRecord {
            fingerprint: self.fingerprint,
            result,
            error: self.error_code.map(|code| (code, self.error_message.unwrap_or_default())),
            completed_at: to_u64(self.completed_at),
        })
    }
}

/// A binding as stored: its target, its flow's target type and its secrets (the row is
/// private material: never logged).
pub(crate) fn binding_to_json(binding: &Binding) -> Result<String, StorageError> {
    let secrets: BTreeMap<&str, &str> = binding.secrets().map(|(k, v)| (k, v.expose())).collect();
    let mut stored = serde_json::json!({ "target": binding.target, "secrets": secrets });
    if let Some(target_type) = binding.target_type() {
        stored["target_type"] = serde_json::json!(target_type);
    }
    serde_json::to_string(&stored).map_err(|e| StorageError::new("encode binding", e))
}

/// A stored binding read back.
pub(crate) fn binding_from_json(text: &str) -> Result<Binding, StorageError> {
    #[derive(serde::Deserialize)]
    struct Stored {
        target: DescriptorTarget,
        #[serde(default)]
        secrets: BTreeMap<String, String>,
        /// Absent in bindings stored before channels kept their flow's target type.
        #[serde(default)]
        target_type: Option<TargetType>,
    }
    let stored: Stored =
        serde_json::from_str(text).map_err(|e| StorageError::new("decode binding", e))?;
    let mut binding = Binding::new(stored.target);
    if let Some(target_type) = stored.target_type {
        binding = binding.with_target_type(target_type);
    }
    for (name, value) in stored.secrets {
        binding = binding.with_secret(name, Secret::new(value));
    }
    Ok(binding)
}

pub(crate) use xagent_storage_sqlite::{to_i64, to_u64};

impl std::fmt::Debug for WriteOp {
    /// Names the operation and its keys, never a stored value (bindings hold secrets).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Outbox(OutboxWrite::Save(r)) => {
                write!(f, "Outbox::Save({}, {})", r.channel, r.message_id)
            }
            Self::Outbox(OutboxWrite::Delete(c, m)) => write!(f, "Outbox::Delete({c}, {m})"),
            Self::Outbox(OutboxWrite::Attempt(a)) => {
                write!(f, "Outbox::Attempt({}, {})", a.channel, a.message_id)
            }
            Self::Idempotency(IdempotencyWrite::Save(r)) => {
                write!(f, "Idempotency::Save({}, {})", r.channel, r.message_id)
            }
            Self::Idempotency(IdempotencyWrite::Delete(c, m)) => {
                write!(f, "Idempotency::Delete({c}, {m})")
            }
            Self::Idempotency(IdempotencyWrite::Trim { channel, keep }) => {
                write!(f, "Idempotency::Trim({channel}, keep {keep})")
            }
            Self::Idempotency(IdempotencyWrite::Expire { before }) => {
                write!(f, "Idempotency::Expire(before {before})")
            }
            Self::ToolCall { channel, key, .. } => write!(f, "ToolCall({channel}, {key})"),
            Self::Channel { id, .. } => write!(f, "Channel({id})"),
            Self::DeleteChannel(id) => write!(f, "DeleteChannel({id})"),
            Self::Meta { key, .. } => write!(f, "Meta({key})"),
            Self::PruneToolCalls { before } => write!(f, "PruneToolCalls({before})"),
            Self::AuthorPut { namespace, key, value } => {
                write!(f, "AuthorPut({namespace}, {key}, {} bytes)", value.len())
            }
            Self::AuthorDelete { namespace, key } => write!(f, "AuthorDelete({namespace}, {key})"),
            Self::AuthorDeletePrefix { namespace, prefix } => {
                write!(f, "AuthorDeletePrefix({namespace}, {prefix})")
            }
            Self::Fence(fence) => write!(f, "Fence({fence})"),
            Self::Notify(text) => write!(f, "Notify({} bytes)", text.len()),
        }
    }
}

/// Longest id or key a backend stores (a channel id, message id, tool-call key, meta key),
/// in bytes: PostgreSQL's primary-key index takes about 2,700 bytes per row, so two of these
/// fit; SQLite takes the same.
pub const MAX_STORED_KEY_BYTES: usize = 1024;

/// Longest wake-up text ([`WriteOp::Notify`]; PostgreSQL takes 8,000 bytes per `NOTIFY`
/// payload).
pub const MAX_NOTIFY_BYTES: usize = 7_900;

/// Longest value a backend stores (a payload, a result, a binding), in bytes: SQLite's own
/// limit on one value, below PostgreSQL's (1 GiB).
pub const MAX_STORED_VALUE_BYTES: usize = 1_000_000_000;

impl WriteOp {
    /// The rules every backend applies before writing (one home, so SQLite and PostgreSQL take
    /// the same writes): ids and keys at most [`MAX_STORED_KEY_BYTES`], values at most
    /// [`MAX_STORED_VALUE_BYTES`], and neither holding a NUL character, which PostgreSQL's `TEXT`
    /// cannot store. Free text (a tool error's message, an outbox message's last error) may
    /// hold one: backends store it as bytes where they must.
    pub fn check(&self) -> Result<(), super::StorageError> {
        let (keys, values): (Vec<&str>, Vec<&str>) = match self {
            Self::Outbox(OutboxWrite::Save(r)) => {
                (vec![r.channel.as_str(), r.message_id.as_str()], vec![r.payload.as_str()])
            }
            Self::Outbox(OutboxWrite::Delete(c, m))
            | Self::Idempotency(IdempotencyWrite::Delete(c, m)) => {
                (vec![c.as_str(), m.as_str()], Vec::new())
            }
            Self::Outbox(OutboxWrite::Attempt(a)) => {
                (vec![a.channel.as_str(), a.message_id.as_str()], Vec::new())
            }
            Self::Idempotency(IdempotencyWrite::Save(r)) => {
                (vec![r.channel.as_str(), r.message_id.as_str()], vec![r.fingerprint.as_str()])
            }
            Self::Idempotency(IdempotencyWrite::Trim { channel, .. }) => {
                (vec![channel.as_str()], Vec::new())
            }
            Self::Idempotency(IdempotencyWrite::Expire { .. })
            | Self::PruneToolCalls { .. }
            | Self::Fence(_) => (Vec::new(), Vec::new()),
            Self::Notify(text) => {
                if text.len() > MAX_NOTIFY_BYTES || text.contains('\0') {
                    return Err(super::StorageError::new(
                        "check a write",
                        format!(
                            "a wake-up of {} bytes (at most {}, no NUL); nothing of its \
                             submission was stored",
                            text.len(),
                            MAX_NOTIFY_BYTES
                        ),
                    ));
                }
                return Ok(());
            }
            Self::ToolCall { channel, key, fingerprint, result, error, .. } => {
                let mut values = vec![fingerprint.as_str()];
                values.extend(result.as_deref());
                values.extend(error.as_ref().map(|(code, _)| code.as_str()));
                (vec![channel.as_str(), key.as_str()], values)
            }
            Self::Channel { id, connector_id, status, binding, tool_overrides, .. } => {
                let mut values = vec![connector_id.as_str(), status.as_str()];
                values.extend(binding.as_deref());
                values.push(tool_overrides.as_str());
                (vec![id.as_str()], values)
            }
            Self::DeleteChannel(id) => (vec![id.as_str()], Vec::new()),
            Self::Meta { key, value } => {
                (vec![key.as_str()], value.as_deref().into_iter().collect())
            }
            // Author records have their own, tighter limits (one home: `author_limits`); their
            // values are bytes, stored as such on both backends.
            Self::AuthorPut { namespace, key, value } => {
                return super::author_rules::check_record(namespace, key, Some(value.len()))
                    .map_err(|e| super::StorageError::new("check a write", e));
            }
            Self::AuthorDelete { namespace, key } => {
                return super::author_rules::check_record(namespace, key, None)
                    .map_err(|e| super::StorageError::new("check a write", e));
            }
            Self::AuthorDeletePrefix { namespace, prefix } => {
                return super::author_rules::check_record(namespace, prefix, None)
                    .map_err(|e| super::StorageError::new("check a write", e));
            }
        };
        let refuse = |what: String| {
            Err(super::StorageError::new(
                "check a write",
                format!("a write holds {what}; nothing of its submission was stored"),
            ))
        };
        if let Some(key) = keys.iter().find(|k| k.len() > MAX_STORED_KEY_BYTES) {
            return refuse(format!(
                "an id or key of {} bytes (at most {MAX_STORED_KEY_BYTES})",
                key.len()
            ));
        }
        if let Some(value) = values.iter().find(|v| v.len() > MAX_STORED_VALUE_BYTES) {
            return refuse(format!(
                "a value of {} bytes (at most {MAX_STORED_VALUE_BYTES})",
                value.len()
            ));
        }
        if keys.iter().chain(&values).any(|text| text.contains('\0')) {
            return refuse("a NUL character in an id, key or value".into());
        }
        Ok(())
    }
}

/// Executes one write through the statement cache.
pub(crate) fn execute(conn: &Connection, op: &WriteOp) -> rusqlite::Result<()> {
    op.check().map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
    let exec = |sql: &str, p: &[&dyn rusqlite::ToSql]| -> rusqlite::Result<()> {
        conn.prepare_cached(sql)?.execute(p).map(|_| ())
    };
    match op {
        WriteOp::Outbox(write) => xagent_storage_sqlite::im::write_outbox(conn, write),
        WriteOp::Idempotency(write) => xagent_storage_sqlite::im::write_idempotency(conn, write),
        WriteOp::ToolCall { channel, key, fingerprint, result, error, completed_at } => {
            let (code, message) = match error {
                Some((code, message)) => (Some(code.as_str()), Some(message.as_str())),
                None => (None, None),
            };
            exec(
                "INSERT OR REPLACE INTO tool_calls
                   (channel, key, fingerprint, result, error_code, error_message, completed_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![channel, key, fingerprint, result, code, message, completed_at],
            )
        }
        WriteOp::Channel { id, connector_id, status, binding, tool_overrides, created_at } => exec(
            "INSERT INTO channels (id, connector_id, status, binding, tool_overrides, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(id) DO UPDATE SET connector_id = excluded.connector_id,
                   status = excluded.status, binding = excluded.binding,
                   tool_overrides = excluded.tool_overrides",
            params![id, connector_id, status, binding, tool_overrides, created_at],
        ),
        WriteOp::DeleteChannel(id) => {
            for sql in [
                "DELETE FROM channels WHERE id = ?1",
                "DELETE FROM tool_calls WHERE channel = ?1",
                "DELETE FROM im_pending WHERE channel = ?1",
                "DELETE FROM im_completed WHERE channel = ?1",
            ] {
                exec(sql, params![id])?;
            }
            Ok(())
        }
        WriteOp::Meta { key, value: Some(value) } => exec(
            "INSERT INTO meta (key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![key, value],
        ),
        WriteOp::Meta { key, value: None } => exec("DELETE FROM meta WHERE key = ?1", params![key]),
        WriteOp::PruneToolCalls { before } => {
            exec("DELETE FROM tool_calls WHERE completed_at < ?1", params![before])
        }
        WriteOp::AuthorPut { namespace, key, value } => exec(
            "INSERT INTO author_records (namespace, key, value) VALUES (?1, ?2, ?3)
             ON CONFLICT(namespace, key) DO UPDATE SET value = excluded.value",
            params![namespace, key.as_bytes(), value],
        ),
        WriteOp::AuthorDelete { namespace, key } => exec(
            "DELETE FROM author_records WHERE namespace = ?1 AND key = ?2",
            params![namespace, key.as_bytes()],
        ),
        WriteOp::AuthorDeletePrefix { namespace, prefix } => {
            let upper = prefix_upper_bound(prefix.as_bytes());
            exec(
                "DELETE FROM author_records WHERE namespace = ?1 AND key >= ?2
                   AND (?3 IS NULL OR key < ?3)",
                params![namespace, prefix.as_bytes(), upper],
            )
        }
        // One process owns a SQLite database: there is no other holder to fence off and no
        // other replica to wake.
        WriteOp::Fence(_) | WriteOp::Notify(_) => Ok(()),
    }
}

/// The smallest byte string above every key that starts with `prefix` (keys are UTF-8, which
/// never holds the byte 0xFF), or `None` for the empty prefix (no upper bound). Both backends
/// store keys as bytes and compare them bytewise, so a prefix is one index range.
pub(crate) fn prefix_upper_bound(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut upper = prefix.to_vec();
    while let Some(last) = upper.pop() {
        if last < u8::MAX {
            upper.push(last + 1);
            return Some(upper);
        }
    }
    None
}

/// An author record read back: its key must be the UTF-8 it was written as.
pub(crate) fn author_record(
    key: Vec<u8>,
    value: Vec<u8>,
) -> Result<crate::AuthorRecord, StorageError> {
    let key = String::from_utf8(key).map_err(|e| StorageError::new("decode an author key", e))?;
    Ok(crate::AuthorRecord { key, value })
}
