//! The IM outbox's and idempotency set's writes as SQL, inside the batch's transaction.

use xagent_profile_im::{IdempotencyWrite, OutboxWrite};
use xagent_protocol_types::{ConnectorChannelId, MessageId};
use xagent_storage_postgres::PgError;
use xagent_storage_postgres::deadpool_postgres::Transaction;

use super::exec;
use crate::store::to_i64;

/// Deletes the row of one message of `scope` from `table` (the pending or the completed
/// messages, both keyed by scope, channel and message id).
async fn delete_message(
    tx: &Transaction<'_>,
    context: &str,
    table: &'static str,
    scope: &str,
    channel: &ConnectorChannelId,
    message_id: &MessageId,
) -> Result<u64, PgError> {
    let sql = format!("DELETE FROM {table} WHERE scope = $1 AND channel = $2 AND message_id = $3");
    exec(tx, context, &sql, &[&scope, &channel.as_str(), &message_id.as_str()]).await
}

pub(super) async fn outbox(
    tx: &Transaction<'_>,
    scope: &str,
    write: &OutboxWrite,
) -> Result<(), PgError> {
    match write {
        OutboxWrite::Save(r) => {
            exec(
                tx,
                "save_pending",
                "INSERT INTO xagent_client_pending (scope, channel, message_id, seq, payload,
                   attempts, first_responsibility_at, expires_at, next_attempt_at, last_error)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT (scope, channel, message_id) DO UPDATE SET seq = excluded.seq,
                   payload = excluded.payload, attempts = excluded.attempts,
                   first_responsibility_at = excluded.first_responsibility_at,
                   expires_at = excluded.expires_at, next_attempt_at = excluded.next_attempt_at,
                   last_error = excluded.last_error",
                &[
                    &scope,
                    &r.channel.as_str(),
                    &r.message_id.as_str(),
                    &to_i64(r.seq),
                    &r.payload,
                    &i64::from(r.attempts),
                    &to_i64(r.first_responsibility_at),
                    &to_i64(r.expires_at),
                    &to_i64(r.next_attempt_at),
                    &r.last_error,
                ],
            )
            .await?;
        }
        OutboxWrite::Delete(channel, message_id) => {
            delete_message(
                tx,
                "delete_pending",
                "xagent_client_pending",
                scope,
                channel,
                message_id,
            )
            .await?;
        }
        OutboxWrite::Attempt(a) => {
            exec(
                tx,
                "save_attempt",
                "UPDATE xagent_client_pending
                 SET attempts = $4, next_attempt_at = $5, last_error = $6
                 WHERE scope = $1 AND channel = $2 AND message_id = $3",
                &[
                    &scope,
                    &a.channel.as_str(),
                    &a.message_id.as_str(),
                    &i64::from(a.attempts),
                    &to_i64(a.next_attempt_at),
                    &a.last_error,
                ],
            )
            .await?;
        }
    }
    Ok(())
}

pub(super) async fn idempotency(
    tx: &Transaction<'_>,
    scope: &str,
    write: &IdempotencyWrite,
) -> Result<(), PgError> {
    match write {
        IdempotencyWrite::Save(r) => {
            exec(
                tx,
                "save_completed",
                "INSERT INTO xagent_client_completed
                   (scope, channel, message_id, fingerprint, completed_at)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (scope, channel, message_id) DO UPDATE
                   SET fingerprint = excluded.fingerprint, completed_at = excluded.completed_at",
                &[
                    &scope,
                    &r.channel.as_str(),
                    &r.message_id.as_str(),
                    &r.fingerprint.as_str(),
                    &to_i64(r.completed_at),
                ],
            )
            .await?;
        }
        IdempotencyWrite::Delete(channel, message_id) => {
            delete_message(
                tx,
                "delete_completed",
                "xagent_client_completed",
                scope,
                channel,
                message_id,
            )
            .await?;
        }
        IdempotencyWrite::Trim { channel, keep } => {
            let keep = i64::try_from(*keep).unwrap_or(i64::MAX);
            exec(
                tx,
                "trim_completed",
                "DELETE FROM xagent_client_completed
                 WHERE scope = $1 AND channel = $2 AND message_id NOT IN (
                   SELECT message_id FROM xagent_client_completed
                   WHERE scope = $1 AND channel = $2
                   ORDER BY completed_at DESC, message_id DESC LIMIT $3)",
                &[&scope, &channel.as_str(), &keep],
            )
            .await?;
        }
        IdempotencyWrite::Expire { before } => {
            exec(
                tx,
                "expire_completed",
                "DELETE FROM xagent_client_completed WHERE scope = $1 AND completed_at < $2",
                &[&scope, &to_i64(*before)],
            )
            .await?;
        }
    }
    Ok(())
}
