//! Replicas of one Connector sharing one database (a storage with a [`Cluster`]).
//!
//! - **The data-plane lease.** The replica xAgent's `/ws` reaches takes the lease at hello
//!   (from whoever held it: xAgent keeps one data plane, so its newest socket is the one that
//!   counts) and gets a new fencing number, which [`ClusterStorage`] puts in front of every
//!   submission from then on. It renews the lease every second; when another replica takes
//!   it (heard at once through the database, or found when a renewal fails) or when it cannot
//!   renew for [`LEASE_VALID_MS`], it closes its sockets: a replica that lost the lease can
//!   neither deliver nor acknowledge, and its own late commits fail in the database.
//! - **The view of shared rows.** Channel rows and outbox records written on one replica wake
//!   the others (a `NOTIFY` in the writing transaction): a replica re-reads the channel, and
//!   the one holding the channel's socket adopts the new outbox records and sends them. After
//!   the notification stream broke (or a subscriber lagged) everything is read again.
//! - **The offline lease** is one fact for the whole cluster: the data-plane lease row says
//!   since when nobody holds it, and exactly one replica claims the cleanup when it ran out.
//! - **Author broadcasts** ([`crate::ConnectorHandle::broadcast`]) reach every replica's
//!   subscribers.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use xagent_protocol_types::{ConnectorChannelId, ConnectorId};

mod wakeups;

use super::Shared;
use crate::handle::Broadcast;
use crate::storage::{Cluster, ClusterEvent, ClusterStorage, DATA_PLANE_LEASE, StorageError};
use wakeups::drain_outbox_wakeups;

/// How long one renewal keeps the data-plane lease: a replica that cannot renew for this long
/// closes its sockets (xAgent reconnects, through the load balancer, to another replica).
pub(crate) const LEASE_VALID_MS: u64 = 5_000;

/// How often the holder renews the data-plane lease.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// The close code of a socket this replica can no longer serve (WebSocket "try again later").
pub(crate) const CLOSE_TRY_AGAIN_LATER: u16 = 1013;

/// The cluster side of the runtime.
pub(crate) struct ClusterRuntime {
    pub(crate) cluster: Arc<dyn Cluster>,
    /// The runtime's storage (the same object as `Shared::storage`), to set the fence.
    pub(crate) storage: Arc<ClusterStorage>,
    holding: std::sync::Mutex<Holding>,
    /// Wakes the lease keeper when a replicated consumer is newly wanted here.
    pub(crate) consumers_wanted: tokio::sync::Notify,
    /// The fencing number whose own lease notice this replica has heard back: from then on
    /// records carried in wake-ups may be taken as they are.
    carried_trusted: std::sync::atomic::AtomicU64,
}

/// The data-plane lease as this replica holds it.
#[derive(Default)]
struct Holding {
    /// Its fencing number; 0 while not held.
    fence: u64,
    /// Until when (injected clock) the last renewal keeps it.
    valid_until: u64,
    /// Why the sockets were last closed, for their close frames.
    lost_because: Option<String>,
}

