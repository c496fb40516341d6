//! The data-plane loop of one connection, written against a generic stream and sink of
//! [`Frame`]s so it runs over axum's WebSocket in production and over in-memory channels in
//! tests. Sequencing (hello first, channel open, ack pairing, error codes) is decided by
//! `protocol-validate`'s [`Session`]; this module runs what it accepts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::{FutureExt, Sink, SinkExt, Stream, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::task::TaskTracker;
use xagent_profile_im::Fingerprint;
use xagent_protocol_types::{
    AuthCancelAck, AuthProgress, AuthSessionId, AuthStartAck, AuthStatus, AuthStatusAck,
    CancelStatus, ChannelCloseAck, ChannelOpenAck, ConnectionStatus, ConnectorChannelId,
    ConnectorHelloAck, DescriptorGetAck, ErrorCode, FlowId, Packet, PacketBody, Payload, Pong,
    ProfileId, Side, ToolInvokeAck, WireError,
};
use xagent_protocol_validate::{
    Accepted, ChannelOwner, Negotiated, Permission, RejectAction, Rejection, Session,
};

use crate::author::{AuthContext, AuthStep, AuthValues, ChannelContext, ToolContext};
use crate::ids;
use crate::runtime::{AuthSession, Outgoing, Route, Shared};
use crate::storage::{ChannelRecord, ToolCallRecord};

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
    /// What happened.
    pub message: String,
}

/// WebSocket close code: policy violation (unsupported protocol version).
pub const CLOSE_POLICY: u16 = 1008;
/// WebSocket close code: message too big.
pub const CLOSE_TOO_BIG: u16 = 1009;
/// WebSocket close code: going away (server shutdown).
pub const CLOSE_GOING_AWAY: u16 = 1001;

type ToolOutcome = Result<Value, (ErrorCode, String)>;

/// Calls of a Tool still running, so a repeat waits for the first result.
pub(crate) type InflightTools =
    Mutex<HashMap<(ConnectorChannelId, String), (String, watch::Receiver<Option<ToolOutcome>>)>>;

pub(crate) struct Conn {
    pub(crate) shared: Arc<Shared>,
    pub(crate) socket: u64,
    pub(crate) tx: mpsc::Sender<Outgoing>,
    pub(crate) proto: Arc<Mutex<Session>>,
    tasks: TaskTracker,
    negotiated: Option<Negotiated>,
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
    let writer = tokio::spawn(write_loop(sink, rx, Arc::clone(&proto)));
    let mut conn = Conn {
        shared: Arc::clone(&shared),
        socket,
        tx,
        proto,
        tasks: TaskTracker::new(),
        negotiated: None,
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
    conn.detach();
    if let Some((code, reason)) = close {
        let _ = conn.tx.send(Outgoing::Close(code, reason)).await;
    }
    drop(conn);
    let _ = writer.await;
    tracing::debug!(socket, "data plane connection closed");
}

async fn write_loop<Si>(mut sink: Si, mut rx: mpsc::Receiver<Outgoing>, proto: Arc<Mutex<Session>>)
where
    Si: Sink<Frame> + Send + Unpin + 'static,
{
    while let Some(item) = rx.recv().await {
        let (packet, done) = match item {
            Outgoing::Packet(packet) => (packet, None),
            Outgoing::Tracked(packet, done) => (packet, Some(done)),
            Outgoing::Close(code, reason) => {
                let _ = sink.send(Frame::Close(Some((code, reason)))).await;
                let _ = sink.close().await;
                return;
            }
        };
        let verdict =
            proto.lock().unwrap_or_else(std::sync::PoisonError::into_inner).on_sent(&packet);
        if let Err(rejection) = verdict {
            // Not sent: the channel closed meanwhile or the packet breaks sequencing.
            tracing::debug!(packet_type = packet.type_str(), code = %rejection.error.code, "outgoing packet withheld");
            if let Some(done) = done {
                let _ = done.send(false);
            }
            continue;
        }
        let text = match packet.to_json() {
            Ok(text) => text,
            Err(error) => {
                tracing::error!(%error, "could not encode an outgoing packet");
                continue;
            }
        };
        let ok = sink.send(Frame::Text(text)).await.is_ok();
        if let Some(done) = done {
            let _ = done.send(ok);
        }
        if !ok {
            break;
        }
    }
    let _ = sink.close().await;
}

/// The ack type answering a request type, empty (for error acks).
fn empty_ack(request: &PacketBody) -> PacketBody {
    match request {
        PacketBody::ConnectorHello(_) => PacketBody::ConnectorHelloAck(None),
        PacketBody::ChannelOpen(_) => PacketBody::ChannelOpenAck(None),
        PacketBody::ChannelClose(_) => PacketBody::ChannelCloseAck(None),
        PacketBody::AuthStart(_) => PacketBody::AuthStartAck(None),
        PacketBody::AuthStatus(_) => PacketBody::AuthStatusAck(None),
        PacketBody::AuthCancel(_) => PacketBody::AuthCancelAck(None),
        PacketBody::AuthLogout(_) => PacketBody::AuthLogoutAck(None),
        PacketBody::DescriptorGet(_) => PacketBody::DescriptorGetAck(None),
        PacketBody::ToolInvoke(_) => PacketBody::ToolInvokeAck(None),
        _ => PacketBody::Error(None),
    }
}

impl Conn {
    pub(crate) async fn send(&self, packet: Packet) {
        let packet = packet.time(self.shared.now());
        let _ = self.tx.send(Outgoing::Packet(packet)).await;
    }

