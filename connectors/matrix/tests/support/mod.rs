//! What the `im.matrix` tests share: a real Synapse (testkit), the Connector served on
//! 127.0.0.1, xAgent's side through `xagent-client-runtime`, and a human on a Matrix client of
//! their own (matrix-sdk with an in-memory store and its own device keys).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use matrix_sdk::Room;
use xagent_client_runtime::{Backoff, BaseUrl, ClientConfig, ClientEvent, DataPlane, Events};
use xagent_connector_matrix::connector::ROOM_FLOW;
use xagent_connector_matrix::{CARD_ID, Credentials, Matrix, MatrixOptions};
use xagent_protocol_types::{
    AuthProgress, AuthStart, AuthStatus, AuthStatusRequest, ConnectorChannelId, PROFILE_IM_V2,
    Secret,
};
use xagent_testkit::Serving;
use xagent_testkit::synapse::{TestSynapse, TestUser};

#[allow(unused_imports)]
pub use xagent_connector_matrix::testing::{Account, Human, WAIT, body_of, is_edit};

pub const API_KEY: &str = "sk-matrix-test-51a7c2";

/// A human logged in to the test homeserver.
pub async fn human(synapse: &TestSynapse, prefix: &str) -> Human {
    let user = synapse.register(prefix).await;
    let account =
        Account { user_id: user.user_id, localpart: user.localpart, password: user.password };
    Human::login(&synapse.url(), account).await
}

pub fn temp_dir(name: &str) -> PathBuf {
    xagent_testkit::temp_state_dir(&format!("matrix-{name}"))
}

/// The Connector, served.
pub struct Server {
    pub matrix: Arc<Matrix>,
    pub addr: SocketAddr,
    serving: Serving,
}

impl Server {
    pub async fn start(synapse: &TestSynapse, bot: &TestUser, dir: &Path) -> Server {
        Self::start_with(synapse, bot, dir, |_| {}).await
    }

    pub async fn start_with(
        synapse: &TestSynapse,
        bot: &TestUser,
        dir: &Path,
        tune: impl FnOnce(&mut MatrixOptions),
    ) -> Server {
        let listener = xagent_testkit::bind_local(None).await.expect("binds");
        let addr = listener.local_addr().expect("addr");
        let mut options = MatrixOptions::new(
            synapse.url(),
            &bot.user_id,
            Credentials::Password(Secret::new(bot.password.clone())),
            dir,
        );
        options.api_key = Some(Secret::new(API_KEY));
        options.edit_interval = Duration::from_millis(300);
        tune(&mut options);
        let matrix = Arc::new(Matrix::open(options).await.expect("im.matrix opens"));
        let running = Arc::clone(&matrix);
        let serving = Serving::spawn(listener, |listener, shutdown| async move {
            let _ = running.serve(listener, shutdown).await;
        });
        Server { matrix, addr, serving }
    }

    pub fn base(&self) -> BaseUrl {
        BaseUrl::parse(&format!("http://{}", self.addr)).expect("base url")
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
        max_failures: Some(400),
    };
    config.request_timeout = Duration::from_secs(10);
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

/// Opens a channel and starts `matrix_room` on it.
pub async fn pairing_start(plane: &DataPlane) -> (ConnectorChannelId, AuthProgress) {
    let opened = plane.open_channel(None).await.expect("channel.open");
    let channel = opened.connector_channel_id;
    let ack = plane.request(Some(&channel), AuthStart::new(ROOM_FLOW)).await.expect("auth.start");
    (channel, ack.0)
}

pub async fn pairing_status(
    plane: &DataPlane,
    channel: &ConnectorChannelId,
    progress: &AuthProgress,
) -> AuthProgress {
    let poll = AuthStatusRequest::new(progress.auth_session_id.clone().expect("session"))
        .with_flow_id(ROOM_FLOW);
    plane.request(Some(channel), poll).await.expect("auth.status").0
}

/// The code in the prompt's message (`... post this pairing code in the room: ABCD-EFGH`).
pub fn code_of(progress: &AuthProgress) -> String {
    let message = progress.message.clone().expect("a prompt message");
    message.rsplit(' ').next().expect("the code").to_owned()
}

/// Polls `auth.status` until it is no longer pending.
pub async fn pairing_result(
    plane: &DataPlane,
    channel: &ConnectorChannelId,
    progress: &AuthProgress,
) -> AuthProgress {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = pairing_status(plane, channel, progress).await;
        if now.status != AuthStatus::Pending || tokio::time::Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn next_event(
    events: &mut Events,
    want: impl FnMut(&ClientEvent) -> bool,
) -> ClientEvent {
    xagent_client_runtime::next_event_matching(events, WAIT, want)
        .await
        .expect("the awaited event arrived in time")
}

/// The next inbound `chat.message` (accepted once read).
pub async fn next_chat(events: &mut Events) -> xagent_protocol_types::ChatMessage {
    match next_event(events, |e| matches!(e, ClientEvent::ChatMessage(_))).await {
        ClientEvent::ChatMessage(inbound) => {
            let message = inbound.message.clone();
            inbound.accept();
            message
        }
        _ => unreachable!(),
    }
}

/// Pairs a new room of `human` with a new channel: returns the channel and the room.
pub async fn pair_room(
    plane: &DataPlane,
    human: &Human,
    bot: &TestUser,
    name: &str,
    encrypted: bool,
) -> (ConnectorChannelId, Room) {
    let (channel, started) = pairing_start(plane).await;
    assert_eq!(started.status, AuthStatus::Pending);
    let room = human.create_room(name, encrypted, &[&bot.user_id]).await;
    human.wait_joined(&room, &bot.user_id).await;
    human.say(&room, &code_of(&started)).await;
    let done = pairing_result(plane, &channel, &started).await;
    assert_eq!(done.status, AuthStatus::Authenticated, "{:?}", done.message);
    (channel, room)
}

/// A reverse proxy in front of the real homeserver that forwards every request except those
/// whose path contains `stall`: those get no answer at all (a media repository that hangs).
pub struct StallingProxy {
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Upstream {
    client: reqwest::Client,
    base: String,
    stall: &'static str,
}

pub async fn stalling_proxy(upstream: String, stall: &'static str) -> StallingProxy {
    use axum::extract::{Request, State};
    use axum::response::{IntoResponse, Response};

    async fn forward(State(up): State<Arc<Upstream>>, request: Request) -> Response {
        let target = request.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/").to_owned();
        if target.contains(up.stall) {
            std::future::pending::<()>().await;
        }
        let method = request.method().clone();
        let mut headers = request.headers().clone();
        headers.remove(axum::http::header::HOST);
        let Ok(body) = axum::body::to_bytes(request.into_body(), 64 << 20).await else {
            return axum::http::StatusCode::BAD_REQUEST.into_response();
        };
        let sent = up
            .client
            .request(method, format!("{}{target}", up.base))
            .headers(headers)
            .body(body)
            .send()
            .await;
        let Ok(answer) = sent else { return axum::http::StatusCode::BAD_GATEWAY.into_response() };
        let status = answer.status();
        let mut headers = answer.headers().clone();
        for hop in [axum::http::header::TRANSFER_ENCODING, axum::http::header::CONTENT_LENGTH] {
            headers.remove(hop);
        }
        let Ok(bytes) = answer.bytes().await else {
            return axum::http::StatusCode::BAD_GATEWAY.into_response();
        };
        (status, headers, bytes).into_response()
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let state = Arc::new(Upstream { client: reqwest::Client::new(), base: upstream, stall });
    let app = axum::Router::new().fallback(forward).with_state(state);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    StallingProxy { url, task }
}
