//! The reader of one connection (on the connection core's [`Driver`]), the judging of what
//! the Connector sent, and the dispatch of accepted packets.

use std::sync::{Arc, Mutex as StdMutex};

use xagent_connection::{
    CLOSE_POLICY, Driver, Ended, Flow, FrameError, FrameHandler, Received, XagentEnd,
    judge_received,
};
use xagent_protocol_types::{Packet, PacketBody, Pong, Role, Side, WireError};
use xagent_protocol_validate::{Accepted, RejectAction, Session};

use super::hello::check_hello_ack;
use crate::connection::{
    ClientEvent, Shared, TapDirection, emit, lock, packet_problems, send_quietly,
};
use crate::transport::FrameStream;
use crate::{ClientError, ids};

impl From<ClientError> for FrameError {
    fn from(error: ClientError) -> Self {
        FrameError::other(error.to_string())
    }
}

/// The xAgent side's half of a connection: what the core's driver hands each text frame to.
struct Reader {
    shared: Arc<Shared>,
    session: Arc<StdMutex<Session>>,
}

impl FrameHandler for Reader {
    async fn on_text(&mut self, text: String) -> Flow {
        match on_text(&self.shared, &self.session, &text).await {
            Some(reason) => Flow::Close(CLOSE_POLICY, reason),
            None => Flow::Continue,
        }
    }

    async fn on_binary(&mut self) -> Flow {
        tracing::warn!("ignoring a binary frame from the Connector");
        Flow::Continue
    }
}

/// The reader: every frame through the core's driver (size limit, UTF-8), every packet through
/// the session, then to its handler. Returns why it ended.
pub(super) async fn read_loop(
    shared: Arc<Shared>,
    session: Arc<StdMutex<Session>>,
    mut stream: FrameStream,
) -> String {
    let driver = Driver::<XagentEnd>::new(shared.config.max_frame_bytes);
    let mut reader = Reader { shared: Arc::clone(&shared), session };
    match driver.run(&mut stream, &mut reader, std::future::pending()).await {
        Ended::PeerClosed(None) => "the Connector closed the socket".to_owned(),
        Ended::PeerClosed(Some((code, reason))) => {
            format!("closed by the Connector ({code}: {reason})")
        }
        Ended::Failed(error) => format!("socket error: {error}"),
        Ended::Stopped => "stopped".to_owned(),
        Ended::Close(code, reason) => {
            if let Some(link) = shared.link() {
                link.close(code, reason.clone()).await;
            }
            reason
        }
    }
}

/// Handles one text frame (within the size limit); `Some(reason)` closes the connection.
async fn on_text(shared: &Arc<Shared>, session: &StdMutex<Session>, text: &str) -> Option<String> {
    if let Some(tap) = &shared.config.tap {
        tap.see(TapDirection::Received, text);
    }
    let packet = match Packet::decode_str(text) {
        Ok(packet) => packet,
        Err(error) => {
            tracing::warn!(error = %error, "invalid packet from the Connector");
            let rejection = xagent_protocol_validate::Rejection::from_decode(&error);
            // A malformed answer to a pending request fails that request now.
            if let Some(request_id) = &error.ids.request_id {
                shared.pending.resolve(request_id, Err(ClientError::Protocol(error.to_string())));
            }
            send_quietly(shared, rejection.error_packet_for(ids::mint("pkt_"), &error.ids)).await;
            return None;
        }
    };
    // The core's verdict, the same as the Connector side's: a packet of a Profile not in
    // effect is dropped without an answer; then nothing the validator rejects is accepted (a
    // `chat.message` is judged by the IM v2 payload rules instead, which answer with a
    // `rejected` ack as the Profile says); then the session decides.
    let verdict = judge_received(session, &packet, |packet| {
        if matches!(packet.body, PacketBody::ChatMessage(_)) {
            return None;
        }
        packet_problems(shared, packet, text, Side::Connector)
    });
    let accepted = match verdict {
        Received::Accepted(accepted) => accepted,
        Received::NotInEffect { .. } => return None,
        Received::Invalid(problems) => {
            on_invalid(shared, session, &packet, &problems).await;
            return None;
        }
        Received::Refused(rejection) => {
            tracing::debug!(packet_type = packet.type_str(), code = %rejection.error.code, "packet refused");
            // A refused hello.ack is reported with the validator's rule ids where it has them.
            let error = match &packet.body {
                PacketBody::ConnectorHelloAck(_) => check_hello_ack(shared, &packet)
                    .err()
                    .unwrap_or_else(|| ClientError::Refused(rejection.error.clone())),
                _ => ClientError::Refused(rejection.error.clone()),
            };
            let reason = error.to_string();
            if let Some(request_id) = &packet.request_id {
                shared.pending.resolve(request_id, Err(error));
            }
            return match rejection.action {
                RejectAction::Ignore => None,
                RejectAction::ReplyAndClose => {
                    send_quietly(shared, rejection.error_packet(ids::mint("pkt_"), &packet)).await;
                    Some(reason)
                }
                _ => {
                    send_quietly(shared, rejection.error_packet(ids::mint("pkt_"), &packet)).await;
                    None
                }
            };
        }
    };
    dispatch(shared, packet, accepted).await;
    None
}

