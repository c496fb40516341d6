//! The xAgent side's half of a connection on the connection core's [`Driver`] (which decodes,
//! judges and answers refused packets), and the dispatch of the packets it accepted.

use std::sync::{Arc, Mutex as StdMutex};

use xagent_connection::{Driver, Ended, Flow, FrameError, PacketHandler};
use xagent_protocol_types::{Packet, PacketBody, Pong, RequestId, WireError};
use xagent_protocol_validate::{Accepted, Session};

use crate::connection::{ClientEvent, Shared, TapDirection, emit, lock, send_quietly};
use crate::transport::FrameStream;
use crate::{ClientError, ids};

impl From<ClientError> for FrameError {
    fn from(error: ClientError) -> Self {
        FrameError::Read(error.to_string())
    }
}

/// The xAgent side's half of a connection: what the core's driver hands judged packets to.
struct Reader {
    shared: Arc<Shared>,
}

impl PacketHandler for Reader {
    async fn on_packet(&mut self, packet: Packet, accepted: Accepted) -> Flow {
        dispatch(&self.shared, packet, accepted).await;
        Flow::Continue
    }

    async fn send(&mut self, packet: Packet) {
        send_quietly(&self.shared, packet).await;
    }

    fn fail_pending(&mut self, request_id: &RequestId, error: WireError) {
        tracing::warn!(%request_id, code = %error.code, "the Connector's answer was refused");
        self.shared.pending.resolve(request_id, Err(ClientError::Refused(error)));
    }

    async fn on_binary(&mut self) -> Flow {
        tracing::warn!("ignoring a binary frame from the Connector");
        Flow::Continue
    }

    fn saw(&mut self, text: &str, _packet: Option<&Packet>) {
        if let Some(tap) = &self.shared.config.tap {
            tap.see(TapDirection::Received, text);
        }
    }
}

/// The reader: every frame through the core's driver (frame rules, session, packet rules),
/// every accepted packet to its handler. Returns why it ended.
pub(super) async fn read_loop(
    shared: Arc<Shared>,
    session: Arc<StdMutex<Session>>,
    mut stream: FrameStream,
) -> String {
    let driver = Driver::new(&session, &shared.admission, shared.config.max_frame_bytes);
    let mut reader = Reader { shared: Arc::clone(&shared) };
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
