//! The runtime state shared by every connection, behind one lock: the registered
//! `connector_id` and its lease, channels, routes, auth sessions, shared consumers. The lock is
//! never held while author code runs or while a socket is written (every guard here is taken
//! and dropped inside a synchronous block).
//!
//! - `consumers`: reference-counted shared target consumers.
//! - `lifecycle`: unregistering a channel, lease expiry and maintenance (`tick`).
//! - `ops`: the author's [`crate::ConnectorHandle`] operations (`HandleOps`) on this state.
//! - `hosts`: what the IM wiring and the Transfer Plane ask of this state.

mod consumers;
mod hosts;
mod lifecycle;
mod ops;

pub(crate) use consumers::Consumers;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use xagent_protocol_types::{
    AuthSessionId, AuthStatus, Clock, Connection, ConnectionDescriptor, ConnectionStatus,
    ConnectorChannelId, ConnectorId, DescriptorPush, DescriptorTool, FlowId, Packet,
    PermissionState, ProfileId, Secret, TargetType, ToolId, ToolStatus,
};

use crate::config::RuntimeConfig;
use crate::connector::Connector;
use crate::ids;
use crate::im::TryQueue;
use crate::storage::{ChannelRecord, Storage, StorageError};

/// Something to write on a socket.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// A packet.
    Packet(Packet),
    /// A packet whose successful write is reported.
    Tracked(Packet, tokio::sync::oneshot::Sender<bool>),
    /// Close the socket with a code and reason.
    Close(u16, String),
}

/// Where a channel's packets go right now.
#[derive(Clone, Debug)]
pub(crate) struct Route {
    pub(crate) socket: u64,
    pub(crate) tx: mpsc::Sender<Outgoing>,
    pub(crate) profiles: Vec<ProfileId>,
}

/// One open auth session.
#[derive(Clone, Debug)]
pub(crate) struct AuthSession {
    pub(crate) channel: ConnectorChannelId,
    pub(crate) flow_id: FlowId,
    pub(crate) status: AuthStatus,
    pub(crate) created_at: u64,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) connector_id: Option<ConnectorId>,
    pub(crate) live_sockets: HashSet<u64>,
    pub(crate) offline_since: Option<u64>,
    pub(crate) channels: HashMap<ConnectorChannelId, ChannelRecord>,
    pub(crate) routes: HashMap<ConnectorChannelId, Route>,
    pub(crate) auth_sessions: HashMap<AuthSessionId, AuthSession>,
    pub(crate) consumers: Consumers,
    pub(crate) next_socket: u64,
}

impl State {
    /// Puts an unbound channel back to `created` when no sign-in attempt is pending on it.
    pub(crate) fn revert_authenticating(&mut self, channel: &ConnectorChannelId) {
        let pending_left =
            self.auth_sessions.values().any(|s| &s.channel == channel && !s.status.is_final());
        if let Some(record) = self.channels.get_mut(channel)
            && record.binding.is_none()
            && !pending_left
        {
            record.status = ConnectionStatus::Created;
        }
    }
}

/// How one Card Tool shows in a channel's Descriptor.
enum ToolView<'a> {
    /// As the author (or the device gate) reported it.
    Reported(&'a DescriptorTool),
    /// Unavailable: the channel is not signed in, or not connected.
    Unusable {
        /// Whether the channel has a binding.
        signed_in: bool,
    },
    /// Available (signed in and connected, nothing reported).
    Available,
}

pub(crate) struct Shared {
    pub(crate) def: Connector,
    pub(crate) device: Option<crate::device::DeviceRuntime>,
    pub(crate) config: RuntimeConfig,
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) api_key: Option<Secret>,
    pub(crate) state: Mutex<State>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) tasks: TaskTracker,
    pub(crate) im: Option<crate::im::ImState>,
    pub(crate) tool_calls: crate::tool_calls::ToolCalls,
    pub(crate) files: Option<xagent_file_transfer::FileStore>,
    pub(crate) files_upload_limit: u64,
}

impl Shared {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    /// The `target_type` of a channel with `profiles` enabled: the target type of those
    /// Profiles (Device Profile rule, for every Card shape), else the Card's first.
    pub(crate) fn target_type(&self, profiles: &[ProfileId]) -> TargetType {
        let declared = &self.def.card.supports.target_types;
        xagent_profile_device::channel_target_type(profiles, declared).unwrap_or_else(|error| {
            tracing::warn!(%error, "no target type fits the channel's Profiles; using the Card's first");
            declared.first().cloned().unwrap_or(TargetType::Im)
        })
    }