/// A packet from the Connector that breaks the protocol: an answer fails its request; a pushed
/// Descriptor is dropped; anything else is answered with `invalid_packet`.
async fn on_invalid(shared: &Shared, session: &StdMutex<Session>, packet: &Packet, problems: &str) {
    tracing::warn!(packet_type = packet.type_str(), %problems, "packet breaks the protocol");
    let error = WireError::invalid_packet(format!("the packet breaks the protocol: {problems}"));
    let role = packet.packet_type().spec().map(|s| s.role);
    let answering = matches!(role, Some(Role::Ack { .. }) | Some(Role::Error))
        || matches!(packet.body, PacketBody::Error(_));
    if answering {
        if let Some(request_id) = &packet.request_id
            && shared.pending.is_pending(request_id)
        {
            lock(session).forget_request(Side::Xagent, request_id);
            shared.pending.resolve(request_id, Err(ClientError::Refused(error)));
        }
        return;
    }
    // A pushed Descriptor that breaks the rules is dropped without an answer (as the
    // session does for one of another channel); everything else gets `invalid_packet`.
    if matches!(packet.body, PacketBody::DescriptorPush(_)) {
        return;
    }
    let reply = Packet::error(ids::mint("pkt_"), error).answering(packet);
    send_quietly(shared, reply).await;
}

async fn dispatch(shared: &Arc<Shared>, packet: Packet, accepted: Accepted) {
    let answers = matches!(
        accepted,
        Accepted::Established(_)
            | Accepted::Reply(Some(_))
            | Accepted::ChannelOpened { .. }
            | Accepted::Error(Some(_))
    );
    // Every ack that carries a Descriptor updates the directory (after the Descriptor rules).
    let carried = match &packet.body {
        PacketBody::ChannelOpenAck(Some(ack)) => Some(&ack.connection_descriptor),
        PacketBody::AuthStartAck(Some(ack)) => ack.0.connection_descriptor.as_ref(),
        PacketBody::AuthStatusAck(Some(ack)) => ack.0.connection_descriptor.as_ref(),
        PacketBody::AuthLogoutAck(Some(ack)) => ack.connection_descriptor.as_ref(),
        PacketBody::DescriptorGetAck(Some(ack)) => Some(&ack.connection_descriptor),
        _ => None,
    };
    if packet.error.is_none()
        && let (Some(descriptor), Some(channel)) = (carried, &packet.connector_channel_id)
    {
        let outcome = lock(&shared.directory).apply_descriptor(channel, descriptor);
        if let Err(error) = outcome {
            tracing::warn!(%channel, %error, "a Descriptor in an ack was refused");
        }
    }
    // A remembered channel the Connector re-keyed is renamed before the next frame is read.
    if let Accepted::ChannelOpened { channel, request } = &accepted
        && let Some(requested) = &request.channel
    {
        super::reopen::on_rekeyed(shared, requested, channel).await;
    }
    if answers {
        if let Some(request_id) = packet.request_id.clone() {
            shared.pending.resolve(&request_id, Ok(packet));
        }
        return;
    }
    let channel = packet.connector_channel_id.clone();
    match &packet.body {
        PacketBody::Ping(_) => {
            let pong = Packet::with_payload(ids::mint("pkt_"), Pong::default()).answering(&packet);
            send_quietly(shared, pong).await;
        }
        PacketBody::DescriptorPush(push) => {
            let Some(channel) = channel else { return };
            let outcome =
                lock(&shared.directory).apply_descriptor(&channel, &push.connection_descriptor);
            match outcome {
                Ok(()) => {
                    emit(
                        shared,
                        ClientEvent::DescriptorPushed {
                            channel,
                            descriptor: Box::new(push.connection_descriptor.clone()),
                        },
                    )
                    .await;
                }
                Err(error) => {
                    // The texts have a pushed Descriptor that breaks the rules dropped.
                    tracing::warn!(%channel, %error, "ignoring a Descriptor push that breaks the Descriptor rules");
                }
            }
        }
        PacketBody::ChatMessage(_) => crate::im::on_chat_message(shared, packet).await,
        PacketBody::ChatMessageAck(_) => crate::im::on_chat_message_ack(shared, packet).await,
        PacketBody::MessagePush(message) => {
            let message = message.clone();
            emit(shared, ClientEvent::MessagePush { channel, message }).await;
        }
        PacketBody::ToolProgressPush(progress) => {
            let progress = (**progress).clone();
            crate::invoke::on_progress(shared, &progress);
            emit(shared, ClientEvent::ToolProgress { channel, progress }).await;
        }
        PacketBody::Error(_) => {
            if let Some(error) = packet.error {
                emit(shared, ClientEvent::Error(error)).await;
            }
        }
        _ => {
            // A late ack whose request timed out: the session already paired or ignored it.
            tracing::debug!(packet_type = packet.type_str(), "ignoring packet");
        }
    }
}
