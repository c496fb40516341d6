//! Deliberately broken Connectors, each caught by the conformance check that names the broken
//! rule. A broken variant is the echo connector behind a small proxy that breaks one rule:
//! a wrong card id in `/health`, no subprotocol check, no API key check, or a Tool in the
//! Descriptor that the Card does not declare.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::ws::{Message as AxumMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as TungMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use xagent_client_runtime::BaseUrl;
use xagent_conformance::{ConformanceOptions, ConformanceReport, Status, run};
use xagent_protocol_types::{AuthInput, SUBPROTOCOL, Secret};
use xagent_testkit::{ECHO_FLOW, EchoServer, temp_state_dir};

const API_KEY: &str = "sk-broken-variants-91c3";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    WrongHealthCardId,
    NoSubprotocolCheck,
    NoApiKeyCheck,
    UndeclaredDescriptorTool,
}

#[derive(Clone)]
struct Proxy {
    upstream: SocketAddr,
    fault: Fault,
    http: reqwest::Client,
}

async fn echo_upstream() -> SocketAddr {
    let server =
        EchoServer::start(&temp_state_dir("broken"), API_KEY, None).await.expect("echo server");
    let addr = server.addr;
    // Kept running for the rest of the test process.
    std::mem::forget(server);
    addr
}

fn authorized(proxy: &Proxy, headers: &HeaderMap) -> bool {
    proxy.fault == Fault::NoApiKeyCheck
        || headers.get("authorization").and_then(|v| v.to_str().ok())
            == Some(&format!("Bearer {API_KEY}"))
}

