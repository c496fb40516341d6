//! The delivery state a visitor message shows on its page (its tick): `sending` until the
//! runtime's outbox reports the outcome, then `delivered`, `rejected` or `expired`.
//!
//! Two paths write it (the outbox's facts and the hand-over happen on the replica holding
//! xAgent's socket):
//! - [`relay_outbox_events`] turns the outbox's facts into states as they happen, in batches
//!   (one transaction for all that arrived meanwhile).
//! - [`sweep_stranded`] finds messages the outbox no longer holds that still show `sending`:
//!   the outbox's removal of an acknowledged message and the state's write are two
//!   transactions, so a replica killed between them (or whose relay fell behind and missed
//!   events) leaves the message `sending` although xAgent has it. For every channel routed
//!   here, a message `sending` for longer than [`STRANDED_AFTER_MILLIS`] (injected clock) that
//!   the outbox does not hold is handed to the outbox again with its kept `chat.message`:
//!   xAgent's receiver answers `duplicate` for one it has (applied once, as any redelivery
//!   across a failover) and the answer sets the state. One older than the outbox's TTL is
//!   marked `expired` (on any replica) instead of being sent after its time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use xagent_profile_im::{DEFAULT_TTL_MS, OutboxEvent};
use xagent_protocol_types::{ChatMessage, ConnectorChannelId};
use xagent_server_runtime::ConnectorHandle;

use crate::app::App;
use crate::error::WebchatError;
use crate::messages::StatusUpdate;
use crate::store::EntryStatus;

/// How long a visitor message may show `sending` without the outbox holding it before the
/// sweep hands it over again (far above a delivery's normal time, so the sweep never races
/// the usual path).
pub(crate) const STRANDED_AFTER_MILLIS: u64 = 5_000;

/// How often the sweep looks.
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// Most messages one sweep looks at (the oldest first).
const SWEEP_BATCH: usize = 200;

/// Most outbox facts written in one transaction.
const RELAY_BATCH: usize = 128;

/// The reason shown under an expired message.
const EXPIRED_TEXT: &str = "the agent did not take the message in time";

/// The delivery state an outbox fact sets, if any.
fn update_of(event: OutboxEvent) -> Option<StatusUpdate> {
    let (message_id, status, error) = match event {
        OutboxEvent::Delivered { message_id, .. } => (message_id, EntryStatus::Delivered, None),
        OutboxEvent::Failed { message_id, code, reason, .. } => {
            (message_id, EntryStatus::Rejected, Some(rejection_text(&code.to_string(), &reason)))
        }
        OutboxEvent::Expired { message_id, .. } => {
            (message_id, EntryStatus::Expired, Some(EXPIRED_TEXT.to_owned()))
        }
        OutboxEvent::Evicted { message_id, .. } => (
            message_id,
            EntryStatus::Rejected,
            Some("not sent: too many messages were waiting for the agent".to_owned()),
        ),
        OutboxEvent::Discarded { message_id, .. } => (
            message_id,
            EntryStatus::Rejected,
            Some("not sent: the agent's connection to this room was removed".to_owned()),
        ),
        _ => return None,
    };
    Some(StatusUpdate { message_id: message_id.to_string(), status, error })
}

/// Turns the outbox's facts into the delivery state the page shows, every fact that arrived
/// meanwhile in one transaction.
pub(crate) async fn relay_outbox_events(app: Arc<App>, handle: ConnectorHandle) {
    let Some(mut events) = handle.outbox_events() else { return };
    loop {
        let first = match events.recv().await {
            Ok(event) => event,
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "delivery states were missed; the sweep sets them");
                continue;
            }
            Err(RecvError::Closed) => return,
        };
        let mut updates: Vec<StatusUpdate> = update_of(first).into_iter().collect();
        while updates.len() < RELAY_BATCH {
            match events.try_recv() {
                Ok(event) => updates.extend(update_of(event)),
                Err(TryRecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "delivery states were missed; the sweep sets them");
                }
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        if updates.is_empty() {
            continue;
        }
        let missing = record_states(&app, updates).await;
        if !missing.is_empty() {
            // A message posted on this replica is sent while its row is still on its way to
            // the database (they commit together), so its outcome can come first: try again
            // shortly rather than leave the tick to the sweep.
            let app = Arc::clone(&app);
            tokio::spawn(async move {
                let mut missing = missing;
                for delay in LATE_ROW_RETRIES {
                    tokio::time::sleep(delay).await;
                    missing = record_states(&app, missing).await;
                    if missing.is_empty() {
                        return;
                    }
                }
            });
        }
    }
}

/// When to look again for messages whose outcome came before their row (then the sweep).
const LATE_ROW_RETRIES: [Duration; 3] =
    [Duration::from_millis(50), Duration::from_millis(250), Duration::from_secs(1)];

