//! Live state of every room for the pages watching it: one broadcast per room carrying
//! [`RoomEvent`]s, the assistant message that is streaming right now, the activity line, and
//! whether the agent's channel is routed. Nothing here is persisted: a page that reconnects
//! gets a fresh snapshot. Messages stored by other replicas arrive through `live.rs`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::store::ChatEntry;

/// The assistant message streaming into a room (assembled deltas).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Draft {
    /// Its `message_id` (the final message replaces the draft with the same id).
    pub message_id: String,
    /// All text so far.
    pub text: String,
}

/// The activity line of a room.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Activity {
    /// `thinking` or `tool`.
    pub status: String,
    /// The Tool's name with `tool`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
}

/// What a page receives over Server-Sent Events (`data:` is this JSON, tagged by `kind`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RoomEvent {
    /// Everything the page needs after (re)connecting.
    Snapshot {
        /// Room id.
        room_id: String,
        /// Room name.
        room_name: String,
        /// Whether an agent channel is connected.
        agent_online: bool,
        /// Recent messages, oldest first.
        messages: Vec<ChatEntry>,
        /// Assistant messages streaming right now, oldest first.
        drafts: Vec<Draft>,
        /// The activity line, if shown.
        #[serde(skip_serializing_if = "Option::is_none")]
        activity: Option<Activity>,
    },
    /// A new or updated message (upsert by `message_id`).
    Message {
        /// The message.
        message: ChatEntry,
    },
    /// A streaming assistant message grew.
    Draft {
        /// The draft.
        draft: Draft,
    },
    /// The activity line changed (`None` clears it).
    Activity {
        /// The activity.
        activity: Option<Activity>,
    },
    /// The agent came online or went offline.
    Agent {
        /// Online.
        online: bool,
    },
}

#[derive(Debug)]
struct RoomLive {
    tx: broadcast::Sender<RoomEvent>,
    drafts: Vec<Draft>,
    activity: Option<Activity>,
    online: bool,
}

impl RoomLive {
    fn new() -> Self {
        Self { tx: broadcast::channel(256).0, drafts: Vec::new(), activity: None, online: false }
    }
}

/// Open event streams, counted per visitor token, per visitor address, per room and in total.
#[derive(Debug, Default)]
struct StreamCounts {
    total: usize,
    rooms: HashMap<String, usize>,
    tokens: HashMap<String, usize>,
    addresses: HashMap<IpAddr, usize>,
    /// The sessions with open streams (F4): ending one cancels every stream it holds.
    sessions: HashMap<String, LiveSession>,
    /// Where the counts are shown (the metrics listener).
    gauges: HubGauges,
}

/// A visitor session with open streams: its room and the signal that ends them.
#[derive(Debug)]
struct LiveSession {
    room: String,
    ended: CancellationToken,
}

impl StreamCounts {
    /// The end signal of `token_key`'s streams in `room` (registered with its first stream).
    fn session_signal(&mut self, room: &str, token_key: &str) -> CancellationToken {
        self.sessions
            .entry(token_key.to_owned())
            .or_insert_with(|| LiveSession {
                room: room.to_owned(),
                ended: CancellationToken::new(),
            })
            .ended
            .clone()
    }

    /// Forgets `token_key`'s signal once its last stream is gone.
    fn release_session(&mut self, token_key: &str) {
        if !self.tokens.contains_key(token_key) {
            self.sessions.remove(token_key);
        }
    }
}

fn decrement<K, Q>(map: &mut HashMap<K, usize>, key: &Q)
where
    K: std::hash::Hash + Eq + std::borrow::Borrow<Q>,
    Q: std::hash::Hash + Eq + ?Sized,
{
    if let Some(count) = map.get_mut(key) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            map.remove(key);
        }
    }
}

/// Which stream limit a new stream would pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamLimit {
    /// The visitor token holds its maximum of streams.
    Token,
    /// The visitor's address holds its maximum of streams (over all its sessions and rooms).
    Address,
    /// The room has its maximum of streams.
    Room,
    /// The Connector has its maximum of streams.
    Total,
}

/// The most streams a token, an address, a room and the Connector may hold.
#[derive(Clone, Copy, Debug)]
pub struct StreamCaps {
    /// Per visitor token.
    pub per_token: usize,
    /// Per visitor address (IPv6 per /64), whatever the session and the room.
    pub per_address: usize,
    /// Per room.
    pub per_room: usize,
    /// In total.
    pub total: usize,
}