async fn http_passthrough(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let headers = request.headers().clone();
    let method = request.method().clone();
    let body = match axum::body::to_bytes(request.into_body(), 200 << 20).await {
        Ok(body) => body,
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    if path == "/health" && !authorized(&proxy, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut upstream = proxy.http.request(method, format!("http://{}{}", proxy.upstream, path));
    for (name, value) in headers.iter() {
        if name != "host" && name != "content-length" {
            upstream = upstream.header(name, value);
        }
    }
    if path == "/health" {
        upstream = upstream.bearer_auth(API_KEY);
    }
    let Ok(response) = upstream.body(body).send().await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let status = response.status();
    let content_type = response.headers().get("content-type").cloned();
    let mut bytes: Bytes = response.bytes().await.unwrap_or_default();
    if path == "/health" && proxy.fault == Fault::WrongHealthCardId && status.is_success() {
        let mut value: Value = serde_json::from_slice(&bytes).unwrap_or_default();
        value["connector_card_id"] = json!("im.someone-else");
        bytes = Bytes::from(value.to_string());
    }
    let mut out = Response::builder().status(status.as_u16());
    if let Some(content_type) = content_type {
        out = out.header("content-type", content_type);
    }
    out.body(axum::body::Body::from(bytes))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

async fn ws_passthrough(
    State(proxy): State<Arc<Proxy>>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let offered = headers
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|p| p.trim() == SUBPROTOCOL));
    if !offered && proxy.fault != Fault::NoSubprotocolCheck {
        return StatusCode::BAD_REQUEST.into_response();
    }
    if !authorized(&proxy, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let upgrade = if offered { upgrade.protocols([SUBPROTOCOL]) } else { upgrade };
    upgrade.on_upgrade(move |socket| pipe(proxy, socket))
}

fn add_undeclared_tool(text: &str) -> String {
    let Ok(mut packet) = serde_json::from_str::<Value>(text) else { return text.to_owned() };
    let descriptor = packet
        .get_mut("payload")
        .and_then(|p| p.get_mut("connection_descriptor"))
        .and_then(Value::as_object_mut);
    if let Some(descriptor) = descriptor {
        let tools = descriptor.entry("tools").or_insert_with(|| json!([]));
        if let Some(list) = tools.as_array_mut() {
            list.push(json!({ "tool_id": "not_in_the_card", "status": "available" }));
        }
    }
    packet.to_string()
}

async fn pipe(proxy: Arc<Proxy>, client: WebSocket) {
    let Ok(mut request) = format!("ws://{}/ws", proxy.upstream).into_client_request() else {
        return;
    };
    request.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_static(SUBPROTOCOL));
    if let Ok(value) = HeaderValue::from_str(&format!("Bearer {API_KEY}")) {
        request.headers_mut().insert("Authorization", value);
    }
    let Ok((server, _)) = tokio_tungstenite::connect_async(request).await else { return };
    let (mut server_sink, mut server_stream) = server.split();
    let (mut client_sink, mut client_stream) = client.split();
    let fault = proxy.fault;
    let up = async move {
        while let Some(Ok(message)) = client_stream.next().await {
            let forwarded = match message {
                AxumMessage::Text(text) => TungMessage::Text(text.as_str().into()),
                AxumMessage::Binary(bytes) => TungMessage::Binary(bytes),
                AxumMessage::Close(_) => break,
                _ => continue,
            };
            if server_sink.send(forwarded).await.is_err() {
                break;
            }
        }
        let _ = server_sink.close().await;
    };
    let down = async move {
        while let Some(Ok(message)) = server_stream.next().await {
            let forwarded = match message {
                TungMessage::Text(text) => {
                    let text = if fault == Fault::UndeclaredDescriptorTool {
                        add_undeclared_tool(text.as_str())
                    } else {
                        text.as_str().to_owned()
                    };
                    AxumMessage::Text(text.into())
                }
                TungMessage::Close(_) => break,
                _ => continue,
            };
            if client_sink.send(forwarded).await.is_err() {
                break;
            }
        }
        let _ = client_sink.close().await;
    };
    tokio::join!(up, down);
}

async fn broken(fault: Fault) -> String {
    let upstream = echo_upstream().await;
    let proxy = Arc::new(Proxy { upstream, fault, http: reqwest::Client::new() });
    let app = axum::Router::new()
        .route("/ws", axum::routing::get(ws_passthrough))
        .fallback(http_passthrough)
        .with_state(proxy);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

async fn conformance(base: &str) -> ConformanceReport {
    let mut options = ConformanceOptions::new(BaseUrl::parse(base).expect("base"));
    options.api_key = Some(Secret::new(API_KEY));
    options.flow = Some(ECHO_FLOW.into());
    options.inputs = AuthInput::default().with("token", "tok-broken");
    options.timeout = Duration::from_secs(5);
    run(options).await
}

fn assert_caught(report: &ConformanceReport, check: &str) {
    let text = report.to_text(false);
    assert!(!report.passed(), "the broken variant must fail:\n{text}");
    assert_eq!(
        report.check(check).map(|c| c.status),
        Some(Status::Fail),
        "{check} must catch it:\n{text}"
    );
}

#[tokio::test]
async fn the_proxy_is_transparent_outside_the_fault() {
    // The proxy itself is transparent: with a fault that changes nothing on this path the
    // suite passes, so failures below come from the fault alone.
    let base = broken(Fault::UndeclaredDescriptorTool).await;
    let report = conformance(&base).await;
    for check in [
        "control.card.valid",
        "control.health.matches_card",
        "ws.subprotocol_required",
        "ws.api_key_enforced",
        "im.message_accepted",
    ] {
        assert_eq!(
            report.check(check).map(|c| c.status),
            Some(Status::Pass),
            "{check}:\n{}",
            report.to_text(false)
        );
    }
}

#[tokio::test]
async fn wrong_card_id_in_health_is_caught() {
    let report = conformance(&broken(Fault::WrongHealthCardId).await).await;
    assert_caught(&report, "control.health.matches_card");
}

#[tokio::test]
async fn missing_subprotocol_check_is_caught() {
    let report = conformance(&broken(Fault::NoSubprotocolCheck).await).await;
    assert_caught(&report, "ws.subprotocol_required");
}

#[tokio::test]
async fn missing_api_key_check_is_caught() {
    let report = conformance(&broken(Fault::NoApiKeyCheck).await).await;
    assert_caught(&report, "control.health.api_key_enforced");
    assert_caught(&report, "ws.api_key_enforced");
}

#[tokio::test]
async fn a_descriptor_tool_absent_from_the_card_is_caught() {
    let report = conformance(&broken(Fault::UndeclaredDescriptorTool).await).await;
    assert_caught(&report, "descriptor.tool_not_in_card");
}
