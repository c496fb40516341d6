//! The runtime state shared by every connection, behind one lock: the registered
//! `connector_id` and its lease, channels, routes, auth sessions, shared consumers. The lock is
//! never held while author code runs or while a socket is written (every guard here is taken
//! and dropped inside a synchronous block).
//!
//! - `descriptor`: a channel's target type, Profiles and Descriptor, and which Tools it offers.
//! - `lifecycle`: unregistering a channel, lease expiry and maintenance (`tick`).
//! - `ops`: the author's [`crate::ConnectorHandle`] operations (`HandleOps`) on this state.
//! - `hosts`: what the IM wiring and the Transfer Plane ask of this state.

mod cluster;
mod descriptor;
mod hosts;
mod lifecycle;
mod ops;

pub(crate) use crate::handle::Consumers;
pub(crate) use cluster::{CLOSE_TRY_AGAIN_LATER, ClusterRuntime};

use std::collections::{HashMap, HashSet};

use foldhash::fast::RandomState;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use xagent_protocol_types::{
    AuthSessionId, AuthStatus, Clock, ConnectionStatus, ConnectorChannelId, ConnectorId,
    DescriptorPush, FlowId, Packet, ProfileId, Secret,
};

use crate::config::RuntimeConfig;
use crate::connector::Connector;
use crate::ids;
use crate::im::TryQueue;
use crate::storage::{ChannelRecord, CommitTicket, Storage};

/// Something to write on a socket: the connection core's queue item.
pub(crate) use xagent_connection::Outgoing;

/// Where a channel's packets go right now: a socket, through that socket's [`Link`] (one
/// shared value for every channel routed on the socket, not a copy per channel).
#[derive(Clone, Debug)]
pub(crate) struct Route {
    pub(crate) socket: u64,
    pub(crate) link: Arc<Link>,
}

/// What every channel routed on one socket shares: its write queue and negotiated Profiles.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) tx: mpsc::Sender<Outgoing>,
    pub(crate) profiles: Vec<ProfileId>,
}

/// A socket's link and how many channels are routed on it (the per-socket limit).
struct SocketRoutes {
    link: Arc<Link>,
    channels: usize,
}

/// One channel in memory: its record and, while it is open on a socket, its route. One map
/// entry per channel (not one per map for records and routes, each with its own id key). The
/// record is boxed so the map's spare slots (a hash table keeps up to half of them empty after
/// it grows) cost a pointer each, not a whole record.
#[derive(Debug)]
pub(crate) struct Channel {
    pub(crate) record: Box<ChannelRecord>,
    route: Option<Route>,
}

impl std::ops::Deref for Channel {
    type Target = ChannelRecord;
    fn deref(&self) -> &ChannelRecord {
        &self.record
    }
}

impl std::ops::DerefMut for Channel {
    fn deref_mut(&mut self) -> &mut ChannelRecord {
        &mut self.record
    }
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
    pub(crate) live_sockets: HashSet<u64, RandomState>,
    pub(crate) offline_since: Option<u64>,
    /// Looked up on every packet of a channel: hashed with the seeded foldhash, not SipHash
    /// (docs/DECISIONS.md, "Hashers of internal maps").
    pub(crate) channels: HashMap<ConnectorChannelId, Channel, RandomState>,
    sockets: HashMap<u64, SocketRoutes, RandomState>,
    pub(crate) auth_sessions: HashMap<AuthSessionId, AuthSession, RandomState>,
    pub(crate) consumers: Consumers,
    pub(crate) next_socket: u64,
    /// Stops each live socket (a replica that lost the data plane closes them all).
    pub(crate) socket_stops: HashMap<u64, CancellationToken, RandomState>,
}

impl State {
    /// Adds (or replaces) a channel, without a route.
    pub(crate) fn insert_channel(&mut self, record: ChannelRecord) {
        self.remove_channel(&record.id);
        self.channels.insert(record.id.clone(), Channel { record: Box::new(record), route: None });
    }

    /// Takes a channel's record as another replica stored it, keeping its route here; true
    /// when the channel is routed here.
    pub(crate) fn refresh_channel(&mut self, record: ChannelRecord) -> bool {
        match self.channels.get_mut(&record.id) {
            Some(entry) => {
                *entry.record = record;
                entry.route.is_some()
            }
            None => {
                self.insert_channel(record);
                false
            }
        }
    }

    /// Removes a channel and its route.
    pub(crate) fn remove_channel(&mut self, channel: &ConnectorChannelId) -> Option<ChannelRecord> {
        self.clear_route(channel);
        self.channels.remove(channel).map(|c| *c.record)
    }

    /// The channel's route, when it is open on a socket.
    pub(crate) fn route(&self, channel: &ConnectorChannelId) -> Option<&Route> {
        self.channels.get(channel)?.route.as_ref()
    }

    /// Routes an existing channel on `socket`; `link` makes the socket's shared link when it
    /// has none yet. False when the channel does not exist.
    pub(crate) fn set_route(
        &mut self,
        channel: &ConnectorChannelId,
        socket: u64,
        link: impl FnOnce() -> Link,
    ) -> bool {
        if !self.channels.contains_key(channel) {
            return false;
        }
        self.clear_route(channel);
        let routes = self
            .sockets
            .entry(socket)
            .or_insert_with(|| SocketRoutes { link: Arc::new(link()), channels: 0 });
        routes.channels += 1;
        let route = Route { socket, link: Arc::clone(&routes.link) };
        if let Some(entry) = self.channels.get_mut(channel) {
            entry.route = Some(route);
        }
        true
    }

