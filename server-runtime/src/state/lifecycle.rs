//! Unregistering a channel, lease expiry and periodic maintenance.

use std::sync::Arc;

use xagent_protocol_types::{AuthSessionId, ConnectorId, TargetType};

use super::{AuthSession, Shared};
use crate::author::{AuthContext, ChannelContext};
use crate::handle::StopFn;
use crate::storage::ChannelRecord;

impl Shared {
    /// Unregisters one channel: the author's sign-out cleanup, shared consumers, storage, IM
    /// state, open auth sessions.
    pub(crate) async fn unregister_channel(self: &Arc<Self>, record: ChannelRecord) {
        let channel = record.id.clone();
        let (stops, sessions): (Vec<StopFn>, Vec<(AuthSessionId, AuthSession)>) = {
            let mut state = self.state();
            state.remove_channel(&channel);
            let sessions: Vec<_> = state
                .auth_sessions
                .iter()
                .filter(|(_, s)| s.channel == channel)
                .map(|(id, s)| (id.clone(), s.clone()))
                .collect();
            for (id, _) in &sessions {
                state.auth_sessions.remove(id);
            }
            (state.consumers.release_channel(&channel), sessions)
        };
        for (auth_session_id, session) in sessions {
            if !session.status.is_final() {
                let ctx = AuthContext {
                    channel: channel.clone(),
                    flow_id: session.flow_id,
                    auth_session_id,
                    handle: self.handle(),
                    state: (),
                };
                self.def.auth.cancel(ctx).await;
            }
        }
        if let Some(binding) = record.binding {
            let ctx = ChannelContext {
                channel: channel.clone(),
                binding,
                handle: self.handle(),
                state: (),
            };
            self.def.auth.unregister(ctx).await;
        }
        for stop in stops {
            stop();
        }
        if let Some(im) = &self.im {
            im.forget_channel(&channel);
        }
        if let Some(device) = &self.device {
            device.forget(&channel);
        }
        if let Some(files) = &self.files
            && let Err(error) = files.remove_channel(&channel).await
        {
            tracing::error!(%error, %channel, "could not delete an unregistered channel's files");
        }
        if let Err(error) = self.storage.commit_delete_channel(&channel).committed().await {
            tracing::error!(%error, %channel, "could not delete an unregistered channel");
        }
        tracing::info!(%channel, "channel unregistered");
    }

    /// Puts every bound device channel in the device gate as restored (not connected until its
    /// device answers: the channel's Descriptor shows it so) and, with `check`, asks each
    /// device in the background and reports what it says. At start, and on a replica when it
    /// takes the data plane (the devices are asked by the replica serving their Tools).
    pub(crate) fn restore_devices(self: &Arc<Self>, check: bool) {
        let Some(device) = &self.device else { return };
        let restored: Vec<ChannelContext> = {
            let mut state = self.state();
            let mut restored = Vec::new();
            for record in state.channels.values_mut() {
                // Only device channels have a device (an IM channel of a Card with both has none).
                let Some(binding) = record
                    .binding
                    .clone()
                    .filter(|b| b.target_type().is_none_or(|t| *t == TargetType::Device))
                else {
                    continue;
                };
                let Some(key) = device.code.device_key(&binding) else { continue };
                let correction = device.restore(&record.id, &key);
                device.project(record, &correction);
                restored.push(ChannelContext {
                    channel: record.id.clone(),
                    binding,
                    handle: self.handle(),
                    state: (),
                });
            }
            restored
        };
        if !check {
            return;
        }
        for ctx in restored {
            // The channel stays degraded meanwhile.
            let code = device.code.clone();
            let (channel, handle) = (ctx.channel.clone(), ctx.handle.clone());
            self.tasks.spawn(async move {
                let status = code.check(ctx).await;
                let _ = handle.device_status(&channel, status).await;
            });
        }
    }

    /// Lease expiry and periodic maintenance.
    pub(crate) async fn tick(self: &Arc<Self>) {
        let now = self.now();
        let lease = u64::try_from(self.config.lease.as_millis()).unwrap_or(u64::MAX);
        let expired = if self.cluster.is_some() {
            // One fact for the whole cluster, claimed by exactly one replica.
            self.claim_expired_lease(lease).await.map(|(id, channels)| {
                let cleared = self.storage.commit_connector_id(None);
                (id, channels, cleared)
            })
        } else {
            let mut state = self.state();
            let due = state.live_sockets.is_empty()
                && state.offline_since.is_some_and(|since| now >= since.saturating_add(lease));
            if due {
                state.offline_since = None;
                let connector_id = state.connector_id.take();
                let channels: Vec<ChannelRecord> =
                    state.channels.values().map(|c| ChannelRecord::clone(c)).collect();
                // Submitted under the lock, so a hello minting a new id commits after it.
                let cleared = self.storage.commit_connector_id(None);
                Some((connector_id, channels, cleared))
            } else {
                None
            }
        };
        if let Some((connector_id, channels, cleared)) = expired {
            tracing::info!(
                connector_id = connector_id.as_ref().map(ConnectorId::as_str),
                channels = channels.len(),
                "offline lease expired; unregistering the runtime instance"
            );
            if let Err(error) = cleared.committed().await {
                tracing::error!(%error, "could not clear the connector_id");
            }
            for record in channels {
                self.unregister_channel(record).await;
            }
        }
        // Tool-call idempotency window.
        let window = u64::try_from(self.config.tool_call_window.as_millis()).unwrap_or(u64::MAX);
        if let Err(error) = self.storage.prune_tool_calls(now.saturating_sub(window)).await {
            tracing::warn!(%error, "could not prune tool calls");
        }
        // Old auth sessions.
        let ttl = u64::try_from(self.config.auth_session_ttl.as_millis()).unwrap_or(u64::MAX);
        let stale: Vec<(AuthSessionId, AuthSession)> = {
            let mut state = self.state();
            let ids: Vec<AuthSessionId> = state
                .auth_sessions
                .iter()
                .filter(|(_, s)| now >= s.created_at.saturating_add(ttl))
                .map(|(id, _)| id.clone())
                .collect();
            let stale: Vec<(AuthSessionId, AuthSession)> = ids
                .into_iter()
                .filter_map(|id| state.auth_sessions.remove(&id).map(|s| (id, s)))
                .collect();
            // A channel whose only sign-in attempt timed out is no longer authenticating.
            for (_, session) in &stale {
                state.revert_authenticating(&session.channel);
            }
            stale
        };
        for (auth_session_id, session) in stale {
            if !session.status.is_final() {
                let ctx = AuthContext {
                    channel: session.channel,
                    flow_id: session.flow_id,
                    auth_session_id,
                    handle: self.handle(),
                    state: (),
                };
                self.def.auth.cancel(ctx).await;
            }
        }
        if let Some(im) = &self.im {
            im.maintain(self).await;
        }
    }
}
