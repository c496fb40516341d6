//! The one request/ack path and the write queue's entry points, on the connection core's
//! [`xagent_connection::Requests`] and [`xagent_connection::Outbound`].

use xagent_connection::{RequestError, SendError};
use xagent_protocol_types::{
    ConnectorChannelId, Packet, PacketBody, Payload, Request, RequestId, Role,
};

use super::Shared;
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
        _ => {
            return Err(ClientError::InvalidInput(format!("{} is not a request", body.type_str())));
        }
    };
    let request_id = RequestId::new(ids::mint("req_"));
    let packet =
        Packet::new(ids::mint("pkt_"), body).request_id(request_id).maybe_channel(channel.cloned());
    let link = shared.link().ok_or(ClientError::NotConnected)?;
    let timeout = shared.config.request_timeout;
    match shared.pending.request(&link, packet, timeout).await {
        Ok(answer) => answer,
        Err(RequestError::Send(error)) => Err(sent_error(error)),
        Err(RequestError::Closed) => Err(ClientError::NotConnected),
        Err(RequestError::TimedOut(_)) => {
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

/// Queues a packet and waits until the writer wrote it, or refused it (the send rules, the
/// session, the size rule).
pub(crate) async fn send_on(shared: &Shared, packet: &Packet) -> Result<(), ClientError> {
    let link = shared.link().ok_or(ClientError::NotConnected)?;
    link.send(packet.clone()).await.map_err(sent_error)
}

/// Queues a packet without waiting for the write (replies from the reader).
pub(crate) async fn send_quietly(shared: &Shared, packet: Packet) {
    if let Some(link) = shared.link() {
        link.push(packet).await;
    }
}

/// What the core's writer said about a packet, as this crate's error.
pub(crate) fn sent_error(error: SendError) -> ClientError {
    match error {
        SendError::Withheld(error) => ClientError::Withheld(error),
        SendError::Invalid(refusal) => {
            ClientError::Invalid { rules: refusal.rules, message: refusal.message }
        }
        SendError::TooLarge { bytes, limit } => ClientError::TooLarge { bytes, limit },
        SendError::Encode(reason) => ClientError::Encode(reason),
        _ => ClientError::NotConnected,
    }
}
