//! The HTTP side: control plane (`/connector-card.json`, `/skill.md`, `/health`), the `/ws`
//! upgrade, the system API key as a tower layer, all under an optional Base URL path prefix.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{SinkExt, StreamExt, future};
use xagent_protocol_types::{
    ErrorCode, HealthResponse, HttpErrorBody, SUBPROTOCOL, WireError, paths,
};

use crate::connection::{Frame, FrameError};
use crate::server::ConnectorServer;
use crate::state::Shared;

/// A JSON error response `{"error":{"code","message"}}`.
pub fn error_response(status: StatusCode, code: ErrorCode, message: &str) -> Response {
    let body = HttpErrorBody { error: WireError::new(code, message) };
    (status, axum::Json(body)).into_response()
}

impl ConnectorServer {
    /// The axum router with every endpoint, under the configured Base URL path prefix.
    pub fn router(&self) -> Router {
        let shared = Arc::clone(&self.shared);
        let public = Router::new()
            .route(paths::CONNECTOR_CARD, get(card))
            .route(paths::SKILL, get(skill))
            .route(READY, get(ready));
        let protected = Router::new()
            .route(paths::HEALTH, get(health))
            .route(paths::WS, get(ws))
            .route_layer(middleware::from_fn_with_state(Arc::clone(&shared), require_api_key));
        let mut app = public.merge(protected).with_state(Arc::clone(&shared));
        if let Some(files) = shared.files_router() {
            // The Transfer Plane checks the system API key itself (downloads also accept a
            // signature instead).
            app = app.merge(files);
        }
        // The author's own routes: no system API key layer (they protect themselves).
        // Requests are traced by method and path only: a query can hold a URL signature
        // (`/files/refs/...?sig=`), which must not reach a log at any level (L2).
        let trace = tower_http::trace::TraceLayer::new_for_http().make_span_with(
            |request: &axum::http::Request<axum::body::Body>| {
                tracing::debug_span!("request", method = %request.method(), path = %request.uri().path())
            },
        );
        let app = app.merge(self.extra.clone()).layer(trace);
        let base = shared.config.base_path.trim_end_matches('/');
        if base.is_empty() { app } else { Router::new().nest(base, app) }
    }
}

/// True when `headers` carry `Authorization: Bearer <key>` for the configured key (compared in
/// constant time), or when no key is configured.
pub(crate) fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(key) = &shared.api_key else { return true };
    // The one Bearer parser (scheme case-insensitive), shared with the Transfer Plane.
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(xagent_protocol_types::bearer_token);
    presented.is_some_and(|token| key.matches(token))
}

