//! One room message to xAgent: its text or file as a chat message into the outbox, the
//! per-room rate, messages held until a channel is signed in, and the channel's binding.

use matrix_sdk::media::{MediaFormat, MediaRequestParameters};
use matrix_sdk::ruma::OwnedRoomId;
use matrix_sdk::ruma::events::room::MediaSource;
use matrix_sdk::ruma::events::room::message::{
    MessageType, Relation, RoomMessageEventContent, SyncRoomMessageEvent,
};
use matrix_sdk::ruma::events::{AnySyncMessageLikeEvent, AnySyncTimelineEvent};
use matrix_sdk::{Room, RoomState};
use sha2::{Digest, Sha256};
use xagent_protocol_types::{ChatMessage, ConnectorChannelId, ErrorCode};
use xagent_server_runtime::{AuthorWrite, ChannelContext, ConnectorHandle};

use crate::app::{App, RoomRate, lock, room_of};
use crate::names::SEEN_NS;

/// Messages of a room not signed in yet (pairing just done), held until it is.
const MAX_HELD_PER_ROOM: usize = 50;

/// The message id of an inbound event: stable, so a redelivered event is a duplicate.
pub fn message_id_of(event_id: &str) -> String {
    let digest = Sha256::digest(event_id.as_bytes());
    format!("mx_{}", hex::encode(&digest[..16]))
}

/// What the room is told when the runtime refused one of its messages: what to do about it.
pub fn refused_notice(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::PayloadTooLarge => {
            "Your last message is too long for the agent to take. Please shorten it, or send the text as a file."
        }
        _ => "The agent could not take your last message right now. Please send it again later.",
    }
}

/// A file posted in a room: where to fetch it and what its event says about it.
struct Media {
    source: MediaSource,
    filename: String,
    mime: Option<String>,
    size: Option<u64>,
    /// `image`, `file`, `audio` or `video`, for the notes about it.
    kind: &'static str,
}

impl Media {
    /// The file of an image, file, audio or video message; `None` for other kinds.
    fn of(content: MessageType) -> Option<Self> {
        // The four contents have the same fields but no common trait.
        macro_rules! media {
            ($c:expr, $kind:literal) => {{
                let info = $c.info.as_deref();
                Self {
                    source: $c.source.clone(),
                    filename: $c.filename().to_owned(),
                    mime: info.and_then(|i| i.mimetype.clone()),
                    size: info.and_then(|i| i.size).map(u64::from),
                    kind: $kind,
                }
            }};
        }
        match content {
            MessageType::Image(c) => Some(media!(c, "image")),
            MessageType::File(c) => Some(media!(c, "file")),
            MessageType::Audio(c) => Some(media!(c, "audio")),
            MessageType::Video(c) => Some(media!(c, "video")),
            _ => None,
        }
    }
}

impl App {
    /// One timeline event of a joined room.
    pub(crate) async fn event(
        &self,
        handle: &ConnectorHandle,
        room_id: &OwnedRoomId,
        event: AnySyncTimelineEvent,
    ) -> Result<(), String> {
        let AnySyncTimelineEvent::MessageLike(AnySyncMessageLikeEvent::RoomMessage(message)) =
            event
        else {
            // Redactions, reactions and state changes are not messages for the agent
            // (docs/MATRIX.md: an agent cannot unsee a message).
            tracing::debug!(event = %event.event_id(), kind = %event.event_type(), "im.matrix: not a message");
            return Ok(());
        };
        let SyncRoomMessageEvent::Original(message) = message else { return Ok(()) };
        if message.sender == self.bot {
            return Ok(());
        }
        let Some(room) = self.client.get_room(room_id) else { return Ok(()) };
        let channel = self.channel_of(handle, room_id);
        let (content, edited) = match &message.content.relates_to {
            Some(Relation::Replacement(replacement)) => {
                (replacement.new_content.msgtype.clone(), true)
            }
            _ => (message.content.msgtype.clone(), false),
        };
        let Some(channel) = channel else {
            if let MessageType::Text(text) = &content {
                let at = u64::from(message.origin_server_ts.0);
                self.pairing_attempt(handle, &room, message.sender.as_str(), &text.body, at).await;
            }
            return Ok(());
        };
        let message_id = message_id_of(message.event_id.as_str());
        let store = handle.author_store();
        if matches!(store.get(SEEN_NS, &message_id).await, Ok(Some(_))) {
            tracing::debug!(event = %message.event_id, "im.matrix: handed over before");
            return Ok(());
        }
        tracing::debug!(event = %message.event_id, %channel, "im.matrix: a room message");
        if !self.admit(handle, &room).await {
            return Ok(());
        }
        let sender = match room.get_member_no_sync(&message.sender).await {
            Ok(Some(member)) => member.name().to_owned(),
            _ => message.sender.localpart().to_owned(),
        };
        let created_at = u64::from(message.origin_server_ts.0);
        let chat = match self.to_chat(handle, &channel, &message_id, &sender, edited, content).await
        {
            Some(chat) => chat.created_at(created_at),
            None => return Ok(()),
        };
        let seen = AuthorWrite::put(SEEN_NS, &message_id, created_at.to_string().into_bytes())
            .map_err(|e| e.to_string())?;
        self.hand_over(handle, &room, &channel, chat, seen).await
    }

