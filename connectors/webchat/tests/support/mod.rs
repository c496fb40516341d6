//! Shared helpers of the integration tests: a Webchat server on 127.0.0.1 with a temporary
//! state directory, an xAgent data-plane client (`xagent-client-runtime`), and the visitor's
//! HTTP calls.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use xagent_client_runtime::{Backoff, BaseUrl, ClientConfig, ClientEvent, DataPlane, Events};
use xagent_connector_webchat::{
    CARD_ID, QR_FLOW, ROOM_FLOW, VisitorLimits, Webchat, WebchatOptions,
};
use xagent_protocol_types::{
    AuthInput, AuthProgress, AuthStart, AuthStatus, AuthStatusRequest, Clock, ConnectorChannelId,
    PROFILE_IM_V2, Secret, SystemClock,
};
use xagent_testkit::{Serving, bind_local};

pub const API_KEY: &str = "sk-webchat-test-3c9e1a";

pub fn temp_dir(name: &str) -> PathBuf {
    xagent_testkit::temp_state_dir(&format!("webchat-{name}"))
}

pub struct Server {
    pub webchat: Webchat,
    pub addr: SocketAddr,
    serving: Serving,
}

pub async fn start(dir: &PathBuf, addr: Option<SocketAddr>) -> Server {
    start_with_clock(dir, addr, Arc::new(SystemClock)).await
}

pub async fn start_with_clock(
    dir: &PathBuf,
    addr: Option<SocketAddr>,
    clock: Arc<dyn Clock>,
) -> Server {
    start_with(dir, addr, clock, VisitorLimits::default()).await
}

/// A server with these visitor limits (tests of the quotas).
pub async fn start_with_limits(dir: &PathBuf, limits: VisitorLimits) -> Server {
    start_with(dir, None, Arc::new(SystemClock), limits).await
}

/// A replica with its state in this PostgreSQL database (feature `postgres`).
#[cfg(feature = "postgres")]
pub async fn start_on_database(
    dir: &PathBuf,
    url: xagent_server_runtime::ops::DatabaseUrl,
    limits: VisitorLimits,
) -> Server {
    start_on_database_with_clock(dir, url, limits, Arc::new(SystemClock)).await
}

/// [`start_on_database`] with this clock (replicas of a test share one `ManualClock`).
#[cfg(feature = "postgres")]
pub async fn start_on_database_with_clock(
    dir: &PathBuf,
    url: xagent_server_runtime::ops::DatabaseUrl,
    limits: VisitorLimits,
    clock: Arc<dyn Clock>,
) -> Server {
    let listener = bind_local(None).await.expect("binds");
    let addr = listener.local_addr().expect("addr");
    let options = WebchatOptions::new(dir, format!("http://{addr}"))
        .with_api_key(Secret::new(API_KEY))
        .with_visitor_limits(limits)
        .with_clock(clock)
        .with_database_url(url);
    serve(listener, options).await
}

/// A replica on this PostgreSQL database in a runtime of its own, so the test can stop it
/// the way `kill -9` does: every task dropped at its next await, nothing drained, its sockets
/// and database connections cut (feature `postgres`).
#[cfg(feature = "postgres")]
pub struct Crashable {
    runtime: tokio::runtime::Runtime,
    pub addr: SocketAddr,
}

#[cfg(feature = "postgres")]
impl Crashable {
    /// Starts the replica (its own two-thread runtime) with the system clock.
    pub async fn start(
        dir: &std::path::Path,
        url: xagent_server_runtime::ops::DatabaseUrl,
    ) -> Crashable {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the replica");
        let dir = dir.to_path_buf();
        let (ready, started) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            let listener = bind_local(None).await.expect("binds");
            let addr = listener.local_addr().expect("addr");
            let options = WebchatOptions::new(&dir, format!("http://{addr}"))
                .with_api_key(Secret::new(API_KEY))
                .with_database_url(url);
            let webchat = Webchat::open(options).await.expect("webchat opens");
            let _ = ready.send(addr);
            let _ = webchat.serve(listener, std::future::pending()).await;
        });
        let addr = started.await.expect("the replica started");
        Crashable { runtime, addr }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops it at once, like `kill -9`.
    pub fn crash(self) {
        self.runtime.shutdown_background();
    }
}

