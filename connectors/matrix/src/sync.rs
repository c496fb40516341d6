//! The sync loop: long-polls the homeserver, fills gaps after an absence, keeps encrypted
//! events for another decryption try, accepts invites and leaves rooms nobody paired.

use std::sync::Arc;
use std::time::Duration;

use matrix_sdk::RoomState;
use matrix_sdk::config::SyncSettings;
use matrix_sdk::ruma::{OwnedEventId, OwnedRoomId, RoomId};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use xagent_protocol_types::{ConnectionStatus, ConnectorChannelId};
use xagent_server_runtime::{AuthorWrite, Backoff, ConnectorHandle, LinkHealth};

use crate::app::{App, lock, room_hint};
use crate::intake::message_id_of;
use crate::names::{PAIRED_AT_SECRET, SEEN_NS, SYNC_KEY, SYNC_NS, UTD_NS};

/// How long the bot stays in a room nobody paired: 1 hour.
pub const UNBOUND_ROOM_TTL_MS: u64 = 60 * 60 * 1000;
/// Undecryptable events kept for another try at once (the oldest go first).
const MAX_UNDECRYPTED: usize = 1_000;
/// Events fetched at most to fill one room's gap after a long absence.
const MAX_GAP_EVENTS: usize = 1_000;
/// How long a sync long-polls.
const SYNC_TIMEOUT: Duration = Duration::from_secs(20);
/// Undecryptable events are tried again for this long (their key may come later).
const UTD_RETRY_MS: u64 = 10 * 60 * 1000;

/// How long the homeserver asked to wait (a 429's `retry_after_ms`).
fn retry_after(e: &matrix_sdk::Error) -> Option<Duration> {
    use matrix_sdk::ruma::api::error::{ErrorKind, LimitExceededErrorData, RetryAfter};
    match e.client_api_error_kind() {
        Some(ErrorKind::LimitExceeded(LimitExceededErrorData {
            retry_after: Some(after), ..
        })) => match after {
            RetryAfter::Delay(d) => Some(*d),
            RetryAfter::DateTime(at) => {
                Some(at.duration_since(std::time::SystemTime::now()).unwrap_or_default())
            }
        },
        _ => None,
    }
}

/// True for an event that is not readable yet: one the SDK could not decrypt, and one it
/// did not even try (it still has the `m.room.encrypted` type, e.g. when the crypto machine
/// was not ready): both wait for another try instead of being taken for a non-message.
fn still_encrypted(event: &matrix_sdk::deserialized_responses::TimelineEvent) -> bool {
    matches!(
        event.kind,
        matrix_sdk::deserialized_responses::TimelineEventKind::UnableToDecrypt { .. }
    ) || event.raw().get_field::<String>("type").ok().flatten().as_deref()
        == Some("m.room.encrypted")
}

impl App {
    /// Sets every bound channel's status (the homeserver went away or came back).
    async fn show_status(&self, handle: &ConnectorHandle, status: ConnectionStatus) {
        // A room the bot was removed from stays `degraded` whatever the homeserver does.
        let channels: Vec<ConnectorChannelId> = lock(&self.rooms)
            .iter()
            .filter(|(room, _)| {
                self.client.get_room(room).is_none_or(|r| r.state() == RoomState::Joined)
            })
            .map(|(_, channel)| channel.clone())
            .collect();
        tracing::info!(?status, channels = channels.len(), "im.matrix: homeserver link changed");
        for channel in channels {
            let _ = handle.set_status(&channel, status.clone()).await;
        }
    }

