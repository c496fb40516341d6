//! Inbound downloads against a hostile Connector, over real sockets on 127.0.0.1: a
//! `server-runtime` Connector whose author code puts any `download_url` it likes in a
//! `chat.message`, a canary HTTP server on another loopback origin that counts every connection,
//! and the xAgent side with a file sink. What the Connector may learn is what its outbox sees:
//! the ack's code, message and whether it is retryable.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use xagent_client_runtime::{BaseUrl, ClientConfig, DataPlane, FileSink, admit};
use xagent_profile_im::OutboxEvent;
use xagent_protocol_types::{ChatFile, ChatMessage, ConnectorChannelId, FileType, Secret};
use xagent_protocol_validate::AdmissionWindow;
use xagent_server_runtime::{ConnectorHandle, ConnectorServer};
use xagent_testkit::{ECHO_CARD_ID, echo_connector, temp_state_dir};

const API_KEY: &str = "sk-downloads-test-7a41c2";

/// A plain HTTP server that answers every request with a short body and counts connections.
struct Canary {
    addr: std::net::SocketAddr,
    hits: Arc<AtomicUsize>,
}

impl Canary {
    async fn start(ip: &str) -> Self {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("canary binds");
        let addr = listener.local_addr().expect("canary address");
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buffer = [0u8; 2048];
                    let _ = socket.read(&mut buffer).await;
                    let _ = socket
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nConnection: close\r\n\r\ninternal-data",
                        )
                        .await;
                });
            }
        });
        Self { addr, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// A port on `ip` that nothing listens on (bound, then released).
async fn closed_port(ip: &str) -> u16 {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("binds");
    let port = listener.local_addr().expect("address").port();
    drop(listener);
    port
}

/// Keeps nothing; counts the bytes it was handed.
#[derive(Default, Clone)]
struct CountingSink(Arc<AtomicU64>);

impl FileSink for CountingSink {
    fn save(
        &self,
        _channel: &ConnectorChannelId,
        _file: &ChatFile,
        bytes: Vec<u8>,
    ) -> BoxFuture<'_, Result<String, String>> {
        self.0.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        Box::pin(async { Ok("saved".to_owned()) })
    }
}

/// What the hostile Connector's outbox saw for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// `accepted` (or `duplicate`).
    Accepted,
    /// `rejected`, not retryable: "rejected CODE: MESSAGE".
    Final(String),
    /// `rejected`, retryable: "rejected CODE: MESSAGE".
    Retry(String),
}

/// Routes of the hostile Connector's own origin: a redirect to wherever the test says, and a
/// large body (streamed, with or without a `Content-Length`), counting the bytes it produced.
#[derive(Clone, Default)]
struct OwnRoutes {
    redirect_to: Arc<std::sync::Mutex<String>>,
    produced: Arc<AtomicU64>,
}

const BIG_BODY: u64 = 200 * 1024 * 1024;

fn own_routes(routes: OwnRoutes) -> axum::Router {
    use axum::body::Body;
    use axum::response::Response;
    let redirect = routes.clone();
    let chunked = routes.clone();
    let sized = routes;
    axum::Router::new()
        .route(
            "/hop",
            axum::routing::get(move || {
                let to = redirect.redirect_to.lock().map(|s| s.clone()).unwrap_or_default();
                async move {
                    Response::builder()
                        .status(302)
                        .header("location", to)
                        .body(Body::empty())
                        .unwrap_or_default()
                }
            }),
        )
        .route(
            "/big-chunked",
            axum::routing::get(move || {
                let produced = chunked.produced.clone();
                async move { Response::new(Body::from_stream(big_stream(produced))) }
            }),
        )
        .route(
            "/big-sized",
            axum::routing::get(move || {
                let produced = sized.produced.clone();
                async move {
                    Response::builder()
                        .header("content-length", BIG_BODY.to_string())
                        .body(Body::from_stream(big_stream(produced)))
                        .unwrap_or_default()
                }
            }),
        )
}

