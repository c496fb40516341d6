//! The connection's byte level: a socket cut after an idle timeout (unless it became a
//! WebSocket), and a response body that frees the connection's ticket when it is done.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::admission::Ticket;

/// A response body that tells the connection's ticket when it is finished (sent or dropped).
pub(super) struct DoneOnDrop {
    pub(super) inner: axum::body::Body,
    pub(super) ticket: Option<Arc<Ticket>>,
}

impl DoneOnDrop {
    fn finish(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            ticket.done();
        }
    }
}

impl Drop for DoneOnDrop {
    fn drop(&mut self) {
        self.finish();
    }
}

impl hyper::body::Body for DoneOnDrop {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.finish();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A socket that fails with `TimedOut` after `timeout` without a byte read or written,
/// unless `exempt` was set (an upgraded WebSocket). It holds the connection's slot until it
/// is dropped.
pub(super) struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
    exempt: Arc<AtomicBool>,
    _slot: Arc<Ticket>,
}

impl<S> IdleTimeout<S> {
    pub(super) fn new(
        inner: S,
        timeout: Duration,
        exempt: Arc<AtomicBool>,
        slot: Arc<Ticket>,
    ) -> Self {
        let deadline = Box::pin(tokio::time::sleep(timeout));
        Self { inner, timeout, deadline, exempt, _slot: slot }
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

    /// A write's outcome: bytes written are progress, a pending write checks the deadline.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match polled {
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
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.after_write(cx, polled)
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
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.after_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