    /// Queues a room's chat message for xAgent with its seen mark. A channel not signed in
    /// yet holds it; a refusal of this one message tells the room; only a store failure is
    /// an error (the batch comes again).
    async fn hand_over(
        &self,
        handle: &ConnectorHandle,
        room: &Room,
        channel: &ConnectorChannelId,
        chat: ChatMessage,
        seen: AuthorWrite,
    ) -> Result<(), String> {
        match handle.send_message_with(channel, chat.clone(), vec![seen]).await {
            Ok(()) => {
                tracing::debug!(message = %chat.message_id, "im.matrix: queued for xAgent");
                Ok(())
            }
            Err(e) if e.code() == ErrorCode::ConnectionNotAuthenticated => {
                tracing::info!(message = %chat.message_id, "im.matrix: held until the channel is signed in");
                // Paired a moment ago: held until the sign-in completes.
                let mut held = lock(&self.held);
                let list = held.entry(room.room_id().to_owned()).or_default();
                if list.len() < MAX_HELD_PER_ROOM {
                    list.push(chat);
                }
                Ok(())
            }
            // The store failed: the batch is tried again (nothing advanced).
            Err(e) if e.code() == ErrorCode::InternalError => Err(e.to_string()),
            Err(e) => {
                // The runtime refused this one message (its channel went away, its outbox is
                // full): the sender is told, and the other rooms are not held up by it.
                tracing::warn!(code = %e.code(), "im.matrix: a room message was not taken: {e}");
                let note = RoomMessageEventContent::notice_plain(refused_notice(e.code()));
                let _ = room.send(note).await;
                Ok(())
            }
        }
    }

    /// The channel a room is bound to: from the map, else from the runtime's bindings (a
    /// binding restored at start may not have reached `on_bound` yet when the first sync
    /// comes back, and its events must not be taken for an unbound room's).
    pub(crate) fn channel_of(
        &self,
        handle: &ConnectorHandle,
        room_id: &OwnedRoomId,
    ) -> Option<ConnectorChannelId> {
        if let Some(channel) = lock(&self.rooms).get(room_id) {
            return Some(channel.clone());
        }
        let channel = handle.channels().into_iter().find(|channel| {
            handle.binding(channel).and_then(|b| room_of(&b)).as_ref() == Some(room_id)
        })?;
        lock(&self.rooms).insert(room_id.clone(), channel.clone());
        Some(channel)
    }

    /// The per-room inbound rate: false (and one note in the room per minute) beyond it.
    async fn admit(&self, handle: &ConnectorHandle, room: &Room) -> bool {
        let now = Self::now(handle);
        let warn = {
            let mut rates = lock(&self.rates);
            let rate = rates.entry(room.room_id().to_owned()).or_default();
            if now.saturating_sub(rate.window_start) >= 60_000 {
                *rate = RoomRate { window_start: now, count: 0, warned: false };
            }
            rate.count += 1;
            if rate.count <= self.room_messages_per_minute {
                return true;
            }
            !std::mem::replace(&mut rate.warned, true)
        };
        if warn {
            let note = RoomMessageEventContent::notice_plain(
                "Too many messages in this room: the agent gets no more this minute. Wait a little and send again.",
            );
            let _ = room.send(note).await;
        }
        false
    }

