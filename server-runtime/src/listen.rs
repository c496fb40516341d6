//! Serving HTTP to the open internet: an accept loop on hyper with a header-read timeout, an
//! idle timeout on every connection that is not an upgraded WebSocket, connection limits (a
//! global cap, per-address caps and rates, a budget reserved for xAgent's data plane; see
//! [`admission`]), the client address for per-address limits (trusted proxies' forwarding
//! header), and graceful shutdown.
//!
//! `axum::serve` has none of these: one client sending half a request header every few
//! seconds could hold a descriptor forever, and one address could take every slot (F1).

mod admission;
mod socket;

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use admission::{Admission, Ticket};
use socket::{DoneOnDrop, IdleTimeout};

pub use ipnet::IpNet;

/// Connection limits of the HTTP listener, with their defaults (SECURITY.md, "The listener").
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServeLimits {
    /// Time a client has to send a complete request header (10 s).
    pub header_read_timeout: Duration,
    /// A connection with no byte read or written for this long is closed (60 s); upgraded
    /// WebSockets (xAgent's data plane) are exempt. Event streams send a keep-alive every
    /// 15 s, so only a reader that stopped reading is cut.
    pub idle_timeout: Duration,
    /// Connections open at once (1,024). When the slots are full, a new connection takes the
    /// slot of the one that waited longest without a request in progress; when none waits,
    /// it is closed right after `accept`.
    pub max_connections: usize,
    /// Connections one client address holds at once (256; IPv4 per address, IPv6 per /64);
    /// further ones are closed right after `accept`. Trusted proxies are exempt.
    pub max_connections_per_address: usize,
    /// New connections one client address may open per second, sustained (64); trusted
    /// proxies are exempt.
    pub new_connections_per_address_per_second: u32,
    /// New connections one client address may open at once before the rate applies (256).
    pub new_connection_burst_per_address: u32,
    /// Slots of [`Self::max_connections`] that only xAgent's authenticated data plane
    /// (`/ws` upgraded with the system API key) may hold (64): every other connection shares
    /// the rest, so a flood of visitors or half-open connections never starves xAgent.
    pub reserved_data_plane_connections: usize,
    /// Reverse proxies whose connections are exempt from the per-address limits and whose
    /// `Forwarded` (or `X-Forwarded-For`) names the client for [`peer_ip`] (default none: nobody is trusted and
    /// the header is ignored).
    pub trusted_proxies: Vec<IpNet>,
    /// How long shutdown waits for open connections to finish (10 s).
    pub drain_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1_024,
            max_connections_per_address: 256,
            new_connections_per_address_per_second: 64,
            new_connection_burst_per_address: 256,
            reserved_data_plane_connections: 64,
            trusted_proxies: Vec::new(),
            drain_timeout: Duration::from_secs(10),
        }
    }
}

impl ServeLimits {
    /// Sets the global connection cap.
    #[must_use]
    pub fn with_max_connections(mut self, connections: usize) -> Self {
        self.max_connections = connections;
        self
    }

    /// Sets the per-address limits: connections open at once, new ones per second, and the
    /// burst of new ones before the rate applies.
    #[must_use]
    pub fn with_per_address(mut self, open: usize, per_second: u32, burst: u32) -> Self {
        self.max_connections_per_address = open;
        self.new_connections_per_address_per_second = per_second;
        self.new_connection_burst_per_address = burst;
        self
    }

    /// Sets how many slots only xAgent's authenticated data plane may hold.
    #[must_use]
    pub fn with_reserved_data_plane_connections(mut self, connections: usize) -> Self {
        self.reserved_data_plane_connections = connections;
        self
    }

    /// Sets the trusted reverse proxies (addresses or networks).
    #[must_use]
    pub fn with_trusted_proxies(mut self, proxies: Vec<IpNet>) -> Self {
        self.trusted_proxies = proxies;
        self
    }