    /// The sync loop: long-polls the homeserver from the stored position, hands what arrived
    /// to the outbox, then stores the new position. Failures back off (honouring the
    /// homeserver's retry-after) and show in every bound channel's status.
    pub(crate) async fn sync_loop(
        self: Arc<Self>,
        handle: ConnectorHandle,
        shutdown: CancellationToken,
    ) {
        let mut token = match handle.author_store().get(SYNC_NS, SYNC_KEY).await {
            Ok(Some(bytes)) => String::from_utf8(bytes).ok(),
            _ => None,
        };
        tracing::debug!(position = ?token, "im.matrix: syncing from the stored position");
        self.load_undecrypted(&handle).await;
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        let mut health = LinkHealth::new(self.offline_after);
        loop {
            let mut settings = SyncSettings::default().timeout(SYNC_TIMEOUT);
            if let Some(token) = &token {
                settings = settings.token(token.clone());
            }
            let result = tokio::select! {
                () = shutdown.cancelled() => return,
                result = self.client.sync_once(settings) => result,
            };
            let delay = match result {
                Ok(response) => {
                    if let Some(status) = health.succeeded() {
                        self.show_status(&handle, status).await;
                    }
                    match self.take(&handle, response.rooms).await {
                        Ok(()) => {
                            backoff.reset();
                            if self.store_position(&handle, &response.next_batch).await {
                                token = Some(response.next_batch);
                            }
                            self.retry_undecrypted(&handle).await;
                            self.leave_idle_rooms(&handle).await;
                            continue;
                        }
                        Err(e) => {
                            // Nothing advanced: the same batch comes again (duplicates are known).
                            tracing::warn!(
                                "im.matrix: a batch could not be handed over, retrying: {e}"
                            );
                            backoff.next_delay(None)
                        }
                    }
                }
                Err(e) => {
                    tracing::info!("im.matrix: sync failed: {e}");
                    if let Some(status) = health.failed(Self::now(&handle)) {
                        self.show_status(&handle, status).await;
                    }
                    backoff.next_delay(retry_after(&e))
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Stores the position after a batch was handed over; false when it was not stored (the
    /// next sync starts from the older one, and the events it brings again are known).
    async fn store_position(&self, handle: &ConnectorHandle, next: &str) -> bool {
        let write = match AuthorWrite::put(SYNC_NS, SYNC_KEY, next.as_bytes().to_vec()) {
            Ok(write) => write,
            Err(e) => {
                tracing::warn!("im.matrix: sync position too long: {e}");
                return false;
            }
        };
        match handle.author_store().commit(vec![write]).await {
            Ok(()) => {
                tracing::debug!(position = %next, "im.matrix: sync position stored");
                true
            }
            Err(e) => {
                tracing::warn!("im.matrix: sync position not stored: {e}");
                false
            }
        }
    }

    /// Handles one sync's room updates: invites, then every timeline event.
    async fn take(
        &self,
        handle: &ConnectorHandle,
        rooms: matrix_sdk::sync::RoomUpdates,
    ) -> Result<(), String> {
        for room_id in rooms.invited.keys() {
            self.invited(room_id).await;
        }
        for (room_id, update) in rooms.joined {
            tracing::debug!(
                room = %room_hint(&room_id),
                events = update.timeline.events.len(),
                limited = update.timeline.limited,
                "im.matrix: sync batch"
            );
            if update.timeline.limited
                && let Some(prev_batch) = &update.timeline.prev_batch
            {
                // More happened than one sync carries (the Connector was away): fetch the
                // gap before the events that came.
                for event in self.gap(handle, &room_id, prev_batch).await? {
                    self.timeline_event(handle, &room_id, event).await?;
                }
            }
            for event in update.timeline.events {
                self.timeline_event(handle, &room_id, event).await?;
            }
        }
        for room_id in rooms.left.keys() {
            let channel = lock(&self.rooms).get(room_id).cloned();
            if let Some(channel) = channel {
                tracing::warn!(%channel, "im.matrix: the bot left or was removed from a bound room");
                let _ = handle.set_status(&channel, ConnectionStatus::Degraded).await;
            }
        }
        Ok(())
    }

    /// One event of a room's timeline: handled, or kept (durably) for another decryption try.
    async fn timeline_event(
        &self,
        handle: &ConnectorHandle,
        room_id: &OwnedRoomId,
        event: matrix_sdk::deserialized_responses::TimelineEvent,
    ) -> Result<(), String> {
        if still_encrypted(&event) {
            let Some(event_id) = event.event_id() else { return Ok(()) };
            let now = Self::now(handle);
            tracing::debug!(event = %event_id, "im.matrix: undecryptable for now");
            tracing::info!(room = %room_hint(room_id), "im.matrix: an encrypted message cannot be decrypted yet; trying again as keys arrive");
            // Kept in the store before the sync position moves past it.
            let record = json!({ "room": room_id.as_str(), "since": now });
            let write = AuthorWrite::put_json(UTD_NS, event_id.as_str(), &record)
                .map_err(|e| e.to_string())?;
            handle.author_store().commit(vec![write]).await.map_err(|e| e.to_string())?;
            let mut utd = lock(&self.utd);
            if utd.len() >= MAX_UNDECRYPTED {
                utd.remove(0);
            }
            utd.push((room_id.clone(), event_id, now));
            return Ok(());
        }
        let parsed = match event.raw().deserialize() {
            Ok(parsed) => parsed,
            Err(e) => {
                tracing::debug!(event = ?event.event_id(), "im.matrix: an event that does not parse is skipped: {e}");
                return Ok(());
            }
        };
        self.event(handle, room_id, parsed).await
    }

    /// The events of a bound room between `prev_batch` and what was handed over already
    /// (oldest first): at most [`MAX_GAP_EVENTS`], and none from before the room was paired.
    async fn gap(
        &self,
        handle: &ConnectorHandle,
        room_id: &OwnedRoomId,
        prev_batch: &str,
    ) -> Result<Vec<matrix_sdk::deserialized_responses::TimelineEvent>, String> {
        let Some(channel) = self.channel_of(handle, room_id) else { return Ok(Vec::new()) };
        let Some(room) = self.client.get_room(room_id) else { return Ok(Vec::new()) };
        let paired_at = handle
            .binding(&channel)
            .and_then(|b| b.secret(PAIRED_AT_SECRET).and_then(|s| s.expose().parse::<u64>().ok()))
            .unwrap_or(0);
        let store = handle.author_store();
        let mut earlier = Vec::new();
        let mut from = prev_batch.to_owned();
        'pages: while earlier.len() < MAX_GAP_EVENTS {
            let mut options = matrix_sdk::room::MessagesOptions::backward().from(from.as_str());
            options.limit = matrix_sdk::ruma::UInt::from(50_u32);
            let page = room.messages(options).await.map_err(|e| format!("fetching a gap: {e}"))?;
            for event in page.chunk {
                let ts =
                    event.raw().get_field::<u64>("origin_server_ts").ok().flatten().unwrap_or(0);
                if ts < paired_at {
                    break 'pages;
                }
                if let Some(event_id) = event.event_id()
                    && matches!(
                        store.get(SEEN_NS, &message_id_of(event_id.as_str())).await,
                        Ok(Some(_))
                    )
                {
                    break 'pages;
                }
                earlier.push(event);
            }
            match page.end {
                Some(end) if end != from => from = end,
                _ => break,
            }
        }
        earlier.truncate(MAX_GAP_EVENTS);
        earlier.reverse();
        tracing::debug!(room = %room_hint(room_id), events = earlier.len(), "im.matrix: gap fetched");
        Ok(earlier)
    }

    /// Tries the held undecryptable events again (their room key may have arrived).
    async fn retry_undecrypted(&self, handle: &ConnectorHandle) {
        let now = Self::now(handle);
        let waiting: Vec<_> = std::mem::take(&mut *lock(&self.utd));
        let mut still = Vec::new();
        for (room_id, event_id, since) in waiting {
            let Some(room) = self.client.get_room(&room_id) else { continue };
            match room.event(&event_id, None).await {
                Ok(event) if !still_encrypted(&event) => {
                    tracing::debug!(event = %event_id, "im.matrix: decrypted on a later try");
                    let handed = match event.raw().deserialize() {
                        Ok(parsed) => self.event(handle, &room_id, parsed).await.is_ok(),
                        Err(_) => true,
                    };
                    if handed {
                        self.forget_undecrypted(handle, &event_id).await;
                    } else {
                        still.push((room_id, event_id, since));
                    }
                }
                _ if now.saturating_sub(since) < UTD_RETRY_MS => {
                    still.push((room_id, event_id, since))
                }
                _ => {
                    tracing::warn!(room = %room_hint(&room_id), "im.matrix: an encrypted message stayed undecryptable; its sender's device never shared the key with the bot");
                    self.forget_undecrypted(handle, &event_id).await;
                }
            }
        }
        lock(&self.utd).extend(still);
    }

    async fn forget_undecrypted(&self, handle: &ConnectorHandle, event_id: &OwnedEventId) {
        if let Ok(write) = AuthorWrite::delete(UTD_NS, event_id.as_str()) {
            let _ = handle.author_store().commit(vec![write]).await;
        }
    }

    /// The undecryptable events a previous run kept.
    async fn load_undecrypted(&self, handle: &ConnectorHandle) {
        let scan = xagent_server_runtime::AuthorScan::prefix(
            "",
            xagent_server_runtime::MAX_AUTHOR_SCAN_LIMIT,
        );
        let Ok(records) = handle.author_store().scan(UTD_NS, &scan).await else { return };
        let mut utd = lock(&self.utd);
        for record in records {
            let Ok(value) = serde_json::from_slice::<Value>(&record.value) else { continue };
            let room = value["room"].as_str().and_then(|r| RoomId::parse(r).ok());
            let event = OwnedEventId::try_from(record.key.as_str()).ok();
            if let (Some(room), Some(event)) = (room, event) {
                utd.push((room, event, value["since"].as_u64().unwrap_or(0)));
            }
        }
    }

    /// Leaves the rooms that stayed without a channel for [`UNBOUND_ROOM_TTL_MS`].
    async fn leave_idle_rooms(&self, handle: &ConnectorHandle) {
        let now = Self::now(handle);
        let joined = self.client.joined_rooms();
        let idle: Vec<OwnedRoomId> = {
            let bound = lock(&self.rooms);
            let mut since = lock(&self.unbound_since);
            since.retain(|room, _| joined.iter().any(|j| j.room_id() == room));
            for room in &joined {
                if !bound.contains_key(room.room_id()) {
                    since.entry(room.room_id().to_owned()).or_insert(now);
                }
            }
            since
                .iter()
                .filter(|(room, at)| {
                    !bound.contains_key(*room) && now.saturating_sub(**at) >= UNBOUND_ROOM_TTL_MS
                })
                .map(|(room, _)| room.clone())
                .collect()
        };
        for room_id in idle {
            if let Some(room) = self.client.get_room(&room_id) {
                tracing::info!(room = %room_hint(&room_id), "im.matrix: leaving a room that was never paired");
                let _ = room.leave().await;
            }
            lock(&self.unbound_since).remove(&room_id);
        }
    }

    /// Accepts an invite unless the bot already sits in too many rooms without a channel.
    async fn invited(&self, room_id: &RoomId) {
        let Some(room) = self.client.get_room(room_id) else { return };
        let bound = lock(&self.rooms).len();
        let joined = self.client.joined_rooms().len();
        if joined.saturating_sub(bound) >= self.max_unbound_rooms {
            tracing::warn!(room = %room_hint(room_id), "im.matrix: invite declined: too many rooms without a channel");
            let _ = room.leave().await;
            return;
        }
        if let Err(e) = room.join().await {
            tracing::info!(room = %room_hint(room_id), "im.matrix: could not accept an invite: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encrypted_event_the_sdk_did_not_decrypt_waits_for_another_try() {
        use matrix_sdk::deserialized_responses::TimelineEvent;
        let raw = |kind: &str, content: serde_json::Value| {
            let event = json!({
                "type": kind, "event_id": "$e:x", "sender": "@a:x",
                "origin_server_ts": 1, "content": content,
            });
            TimelineEvent::from_plaintext(
                matrix_sdk::ruma::serde::Raw::from_json_string(event.to_string()).expect("json"),
            )
        };
        let untried = raw(
            "m.room.encrypted",
            json!({"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgA", "sender_key": "k",
                   "device_id": "D", "session_id": "s"}),
        );
        assert!(still_encrypted(&untried), "not taken for a non-message and dropped");
        let plain = raw("m.room.message", json!({"msgtype": "m.text", "body": "hi"}));
        assert!(!still_encrypted(&plain));
    }
}
