//! A channel's outbox over its life: reopened (redelivery), its route lost, adopted from another
//! replica, forgotten; and the maintenance ticks that redeliver what is due.

use std::sync::Arc;

use xagent_profile_im::PendingRecord;
use xagent_protocol_types::{ConnectorChannelId, MessageId};

use super::{ImHost, ImState};

impl ImState {
    pub(crate) async fn on_channel_open<H: ImHost>(
        &self,
        shared: &Arc<H>,
        channel: &ConnectorChannelId,
    ) {
        // A replica reads the channel's records as they are now: other replicas may have
        // written, delivered or expired some since it last held the channel.
        let stored = if self.replicated {
            match shared.storage().load_pending_of(channel).await {
                Ok(stored) => Some(stored),
                Err(error) => {
                    tracing::warn!(%error, %channel, "could not load the channel's outbox; it is read again on the next wake-up");
                    None
                }
            }
        } else {
            None
        };
        let (result, events) = {
            let mut inner = self.inner();
            let events = inner.take_events();
            if let Some(stored) = stored {
                inner.outbox.forget_channel(channel);
                if let Err(error) = inner.outbox.adopt(stored, shared.now()) {
                    tracing::warn!(%error, "outbox adopt failed");
                }
            }
            let result = inner.outbox.on_channel_reopened(channel, shared.now());
            Self::submit_in_background(shared, &mut inner);
            (result, events)
        };
        self.publish(events);
        if let Err(error) = result {
            tracing::warn!(%error, "outbox reopen failed");
        }
        self.pump(shared).await;
    }

    /// The channels lost their route (socket closed, channel.close).
    /// (Their rescheduling writes, if any, go with the next commit.) A replica forgets them:
    /// whoever opens them next reads their records again.
    pub(crate) fn on_routes_lost(&self, channels: &[ConnectorChannelId], now: u64) {
        let mut inner = self.inner();
        for channel in channels {
            if self.replicated {
                inner.outbox.forget_channel(channel);
            } else if let Err(error) = inner.outbox.on_channel_closed(channel, now) {
                tracing::warn!(%error, "outbox close failed");
            }
        }
    }

    /// Another replica wrote outbox records of `channel`: when it is routed here, the ones
    /// not queued yet join its queue and the pump sends them. `carried` are records the
    /// wake-up brought as committed: those this outbox neither holds nor finished lately are
    /// taken as they are; the rest of `ids` is read (all of the channel's when `ids` is
    /// `None`).
    pub(crate) async fn adopt<H: ImHost>(
        &self,
        shared: &Arc<H>,
        channel: &ConnectorChannelId,
        ids: Option<&[MessageId]>,
        carried: Vec<PendingRecord>,
    ) {
        if !shared.is_routed(channel) {
            return;
        }
        // The carried records join at once, in the same lock as the look at what is held and
        // finished (a message delivered in between cannot come back).
        let (to_read, joined, events) = {
            let mut inner = self.inner();
            let events = inner.take_events();
            match ids {
                None => (None, 0, events),
                Some(ids) => {
                    let held: std::collections::HashSet<MessageId> =
                        inner.outbox.pending_ids(channel).into_iter().collect();
                    let new: Vec<&MessageId> =
                        ids.iter().filter(|id| !held.contains(*id)).collect();
                    // One this outbox finished lately is read instead: the database says
                    // whether it was queued again since (its row is gone otherwise).
                    let usable: Vec<PendingRecord> = carried
                        .into_iter()
                        .filter(|r| {
                            &r.channel == channel
                                && new.contains(&&r.message_id)
                                && !inner.finished.contains(channel, &r.message_id)
                        })
                        .collect();
                    let taken: std::collections::HashSet<MessageId> =
                        usable.iter().map(|r| r.message_id.clone()).collect();
                    let to_read: Vec<MessageId> =
                        new.into_iter().filter(|id| !taken.contains(*id)).cloned().collect();
                    // Routed still? (The route is looked at again under the lock.)
                    let joined = if usable.is_empty() || !shared.is_routed(channel) {
                        Ok(0)
                    } else {
                        let joined = inner.outbox.adopt(usable, shared.now());
                        Self::submit_in_background(shared, &mut inner);
                        joined
                    };
                    let joined = joined.unwrap_or_else(|error| {
                        tracing::warn!(%error, "outbox adopt failed");
                        0
                    });
                    (Some(to_read), joined, events)
                }
            }
        };
        self.publish(events);
        let read = match to_read {
            Some(ids) if ids.is_empty() => Ok(Vec::new()),
            Some(ids) => shared.storage().load_pending_ids(channel, &ids).await,
            None => shared.storage().load_pending_of(channel).await,
        };
        let stored = match read {
            Ok(stored) => stored,
            Err(error) => {
                tracing::warn!(%error, %channel, "could not load outbox records another replica wrote; read again on the next wake-up");
                Vec::new()
            }
        };
        let read_joined = if stored.is_empty() {
            Ok(0)
        } else {
            let mut inner = self.inner();
            // Routed still (the lock is not held across the read)?
            if !shared.is_routed(channel) {
                return;
            }
            let joined = inner.outbox.adopt(stored, shared.now());
            Self::submit_in_background(shared, &mut inner);
            joined
        };
        match read_joined {
            Ok(n) if n + joined == 0 => {}
            Ok(_) => self.pump(shared).await,
            Err(error) => tracing::warn!(%error, "outbox adopt failed"),
        }
    }