/// The 401 answer: `WWW-Authenticate: Bearer` and a JSON error body.
pub(crate) fn unauthorized() -> Response {
    let mut response = error_response(
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        "missing or wrong system API key; send Authorization: Bearer <api key>",
    );
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

async fn require_api_key(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    if authorized(&shared, request.headers()) {
        next.run(request).await
    } else {
        tracing::info!(
            path = request.uri().path(),
            "refused a request without a valid system API key"
        );
        unauthorized()
    }
}

async fn card(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(&shared.def.card).into_response()
}

async fn skill(State(shared): State<Arc<Shared>>) -> Response {
    match &shared.def.skill {
        Some(markdown) => {
            ([(header::CONTENT_TYPE, "text/markdown; charset=utf-8")], Body::from(markdown.clone()))
                .into_response()
        }
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// The metrics listener's paths: the Prometheus exposition and readiness.
pub const METRICS_PATH: &str = "/metrics";
/// Readiness on the metrics listener: storage usable and the listener accepting.
pub const READYZ_PATH: &str = "/readyz";

impl ConnectorServer {
    /// The router of the metrics listener: `GET /metrics` (every series of the runtime, in the
    /// Prometheus text format; the Connector's gauges read at each scrape) and `GET /readyz`
    /// (`200` only while the storage answers and the main listener accepts connections). It
    /// has no API key: serve it on an address only the monitoring reaches (`--metrics-listen`).
    pub fn metrics_router(&self) -> Router {
        Router::new()
            .route(METRICS_PATH, get(metrics))
            .route(READYZ_PATH, get(readyz))
            .with_state(Arc::clone(&self.shared))
    }

    /// Binds `addr` and serves [`ConnectorServer::metrics_router`] there in the background
    /// until Ctrl-C or SIGTERM (an error is logged); returns the bound address. The one way
    /// `serve_from_env` and the `--metrics-listen` flag start it.
    pub async fn start_metrics(&self, addr: &str) -> std::io::Result<std::net::SocketAddr> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let server = self.clone();
        tokio::spawn(async move {
            if let Err(error) = server.serve_metrics(listener, crate::listen::stop_signal()).await {
                tracing::error!(%error, "the metrics listener stopped");
            }
        });
        Ok(local)
    }

    /// Serves [`ConnectorServer::metrics_router`] on `listener` until `shutdown` completes.
    pub async fn serve_metrics(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), crate::ServerError> {
        crate::listen::serve(
            listener,
            self.metrics_router(),
            crate::listen::ServeLimits::default(),
            shutdown,
        )
        .await?;
        Ok(())
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let m = crate::metrics::metrics();
    let (sockets, statuses, channels) = {
        let state = shared.state();
        let mut statuses: std::collections::BTreeMap<String, i64> =
            std::collections::BTreeMap::new();
        for channel in state.channels.values() {
            *statuses.entry(channel.record.status.as_str().to_owned()).or_default() += 1;
        }
        let channels: Vec<_> = state.channels.keys().cloned().collect();
        (state.live_sockets.len(), statuses, channels)
    };
    m.connections.set(i64::try_from(sockets).unwrap_or(i64::MAX));
    m.channels.clear();
    for (status, count) in statuses {
        m.channels.get_or_create(&crate::metrics::status_labels(status)).set(count);
    }
    let depth: usize =
        shared.im.as_ref().map_or(0, |im| channels.iter().map(|c| im.pending(c).len()).sum());
    m.outbox_depth.set(i64::try_from(depth).unwrap_or(i64::MAX));
    ([(header::CONTENT_TYPE, crate::metrics::METRICS_CONTENT_TYPE)], m.encode()).into_response()
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    let accepting = shared.accepting.load(std::sync::atomic::Ordering::SeqCst);
    let storage = shared.ready().await;
    let reason = match (&storage, accepting) {
        (Ok(()), true) => return axum::Json(serde_json::json!({ "ready": true })).into_response(),
        (Err(error), _) => {
            tracing::warn!(%error, "not ready: the storage does not answer");
            "the storage does not answer"
        }
        (Ok(()), false) => "the listener is not accepting connections (starting or draining)",
    };
    let body = serde_json::json!({ "ready": false, "reason": reason });
    (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
}

/// The readiness endpoint of a replica, for load balancers (not part of the protocol, so
/// outside the system API key: it tells nothing but whether this process can serve).
pub const READY: &str = "/ready";

/// `200 {"ready":true}` when this process can serve (its storage answers), else `503
/// {"ready":false,"reason":...}`: a load balancer's health check takes the replica out.
async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    match shared.ready().await {
        Ok(()) => axum::Json(serde_json::json!({ "ready": true })).into_response(),
        Err(error) => {
            // The details (the server's address among them) go to the log only: this answer
            // is public.
            tracing::warn!(%error, "not ready: the storage does not answer");
            let reason = "this replica cannot reach its database";
            let body = serde_json::json!({ "ready": false, "reason": reason });
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
        }
    }
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(HealthResponse::for_card(&shared.def.card)).into_response()
}

fn offers_subprotocol(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == SUBPROTOCOL)
}

async fn ws(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    if !offers_subprotocol(&headers) {
        return error_response(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidPacket,
            "offer the WebSocket subprotocol xagent.connector.packet.v1 (Sec-WebSocket-Protocol)",
        );
    }
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    // A replica that cannot reach its database takes no data plane: the socket is closed at
    // once with the reason (xAgent reconnects, and the load balancer's check takes it out).
    if shared.cluster.is_some()
        && let Err(error) = shared.ready().await
    {
        tracing::warn!(%error, "refused a data plane: the database does not answer");
        let reason = "this replica cannot reach its database; connect again (to another replica)";
        return upgrade.protocols([SUBPROTOCOL]).on_upgrade(move |mut socket| async move {
            let frame =
                CloseFrame { code: crate::state::CLOSE_TRY_AGAIN_LATER, reason: reason.into() };
            let _ = socket.send(Message::Close(Some(frame))).await;
        });
    }
    let limit = shared.config.max_packet_bytes;
    let mut response = upgrade
        .protocols([SUBPROTOCOL])
        .max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| serve_socket(shared, socket));
    // The API key layer let it through: the listener moves the connection into the slots
    // reserved for xAgent's data plane.
    response.extensions_mut().insert(crate::listen::DataPlaneUpgrade);
    response
}

async fn serve_socket(shared: Arc<Shared>, socket: WebSocket) {
    let (sink, stream) = socket.split();
    let stream = stream.map(from_message);
    let sink = sink.with(|frame: Frame| future::ready(Ok::<_, axum::Error>(to_message(frame))));
    let task =
        shared.tasks.spawn(crate::connection::run(Arc::clone(&shared), stream, Box::pin(sink)));
    let _ = task.await;
}

fn from_message(message: Result<Message, axum::Error>) -> Result<Frame, FrameError> {
    match message {
        Ok(Message::Text(text)) => Ok(Frame::Text(text.as_str().to_owned())),
        Ok(Message::Binary(bytes)) => Ok(Frame::Binary(bytes.to_vec())),
        Ok(Message::Ping(bytes)) => Ok(Frame::Ping(bytes.to_vec())),
        Ok(Message::Pong(bytes)) => Ok(Frame::Pong(bytes.to_vec())),
        Ok(Message::Close(frame)) => {
            Ok(Frame::Close(frame.map(|f| (f.code, f.reason.as_str().to_owned()))))
        }
        Err(error) => Err(frame_error(error)),
    }
}

/// The typed frame error of a failed read: axum's WebSocket error wraps tungstenite's, whose
/// kind says whether the frame was too large or not UTF-8.
fn frame_error(error: axum::Error) -> FrameError {
    use tokio_tungstenite::tungstenite::Error as Ws;
    let error = error.into_inner();
    match error.downcast_ref::<Ws>() {
        Some(Ws::Capacity(_)) => FrameError::TooLarge,
        Some(Ws::Utf8(_)) => FrameError::InvalidUtf8,
        _ => FrameError::Read(error.to_string()),
    }
}

fn to_message(frame: Frame) -> Message {
    match frame {
        Frame::Text(text) => Message::Text(text.into()),
        Frame::Binary(bytes) => Message::Binary(bytes.into()),
        Frame::Ping(bytes) => Message::Ping(bytes.into()),
        Frame::Pong(bytes) => Message::Pong(bytes.into()),
        Frame::Close(frame) => {
            Message::Close(frame.map(|(code, reason)| CloseFrame { code, reason: reason.into() }))
        }
    }
}
