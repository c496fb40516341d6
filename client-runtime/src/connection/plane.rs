//! The [`DataPlane`] handle the application holds (started by `crate::driver`).

use std::sync::Arc;

use tokio::sync::watch;
use xagent_connection::CLOSE_NORMAL;
use xagent_protocol_types::{
    ChannelOpen, ChannelOpenAck, ConnectorChannelId, ConnectorId, MessagePush, Packet, PacketBody,
    Payload, Request,
};

use super::request::{request_on, request_typed, send_on};
use super::shared::fail_pending;
use super::{ClientEvent, ConnectionState, Shared, lock};
use crate::ClientError;
use crate::store::XagentWrite;

/// A handle to the data plane; clones share one connection.
#[derive(Clone)]
pub struct DataPlane {
    pub(crate) shared: Arc<Shared>,
    pub(crate) state: watch::Receiver<ConnectionState>,
    /// The driver task (`crate::driver`), aborted by [`DataPlane::close`].
    pub(crate) task: Arc<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for DataPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPlane").field("state", &*self.state.borrow()).finish()
    }
}

impl DataPlane {
    /// The current connection state.
    pub fn state(&self) -> ConnectionState {
        self.state.borrow().clone()
    }

    /// A receiver that sees every state change.
    pub fn watch_state(&self) -> watch::Receiver<ConnectionState> {
        self.state.clone()
    }

    /// Waits until hello has completed and returns the connector id. Fails when the client
    /// was closed or the Connector refused the API key.
    pub async fn connected(&self) -> Result<ConnectorId, ClientError> {
        let mut state = self.state.clone();
        loop {
            match &*state.borrow_and_update() {
                ConnectionState::Online { connector_id } => return Ok(connector_id.clone()),
                ConnectionState::Stopped { .. } => return Err(ClientError::Closed),
                ConnectionState::AuthFailed { reason } => {
                    return Err(ClientError::Unauthorized {
                        endpoint: format!("{} ({reason})", self.shared.config.base_url.ws_url()),
                        status: 401,
                    });
                }
                _ => {}
            }
            state.changed().await.map_err(|_| ClientError::Closed)?;
        }
    }

    /// Sends a request and waits for its ack, returning the typed ack payload. An ack that
    /// carries an `error`, or an `error` packet answering the request, becomes
    /// [`ClientError::Remote`].
    pub async fn request<R: Request>(
        &self,
        channel: Option<&ConnectorChannelId>,
        payload: R,
    ) -> Result<R::Ack, ClientError>
    where
        R::Ack: Clone,
    {
        request_typed(&self.shared, channel, payload).await
    }

    /// Sends a request body and returns the answering packet as it arrived.
    pub async fn request_packet(
        &self,
        channel: Option<&ConnectorChannelId>,
        body: PacketBody,
    ) -> Result<Packet, ClientError> {
        request_on(&self.shared, channel, body).await
    }

    /// Sends one packet as it is (after the session allowed it).
    pub async fn send(&self, packet: &Packet) -> Result<(), ClientError> {
        send_on(&self.shared, packet).await
    }

    /// Opens a channel (`existing` restores a persisted one) and returns its ack. The channel
    /// is not remembered until [`DataPlane::remember_channel`] is called (xAgent persists a
    /// channel only after authentication succeeded).
    pub async fn open_channel(
        &self,
        existing: Option<&ConnectorChannelId>,
    ) -> Result<ChannelOpenAck, ClientError> {
        self.request(existing, ChannelOpen::default()).await
    }

    /// Opens a channel for an xAgent user, who then owns it in the channel directory.
    pub async fn open_channel_for(
        &self,
        owner: &str,
        existing: Option<&ConnectorChannelId>,
    ) -> Result<ChannelOpenAck, ClientError> {
        let _place = crate::channel_mode::reserve_open(&self.shared.directory, owner, existing)?;
        let ack = self.open_channel(existing).await?;
        lock(&self.shared.directory).set_owner(&ack.connector_channel_id, owner);
        Ok(ack)
    }

    /// Remembers a channel so it is reopened after every reconnect (and, with a durable store,
    /// after a restart).
    pub async fn remember_channel(&self, channel: ConnectorChannelId) {
        let owner = lock(&self.shared.directory).owner(&channel);
        let write = XagentWrite::SaveChannel { channel: channel.clone(), owner };
        let ticket = self.shared.im.lock().await.submit(vec![write]);
        if let Err(error) = ticket.await {
            self.shared.commit_failed("a remembered channel", &error);
        }
        lock(&self.shared.channels).insert(channel.clone(), channel);
    }

    /// Forgets a channel.
    pub async fn forget_channel(&self, channel: &ConnectorChannelId) {
        // The channel may be known by the id it was remembered by or by its current id (it
        // was re-keyed): both go.
        let current = lock(&self.shared.channels).get(channel).cloned();
        let writes = std::iter::once(channel)
            .chain(current.as_ref())
            .map(|id| XagentWrite::DeleteChannel(id.clone()))
            .collect();
        let ticket = self.shared.im.lock().await.submit(writes);
        if let Err(error) = ticket.await {
            self.shared.commit_failed("a forgotten channel", &error);
        }
        for id in std::iter::once(channel).chain(current.as_ref()) {
            lock(&self.shared.directory).forget(id);
        }
        lock(&self.shared.channels)
            .retain(|persisted, current| persisted != channel && current != channel);
    }

    /// The current id of a remembered channel (it changes when the Connector did not
    /// recognise the old one on reopen).
    pub async fn current_channel(
        &self,
        persisted: &ConnectorChannelId,
    ) -> Option<ConnectorChannelId> {
        lock(&self.shared.channels).get(persisted).cloned()
    }

    /// Remembered channels as (persisted id, current id).
    pub async fn channels(&self) -> Vec<(ConnectorChannelId, ConnectorChannelId)> {
        lock(&self.shared.channels).iter().map(|(a, b)| (a.clone(), b.clone())).collect()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Stops the client: closes the socket and ends reconnecting. A holder lease this process
    /// holds is given up, so another process takes the data plane over at once.
    pub async fn close(&self) {
        self.task.abort();
        let held = {
            let mut im = self.shared.im.lock().await;
            std::mem::replace(&mut im.holding, crate::im_state::Holding::Standby)
        };
        match held {
            crate::im_state::Holding::Held(fence) => {
                if let Err(error) = self.shared.store.release_lease(&fence).await {
                    tracing::warn!(%error, "the holder lease could not be given up; it expires by itself");
                }
            }
            // Without a lease the state stays writable (a closed plane's handle still reads).
            other => self.shared.im.lock().await.holding = other,
        }
        let link = lock(&self.shared.link).take();
        if let Some(link) = link {
            link.close(CLOSE_NORMAL, "closed").await;
        }
        self.shared.set_state(ConnectionState::Stopped { reason: "closed".into() });
        let _ = self.shared.events.try_send(ClientEvent::Stopped { reason: "closed".into() });
        fail_pending(&self.shared);
    }

    /// Sends a `ping` and waits for the `pong`.
    pub async fn ping(&self) -> Result<(), ClientError> {
        let answer =
            self.request_packet(None, xagent_protocol_types::Ping::default().into_body()).await?;
        match (answer.error.clone(), answer.type_str()) {
            (Some(error), _) => Err(ClientError::Remote(error)),
            (None, "pong") => Ok(()),
            (None, other) => Err(ClientError::Protocol(format!("expected pong, got {other}"))),
        }
    }
}

#[allow(dead_code)]
fn assert_send() {
    fn is_send<T: Send>() {}
    is_send::<DataPlane>();
    is_send::<MessagePush>();
}
