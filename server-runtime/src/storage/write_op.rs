//! [`WriteOp`]: one durable write of the SQLite storage, and how the writer thread executes it
//! (through the statement cache).

use rusqlite::{Connection, params};
use xagent_profile_im::{IdempotencyWrite, OutboxWrite};

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
}

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
        }
    }
}

/// Longest id or key a backend stores (a channel id, message id, tool-call key, meta key),
/// in bytes: PostgreSQL's primary-key index takes about 2,700 bytes per row, so two of these
/// fit; SQLite takes the same.
pub const MAX_STORED_KEY_BYTES: usize = 1024;

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
            Self::Idempotency(IdempotencyWrite::Expire { .. }) | Self::PruneToolCalls { .. } => {
                (Vec::new(), Vec::new())
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
        WriteOp::Outbox(write) => xagent_im_sqlite::write_outbox(conn, write),
        WriteOp::Idempotency(write) => xagent_im_sqlite::write_idempotency(conn, write),
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
    }
}
