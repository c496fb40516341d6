//! testkit's HAProxy in front of two tiny HTTP servers: both serve, one is killed, the
//! health checks take it out and the frontend keeps answering; it comes back when it
//! serves again.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use xagent_testkit::haproxy::{Balance, HaproxyOptions, TestHaproxy};

/// Answers every request (health checks included) with 200 and its own name.
async fn tiny_server(listener: TcpListener, name: &'static str) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { return };
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                name.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

async fn serve(addr: &str, name: &'static str) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind(addr).await.expect("bind");
    let addr = listener.local_addr().expect("address");
    (addr, tokio::spawn(tiny_server(listener, name)))
}

async fn answers(client: &reqwest::Client, url: &str, n: usize) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let response = client.get(url).send().await.expect("the frontend answers");
        assert_eq!(response.status(), 200);
        seen.push(response.text().await.expect("a body"));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_backend_is_taken_out_and_the_frontend_keeps_answering() {
    let (a, _a_task) = serve("127.0.0.1:0", "A").await;
    let (b, b_task) = serve("127.0.0.1:0", "B").await;
    let options = HaproxyOptions::default().with_balance(Balance::RoundRobin).with_checks(
        Duration::from_millis(200),
        2,
        1,
    );
    let proxy = TestHaproxy::start(&[a, b], options).await.expect("haproxy starts");
    for addr in [a, b] {
        proxy.wait_backend_state(addr, true, Duration::from_secs(10)).await.expect("up");
    }
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let url = format!("{}/anything", proxy.url());
    let seen = answers(&client, &url, 6).await;
    assert!(seen.contains(&"A".to_owned()) && seen.contains(&"B".to_owned()), "{seen:?}");

    // Kill B: its listener closes with its task.
    b_task.abort();
    let _ = b_task.await;
    proxy.wait_backend_state(b, false, Duration::from_secs(10)).await.expect("B taken out");
    let states = proxy.backend_states().await.unwrap();
    assert!(states.iter().any(|s| s.addr == a && s.up), "{states:?}");
    let seen = answers(&client, &url, 6).await;
    assert!(seen.iter().all(|s| s == "A"), "only A answers: {seen:?}");

    // B serves again on its port: the checks bring it back.
    let (_, _b_again) = serve(&b.to_string(), "B").await;
    proxy.wait_backend_state(b, true, Duration::from_secs(10)).await.expect("B back");
}

#[tokio::test]
async fn a_backend_that_never_answers_health_checks_stays_down() {
    let (a, _a_task) = serve("127.0.0.1:0", "A").await;
    // Nothing listens here.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let options = HaproxyOptions::default().with_balance(Balance::LeastConn).with_checks(
        Duration::from_millis(200),
        1,
        1,
    );
    let proxy = TestHaproxy::start(&[a, silent], options).await.expect("haproxy starts");
    proxy.wait_backend_state(a, true, Duration::from_secs(10)).await.expect("A up");
    proxy.wait_backend_state(silent, false, Duration::from_secs(10)).await.expect("down");
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let seen = answers(&client, &proxy.url(), 4).await;
    assert!(seen.iter().all(|s| s == "A"), "{seen:?}");
    let stranger: SocketAddr = "127.0.0.1:9".parse().unwrap();
    assert!(proxy.wait_backend_state(stranger, true, Duration::from_millis(10)).await.is_err());
}

/// A backend with `/health` and an echoing `/ws`.
async fn websocket_backend() -> SocketAddr {
    use axum::extract::ws::WebSocketUpgrade;
    use axum::routing::get;
    let app = axum::Router::new().route("/health", get(|| async { "ok" })).route(
        "/ws",
        get(|ws: WebSocketUpgrade| async {
            ws.on_upgrade(|mut socket| async move {
                while let Some(Ok(message)) = socket.recv().await {
                    if socket.send(message).await.is_err() {
                        break;
                    }
                }
            })
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_outlives_the_http_idle_timeout_but_not_the_tunnel_timeout() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let backend = websocket_backend().await;
    let idle = Duration::from_millis(300);
    for (tunnel, survives) in [(Duration::from_secs(3600), true), (idle, false)] {
        let options = HaproxyOptions::default().with_idle_timeout(idle).with_tunnel_timeout(tunnel);
        let proxy = TestHaproxy::start(&[backend], options).await.expect("haproxy starts");
        proxy.wait_backend_state(backend, true, Duration::from_secs(10)).await.expect("up");
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", proxy.addr()))
            .await
            .expect("upgraded through haproxy");
        ws.send(Message::text("one")).await.unwrap();
        assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("one"));
        // Idle for longer than the HTTP idle timeout.
        tokio::time::sleep(idle * 4).await;
        let echoed = match ws.send(Message::text("two")).await {
            Ok(()) => matches!(ws.next().await, Some(Ok(m)) if m == Message::text("two")),
            Err(_) => false,
        };
        assert_eq!(echoed, survives, "tunnel timeout {tunnel:?}");
    }
}
