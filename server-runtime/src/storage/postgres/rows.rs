//! How the stored rows read back: the column lists of the channel and outbox queries and the
//! decoders of their rows.

use tokio_postgres::Row;
use xagent_profile_im::PendingRecord;
use xagent_protocol_types::{ConnectorChannelId, MessageId};

use super::super::write_op::{ChannelRow, to_u64};
use super::super::{ChannelRecord, StorageError};

pub(super) const LOAD_CHANNELS: &str = "load channels";
pub(super) const CHANNEL_COLUMNS: &str =
    "SELECT id, connector_id, status, binding, tool_overrides, created_at FROM server_channels";
pub(super) const LOAD_PENDING: &str = "load pending messages";
pub(super) const PENDING_COLUMNS: &str = "SELECT channel, message_id, seq, payload, attempts,
   first_responsibility_at, expires_at, next_attempt_at, last_error FROM server_im_pending";

/// A channel row of [`CHANNEL_COLUMNS`].
pub(super) fn channel_of(row: &Row) -> Result<ChannelRecord, StorageError> {
    const OP: &str = LOAD_CHANNELS;
    ChannelRow {
        id: get(row, 0, OP)?,
        connector_id: get(row, 1, OP)?,
        status: get(row, 2, OP)?,
        binding: get(row, 3, OP)?,
        tool_overrides: get(row, 4, OP)?,
        created_at: get(row, 5, OP)?,
    }
    .decode()
}

/// An outbox row of [`PENDING_COLUMNS`].
pub(super) fn pending_of(row: &Row) -> Result<PendingRecord, StorageError> {
    const OP: &str = LOAD_PENDING;
    let attempts: i64 = get(row, 4, OP)?;
    Ok(PendingRecord {
        channel: ConnectorChannelId::new(get::<String>(row, 0, OP)?),
        message_id: MessageId::new(get::<String>(row, 1, OP)?),
        seq: to_u64(get(row, 2, OP)?),
        payload: get(row, 3, OP)?,
        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        first_responsibility_at: to_u64(get(row, 5, OP)?),
        expires_at: to_u64(get(row, 6, OP)?),
        next_attempt_at: to_u64(get(row, 7, OP)?),
        last_error: get::<Option<Vec<u8>>>(row, 8, OP)?.map(text_of),
    })
}

/// A column of a row; a type mismatch (a schema this binary does not know) is an error.
pub(super) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    index: usize,
    operation: &'static str,
) -> Result<T, StorageError> {
    row.try_get(index).map_err(|e| StorageError::new(operation, e))
}

/// Free text stored as bytes; bytes that are not UTF-8 (never written by this crate) are
/// shown with replacement characters rather than refused.
pub(super) fn text_of(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}
