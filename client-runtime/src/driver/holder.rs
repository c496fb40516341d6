//! The holder lease at work: a standby process tries to take the Card's lease until it gets it,
//! then reloads the channels and the outbox from the store (what the previous holder left) and
//! connects; the holder renews it, and the moment it is lost (a renewal failed or the row
//! names another holder or fencing number, or a batch was fenced) the data plane is closed and
//! the process stands by again, delivering and acknowledging nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::connection::{ClientEvent, ConnectionState, Shared, emit, fail_pending, lock};
use crate::im_state::{Holding, ImState};
use crate::lease::{HolderLease, Keeper, Verdict};
use crate::store::{LeaseRequest, LeaseState};

/// Waits until this process holds the lease and has reloaded its state under it.
pub(super) async fn take_lease(shared: &Arc<Shared>, lease: &HolderLease) -> Keeper {
    loop {
        let request = LeaseRequest {
            card: shared.config.connector_card_id.clone(),
            holder: lease.holder.clone(),
            now: shared.now(),
            ttl_ms: lease.ttl_ms(),
        };
        match shared.store.acquire_lease(&request).await {
            Ok(LeaseState::Held { fence, expires_at }) => {
                tracing::info!(card = %fence.card, holder = %fence.holder, fencing = fence.number, "took the holder lease");
                let keeper = Keeper::new(fence, expires_at);
                match reload(shared, &keeper).await {
                    Ok(()) => return keeper,
                    Err(error) => {
                        tracing::warn!(%error, "the state could not be loaded under the new lease; giving it up");
                        if let Err(error) = shared.store.release_lease(keeper.fence()).await {
                            tracing::warn!(%error, "the holder lease could not be given up; it expires by itself");
                        }
                    }
                }
            }
            Ok(LeaseState::Other { holder, .. }) => standby(shared, Some(holder)),
            Err(error) => {
                tracing::warn!(%error, "the holder lease could not be read");
                standby(shared, None);
            }
        }
        tokio::time::sleep(lease.renew_every).await;
    }
}

/// Reports standing by, once per holder seen (not on every attempt).
fn standby(shared: &Shared, holder: Option<String>) {
    let state = ConnectionState::Standby { holder };
    if *shared.state.borrow() != state {
        shared.set_state(state);
    }
}

/// Reloads what the previous holder left: the outbox (its pending messages resume once their
/// channels are reopened), a fresh idempotency set (the store answers it), the remembered
/// channels.
async fn reload(shared: &Arc<Shared>, keeper: &Keeper) -> Result<(), crate::ClientError> {
    let store = Arc::clone(&shared.store);
    let state = ImState::load(store, Holding::Held(keeper.fence().clone()), shared.now()).await?;
    let remembered = shared.store.load_channels().await.map_err(crate::ClientError::Store)?;
    {
        let mut im = shared.im.lock().await;
        let uploads = std::mem::take(&mut im.uploads);
        *im = state;
        im.uploads = uploads;
    }
    let mut channels = BTreeMap::new();
    {
        let mut directory = lock(&shared.directory);
        for channel in remembered {
            channels.insert(channel.channel.clone(), channel.channel.clone());
            directory.remember(channel.channel, channel.owner);
        }
    }
    *lock(&shared.channels) = channels;
    Ok(())
}

/// Renews the lease every `renew_every` (at once when a batch was fenced) and returns why it
/// was lost.
pub(super) async fn keep_lease(
    shared: &Arc<Shared>,
    lease: &HolderLease,
    keeper: &mut Keeper,
) -> String {
    loop {
        tokio::select! {
            () = tokio::time::sleep(lease.renew_every) => {}
            () = shared.fenced.notified() => {}
        }
        if let Verdict::Lost(reason) = keeper.check(shared.now()) {
            return reason;
        }
        // A renewal that hangs past the interval counts as failed.
        let answer = tokio::time::timeout(
            lease.renew_every,
            shared.store.renew_lease(keeper.fence(), shared.now(), lease.ttl_ms()),
        )
        .await
        .map_err(|_| format!("no answer within {} ms", lease.renew_every.as_millis()))
        .and_then(|answer| answer.map_err(|e| e.to_string()));
        if let Verdict::Lost(reason) = keeper.on_renewal(answer, shared.now()) {
            return reason;
        }
    }
}

/// The lease is lost: stop acting at once (no delivery, no ack, no write), close the socket,
/// fail what waits for an answer, and stand by.
pub(super) async fn on_lost(shared: &Arc<Shared>, reason: String) {
    tracing::warn!(%reason, "the holder lease is lost; closing the data plane");
    shared.im.lock().await.holding = Holding::Standby;
    let link = lock(&shared.link).take();
    if let Some(link) = link {
        link.close(xagent_connection::CLOSE_NORMAL, "holder lease lost").await;
    }
    fail_pending(shared);
    shared.set_state(ConnectionState::Standby { holder: None });
    emit(shared, ClientEvent::Disconnected { reason: format!("holder lease lost: {reason}") })
        .await;
}
