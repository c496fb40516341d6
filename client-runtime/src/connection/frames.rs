//! The reader and the writer of one connection, and the dispatch of accepted packets.

use std::sync::{Arc, Mutex as StdMutex};

use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use xagent_protocol_types::{Packet, PacketBody, Pong, Role, Side, WireError};
use xagent_protocol_validate::{Accepted, PacketContext, Permission, RejectAction, Session};

use super::reconnect::check_hello_ack;
use super::request::send_quietly;
use super::shared::Outgoing;
use super::{ClientEvent, PacketTap, Shared, TapDirection, emit, lock};
use crate::transport::{Frame, FrameSink, FrameStream};
use crate::{ClientError, ids};

/// The writer: judges each packet with the session (no lock held while writing), then writes.
pub(super) async fn write_loop(
    mut sink: FrameSink,
    mut rx: mpsc::Receiver<Outgoing>,
    session: Arc<StdMutex<Session>>,
    tap: Option<PacketTap>,
) {
    while let Some(item) = rx.recv().await {
        let (text, done) = match item {
            Outgoing::Close(code, reason) => {
                let _ = sink.send(Frame::Close(Some((code, reason)))).await;
                let _ = sink.close().await;
                return;
            }
            Outgoing::Raw(text) => (text, None),
            Outgoing::Packet(packet, done) => {
                let verdict = lock(&session).on_sent(&packet);
                if let Err(rejection) = verdict {
                    tracing::debug!(packet_type = packet.type_str(), code = %rejection.error.code, "outgoing packet withheld");
                    if let Some(done) = done {
                        let _ = done.send(Err(ClientError::Withheld(rejection.error)));
                    }
                    continue;
                }
                match packet.to_json() {
                    Ok(text) => (text, done),
                    Err(error) => {
                        if let Some(done) = done {
                            let _ = done.send(Err(ClientError::Protocol(error.to_string())));
                        }
                        continue;
                    }
                }
            }
        };
        if let Some(tap) = &tap {
            tap.see(TapDirection::Sent, &text);
        }
        let written = sink.send(Frame::Text(text)).await;
        let ok = written.is_ok();
        if let Some(done) = done {
            let _ = done.send(written);
        }
        if !ok {
            break;
        }
    }
    let _ = sink.close().await;
}

/// The reader: every frame through the session, then to its handler. Returns why it ended.
pub(super) async fn read_loop(
    shared: Arc<Shared>,
    session: Arc<StdMutex<Session>>,
    mut stream: FrameStream,
) -> String {
    loop {
        let Some(frame) = stream.next().await else {
            return "the Connector closed the socket".to_owned();
        };
        match frame {
            Err(error) => return format!("socket error: {error}"),
            Ok(Frame::Close(close)) => {
                return match close {
                    Some((code, reason)) => format!("closed by the Connector ({code}: {reason})"),
                    None => "closed by the Connector".to_owned(),
                };
            }
            Ok(Frame::Binary(_)) => tracing::warn!("ignoring a binary frame from the Connector"),
            Ok(Frame::Text(text)) => {
                if let Some(reason) = on_text(&shared, &session, &text).await {
                    if let Some(link) = shared.link() {
                        let _ = link.tx.send(Outgoing::Close(1008, reason.clone())).await;
                    }
                    return reason;
                }
            }
        }
    }
}

