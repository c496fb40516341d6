//! A person on a Matrix client of their own, for tests (cargo feature `testing`): matrix-sdk
//! with an in-memory store and device keys of its own, logged in to a test homeserver
//! (`xagent_testkit::synapse`), syncing in the background and keeping what it saw. Panics
//! on failures: it is test code.

#![allow(missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use matrix_sdk::config::SyncSettings;
use matrix_sdk::ruma::api::client::room::create_room::v3::Request as CreateRoomRequest;
use matrix_sdk::ruma::events::InitialStateEvent;
use matrix_sdk::ruma::events::room::encryption::RoomEncryptionEventContent;
use matrix_sdk::ruma::events::room::message::{
    OriginalSyncRoomMessageEvent, RoomMessageEventContent,
};
use matrix_sdk::ruma::events::typing::SyncTypingEvent;
use matrix_sdk::ruma::{OwnedRoomId, OwnedUserId};
use matrix_sdk::{Client, Room, RoomMemberships};

/// How long a wait lasts.
pub const WAIT: Duration = Duration::from_secs(30);

/// A registered account: its id and password.
#[derive(Clone, Debug)]
pub struct Account {
    /// `@name:server`.
    pub user_id: String,
    /// The local part.
    pub localpart: String,
    /// Its password.
    pub password: String,
}

/// What a human's client saw.
#[derive(Default)]
pub struct Seen {
    pub messages: Vec<(OwnedRoomId, OriginalSyncRoomMessageEvent)>,
    pub typing: Vec<(OwnedRoomId, Vec<OwnedUserId>)>,
}

/// A person on a Matrix client of their own.
pub struct Human {
    pub client: Client,
    pub user: Account,
    pub seen: Arc<Mutex<Seen>>,
    sync: tokio::task::JoinHandle<()>,
}

impl Drop for Human {
    fn drop(&mut self) {
        self.sync.abort();
    }
}

impl Human {
    pub async fn login(homeserver: &str, user: Account) -> Human {
        let client = Client::builder().homeserver_url(homeserver).build().await.expect("a client");
        client
            .matrix_auth()
            .login_username(&user.user_id, &user.password)
            .initial_device_display_name("test human")
            .send()
            .await
            .expect("the human logs in");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let messages = Arc::clone(&seen);
        client.add_event_handler(move |event: OriginalSyncRoomMessageEvent, room: Room| {
            let seen = Arc::clone(&messages);
            async move {
                seen.lock().unwrap().messages.push((room.room_id().to_owned(), event));
            }
        });
        let typing = Arc::clone(&seen);
        client.add_event_handler(move |event: SyncTypingEvent, room: Room| {
            let seen = Arc::clone(&typing);
            async move {
                seen.lock()
                    .unwrap()
                    .typing
                    .push((room.room_id().to_owned(), event.content.user_ids));
            }
        });
        client.sync_once(SyncSettings::default()).await.expect("first sync");
        let syncing = client.clone();
        let sync = tokio::spawn(async move {
            let _ = syncing.sync(SyncSettings::default().timeout(Duration::from_secs(5))).await;
        });
        Human { client, user, seen, sync }
    }

    /// Creates a room (encrypted or not) and invites `invite`.
    pub async fn create_room(&self, name: &str, encrypted: bool, invite: &[&str]) -> Room {
        let mut request = CreateRoomRequest::new();
        request.name = Some(name.to_owned());
        request.invite = invite.iter().map(|u| u.parse().expect("user id")).collect();
        if encrypted {
            request.initial_state = vec![
                InitialStateEvent::with_empty_state_key(
                    RoomEncryptionEventContent::with_recommended_defaults(),
                )
                .to_raw_any(),
            ];
        }
        self.client.create_room(request).await.expect("the room is created")
    }

    /// Waits until `user` joined `room`.
    pub async fn wait_joined(&self, room: &Room, user: &str) {
        let user: OwnedUserId = user.parse().expect("user id");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let _ = room.sync_members().await;
            let joined = room.members(RoomMemberships::JOIN).await.unwrap_or_default();
            if joined.iter().any(|m| m.user_id() == user) {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "{user} did not join in time");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// True while `user` is a joined member of `room` (as the homeserver says now).
    pub async fn is_joined(&self, room: &Room, user: &str) -> bool {
        let _ = room.sync_members().await;
        let joined = room.members(RoomMemberships::JOIN).await.unwrap_or_default();
        joined.iter().any(|m| m.user_id().as_str() == user)
    }

    /// Waits until `user` is no longer a joined member of `room`.
    pub async fn wait_left(&self, room: &Room, user: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.is_joined(room, user).await {
            assert!(tokio::time::Instant::now() < deadline, "{user} did not leave in time");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn say(&self, room: &Room, text: &str) {
        room.send(RoomMessageEventContent::text_plain(text)).await.expect("the human posts");
    }

    /// Waits until a message from `sender` in `room` satisfies `want`; returns it.
    pub async fn wait_message(
        &self,
        room: &Room,
        sender: &str,
        mut want: impl FnMut(&OriginalSyncRoomMessageEvent) -> bool,
    ) -> OriginalSyncRoomMessageEvent {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let found = self
                .seen
                .lock()
                .unwrap()
                .messages
                .iter()
                .find(|(r, e)| r == room.room_id() && e.sender == sender && want(e))
                .map(|(_, e)| e.clone());
            if let Some(found) = found {
                return found;
            }
            assert!(tokio::time::Instant::now() < deadline, "the awaited message did not come");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every message from `sender` in `room` so far.
    pub fn messages_from(&self, room: &Room, sender: &str) -> Vec<OriginalSyncRoomMessageEvent> {
        self.seen
            .lock()
            .unwrap()
            .messages
            .iter()
            .filter(|(r, e)| r == room.room_id() && e.sender == sender)
            .map(|(_, e)| e.clone())
            .collect()
    }
}

/// The text body of a message (the new content for an edit).
pub fn body_of(event: &OriginalSyncRoomMessageEvent) -> String {
    use matrix_sdk::ruma::events::room::message::{MessageType, Relation};
    let msgtype = match &event.content.relates_to {
        Some(Relation::Replacement(r)) => &r.new_content.msgtype,
        _ => &event.content.msgtype,
    };
    match msgtype {
        MessageType::Text(t) => t.body.clone(),
        MessageType::Notice(t) => t.body.clone(),
        other => other.body().to_owned(),
    }
}

/// Whether the message edits another one.
pub fn is_edit(event: &OriginalSyncRoomMessageEvent) -> bool {
    matches!(
        event.content.relates_to,
        Some(matrix_sdk::ruma::events::room::message::Relation::Replacement(_))
    )
}