async fn start_with(
    dir: &PathBuf,
    addr: Option<SocketAddr>,
    clock: Arc<dyn Clock>,
    limits: VisitorLimits,
) -> Server {
    let listener = bind_local(addr).await.expect("binds");
    let addr = listener.local_addr().expect("addr");
    let options = WebchatOptions::new(dir, format!("http://{addr}"))
        .with_api_key(Secret::new(API_KEY))
        .with_clock(clock)
        .with_visitor_limits(limits);
    serve(listener, options).await
}

/// im.webchat whose public URL has the path `prefix` (`/connectors/webchat`): what a reverse
/// proxy serving it under that prefix (and stripping it) gives it.
pub async fn start_under(dir: &PathBuf, prefix: &str) -> Server {
    let listener = bind_local(None).await.expect("binds");
    let addr = listener.local_addr().expect("addr");
    let options = WebchatOptions::new(dir, format!("http://{addr}{prefix}"))
        .with_api_key(Secret::new(API_KEY));
    serve(listener, options).await
}

async fn serve(listener: tokio::net::TcpListener, options: WebchatOptions) -> Server {
    let addr = listener.local_addr().expect("addr");
    let webchat = Webchat::open(options).await.expect("webchat opens");
    let running = webchat.clone();
    let serving = Serving::spawn(listener, |listener, shutdown| async move {
        let _ = running.serve(listener, shutdown).await;
    });
    Server { webchat, addr, serving }
}

impl Server {
    pub fn base(&self) -> BaseUrl {
        BaseUrl::parse(&self.url("")).expect("base url")
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn stop(self) {
        self.serving.stop().await;
    }
}

pub fn client_config(base: BaseUrl) -> ClientConfig {
    let mut config = ClientConfig::new(base, CARD_ID, vec![PROFILE_IM_V2.into()])
        .with_api_key(Secret::new(API_KEY));
    config.backoff = Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(300),
        factor: 2.0,
        max_failures: Some(200),
    };
    config.request_timeout = Duration::from_secs(5);
    config
}

pub async fn connect(server: &Server) -> (DataPlane, Events) {
    let (plane, events) =
        DataPlane::connect(client_config(server.base())).await.expect("the data plane starts");
    tokio::time::timeout(Duration::from_secs(10), plane.connected())
        .await
        .expect("connects in time")
        .expect("connects");
    (plane, events)
}

/// The owner code the tests give a room they create with [`open_room`] (F7: new rooms need
/// one).
pub fn owner_code_for(code: &str) -> String {
    format!("owner-of-{code}")
}

/// Opens a channel and signs it in to `room` with the form flow (creating it with the owner
/// code [`owner_code_for`]).
pub async fn open_room(plane: &DataPlane, room: &str, code: &str) -> ConnectorChannelId {
    open_room_as_owner(plane, room, code, &owner_code_for(code)).await
}

/// Opens a channel and signs it in to `room` as its owner (M9: the owner code moves a room).
pub async fn open_room_as_owner(
    plane: &DataPlane,
    room: &str,
    code: &str,
    owner: &str,
) -> ConnectorChannelId {
    let input = AuthInput::default()
        .with("room_name", room)
        .with("access_code", code)
        .with("owner_code", owner);
    open_room_with(plane, input).await
}

async fn open_room_with(plane: &DataPlane, input: AuthInput) -> ConnectorChannelId {
    let opened = plane.open_channel(None).await.expect("channel.open");
    let channel = opened.connector_channel_id.clone();
    let ack = plane
        .request(Some(&channel), AuthStart::new(ROOM_FLOW).with_input(input))
        .await
        .expect("auth.start");
    assert_eq!(ack.0.status, AuthStatus::Authenticated, "{:?}", ack.0.message);
    plane.remember_channel(channel.clone()).await;
    channel
}

/// Opens a channel and starts the QR pairing flow on it.
pub async fn qr_start(plane: &DataPlane) -> (ConnectorChannelId, AuthProgress) {
    let opened = plane.open_channel(None).await.expect("channel.open");
    let channel = opened.connector_channel_id;
    let ack = plane.request(Some(&channel), AuthStart::new(QR_FLOW)).await.expect("auth.start");
    (channel, ack.0)
}

