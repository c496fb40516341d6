//! The `im.matrix` Connector on the runtime: the Card (target `im`, IM Profile v2), the
//! `matrix_room` pairing flow, the sync loop that turns room events into `chat.message`s, the
//! IM target that posts, streams (edits in place) and shows typing, and the two Tools.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use matrix_sdk::attachment::AttachmentConfig;
use matrix_sdk::config::SyncSettings;
use matrix_sdk::media::{MediaFormat, MediaRequestParameters};
use matrix_sdk::ruma::events::room::MediaSource;
use matrix_sdk::ruma::events::room::message::{
    MessageType, Relation, ReplacementMetadata, RoomMessageEventContent, SyncRoomMessageEvent,
};
use matrix_sdk::ruma::events::{AnySyncMessageLikeEvent, AnySyncTimelineEvent};
use matrix_sdk::ruma::{OwnedEventId, OwnedRoomId, OwnedTransactionId, OwnedUserId, RoomId};
use matrix_sdk::{Client, Room, RoomState};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;
use xagent_file_transfer::{FileReader, FileRecord};
use xagent_profile_im::{ActivityAction, ActivityCapability};
use xagent_protocol_types::{
    AuthSessionId, ChatMessage, Clock, ConnectionStatus, ConnectorChannelId, DescriptorTarget,
    ErrorCode, FileRef, PROFILE_IM_V2, Secret, Security, SystemClock, TargetDeclaration,
    TargetType, TrustLevel,
};
use xagent_server_runtime::{
    AuthContext, AuthError, AuthPrompt, AuthStep, AuthValues, AuthorWrite, Backoff, Binding,
    BoundReason, ChannelContext, Connector, ConnectorHandle, ConnectorServer, DeliveryError,
    DeltaUpdate, EditThrottle, FinalDelivery, FlowHandler, FlowSpec, ImTarget, LinkHealth, Offer,
    RuntimeConfig, ServerError, ToolContext, ToolError, ToolSpec,
};

use crate::MatrixError;
use crate::bot::{self, Credentials};
use crate::pairing::{Pairing, Redeem};

/// The Card id.
pub const CARD_ID: &str = "im.matrix";
/// The provider named in the Card and the Descriptor.
pub const PROVIDER: &str = "matrix";
/// The flow that binds a room to a channel.
pub const ROOM_FLOW: &str = "matrix_room";
/// Send a text to the bound room.
pub const TOOL_MESSAGE_SEND: &str = "matrix_message_send";
/// Send a file to the bound room.
pub const TOOL_FILE_SEND: &str = "matrix_file_send";
/// The primary Skill (`connector-im-matrix`).
pub const SKILL: &str = include_str!("../assets/skill.md");

/// The binding's private entry naming the room.
const ROOM_SECRET: &str = "matrix_room_id";
/// Author records: inbound events already handed to the outbox (key: message id).
const SEEN_NS: &str = "matrix.seen";
/// Author records: the sync position (key [`SYNC_KEY`]).
const SYNC_NS: &str = "matrix.sync";
const SYNC_KEY: &str = "next_batch";
/// Author records: encrypted events not decrypted yet (key: event id).
const UTD_NS: &str = "matrix.utd";
/// The binding's private entry: when the room was paired (Unix ms); no gap is filled from
/// before it.
const PAIRED_AT_SECRET: &str = "matrix_paired_at";
/// How long fetching one inbound file may take (by default; [`MatrixOptions::download_timeout`]).
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the bot stays in a room nobody paired: 1 hour.
pub const UNBOUND_ROOM_TTL_MS: u64 = 60 * 60 * 1000;
/// Undecryptable events kept for another try at once (the oldest go first).
const MAX_UNDECRYPTED: usize = 1_000;
/// Events fetched at most to fill one room's gap after a long absence.
const MAX_GAP_EVENTS: usize = 1_000;

/// The longest text posted as one Matrix event (the homeserver takes events up to 64 KiB in
/// all; longer texts go out as several messages).
pub const MAX_EVENT_TEXT_BYTES: usize = 32_000;
/// How long a sync long-polls.
const SYNC_TIMEOUT: Duration = Duration::from_secs(20);
/// Undecryptable events are tried again for this long (their key may come later).
const UTD_RETRY_MS: u64 = 10 * 60 * 1000;
/// Messages of a room not signed in yet (pairing just done), held until it is.
const MAX_HELD_PER_ROOM: usize = 50;

