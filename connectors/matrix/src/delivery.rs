//! The IM target: posting texts and files in the bound room, streamed replies edited in
//! place, typing.

use std::sync::Arc;
use std::time::Duration;

use matrix_sdk::Room;
use matrix_sdk::attachment::AttachmentConfig;
use matrix_sdk::ruma::events::room::message::{ReplacementMetadata, RoomMessageEventContent};
use matrix_sdk::ruma::{OwnedEventId, OwnedTransactionId};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use xagent_file_transfer::{FileReader, FileRecord};
use xagent_profile_im::{ActivityAction, ActivityCapability};
use xagent_protocol_types::{ChatMessage, ConnectorChannelId, ErrorCode, FileRef};
use xagent_server_runtime::{
    ChannelContext, ConnectorHandle, DeliveryError, DeltaUpdate, EditThrottle, FinalDelivery,
    ImTarget, Offer,
};

use crate::app::{App, Stream, lock};

/// The longest text posted as one Matrix event (the homeserver takes events up to 64 KiB in
/// all; longer texts go out as several messages).
pub const MAX_EVENT_TEXT_BYTES: usize = 32_000;

/// The Matrix transaction id of one part of an outbound message: derived from the channel and
/// the message id, so a redelivered final message (or a repeated Tool call) never posts twice.
pub(crate) fn txn_id(
    channel: &ConnectorChannelId,
    message_id: &str,
    part: &str,
) -> OwnedTransactionId {
    let digest = Sha256::digest(format!("{channel}\n{message_id}\n{part}").as_bytes());
    OwnedTransactionId::from(format!("xa{}", hex::encode(&digest[..16])).as_str())
}