    /// True when `ip` is a trusted reverse proxy (an IPv4-mapped IPv6 peer counts as IPv4).
    pub fn is_trusted_proxy(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }
}

/// `ip` with an IPv4-mapped IPv6 address written as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// Parses a `--trusted-proxy` value: an address (`10.0.0.5`, `::1`) or a network
/// (`10.0.0.0/8`, `fd00::/8`).
pub fn parse_trusted_proxy(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse::<IpNet>().or_else(|_| text.parse::<IpAddr>().map(IpNet::from)).map_err(|_| {
        format!("{text:?} is not an address or network (e.g. 10.0.0.5, 10.0.0.0/8, fd00::/8)")
    })
}

/// Marks the response of `/ws` when it upgrades: the API key was checked, the connection is
/// xAgent's data plane and moves into the reserved slots.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DataPlaneUpgrade;

/// The client behind a trusted proxy, from its `X-Forwarded-For` ([`peer_ip`] prefers it).
#[derive(Clone, Copy, Debug)]
struct ForwardedClient(IpAddr);

/// The client a trusted proxy forwarded for: the hops of `Forwarded` (RFC 7239, its `for=`
/// parameters) or, without that header, of `X-Forwarded-For`, read from the right, skipping
/// trusted proxies; the first other address is the client. `None` when neither header is
/// there or a hop is not an address (`unknown`, an obfuscated name, garbage): the direct peer
/// is used then.
fn forwarded_client(headers: &hyper::HeaderMap, limits: &ServeLimits) -> Option<IpAddr> {
    let mut hops = Vec::new();
    if headers.contains_key(hyper::header::FORWARDED) {
        for value in headers.get_all(hyper::header::FORWARDED) {
            for element in value.to_str().ok()?.split(',') {
                let node = element.split(';').find_map(|pair| {
                    let (name, value) = pair.trim().split_once('=')?;
                    name.trim().eq_ignore_ascii_case("for").then(|| value.trim())
                });
                hops.push(node_address(node?)?);
            }
        }
    } else {
        for value in headers.get_all("x-forwarded-for") {
            let text = value.to_str().ok()?;
            for hop in text.split(',') {
                hops.push(hop.trim().parse::<IpAddr>().ok()?);
            }
        }
    }
    let mut client = None;
    for hop in hops.iter().rev() {
        let ip = canonical(*hop);
        client = Some(ip);
        if !limits.is_trusted_proxy(ip) {
            break;
        }
    }
    client
}

/// The address of an RFC 7239 node: `192.0.2.1`, `192.0.2.1:80`, `"[2001:db8::1]:4711"`;
/// `None` for `unknown` and obfuscated identifiers.
fn node_address(node: &str) -> Option<IpAddr> {
    let node = node.trim_matches('"');
    if let Some(rest) = node.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    node.parse()
        .ok()
        .or_else(|| node.rsplit_once(':')?.0.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4))
}

/// The answer to a request on a probation slot that is not a data-plane upgrade: the
/// listener is full; the connection closes after it.
fn busy_response() -> hyper::Response<axum::body::Body> {
    let body = xagent_protocol_types::HttpErrorBody {
        error: xagent_protocol_types::WireError::new(
            xagent_protocol_types::ErrorCode::CapacityExceeded,
            "the server is at its connection limit; try again in a few seconds",
        ),
    };
    let json = serde_json::to_vec(&body).unwrap_or_default();
    let mut response = hyper::Response::new(axum::body::Body::from(json));
    *response.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    headers.insert(hyper::header::RETRY_AFTER, hyper::header::HeaderValue::from_static("2"));
    headers.insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    response
}

