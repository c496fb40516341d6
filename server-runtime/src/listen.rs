//! Serving HTTP to the open internet: an accept loop on hyper with a header-read timeout, an
//! idle timeout on every connection that is not an upgraded WebSocket, a cap on open
//! connections, the peer address for the join throttle, and graceful shutdown.
//!
//! `axum::serve` has none of the first three: one client sending half a request header every
//! few seconds could hold a descriptor forever.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Connection limits of the HTTP listener, with their defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServeLimits {
    /// Time a client has to send a complete request header (10 s).
    pub header_read_timeout: Duration,
    /// A connection with no byte read or written for this long is closed (60 s); upgraded
    /// WebSockets (xAgent's data plane) are exempt. Event streams send a keep-alive every
    /// 15 s, so only a reader that stopped reading is cut.
    pub idle_timeout: Duration,
    /// Connections open at once (1,024); further ones are closed right after `accept`.
    pub max_connections: usize,
    /// How long shutdown waits for open connections to finish (10 s).
    pub drain_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1_024,
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves `router` on `listener` with `limits` until `shutdown` completes, then stops
/// accepting, asks every connection to finish its request and waits for them (at most
/// [`ServeLimits::drain_timeout`]). Handlers can read the peer as `ConnectInfo<SocketAddr>`.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
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
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::warn!(
                max = limits.max_connections,
                "connection cap reached; closing a new connection"
            );
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let exempt = Arc::new(AtomicBool::new(false));
        let io = TokioIo::new(IdleTimeout::new(stream, limits.idle_timeout, Arc::clone(&exempt)));
        let router = router.clone();
        let service = hyper::service::service_fn(
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                if request.headers().contains_key(hyper::header::UPGRADE) {
                    // A WebSocket may stay quiet for long; the data plane has its own liveness.
                    exempt.store(true, Ordering::Relaxed);
                }
                router.clone().oneshot(request.map(axum::body::Body::new))
            },
        );
        let stopping = stopping.clone();
        let header_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
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
                () = stopping.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    stopping.cancel();
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(limits.drain_timeout, permits.acquire_many(all)).await;
    Ok(())
}

/// A socket that fails with `TimedOut` after `timeout` without a byte read or written,
/// unless `exempt` was set (an upgraded WebSocket).
struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
    exempt: Arc<AtomicBool>,
}

impl<S> IdleTimeout<S> {
    fn new(inner: S, timeout: Duration, exempt: Arc<AtomicBool>) -> Self {
        Self { inner, timeout, deadline: Box::pin(tokio::time::sleep(timeout)), exempt }
    }

    fn progressed(&mut self) {
        // An upgraded WebSocket is never cut for idling: no clock read or timer reset per
        // read and write on the data plane.
        if self.exempt.load(Ordering::Relaxed) {
            return;
        }
        let next = Instant::now() + self.timeout;
        self.deadline.as_mut().reset(next);
    }

    /// Called when the socket has nothing to do: an error once the deadline passed.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.exempt.load(Ordering::Relaxed) {
            return Poll::Pending;
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, "connection idle too long"))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.progressed();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => self.check_idle(cx).map(Err),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(written)) => {
                if written > 0 {
                    self.progressed();
                }
                Poll::Ready(Ok(written))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => self.check_idle(cx).map(Err),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.check_idle(cx).map(Err),
            ready => ready,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(written)) => {
                if written > 0 {
                    self.progressed();
                }
                Poll::Ready(Ok(written))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => self.check_idle(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Completes on Ctrl-C or SIGTERM (what service managers and `docker stop` send): pass it as
/// the `shutdown` of [`crate::ConnectorServer::serve`] for a graceful stop on both (L4).
pub async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The peer address a request came from, when [`crate::ConnectorServer::serve`] accepted it
/// (author routes use it for per-address limits).
pub fn peer_ip(extensions: &axum::http::Extensions) -> Option<std::net::IpAddr> {
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
        let router = Router::new().route("/", get(|| async { "ok" }));
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
        let (addr, _stop) = start(limits).await;
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
        let mut first = TcpStream::connect(addr).await.unwrap();
        first.write_all(b"G").await.unwrap();
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
    async fn m1_an_idle_keep_alive_connection_is_closed() {
        let limits = ServeLimits::default();
        let (addr, _stop) = start(limits).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let started = Instant::now();
        let answer = read_to_close(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(started.elapsed() <= limits.idle_timeout + Duration::from_secs(1));
    }
}
