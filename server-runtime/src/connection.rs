//! The data-plane loop of one connection, written against a generic stream and sink of
//! [`Frame`]s so it runs over axum's WebSocket in production and over in-memory channels in
//! tests. Sequencing (hello first, channel open, ack pairing, error codes) is decided by
//! `protocol-validate`'s [`Session`]; this module runs what it accepts.

use std::future::Future;
use std::sync::{Arc, Mutex};

use futures_util::{Sink, SinkExt, Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use xagent_protocol_types::{
    ConnectorChannelId, ErrorCode, Packet, PacketBody, Payload, Pong, ProfileId, Side, WireError,
};
use crate::judge::Refusal;
use xagent_protocol_validate::{
    Accepted, ChannelOwner, Negotiated, Permission, RejectAction, Rejection, Session,
};

use crate::ids;
use crate::state::{Outgoing, Shared};

/// One WebSocket message, independent of the WebSocket library.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Frame {
    /// A text frame (one JSON packet).
    Text(String),
    /// A binary frame (always refused with `invalid_packet`).
    Binary(Vec<u8>),
    /// A WebSocket ping (answered by the WebSocket layer).
    Ping(Vec<u8>),
    /// A WebSocket pong.
    Pong(Vec<u8>),
    /// A close frame with an optional code and reason.
    Close(Option<(u16, String)>),
}

/// A failure reading a frame.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct FrameError {
    /// True when the frame exceeded the size limit (answered with close 1009).
    pub too_large: bool,
    /// True when a text frame was not valid UTF-8 (answered with close 1007).
    pub invalid_utf8: bool,
    /// What happened.
    pub message: String,
}

/// WebSocket close code: policy violation (unsupported protocol version).
pub const CLOSE_POLICY: u16 = 1008;
/// WebSocket close code: message too big.
pub const CLOSE_TOO_BIG: u16 = 1009;
/// WebSocket close code: going away (server shutdown).
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// WebSocket close code: invalid frame payload data (a text frame that is not UTF-8).
pub const CLOSE_INVALID_DATA: u16 = 1007;

pub(crate) struct Conn {
    pub(crate) shared: Arc<Shared>,
    pub(crate) socket: u64,
    pub(crate) tx: mpsc::Sender<Outgoing>,
    pub(crate) proto: Arc<Mutex<Session>>,
    pub(crate) tasks: TaskTracker,
    /// Places for request work running at once (M7): the reader waits for one, so a peer
    /// that floods requests without reading the answers stops being read.
    pub(crate) in_flight: Arc<tokio::sync::Semaphore>,
    /// What the hello negotiated, shared with the request tasks (a clone per task is one
    /// reference count, not a copy of the Profile lists).
    pub(crate) negotiated: Option<Arc<Negotiated>>,
    /// The rules judgement of received packets (one per connection: the Card's facts).
    pub(crate) judge: Arc<crate::judge::InboundJudge>,
}

/// Detaches a connection from the state when dropped: its routes are removed and, when it was
/// the last live socket, the offline lease starts. Held by the connection task, so this
/// happens however the task ends (closed, failed, panicked, aborted).
struct Detach {
    shared: Arc<Shared>,
    socket: u64,
}

impl Drop for Detach {
    fn drop(&mut self) {
        detach(&self.shared, self.socket);
    }
}

fn detach(shared: &Shared, socket: u64) {
    let now = shared.now();
    let lost: Vec<ConnectorChannelId> = {
        let mut state = shared.state();
        let lost = state.detach_socket(socket);
        if state.live_sockets.remove(&socket) && state.live_sockets.is_empty() {
            state.offline_since = Some(now);
            tracing::info!("last authenticated data plane closed; offline lease started");
        }
        lost
    };
    if let Some(im) = &shared.im {
        im.on_routes_lost(&lost, now);
    }
}

enum Flow {
    Continue,
    Close(u16, String),
}