/// One open event stream; dropping it frees its place.
#[derive(Debug)]
pub struct StreamGuard {
    counts: Arc<Mutex<StreamCounts>>,
    room: String,
    token: String,
    address: Option<IpAddr>,
    ended: CancellationToken,
}

impl StreamGuard {
    /// Cancelled the moment the stream's session ends (leave, code change): the stream
    /// selects on it and ends at once (F4).
    pub fn session_ended(&self) -> CancellationToken {
        self.ended.clone()
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        counts.total = counts.total.saturating_sub(1);
        decrement(&mut counts.rooms, self.room.as_str());
        decrement(&mut counts.tokens, self.token.as_str());
        if let Some(address) = &self.address {
            decrement(&mut counts.addresses, address);
        }
        counts.release_session(&self.token);
        counts.gauges.show(&counts);
    }
}

/// Live state of all rooms.
#[derive(Debug, Default)]
pub struct Hub {
    rooms: Mutex<HashMap<String, RoomLive>>,
    streams: Arc<Mutex<StreamCounts>>,
}

/// The metrics of the open streams: visitors' event streams and the rooms they are in.
#[derive(Debug, Clone, Default)]
pub struct HubGauges {
    /// Open event streams (chat pages with live events).
    pub streams: Option<xagent_server_runtime::AuthorGauge>,
    /// Rooms with at least one open stream.
    pub rooms: Option<xagent_server_runtime::AuthorGauge>,
}

impl HubGauges {
    fn show(&self, counts: &StreamCounts) {
        if let Some(gauge) = &self.streams {
            gauge.set(i64::try_from(counts.total).unwrap_or(i64::MAX));
        }
        if let Some(gauge) = &self.rooms {
            gauge.set(i64::try_from(counts.rooms.len()).unwrap_or(i64::MAX));
        }
    }
}

impl Hub {
    /// Takes a place for a new event stream of `token_key` (a hash of the visitor token) in
    /// `room`, from `address` (the visitor's, already reduced to its /64 for IPv6), or says
    /// which cap is reached.
    pub fn open_stream(
        &self,
        room: &str,
        token_key: &str,
        address: Option<IpAddr>,
        caps: StreamCaps,
    ) -> Result<StreamGuard, StreamLimit> {
        let mut counts = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if counts.tokens.get(token_key).copied().unwrap_or(0) >= caps.per_token {
            return Err(StreamLimit::Token);
        }
        if let Some(address) = &address
            && counts.addresses.get(address).copied().unwrap_or(0) >= caps.per_address
        {
            return Err(StreamLimit::Address);
        }
        if counts.rooms.get(room).copied().unwrap_or(0) >= caps.per_room {
            return Err(StreamLimit::Room);
        }
        if counts.total >= caps.total {
            return Err(StreamLimit::Total);
        }
        counts.total += 1;
        *counts.rooms.entry(room.to_owned()).or_default() += 1;
        *counts.tokens.entry(token_key.to_owned()).or_default() += 1;
        if let Some(address) = address {
            *counts.addresses.entry(address).or_default() += 1;
        }
        let ended = counts.session_signal(room, token_key);
        counts.gauges.show(&counts);
        Ok(StreamGuard {
            counts: Arc::clone(&self.streams),
            room: room.to_owned(),
            token: token_key.to_owned(),
            address,
            ended,
        })
    }

    /// Shows the stream counts on these gauges from now on.
    pub fn set_gauges(&self, gauges: HubGauges) {
        let mut counts = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        gauges.show(&counts);
        counts.gauges = gauges;
    }

    /// The visitor session `token_key` ended: every stream it holds ends now (F4).
    pub fn end_session(&self, token_key: &str) {
        let counts = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(session) = counts.sessions.get(token_key) {
            session.ended.cancel();
        }
    }

    /// Every visitor session of `room` ended (its access code changed): all their streams
    /// end now (F4).
    pub fn end_room_sessions(&self, room: &str) {
        let counts = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for session in counts.sessions.values().filter(|s| s.room == room) {
            session.ended.cancel();
        }
    }