    /// The chat message for an event's content: text (with the sender's name), or a file
    /// fetched from the media repository (decrypted in encrypted rooms).
    async fn to_chat(
        &self,
        handle: &ConnectorHandle,
        channel: &ConnectorChannelId,
        message_id: &str,
        sender: &str,
        edited: bool,
        content: MessageType,
    ) -> Option<ChatMessage> {
        let mark = if edited { " (edited)" } else { "" };
        let text = match &content {
            MessageType::Text(t) => format!("{sender}{mark}: {}", t.body),
            MessageType::Notice(t) => format!("{sender}{mark}: {}", t.body),
            MessageType::Emote(t) => format!("* {sender}{mark} {}", t.body),
            _ => {
                let media = Media::of(content)?;
                return Some(
                    self.file_to_chat(handle, channel, message_id, sender, mark, media).await,
                );
            }
        };
        Some(ChatMessage::text(message_id, text))
    }

    /// The chat message for a posted file: the file kept on the channel, or a note saying why
    /// the agent does not get it (too large, not fetched, not kept).
    async fn file_to_chat(
        &self,
        handle: &ConnectorHandle,
        channel: &ConnectorChannelId,
        message_id: &str,
        sender: &str,
        mark: &str,
        media: Media,
    ) -> ChatMessage {
        let Media { source, filename, mime, size, kind } = media;
        let note = |what: &str| {
            ChatMessage::text(
                message_id,
                format!("{sender} sent a {kind} ({filename}) that {what}."),
            )
        };
        let too_big =
            format!("is larger than the {} bytes this Connector takes", self.max_file_bytes);
        if size.is_some_and(|s| s > self.max_file_bytes) {
            return note(&too_big);
        }
        let bytes = match self.download(source).await {
            Ok(bytes) if bytes.len() as u64 > self.max_file_bytes => return note(&too_big),
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::info!("im.matrix: a file could not be fetched: {e}");
                return note("could not be fetched from the homeserver");
            }
        };
        let mime = mime.or_else(|| mime_guess::from_path(&filename).first().map(|m| m.to_string()));
        match handle.register_file(channel, &filename, mime.as_deref(), &bytes).await {
            Ok(file) => ChatMessage::with_files(
                message_id,
                Some(format!("{sender}{mark} sent {filename}")),
                vec![file],
            ),
            Err(e) => {
                tracing::warn!("im.matrix: a file could not be kept: {e}");
                note("could not be kept by the Connector")
            }
        }
    }

    /// Fetches (and decrypts) a file, within [`crate::MatrixOptions::download_timeout`].
    async fn download(&self, source: MediaSource) -> Result<Vec<u8>, String> {
        let request = MediaRequestParameters { source, format: MediaFormat::File };
        let media = self.client.media();
        let fetch = media.get_media_content(&request, false);
        match tokio::time::timeout(self.download_timeout, fetch).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.download_timeout)),
        }
    }

    /// A channel signed in or was restored: its room's events go to it from now on.
    pub(crate) async fn bound(&self, ctx: &ChannelContext) {
        let Some(room_id) = room_of(&ctx.binding) else { return };
        {
            // A channel serves one room: a room it served before (it paired again) is let go.
            let mut rooms = lock(&self.rooms);
            rooms.retain(|room, channel| *channel != ctx.channel || *room == room_id);
            rooms.insert(room_id.clone(), ctx.channel.clone());
        }
        lock(&self.unbound_since).remove(&room_id);
        let held = lock(&self.held).remove(&room_id).unwrap_or_default();
        for message in held {
            let seen = AuthorWrite::put(SEEN_NS, message.message_id.as_str(), b"1".to_vec());
            let writes = seen.into_iter().collect();
            if let Err(e) = ctx.handle.send_message_with(&ctx.channel, message, writes).await {
                tracing::warn!("im.matrix: a held message could not be queued: {e}");
            }
        }
    }

    /// The channel signed out: stop delivering, and the bot leaves the room.
    pub(crate) async fn unbound(&self, ctx: &ChannelContext) {
        let Some(room_id) = room_of(&ctx.binding) else { return };
        lock(&self.rooms).remove(&room_id);
        if let Some(room) = self.client.get_room(&room_id)
            && room.state() == RoomState::Joined
            && let Err(e) = room.leave().await
        {
            tracing::info!("im.matrix: could not leave the room after sign-out: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_stable_per_event() {
        assert_eq!(message_id_of("$a:x"), message_id_of("$a:x"));
        assert_ne!(message_id_of("$a:x"), message_id_of("$b:x"));
    }
}
