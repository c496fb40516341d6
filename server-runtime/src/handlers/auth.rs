//! `auth.start`, `auth.status`, `auth.cancel`, `auth.logout`: sessions and bindings in the
//! state, steps run by the author's flow code (contained, never under the lock).

use xagent_protocol_types::{
    AuthCancelAck, AuthProgress, AuthSessionId, AuthStartAck, AuthStatus, AuthStatusAck,
    CancelStatus, ConnectionStatus, ConnectorChannelId, ErrorCode, FlowId, Packet, PacketBody,
    TargetType, WireError,
};

use crate::author::{AuthContext, AuthStep, AuthValues, BoundReason, ChannelContext};
use crate::connection::Conn;
use crate::ids;
use crate::state::AuthSession;
use crate::storage::ChannelRecord;

impl Conn {
    pub(crate) async fn on_auth(&self, packet: Packet) {
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

    pub(crate) async fn on_auth_start(
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
        // One target type per channel: a flow whose target type none of the negotiated
        // Profiles is for would sign in a channel this xAgent cannot use.
        let negotiated = self.profiles();
        if !negotiated.is_empty()
            && xagent_profile_device::profiles_for_target_type(&flow.target_type, &negotiated)
                .is_empty()
        {
            let error = WireError::invalid_packet(format!(
                "flow {:?} signs in a {} channel, and no Profile negotiated on this connection \
                 is for {}: announce one in connector.hello or use another flow",
                flow.id.as_str(),
                flow.target_type,
                flow.target_type
            ));
            return self.reply_error(packet, error).await;
        }
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
            state: (),
        };
        let step = self.shared.def.auth.start(ctx, values).await;
        match self.apply_step(&record.id, &flow.id, &auth_session_id, step).await {
            Ok(progress) => self.reply(packet, AuthStartAck(progress)).await,
            Err(error) => self.reply_error(packet, error).await,
        }
    }

    /// Applies an auth step to the session and channel; returns the progress to report.
    pub(crate) async fn apply_step(
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
                state.revert_authenticating(channel);
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
                // The flow's target type becomes the channel's (one target type per channel).
                let binding = match self.shared.def.card.auth_flow(flow_id.as_str()) {
                    Some(flow) => binding.with_target_type(flow.target_type.clone()),
                    None => binding,
                };
                // Device channels: the author's sign-in checked the device; the device rules
                // keep it to one channel (exclusive devices) before anything is stored. A
                // channel of another target type (an IM flow of a Card with both) has none.
                let device_channel = binding.target_type() == Some(&TargetType::Device);
                let correction = match self.shared.device.as_ref().filter(|_| device_channel) {
                    None => None,
                    Some(device) => {
                        let bound = match device.code.device_key(&binding) {
                            Some(key) => device
                                .bind(channel, &key)
                                .map_err(|e| WireError::new(e.code(), e.to_string())),
                            None => Err(WireError::new(
                                ErrorCode::InternalError,
                                "the sign-in did not name a device; try again",
                            )),
                        };
                        match bound {
                            Ok(correction) => Some(correction),
                            Err(error) => {
                                let mut state = self.shared.state();
                                state.auth_sessions.remove(auth_session_id);
                                state.revert_authenticating(channel);
                                return Err(error);
                            }
                        }
                    }
                };
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
                    if let (Some(device), Some(correction)) = (&self.shared.device, &correction) {
                        device.project(record, correction);
                    }
                    let record = record.clone();
                    let commit = self.shared.commit_channel(&record);
                    (record, commit)
                };
                let (record, commit) = record;
                commit.committed().await.map_err(|e| {
                    tracing::error!(error = %e, "could not persist a binding");
                    WireError::new(
                        ErrorCode::InternalError,
                        "could not store the sign-in; try again",
                    )
                })?;
                tracing::info!(%channel, "channel authenticated");
                if let Some(binding) = record.binding.clone() {
                    let ctx = ChannelContext {
                        channel: channel.clone(),
                        binding,
                        handle: self.shared.handle(),
                        state: (),
                    };
                    self.shared.def.auth.bound(ctx, BoundReason::SignedIn).await;
                }
                let descriptor = self.shared.descriptor_for(&record, &self.profiles())?;
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
                state.revert_authenticating(channel);
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

