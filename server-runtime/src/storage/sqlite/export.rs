//! Everything a SQLite state holds, as the writes that recreate it on another backend (what
//! `xagent-connector migrate-state` commits to PostgreSQL). Rows are read as their stored
//! columns, which every backend shares (`write_op`), so no record is decoded and encoded again.

use xagent_profile_im::{CompletedRecord, Fingerprint, IdempotencyWrite, OutboxWrite};
use xagent_protocol_types::{ConnectorChannelId, MessageId};

use super::SqliteStorage;
use crate::storage::{StorageError, WriteOp};

/// How many records of each kind an export holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportCounts {
    /// Meta values (the registered `connector_id`, the URL signing secret, ...).
    pub meta: usize,
    /// Channels with their bindings.
    pub channels: usize,
    /// Completed tool-call records.
    pub tool_calls: usize,
    /// Pending IM outbox messages.
    pub outbox: usize,
    /// IM receiver idempotency records.
    pub completed: usize,
    /// Author-store records (a Connector's own state).
    pub author_records: usize,
}

impl ExportCounts {
    /// The sum of every kind.
    pub fn total(&self) -> usize {
        self.meta
            + self.channels
            + self.tool_calls
            + self.outbox
            + self.completed
            + self.author_records
    }
}

impl SqliteStorage {
    /// Every stored fact as the [`WriteOp`]s that recreate it (meta, channels, tool calls, the
    /// outbox, receiver idempotency, author records), with their counts. Commit them in one
    /// submission to move the state whole.
    pub async fn export(&self) -> Result<(Vec<WriteOp>, ExportCounts), StorageError> {
        self.read("export the state", |conn| {
            let failed = |e| StorageError::new("export the state", e);
            let mut writes = Vec::new();
            let mut counts = ExportCounts::default();

            let mut stmt =
                conn.prepare("SELECT key, value FROM meta ORDER BY key").map_err(failed)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok(WriteOp::Meta { key: row.get(0)?, value: Some(row.get(1)?) })
                })
                .map_err(failed)?;
            for row in rows {
                writes.push(row.map_err(failed)?);
                counts.meta += 1;
            }

            for row in super::channel_rows(conn).map_err(failed)? {
                writes.push(WriteOp::Channel {
                    id: row.id,
                    connector_id: row.connector_id,
                    status: row.status,
                    binding: row.binding,
                    tool_overrides: row.tool_overrides,
                    created_at: row.created_at,
                });
                counts.channels += 1;
            }

            let mut stmt = conn
                .prepare(
                    "SELECT channel, key, fingerprint, result, error_code, error_message,
                       completed_at FROM tool_calls ORDER BY channel, key",
                )
                .map_err(failed)?;
            let rows = stmt
                .query_map([], |row| {
                    let code: Option<String> = row.get(4)?;
                    let message: Option<String> = row.get(5)?;
                    Ok(WriteOp::ToolCall {
                        channel: row.get(0)?,
                        key: row.get(1)?,
                        fingerprint: row.get(2)?,
                        result: row.get(3)?,
                        error: code.map(|code| (code, message.unwrap_or_default())),
                        completed_at: row.get(6)?,
                    })
                })
                .map_err(failed)?;
            for row in rows {
                writes.push(row.map_err(failed)?);
                counts.tool_calls += 1;
            }

            for record in xagent_storage_sqlite::im::load_pending(conn).map_err(failed)? {
                writes.push(WriteOp::Outbox(OutboxWrite::Save(record)));
                counts.outbox += 1;
            }

            // Oldest first, so a backend that orders equal times by insertion keeps the order.
            let mut stmt = conn
                .prepare(
                    "SELECT channel, message_id, fingerprint, completed_at FROM im_completed
                     ORDER BY completed_at, rowid",
                )
                .map_err(failed)?;
            let rows = stmt
                .query_map([], |row| {
                    let channel: String = row.get(0)?;
                    let message_id: String = row.get(1)?;
                    let fingerprint: String = row.get(2)?;
                    let completed_at: i64 = row.get(3)?;
                    Ok(CompletedRecord {
                        channel: ConnectorChannelId::new(channel),
                        message_id: MessageId::new(message_id),
                        fingerprint: Fingerprint::from_hex(fingerprint),
                        completed_at: u64::try_from(completed_at).unwrap_or(0),
                    })
                })
                .map_err(failed)?;
            for row in rows {
                writes.push(WriteOp::Idempotency(IdempotencyWrite::Save(row.map_err(failed)?)));
                counts.completed += 1;
            }

            let mut stmt = conn
                .prepare("SELECT namespace, key, value FROM author_records ORDER BY namespace, key")
                .map_err(failed)?;
            let rows = stmt
                .query_map([], |row| {
                    let key: Vec<u8> = row.get(1)?;
                    Ok((row.get::<_, String>(0)?, key, row.get::<_, Vec<u8>>(2)?))
                })
                .map_err(failed)?;
            for row in rows {
                let (namespace, key, value) = row.map_err(failed)?;
                let key = String::from_utf8(key).map_err(|_| {
                    StorageError::new(
                        "export the state",
                        format!("an author record of {namespace} has a key that is not UTF-8"),
                    )
                })?;
                writes.push(WriteOp::AuthorPut { namespace, key, value });
                counts.author_records += 1;
            }
            Ok((writes, counts))
        })
        .await
    }
}
