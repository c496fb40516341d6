//! # xagent-connector-webchat
//!
//! `im.webchat`, the reference IM Connector of the toolkit: it puts an xAgent agent on a web
//! page. A visitor chats in the browser; the Connector relays each message to xAgent over the
//! Connector Protocol 3.0 with IM Profile v2 (`xagent.im.v2`), and the agent's reply streams
//! back live into the page. It needs no outside service and is built only on the public API
//! of `xagent-server-runtime`, `xagent-file-transfer` and `xagent-profile-im`.
//!
//! - Card `im.webchat`, target type `im`, provider `webchat`, Profile `xagent.im.v2`, primary
//!   Skill `connector-im-webchat` at `/skill.md`.
//! - Auth flows binding a channel to a chat room: `webchat_qr_login` (`qr_login`, a one-time
//!   pairing link as a QR code) and `webchat_room` (`form`: `room_name`, `access_code`,
//!   `owner_code`, which a new room needs).
//! - The chat page at `/chat/` (see the `web` module docs for its JSON + SSE API), Tools
//!   `webchat_message_send` and `webchat_file_send`.
//! - State: everything in the runtime's storage (`connector.sqlite3` under the state
//!   directory, or PostgreSQL): rooms, visitor sessions, upload quota, wrong-code budgets and
//!   messages through its author store, so replicas on one database share them; files under
//!   `<state dir>/files` or in PostgreSQL. An older version's `webchat.sqlite3` is moved in at
//!   start ([`import_legacy_state`]).
//!
//! ```no_run
//! use xagent_connector_webchat::{Webchat, WebchatOptions};
//! use xagent_protocol_types::Secret;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let options = WebchatOptions::new("./state", "http://127.0.0.1:8080")
//!     .with_api_key(Secret::new("a long random system key"));
//! let webchat = Webchat::open(options).await?;
//! assert_eq!(webchat.card().connector_card_id.as_str(), "im.webchat");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! webchat.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```
//!
//! ## Modules and which way they depend
//!
//! Rows are listed top first: a module imports only its own row and rows below it, and no two
//! files import each other in a circle (`tests/module_layers.rs` checks both).
//!
//! **The replica's tasks and the visitor side.**
//!
//! | module | holds |
//! |---|---|
//! | `ticks`, `follow` | background tasks: delivery states from the outbox and the sweep; other replicas' room news |
//! | `web` | the page, its API and event streams, the visitor limits |
//! | `legacy` | the move of an older version's database |
//!
//! **The Connector and the room state.**
//!
//! | module | holds |
//! |---|---|
//! | `connector` | the definition: the Card, the IM target, the registration of flows and Tools |
//! | `flows`, `tools` | the auth flows binding a channel to a room; the Tools |
//! | `app` | `App`, what every part of a replica shares |
//! | `messages` | every room's conversation in the author store |
//! | `pairing`, `hub` | the QR pairing flow; the pages' live state per room |
//! | `live`, `qr` | the room news hint; QR codes |
//! | `store` | rooms, sessions, uploads and limits in the author store |
//! | `guess` | the one limiter on guessing a room's secrets |
//! | `quota`, `rate`, `names` | the daily upload allowance; the burst-then-interval rule; the Connector's names |
//! | `error` | [`WebchatError`] |
//! | `pairing_error` | [`PairingError`] |
//!
//! ## Decisions where the protocol texts are silent
//!
//! - **One channel per room, one room per channel.** A room is served by one channel at a
//!   time; signing another channel in to it takes the room's owner code (the visitors' access
//!   code alone is not enough) and marks the earlier channel `revoked`; signing a channel in to
//!   another room unbinds it from the first. Logout or unregistration leaves the room and its
//!   history in place, without an agent, until a channel binds it again. A new room needs an
//!   owner code; a room without one (QR-paired, or older) stays with the channel holding it.
//! - **Room ids** are the room name lower-cased with every run of other characters turned
//!   into `-` (`Support Desk` -> `support-desk`); names have 1-64 characters. Access and owner
//!   codes of new rooms have at least 8 characters and are stored as salted SHA-256 only,
//!   compared in constant time. Wrong codes are limited per address (joins) or per channel
//!   (`auth.start`) with a backoff that refused tries extend, and per room with a budget that
//!   refills ([`GuessPolicy`]): one address never locks a room for the others.
//! - **What one address or room may take**: event streams are capped per session, per visitor
//!   address, per room and in total; an address starts a limited number of sessions a minute;
//!   a room takes at most a share of the day's all-visitor upload quota, reserved before the
//!   file is stored ([`VisitorLimits`] has every number).
//! - **Pairing** (`webchat_qr_login`): the link `{public url}/chat/pair/{token}` (128 random
//!   bits) lives 5 minutes. Opening it makes the session `scanned`; confirming on the page
//!   creates a new room with a random access code (shown once on the page) and binds it; the
//!   next `auth.status` reports `authenticated`. After expiry `auth.status` reports
//!   `qr_refresh_required`, and `refresh: true` issues a new link and retires the old one.
//!   Pairings are in the runtime's storage (the token as a hash only), so a link opens and is
//!   confirmed, exactly once, on any replica.
//! - **Visitor sessions**: joining with the access code (or confirming a pairing) gives a
//!   token kept hashed in the database, in an `HttpOnly` cookie for the page (and in the answer
//!   for API clients); it opens that room only, lives 7 days and can be revoked; ending it ends
//!   its open event streams at once. Every limit a visitor meets is a field of
//!   [`VisitorLimits`]; SECURITY.md lists them.
//! - **Delivery state on the page**: a visitor message is `sending` until the runtime's outbox
//!   reports it delivered (`accepted`/`duplicate`), `rejected` (with the receiver's reason)
//!   or `expired`. The page repeats a failed send with the same `client_id`, which the
//!   Connector answers with the stored message instead of sending twice.
//! - **Streaming**: deltas grow one draft per room; the final `chat.message` replaces it. Agent
//!   files are served to the page under the room (`/chat/api/rooms/{room}/files/{file_ref}`),
//!   inline for allow-listed raster images, as sandboxed downloads otherwise.
//! - **Tools** derive the shown message id from the channel, Tool and `tool_call_id` (or
//!   `request_id`), so a repeated call shows one message even after the runtime's repeat
//!   window.
//! - The Connector is served at the root of its origin (no Base URL path prefix).

