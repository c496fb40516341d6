//! `App`, the state every part of the Connector shares, and small helpers on rooms.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use matrix_sdk::ruma::{OwnedEventId, OwnedRoomId, OwnedUserId, RoomId};
use matrix_sdk::{Client, Room};
use xagent_protocol_types::{AuthSessionId, ChatMessage, ConnectorChannelId, ErrorCode};
use xagent_server_runtime::{AuthPrompt, Binding, ConnectorHandle, DeliveryError, EditThrottle};

use crate::names::ROOM_SECRET;
use crate::pairing::Pairing;

/// A room paired by a posted code, waiting for its session's `auth.status`.
#[derive(Clone, Debug)]
pub(crate) struct Paired {
    pub(crate) room_id: OwnedRoomId,
    pub(crate) name: String,
    /// When the code was posted (the event's time).
    pub(crate) at: u64,
}

/// One streamed reply: its Matrix event and the edit pacing.
pub(crate) struct Stream {
    pub(crate) event_id: OwnedEventId,
    pub(crate) throttle: EditThrottle,
    /// Held while an edit is being sent, so the final edit is never overtaken.
    pub(crate) sending: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Default)]
pub(crate) struct RoomRate {
    pub(crate) window_start: u64,
    pub(crate) count: u32,
    pub(crate) warned: bool,
}

/// What every part of the Connector shares: the bot's client, the rooms and their channels,
/// pairing state, streamed replies, rates and the limits from the options.
pub(crate) struct App {
    pub(crate) client: Client,
    pub(crate) bot: OwnedUserId,
    pub(crate) link: String,
    pub(crate) pairing: Mutex<Pairing<(AuthSessionId, ConnectorChannelId)>>,
    pub(crate) prompts: Mutex<HashMap<AuthSessionId, AuthPrompt>>,
    pub(crate) paired: Mutex<HashMap<AuthSessionId, Paired>>,
    pub(crate) rooms: Mutex<HashMap<OwnedRoomId, ConnectorChannelId>>,
    pub(crate) held: Mutex<HashMap<OwnedRoomId, Vec<ChatMessage>>>,
    pub(crate) streams: Mutex<HashMap<String, Stream>>,
    pub(crate) rates: Mutex<HashMap<OwnedRoomId, RoomRate>>,
    pub(crate) utd: Mutex<Vec<(OwnedRoomId, OwnedEventId, u64)>>,
    /// Rooms the bot is in without a channel, since when (they are left after
    /// [`crate::sync::UNBOUND_ROOM_TTL_MS`], so strangers' invites cannot fill the quota for good).
    pub(crate) unbound_since: Mutex<HashMap<OwnedRoomId, u64>>,
    pub(crate) edit_interval: Duration,
    pub(crate) max_file_bytes: u64,
    pub(crate) download_timeout: Duration,
    pub(crate) max_unbound_rooms: usize,
    pub(crate) room_messages_per_minute: u32,
    pub(crate) offline_after: Duration,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `!abcdef…:server` for the Descriptor: enough to tell rooms apart, not a full id.
pub(crate) fn room_hint(room_id: &RoomId) -> String {
    let text = room_id.as_str();
    let (local, server) = text.split_once(':').unwrap_or((text, ""));
    let short: String = local.chars().take(7).collect();
    if server.is_empty() { format!("{short}…") } else { format!("{short}…:{server}") }
}

pub(crate) fn room_of(binding: &Binding) -> Option<OwnedRoomId> {
    binding.secret(ROOM_SECRET).and_then(|s| RoomId::parse(s.expose()).ok())
}

impl App {
    pub(crate) fn now(handle: &ConnectorHandle) -> u64 {
        handle.now_millis()
    }

    pub(crate) fn room(&self, binding: &Binding) -> Result<Room, DeliveryError> {
        room_of(binding).and_then(|id| self.client.get_room(&id)).ok_or_else(|| {
            DeliveryError::permanent(
                ErrorCode::ConnectionNotAuthenticated,
                "the channel serves no Matrix room the bot is in; pair a room again",
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_room_hint_is_not_the_room_id() {
        let id = RoomId::parse("!abcdefghijklmnop:example.org").unwrap();
        let hint = room_hint(&id);
        assert_eq!(hint, "!abcdef…:example.org");
    }
}
