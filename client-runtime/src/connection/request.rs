//! The one request/ack path and the write queue's entry points.

use tokio::sync::oneshot;
use xagent_protocol_types::{
    ConnectorChannelId, Packet, PacketBody, Payload, Request, RequestId, Role, Side,
};

use super::shared::Outgoing;
use super::{Shared, lock};
use crate::{ClientError, ids};

/// The one request/ack path: every request type (hello included) is registered by
/// `request_id`, written through the session, and answered by the reader.
pub(crate) async fn request_on(
    shared: &Shared,
    channel: Option<&ConnectorChannelId>,
    body: PacketBody,
) -> Result<Packet, ClientError> {
    let expected = match body.packet_type().spec().map(|s| s.role) {
        Some(Role::Request { ack }) => ack,
        _ => return Err(ClientError::Protocol(format!("{} is not a request", body.type_str()))),
    };
    let request_id = RequestId::new(ids::mint("req_"));
    let packet = Packet::new(ids::mint("pkt_"), body)
        .request_id(request_id.clone())
        .maybe_channel(channel.cloned());
    let (sender, receiver) = oneshot::channel();
    lock(&shared.pending).insert(request_id.clone(), sender);
    if let Err(error) = send_on(shared, &packet).await {
        lock(&shared.pending).remove(&request_id);
        return Err(error);
    }
    let timeout = shared.config.request_timeout;
    match tokio::time::timeout(timeout, receiver).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(ClientError::NotConnected),
        Err(_) => {
            lock(&shared.pending).remove(&request_id);
            if let Some(link) = shared.link() {
                lock(&link.session).forget_request(Side::Xagent, &request_id);
            }
            Err(ClientError::Timeout { expected, millis: timeout.as_millis() as u64 })
        }
    }
}

/// [`request_on`] with the ack decoded into the request's ack type.
pub(crate) async fn request_typed<R: Request>(
    shared: &Shared,
    channel: Option<&ConnectorChannelId>,
    payload: R,
) -> Result<R::Ack, ClientError>
where
    R::Ack: Clone,
{
    let packet = request_on(shared, channel, payload.into_body()).await?;
    if let Some(error) = packet.error {
        return Err(ClientError::Remote(error));
    }
    match R::Ack::from_body(&packet.body) {
        Some(ack) => Ok(ack.clone()),
        None => Err(ClientError::Protocol(format!(
            "expected {} with a payload, got {}",
            R::Ack::TYPE,
            packet.type_str()
        ))),
    }
}

/// Queues a packet and waits until the writer wrote it, or the session withheld it.
pub(crate) async fn send_on(shared: &Shared, packet: &Packet) -> Result<(), ClientError> {
    let link = shared.link().ok_or(ClientError::NotConnected)?;
    let packet = packet.clone().time(shared.now());
    let (done, written) = oneshot::channel();
    link.tx
        .send(Outgoing::Packet(Box::new(packet), Some(done)))
        .await
        .map_err(|_| ClientError::NotConnected)?;
    written.await.unwrap_or(Err(ClientError::NotConnected))
}

/// Queues a packet without waiting for the write (replies from the reader).
pub(super) async fn send_quietly(shared: &Shared, packet: Packet) {
    if let Some(link) = shared.link() {
        let _ = link.tx.send(Outgoing::Packet(Box::new(packet.time(shared.now())), None)).await;
    }
}