mod app;
mod connector;
mod error;
mod flows;
mod follow;
mod guess;
mod hub;
mod legacy;
mod live;
mod messages;
mod names;
mod pairing;
mod pairing_error;
mod qr;
mod quota;
mod rate;
mod store;
mod ticks;
mod tools;
mod web;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use xagent_protocol_types::{Clock, ConnectorCard, Secret, SystemClock};
use xagent_server_runtime::{CancellationToken, ConnectorHandle, ConnectorServer, RuntimeConfig};

pub use error::WebchatError;
pub use guess::{GuessPolicy, Refused};
pub use hub::{Activity, Draft, RoomEvent};
pub use legacy::{LegacyImport, import_legacy_state, migrated_path};
pub use names::{CARD_ID, PROVIDER, QR_FLOW, ROOM_FLOW, SKILL, TOOL_FILE_SEND, TOOL_MESSAGE_SEND};
pub use pairing::PAIRING_LINK_TTL_MILLIS;
pub use pairing_error::PairingError;
pub use qr::{qr_data_url, qr_png};
pub use quota::UploadQuota;
pub use store::MIN_ACCESS_CODE_CHARS;
pub use store::{
    Author, ChatEntry, EntryFile, EntryStatus, HISTORY_LIMIT, WEBCHAT_DATABASE_FILE,
    room_id_from_name,
};
pub use web::{MAX_PAGE_UPLOAD_BYTES, MAX_TEXT_CHARS, VisitorLimits};

use app::App;
use store::Store;

/// How to run the Connector.
#[derive(Clone)]
#[non_exhaustive]
pub struct WebchatOptions {
    /// The state directory: the runtime's SQLite database and the files (nothing of them
    /// when PostgreSQL holds the state).
    pub state_dir: PathBuf,
    /// The system API key xAgent must present (`/health`, `/ws`, `/files/uploads`).
    pub api_key: Option<Secret>,
    /// The absolute URL visitors reach the Connector at (pairing links start with it).
    pub public_url: String,
    /// The clock (tests inject a `ManualClock`).
    pub clock: Arc<dyn Clock>,
    /// The runtime's tunables (maintenance interval, lease, listener limits, ...).
    pub config: RuntimeConfig,
    /// What one visitor, address or room may cost (SECURITY.md lists every limit).
    pub visitor_limits: VisitorLimits,
    /// Wrong codes tolerated through `auth.start` per channel and per room (F21; default
    /// [`GuessPolicy::sign_in`]).
    pub sign_in_limits: GuessPolicy,
    /// The runtime's state in this PostgreSQL database instead of SQLite (feature
    /// `postgres`): the Connector's own records and the files go there too.
    #[cfg(feature = "postgres")]
    pub database_url: Option<xagent_server_runtime::ops::DatabaseUrl>,
}