/// Serves `router` on `listener` with `limits` until `shutdown` completes, then stops
/// accepting, asks every connection to finish its request and waits for them (at most
/// [`ServeLimits::drain_timeout`]). Handlers can read the peer as `ConnectInfo<SocketAddr>`,
/// or the client as [`peer_ip`].
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let admission = Admission::new(limits.clone(), Instant::now());
    let limits = Arc::new(limits);
    let connections = TaskTracker::new();
    let stopping = CancellationToken::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Decided before a byte is read; a refusal is a reset (no TIME_WAIT kept here), counted
        // and reported by the admission at a bounded rate.
        let ticket = match admission.admit(peer.ip(), Instant::now()) {
            Ok(ticket) => ticket,
            Err(_) => {
                let _ = stream.set_zero_linger();
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let exempt = Arc::new(AtomicBool::new(false));
        let evicted = ticket.evicted();
        let ticket = Arc::new(ticket);
        // The socket holds the slot: an upgrade hands it on to the WebSocket, which keeps the
        // slot until it closes (the HTTP task ends right after the upgrade).
        let io = TokioIo::new(IdleTimeout::new(
            stream,
            limits.idle_timeout,
            Arc::clone(&exempt),
            Arc::clone(&ticket),
        ));
        let trusted_peer = admission.trusted(peer.ip());
        let slot = Arc::clone(&ticket);
        let service = {
            let (router, limits) = (router.clone(), Arc::clone(&limits));
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let mut request = request.map(axum::body::Body::new);
                request.extensions_mut().insert(ConnectInfo(peer));
                if trusted_peer && let Some(client) = forwarded_client(request.headers(), &limits) {
                    request.extensions_mut().insert(ForwardedClient(client));
                }
                handle(request, router.clone(), Arc::clone(&ticket), Arc::clone(&exempt))
            })
        };
        let stopping = stopping.clone();
        let header_timeout = limits.header_read_timeout;
        connections.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
            let connection = builder.serve_connection(io, service).with_upgrades();
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "http connection ended with an error");
                    }
                }
                // Its slot went to a newer connection: it was only waiting, so nothing is lost.
                () = evicted => {}
                () = stopping.cancelled() => {
                    // Nothing in progress (a silent or half-sent connection): nothing to finish.
                    if slot.is_waiting() {
                        return;
                    }
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    drop(listener);
    stopping.cancel();
    connections.close();
    let _ = tokio::time::timeout(limits.drain_timeout, connections.wait()).await;
    Ok(())
}

/// One request on an admitted connection: a probation slot only serves a data-plane upgrade;
/// a `/ws` upgrade moves the connection into the reserved slots; otherwise the connection
/// waits again (evictable) once the response body is done.
async fn handle(
    request: hyper::Request<axum::body::Body>,
    router: Router,
    ticket: Arc<Ticket>,
    exempt: Arc<AtomicBool>,
) -> Result<hyper::Response<axum::body::Body>, std::convert::Infallible> {
    ticket.busy();
    let probation = ticket.on_probation();
    if probation && !request.headers().contains_key(hyper::header::UPGRADE) {
        return Ok(busy_response());
    }
    let mut response = router.oneshot(request).await?;
    if response.status() == hyper::StatusCode::SWITCHING_PROTOCOLS {
        if response.extensions().get::<DataPlaneUpgrade>().is_some() {
            ticket.promote();
        } else if probation {
            return Ok(busy_response());
        } else {
            ticket.upgraded();
        }
        // A WebSocket may stay quiet for long; the data plane has its own liveness.
        exempt.store(true, Ordering::Relaxed);
        return Ok(response);
    }
    if probation {
        response
            .headers_mut()
            .insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    }
    Ok(response.map(|inner| axum::body::Body::new(DoneOnDrop { inner, ticket: Some(ticket) })))
}

