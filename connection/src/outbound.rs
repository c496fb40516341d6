//! A connection's outbound handle (its write queue, its session and the clock that stamps
//! every packet) and the one request/ack correlation: requests are registered by
//! `request_id`, answered by the reader, and forgotten by the session when they time out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Sink;
use tokio::sync::{mpsc, oneshot};
use xagent_protocol_types::{Clock, Packet, RequestId};
use xagent_protocol_validate::Session;

use crate::writer::{Outgoing, SendError, WriterOptions, write_loop};
use crate::{Frame, lock};

/// The sending half of one connection: cheap to clone, shared by everything that writes.
#[derive(Clone)]
pub struct Outbound {
    tx: mpsc::Sender<Outgoing>,
    session: Arc<Mutex<Session>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("side", &lock(&self.session).side())
            .finish_non_exhaustive()
    }
}

impl Outbound {
    /// Starts the writer task of one connection on `sink` (queue of `queue` packets) and
    /// returns the handle and the task. `session` judges every packet written.
    pub fn open<Si>(
        session: Arc<Mutex<Session>>,
        sink: Si,
        options: WriterOptions,
        queue: usize,
        clock: Arc<dyn Clock>,
    ) -> (Self, tokio::task::JoinHandle<()>)
    where
        Si: Sink<Frame> + Send + Unpin + 'static,
    {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let writer = tokio::spawn(write_loop(sink, rx, Arc::clone(&session), options));
        (Self { tx, session, clock }, writer)
    }

    /// The sequencing session of this connection.
    pub fn session(&self) -> &Arc<Mutex<Session>> {
        &self.session
    }

    /// The write queue (for callers that queue without waiting, or reserve a place first).
    pub fn queue(&self) -> &mpsc::Sender<Outgoing> {
        &self.tx
    }

    /// Now, by the injected clock (every packet's `time`).
    pub fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    /// Stamps and queues a packet, then waits until it was written or refused.
    pub async fn send(&self, packet: Packet) -> Result<(), SendError> {
        let (done, written) = oneshot::channel();
        let packet = packet.time(self.now());
        self.tx.send(Outgoing::Tracked(packet, done)).await.map_err(|_| SendError::Closed)?;
        written.await.unwrap_or(Err(SendError::Closed))
    }

    /// Stamps and queues a packet without waiting for its write (replies from a reader).
    pub async fn push(&self, packet: Packet) {
        let _ = self.tx.send(Outgoing::Packet(packet.time(self.now()))).await;
    }

    /// Queues a close frame; the writer stops after it.
    pub async fn close(&self, code: u16, reason: impl Into<String>) {
        let _ = self.tx.send(Outgoing::Close(code, reason.into())).await;
    }
}

/// Why a request has no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// It was not sent.
    #[error(transparent)]
    Send(#[from] SendError),
    /// No answer within the timeout (the session forgot the request).
    #[error("no answer within {} ms", .0.as_millis())]
    TimedOut(Duration),
    /// The connection ended before an answer.
    #[error("the connection ended before an answer")]
    Closed,
}

/// The pending requests of a side, keyed by `request_id`; `T` is what an answer carries.
#[derive(Debug)]
pub struct Requests<T> {
    pending: Mutex<HashMap<RequestId, oneshot::Sender<T>>>,
}

impl<T> Default for Requests<T> {
    fn default() -> Self {
        Self { pending: Mutex::new(HashMap::new()) }
    }
}

impl<T> Requests<T> {
    /// No request pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hands the answer to the request's waiter; false when none waits (it timed out).
    pub fn resolve(&self, request_id: &RequestId, answer: T) -> bool {
        match lock(&self.pending).remove(request_id) {
            Some(waiter) => waiter.send(answer).is_ok(),
            None => false,
        }
    }

    /// Whether a request is waiting for its answer.
    pub fn is_pending(&self, request_id: &RequestId) -> bool {
        lock(&self.pending).contains_key(request_id)
    }

    /// Fails every pending request with [`RequestError::Closed`] (the connection ended).
    pub fn fail_all(&self) {
        lock(&self.pending).clear();
    }

