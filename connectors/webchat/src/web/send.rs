//! A visitor's text message: checked, stored once per `client_id`, relayed to the room's
//! channel through the outbox (and handed again when it is stranded).

use super::guard::VisitorLimits;
use super::visitor::{MAX_CLIENT_ID_BYTES, Web, visitor_write};
use crate::app::App;
use crate::error::WebchatError;
use crate::messages::Sent;
use crate::store::{Author, ChatEntry, EntryStatus, random_hex};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::sync::Arc;
use xagent_protocol_types::{ChatMessage, ConnectorChannelId};
use xagent_server_runtime::storage::StorageError;
use xagent_server_runtime::{ConnectorHandle, HandleError};

#[derive(Deserialize)]
pub(crate) struct SendBody {
    pub(crate) text: String,
    #[serde(default)]
    pub(crate) client_id: Option<String>,
}

pub(crate) fn check_client_id(client_id: Option<&str>) -> Result<(), WebchatError> {
    match client_id {
        Some(id) if id.is_empty() || id.len() > MAX_CLIENT_ID_BYTES => {
            Err(WebchatError::InvalidInput("client_id must have 1-100 characters".into()))
        }
        _ => Ok(()),
    }
}

/// The one text rule of every visitor route (H3): trimmed, at most
/// [`VisitorLimits::max_text_chars`] characters; `None` when empty.
pub(crate) fn check_text(
    text: &str,
    limits: &VisitorLimits,
) -> Result<Option<String>, WebchatError> {
    let text = text.trim();
    if text.chars().count() > limits.max_text_chars {
        return Err(WebchatError::InvalidInput(format!(
            "the text must have 1-{} characters",
            limits.max_text_chars
        )));
    }
    Ok(Some(text.to_owned()).filter(|t| !t.is_empty()))
}

/// Hands a stored visitor message (`outbound`, its exact `chat.message`) to the runtime's
/// outbox unless the runtime holds it already (the process stopped between storing and
/// queueing it, or a failover left it `sending`). `when` says in the log which path found it.
pub(crate) async fn requeue(
    handle: &ConnectorHandle,
    channel: &ConnectorChannelId,
    message_id: &str,
    outbound: &str,
    when: &str,
) {
    if handle.pending_messages(channel).iter().any(|id| id.as_str() == message_id) {
        return;
    }
    let Ok(message) = serde_json::from_str::<ChatMessage>(outbound) else { return };
    if let Err(error) = handle.send_message(channel, message).await {
        tracing::info!(%error, when, "a stored visitor message could not be queued again");
    }
}

/// Queues a repeated send's stored message again when the runtime does not hold it.
pub(crate) async fn resubmit(web: &Web, channel: &ConnectorChannelId, message_id: &str) {
    let Ok(handle) = web.handle() else { return };
    let Ok(messages) = web.app.messages() else { return };
    let Ok(Some((_, outbound))) = messages.outbound_of(message_id).await else { return };
    requeue(handle, channel, message_id, &outbound, "repeated send").await;
}

/// Queues every stored visitor message the runtime does not hold (called at start: a
/// message stored just before a crash is delivered after it).
pub(crate) async fn recover_pending(app: Arc<App>, handle: ConnectorHandle) {
    let Ok(messages) = app.messages() else { return };
    let Ok(sending) = messages.sending().await else { return };
    for (room_id, message_id, outbound) in sending {
        let Ok(store) = app.store() else { return };
        let Ok(Some(room)) = store.room(&room_id).await else { continue };
        let Some(channel) = room.channel else { continue };
        requeue(&handle, &channel, &message_id, &outbound, "start").await;
    }
}

/// Stores a visitor message, shows it, and hands it to xAgent through the runtime's outbox.
/// The stored row keeps the exact `chat.message`, so a repeat of the send (same
/// `client_id`) or the next start queues it again if it never reached the outbox (M4).
pub(crate) async fn relay(
    web: &Web,
    room_id: &str,
    entry: ChatEntry,
    message: ChatMessage,
) -> Result<ChatEntry, WebchatError> {
    let room = web.app.store()?.room(room_id).await?.ok_or(WebchatError::Forbidden)?;
    let channel = room.channel.ok_or(WebchatError::NoAgent)?;
    let outbound = serde_json::to_string(&message)
        .map_err(|e| StorageError::new("encoding an outbound message", e))?;
    let handle = web.handle()?;
    let sent = web
        .app
        .messages()?
        .insert_sent(
            room_id,
            &entry,
            &outbound,
            |writes| handle.send_message_with(&channel, message, writes),
            |error: &HandleError| {
                tracing::info!(%error, room = room_id, "the runtime did not take a visitor message");
                match error.code() {
                    xagent_protocol_types::ErrorCode::ConnectionNotAuthenticated
                    | xagent_protocol_types::ErrorCode::ConnectionNotFound => {
                        "the agent is not connected to this room right now; send it again later"
                            .to_owned()
                    }
                    _ => format!("not sent: {error}"),
                }
            },
        )
        .await?;
    let entry = match sent {
        Sent::Existing(existing) => {
            if existing.status == EntryStatus::Sending {
                resubmit(web, &channel, &existing.message_id).await;
            }
            return Ok(existing);
        }
        Sent::Queued(entry) | Sent::Refused(entry) => entry,
    };
    web.app.publish(room_id, entry.clone());
    Ok(entry)
}

pub(crate) async fn send_text(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    headers: HeaderMap,
    Json(body): Json<SendBody>,
) -> Result<Response, WebchatError> {
    visitor_write(&web, &room_id, &headers).await?;
    check_client_id(body.client_id.as_deref())?;
    let text = check_text(&body.text, &web.limits)?.ok_or_else(|| {
        WebchatError::InvalidInput(format!(
            "the text must have 1-{} characters",
            web.limits.max_text_chars
        ))
    })?;
    let now = web.now();
    let message_id = format!("msg_web_{}", random_hex(12));
    let entry = ChatEntry {
        message_id: message_id.clone(),
        author: Author::Visitor,
        text: Some(text.clone()),
        files: vec![],
        status: EntryStatus::Sending,
        error: None,
        client_id: body.client_id,
        created_at: now,
    };
    let message = ChatMessage::text(message_id, text).created_at(now);
    Ok(Json(relay(&web, &room_id, entry, message).await?).into_response())
}