    /// Open event streams in total.
    #[cfg(test)]
    pub fn open_streams(&self) -> usize {
        self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).total
    }

    fn rooms(&self) -> MutexGuard<'_, HashMap<String, RoomLive>> {
        self.rooms.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Subscribes to a room and returns the live parts of its snapshot.
    pub fn subscribe(
        &self,
        room_id: &str,
    ) -> (broadcast::Receiver<RoomEvent>, Vec<Draft>, Option<Activity>) {
        let mut rooms = self.rooms();
        let room = rooms.entry(room_id.to_owned()).or_insert_with(RoomLive::new);
        (room.tx.subscribe(), room.drafts.clone(), room.activity.clone())
    }

    fn send(&self, room_id: &str, change: impl FnOnce(&mut RoomLive) -> Option<RoomEvent>) {
        let mut rooms = self.rooms();
        let room = rooms.entry(room_id.to_owned()).or_insert_with(RoomLive::new);
        if let Some(event) = change(room) {
            // No page watching is fine.
            let _ = room.tx.send(event);
        }
    }

    /// A message was added or changed. A final assistant message ends the draft it replaces.
    pub fn message(&self, room_id: &str, message: ChatEntry) {
        self.send(room_id, |room| {
            room.drafts.retain(|d| d.message_id != message.message_id);
            Some(RoomEvent::Message { message })
        });
    }

    /// A streaming assistant message grew (at most 16 drafts are kept per room; the oldest
    /// goes first, its final message still replaces it on the page).
    pub fn draft(&self, room_id: &str, draft: Draft) {
        self.send(room_id, |room| {
            match room.drafts.iter_mut().find(|d| d.message_id == draft.message_id) {
                Some(existing) => existing.text.clone_from(&draft.text),
                None => {
                    if room.drafts.len() >= 16 {
                        room.drafts.remove(0);
                    }
                    room.drafts.push(draft.clone());
                }
            }
            Some(RoomEvent::Draft { draft })
        });
    }

    /// The activity line changed.
    pub fn activity(&self, room_id: &str, activity: Option<Activity>) {
        self.send(room_id, |room| {
            if room.activity == activity {
                return None;
            }
            room.activity = activity.clone();
            Some(RoomEvent::Activity { activity })
        });
    }

    /// Records whether the agent is online; sends an event only on a change.
    pub fn set_online(&self, room_id: &str, online: bool) {
        self.send(room_id, |room| {
            if room.online == online {
                return None;
            }
            room.online = online;
            if !online {
                room.activity = None;
            }
            Some(RoomEvent::Agent { online })
        });
    }

    /// Whether some page of this process listens to the room now. (A room this process only sent news to, with no page listening, is not watched: the
    /// other replicas' news of it need not be read.)
    pub fn is_watched(&self, room_id: &str) -> bool {
        self.rooms().get(room_id).is_some_and(|room| room.tx.receiver_count() > 0)
    }

    /// Rooms some page of this process is subscribed to now.
    pub fn watched_rooms(&self) -> Vec<String> {
        self.rooms()
            .iter()
            .filter(|(_, room)| room.tx.receiver_count() > 0)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Author, EntryStatus};

    fn final_entry(id: &str) -> ChatEntry {
        ChatEntry {
            message_id: id.into(),
            author: Author::Assistant,
            text: Some("done".into()),
            files: vec![],
            status: EntryStatus::Shown,
            error: None,
            client_id: None,
            created_at: 1,
        }
    }

    #[test]
    fn a_room_is_watched_only_while_a_page_listens() {
        let hub = Hub::default();
        // News sent by this process to a room nobody watches keep its live state only.
        hub.message("r", final_entry("m1"));
        hub.set_online("r", true);
        assert!(!hub.is_watched("r"));
        assert!(hub.watched_rooms().is_empty());
        let (rx, _, _) = hub.subscribe("r");
        assert!(hub.is_watched("r"));
        assert_eq!(hub.watched_rooms(), vec!["r".to_owned()]);
        drop(rx);
        assert!(!hub.is_watched("r"));
    }

    #[test]
    fn the_final_message_replaces_its_draft() {
        let hub = Hub::default();
        let (mut rx, _, _) = hub.subscribe("r");
        hub.draft("r", Draft { message_id: "m1".into(), text: "do".into() });
        hub.message("r", final_entry("m1"));
        assert!(matches!(rx.try_recv().unwrap(), RoomEvent::Draft { .. }));
        assert!(matches!(rx.try_recv().unwrap(), RoomEvent::Message { .. }));
        let (_, drafts, _) = hub.subscribe("r");
        assert!(drafts.is_empty());
    }

    #[test]
    fn a_final_message_of_another_id_keeps_the_draft() {
        let hub = Hub::default();
        hub.draft("r", Draft { message_id: "m1".into(), text: "do".into() });
        hub.message("r", final_entry("m2"));
        hub.draft("r", Draft { message_id: "m3".into(), text: "x".into() });
        hub.draft("r", Draft { message_id: "m1".into(), text: "done so far".into() });
        let drafts = hub.subscribe("r").1;
        assert_eq!(drafts.len(), 2);
        assert_eq!(drafts[0].text, "done so far");
    }

    #[test]
    fn unchanged_activity_and_presence_send_nothing() {
        let hub = Hub::default();
        let (mut rx, _, _) = hub.subscribe("r");
        let thinking = Activity { status: "thinking".into(), tool_name: None };
        hub.activity("r", Some(thinking.clone()));
        hub.activity("r", Some(thinking));
        hub.set_online("r", false);
        hub.set_online("r", true);
        hub.set_online("r", true);
        assert!(matches!(rx.try_recv().unwrap(), RoomEvent::Activity { .. }));
        assert!(matches!(rx.try_recv().unwrap(), RoomEvent::Agent { online: true }));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn h5_streams_are_capped_per_token_per_room_and_in_total_and_freed_on_drop() {
        let hub = Hub::default();
        let caps = StreamCaps { per_token: 2, per_address: 10, per_room: 3, total: 4 };
        let a1 = hub.open_stream("r1", "ta", None, caps).unwrap();
        let _a2 = hub.open_stream("r1", "ta", None, caps).unwrap();
        assert_eq!(hub.open_stream("r1", "ta", None, caps).unwrap_err(), StreamLimit::Token);
        let _b1 = hub.open_stream("r1", "tb", None, caps).unwrap();
        assert_eq!(hub.open_stream("r1", "tc", None, caps).unwrap_err(), StreamLimit::Room);
        let _c1 = hub.open_stream("r2", "tc", None, caps).unwrap();
        assert_eq!(hub.open_stream("r3", "td", None, caps).unwrap_err(), StreamLimit::Total);
        drop(a1);
        assert_eq!(hub.open_streams(), 3);
        assert!(hub.open_stream("r1", "ta", None, caps).is_ok());
    }

    #[test]
    fn streams_are_capped_per_address_over_every_session_and_room() {
        let hub = Hub::default();
        let caps = StreamCaps { per_token: 4, per_address: 3, per_room: 64, total: 512 };
        let (attacker, visitor) =
            (Some("192.0.2.1".parse().unwrap()), Some("192.0.2.2".parse().unwrap()));
        let held: Vec<_> = ["t1", "t2", "t3"]
            .iter()
            .map(|token| hub.open_stream("r1", token, attacker, caps).unwrap())
            .collect();
        assert_eq!(hub.open_stream("r1", "t4", attacker, caps).unwrap_err(), StreamLimit::Address);
        assert_eq!(hub.open_stream("r2", "t5", attacker, caps).unwrap_err(), StreamLimit::Address);
        assert!(hub.open_stream("r1", "v1", visitor, caps).is_ok());
        drop(held);
        assert!(hub.open_stream("r1", "t4", attacker, caps).is_ok());
    }

    #[test]
    fn ending_a_session_signals_its_streams_and_a_room_change_signals_all_of_the_room() {
        let hub = Hub::default();
        let caps = StreamCaps { per_token: 4, per_address: 16, per_room: 8, total: 16 };
        let (a1, a2) = (
            hub.open_stream("r1", "ta", None, caps).unwrap(),
            hub.open_stream("r1", "ta", None, caps).unwrap(),
        );
        let b = hub.open_stream("r1", "tb", None, caps).unwrap();
        let c = hub.open_stream("r2", "tc", None, caps).unwrap();
        hub.end_session("ta");
        assert!(a1.session_ended().is_cancelled() && a2.session_ended().is_cancelled());
        assert!(!b.session_ended().is_cancelled());
        hub.end_room_sessions("r1");
        assert!(b.session_ended().is_cancelled());
        assert!(!c.session_ended().is_cancelled(), "another room's sessions go on");
        drop((a1, a2, b));
        // The signal is forgotten with the last stream: a later stream starts fresh.
        let again = hub.open_stream("r1", "tb", None, caps).unwrap();
        assert!(!again.session_ended().is_cancelled());
    }

    #[test]
    fn snapshot_events_serialise_with_a_kind_tag() {
        let event = RoomEvent::Agent { online: true };
        assert_eq!(
            serde_json::to_value(event).unwrap(),
            serde_json::json!({"kind": "agent", "online": true})
        );
    }
}