impl ClusterRuntime {
    pub(crate) fn new(cluster: Arc<dyn Cluster>, storage: Arc<ClusterStorage>) -> Self {
        Self {
            cluster,
            storage,
            holding: std::sync::Mutex::new(Holding::default()),
            consumers_wanted: tokio::sync::Notify::new(),
            carried_trusted: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The fencing number from whose own lease notice on carried records are trusted.
    fn carried_trusted_from(&self) -> u64 {
        self.carried_trusted.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn trust_carried_from(&self, fence: u64) {
        self.carried_trusted.store(fence, std::sync::atomic::Ordering::SeqCst);
    }

    fn holding(&self) -> std::sync::MutexGuard<'_, Holding> {
        self.holding.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The fencing number this replica holds the data plane with (0: none).
    pub(crate) fn fence(&self) -> u64 {
        self.holding().fence
    }

    /// Why this replica's sockets were closed last (for the close frame).
    pub(crate) fn lost_because(&self) -> Option<String> {
        self.holding().lost_because.clone()
    }
}

impl Shared {
    /// At hello on a replica: takes the data-plane lease and reads the shared rows this
    /// replica is about to serve (the `connector_id`, every channel) as they are now.
    pub(crate) async fn take_data_plane(self: &Arc<Self>) -> Result<(), StorageError> {
        let Some(cluster) = &self.cluster else { return Ok(()) };
        let now = self.now();
        let fence = cluster
            .cluster
            .acquire(DATA_PLANE_LEASE, true, now, LEASE_VALID_MS)
            .await?
            .ok_or_else(|| StorageError::new("take the data plane", "the lease was refused"))?;
        {
            let mut holding = cluster.holding();
            holding.fence = fence;
            holding.valid_until = now.saturating_add(LEASE_VALID_MS);
            holding.lost_because = None;
        }
        cluster.storage.set_fence(fence);
        // Consumers that follow the data plane start here now.
        cluster.consumers_wanted.notify_one();
        tracing::info!(replica = cluster.cluster.replica(), fence, "took the data plane");
        self.reread_all().await?;
        // The devices of the channels this replica now serves are asked afresh here.
        self.restore_devices(true);
        Ok(())
    }

    /// Reads the `connector_id` and every channel again (after hello, after a broken
    /// notification stream); routes are kept.
    async fn reread_all(&self) -> Result<(), StorageError> {
        let connector_id = self.storage.load_connector_id().await?;
        let records = self.storage.load_channels().await?;
        let mut state = self.state();
        // The database's fact, cleared too (another replica's offline cleanup): a hello after it
        // mints a new one instead of reusing one the database no longer holds.
        state.connector_id = connector_id;
        let stored: std::collections::HashSet<ConnectorChannelId> =
            records.iter().map(|r| r.id.clone()).collect();
        let gone: Vec<ConnectorChannelId> = state
            .channels
            .keys()
            .filter(|id| !stored.contains(*id) && state.route(id).is_none())
            .cloned()
            .collect();
        for id in gone {
            state.remove_channel(&id);
        }
        for record in records {
            state.refresh_channel(record);
        }
        Ok(())
    }

    /// Stops serving the data plane: the fence is dropped and every socket closes with
    /// `reason` (xAgent reconnects through the load balancer).
    fn lose_data_plane(&self, reason: &str) {
        let Some(cluster) = &self.cluster else { return };
        let stops = {
            let mut holding = cluster.holding();
            if holding.fence == 0 {
                return;
            }
            holding.fence = 0;
            holding.lost_because = Some(reason.to_owned());
            cluster.storage.set_fence(0);
            self.state().socket_stops.values().cloned().collect::<Vec<_>>()
        };
        tracing::warn!(
            replica = cluster.cluster.replica(),
            reason,
            "lost the data plane; closing its sockets"
        );
        for stop in stops {
            stop.cancel();
        }
    }

    /// The last socket closed: the lease is released, so the offline lease counts from now.
    pub(crate) fn release_data_plane(self: &Arc<Self>) {
        let Some(cluster) = &self.cluster else { return };
        let fence = {
            let mut holding = cluster.holding();
            std::mem::take(&mut holding.fence)
        };
        if fence == 0 {
            return;
        }
        cluster.storage.set_fence(0);
        cluster.consumers_wanted.notify_one();
        let shared = Arc::clone(self);
        self.tasks.spawn(async move {
            let Some(cluster) = &shared.cluster else { return };
            if let Err(error) = cluster.cluster.release(DATA_PLANE_LEASE, fence, shared.now()).await
            {
                tracing::warn!(%error, "could not release the data plane; it runs out by itself");
            }
        });
    }

    /// Renews the data-plane lease every second while held, and keeps the replicated
    /// consumers' leases, until shutdown.
    pub(crate) async fn keep_lease(self: Arc<Self>) {
        let Some(cluster) = &self.cluster else { return };
        let mut interval = tokio::time::interval(RENEW_EVERY);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                _ = interval.tick() => {}
                () = cluster.consumers_wanted.notified() => {}
            }
            self.keep_consumers().await;
            let fence = cluster.fence();
            if fence == 0 {
                continue;
            }
            let now = self.now();
            match cluster.cluster.renew(DATA_PLANE_LEASE, fence, now, LEASE_VALID_MS).await {
                Ok(true) => {
                    let mut holding = cluster.holding();
                    if holding.fence == fence {
                        holding.valid_until = now.saturating_add(LEASE_VALID_MS);
                    }
                }
                Ok(false) => self.lose_data_plane("another replica took the data plane"),
                Err(error) => {
                    let valid_until = cluster.holding().valid_until;
                    tracing::warn!(%error, "could not renew the data plane lease");
                    if self.now() >= valid_until {
                        self.lose_data_plane(
                            "this replica cannot reach its database; reconnect to another",
                        );
                    }
                }
            }
        }
    }

    /// Renews the lease of every replicated consumer running here (stopping one whose lease
    /// was lost or could not be renewed: another replica may take it within the lease's
    /// validity) and tries for the lease of every one wanted here that runs nowhere.
    async fn keep_consumers(&self) {
        let Some(cluster) = &self.cluster else { return };
        let wanted = self.state().consumers.wanted();
        let holds_data_plane = cluster.fence() != 0;
        for crate::handle::consumers::Wanted { key, running, with_data_plane } in wanted {
            let name = crate::handle::consumers::lease_name(&key);
            let now = self.now();
            if with_data_plane && !holds_data_plane {
                // It follows the data plane: stop it here and let the new holder have it now.
                if let Some(fence) = running {
                    let stop = self.state().consumers.lost(&key, fence);
                    if let Some(stop) = stop {
                        stop();
                    }
                    if let Err(error) = cluster.cluster.release(&name, fence, now).await {
                        tracing::warn!(%error, consumer = key, "could not release a consumer's lease; it runs out by itself");
                    }
                }
                continue;
            }
            match running {
                Some(fence) => {
                    let kept = cluster.cluster.renew(&name, fence, now, LEASE_VALID_MS).await;
                    if !matches!(kept, Ok(true)) {
                        tracing::warn!(
                            consumer = key,
                            "lost a replicated consumer's lease; stopping it here"
                        );
                        let stop = self.state().consumers.lost(&key, fence);
                        if let Some(stop) = stop {
                            stop();
                        }
                    }
                }
                None => {
                    let won = match cluster.cluster.acquire(&name, false, now, LEASE_VALID_MS).await
                    {
                        Ok(won) => won,
                        Err(error) => {
                            tracing::warn!(%error, consumer = key, "could not try for a consumer's lease");
                            None
                        }
                    };
                    let Some(fence) = won else { continue };
                    let Some(start) = self.state().consumers.start_of(&key) else { continue };
                    let started =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| start()));
                    let Ok(stop) = started else {
                        tracing::error!(
                            consumer = key,
                            "starting a replicated consumer panicked; contained"
                        );
                        continue;
                    };
                    tracing::info!(consumer = key, fence, "runs a replicated consumer here");
                    let surplus = self.state().consumers.started(&key, fence, stop);
                    if let Some(stop) = surplus {
                        stop();
                    }
                }
            }
        }
    }

    /// Follows the other replicas until shutdown: re-reads channels they wrote, adopts outbox
    /// records they wrote for channels routed here, hands broadcasts to the author, stops
    /// serving when another replica took the data plane.
    pub(crate) async fn follow_cluster(self: Arc<Self>) {
        let Some(cluster) = &self.cluster else { return };
        let mut events = cluster.cluster.subscribe();
        let mut next = None;
        loop {
            let event = match next.take() {
                Some(event) => event,
                None => tokio::select! {
                    () = self.shutdown.cancelled() => return,
                    event = events.recv() => event,
                },
            };
            match event {
                Ok(event @ (ClusterEvent::Outbox(_) | ClusterEvent::OutboxRecords { .. })) => {
                    // Under load wake-ups queue up: one read per channel serves all of them.
                    let (wanted, after) = drain_outbox_wakeups(&mut events, event, |b| {
                        let _ = self.broadcasts.send(b);
                    });
                    next = after;
                    // Records carried in a wake-up are what was committed; they are taken as
                    // they are only once this replica's own lease notice has come through the
                    // same stream: every wake-up after it was committed after the take-over,
                    // so no earlier holder can have delivered its records since.
                    let fence = cluster.fence();
                    let trusted = fence != 0 && cluster.carried_trusted_from() == fence;
                    if let Some(im) = &self.im {
                        // The channels' reads are independent: all at once.
                        let shared = &self;
                        futures_util::future::join_all(wanted.into_iter().map(|want| {
                            let carried = if trusted { want.records } else { Vec::new() };
                            async move {
                                im.adopt(shared, &want.channel, want.ids.as_deref(), carried).await;
                            }
                        }))
                        .await;
                    }
                }
                Ok(ClusterEvent::Channel(channel)) => self.reread_channel(&channel).await,
                Ok(ClusterEvent::DataPlaneTaken { fence, replica }) => {
                    let mine = cluster.fence();
                    if replica == cluster.cluster.replica() {
                        // Its own take-over (perhaps heard before `take_data_plane` noted the
                        // number: the check where carried records are used compares).
                        cluster.trust_carried_from(fence);
                    } else if mine != 0 && fence > mine {
                        self.lose_data_plane("another replica took the data plane");
                    }
                }
                Ok(ClusterEvent::Broadcast { topic, message }) => {
                    let _ = self.broadcasts.send(Broadcast { topic, message });
                }
                Ok(ClusterEvent::Resync) | Err(RecvError::Lagged(_)) => self.resync().await,
                Err(RecvError::Closed) => return,
            }
        }
    }

    /// Everything may have been missed: read every channel again, and adopt the outbox records
    /// of every channel routed here.
    async fn resync(self: &Arc<Self>) {
        if let Err(error) = self.reread_all().await {
            tracing::warn!(%error, "could not read the shared channels again");
        }
        let routed: Vec<ConnectorChannelId> = {
            let state = self.state();
            state.channels.keys().filter(|id| state.route(id).is_some()).cloned().collect()
        };
        if let Some(im) = &self.im {
            for channel in routed {
                im.adopt(self, &channel, None, Vec::new()).await;
            }
        }
    }

    /// Another replica wrote (or deleted) the channel's row: take it as stored, and push its
    /// Descriptor when the channel is routed here.
    async fn reread_channel(self: &Arc<Self>, channel: &ConnectorChannelId) {
        let record = match self.storage.load_channel(channel).await {
            Ok(record) => record,
            Err(error) => {
                tracing::warn!(%error, %channel, "could not read a channel another replica wrote");
                return;
            }
        };
        let (routed, bound, unbound) = {
            let mut state = self.state();
            let was_bound = state.channels.get(channel).is_some_and(|c| c.binding.is_some());
            match record {
                Some(record) => {
                    let binding = record.binding.clone();
                    let routed = state.refresh_channel(record);
                    let bound = binding.filter(|_| !was_bound);
                    let unbound = was_bound
                        && state.channels.get(channel).is_some_and(|c| c.binding.is_none());
                    (routed, bound, unbound)
                }
                None => {
                    state.remove_channel(channel);
                    (false, None, was_bound)
                }
            }
        };
        if unbound {
            // Signed out or unregistered elsewhere: this replica's consumers for it stop.
            let stops = self.state().consumers.release_channel(channel);
            for stop in stops {
                stop();
            }
        }
        if let Some(binding) = bound {
            // Signed in on another replica: the author hears it as a restored binding (so it
            // can want its replicated consumers here too).
            let ctx = crate::author::ChannelContext {
                channel: channel.clone(),
                binding,
                handle: self.handle(),
                state: (),
            };
            self.def.auth.bound(ctx, crate::BoundReason::Restored).await;
        }
        if routed {
            self.push_descriptor(channel).await;
        }
    }

    /// The offline lease of the whole cluster (maintenance on a replica): when nobody held the
    /// data plane for [`crate::RuntimeConfig::lease`], exactly one replica claims the cleanup
    /// and returns the `connector_id` and channels to unregister.
    pub(crate) async fn claim_expired_lease(
        &self,
        lease_ms: u64,
    ) -> Option<(Option<ConnectorId>, Vec<crate::storage::ChannelRecord>)> {
        let cluster = self.cluster.as_ref()?;
        let now = self.now();
        let lease = match cluster.cluster.lease(DATA_PLANE_LEASE).await {
            Ok(lease) => lease,
            Err(error) => {
                tracing::warn!(%error, "could not read the data plane lease");
                return None;
            }
        };
        let since = lease.vacant_since(now)?;
        if now < since.saturating_add(lease_ms) {
            return None;
        }
        match cluster.cluster.claim_vacant(DATA_PLANE_LEASE, lease.fence, now).await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(error) => {
                tracing::warn!(%error, "could not claim the offline lease's cleanup");
                return None;
            }
        }
        let connector_id = self.storage.load_connector_id().await.ok().flatten();
        let channels = match self.storage.load_channels().await {
            Ok(channels) => channels,
            Err(error) => {
                tracing::error!(%error, "could not read the channels to clean up");
                Vec::new()
            }
        };
        self.state().connector_id = None;
        Some((connector_id, channels))
    }

    /// Whether this replica can serve: `Err` with the reason when its storage does not answer.
    pub(crate) async fn ready(&self) -> Result<(), StorageError> {
        self.storage.ping().await
    }
}