    async fn reply<P: Payload>(&self, request: &Packet, payload: P) {
        self.send(Packet::with_payload(ids::packet_id(), payload).answering(request)).await;
    }

    async fn reply_error(&self, request: &Packet, error: WireError) {
        tracing::debug!(packet_type = request.type_str(), code = %error.code, "request failed");
        let ack = Packet::new(ids::packet_id(), empty_ack(&request.body))
            .with_error(error)
            .answering(request);
        self.send(ack).await;
    }

    fn detach(&self) {
        let now = self.shared.now();
        let lost: Vec<ConnectorChannelId> = {
            let mut state = self.shared.state();
            let lost = state
                .routes
                .iter()
                .filter(|(_, route)| route.socket == self.socket)
                .map(|(id, _)| id.clone())
                .collect();
            state.routes.retain(|_, route| route.socket != self.socket);
            if state.live_sockets.remove(&self.socket) && state.live_sockets.is_empty() {
                state.offline_since = Some(now);
                tracing::info!("last authenticated data plane closed; offline lease started");
            }
            lost
        };
        if let Some(im) = &self.shared.im {
            im.on_routes_lost(&lost, now);
        }
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
        drop(text);
        // Profile packets outside what was negotiated (or what the channel enables) are
        // dropped without an answer; the catalog decides.
        if let Some(negotiated) = &self.negotiated {
            let channel_profiles = packet.connector_channel_id.as_ref().and_then(|c| {
                self.proto
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .channel(c)
                    .map(|open| open.profiles.clone())
            });
            match negotiated.decide(packet.type_str(), Side::Xagent, channel_profiles.as_ref()) {
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
        let verdict = self
            .proto
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .on_received(&packet);
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
                self.tasks.spawn(async move { conn.on_auth(packet).await });
            }
            (PacketBody::ToolInvoke(_), _) => {
                let conn = self.task_view();
                self.tasks.spawn(async move { conn.on_tool_invoke(packet).await });
            }
            (PacketBody::ChatMessage(_), _)
            | (PacketBody::ChatMessageAck(_), _)
            | (PacketBody::ChatMessageDelta(_), _)
            | (PacketBody::ChatActivity(_), _) => {
                if let Some(im) = &self.shared.im {
                    im.on_packet(self, &packet).await;
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
            negotiated: self.negotiated.clone(),
        }
    }

    fn profiles(&self) -> Vec<ProfileId> {
        self.negotiated.as_ref().map(|n| n.profile_ids().to_vec()).unwrap_or_default()
    }

    async fn on_hello(
        &mut self,
        packet: &Packet,
        negotiated: Negotiated,
        requested: Option<xagent_protocol_types::ConnectorId>,
    ) {
        if negotiated.profile_ids().is_empty() {
            let error = WireError::invalid_packet(format!(
                "supported_profiles has no Profile in common with the Card ({}); list at least one",
                self.shared
                    .def
                    .card
                    .supports
                    .profiles
                    .iter()
                    .map(ProfileId::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            self.send(Packet::error(ids::packet_id(), error).answering(packet)).await;
            return;
        }
        let card_id = self.shared.def.card.connector_card_id.clone();
        let result = {
            let mut state = self.shared.state();
            let (id, minted) = match &state.connector_id {
                Some(id) => (id.clone(), false),
                None => (ids::connector_id(card_id.as_str()), true),
            };
            if minted {
                state.connector_id = Some(id.clone());
            }
            state.live_sockets.insert(self.socket);
            state.offline_since = None;
            (id, minted)
        };
        let (connector_id, minted) = result;
        if minted && let Err(error) = self.shared.storage.save_connector_id(Some(&connector_id)) {
            tracing::error!(%error, "could not persist the connector_id");
        }
        if requested.as_ref().is_some_and(|r| r != &connector_id) {
            tracing::info!(%connector_id, "hello asked for an unknown or expired connector_id; issued the current one");
        }
        tracing::info!(%connector_id, profiles = ?negotiated.profile_ids(), "hello accepted");
        self.negotiated = Some(negotiated);
        self.reply(packet, ConnectorHelloAck::new(card_id, connector_id)).await;
    }

    async fn on_channel_open(&mut self, packet: &Packet) {
        let requested = packet.connector_channel_id.clone().filter(|c| !c.is_empty());
        let now = self.shared.now();
        let profiles = self.profiles();
        let opened = 'open: {
            let mut state = self.shared.state();
            let current = state.connector_id.clone();
            let known = requested
                .as_ref()
                .and_then(|id| state.channels.get(id))
                .filter(|r| Some(&r.connector_id) == current.as_ref());
            let (record, created) = match (known, current) {
                (Some(record), _) => (record.clone(), false),
                (None, Some(connector_id)) => {
                    let record = ChannelRecord {
                        id: ids::channel_id(),
                        connector_id,
                        status: ConnectionStatus::Created,
                        binding: None,
                        tool_overrides: Default::default(),
                        created_at: now,
                    };
                    state.channels.insert(record.id.clone(), record.clone());
                    (record, true)
                }
                (None, None) => break 'open None,
            };
            state.routes.insert(
                record.id.clone(),
                Route { socket: self.socket, tx: self.tx.clone(), profiles: profiles.clone() },
            );
            Some((record, created))
        };
        let Some((record, created)) = opened else {
            let error = WireError::hello_required(
                "the runtime instance expired; send connector.hello again",
            );
            return self.reply_error(packet, error).await;
        };
        if created && let Err(error) = self.shared.save_channel(&record) {
            tracing::error!(%error, "could not persist a new channel");
        }
        let channel = record.id.clone();
        tracing::info!(%channel, created, "channel opened");
        let descriptor = self.shared.descriptor_for(&record, &profiles);
        let ack = Packet::with_payload(
            ids::packet_id(),
            ChannelOpenAck::new(channel.clone(), descriptor),
        )
        .channel(channel.clone())
        .answering(packet);
        self.send(ack).await;
        if let Some(im) = &self.shared.im {
            im.on_channel_open(&self.shared, &channel).await;
        }
    }

    async fn on_channel_close(&mut self, packet: &Packet) {
        if let Some(channel) = &packet.connector_channel_id {
            let mut state = self.shared.state();
            if state.routes.get(channel).is_some_and(|r| r.socket == self.socket) {
                state.routes.remove(channel);
            }
            drop(state);
            if let Some(im) = &self.shared.im {
                im.on_routes_lost(std::slice::from_ref(channel), self.shared.now());
            }
            tracing::info!(%channel, "channel route closed");
        }
        self.reply(packet, ChannelCloseAck::default()).await;
    }

    fn record(&self, packet: &Packet) -> Result<ChannelRecord, WireError> {
        let channel = packet.connector_channel_id.as_ref().ok_or_else(|| {
            WireError::connector_channel_id_required("set the envelope connector_channel_id")
        })?;
        let state = self.shared.state();
        let record = state.channels.get(channel).ok_or_else(|| {
            WireError::connection_not_found("the channel does not exist; open a new one")
        })?;
        if Some(&record.connector_id) != state.connector_id.as_ref() {
            return Err(WireError::connector_channel_connector_mismatch(
                "the channel belongs to another runtime instance",
            ));
        }
        Ok(record.clone())
    }

    async fn on_descriptor_get(&self, packet: &Packet) {
        match self.record(packet) {
            Ok(record) => {
                let descriptor = self.shared.descriptor_for(&record, &self.profiles());
                self.reply(packet, DescriptorGetAck::new(descriptor)).await;
            }
            Err(error) => self.reply_error(packet, error).await,
        }
    }

    // ---------------------------------------------------------------- auth

    async fn on_auth(&self, packet: Packet) {
        let record = match self.record(&packet) {
            Ok(record) => record,
            Err(error) => return self.reply_error(&packet, error).await,
        };
        match &packet.body {
            PacketBody::AuthStart(start) => self.on_auth_start(&packet, record, start).await,
            PacketBody::AuthStatus(status) => {
                self.on_auth_status(
                    &packet,
                    record,
                    &status.auth_session_id,
                    status.refresh == Some(true),
                )
                .await;
            }
            PacketBody::AuthCancel(cancel) => {
                self.on_auth_cancel(&packet, record, &cancel.auth_session_id).await
            }
            PacketBody::AuthLogout(_) => self.on_auth_logout(&packet, record).await,
            _ => {}
        }
    }

    async fn on_auth_start(
        &self,
        packet: &Packet,
        record: ChannelRecord,
        start: &xagent_protocol_types::AuthStart,
    ) {
        let Some(flow) = self.shared.def.card.auth_flow(start.flow_id.as_str()).cloned() else {
            let error = WireError::invalid_packet(format!(
                "flow_id {:?} is not declared in the Card's auth_flows",
                start.flow_id.as_str()
            ));
            return self.reply_error(packet, error).await;
        };
        let values = AuthValues::from_input(start.input.as_ref());
        if let Some(missing) = flow.fields.iter().find(|f| f.is_required() && !values.has(&f.name))
        {
            let error = WireError::new(
                ErrorCode::InvalidArguments,
                format!("the form field {:?} is required", missing.name),
            );
            return self.reply_error(packet, error).await;
        }
        let auth_session_id = ids::auth_session_id();
        {
            let mut state = self.shared.state();
            state.auth_sessions.insert(
                auth_session_id.clone(),
                AuthSession {
                    channel: record.id.clone(),
                    flow_id: flow.id.clone(),
                    status: AuthStatus::Pending,
                    created_at: self.shared.now(),
                },
            );
            if let Some(r) = state.channels.get_mut(&record.id)
                && r.binding.is_none()
            {
                r.status = ConnectionStatus::Authenticating;
            }
        }
        tracing::info!(channel = %record.id, flow_id = %flow.id, "auth started");
        let ctx = AuthContext {
            channel: record.id.clone(),
            flow_id: flow.id.clone(),
            auth_session_id: auth_session_id.clone(),
            handle: self.shared.handle(),
        };
        let step = self.shared.def.auth.start(ctx, values).await;
        match self.apply_step(&record.id, &flow.id, &auth_session_id, step) {
            Ok(progress) => self.reply(packet, AuthStartAck(progress)).await,
            Err(error) => self.reply_error(packet, error).await,
        }
    }

    /// Applies an auth step to the session and channel; returns the progress to report.
    fn apply_step(
        &self,
        channel: &ConnectorChannelId,
        flow_id: &FlowId,
        auth_session_id: &AuthSessionId,
        step: Result<AuthStep, crate::author::AuthError>,
    ) -> Result<AuthProgress, WireError> {
        let (status, prompt, message) = match step {
            Err(error) => {
                let mut state = self.shared.state();
                state.auth_sessions.remove(auth_session_id);
                revert_authenticating(&mut state, channel);
                return Err(WireError::new(error.code, error.message));
            }
            Ok(AuthStep::Pending(p)) => (AuthStatus::Pending, Some(p), None),
            Ok(AuthStep::Scanned(p)) => (AuthStatus::Scanned, Some(p), None),
            Ok(AuthStep::QrRefreshRequired(p)) => (AuthStatus::QrRefreshRequired, Some(p), None),
            Ok(AuthStep::Expired) => {
                (AuthStatus::Expired, None, Some("the sign-in expired; start again".to_owned()))
            }
            Ok(AuthStep::Failed(message)) => (AuthStatus::Failed, None, Some(message)),
            Ok(AuthStep::Authenticated(binding)) => {
                let record = {
                    let mut state = self.shared.state();
                    if let Some(session) = state.auth_sessions.get_mut(auth_session_id) {
                        session.status = AuthStatus::Authenticated;
                    }
                    let record = state.channels.get_mut(channel).ok_or_else(|| {
                        WireError::connection_not_found(
                            "the channel was unregistered during sign-in",
                        )
                    })?;
                    record.binding = Some(binding);
                    record.status = ConnectionStatus::Connected;
                    record.clone()
                };
                self.shared.save_channel(&record).map_err(|e| {
                    tracing::error!(error = %e, "could not persist a binding");
                    WireError::new(
                        ErrorCode::InternalError,
                        "could not store the sign-in; try again",
                    )
                })?;
                tracing::info!(%channel, "channel authenticated");
                let descriptor = self.shared.descriptor_for(&record, &self.profiles());
                return Ok(AuthProgress::new(AuthStatus::Authenticated)
                    .for_session(channel.clone(), flow_id.clone(), auth_session_id.clone())
                    .with_descriptor(descriptor));
            }
        };
        {
            let mut state = self.shared.state();
            if let Some(session) = state.auth_sessions.get_mut(auth_session_id) {
                session.status = status.clone();
            }
            if status.is_final() {
                revert_authenticating(&mut state, channel);
            }
        }
        let mut progress = AuthProgress::new(status).for_session(
            channel.clone(),
            flow_id.clone(),
            auth_session_id.clone(),
        );
        if let Some(prompt) = prompt {
            progress.qr_code_text = prompt.qr_code_text;
            progress.qr_code_image = prompt.qr_code_image;
            progress.expires_at = prompt.expires_at;
            progress.poll_interval_millis = prompt.poll_interval_millis;
            progress.message = prompt.message;
        }
        if message.is_some() {
            progress.message = message;
        }
        Ok(progress)
    }

    fn session(&self, channel: &ConnectorChannelId, id: &AuthSessionId) -> Option<AuthSession> {
        self.shared.state().auth_sessions.get(id).filter(|s| &s.channel == channel).cloned()
    }

    async fn on_auth_status(
        &self,
        packet: &Packet,
        record: ChannelRecord,
        auth_session_id: &AuthSessionId,
        refresh: bool,
    ) {
        let Some(session) = self.session(&record.id, auth_session_id) else {
            let error = WireError::auth_session_not_found(
                "no such auth session on this channel; start a new one",
            );
            return self.reply_error(packet, error).await;
        };
        if session.status.is_final() {
            let mut progress = AuthProgress::new(session.status.clone()).for_session(
                record.id.clone(),
                session.flow_id.clone(),
                auth_session_id.clone(),
            );
            if session.status == AuthStatus::Authenticated {
                progress =
                    progress.with_descriptor(self.shared.descriptor_for(&record, &self.profiles()));
            }
            return self.reply(packet, AuthStatusAck(progress)).await;
        }
        let ctx = AuthContext {
            channel: record.id.clone(),
            flow_id: session.flow_id.clone(),
            auth_session_id: auth_session_id.clone(),
            handle: self.shared.handle(),
        };
        let step = self.shared.def.auth.status(ctx, refresh).await;
        match self.apply_step(&record.id, &session.flow_id, auth_session_id, step) {
            Ok(progress) => self.reply(packet, AuthStatusAck(progress)).await,
            Err(error) => self.reply_error(packet, error).await,
        }
    }

    async fn on_auth_cancel(
        &self,
        packet: &Packet,
        record: ChannelRecord,
        auth_session_id: &AuthSessionId,
    ) {
        let mut ack = match self.session(&record.id, auth_session_id) {
            None => AuthCancelAck::new(CancelStatus::NotFound),
            Some(session) if session.status == AuthStatus::Authenticated => {
                let mut ack = AuthCancelAck::new(CancelStatus::Ignored);
                ack.auth_status = Some(AuthStatus::Authenticated);
                ack.connection_descriptor =
                    Some(self.shared.descriptor_for(&record, &self.profiles()));
                ack.message = Some("already authenticated".into());
                ack
            }
            Some(session) => {
                let ctx = AuthContext {
                    channel: record.id.clone(),
                    flow_id: session.flow_id,
                    auth_session_id: auth_session_id.clone(),
                    handle: self.shared.handle(),
                };
                self.shared.def.auth.cancel(ctx).await;
                {
                    let mut state = self.shared.state();
                    state.auth_sessions.remove(auth_session_id);
                    revert_authenticating(&mut state, &record.id);
                }
                let mut ack = AuthCancelAck::new(CancelStatus::Canceled);
                ack.auth_status = Some(if record.binding.is_some() {
                    AuthStatus::Authenticated
                } else {
                    AuthStatus::Unauthenticated
                });
                ack.message = Some("authentication canceled".into());
                ack
            }
        };
        ack.connector_channel_id = Some(record.id.clone());
        ack.auth_session_id = Some(auth_session_id.clone());
        self.reply(packet, ack).await;
    }

    async fn on_auth_logout(&self, packet: &Packet, record: ChannelRecord) {
        if let Some(binding) = record.binding.clone() {
            let ctx = ChannelContext {
                channel: record.id.clone(),
                binding,
                handle: self.shared.handle(),
            };
            if let Err(error) = self.shared.def.auth.logout(ctx).await {
                return self.reply_error(packet, WireError::new(error.code, error.message)).await;
            }
        }
        // Sign-in attempts still pending on the channel end with it: the author cancels them.
        let pending: Vec<(AuthSessionId, AuthSession)> = {
            let mut state = self.shared.state();
            let ids: Vec<AuthSessionId> = state
                .auth_sessions
                .iter()
                .filter(|(_, s)| s.channel == record.id)
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| state.auth_sessions.remove(&id).map(|s| (id, s)))
                .filter(|(_, s)| !s.status.is_final())
                .collect()
        };
        for (auth_session_id, session) in pending {
            let ctx = AuthContext {
                channel: record.id.clone(),
                flow_id: session.flow_id,
                auth_session_id,
                handle: self.shared.handle(),
            };
            self.shared.def.auth.cancel(ctx).await;
        }
        let updated = {
            let mut state = self.shared.state();
            let stops = state.consumers.release_channel(&record.id);
            state.auth_sessions.retain(|_, s| s.channel != record.id);
            state.channels.get_mut(&record.id).map(|r| {
                r.binding = None;
                r.status = ConnectionStatus::Created;
                r.tool_overrides.clear();
                (r.clone(), stops)
            })
        };
        let Some((record, stops)) = updated else {
            let error = WireError::connection_not_found("the channel was unregistered");
            return self.reply_error(packet, error).await;
        };
        for stop in stops {
            stop();
        }
        if let Err(error) = self.shared.save_channel(&record) {
            tracing::error!(%error, "could not persist a sign-out");
        }
        tracing::info!(channel = %record.id, "channel signed out");
        let descriptor = self.shared.descriptor_for(&record, &self.profiles());
        self.reply(packet, xagent_protocol_types::AuthLogoutAck::new(Some(descriptor))).await;
    }

    // ---------------------------------------------------------------- tools

    async fn on_tool_invoke(&self, packet: Packet) {
        let Some(invoke) = packet.payload::<xagent_protocol_types::ToolInvoke>() else { return };
        let Some(tool) = self.shared.def.tools.get(&invoke.tool_id) else {
            let error = WireError::new(
                ErrorCode::ToolNotFound,
                format!("tool {:?} is not declared in the Connector Card", invoke.tool_id.as_str()),
            );
            return self.reply_error(&packet, error).await;
        };
        let record = match self.record(&packet) {
            Ok(record) => record,
            Err(error) => return self.reply_error(&packet, error).await,
        };
        let Some(binding) = record.binding.clone() else {
            let error = WireError::connection_not_authenticated(
                "sign in to the target system before calling tools",
            );
            return self.reply_error(&packet, error).await;
        };
        let descriptor = self.shared.descriptor_for(&record, &self.profiles());
        if !descriptor.is_tool_available(invoke.tool_id.as_str()) {
            let error = WireError::connector_channel_unavailable(format!(
                "tool {:?} is not available on this channel now",
                invoke.tool_id.as_str()
            ));
            return self.reply_error(&packet, error).await;
        }
        let arguments = Value::Object(invoke.arguments.clone());
        let problems: Vec<String> = tool
            .validator
            .iter_errors(&arguments)
            .take(5)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() { e.to_string() } else { format!("{path}: {e}") }
            })
            .collect();
        if !problems.is_empty() {
            let error = WireError::new(
                ErrorCode::InvalidArguments,
                format!("the arguments do not match the input schema: {}", problems.join("; ")),
            );
            return self.reply_error(&packet, error).await;
        }
        // Idempotency: channel + tool_call_id, or the request_id without one.
        let key = match (invoke.tool_call_id(), &packet.request_id) {
            (Some(call), _) => format!("call:{call}"),
            (None, Some(request)) => format!("req:{request}"),
            (None, None) => format!("pkt:{}", packet.packet_id),
        };
        let fingerprint =
            Fingerprint::of_value(&json!({ "tool_id": invoke.tool_id, "arguments": arguments }))
                .as_str()
                .to_owned();
        let channel = record.id.clone();
        let map_key = (channel.clone(), key.clone());
        enum Plan {
            Run(watch::Sender<Option<ToolOutcome>>),
            Wait(watch::Receiver<Option<ToolOutcome>>),
            Replay(ToolOutcome),
            Conflict,
        }
        let window =
            u64::try_from(self.shared.config.tool_call_window.as_millis()).unwrap_or(u64::MAX);
        let now = self.shared.now();
        let within_window = |completed_at: u64| now.saturating_sub(completed_at) <= window;
        let plan = {
            let mut inflight = self
                .shared
                .inflight_tools
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match inflight.get(&map_key) {
                Some((fp, rx)) if fp == &fingerprint => Plan::Wait(rx.clone()),
                Some(_) => Plan::Conflict,
                None if !tool.records_calls => {
                    let (tx, rx) = watch::channel(None);
                    inflight.insert(map_key.clone(), (fingerprint.clone(), rx));
                    Plan::Run(tx)
                }
                None => match self.shared.storage.load_tool_call(&channel, &key) {
                    // Past the window the key is forgotten, even before maintenance prunes it.
                    Ok(Some(stored)) if !within_window(stored.completed_at) => {
                        let (tx, rx) = watch::channel(None);
                        inflight.insert(map_key.clone(), (fingerprint.clone(), rx));
                        Plan::Run(tx)
                    }
                    Ok(Some(stored)) if stored.fingerprint == fingerprint => {
                        Plan::Replay(match stored.error {
                            Some((code, message)) => Err((ErrorCode::parse(&code), message)),
                            None => Ok(stored.result.unwrap_or(Value::Null)),
                        })
                    }
                    Ok(Some(_)) => Plan::Conflict,
                    Ok(None) | Err(_) => {
                        let (tx, rx) = watch::channel(None);
                        inflight.insert(map_key.clone(), (fingerprint.clone(), rx));
                        Plan::Run(tx)
                    }
                },
            }
        };
        let outcome = match plan {
            Plan::Conflict => {
                let error = WireError::new(
                    ErrorCode::IdempotencyConflict,
                    "this tool_call_id was already used with different arguments; use a new call id",
                );
                return self.reply_error(&packet, error).await;
            }
            Plan::Replay(outcome) => {
                tracing::debug!(%channel, tool_id = %invoke.tool_id, "repeated tool call answered from the stored result");
                outcome
            }
            Plan::Wait(mut rx) => {
                let waited = rx.wait_for(Option::is_some).await.map(|v| v.clone());
                match waited {
                    Ok(Some(outcome)) => outcome,
                    _ => Err((
                        ErrorCode::InternalError,
                        "the first call of this tool_call_id did not finish".into(),
                    )),
                }
            }
            Plan::Run(done) => {
                let ctx = ToolContext {
                    channel: channel.clone(),
                    tool_id: invoke.tool_id.clone(),
                    request_id: packet.request_id.clone(),
                    tool_call_id: invoke.tool_call_id().cloned(),
                    binding,
                    handle: self.shared.handle(),
                };
                tracing::info!(%channel, tool_id = %invoke.tool_id, "tool invoked");
                let call = (tool.call)(ctx, invoke.arguments.clone());
                let outcome = match std::panic::AssertUnwindSafe(call).catch_unwind().await {
                    Ok(Ok(value)) => Ok(value),
                    Ok(Err(error)) => Err((error.code, error.message)),
                    Err(_) => {
                        Err((ErrorCode::InternalError, "the tool handler panicked".to_owned()))
                    }
                };
                let stored = ToolCallRecord {
                    fingerprint: fingerprint.clone(),
                    result: outcome.as_ref().ok().cloned(),
                    error: outcome.as_ref().err().map(|(c, m)| (c.to_string(), m.clone())),
                    completed_at: self.shared.now(),
                };
                // The ack goes out only once the record is committed (group commit: shared
                // with other calls' records), so a repeat after a crash is answered from it.
                if tool.records_calls
                    && let Err(error) = self
                        .shared
                        .storage
                        .commit_tool_call(&channel, &key, &stored)
                        .committed()
                        .await
                {
                    tracing::error!(%error, "could not store a tool result");
                }
                let _ = done.send(Some(outcome.clone()));
                self.shared
                    .inflight_tools
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&map_key);
                outcome
            }
        };
        match outcome {
            Ok(result) => {
                self.reply(&packet, ToolInvokeAck::new(invoke.tool_id.clone(), result)).await
            }
            Err((code, message)) => self.reply_error(&packet, WireError::new(code, message)).await,
        }
    }
}

/// Puts an unbound channel back to `created` when no sign-in attempt is pending on it any more.
pub(crate) fn revert_authenticating(
    state: &mut crate::runtime::State,
    channel: &ConnectorChannelId,
) {
    let pending_left =
        state.auth_sessions.values().any(|s| &s.channel == channel && !s.status.is_final());
    if let Some(record) = state.channels.get_mut(channel)
        && record.binding.is_none()
        && !pending_left
    {
        record.status = ConnectionStatus::Created;
    }
}