    /// Sends `packet` (which carries its `request_id`) on `outbound` and waits up to `timeout`
    /// for the answer the reader resolves. On timeout the request is forgotten here and by the
    /// session, so a late ack is ignored.
    pub async fn request(
        &self,
        outbound: &Outbound,
        packet: Packet,
        timeout: Duration,
    ) -> Result<T, RequestError> {
        let Some(request_id) = packet.request_id.clone() else {
            return Err(RequestError::Send(SendError::Encode(
                "a request needs a request_id".into(),
            )));
        };
        let (sender, receiver) = oneshot::channel();
        lock(&self.pending).insert(request_id.clone(), sender);
        if let Err(error) = outbound.send(packet).await {
            lock(&self.pending).remove(&request_id);
            return Err(RequestError::Send(error));
        }
        match tokio::time::timeout(timeout, receiver).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(RequestError::Closed),
            Err(_) => {
                lock(&self.pending).remove(&request_id);
                let mut session = lock(outbound.session());
                let side = session.side();
                session.forget_request(side, &request_id);
                Err(RequestError::TimedOut(timeout))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use xagent_protocol_types::{
        ConnectorHello, ConnectorHelloAck, ManualClock, Ping, ProfileId, RequestId, Side,
    };
    use xagent_protocol_validate::AdmissionWindow;

    use super::*;
    use crate::{Admission, OutboundJudge, OutboundRefusal};

    struct RefuseAll;

    impl OutboundJudge for RefuseAll {
        fn judge(&self, _: &Packet, _: &str) -> Result<(), OutboundRefusal> {
            Err(OutboundRefusal {
                rules: vec!["test.rule".into()],
                message: "test.rule: no".into(),
            })
        }
    }

    /// An xAgent session past hello, and a sink that collects what is written.
    fn established()
    -> (Arc<Mutex<Session>>, impl Sink<Frame> + Send + Unpin + 'static, mpsc::Receiver<Frame>) {
        let admission = Admission::from_parts(
            "im.out".into(),
            vec![ProfileId::from("xagent.im.v2")],
            None,
            AdmissionWindow::default(),
        );
        let mut session = admission.current().session(Side::Xagent);
        let hello = Packet::with_payload(
            "pkt_h",
            ConnectorHello::new("im.out", vec!["xagent.im.v2".into()]),
        )
        .request_id(RequestId::from("req_h"));
        session.on_sent(&hello).expect("hello");
        let ack = Packet::with_payload("pkt_a", ConnectorHelloAck::new("im.out", "conn_1"))
            .answering(&hello);
        session.on_received(&ack).expect("ack");
        let (tx, rx) = mpsc::channel(16);
        let sink = Box::pin(futures_util::sink::unfold(tx, |tx, frame: Frame| async move {
            tx.send(frame).await.map_err(|_| ())?;
            Ok::<_, ()>(tx)
        }));
        (Arc::new(Mutex::new(session)), sink, rx)
    }

    /// `sink::unfold` (like `sink_map_err`) panics when used again after an error: the writer
    /// must stop at the first failure, here a flush that fails just before a close frame.
    #[tokio::test]
    async fn writer_never_uses_a_sink_again_after_it_failed() {
        let sink = Box::pin(futures_util::sink::unfold((), |(), _frame: Frame| async move {
            Err::<(), _>("the peer is gone")
        }));
        let (tx, rx) = mpsc::channel(4);
        tx.send(crate::writer::Outgoing::Packet(ping("req_gone"))).await.expect("queued");
        tx.send(crate::writer::Outgoing::Close(1000, "bye".into())).await.expect("queued");
        drop(tx);
        let (session, _unused_sink, _written) = established();
        crate::write_loop(sink, rx, session, WriterOptions::new(1 << 20)).await;
    }

    fn ping(id: &str) -> Packet {
        Packet::with_payload(format!("pkt_{id}"), Ping::default()).request_id(RequestId::from(id))
    }

    #[tokio::test(start_paused = true)]
    async fn send_rule_a_packet_the_judge_refuses_never_leaves_and_is_forgotten_by_the_session() {
        let (session, sink, mut written) = established();
        let mut options = WriterOptions::new(1 << 20);
        options.judge = Some(Arc::new(RefuseAll));
        let clock = Arc::new(ManualClock::new(7));
        let (outbound, _writer) = Outbound::open(Arc::clone(&session), sink, options, 8, clock);
        let requests: Requests<Packet> = Requests::new();
        let answer = requests.request(&outbound, ping("req_1"), Duration::from_secs(5)).await;
        match answer {
            Err(RequestError::Send(SendError::Invalid(refusal))) => {
                assert_eq!(refusal.rules, ["test.rule"]);
            }
            other => panic!("expected a local refusal, got {other:?}"),
        }
        assert!(!requests.is_pending(&RequestId::from("req_1")));
        assert_eq!(lock(&session).pending_requests().count(), 0, "the session forgot it");
        assert!(written.try_recv().is_err(), "no byte left");
    }

    #[tokio::test(start_paused = true)]
    async fn request_rule_a_timed_out_request_is_forgotten_here_and_by_the_session() {
        let (session, sink, mut written) = established();
        let clock = Arc::new(ManualClock::new(7));
        let options = WriterOptions::new(1 << 20);
        let (outbound, _writer) = Outbound::open(Arc::clone(&session), sink, options, 8, clock);
        let requests: Requests<Packet> = Requests::new();
        let answer = requests.request(&outbound, ping("req_2"), Duration::from_secs(3)).await;
        assert_eq!(answer, Err(RequestError::TimedOut(Duration::from_secs(3))));
        assert!(!requests.is_pending(&RequestId::from("req_2")));
        assert_eq!(lock(&session).pending_requests().count(), 0);
        match written.recv().await {
            Some(Frame::Text(text)) => {
                let sent = Packet::decode_str(&text).expect("a packet");
                assert_eq!(sent.time, Some(7), "stamped by the injected clock");
            }
            other => panic!("expected the ping, got {other:?}"),
        }
    }
}