/// Writes delivery states and shows them; returns those whose message is not stored (yet).
async fn record_states(app: &App, updates: Vec<StatusUpdate>) -> Vec<StatusUpdate> {
    let updated = match app.messages() {
        Ok(messages) => messages.set_statuses(updates.clone()).await,
        Err(error) => Err(error),
    };
    match updated {
        Ok(updated) => {
            let found: std::collections::HashSet<String> =
                updated.iter().map(|(_, entry)| entry.message_id.clone()).collect();
            for (room_id, entry) in updated {
                app.publish(&room_id, entry);
            }
            updates.into_iter().filter(|u| !found.contains(&u.message_id)).collect()
        }
        Err(error) => {
            tracing::error!(%error, "could not record delivery states; the sweep sets them");
            Vec::new()
        }
    }
}

/// The reason shown under a rejected message: the receiver's words and its code, without
/// the outbox's `rejected <code>: ` prefix when it kept one.
pub(crate) fn rejection_text(code: &str, reason: &str) -> String {
    let prefix = format!("rejected {code}: ");
    let reason = reason.strip_prefix(&prefix).unwrap_or(reason).trim();
    if reason.is_empty() { format!("rejected ({code})") } else { format!("{reason} ({code})") }
}

/// Resolves stranded `sending` messages every [`SWEEP_EVERY`] until the runtime stops.
pub(crate) async fn sweep_stranded(app: Arc<App>, handle: ConnectorHandle) {
    let mut interval = tokio::time::interval(SWEEP_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        if let Err(error) = resolve_stranded(&app, &handle).await {
            tracing::warn!(%error, "could not look for visitor messages left sending");
        }
    }
}

/// One sweep: hands every stranded message of a channel routed here to the outbox again (or
/// marks it expired). Returns how many it handed over or marked.
pub(crate) async fn resolve_stranded(
    app: &App,
    handle: &ConnectorHandle,
) -> Result<usize, WebchatError> {
    let now = handle.now_millis();
    let before_seq = now.saturating_sub(STRANDED_AFTER_MILLIS).saturating_mul(1_000);
    let candidates = app.messages()?.sending_before(before_seq, SWEEP_BATCH).await?;
    // Each room's channel once per sweep; only channels whose socket is here count.
    let mut channels: HashMap<String, Option<ConnectorChannelId>> = HashMap::new();
    let mut resolved = 0;
    for (room_id, message_id, seq) in candidates {
        // Older than the outbox's TTL (its key's time is at least its creation's): no outbox
        // delivers it any more. Any replica marks it, so none of them looks at it again.
        if past_ttl(seq / 1_000, now) {
            expire(app, &message_id).await?;
            resolved += 1;
            continue;
        }
        let channel = match channels.get(&room_id) {
            Some(channel) => channel.clone(),
            None => {
                let channel = app.store()?.room(&room_id).await?.and_then(|room| room.channel);
                channels.insert(room_id.clone(), channel.clone());
                channel
            }
        };
        let Some(channel) = channel.filter(|c| handle.is_routed(c)) else { continue };
        if handle.pending_messages(&channel).iter().any(|id| id.as_str() == message_id) {
            continue;
        }
        let Some((_, outbound)) = app.messages()?.outbound_of(&message_id).await? else {
            continue;
        };
        let created_at = serde_json::from_str::<ChatMessage>(&outbound)
            .ok()
            .and_then(|message| message.created_at)
            .unwrap_or(seq / 1_000);
        if past_ttl(created_at, now) {
            expire(app, &message_id).await?;
        } else {
            crate::web::requeue(handle, &channel, &message_id, &outbound, "sweep").await;
        }
        resolved += 1;
    }
    if resolved > 0 {
        tracing::info!(resolved, "visitor messages left sending were handed to the outbox again");
    }
    Ok(resolved)
}

/// Whether a message made at `created_at` is past the outbox's TTL at `now`.
fn past_ttl(created_at: u64, now: u64) -> bool {
    now >= created_at.saturating_add(DEFAULT_TTL_MS)
}

/// Marks a message `expired` and shows it.
async fn expire(app: &App, message_id: &str) -> Result<(), WebchatError> {
    let messages = app.messages()?;
    if let Some((room, updated)) =
        messages.set_status(message_id, EntryStatus::Expired, Some(EXPIRED_TEXT)).await?
    {
        app.publish(&room, updated);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::rejection_text;

    #[test]
    fn rejection_text_keeps_the_reason_and_the_code_once() {
        assert_eq!(
            rejection_text("permission_denied", "rejected permission_denied: no thanks"),
            "no thanks (permission_denied)"
        );
        assert_eq!(rejection_text("channel_busy", "busy"), "busy (channel_busy)");
        assert_eq!(rejection_text("x", ""), "rejected (x)");
    }
}
