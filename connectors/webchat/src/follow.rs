//! Each replica's follower of the room news the others broadcast (the hint's format and why
//! it carries no data are in `live.rs`): it reads the named message from the store and pushes
//! it to this replica's open pages of the room.

use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use xagent_server_runtime::ConnectorHandle;

use crate::app::App;
use crate::live::{TOPIC, parse};

/// Follows the other replicas' hints until the runtime stops.
pub(crate) async fn follow(app: Arc<App>, handle: ConnectorHandle) {
    let mut hints = handle.subscribe_broadcast();
    loop {
        match hints.recv().await {
            Ok(hint) if hint.topic == TOPIC => apply(&app, &hint.message).await,
            Ok(_) => {}
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "room news were missed; pages catch up when they reconnect");
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// Pushes the message a hint names to this replica's pages of its room (read from the store).
pub(crate) async fn apply(app: &App, text: &str) {
    let Some((origin, room_id, message_id)) = parse(text) else { return };
    if origin == app.origin || !app.hub.is_watched(room_id) {
        return;
    }
    let Ok(messages) = app.messages() else { return };
    match messages.entry_by_id(message_id).await {
        Ok(Some((room, entry))) if room == room_id => app.hub.message(room_id, entry),
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "a room's news could not be read"),
    }
}