impl std::fmt::Debug for WebchatOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebchatOptions")
            .field("state_dir", &self.state_dir)
            .field("api_key", &self.api_key)
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

impl WebchatOptions {
    /// Options with a state directory and the public URL; no API key, the system clock.
    pub fn new(state_dir: impl Into<PathBuf>, public_url: impl Into<String>) -> Self {
        Self {
            state_dir: state_dir.into(),
            api_key: None,
            public_url: public_url.into().trim_end_matches('/').to_owned(),
            clock: Arc::new(SystemClock),
            config: RuntimeConfig::default(),
            visitor_limits: VisitorLimits::default(),
            sign_in_limits: GuessPolicy::sign_in(),
            #[cfg(feature = "postgres")]
            database_url: None,
        }
    }

    /// Keeps the runtime's state in this PostgreSQL database (feature `postgres`).
    #[cfg(feature = "postgres")]
    #[must_use]
    pub fn with_database_url(mut self, url: xagent_server_runtime::ops::DatabaseUrl) -> Self {
        self.database_url = Some(url);
        self
    }

    /// Sets the limits on wrong codes through `auth.start` (F21).
    #[must_use]
    pub fn with_sign_in_limits(mut self, limits: GuessPolicy) -> Self {
        self.sign_in_limits = limits;
        self
    }

    /// Sets the visitor limits.
    #[must_use]
    pub fn with_visitor_limits(mut self, limits: VisitorLimits) -> Self {
        self.visitor_limits = limits;
        self
    }

    /// Sets the runtime's tunables.
    #[must_use]
    pub fn with_config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// Requires this system API key.
    #[must_use]
    pub fn with_api_key(mut self, key: Secret) -> Self {
        self.api_key = Some(key);
        self
    }

    /// Injects the clock.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

/// A running `im.webchat` Connector: the protocol runtime plus the chat page.
#[derive(Clone)]
pub struct Webchat {
    server: ConnectorServer,
    app: Arc<App>,
}

impl std::fmt::Debug for Webchat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webchat").field("public_url", &self.app.public_url).finish_non_exhaustive()
    }
}

impl Webchat {
    /// Opens the state directory and starts the runtime (restored channels keep their rooms).
    pub async fn open(options: WebchatOptions) -> Result<Self, WebchatError> {
        let app = Arc::new(App {
            store: std::sync::OnceLock::new(),
            handle: std::sync::OnceLock::new(),
            origin: store::random_hex(8),
            messages: std::sync::OnceLock::new(),
            hub: hub::Hub::default(),
            pairings: std::sync::OnceLock::new(),
            sign_ins: tokio::sync::Mutex::new(guess::GuessLimiter::new(options.sign_in_limits)),
            public_url: options.public_url.clone(),
        });
        let connector = connector::build(Arc::clone(&app))?;
        let (page, relay, presence) = (Arc::clone(&app), Arc::clone(&app), Arc::clone(&app));
        let recover = Arc::clone(&app);
        let follow = Arc::clone(&app);
        let sweep = Arc::clone(&app);
        let limits = options.visitor_limits.clone();
        let mut builder = ConnectorServer::builder(connector);
        #[cfg(feature = "postgres")]
        let shared_storage = options.database_url.is_some();
        #[cfg(not(feature = "postgres"))]
        let shared_storage = false;
        #[cfg(feature = "postgres")]
        if let Some(url) = options.database_url.clone() {
            builder = builder.database_url(url);
        }
        builder = builder
            .state_dir(&options.state_dir)?
            .clock(Arc::clone(&options.clock))
            .config(runtime_config(&options))
            .routes(move |handle| {
                let shutdown = handle.shutdown_signal();
                web::router(page, handle, shutdown, limits)
            })
            // Visitor messages stored but never queued (a stop in between) are queued now.
            .task(move |handle, shutdown| until(shutdown, web::recover_pending(recover, handle)))
            .task(move |handle, shutdown| {
                until(shutdown, ticks::relay_outbox_events(relay, handle))
            })
            // Visitor messages left `sending` after a failover get their state.
            .task(move |handle, shutdown| until(shutdown, ticks::sweep_stranded(sweep, handle)))
            .task(move |handle, shutdown| until(shutdown, watch_presence(presence, handle)))
            // Other replicas' room news reach this one's pages.
            .task(move |handle, shutdown| until(shutdown, follow::follow(follow, handle)));
        if let Some(key) = options.api_key.clone() {
            builder = builder.api_key(key);
        }
        let server = builder.build().await?;
        let authors = server.handle().author_store();
        // What an older version kept in webchat.sqlite3 moves to the runtime's storage once.
        let now = server.handle().now_millis();
        if let Some(moved) = legacy::import_legacy_state(&options.state_dir, &authors, now).await? {
            tracing::info!(?moved, "moved webchat.sqlite3 into the runtime's storage");
        }
        let store = Store::new(authors.clone());
        if !shared_storage {
            // The only process on this storage: no other upload is running anywhere.
            store.release_all_pending_uploads().await?;
        }
        let _ = app.store.set(store);
        let _ = app.pairings.set(pairing::Pairings::new(authors.clone()));
        let _ = app.messages.set(messages::Messages::with_hints(authors, &app.origin));
        let _ = app.handle.set(server.handle());
        let handle = server.handle();
        app.hub.set_gauges(hub::HubGauges {
            streams: handle
                .gauge("webchat_visitor_streams", "Visitors' open event streams (chat pages live)"),
            rooms: handle
                .gauge("webchat_rooms_live", "Rooms with at least one open visitor stream"),
        });
        Ok(Self { server, app })
    }