pub(crate) async fn run<St, Si>(shared: Arc<Shared>, mut stream: St, sink: Si)
where
    St: Stream<Item = Result<Frame, FrameError>> + Send + Unpin + 'static,
    Si: Sink<Frame> + Send + Unpin + 'static,
{
    let socket = {
        let mut state = shared.state();
        state.next_socket += 1;
        state.next_socket
    };
    let detach_guard = Detach { shared: Arc::clone(&shared), socket };
    let owner_view = Arc::clone(&shared);
    let proto = Session::new(Side::Connector, &shared.def.card, shared.config.admission)
        .with_ownership(move |channel: &ConnectorChannelId| {
            let state = owner_view.state();
            match state.channels.get(channel) {
                Some(record) if Some(&record.connector_id) == state.connector_id.as_ref() => {
                    ChannelOwner::Owned
                }
                Some(_) => ChannelOwner::OtherConnector,
                None => ChannelOwner::Unknown,
            }
        });
    let proto = Arc::new(Mutex::new(proto));
    let (tx, rx) = mpsc::channel(shared.config.write_queue.max(1));
    let writer =
        tokio::spawn(write_loop(sink, rx, Arc::clone(&proto), shared.config.max_packet_bytes));
    let mut conn = Conn {
        shared: Arc::clone(&shared),
        socket,
        tx,
        proto,
        tasks: TaskTracker::new(),
        in_flight: Arc::new(tokio::sync::Semaphore::new(
            shared.config.max_in_flight_requests.max(1),
        )),
        negotiated: None,
        judge: Arc::new(crate::judge::InboundJudge::new(&shared.def.card, shared.config.admission)),
    };
    tracing::debug!(socket, "data plane connection opened");
    let close = loop {
        let frame = tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => break Some((CLOSE_GOING_AWAY, "the Connector is shutting down".to_owned())),
            frame = stream.next() => frame,
        };
        let flow = match frame {
            None => break None,
            Some(Err(error)) if error.too_large => {
                Flow::Close(CLOSE_TOO_BIG, "packet larger than the size limit".into())
            }
            Some(Err(error)) if error.invalid_utf8 => {
                Flow::Close(CLOSE_INVALID_DATA, "text frames must be UTF-8".into())
            }
            Some(Err(error)) => {
                tracing::debug!(socket, %error, "data plane read failed");
                break None;
            }
            Some(Ok(Frame::Text(text))) => conn.on_text(text).await,
            Some(Ok(Frame::Binary(_))) => {
                let error = WireError::invalid_packet(
                    "binary frames are not part of the protocol; send each packet as one JSON text frame",
                );
                conn.send(Packet::error(ids::packet_id(), error)).await;
                Flow::Continue
            }
            Some(Ok(Frame::Close(_))) => break None,
            Some(Ok(Frame::Ping(_) | Frame::Pong(_))) => Flow::Continue,
        };
        if let Flow::Close(code, reason) = flow {
            break Some((code, reason));
        }
    };
    // Finish in-flight work (acks) before closing.
    conn.tasks.close();
    let grace = shared.config.shutdown_grace;
    if tokio::time::timeout(grace, conn.tasks.wait()).await.is_err() {
        tracing::warn!(socket, "in-flight work did not finish within the shutdown grace period");
    }
    drop(detach_guard);
    if let Some((code, reason)) = close {
        let _ = conn.tx.send(Outgoing::Close(code, reason)).await;
    }
    drop(conn);
    let _ = writer.await;
    tracing::debug!(socket, "data plane connection closed");
}

/// Frames written before one flush: what is queued when the writer wakes goes out in one
/// write (one syscall for a burst of acks instead of one each), up to this many.
const MAX_FRAMES_PER_FLUSH: usize = 64;