    /// The Descriptor of a channel as seen with `profiles` enabled.
    pub(crate) fn descriptor_for(
        &self,
        record: &ChannelRecord,
        profiles: &[ProfileId],
    ) -> ConnectionDescriptor {
        let target = record
            .binding
            .as_ref()
            .map_or_else(|| self.def.unbound_target.clone(), |b| b.target.clone());
        let profiles = if profiles.is_empty() {
            self.def.card.supports.profiles.clone()
        } else {
            profiles.to_vec()
        };
        let connection = Connection::new(
            self.def.card.connector_card_id.clone(),
            record.connector_id.clone(),
            record.id.clone(),
            self.target_type(&profiles),
            profiles,
            record.status.clone(),
        );
        let tools = self
            .def
            .card
            .tools
            .iter()
            .map(|tool| match self.tool_view(record, &tool.tool_id) {
                ToolView::Reported(reported) => reported.clone(),
                ToolView::Unusable { signed_in } => {
                    let reason = if signed_in {
                        "the channel is not connected"
                    } else {
                        "sign in to the target system first"
                    };
                    let permission = if signed_in {
                        PermissionState::Unknown
                    } else {
                        PermissionState::RequiresReauth
                    };
                    DescriptorTool::new(tool.tool_id.clone(), ToolStatus::Unavailable)
                        .with_permission(permission)
                        .with_reason(reason)
                }
                ToolView::Available => DescriptorTool::available(tool.tool_id.clone()),
            })
            .collect();
        ConnectionDescriptor::new(connection, target).with_tools(tools)
    }

    /// How a Card Tool shows in a channel's Descriptor: the one rule behind
    /// [`Shared::descriptor_for`] and [`Shared::is_tool_available`].
    fn tool_view<'a>(&self, record: &'a ChannelRecord, tool_id: &ToolId) -> ToolView<'a> {
        let signed_in = record.binding.is_some();
        let usable = signed_in
            && matches!(record.status, ConnectionStatus::Connected | ConnectionStatus::Degraded);
        // A device Tool's availability follows its device's binding state, whatever the
        // channel's status (a permission loss shows as `denied_by_target`).
        if signed_in
            && let Some(projected) = record.tool_overrides.get(tool_id)
            && self.device.as_ref().is_some_and(|d| d.covers(tool_id))
        {
            return ToolView::Reported(projected);
        }
        if !usable {
            return ToolView::Unusable { signed_in };
        }
        match record.tool_overrides.get(tool_id) {
            Some(reported) => ToolView::Reported(reported),
            None => ToolView::Available,
        }
    }

    /// Whether a Card Tool is `available` in the channel's Descriptor, decided without
    /// building the Descriptor (the per-call check of `tool.invoke`).
    pub(crate) fn is_tool_available(&self, record: &ChannelRecord, tool_id: &ToolId) -> bool {
        self.def.card.tools.iter().any(|tool| &tool.tool_id == tool_id)
            && match self.tool_view(record, tool_id) {
                ToolView::Reported(reported) => reported.status == ToolStatus::Available,
                ToolView::Unusable { .. } => false,
                ToolView::Available => true,
            }
    }

    /// The Descriptor of a channel with the Profiles of its current route (or the Card's).
    pub(crate) fn current_descriptor(
        &self,
        channel: &ConnectorChannelId,
    ) -> Option<ConnectionDescriptor> {
        let state = self.state();
        let record = state.channels.get(channel)?;
        let profiles = state.routes.get(channel).map(|r| r.profiles.clone()).unwrap_or_default();
        Some(self.descriptor_for(record, &profiles))
    }

    /// Sends a packet on the channel's route, if it has one. Returns false when not routed.
    pub(crate) async fn send_on_route(&self, channel: &ConnectorChannelId, packet: Packet) -> bool {
        let tx = self.state().routes.get(channel).map(|r| r.tx.clone());
        match tx {
            Some(tx) => tx.send(Outgoing::Packet(packet)).await.is_ok(),
            None => false,
        }
    }

    /// Sends a packet on the route and waits until it was written (or refused).
    /// Queues a packet on a channel's route without waiting: a full write queue (a peer that
    /// stopped reading) is reported instead of waited on, so one stalled socket cannot hold up
    /// delivery to the others. The receiver reports whether the write succeeded.
    pub(crate) fn try_queue_tracked(
        &self,
        channel: &ConnectorChannelId,
        packet: Packet,
    ) -> TryQueue {
        let tx = self.state().routes.get(channel).map(|r| r.tx.clone());
        let Some(tx) = tx else { return TryQueue::NotRouted };
        let (done, written) = tokio::sync::oneshot::channel();
        match tx.try_send(Outgoing::Tracked(packet, done)) {
            Ok(()) => TryQueue::Queued(written),
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => TryQueue::Full,
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => TryQueue::NotRouted,
        }
    }

    pub(crate) fn packet(&self, packet: Packet) -> Packet {
        packet.time(self.now())
    }

    /// Pushes the channel's Descriptor when it is routed.
    pub(crate) async fn push_descriptor(&self, channel: &ConnectorChannelId) -> bool {
        let Some(descriptor) = self.current_descriptor(channel) else { return false };
        let packet = self
            .packet(Packet::with_payload(ids::packet_id(), DescriptorPush::new(descriptor)))
            .channel(channel.clone());
        self.send_on_route(channel, packet).await
    }

    pub(crate) fn save_channel(&self, record: &ChannelRecord) -> Result<(), StorageError> {
        self.storage.save_channel(record)
    }
}