/// Settings of an `im.matrix` Connector.
pub struct MatrixOptions {
    /// The homeserver's client API, e.g. `https://matrix.example.org`.
    pub homeserver: String,
    /// The bot's user id, `@bot:example.org`.
    pub user: String,
    /// How the bot logs in.
    pub credentials: Credentials,
    /// Where the runtime keeps its database and files, and the bot its session and stores.
    pub state_dir: PathBuf,
    /// The system API key xAgent must present.
    pub api_key: Option<Secret>,
    /// The runtime's limits and timings (the HTTP listener's among them).
    pub runtime: RuntimeConfig,
    /// The clock the runtime and the bot read (pairing codes, rates, leaving idle rooms);
    /// tests move a [`xagent_protocol_types::ManualClock`] instead of waiting.
    pub clock: Arc<dyn Clock>,
    /// How long a file posted in a room may take to download from the media repository
    /// before the agent is told it could not be fetched (the sync waits meanwhile).
    pub download_timeout: Duration,
    /// The least time between two edits of a streamed reply.
    pub edit_interval: Duration,
    /// The largest file taken from or posted to a room.
    pub max_file_bytes: u64,
    /// Rooms the bot stays in without a channel (invites beyond it are declined).
    pub max_unbound_rooms: usize,
    /// Inbound messages taken per room and minute (more are dropped, with a note in the room).
    pub room_messages_per_minute: u32,
    /// How long the homeserver may stay unreachable before channels show `offline`.
    pub offline_after: Duration,
    /// The runtime's state in this PostgreSQL database (feature `postgres`).
    #[cfg(feature = "postgres")]
    pub database_url: Option<xagent_server_runtime::ops::DatabaseUrl>,
}

impl MatrixOptions {
    /// Options with the defaults for everything but the account and the state directory.
    pub fn new(
        homeserver: impl Into<String>,
        user: impl Into<String>,
        credentials: Credentials,
        state_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            homeserver: homeserver.into(),
            user: user.into(),
            credentials,
            state_dir: state_dir.into(),
            api_key: None,
            runtime: RuntimeConfig::default(),
            clock: Arc::new(SystemClock),
            download_timeout: DOWNLOAD_TIMEOUT,
            edit_interval: Duration::from_millis(1_000),
            max_file_bytes: 25 * 1024 * 1024,
            max_unbound_rooms: 20,
            room_messages_per_minute: 60,
            offline_after: Duration::from_secs(30),
            #[cfg(feature = "postgres")]
            database_url: None,
        }
    }
}

impl std::fmt::Debug for MatrixOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credentials and the API key print redacted (they are `Secret`s).
        f.debug_struct("MatrixOptions")
            .field("homeserver", &self.homeserver)
            .field("user", &self.user)
            .field("credentials", &self.credentials)
            .field("state_dir", &self.state_dir)
            .field("api_key", &self.api_key)
            .field("runtime", &self.runtime)
            .field("download_timeout", &self.download_timeout)
            .field("edit_interval", &self.edit_interval)
            .field("max_file_bytes", &self.max_file_bytes)
            .field("max_unbound_rooms", &self.max_unbound_rooms)
            .field("room_messages_per_minute", &self.room_messages_per_minute)
            .field("offline_after", &self.offline_after)
            .finish_non_exhaustive()
    }
}

/// A room paired by a posted code, waiting for its session's `auth.status`.
#[derive(Clone, Debug)]
struct Paired {
    room_id: OwnedRoomId,
    name: String,
    /// When the code was posted (the event's time).
    at: u64,
}

/// One streamed reply: its Matrix event and the edit pacing.
struct Stream {
    event_id: OwnedEventId,
    throttle: EditThrottle,
    /// Held while an edit is being sent, so the final edit is never overtaken.
    sending: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Default)]
struct RoomRate {
    window_start: u64,
    count: u32,
    warned: bool,
}