/// Polls the pairing's `auth.status` (with `refresh` when asked).
pub async fn qr_status(
    plane: &DataPlane,
    channel: &ConnectorChannelId,
    progress: &AuthProgress,
    refresh: bool,
) -> AuthProgress {
    let mut poll = AuthStatusRequest::new(progress.auth_session_id.clone().expect("session"))
        .with_flow_id(QR_FLOW);
    if refresh {
        poll.refresh = Some(true);
    }
    plane.request(Some(channel), poll).await.expect("auth.status").0
}

/// The token at the end of a pairing link.
pub fn token_of(link: &str) -> String {
    link.rsplit('/').next().expect("token").to_owned()
}

pub async fn next_event(
    events: &mut Events,
    want: impl FnMut(&ClientEvent) -> bool,
) -> ClientEvent {
    xagent_client_runtime::next_event_matching(events, Duration::from_secs(15), want)
        .await
        .expect("the awaited event arrived within 15 s")
}

/// The setup most tests share: a started server, xAgent connected with a channel signed in to
/// the room "Lobby" (access code "code-1234"), and a visitor joined to it. Tests take it apart
/// with a `let Lobby { .. } = ...` pattern.
pub struct Lobby {
    pub dir: PathBuf,
    pub server: Server,
    pub plane: DataPlane,
    pub events: Events,
    pub channel: ConnectorChannelId,
    pub visitor: Visitor,
}

impl Lobby {
    /// A default server in a fresh state directory named after the test.
    pub async fn start(name: &str) -> Lobby {
        let dir = temp_dir(name);
        let server = start(&dir, None).await;
        Lobby::on(dir, server).await
    }

    /// The lobby on a server the test started itself (another clock, other limits).
    pub async fn on(dir: PathBuf, server: Server) -> Lobby {
        let (plane, events) = connect(&server).await;
        let channel = open_room(&plane, "Lobby", "code-1234").await;
        let visitor = Visitor::join(&server, "lobby", "code-1234").await;
        Lobby { dir, server, plane, events, channel, visitor }
    }
}

/// The visitor side over HTTP.
pub struct Visitor {
    pub http: reqwest::Client,
    pub base: String,
    pub room: String,
    pub token: String,
}

impl Visitor {
    pub async fn join(server: &Server, room: &str, code: &str) -> Visitor {
        let http = reqwest::Client::new();
        let response = http
            .post(server.url(&format!("/chat/api/rooms/{room}/join")))
            .json(&serde_json::json!({ "access_code": code }))
            .send()
            .await
            .expect("join");
        assert_eq!(response.status(), 200, "join status");
        let body: Value = response.json().await.expect("join body");
        Visitor {
            http,
            base: server.url(""),
            room: room.into(),
            token: body["token"].as_str().expect("token").into(),
        }
    }

    /// A request to `path` of the room's visitor API (`/chat/api/rooms/<room>/<path>`) with
    /// the visitor's token.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let url = format!("{}/chat/api/rooms/{}/{path}", self.base, self.room);
        self.http.request(method, url).bearer_auth(&self.token)
    }

    pub async fn send(&self, text: &str, client_id: &str) -> Value {
        let response = self
            .request(reqwest::Method::POST, "messages")
            .json(&serde_json::json!({ "text": text, "client_id": client_id }))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 200, "send status");
        response.json().await.expect("send body")
    }

    /// The first SSE event of the room (its snapshot).
    pub async fn snapshot(&self) -> Value {
        let response = self.request(reqwest::Method::GET, "events").send().await.expect("events");
        assert_eq!(response.status(), 200);
        // Behind nginx the stream must not be buffered.
        assert_eq!(
            response.headers().get("x-accel-buffering").and_then(|v| v.to_str().ok()),
            Some("no")
        );
        xagent_testkit::first_sse_event(response).await
    }

    /// Waits until the snapshot satisfies `check` (for states that settle asynchronously).
    pub async fn eventually(&self, mut check: impl FnMut(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let snapshot = self.snapshot().await;
            if check(&snapshot) {
                return snapshot;
            }
            assert!(tokio::time::Instant::now() < deadline, "never reached: {snapshot:#}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