/// 200 MiB of zeros in 64 KiB chunks, counting what was pulled.
fn big_stream(
    produced: Arc<AtomicU64>,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    const CHUNK: u64 = 64 * 1024;
    futures_util::stream::unfold(0u64, move |sent| {
        let produced = produced.clone();
        async move {
            if sent >= BIG_BODY {
                return None;
            }
            produced.fetch_add(CHUNK, Ordering::SeqCst);
            Some((Ok(bytes::Bytes::from(vec![0u8; CHUNK as usize])), sent + CHUNK))
        }
    })
}

/// The hostile Connector and a signed-in xAgent side with a file sink.
struct Rig {
    handle: ConnectorHandle,
    server: ConnectorServer,
    addr: std::net::SocketAddr,
    plane: DataPlane,
    channel: ConnectorChannelId,
    routes: OwnRoutes,
    sink: CountingSink,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    next: usize,
}

impl Rig {
    async fn start() -> Self {
        let dir = temp_state_dir("downloads");
        let (connector, _echo) = echo_connector();
        let routes = OwnRoutes::default();
        let served = routes.clone();
        let server = ConnectorServer::builder(connector)
            .state_dir(&dir)
            .expect("state dir")
            .api_key(Secret::new(API_KEY))
            .routes(move |_handle| own_routes(served))
            .build()
            .await
            .expect("builds");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = server.clone();
        tokio::spawn(async move {
            let _ = running
                .serve(listener, async move {
                    let _ = stopped.await;
                })
                .await;
        });
        let base = BaseUrl::parse(&format!("http://{addr}")).expect("base");
        let control =
            xagent_client_runtime::ControlPlane::new(base.clone(), Some(Secret::new(API_KEY)));
        let admitted = admit(&control, &AdmissionWindow::default(), Some(ECHO_CARD_ID))
            .await
            .expect("admitted");
        let config =
            ClientConfig::for_card(base, &admitted.card).with_api_key(Secret::new(API_KEY));
        let (plane, mut events) = DataPlane::connect(config).await.expect("starts");
        let sink = CountingSink::default();
        plane.set_file_sink(Arc::new(sink.clone()));
        tokio::time::timeout(Duration::from_secs(10), plane.connected())
            .await
            .expect("in time")
            .expect("online");
        let channel =
            plane.open_channel_for("alice", None).await.expect("opened").connector_channel_id;
        support::authenticate(&plane, &channel).await;
        plane.remember_channel(channel.clone()).await;
        // The application accepts every message that reaches it.
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                if let xagent_client_runtime::ClientEvent::ChatMessage(inbound) = event {
                    inbound.accept();
                }
            }
        });
        Self {
            handle: server.handle(),
            server,
            addr,
            plane,
            channel,
            routes,
            sink,
            stop: Some(stop),
            next: 0,
        }
    }

    fn own(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Sends one `chat.message` with a file at `download_url` and waits for what the outbox
    /// hears back.
    async fn offer(&mut self, download_url: &str) -> Seen {
        self.next += 1;
        let message_id = format!("in_dl_{}", self.next);
        let mut outbox = self.handle.outbox_events().expect("IM outbox");
        let mut file = ChatFile::new(FileType::File, format!("file_dl_{}", self.next))
            .with_filename("report.pdf")
            .with_mime_type("application/pdf");
        file.download_url = Some(download_url.to_owned());
        let message = ChatMessage::with_files(message_id.as_str(), None, vec![file]);
        self.handle.send_message(&self.channel, message).await.expect("queued");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let event = tokio::time::timeout_at(deadline, outbox.recv())
                .await
                .expect("an answer within 60 s")
                .expect("outbox events");
            match event {
                OutboxEvent::Delivered { message_id: id, .. } if id.as_str() == message_id => {
                    return Seen::Accepted;
                }
                OutboxEvent::Failed { message_id: id, reason, .. } if id.as_str() == message_id => {
                    return Seen::Final(reason);
                }
                OutboxEvent::Retrying { message_id: id, reason, .. }
                    if id.as_str() == message_id =>
                {
                    return Seen::Retry(reason);
                }
                _ => {}
            }
        }
    }

    async fn stop(mut self) {
        self.plane.close().await;
        self.server.shutdown();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn refused(seen: &Seen) -> bool {
    matches!(seen, Seen::Final(reason) if reason.contains("refused by policy"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_refuse_loopback_outside_the_connectors_origin() {
    let mut rig = Rig::start().await;
    let other_host = Canary::start("127.0.0.2").await;
    let other_port = Canary::start("127.0.0.1").await;
    for url in [
        format!("http://{}/latest/meta-data", other_host.addr),
        format!("http://{}/admin", other_port.addr),
        format!("http://[::ffff:127.0.0.1]:{}/admin", other_port.addr.port()),
    ] {
        let seen = rig.offer(&url).await;
        assert!(refused(&seen), "{url}: {seen:?}");
    }
    assert_eq!(other_host.hits() + other_port.hits(), 0, "no connection left xAgent");
    assert_eq!(rig.sink.0.load(Ordering::SeqCst), 0, "nothing reached the sink");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirect_to_a_private_address_is_refused() {
    let mut rig = Rig::start().await;
    let canary = Canary::start("127.0.0.1").await;
    if let Ok(mut to) = rig.routes.redirect_to.lock() {
        *to = format!("http://{}/internal", canary.addr);
    }
    let seen = rig.offer(&rig.own("/hop")).await;
    assert!(refused(&seen), "{seen:?}");
    assert_eq!(canary.hits(), 0, "the redirect was not followed");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebinding_host_is_refused_at_connect() {
    // `localhost` is a name, not an address: only the addresses it resolves to at connect time
    // say where the request would go, and they are loopback, outside the Connector's origin.
    let mut rig = Rig::start().await;
    let canary = Canary::start("127.0.0.1").await;
    let seen = rig.offer(&format!("http://localhost:{}/internal", canary.addr.port())).await;
    assert!(refused(&seen), "{seen:?}");
    assert_eq!(canary.hits(), 0, "nothing connected to the resolved loopback address");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_is_refused_while_streaming() {
    let mut rig = Rig::start().await;
    // Declared too large: refused before the body is read.
    let seen = rig.offer(&rig.own("/big-sized")).await;
    assert!(
        matches!(&seen, Seen::Final(reason) if reason.contains("payload_too_large")),
        "{seen:?}"
    );
    // Not declared: reading stops once the limit is passed (a few socket buffers later).
    let before = rig.routes.produced.load(Ordering::SeqCst);
    let seen = rig.offer(&rig.own("/big-chunked")).await;
    assert!(
        matches!(&seen, Seen::Final(reason) if reason.contains("payload_too_large")),
        "{seen:?}"
    );
    let produced = rig.routes.produced.load(Ordering::SeqCst) - before;
    assert!(produced < 48 * 1024 * 1024, "the Connector produced {produced} bytes of 200 MiB");
    assert_eq!(rig.sink.0.load(Ordering::SeqCst), 0, "nothing reached the sink");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_does_not_reveal_why_a_download_failed() {
    let mut rig = Rig::start().await;
    let open = Canary::start("127.0.0.2").await;
    let closed = closed_port("127.0.0.2").await;
    let answered = rig.offer(&format!("http://{}/", open.addr)).await;
    let silent = rig.offer(&format!("http://127.0.0.2:{closed}/")).await;
    assert_eq!(answered, silent, "an open and a closed port look the same");
    assert_eq!(open.hits(), 0);
    // A failure on the Connector's own origin (an unknown file, a dead port on its host is
    // another origin) says only that the download failed.
    let missing = rig.offer(&rig.own("/files/refs/file_unknown?exp=1&sig=00")).await;
    let Seen::Retry(reason) = &missing else {
        panic!("a failed download is retryable: {missing:?}")
    };
    assert!(reason.contains("download failed"), "{reason}");
    for detail in ["404", "HTTP", "error sending", "refused", "127.0.0.1", "sig="] {
        assert!(!reason.contains(detail), "the ack reveals {detail:?}: {reason}");
    }
    rig.stop().await;
}
