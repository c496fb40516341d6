//! What every part of a replica shares ([`App`]): the store, the conversation, the pairings,
//! the rooms' live state, and the staging of an agent message on a Tool call.

use crate::error::WebchatError;
use crate::guess::GuessLimiter;
use crate::hub::Hub;
use crate::messages::{Messages, Prepared};
use crate::names::{PROVIDER, ROOM_SECRET};
use crate::pairing::{PairingPrompt, Pairings};
use crate::store::{ChatEntry, EntryFile, Inserted, Room, Store};
use std::sync::Arc;
use xagent_protocol_types::{
    ChatMessage, ConnectionStatus, ConnectorChannelId, DescriptorTarget, Secret,
};
use xagent_server_runtime::{AuthError, AuthPrompt, Binding, ConnectorHandle, ToolContext};

/// State shared by the Connector code and the chat page's HTTP API.
pub(crate) struct App {
    /// The Connector's own records in the runtime's storage (set once the runtime is built).
    pub(crate) store: std::sync::OnceLock<Store>,
    /// The rooms' conversations in the runtime's storage (set once the runtime is built).
    pub(crate) messages: std::sync::OnceLock<Messages>,
    pub(crate) hub: Hub,
    /// The runtime's handle (set once it is built): room news go to the other replicas.
    pub(crate) handle: std::sync::OnceLock<ConnectorHandle>,
    /// This process's name in its room news (its own come back to it and are skipped).
    pub(crate) origin: String,
    /// The pairings of every replica in the runtime's storage (set once the runtime is built).
    pub(crate) pairings: std::sync::OnceLock<Pairings>,
    /// Wrong codes given through `auth.start`, per channel and per room (F21).
    pub(crate) sign_ins: tokio::sync::Mutex<GuessLimiter<ConnectorChannelId>>,
    /// Absolute URL the pairing links and page links start with (no trailing slash).
    pub(crate) public_url: String,
}

impl App {
    /// The pairings (available once the runtime is built, before it serves).
    pub(crate) fn pairings(&self) -> Result<&Pairings, WebchatError> {
        self.pairings.get().ok_or(WebchatError::ShuttingDown)
    }

    /// Ends one visitor session (the page's "leave"): the token stops working and every
    /// event stream it holds ends now (F4).
    pub(crate) async fn end_visitor_session(&self, token: &str) -> Result<(), WebchatError> {
        self.store()?.revoke_visitor(token).await?;
        self.hub.end_session(&crate::store::hash_token(token));
        Ok(())
    }

    pub(crate) fn pairing_link(&self, token: &str) -> String {
        format!("{}/chat/pair/{token}", self.public_url)
    }

    /// The prompt of a pairing: with the link and its QR code when this replica minted the
    /// token (another replica knows only its hash and reports the state and expiry).
    pub(crate) fn prompt(
        &self,
        prompt: &PairingPrompt,
        message: &str,
    ) -> Result<AuthPrompt, AuthError> {
        let link = prompt.token.as_deref().map(|token| self.pairing_link(token));
        let image = match &link {
            Some(link) => Some(crate::qr::qr_data_url(link).map_err(AuthError::internal)?),
            None => None,
        };
        Ok(AuthPrompt {
            qr_code_text: link,
            qr_code_image: image,
            expires_at: Some(prompt.expires_at),
            poll_interval_millis: Some(1_000),
            message: Some(message.to_owned()),
        })
    }

    /// Binds `room` to `channel`: the room's earlier channel (if another one) is marked
    /// `revoked`, since a room is served by one channel at a time.
    pub(crate) async fn bind(
        &self,
        handle: &ConnectorHandle,
        room: &Room,
        channel: &ConnectorChannelId,
    ) -> Result<Binding, AuthError> {
        let previous = self
            .store()
            .map_err(AuthError::internal)?
            .set_room_channel(&room.room_id, Some(channel))
            .await
            .map_err(AuthError::internal)?;
        if let Some(previous) = previous.filter(|p| p != channel) {
            tracing::info!(room = %room.room_id, %previous, "room moved to another channel");
            let _ = handle.set_status(&previous, ConnectionStatus::Revoked).await;
        }
        self.hub.set_online(&room.room_id, handle.is_routed(channel));
        Ok(binding_for(room))
    }

    pub(crate) async fn room_of(&self, channel: &ConnectorChannelId) -> Option<Room> {
        let room = match self.store() {
            Ok(store) => store.room_by_channel(channel).await,
            Err(error) => Err(error),
        };
        match room {
            Ok(room) => room,
            Err(error) => {
                tracing::error!(%error, "room lookup failed");
                None
            }
        }
    }

    /// The Connector's records (available once the runtime is built, before it serves).
    pub(crate) fn store(&self) -> Result<&Store, WebchatError> {
        self.store.get().ok_or(WebchatError::ShuttingDown)
    }

    /// Shows a new or changed message on this replica's pages of the room. The message is
    /// stored already, and the other replicas heard of it in the same transaction (the hint
    /// rides with the message's writes, see `live.rs`).
    pub(crate) fn publish(&self, room_id: &str, entry: ChatEntry) {
        self.hub.message(room_id, entry);
    }

    /// The rooms' conversations (available once the runtime is built, before it serves).
    pub(crate) fn messages(&self) -> Result<&Messages, WebchatError> {
        self.messages.get().ok_or(WebchatError::ShuttingDown)
    }

    /// Adds an agent message to a room (idempotent by `message_id`), committed now, and shows
    /// it.
    pub(crate) async fn show_agent_message(
        &self,
        room_id: &str,
        entry: ChatEntry,
    ) -> Result<ChatEntry, WebchatError> {
        match self.messages()?.insert(room_id, &entry, None).await? {
            Inserted::New(entry) => {
                self.publish(room_id, entry.clone());
                Ok(entry)
            }
            Inserted::Existing(entry) => Ok(entry),
        }
    }
}

/// Adds an agent message to a room from a Tool call: its records are staged on the call, so
/// they commit with the call's tool-call record (one transaction), and the page is shown the
/// message once that committed. A repeat (same `message_id`) returns the stored one.
pub(crate) async fn stage_agent_message(
    ctx: &ToolContext<Arc<App>>,
    room_id: &str,
    entry: ChatEntry,
) -> Result<ChatEntry, WebchatError> {
    let app = ctx.state();
    match app.messages()?.prepare(room_id, &entry).await? {
        Prepared::Existing(existing) => Ok(existing),
        Prepared::New { entry, writes } => {
            for write in writes {
                ctx.stage(write);
            }
            let (shown, app, room_id) = (entry.clone(), Arc::clone(app), room_id.to_owned());
            ctx.after_commit(move || app.publish(&room_id, shown));
            Ok(entry)
        }
    }
}

pub(crate) fn entry_files(message: &ChatMessage) -> Vec<EntryFile> {
    message
        .files
        .iter()
        .map(|f| EntryFile {
            file_ref: f.file_ref.to_string(),
            filename: f.filename.clone().unwrap_or_else(|| f.file_ref.to_string()),
            mime_type: f.mime_type.clone(),
            byte_size: f.byte_size,
        })
        .collect()
}

/// The binding a room gives its channel: the room as the target, its id as the secret.
pub(crate) fn binding_for(room: &Room) -> Binding {
    let target = DescriptorTarget::new(PROVIDER, format!("Web chat room {}", room.name))
        .with_label("Web chat")
        .with_account_hint(room.room_id.clone());
    Binding::new(target).with_secret(ROOM_SECRET, Secret::new(room.room_id.clone()))
}