/// Completes on Ctrl-C or SIGTERM (what service managers and `docker stop` send): pass it as
/// the `shutdown` of [`crate::ConnectorServer::serve`] for a graceful stop on both (L4). The
/// signals are taken over when this is called (inside the async runtime), not when the future
/// is first polled, so a SIGTERM right after the "listening" line is a graceful stop too.
pub fn stop_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{SignalKind, signal};
        (signal(SignalKind::terminate()).ok(), signal(SignalKind::interrupt()).ok())
    };
    async move {
        #[cfg(unix)]
        let which = match signals {
            (Some(mut term), Some(mut interrupt)) => tokio::select! {
                _ = interrupt.recv() => "Ctrl-C (SIGINT)",
                _ = term.recv() => "SIGTERM",
            },
            _ => {
                let _ = tokio::signal::ctrl_c().await;
                "Ctrl-C (SIGINT)"
            }
        };
        #[cfg(not(unix))]
        let which = {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        };
        tracing::info!("{which} received: stopping after the open requests finish");
    }
}

/// The client address of a request [`crate::ConnectorServer::serve`] accepted: the TCP peer,
/// or, when the peer is a trusted proxy ([`ServeLimits::trusted_proxies`]), the client its
/// `X-Forwarded-For` names. Author routes use it for per-address limits.
pub fn peer_ip(extensions: &axum::http::Extensions) -> Option<std::net::IpAddr> {
    if let Some(ForwardedClient(client)) = extensions.get::<ForwardedClient>() {
        return Some(*client);
    }
    extensions.get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(addr)| addr.ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(limits: ServeLimits) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", get(|| async { "ok" })).route(
            "/forever",
            get(|| async {
                let stream = futures_util::stream::pending::<Result<bytes::Bytes, io::Error>>();
                axum::body::Body::from_stream(stream)
            }),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, router, limits, async move {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// Reads until the server closes the connection; returns what it sent.
    async fn read_to_close(client: &mut TcpStream) -> String {
        let mut all = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return String::from_utf8_lossy(&all).into_owned(),
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn m1_a_half_sent_header_is_cut_after_the_header_timeout() {
        let limits = ServeLimits::default();
        let (addr, _stop) = start(limits.clone()).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        let started = Instant::now();
        read_to_close(&mut client).await;
        let waited = started.elapsed();
        assert!(waited >= limits.header_read_timeout, "closed after {waited:?}");
        assert!(waited < limits.idle_timeout, "closed by the header timeout, after {waited:?}");

        // A whole request is answered as usual.
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let answer = read_to_close(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    #[tokio::test(start_paused = true)]
    async fn m1_connections_beyond_the_cap_are_closed_at_once() {
        let limits = ServeLimits { max_connections: 1, ..ServeLimits::default() };
        let (addr, _stop) = start(limits).await;
        // The first holds a request in progress (a stream that never ends): not evictable.
        let mut first = TcpStream::connect(addr).await.unwrap();
        first.write_all(b"GET /forever HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = Instant::now();
        let mut second = TcpStream::connect(addr).await.unwrap();
        let _ = second.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let answer = read_to_close(&mut second).await;
        assert_eq!(answer, "", "the second connection got nothing");
        assert!(started.elapsed() < Duration::from_secs(1), "closed at once");
        // Once the first is gone, a new connection is served.
        drop(first);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mut third = TcpStream::connect(addr).await.unwrap();
        third.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        assert!(read_to_close(&mut third).await.starts_with("HTTP/1.1 200"));
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_a_half_sent_connection_makes_room_for_a_new_one() {
        let limits = ServeLimits { max_connections: 1, ..ServeLimits::default() };
        let (addr, _stop) = start(limits).await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        first.write_all(b"G").await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mut second = TcpStream::connect(addr).await.unwrap();
        second.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        assert!(read_to_close(&mut second).await.starts_with("HTTP/1.1 200"));
        let started = Instant::now();
        assert_eq!(read_to_close(&mut first).await, "", "the waiting one was closed");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_forwarded_header_names_the_client_only_from_a_trusted_proxy() {
        async fn client_of(limits: ServeLimits, header: &str) -> String {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let router = Router::new().route(
                "/",
                get(|extensions: axum::http::Extensions| async move {
                    peer_ip(&extensions).map(|ip| ip.to_string()).unwrap_or_default()
                }),
            );
            tokio::spawn(serve(listener, router, limits, std::future::pending()));
            let mut client = TcpStream::connect(addr).await.unwrap();
            let request = format!("GET / HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n");
            client.write_all(request.as_bytes()).await.unwrap();
            let answer = read_to_close(&mut client).await;
            answer.rsplit("\r\n\r\n").next().unwrap_or_default().to_owned()
        }
        let forged = "X-Forwarded-For: 203.0.113.9\r\n";
        assert_eq!(
            client_of(ServeLimits::default(), forged).await,
            "127.0.0.1",
            "nobody is trusted by default"
        );
        let trusted = ServeLimits::default().with_trusted_proxies(vec![
            parse_trusted_proxy("127.0.0.1").unwrap(),
            parse_trusted_proxy("10.0.0.0/8").unwrap(),
        ]);
        assert_eq!(client_of(trusted.clone(), forged).await, "203.0.113.9");
        // Read from the right: what the client itself wrote on the left is not believed.
        let chain = "X-Forwarded-For: 198.51.100.1, 203.0.113.9, 10.1.1.1\r\n";
        assert_eq!(client_of(trusted.clone(), chain).await, "203.0.113.9");
        // A hop that is not an address: the direct peer counts.
        let garbage = "X-Forwarded-For: 203.0.113.9, not-an-ip\r\n";
        assert_eq!(client_of(trusted.clone(), garbage).await, "127.0.0.1");
        // RFC 7239 `Forwarded` wins over `X-Forwarded-For`; ports and brackets are dropped.
        let forwarded = "Forwarded: for=198.51.100.1, for=\"[2001:db8::7]:4711\";proto=https, for=10.1.1.1:80\r\nX-Forwarded-For: 203.0.113.9\r\n";
        assert_eq!(client_of(trusted.clone(), forwarded).await, "2001:db8::7");
        let hidden = "Forwarded: for=_hidden, for=10.1.1.1\r\n";
        assert_eq!(client_of(trusted.clone(), hidden).await, "127.0.0.1", "no address: the peer");
        assert_eq!(
            client_of(ServeLimits::default(), "Forwarded: for=203.0.113.9\r\n").await,
            "127.0.0.1",
            "Forwarded from an untrusted peer is ignored too"
        );
        assert_eq!(client_of(trusted, "").await, "127.0.0.1");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_does_not_wait_for_connections_that_never_sent_a_request() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", get(|| async { "ok" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve(listener, router, ServeLimits::default(), async move {
            let _ = stopped.await;
        }));
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = Instant::now();
        let _ = stop.send(());
        served.await.unwrap().unwrap();
        assert!(started.elapsed() < Duration::from_secs(1), "waited {:?}", started.elapsed());
    }

    #[test]
    fn trusted_proxies_parse_as_addresses_or_networks() {
        let limits = ServeLimits::default().with_trusted_proxies(vec![
            parse_trusted_proxy("10.0.0.5").unwrap(),
            parse_trusted_proxy("fd00::/8").unwrap(),
        ]);
        assert!(limits.is_trusted_proxy("10.0.0.5".parse().unwrap()));
        assert!(limits.is_trusted_proxy("::ffff:10.0.0.5".parse().unwrap()));
        assert!(!limits.is_trusted_proxy("10.0.0.6".parse().unwrap()));
        assert!(limits.is_trusted_proxy("fd12::1".parse().unwrap()));
        assert!(parse_trusted_proxy("example.com").is_err());
        assert!(!ServeLimits::default().is_trusted_proxy("127.0.0.1".parse().unwrap()));
    }

    #[tokio::test(start_paused = true)]
    async fn m1_an_idle_keep_alive_connection_is_closed() {
        let limits = ServeLimits::default();
        let (addr, _stop) = start(limits.clone()).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let started = Instant::now();
        let answer = read_to_close(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(started.elapsed() <= limits.idle_timeout + Duration::from_secs(1));
    }
}