async fn write_loop<Si>(
    mut sink: Si,
    mut rx: mpsc::Receiver<Outgoing>,
    proto: Arc<Mutex<Session>>,
    limit: usize,
) where
    Si: Sink<Frame> + Send + Unpin + 'static,
{
    // Senders of tracked packets fed since the last flush: told once the flush succeeded.
    let mut tracked: Vec<tokio::sync::oneshot::Sender<bool>> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        let mut fed = 0;
        let mut ok = true;
        while let Some(item) = next.take() {
            let (packet, done) = match item {
                Outgoing::Packet(packet) => (packet, None),
                Outgoing::Tracked(packet, done) => (packet, Some(done)),
                Outgoing::Close(code, reason) => {
                    let flushed = sink.flush().await.is_ok();
                    for done in tracked.drain(..) {
                        let _ = done.send(flushed);
                    }
                    let _ = sink.send(Frame::Close(Some((code, reason)))).await;
                    let _ = sink.close().await;
                    return;
                }
            };
            match encode_outgoing(&proto, &packet, limit) {
                Some(text) => {
                    if sink.feed(Frame::Text(text)).await.is_err() {
                        ok = false;
                        if let Some(done) = done {
                            let _ = done.send(false);
                        }
                        break;
                    }
                    tracked.extend(done);
                }
                None => {
                    if let Some(done) = done {
                        let _ = done.send(false);
                    }
                }
            }
            fed += 1;
            if fed < MAX_FRAMES_PER_FLUSH {
                next = rx.try_recv().ok();
            }
        }
        let flushed = ok && sink.flush().await.is_ok();
        for done in tracked.drain(..) {
            let _ = done.send(flushed);
        }
        if !flushed {
            break;
        }
    }
    let _ = sink.close().await;
}

/// The text of an outgoing packet, or `None` when it must not be sent: the sequencing
/// `Session` refuses it (the channel closed meanwhile, or it breaks sequencing), it cannot be
/// encoded, or it is over the size limit (see [`within_limit`]).
fn encode_outgoing(proto: &Mutex<Session>, packet: &Packet, limit: usize) -> Option<String> {
    let verdict = proto.lock().unwrap_or_else(std::sync::PoisonError::into_inner).on_sent(packet);
    if let Err(rejection) = verdict {
        tracing::debug!(packet_type = packet.type_str(), code = %rejection.error.code, "outgoing packet withheld");
        return None;
    }
    let text = match packet.to_json() {
        Ok(text) => text,
        Err(error) => {
            tracing::error!(%error, "could not encode an outgoing packet");
            return None;
        }
    };
    within_limit(packet, text, limit)
}

/// The ack of `request` carrying `error` (the ack type from the one request-to-ack table of
/// `protocol-types`; `error` for a packet that has none).
pub(crate) fn error_ack(request: &Packet, error: WireError) -> Packet {
    tracing::debug!(packet_type = request.type_str(), code = %error.code, "request failed");
    let body = PacketBody::empty_ack_for(&request.body).unwrap_or(PacketBody::Error(None));
    Packet::new(ids::packet_id(), body).with_error(error).answering(request)
}

/// The last line of the outbound size rule: nothing leaves that the peer's packet limit would
/// refuse (a peer drops an oversized packet and reconnects, cutting every channel on the socket).
/// An oversized ack (a Tool result, say) is replaced by the same ack carrying
/// `payload_too_large`, so the request is still answered; any other oversized packet is withheld.
fn within_limit(packet: &Packet, text: String, limit: usize) -> Option<String> {
    if text.len() <= limit {
        return Some(text);
    }
    let packet_type = packet.type_str();
    tracing::warn!(packet_type, bytes = text.len(), limit, "outgoing packet over the size limit");
    let body = PacketBody::empty_ack(packet_type)?;
    let mut answer = Packet::new(ids::packet_id(), body).with_error(WireError::new(
        ErrorCode::PayloadTooLarge,
        format!(
            "the answer is {} bytes as a packet and the data plane takes at most {limit}: ask for less (a narrower query, or a file through the Transfer Plane)",
            text.len()
        ),
    ));
    answer.request_id = packet.request_id.clone();
    answer.reply_to = packet.reply_to.clone();
    answer.connector_channel_id = packet.connector_channel_id.clone();
    answer.time = packet.time;
    answer.to_json().ok().filter(|answer| answer.len() <= limit)
}