    /// Stores a visitor text message the way a page's send does just before it hands the
    /// message to the runtime, without handing it over: what a crash between the two steps
    /// leaves (tests of the recovery, M4). Not for production use.
    #[doc(hidden)]
    pub async fn store_unqueued_visitor_message(
        &self,
        room_id: &str,
        message: &xagent_protocol_types::ChatMessage,
        client_id: &str,
    ) -> Result<(), WebchatError> {
        let outbound = serde_json::to_string(message).map_err(|e| {
            xagent_server_runtime::storage::StorageError::new("encoding an outbound message", e)
        })?;
        let entry = ChatEntry {
            message_id: message.message_id.to_string(),
            author: Author::Visitor,
            text: message.text.clone(),
            files: Vec::new(),
            status: EntryStatus::Sending,
            error: None,
            client_id: Some(client_id.to_owned()),
            created_at: message.created_at.unwrap_or_else(|| self.server.handle().now_millis()),
        };
        self.app.messages()?.insert(room_id, &entry, Some(&outbound)).await.map(|_| ())
    }

    /// The Connector Card.
    pub fn card(&self) -> &ConnectorCard {
        self.server.card()
    }

    /// The runtime.
    pub fn server(&self) -> &ConnectorServer {
        &self.server
    }

    /// The runtime's author handle.
    pub fn handle(&self) -> ConnectorHandle {
        self.server.handle()
    }

    /// The page URL of a room; with an access code, the page joins by itself (the code rides
    /// in the URL fragment, which browsers never send to a server).
    pub fn room_url(&self, room_id: &str, access_code: Option<&str>) -> String {
        match access_code {
            Some(code) => format!("{}/chat/r/{room_id}#code={code}", self.app.public_url),
            None => format!("{}/chat/r/{room_id}", self.app.public_url),
        }
    }

    /// Every route: the runtime's control, data and transfer planes plus the chat page.
    pub fn router(&self) -> axum::Router {
        self.server.router()
    }

    /// Serves until `shutdown` completes, then closes pages and xAgent sockets and waits for
    /// in-flight work. The runtime runs its maintenance (at the configured interval), the file
    /// cleanup, the delivery-state relay and the agent presence watcher meanwhile.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), WebchatError> {
        Ok(self.server.serve(listener, shutdown).await?)
    }
}

/// The runtime's configuration: the caller's, with the public URL's path as the prefix of the
/// URLs it hands out (the page is served at the root and a proxy strips that path, so download
/// URLs must carry it), unless the caller set one.
fn runtime_config(options: &WebchatOptions) -> RuntimeConfig {
    let mut config = options.config.clone();
    let path = web::root_path(&options.public_url);
    if config.public_path.is_none() && !path.is_empty() {
        config.public_path = Some(path);
    }
    config
}

/// Runs `work` until the runtime shuts down.
async fn until(shutdown: CancellationToken, work: impl Future<Output = ()>) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = work => {}
    }
}

/// Tells watching pages when the agent's channel comes online or goes offline.
async fn watch_presence(app: Arc<App>, handle: ConnectorHandle) {
    let mut interval = tokio::time::interval(Duration::from_millis(500));
    loop {
        interval.tick().await;
        for room_id in app.hub.watched_rooms() {
            let room = match app.store() {
                Ok(store) => store.room(&room_id).await,
                Err(error) => Err(error),
            };
            let online = match room {
                Ok(Some(room)) => room.channel.is_some_and(|c| handle.is_routed(&c)),
                _ => false,
            };
            app.hub.set_online(&room_id, online);
        }
    }
}