    /// Removes the channel's route; returns it.
    pub(crate) fn clear_route(&mut self, channel: &ConnectorChannelId) -> Option<Route> {
        let route = self.channels.get_mut(channel)?.route.take()?;
        if let Some(routes) = self.sockets.get_mut(&route.socket) {
            routes.channels = routes.channels.saturating_sub(1);
            if routes.channels == 0 {
                self.sockets.remove(&route.socket);
            }
        }
        Some(route)
    }

    /// How many channels are routed on `socket`.
    pub(crate) fn routed_on(&self, socket: u64) -> usize {
        self.sockets.get(&socket).map_or(0, |routes| routes.channels)
    }

    /// Removes every route on `socket` (it closed); returns the channels that lost theirs.
    pub(crate) fn detach_socket(&mut self, socket: u64) -> Vec<ConnectorChannelId> {
        if self.sockets.remove(&socket).is_none() {
            return Vec::new();
        }
        let mut lost = Vec::new();
        for (id, entry) in &mut self.channels {
            if entry.route.as_ref().is_some_and(|r| r.socket == socket) {
                entry.route = None;
                lost.push(id.clone());
            }
        }
        lost
    }

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
    /// The Card and version window every connection's session is judged by (the connection
    /// core's one home of them), read when a connection starts.
    pub(crate) admission: xagent_connection::Admission,
    /// Replicas sharing the database, when the storage offers a cluster.
    pub(crate) cluster: Option<ClusterRuntime>,
    /// The author's broadcasts, as heard on this replica (its own and the others').
    pub(crate) broadcasts: tokio::sync::broadcast::Sender<crate::handle::Broadcast>,
    /// Held while the runtime lives: its state directory is this process's.
    pub(crate) _state_lock: Option<crate::state_lock::StateDirLock>,
    /// True while the listener accepts connections (for `/readyz`).
    pub(crate) accepting: std::sync::atomic::AtomicBool,
}

impl Shared {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    /// Sends a packet on the channel's route, if it has one. Returns false when not routed.
    pub(crate) async fn send_on_route(&self, channel: &ConnectorChannelId, packet: Packet) -> bool {
        let tx = self.state().route(channel).map(|r| r.link.tx.clone());
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
        let tx = self.state().route(channel).map(|r| r.link.tx.clone());
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

    /// Queues a channel record's write. Call it under the state lock that made the change, so
    /// writes commit in the order of the changes; await the ticket after releasing the lock.
    pub(crate) fn commit_channel(&self, record: &ChannelRecord) -> CommitTicket {
        self.storage.commit_channel(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> ChannelRecord {
        ChannelRecord {
            id: ConnectorChannelId::new(id),
            connector_id: ConnectorId::new("conn_test"),
            status: ConnectionStatus::Created,
            binding: None,
            tool_overrides: Default::default(),
            created_at: 0,
        }
    }

    fn link() -> Link {
        Link { tx: mpsc::channel(1).0, profiles: vec![ProfileId::new("xagent.im.v2")] }
    }

    #[test]
    fn routes_share_one_link_per_socket_and_count_per_socket() {
        let mut state = State::default();
        for id in ["a", "b", "c"] {
            state.insert_channel(record(id));
        }
        let (a, b, c) = (
            ConnectorChannelId::new("a"),
            ConnectorChannelId::new("b"),
            ConnectorChannelId::new("c"),
        );
        assert!(state.set_route(&a, 1, link));
        assert!(state.set_route(&b, 1, || unreachable!("socket 1 has its link")));
        assert!(state.set_route(&c, 2, link));
        assert!(!state.set_route(&ConnectorChannelId::new("missing"), 1, link));
        let (ra, rb) = (state.route(&a).unwrap(), state.route(&b).unwrap());
        assert!(Arc::ptr_eq(&ra.link, &rb.link), "one link for the socket's channels");
        assert_eq!((state.routed_on(1), state.routed_on(2)), (2, 1));
        // Re-routing moves the count; closing a channel's route frees its place.
        assert!(state.set_route(&b, 2, link));
        assert_eq!((state.routed_on(1), state.routed_on(2)), (1, 2));
        assert_eq!(state.clear_route(&a).map(|r| r.socket), Some(1));
        assert_eq!(state.routed_on(1), 0);
        // A closed socket loses its routes; the records stay.
        let mut lost = state.detach_socket(2);
        lost.sort();
        assert_eq!(lost, vec![b.clone(), c.clone()]);
        assert!(state.route(&b).is_none() && state.route(&c).is_none());
        assert_eq!(state.routed_on(2), 0);
        assert_eq!(state.channels.len(), 3);
        // Removing a routed channel releases its place on the socket.
        assert!(state.set_route(&a, 3, link));
        assert_eq!(state.remove_channel(&a).map(|r| r.id), Some(a));
        assert_eq!(state.routed_on(3), 0);
    }
}