/// Texts of at most [`MAX_EVENT_TEXT_BYTES`], cut at character boundaries (at a line break
/// when there is one in the second half).
pub fn split_text(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = text;
    while rest.len() > MAX_EVENT_TEXT_BYTES {
        let mut cut = MAX_EVENT_TEXT_BYTES;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        if let Some(newline) = rest[..cut].rfind('\n').filter(|at| *at > cut / 2) {
            cut = newline + 1;
        }
        parts.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    if !rest.is_empty() || parts.is_empty() {
        parts.push(rest);
    }
    parts
}

/// A send failure as the IM Profile wants it: rate limits and network trouble retryable,
/// a room the bot may not post in final.
fn delivery_error(e: &matrix_sdk::Error) -> DeliveryError {
    use matrix_sdk::ruma::api::error::ErrorKind;
    match e.client_api_error_kind() {
        Some(ErrorKind::TooLarge) => DeliveryError::permanent(
            ErrorCode::PayloadTooLarge,
            "the homeserver refused the message or file as too large",
        ),
        Some(ErrorKind::Forbidden) => DeliveryError::permanent(
            ErrorCode::PermissionDenied,
            "the bot may not post in this room any more (removed or banned); pair a room again",
        ),
        Some(ErrorKind::LimitExceeded(_)) => DeliveryError::temporary(
            ErrorCode::ChannelBusy,
            "the homeserver rate-limits the bot; retry later",
        ),
        _ => DeliveryError::temporary(
            ErrorCode::TargetDeliveryFailed,
            "the homeserver did not take the message; retry later",
        ),
    }
}

impl App {
    /// Posts a text (split when long) with transaction ids derived from `message_id`.
    pub(crate) async fn post_text(
        &self,
        room: &Room,
        channel: &ConnectorChannelId,
        message_id: &str,
        text: &str,
        edit: Option<OwnedEventId>,
    ) -> Result<Option<OwnedEventId>, DeliveryError> {
        let mut first = None;
        for (i, part) in split_text(text).into_iter().enumerate() {
            let content = RoomMessageEventContent::text_plain(part);
            let (content, label) = match (&edit, i) {
                (Some(event_id), 0) => (
                    content.make_replacement(ReplacementMetadata::new(event_id.clone(), None)),
                    "final-edit".to_owned(),
                ),
                _ => (content, format!("text{i}")),
            };
            let sent = room
                .send(content)
                .with_transaction_id(txn_id(channel, message_id, &label))
                .await
                .map_err(|e| delivery_error(&e))?;
            first.get_or_insert(sent.response.event_id);
        }
        Ok(first)
    }

    /// Opens a file the agent uploaded to `channel` for posting: refused when it is not the
    /// channel's or is larger than the Connector posts.
    pub(crate) async fn open_for_posting(
        &self,
        handle: &ConnectorHandle,
        channel: &ConnectorChannelId,
        file_ref: &FileRef,
    ) -> Result<(FileRecord, FileReader), DeliveryError> {
        let (record, reader) = handle.open_file(channel, file_ref).await.map_err(|_| {
            DeliveryError::permanent(ErrorCode::FileNotFound, "no such file on this channel")
        })?;
        self.check_postable(&record)?;
        Ok((record, reader))
    }

    /// Refuses a file larger than this Connector posts.
    pub(crate) fn check_postable(&self, record: &FileRecord) -> Result<(), DeliveryError> {
        if record.byte_size > self.max_file_bytes {
            return Err(DeliveryError::permanent(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the file is larger than the {} bytes this Connector posts",
                    self.max_file_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Posts an opened file (encrypted in encrypted rooms).
    pub(crate) async fn post_file(
        &self,
        room: &Room,
        (record, reader): (FileRecord, FileReader),
        caption: Option<String>,
        txn: OwnedTransactionId,
    ) -> Result<OwnedEventId, DeliveryError> {
        let mut data = Vec::new();
        reader
            .take(self.max_file_bytes + 1)
            .read_to_end(&mut data)
            .await
            .map_err(DeliveryError::internal)?;
        let mime: mime_guess::mime::Mime =
            record.mime_type.parse().unwrap_or(mime_guess::mime::APPLICATION_OCTET_STREAM);
        let mut config = AttachmentConfig::new().txn_id(txn);
        if let Some(caption) = caption.filter(|c| !c.trim().is_empty()) {
            config = config.caption(Some(
                matrix_sdk::ruma::events::room::message::TextMessageEventContent::plain(caption),
            ));
        }
        let sent = room
            .send_attachment(record.filename.clone(), &mime, data, config)
            .await
            .map_err(|e| delivery_error(&e))?;
        Ok(sent.event_id)
    }

    /// Sends one throttled edit of a streamed reply (while holding the stream's send lock).
    async fn edit_stream(&self, room: &Room, message_id: &str, text: String) {
        let (event_id, sending) = {
            let streams = lock(&self.streams);
            let Some(stream) = streams.get(message_id) else { return };
            (stream.event_id.clone(), Arc::clone(&stream.sending))
        };
        let _held = sending.lock().await;
        if !lock(&self.streams).contains_key(message_id) {
            return; // the final message took over meanwhile
        }
        let shown = split_text(&text).first().copied().unwrap_or_default().to_owned();
        let content = RoomMessageEventContent::text_plain(shown)
            .make_replacement(ReplacementMetadata::new(event_id, None));
        if let Err(e) = room.send(content).await {
            tracing::info!("im.matrix: a streamed edit was not taken: {e}");
        }
    }
}

pub(crate) struct MatrixTarget(pub(crate) Arc<App>);

impl ImTarget for MatrixTarget {
    const STREAMS_DELTAS: bool = true;
    const ACTIVITY: ActivityCapability = ActivityCapability::TypingOnly;

    async fn deliver(
        &self,
        ctx: ChannelContext,
        message: ChatMessage,
        how: FinalDelivery,
    ) -> Result<(), DeliveryError> {
        let app = &self.0;
        let room = app.room(&ctx.binding)?;
        let message_id = message.message_id.to_string();
        // The final message takes over the stream: no kept edit goes out after it.
        let stream = lock(&app.streams).remove(&message_id);
        let _held = match &stream {
            Some(stream) => Some(Arc::clone(&stream.sending).lock_owned().await),
            None => None,
        };
        let streamed = match how {
            FinalDelivery::Edit { handle } => handle
                .and_then(|h| OwnedEventId::try_from(h).ok())
                .or_else(|| stream.map(|s| s.event_id)),
            _ => None,
        };
        // Every file is opened and checked before anything is posted: a refused file posts
        // nothing.
        let mut files = Vec::with_capacity(message.files.len());
        for file in &message.files {
            files.push(app.open_for_posting(&ctx.handle, &ctx.channel, &file.file_ref).await?);
        }
        let text = message.text.as_deref().filter(|t| !t.trim().is_empty());
        if let Some(text) = text {
            app.post_text(&room, &ctx.channel, &message_id, text, streamed).await?;
        }
        for (i, opened) in files.into_iter().enumerate() {
            let txn = txn_id(&ctx.channel, &message_id, &format!("file{i}"));
            app.post_file(&room, opened, None, txn).await?;
        }
        let _ = room.typing_notice(false).await;
        Ok(())
    }

    async fn delta(&self, ctx: ChannelContext, update: DeltaUpdate) -> Option<String> {
        let app = Arc::clone(&self.0);
        let room = app.room(&ctx.binding).ok()?;
        let message_id = update.message_id.to_string();
        let now = ctx.handle.now_millis();
        if update.first || !lock(&app.streams).contains_key(&message_id) {
            let shown =
                split_text(&update.text_so_far).first().copied().unwrap_or_default().to_owned();
            let sent = room
                .send(RoomMessageEventContent::text_plain(shown))
                .with_transaction_id(txn_id(&ctx.channel, &message_id, "draft"))
                .await
                .ok()?;
            let event_id = sent.response.event_id;
            let mut throttle = EditThrottle::new(app.edit_interval);
            let _ = throttle.offer(now, update.text_so_far);
            let stream = Stream { event_id: event_id.clone(), throttle, sending: Arc::default() };
            lock(&app.streams).insert(message_id, stream);
            return Some(event_id.to_string());
        }
        let offer = {
            let mut streams = lock(&app.streams);
            let stream = streams.get_mut(&message_id)?;
            stream.throttle.offer(now, update.text_so_far)
        };
        match offer {
            Offer::SendNow(text) => app.edit_stream(&room, &message_id, text).await,
            Offer::Later { at_ms } => {
                let handle = ctx.handle.clone();
                let id = message_id.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(
                        at_ms.saturating_sub(handle.now_millis()),
                    ))
                    .await;
                    let due = {
                        let mut streams = lock(&app.streams);
                        streams
                            .get_mut(&id)
                            .and_then(|s| s.throttle.due(handle.now_millis().max(at_ms)))
                    };
                    if let Some(text) = due {
                        app.edit_stream(&room, &id, text).await;
                    }
                });
            }
            Offer::Queued => {}
        }
        update.handle
    }

    async fn activity(&self, ctx: ChannelContext, action: ActivityAction) {
        let Ok(room) = self.0.room(&ctx.binding) else { return };
        let typing = match action {
            ActivityAction::Typing | ActivityAction::Show { .. } => true,
            ActivityAction::Clear => false,
            _ => return,
        };
        let _ = room.typing_notice(typing).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_texts_are_split_under_the_event_limit_at_character_boundaries() {
        let text = "é".repeat(MAX_EVENT_TEXT_BYTES);
        let parts = split_text(&text);
        assert!(parts.len() >= 2);
        assert!(parts.iter().all(|p| p.len() <= MAX_EVENT_TEXT_BYTES));
        assert_eq!(parts.concat(), text);
        assert_eq!(split_text("short"), ["short"]);
    }
}