impl Conn {
    /// Queues a packet for the socket's writer, waiting for room when the queue is full.
    /// Queued at once when there is room; only a packet that has to wait is boxed, so the
    /// future every request task awaits here stays small.
    pub(crate) fn send(&self, packet: Packet) -> impl Future<Output = ()> + Send + '_ {
        let packet = packet.time(self.shared.now());
        let waiting = match self.tx.try_reserve() {
            Ok(place) => {
                place.send(Outgoing::Packet(packet));
                None
            }
            Err(mpsc::error::TrySendError::Full(())) => Some(Box::new(packet)),
            Err(mpsc::error::TrySendError::Closed(())) => None,
        };
        async move {
            if let Some(packet) = waiting
                && let Ok(place) = self.tx.reserve().await
            {
                place.send(Outgoing::Packet(*packet));
            }
        }
    }

    pub(crate) async fn reply<P: Payload>(&self, request: &Packet, payload: P) {
        self.send(Packet::with_payload(ids::packet_id(), payload).answering(request)).await;
    }

    pub(crate) async fn reply_error(&self, request: &Packet, error: WireError) {
        self.send(error_ack(request, error)).await;
    }

    async fn on_text(&mut self, text: String) -> Flow {
        if text.len() > self.shared.config.max_packet_bytes {
            return Flow::Close(CLOSE_TOO_BIG, "packet larger than the size limit".into());
        }
        let packet = match Packet::decode_str(&text) {
            Ok(packet) => packet,
            Err(error) => {
                let rejection = Rejection::from_decode(&error);
                self.send(rejection.error_packet_for(ids::packet_id(), &error.ids)).await;
                return Flow::Continue;
            }
        };
        // One hold of the sequencing lock per packet: the Profile check, then the verdict.
        let verdict = {
            let mut proto = self.proto.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Profile packets outside what was negotiated (or what the channel enables) are
            // dropped without an answer; the catalog decides.
            if let Some(negotiated) = &self.negotiated {
                let channel =
                    packet.connector_channel_id.as_ref().and_then(|c| proto.channel_profiles(c));
                match negotiated.decide(packet.type_str(), Side::Xagent, channel) {
                    Permission::ProfileNotNegotiated { profile }
                    | Permission::ProfileNotOnChannel { profile } => {
                        tracing::debug!(
                            packet_type = packet.type_str(),
                            profile,
                            "dropped a packet of a Profile not in effect"
                        );
                        return Flow::Continue;
                    }
                    _ => {}
                }
            }
            proto.on_received(&packet)
        };
        match verdict {
            Err(rejection) => {
                tracing::debug!(packet_type = packet.type_str(), code = %rejection.error.code, "packet refused");
                match rejection.action {
                    RejectAction::Ignore => Flow::Continue,
                    RejectAction::ReplyAndClose => {
                        self.send(rejection.error_packet(ids::packet_id(), &packet)).await;
                        Flow::Close(CLOSE_POLICY, rejection.error.message().to_owned())
                    }
                    _ => {
                        self.send(rejection.error_packet(ids::packet_id(), &packet)).await;
                        Flow::Continue
                    }
                }
            }
            Ok(accepted) => {
                // The rules every judge applies (`check packet --sender xagent`, the C ABI). The
                // hello was judged by the session's hello rules, which answer it.
                let hello = matches!(packet.body, PacketBody::ConnectorHello(_));
                if !hello && let Err(report) = self.judge.judge_decoded(&packet, &text) {
                    match crate::judge::refusal(&packet, &report) {
                        Some(Refusal::Send(answer)) => self.send(answer).await,
                        Some(Refusal::ErrorAck(error)) => self.reply_error(&packet, error).await,
                        None => {}
                    }
                    return Flow::Continue;
                }
                drop(text);
                self.dispatch(packet, accepted).await;
                Flow::Continue
            }
        }
    }

    async fn dispatch(&mut self, packet: Packet, accepted: Accepted) {
        match (&packet.body, accepted) {
            (
                PacketBody::ConnectorHello(_),
                Accepted::Hello { negotiated, requested_connector_id, .. },
            ) => {
                self.on_hello(&packet, negotiated, requested_connector_id).await;
            }
            (PacketBody::ChannelOpen(_), _) => self.on_channel_open(&packet).await,
            (PacketBody::ChannelClose(_), _) => self.on_channel_close(&packet).await,
            (PacketBody::DescriptorGet(_), _) => self.on_descriptor_get(&packet).await,
            (PacketBody::Ping(_), _) => self.reply(&packet, Pong::default()).await,
            (
                PacketBody::AuthStart(_)
                | PacketBody::AuthStatus(_)
                | PacketBody::AuthCancel(_)
                | PacketBody::AuthLogout(_),
                _,
            ) => {
                let conn = self.task_view();
                let place = Arc::clone(&self.in_flight).acquire_owned().await;
                self.tasks.spawn(async move {
                    conn.on_auth(packet).await;
                    drop(place);
                });
            }
            (PacketBody::ToolInvoke(_), _) => {
                let conn = self.task_view();
                let place = Arc::clone(&self.in_flight).acquire_owned().await;
                // Boxed: the task's future moves a pointer, not the whole packet.
                let packet = Box::new(packet);
                let mut call = Box::pin(async move {
                    conn.on_tool_invoke(packet).await;
                    drop(place);
                });
                // Polled once here first: a call that needs no waiting (a read-only Tool whose
                // handler answers at once, a refused or replayed call) is answered on the
                // reader without a task spawned and handed to another worker. Only a call that
                // has to wait becomes a task; it polls again with its own waker, as the
                // `Future` contract allows. Author code runs inside `contain`, so a panic
                // there is caught before it reaches the reader.
                let first = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(call.as_mut().poll(cx).is_ready())
                });
                if !first.await {
                    self.tasks.spawn(call);
                }
            }
            (PacketBody::ChatMessage(_), _)
            | (PacketBody::ChatMessageAck(_), _)
            | (PacketBody::ChatMessageDelta(_), _)
            | (PacketBody::ChatActivity(_), _) => {
                if let Some(im) = &self.shared.im
                    && let Some(reply) = im.on_packet(&self.shared, &packet).await
                {
                    self.send(reply).await;
                }
            }
            (PacketBody::Error(_), _) => {
                let code = packet.error.as_ref().map(|e| e.code.to_string()).unwrap_or_default();
                tracing::info!(%code, "peer reported an error");
            }
            _ => {}
        }
    }

    /// A cheap copy for spawned request handlers.
    fn task_view(&self) -> Conn {
        Conn {
            shared: Arc::clone(&self.shared),
            socket: self.socket,
            tx: self.tx.clone(),
            proto: Arc::clone(&self.proto),
            tasks: self.tasks.clone(),
            in_flight: Arc::clone(&self.in_flight),
            negotiated: self.negotiated.clone(),
            judge: Arc::clone(&self.judge),
        }
    }

    pub(crate) fn profiles(&self) -> Vec<ProfileId> {
        self.negotiated.as_ref().map(|n| n.profile_ids().to_vec()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::{ChatMessage, RequestId, ToolInvokeAck};

    fn big_ack() -> Packet {
        let result = serde_json::json!({ "rows": "x".repeat(4096) });
        let mut ack = Packet::with_payload("pkt_ack", ToolInvokeAck::new("t_read", result))
            .channel(ConnectorChannelId::from("cch_1"));
        ack.request_id = Some(RequestId::from("req_1"));
        ack.reply_to = Some("pkt_req".into());
        ack
    }

    #[test]
    fn outbound_size_rule_an_oversized_ack_is_answered_with_payload_too_large() {
        let ack = big_ack();
        let text = ack.to_json().expect("encodes");
        let sent = within_limit(&ack, text, 1024).expect("the request is still answered");
        assert!(sent.len() <= 1024);
        let answer = Packet::decode_str(&sent).expect("a packet");
        assert_eq!(answer.type_str(), "tool.invoke.ack");
        assert_eq!(answer.error.as_ref().map(|e| e.code.clone()), Some(ErrorCode::PayloadTooLarge));
        assert_eq!(answer.request_id, ack.request_id, "same request_id");
        assert_eq!(answer.reply_to, ack.reply_to, "same reply_to");
        assert_eq!(answer.connector_channel_id, ack.connector_channel_id);
        assert!(!sent.contains("xxxx"), "none of the oversized result leaves");
    }

    #[test]
    fn outbound_size_rule_an_oversized_push_is_withheld_and_a_fitting_packet_passes() {
        let message = Packet::with_payload("pkt_m", ChatMessage::text("msg_1", "y".repeat(4096)))
            .channel(ConnectorChannelId::from("cch_1"));
        let text = message.to_json().expect("encodes");
        assert!(within_limit(&message, text.clone(), 1024).is_none());
        assert_eq!(within_limit(&message, text.clone(), text.len()), Some(text));
    }
}