struct App {
    client: Client,
    bot: OwnedUserId,
    link: String,
    pairing: Mutex<Pairing<(AuthSessionId, ConnectorChannelId)>>,
    prompts: Mutex<HashMap<AuthSessionId, AuthPrompt>>,
    paired: Mutex<HashMap<AuthSessionId, Paired>>,
    rooms: Mutex<HashMap<OwnedRoomId, ConnectorChannelId>>,
    held: Mutex<HashMap<OwnedRoomId, Vec<ChatMessage>>>,
    streams: Mutex<HashMap<String, Stream>>,
    rates: Mutex<HashMap<OwnedRoomId, RoomRate>>,
    utd: Mutex<Vec<(OwnedRoomId, OwnedEventId, u64)>>,
    /// Rooms the bot is in without a channel, since when (they are left after
    /// [`UNBOUND_ROOM_TTL_MS`], so strangers' invites cannot fill the quota for good).
    unbound_since: Mutex<HashMap<OwnedRoomId, u64>>,
    edit_interval: Duration,
    max_file_bytes: u64,
    download_timeout: Duration,
    max_unbound_rooms: usize,
    room_messages_per_minute: u32,
    offline_after: Duration,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The message id of an inbound event: stable, so a redelivered event is a duplicate.
pub fn message_id_of(event_id: &str) -> String {
    let digest = Sha256::digest(event_id.as_bytes());
    format!("mx_{}", hex::encode(&digest[..16]))
}

/// The Matrix transaction id of one part of an outbound message: derived from the channel and
/// the message id, so a redelivered final message (or a repeated Tool call) never posts twice.
fn txn_id(channel: &ConnectorChannelId, message_id: &str, part: &str) -> OwnedTransactionId {
    let digest = Sha256::digest(format!("{channel}\n{message_id}\n{part}").as_bytes());
    OwnedTransactionId::from(format!("xa{}", hex::encode(&digest[..16])).as_str())
}

/// `!abcdef…:server` for the Descriptor: enough to tell rooms apart, not a full id.
fn room_hint(room_id: &RoomId) -> String {
    let text = room_id.as_str();
    let (local, server) = text.split_once(':').unwrap_or((text, ""));
    let short: String = local.chars().take(7).collect();
    if server.is_empty() { format!("{short}…") } else { format!("{short}…:{server}") }
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

/// What the room is told when the runtime refused one of its messages: what to do about it.
pub fn refused_notice(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::PayloadTooLarge => {
            "Your last message is too long for the agent to take. Please shorten it, or send the text as a file."
        }
        _ => "The agent could not take your last message right now. Please send it again later.",
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

fn room_of(binding: &Binding) -> Option<OwnedRoomId> {
    binding.secret(ROOM_SECRET).and_then(|s| RoomId::parse(s.expose()).ok())
}

impl App {
    fn now(handle: &ConnectorHandle) -> u64 {
        handle.now_millis()
    }

    fn room(&self, binding: &Binding) -> Result<Room, DeliveryError> {
        room_of(binding).and_then(|id| self.client.get_room(&id)).ok_or_else(|| {
            DeliveryError::permanent(
                ErrorCode::ConnectionNotAuthenticated,
                "the channel serves no Matrix room the bot is in; pair a room again",
            )
        })
    }

    fn prompt(
        &self,
        session: &AuthSessionId,
        channel: &ConnectorChannelId,
        now: u64,
    ) -> AuthPrompt {
        let (code, expires_at) = lock(&self.pairing).issue((session.clone(), channel.clone()), now);
        let prompt = AuthPrompt {
            qr_code_text: Some(self.link.clone()),
            qr_code_image: None,
            expires_at: Some(expires_at),
            poll_interval_millis: Some(2_000),
            message: Some(format!(
                "Invite {} to your Matrix room (open the link or scan the code), then post this pairing code in the room: {code}",
                self.bot
            )),
        };
        lock(&self.prompts).insert(session.clone(), prompt.clone());
        prompt
    }

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
    async fn sync_loop(self: Arc<Self>, handle: ConnectorHandle, shutdown: CancellationToken) {
        let store = handle.author_store();
        let mut token = match store.get(SYNC_NS, SYNC_KEY).await {
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
                            let next = response.next_batch;
                            let write =
                                AuthorWrite::put(SYNC_NS, SYNC_KEY, next.clone().into_bytes());
                            match write {
                                Ok(write) => match store.commit(vec![write]).await {
                                    Ok(()) => {
                                        tracing::debug!(position = %next, "im.matrix: sync position stored");
                                        token = Some(next)
                                    }
                                    Err(e) => {
                                        tracing::warn!("im.matrix: sync position not stored: {e}")
                                    }
                                },
                                Err(e) => tracing::warn!("im.matrix: sync position too long: {e}"),
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

    /// One timeline event of a joined room.
    async fn event(
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
        match handle.send_message_with(&channel, chat.clone(), vec![seen]).await {
            Ok(()) => {
                tracing::debug!(event = %message.event_id, "im.matrix: queued for xAgent");
                Ok(())
            }
            Err(e) if e.code() == ErrorCode::ConnectionNotAuthenticated => {
                tracing::info!(event = %message.event_id, "im.matrix: held until the channel is signed in");
                // Paired a moment ago: held until the sign-in completes.
                let mut held = lock(&self.held);
                let list = held.entry(room_id.clone()).or_default();
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
    fn channel_of(
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

    /// The `chat.message` for an event's content: text (with the sender's name), or a file
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
        let (source, filename, mime, size, kind) = match content {
            MessageType::Text(t) => {
                return Some(ChatMessage::text(message_id, format!("{sender}{mark}: {}", t.body)));
            }
            MessageType::Notice(t) => {
                return Some(ChatMessage::text(message_id, format!("{sender}{mark}: {}", t.body)));
            }
            MessageType::Emote(t) => {
                return Some(ChatMessage::text(message_id, format!("* {sender}{mark} {}", t.body)));
            }
            MessageType::Image(c) => {
                let info = c.info.as_deref();
                (
                    c.source.clone(),
                    c.filename().to_owned(),
                    info.and_then(|i| i.mimetype.clone()),
                    info.and_then(|i| i.size),
                    "image",
                )
            }
            MessageType::File(c) => {
                let info = c.info.as_deref();
                (
                    c.source.clone(),
                    c.filename().to_owned(),
                    info.and_then(|i| i.mimetype.clone()),
                    info.and_then(|i| i.size),
                    "file",
                )
            }
            MessageType::Audio(c) => {
                let info = c.info.as_deref();
                (
                    c.source.clone(),
                    c.filename().to_owned(),
                    info.and_then(|i| i.mimetype.clone()),
                    info.and_then(|i| i.size),
                    "audio",
                )
            }
            MessageType::Video(c) => {
                let info = c.info.as_deref();
                (
                    c.source.clone(),
                    c.filename().to_owned(),
                    info.and_then(|i| i.mimetype.clone()),
                    info.and_then(|i| i.size),
                    "video",
                )
            }
            _ => return None,
        };
        let too_big = |n: u64| n > self.max_file_bytes;
        let note = |what: &str| {
            ChatMessage::text(
                message_id,
                format!("{sender} sent a {kind} ({filename}) that {what}."),
            )
        };
        if size.is_some_and(|s| too_big(u64::from(s))) {
            return Some(note(&format!(
                "is larger than the {} bytes this Connector takes",
                self.max_file_bytes
            )));
        }
        let bytes = match self.download(source).await {
            Ok(bytes) if too_big(bytes.len() as u64) => {
                return Some(note(&format!(
                    "is larger than the {} bytes this Connector takes",
                    self.max_file_bytes
                )));
            }
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::info!("im.matrix: a file could not be fetched: {e}");
                return Some(note("could not be fetched from the homeserver"));
            }
        };
        let mime = mime.or_else(|| mime_guess::from_path(&filename).first().map(|m| m.to_string()));
        match handle.register_file(channel, &filename, mime.as_deref(), &bytes).await {
            Ok(file) => Some(ChatMessage::with_files(
                message_id,
                Some(format!("{sender}{mark} sent {filename}")),
                vec![file],
            )),
            Err(e) => {
                tracing::warn!("im.matrix: a file could not be kept: {e}");
                Some(note("could not be kept by the Connector"))
            }
        }
    }

    /// Fetches (and decrypts) a file, within [`MatrixOptions::download_timeout`].
    async fn download(&self, source: MediaSource) -> Result<Vec<u8>, String> {
        let request = MediaRequestParameters { source, format: MediaFormat::File };
        let media = self.client.media();
        let fetch = media.get_media_content(&request, false);
        match tokio::time::timeout(self.download_timeout, fetch).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.download_timeout)),
        }
    }

    /// A text posted in a room without a channel: maybe a pairing code.
    async fn pairing_attempt(
        &self,
        handle: &ConnectorHandle,
        room: &Room,
        sender: &str,
        text: &str,
        posted_at: u64,
    ) {
        let now = Self::now(handle);
        let verdict = lock(&self.pairing).redeem(room.room_id().as_str(), sender, text, now);
        let reply = match verdict {
            Redeem::NotACode | Redeem::Locked => return,
            Redeem::Wrong => {
                "That pairing code is not valid (or expired). Ask for a new one where you connect the agent."
            }
            Redeem::Bound((session, channel)) => {
                let taken = lock(&self.rooms).contains_key(room.room_id());
                if taken {
                    "This room is connected to an agent already."
                } else {
                    let name = match room.display_name().await {
                        Ok(name) => name.to_string(),
                        Err(_) => "Matrix room".to_owned(),
                    };
                    let paired = Paired { room_id: room.room_id().to_owned(), name, at: posted_at };
                    lock(&self.paired).insert(session, paired);
                    lock(&self.rooms).insert(room.room_id().to_owned(), channel);
                    "Paired: messages in this room now go to the agent."
                }
            }
        };
        let _ = room.send(RoomMessageEventContent::notice_plain(reply)).await;
    }

    /// A channel signed in or was restored: its room's events go to it from now on.
    async fn bound(&self, ctx: &ChannelContext) {
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
    async fn unbound(&self, ctx: &ChannelContext) {
        let Some(room_id) = room_of(&ctx.binding) else { return };
        lock(&self.rooms).remove(&room_id);
        if let Some(room) = self.client.get_room(&room_id)
            && room.state() == RoomState::Joined
            && let Err(e) = room.leave().await
        {
            tracing::info!("im.matrix: could not leave the room after sign-out: {e}");
        }
    }

    /// Posts a text (split when long) with transaction ids derived from `message_id`.
    async fn post_text(
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
    async fn open_for_posting(
        &self,
        handle: &ConnectorHandle,
        channel: &ConnectorChannelId,
        file_ref: &FileRef,
    ) -> Result<(FileRecord, FileReader), DeliveryError> {
        let (record, reader) = handle.open_file(channel, file_ref).await.map_err(|_| {
            DeliveryError::permanent(ErrorCode::FileNotFound, "no such file on this channel")
        })?;
        if record.byte_size > self.max_file_bytes {
            return Err(DeliveryError::permanent(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the file is larger than the {} bytes this Connector posts",
                    self.max_file_bytes
                ),
            ));
        }
        Ok((record, reader))
    }

    /// Posts an opened file (encrypted in encrypted rooms).
    async fn post_file(
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

struct MatrixTarget(Arc<App>);

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

struct RoomFlow(Arc<App>);

impl FlowHandler for RoomFlow {
    async fn start(&self, ctx: AuthContext, _input: AuthValues) -> Result<AuthStep, AuthError> {
        let now = ctx.handle.now_millis();
        Ok(AuthStep::Pending(self.0.prompt(&ctx.auth_session_id, &ctx.channel, now)))
    }

    async fn status(&self, ctx: AuthContext, refresh: bool) -> Result<AuthStep, AuthError> {
        let app = &self.0;
        if let Some(paired) = lock(&app.paired).remove(&ctx.auth_session_id) {
            lock(&app.prompts).remove(&ctx.auth_session_id);
            let target = DescriptorTarget::new(PROVIDER, paired.name)
                .with_label("Matrix room")
                .with_account_hint(room_hint(&paired.room_id));
            let binding = Binding::new(target)
                .with_secret(ROOM_SECRET, Secret::new(paired.room_id.to_string()))
                .with_secret(PAIRED_AT_SECRET, Secret::new(paired.at.to_string()));
            return Ok(AuthStep::Authenticated(binding));
        }
        let now = ctx.handle.now_millis();
        if refresh {
            return Ok(AuthStep::Pending(app.prompt(&ctx.auth_session_id, &ctx.channel, now)));
        }
        let key = (ctx.auth_session_id.clone(), ctx.channel.clone());
        if !lock(&app.pairing).is_open(&key, now) {
            lock(&app.prompts).remove(&ctx.auth_session_id);
            return Ok(AuthStep::Expired);
        }
        let prompt = lock(&app.prompts).get(&ctx.auth_session_id).cloned().unwrap_or_default();
        Ok(AuthStep::Pending(prompt))
    }

    async fn cancel(&self, ctx: AuthContext) {
        let key = (ctx.auth_session_id.clone(), ctx.channel.clone());
        lock(&self.0.pairing).cancel(&key);
        lock(&self.0.prompts).remove(&ctx.auth_session_id);
        if let Some(paired) = lock(&self.0.paired).remove(&ctx.auth_session_id) {
            lock(&self.0.rooms).remove(&paired.room_id);
        }
    }
}

/// Arguments of `matrix_message_send`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct MessageSendArgs {
    /// The text to post in the Matrix room bound to the current channel.
    #[schemars(length(min = 1, max = 32000))]
    pub text: String,
}

/// Arguments of `matrix_file_send`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct FileSendArgs {
    /// The file to post: one from this conversation (xAgent hands it to the Connector).
    #[schemars(extend("x-xagent-upload-ref" = true))]
    pub file_ref: String,
    /// Optional caption posted with the file.
    #[serde(default)]
    #[schemars(length(max = 4000))]
    pub text: Option<String>,
}

/// The message id of a Tool call's post: derived from the call, so a repeat posts once.
fn tool_message_id(ctx: &ToolContext) -> String {
    let key = ctx
        .tool_call_id
        .as_ref()
        .map(|id| id.to_string())
        .or_else(|| ctx.request_id.as_ref().map(|id| id.to_string()))
        .unwrap_or_else(|| format!("{:x}", rand::random::<u64>()));
    format!("tool:{}:{key}", ctx.tool_id)
}

fn tool_error(e: DeliveryError) -> ToolError {
    ToolError::new(e.code, e.message)
}

async fn message_send(
    app: Arc<App>,
    ctx: ToolContext,
    args: MessageSendArgs,
) -> Result<Value, ToolError> {
    if args.text.trim().is_empty() {
        return Err(ToolError::new(ErrorCode::InvalidArguments, "text must not be empty"));
    }
    let room = app.room(&ctx.binding).map_err(tool_error)?;
    let id = tool_message_id(&ctx);
    let event_id =
        app.post_text(&room, &ctx.channel, &id, &args.text, None).await.map_err(tool_error)?;
    Ok(json!({ "status": "sent", "event_id": event_id.map(|e| e.to_string()) }))
}

async fn file_send(
    app: Arc<App>,
    ctx: ToolContext,
    args: FileSendArgs,
) -> Result<Value, ToolError> {
    let room = app.room(&ctx.binding).map_err(tool_error)?;
    let file_ref = FileRef::new(args.file_ref.as_str());
    let txn = txn_id(&ctx.channel, &tool_message_id(&ctx), "file");
    let posted = match app.open_for_posting(&ctx.handle, &ctx.channel, &file_ref).await {
        Ok(opened) => app.post_file(&room, opened, args.text, txn).await,
        Err(e) => Err(e),
    };
    let event_id = posted.map_err(|e| {
        if e.code == ErrorCode::FileNotFound {
            ToolError::new(
                ErrorCode::FileNotFound,
                "no such file on this channel (unknown or expired); post a file from this conversation",
            )
        } else {
            tool_error(e)
        }
    })?;
    Ok(json!({ "status": "sent", "event_id": event_id.to_string(), "file_ref": args.file_ref }))
}

fn build(app: &Arc<App>) -> Result<Connector, xagent_server_runtime::DefinitionError> {
    let (bound_app, unbound_app) = (Arc::clone(app), Arc::clone(app));
    Connector::builder(CARD_ID, "Matrix", env!("CARGO_PKG_VERSION"))
        .description("Puts an xAgent agent in Matrix rooms, end-to-end encrypted ones too: room members chat with it in any Matrix client.")
        .vendor("xagent-connector-rs")
        .target(TargetDeclaration::new(TargetType::Im, PROVIDER, "Matrix"))
        .profile(PROFILE_IM_V2)
        .security(Security::new(TrustLevel::Local, true).with_data_class("message").with_data_class("file"))
        .qr_flow(
            FlowSpec::new(ROOM_FLOW, "Pair a Matrix room").description(
                "Invite the bot to your room (the link opens its profile), then post the pairing code there.",
            ),
            RoomFlow(Arc::clone(app)),
        )
        .on_bound(move |ctx: ChannelContext, _reason: BoundReason| {
            let app = Arc::clone(&bound_app);
            async move { app.bound(&ctx).await }
        })
        .on_unbound(move |ctx: ChannelContext| {
            let app = Arc::clone(&unbound_app);
            async move {
                app.unbound(&ctx).await;
                Ok(())
            }
        })
        .im_target(MatrixTarget(Arc::clone(app)))
        .skill(SKILL)
        .tool_with(
            app,
            ToolSpec::new(
                TOOL_MESSAGE_SEND,
                "Post a Matrix message\nPost an extra text message in the Matrix room bound to the current channel. Your normal reply is delivered without this tool.",
            ),
            message_send,
        )
        .tool_with(
            app,
            ToolSpec::new(
                TOOL_FILE_SEND,
                "Post a file to the Matrix room\nPost a file from this conversation in the room bound to the current channel (encrypted in encrypted rooms), with an optional caption.",
            ),
            file_send,
        )
        .build()
}

/// A running `im.matrix` Connector: the bot's client and the runtime.
pub struct Matrix {
    client: Client,
    server: ConnectorServer,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matrix").field("user", &self.client.user_id()).finish_non_exhaustive()
    }
}

impl Matrix {
    /// Logs the bot in (or restores its session) and builds the runtime; [`Matrix::serve`]
    /// starts the sync loop with the server.
    pub async fn open(options: MatrixOptions) -> Result<Self, MatrixError> {
        let user: OwnedUserId = options.user.as_str().try_into().map_err(|_| {
            MatrixError::Config(format!(
                "--user {:?} is not a Matrix user id like @bot:example.org",
                options.user
            ))
        })?;
        std::fs::create_dir_all(&options.state_dir).map_err(|e| {
            MatrixError::State(format!("create {}: {e}", options.state_dir.display()))
        })?;
        let client =
            bot::open(&options.homeserver, user.as_str(), &options.credentials, &options.state_dir)
                .await?;
        let app = Arc::new(App {
            client: client.clone(),
            link: format!("https://matrix.to/#/{user}"),
            bot: user,
            pairing: Mutex::new(Pairing::new()),
            prompts: Mutex::default(),
            paired: Mutex::default(),
            rooms: Mutex::default(),
            held: Mutex::default(),
            streams: Mutex::default(),
            rates: Mutex::default(),
            utd: Mutex::default(),
            unbound_since: Mutex::default(),
            edit_interval: options.edit_interval,
            max_file_bytes: options.max_file_bytes,
            download_timeout: options.download_timeout,
            max_unbound_rooms: options.max_unbound_rooms,
            room_messages_per_minute: options.room_messages_per_minute,
            offline_after: options.offline_after,
        });
        let connector = build(&app).map_err(ServerError::from)?;
        let mut builder = ConnectorServer::builder(connector);
        #[cfg(feature = "postgres")]
        if let Some(url) = options.database_url.clone() {
            builder = builder.database_url(url);
        }
        let sync_app = Arc::clone(&app);
        builder = builder
            .config(options.runtime)
            .clock(options.clock)
            .state_dir(&options.state_dir)?
            .task(move |handle, shutdown| sync_app.sync_loop(handle, shutdown));
        if let Some(key) = options.api_key {
            builder = builder.api_key(key);
        }
        let server = builder.build().await?;
        Ok(Self { client, server })
    }

    /// The runtime (handle, Card, router).
    pub fn server(&self) -> &ConnectorServer {
        &self.server
    }

    /// The bot's Matrix client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Serves on `listener` until `shutdown` completes.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        self.server.serve(listener, shutdown).await
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

    #[test]
    fn message_ids_are_stable_per_event() {
        assert_eq!(message_id_of("$a:x"), message_id_of("$a:x"));
        assert_ne!(message_id_of("$a:x"), message_id_of("$b:x"));
    }

    #[test]
    fn the_room_hint_is_not_the_room_id() {
        let id = RoomId::parse("!abcdefghijklmnop:example.org").unwrap();
        let hint = room_hint(&id);
        assert_eq!(hint, "!abcdef…:example.org");
    }
}
