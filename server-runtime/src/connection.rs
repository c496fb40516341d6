//! The Connector side's half of a data-plane connection, run by the connection core
//! (`xagent-connection`): its [`Driver`] reads the generic stream of [`Frame`]s (axum's
//! WebSocket in production, in-memory channels in tests), applies the frame rules, decodes and
//! judges each packet and answers what it refuses; its writer applies `Session::on_sent` and
//! the outbound size rule. This module runs the packets the core accepted.

use std::future::Future;
use std::sync::{Arc, Mutex};

use futures_util::{Sink, Stream};
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use xagent_connection::{Driver, Ended, Flow, PacketHandler, WriterOptions, write_loop};
use xagent_protocol_types::{
    ConnectorChannelId, Packet, PacketBody, Payload, Pong, ProfileId, RequestId, Side, WireError,
};
use xagent_protocol_validate::{Accepted, ChannelOwner, Negotiated, Session};

use crate::ids;
use crate::state::{Outgoing, Shared};

pub use xagent_connection::{
    CLOSE_GOING_AWAY, CLOSE_INVALID_DATA, CLOSE_POLICY, CLOSE_TOO_BIG, Frame, FrameError,
};

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

fn detach(shared: &Arc<Shared>, socket: u64) {
    let now = shared.now();
    let (lost, last) = {
        let mut state = shared.state();
        let lost = state.detach_socket(socket);
        state.socket_stops.remove(&socket);
        let last = state.live_sockets.remove(&socket) && state.live_sockets.is_empty();
        if last {
            state.offline_since = Some(now);
            tracing::info!("last authenticated data plane closed; offline lease started");
        }
        (lost, last)
    };
    if last {
        // On a shared database the offline lease is the cluster's: it counts from the release.
        shared.release_data_plane();
    }
    if let Some(im) = &shared.im {
        im.on_routes_lost(&lost, now);
    }
}

pub(crate) async fn run<St, Si>(shared: Arc<Shared>, mut stream: St, sink: Si)
where
    St: Stream<Item = Result<Frame, FrameError>> + Send + Unpin + 'static,
    Si: Sink<Frame> + Send + Unpin + 'static,
{
    // Cancelled when this replica loses the data plane (another replica took it).
    let stop = tokio_util::sync::CancellationToken::new();
    let socket = {
        let mut state = shared.state();
        state.next_socket += 1;
        let socket = state.next_socket;
        state.socket_stops.insert(socket, stop.clone());
        socket
    };
    let detach_guard = Detach { shared: Arc::clone(&shared), socket };
    let owner_view = Arc::clone(&shared);
    let proto = shared.admission.current().session(Side::Connector).with_ownership(
        move |channel: &ConnectorChannelId| {
            let state = owner_view.state();
            match state.channels.get(channel) {
                Some(record) if Some(&record.connector_id) == state.connector_id.as_ref() => {
                    ChannelOwner::Owned
                }
                Some(_) => ChannelOwner::OtherConnector,
                None => ChannelOwner::Unknown,
            }
        },
    );
    let proto = Arc::new(Mutex::new(proto));
    let (tx, rx) = mpsc::channel(shared.config.write_queue.max(1));
    let writer = tokio::spawn(write_loop(
        sink,
        rx,
        Arc::clone(&proto),
        sent_metrics(WriterOptions::new(shared.config.max_packet_bytes)),
    ));
    let mut conn = Conn {
        shared: Arc::clone(&shared),
        socket,
        tx,
        proto: Arc::clone(&proto),
        tasks: TaskTracker::new(),
        in_flight: Arc::new(tokio::sync::Semaphore::new(
            shared.config.max_in_flight_requests.max(1),
        )),
        negotiated: None,
    };
    tracing::debug!(socket, "data plane connection opened");
    let driver = Driver::new(&proto, &shared.admission, shared.config.max_packet_bytes);
    let stopped = async {
        tokio::select! {
            () = shared.shutdown.cancelled() => {}
            () = stop.cancelled() => {}
        }
    };
    let ended = driver.run(&mut stream, &mut conn, stopped).await;
    let close = match ended {
        Ended::Close(code, reason) => Some((code, reason)),
        Ended::Stopped if !shared.shutdown.is_cancelled() => Some((
            crate::state::CLOSE_TRY_AGAIN_LATER,
            shared
                .cluster
                .as_ref()
                .and_then(|c| c.lost_because())
                .unwrap_or_else(|| "this replica no longer serves the data plane".to_owned()),
        )),
        Ended::Stopped => Some((CLOSE_GOING_AWAY, "the Connector is shutting down".to_owned())),
        Ended::Failed(error) => {
            tracing::debug!(socket, %error, "data plane read failed");
            None
        }
        Ended::PeerClosed(_) => None,
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

/// The writer counts every packet it writes, once (a withheld packet is not counted).
fn sent_metrics(mut options: WriterOptions) -> WriterOptions {
    options.tap = Some(Arc::new(|packet: &Packet, _: &str| crate::metrics::metrics().sent(packet)));
    options
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
        tracing::debug!(packet_type = request.type_str(), code = %error.code, "request failed");
        self.send(xagent_connection::error_ack(request, error)).await;
    }

    async fn dispatch(&mut self, packet: Packet, accepted: Accepted) {
        let span = crate::logging::packet_span(&packet);
        tracing::Instrument::instrument(self.dispatch_in_span(packet, accepted), span).await
    }

    /// [`Conn::dispatch`] inside the packet's span (the request handlers it spawns keep it).
    async fn dispatch_in_span(&mut self, packet: Packet, accepted: Accepted) {
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
                self.tasks.spawn(tracing::Instrument::in_current_span(async move {
                    conn.on_auth(packet).await;
                    drop(place);
                }));
            }
            (PacketBody::ToolInvoke(_), _) => {
                let conn = self.task_view();
                let place = Arc::clone(&self.in_flight).acquire_owned().await;
                // Boxed: the task's future moves a pointer, not the whole packet.
                let packet = Box::new(packet);
                let mut call = Box::pin(tracing::Instrument::in_current_span(async move {
                    conn.on_tool_invoke(packet).await;
                    drop(place);
                }));
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
        }
    }

    pub(crate) fn profiles(&self) -> Vec<ProfileId> {
        self.negotiated.as_ref().map(|n| n.profile_ids().to_vec()).unwrap_or_default()
    }
}

impl PacketHandler for Conn {
    async fn on_packet(&mut self, packet: Packet, accepted: Accepted) -> Flow {
        self.dispatch(packet, accepted).await;
        Flow::Continue
    }

    fn send(&mut self, packet: Packet) -> impl Future<Output = ()> + Send {
        Conn::send(self, packet)
    }

    fn fail_pending(&mut self, request_id: &RequestId, error: WireError) {
        // The Connector side waits on no request of its own on the data plane (a pushed
        // `chat.message` is redelivered by the outbox until a valid ack comes).
        tracing::debug!(%request_id, code = %error.code, "a refused answer from xAgent");
    }

    fn saw(&mut self, _text: &str, packet: Option<&Packet>) {
        if let Some(packet) = packet {
            crate::metrics::metrics().received(packet);
        }
    }

    async fn on_binary(&mut self) -> Flow {
        let error = WireError::invalid_packet(
            "binary frames are not part of the protocol; send each packet as one JSON text frame",
        );
        self.send(Packet::error(ids::packet_id(), error)).await;
        Flow::Continue
    }
}