    /// The channel's rows are deleted with the channel (`Storage::delete_channel`); the
    /// outbox's own removals go with the next commit.
    pub(crate) fn forget_channel(&self, channel: &ConnectorChannelId) {
        let mut inner = self.inner();
        if let Err(error) = inner.outbox.remove_channel(channel) {
            tracing::warn!(%error, "outbox cleanup failed");
        }
        inner.receiver.forget_channel(channel);
        inner.deltas.remove_channel(channel);
        inner.activity.remove_channel(channel);
    }

    /// Runs what the outbox has due by now (a retry whose backoff ended, an ack deadline, an
    /// expiry), and nothing when nothing is: called every [`super::DUE_CHECK_EVERY`], so a retry
    /// goes out when its backoff says, not at the next maintenance pass.
    pub(crate) async fn run_due<H: ImHost>(&self, shared: &Arc<H>) {
        let now = shared.now();
        {
            let mut inner = self.inner();
            if inner.outbox.next_wakeup() > now {
                return;
            }
            if let Err(error) = inner.outbox.maintain(now) {
                tracing::warn!(%error, "outbox maintenance failed");
            }
            Self::submit_in_background(shared, &mut inner);
        }
        self.log_events();
        self.pump(shared).await;
    }

    pub(crate) async fn maintain<H: ImHost>(&self, shared: &Arc<H>) {
        let now = shared.now();
        {
            let mut inner = self.inner();
            if let Err(error) = inner.outbox.maintain(now) {
                tracing::warn!(%error, "outbox maintenance failed");
            }
            Self::submit_in_background(shared, &mut inner);
            // The age expiry of completed ids (at most once a minute) is one statement in the
            // store; it rides the group commit, nobody waits for it.
            let expiry = inner.receiver.prune_deferred(now);
            if !expiry.is_empty() {
                let ticket = Self::submit(shared, &mut inner, expiry);
                tokio::spawn(async move {
                    if let Err(error) = ticket.committed().await {
                        tracing::warn!(%error, "idempotency expiry failed");
                    }
                });
            }
            inner.deltas.expire(now);
        }
        let cleared = self.inner().activity.expire(now);
        for (channel, action) in cleared {
            self.show(shared, &channel, action).await;
        }
        self.log_events();
        self.pump(shared).await;
    }

    /// Pending message ids of a channel (for tests and operators).
    pub(crate) fn pending(&self, channel: &ConnectorChannelId) -> Vec<MessageId> {
        self.inner().outbox.pending_ids(channel)
    }
}
