//! `channel.open`, `channel.close`, `descriptor.get`, and the channel lookup every
//! channel-scoped request starts with.

use xagent_protocol_types::{
    ChannelCloseAck, ChannelOpenAck, ConnectionStatus, DescriptorGetAck, ErrorCode, Packet,
    WireError,
};

use crate::author::{BoundReason, ChannelContext};
use crate::connection::Conn;
use crate::ids;
use crate::state::Link;
use crate::storage::ChannelRecord;

impl Conn {
    /// A Connector without auth flows binds a new channel at once: nothing could ever sign
    /// it in, and Tools need a binding.
    fn bind_without_auth(&self, mut record: ChannelRecord) -> ChannelRecord {
        if self.shared.def.card.auth_flows.is_empty() {
            record.binding = Some(self.shared.def.open_binding());
            record.status = ConnectionStatus::Connected;
        }
        record
    }

    pub(crate) async fn on_channel_open(&mut self, packet: &Packet) {
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
            // Limits (L3): channels routed on this socket, and channels in total.
            let routed_here = known.is_some_and(|r| {
                state.route(&r.id).is_some_and(|route| route.socket == self.socket)
            });
            if !routed_here {
                let on_socket = state.routed_on(self.socket);
                if on_socket >= self.shared.config.max_channels_per_socket {
                    break 'open Some(Err(WireError::new(
                        ErrorCode::CapacityExceeded,
                        format!(
                            "this socket has {on_socket} channels open, the most it may; close some or use another socket"
                        ),
                    )));
                }
            }
            if known.is_none() && state.channels.len() >= self.shared.config.max_channels {
                break 'open Some(Err(WireError::new(
                    ErrorCode::CapacityExceeded,
                    "the Connector holds the most channels it may; reopen an existing channel",
                )));
            }
            let (record, created) = match (known, current) {
                // A known channel opens only where its Profile was negotiated (a device
                // channel reopened by an xAgent that announced only IM does not).
                (Some(record), _) => match self.shared.channel_profiles(record, &profiles) {
                    Ok(_) => (ChannelRecord::clone(record), None),
                    Err(error) => break 'open Some(Err(error)),
                },
                (None, Some(connector_id)) => {
                    let record = ChannelRecord {
                        id: ids::channel_id(),
                        connector_id,
                        status: ConnectionStatus::Created,
                        binding: None,
                        tool_overrides: Default::default(),
                        created_at: now,
                    };
                    let record = self.bind_without_auth(record);
                    state.insert_channel(record.clone());
                    let commit = self.shared.commit_channel(&record);
                    (record, Some(commit))
                }
                (None, None) => break 'open None,
            };
            let tx = &self.tx;
            state.set_route(&record.id, self.socket, || Link {
                tx: tx.clone(),
                profiles: profiles.clone(),
            });
            Some(Ok((record, created)))
        };
        let (record, commit) = match opened {
            Some(Ok(opened)) => opened,
            // A refused open names no channel, and a channel.open.ack must: the refusal is
            // an `error` packet answering the request.
            Some(Err(error)) => {
                let answer = Packet::error(ids::packet_id(), error).answering(packet);
                return self.send(answer).await;
            }
            None => {
                let error = WireError::hello_required(
                    "the runtime instance expired; send connector.hello again",
                );
                return self.reply_error(packet, error).await;
            }
        };
        let created = commit.is_some();
        if let Some(commit) = commit
            && let Err(error) = commit.committed().await
        {
            tracing::error!(%error, "could not persist a new channel");
        }
        let channel = record.id.clone();
        tracing::info!(%channel, created, "channel opened");
        if created
            && self.shared.def.card.auth_flows.is_empty()
            && let Some(binding) = record.binding.clone()
        {
            let ctx = ChannelContext {
                channel: channel.clone(),
                binding,
                handle: self.shared.handle(),
                state: (),
            };
            self.shared.def.auth.bound(ctx, BoundReason::Opened).await;
        }
        let descriptor = match self.shared.descriptor_for(&record, &profiles) {
            Ok(descriptor) => descriptor,
            // The record changed since the check above (another replica's sign-in): the
            // channel stays closed on this connection.
            Err(error) => {
                {
                    let mut state = self.shared.state();
                    if state.route(&channel).is_some_and(|r| r.socket == self.socket) {
                        state.clear_route(&channel);
                    }
                }
                let answer = Packet::error(ids::packet_id(), error).answering(packet);
                return self.send(answer).await;
            }
        };
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

    pub(crate) async fn on_channel_close(&mut self, packet: &Packet) {
        if let Some(channel) = &packet.connector_channel_id {
            let mut state = self.shared.state();
            if state.route(channel).is_some_and(|r| r.socket == self.socket) {
                state.clear_route(channel);
            }
            drop(state);
            if let Some(im) = &self.shared.im {
                im.on_routes_lost(std::slice::from_ref(channel), self.shared.now());
            }
            tracing::info!(%channel, "channel route closed");
        }
        self.reply(packet, ChannelCloseAck::default()).await;
    }

    pub(crate) fn record(&self, packet: &Packet) -> Result<ChannelRecord, WireError> {
        self.with_record(packet, |record| Ok(record.clone()))
    }

    /// Runs `f` on the packet's channel record under the state lock (after the checks that
    /// the channel is named, exists and belongs to this runtime instance), so a caller that
    /// needs a few fields copies only those.
    pub(crate) fn with_record<T>(
        &self,
        packet: &Packet,
        f: impl FnOnce(&ChannelRecord) -> Result<T, WireError>,
    ) -> Result<T, WireError> {
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
        f(record)
    }

    pub(crate) async fn on_descriptor_get(&self, packet: &Packet) {
        match self.record(packet) {
            Ok(record) => match self.shared.descriptor_for(&record, &self.profiles()) {
                Ok(descriptor) => self.reply(packet, DescriptorGetAck::new(descriptor)).await,
                Err(error) => self.reply_error(packet, error).await,
            },
            Err(error) => self.reply_error(packet, error).await,
        }
    }
}