/// Handles one text frame; `Some(reason)` closes the connection.
async fn on_text(shared: &Arc<Shared>, session: &StdMutex<Session>, text: &str) -> Option<String> {
    if let Some(tap) = &shared.config.tap {
        tap.see(TapDirection::Received, text);
    }
    if text.len() > shared.config.max_frame_bytes {
        return Some("packet larger than the size limit".into());
    }
    let packet = match Packet::decode_str(text) {
        Ok(packet) => packet,
        Err(error) => {
            tracing::warn!(error = %error, "invalid packet from the Connector");
            let rejection = xagent_protocol_validate::Rejection::from_decode(&error);
            // A malformed answer to a pending request fails that request now.
            if let Some(request_id) = &error.ids.request_id
                && let Some(waiter) = lock(&shared.pending).remove(request_id)
            {
                let _ = waiter.send(Err(ClientError::Protocol(error.to_string())));
            }
            send_quietly(shared, rejection.error_packet_for(ids::mint("pkt_"), &error.ids)).await;
            return None;
        }
    };
    // Nothing the validator rejects is accepted. A `chat.message` is judged by the IM v2
    // payload rules instead, which answer with a `rejected` ack as the Profile says.
    if !matches!(packet.body, PacketBody::ChatMessage(_))
        && let Some(problems) = validation_errors(shared, &packet, text)
    {
        tracing::warn!(packet_type = packet.type_str(), %problems, "packet breaks the protocol");
        let error =
            WireError::invalid_packet(format!("the packet breaks the protocol: {problems}"));
        let role = packet.packet_type().spec().map(|s| s.role);
        let answering = matches!(role, Some(Role::Ack { .. }) | Some(Role::Error))
            || matches!(packet.body, PacketBody::Error(_));
        if answering {
            if let Some(request_id) = &packet.request_id
                && let Some(waiter) = lock(&shared.pending).remove(request_id)
            {
                lock(session).forget_request(Side::Xagent, request_id);
                let _ = waiter.send(Err(ClientError::Refused(error)));
            }
            return None;
        }
        // A pushed Descriptor that breaks the rules is dropped without an answer (as the
        // session does for one of another channel); everything else gets `invalid_packet`.
        if matches!(packet.body, PacketBody::DescriptorPush(_)) {
            return None;
        }
        let reply = Packet::error(ids::mint("pkt_"), error).answering(&packet);
        send_quietly(shared, reply).await;
        return None;
    }
    // Profile packets outside what was negotiated or what the channel enables are dropped
    // without an answer; the catalog decides.
    {
        let session = lock(session);
        if let Some(negotiated) = session.negotiated() {
            // Borrowed from the session (no copy per packet).
            let channel_profiles =
                packet.connector_channel_id.as_ref().and_then(|c| session.channel_profiles(c));
            if let Permission::ProfileNotNegotiated { profile }
            | Permission::ProfileNotOnChannel { profile } =
                negotiated.decide(packet.type_str(), Side::Connector, channel_profiles)
            {
                tracing::debug!(
                    packet_type = packet.type_str(),
                    profile,
                    "dropped a packet of a Profile not in effect"
                );
                return None;
            }
        }
    }
    let verdict = lock(session).on_received(&packet);
    let accepted = match verdict {
        Ok(accepted) => accepted,
        Err(rejection) => {
            tracing::debug!(packet_type = packet.type_str(), code = %rejection.error.code, "packet refused");
            // A refused hello.ack is reported with the validator's rule ids where it has them.
            let error = match &packet.body {
                PacketBody::ConnectorHelloAck(_) => check_hello_ack(shared, &packet)
                    .err()
                    .unwrap_or_else(|| ClientError::Refused(rejection.error.clone())),
                _ => ClientError::Refused(rejection.error.clone()),
            };
            let reason = error.to_string();
            if let Some(request_id) = &packet.request_id
                && let Some(waiter) = lock(&shared.pending).remove(request_id)
            {
                let _ = waiter.send(Err(error));
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

/// The validator's errors for a packet from the Connector (`packet`, decoded from `text`),
/// rule ids first, or `None`. The hot-path verdict runs first, on the packet already decoded
/// (no second decode, no `Value`); only a refused packet is parsed again for the report that
/// names its rules.
fn validation_errors(shared: &Shared, packet: &Packet, text: &str) -> Option<String> {
    let facts = shared.card_facts();
    let context = PacketContext { card: facts.as_deref(), sender: Some(Side::Connector) };
    let report = shared.validator.check_decoded(packet, text.as_bytes(), context).err()?;
    let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
    (!errors.is_empty()).then(|| errors.join("; "))
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
        crate::reopen::on_rekeyed(shared, requested, channel).await;
    }
    if answers {
        if let Some(request_id) = &packet.request_id
            && let Some(waiter) = lock(&shared.pending).remove(request_id)
        {
            let _ = waiter.send(Ok(packet));
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