    pub(crate) fn session(
        &self,
        channel: &ConnectorChannelId,
        id: &AuthSessionId,
    ) -> Option<AuthSession> {
        self.shared.state().auth_sessions.get(id).filter(|s| &s.channel == channel).cloned()
    }

    pub(crate) async fn on_auth_status(
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
                match self.shared.descriptor_for(&record, &self.profiles()) {
                    Ok(descriptor) => progress = progress.with_descriptor(descriptor),
                    Err(error) => return self.reply_error(packet, error).await,
                }
            }
            return self.reply(packet, AuthStatusAck(progress)).await;
        }
        let ctx = AuthContext {
            channel: record.id.clone(),
            flow_id: session.flow_id.clone(),
            auth_session_id: auth_session_id.clone(),
            handle: self.shared.handle(),
            state: (),
        };
        let step = self.shared.def.auth.status(ctx, refresh).await;
        match self.apply_step(&record.id, &session.flow_id, auth_session_id, step).await {
            Ok(progress) => self.reply(packet, AuthStatusAck(progress)).await,
            Err(error) => self.reply_error(packet, error).await,
        }
    }

    pub(crate) async fn on_auth_cancel(
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
                    match self.shared.descriptor_for(&record, &self.profiles()) {
                        Ok(descriptor) => Some(descriptor),
                        Err(error) => return self.reply_error(packet, error).await,
                    };
                ack.message = Some("already authenticated".into());
                ack
            }
            Some(session) => {
                let ctx = AuthContext {
                    channel: record.id.clone(),
                    flow_id: session.flow_id,
                    auth_session_id: auth_session_id.clone(),
                    handle: self.shared.handle(),
                    state: (),
                };
                self.shared.def.auth.cancel(ctx).await;
                {
                    let mut state = self.shared.state();
                    state.auth_sessions.remove(auth_session_id);
                    state.revert_authenticating(&record.id);
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

    pub(crate) async fn on_auth_logout(&self, packet: &Packet, record: ChannelRecord) {
        if let Some(binding) = record.binding.clone() {
            let ctx = ChannelContext {
                channel: record.id.clone(),
                binding,
                handle: self.shared.handle(),
                state: (),
            };
            if let Err(error) = self.shared.def.auth.logout(ctx).await {
                return self.reply_error(packet, WireError::new(error.code, error.message)).await;
            }
            if let Some(device) = &self.shared.device {
                device.forget(&record.id);
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
                state: (),
            };
            self.shared.def.auth.cancel(ctx).await;
        }
        let updated = {
            let mut state = self.shared.state();
            let stops = state.consumers.release_channel(&record.id);
            state.auth_sessions.retain(|_, s| s.channel != record.id);
            state
                .channels
                .get_mut(&record.id)
                .map(|r| {
                    r.binding = None;
                    r.status = ConnectionStatus::Created;
                    r.tool_overrides.clear();
                    (r.clone(), stops)
                })
                .map(|(record, stops)| {
                    let commit = self.shared.commit_channel(&record);
                    (record, stops, commit)
                })
        };
        let Some((record, stops, commit)) = updated else {
            let error = WireError::connection_not_found("the channel was unregistered");
            return self.reply_error(packet, error).await;
        };
        for stop in stops {
            stop();
        }
        if let Err(error) = commit.committed().await {
            tracing::error!(%error, "could not persist a sign-out");
        }
        tracing::info!(channel = %record.id, "channel signed out");
        // Signed out, the channel takes a target type this connection negotiated: a
        // Descriptor is always there, `None` only should that ever fail.
        let descriptor = self.shared.descriptor_for(&record, &self.profiles()).ok();
        self.reply(packet, xagent_protocol_types::AuthLogoutAck::new(descriptor)).await;
    }
}
