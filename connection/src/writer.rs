//! The one bounded writer: every packet a side sends passes the same steps (the optional
//! outbound judge, `Session::on_sent`, encoding, the outbound size rule) and goes out through
//! one queue drained by a task that holds no lock while it writes.

use std::sync::{Arc, Mutex};

use futures_util::{Sink, SinkExt};
use tokio::sync::{mpsc, oneshot};
use xagent_protocol_types::{ErrorCode, Packet, PacketBody, WireError};
use xagent_protocol_validate::Session;

use crate::Frame;
use crate::lock;

/// Something to write on a connection.
#[derive(Debug)]
pub enum Outgoing {
    /// A packet (a reply, a push); nobody waits for its write.
    Packet(Packet),
    /// A packet whose write (or refusal) is reported once the frame was flushed.
    Tracked(Packet, oneshot::Sender<Result<(), SendError>>),
    /// A close frame; the writer stops after it.
    Close(u16, String),
}

/// Why a packet did not go out.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The sequencing session refused it (before hello, a channel not open, a duplicate
    /// request id); the error carries the protocol's code.
    #[error("the packet was withheld: {0}")]
    Withheld(WireError),
    /// The local outbound judge (the same rules the peer applies on receive) refused it; no
    /// byte left. Fix the packet: the rule ids say what is wrong.
    #[error("the packet breaks the protocol and was not sent: {}", .0.message)]
    Invalid(OutboundRefusal),
    /// It is larger than the peer takes; send less (a file through the Transfer Plane).
    #[error("the packet is {bytes} bytes and the data plane takes at most {limit}; send less")]
    TooLarge {
        /// Its size as text.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// It could not be encoded as JSON.
    #[error("the packet could not be encoded: {0}")]
    Encode(String),
    /// The connection closed before it was written.
    #[error("the connection closed before the packet was written")]
    Closed,
}

/// The outbound judge's refusal: the rule ids broken, and a readable summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundRefusal {
    /// The rule ids, in report order (for example `im.delta.sequence`).
    pub rules: Vec<String>,
    /// Every violation, rule id first, joined.
    pub message: String,
}

/// Judges a packet before it leaves (the xAgent side runs the receive rules of its peer here).
/// Given the packet and its JSON text, so the judge decodes nothing again.
pub trait OutboundJudge: Send + Sync + 'static {
    /// `Err` when the packet must not go out.
    fn judge(&self, packet: &Packet, text: &str) -> Result<(), OutboundRefusal>;
}

/// Sees every packet the writer writes, with its text, once (metrics of sent packets, tools
/// that print the traffic).
pub type WriteTap = Arc<dyn Fn(&Packet, &str) + Send + Sync>;

/// How a writer treats what it writes.
#[derive(Clone)]
pub struct WriterOptions {
    /// The largest packet the peer takes, as text (the outbound size rule).
    pub max_packet_bytes: usize,
    /// Runs before the session sees a packet; `None` on the Connector side.
    pub judge: Option<Arc<dyn OutboundJudge>>,
    /// Sees every packet written.
    pub tap: Option<WriteTap>,
}

impl WriterOptions {
    /// A writer with the size rule only.
    pub fn new(max_packet_bytes: usize) -> Self {
        Self { max_packet_bytes, judge: None, tap: None }
    }
}

impl std::fmt::Debug for WriterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterOptions")
            .field("max_packet_bytes", &self.max_packet_bytes)
            .field("judge", &self.judge.is_some())
            .field("tap", &self.tap.is_some())
            .finish()
    }
}

/// Frames written before one flush: what is queued when the writer wakes goes out in one
/// write (one syscall for a burst of acks instead of one each), up to this many.
const MAX_FRAMES_PER_FLUSH: usize = 64;

/// The writer task of one connection: drains `rx` into `sink` until the queue closes, a
/// write fails or a close frame was written.
pub async fn write_loop<Si>(
    mut sink: Si,
    mut rx: mpsc::Receiver<Outgoing>,
    session: Arc<Mutex<Session>>,
    options: WriterOptions,
) where
    Si: Sink<Frame> + Send + Unpin + 'static,
{
    // Senders of tracked packets fed since the last flush: told once the flush succeeded.
    let mut tracked: Vec<oneshot::Sender<Result<(), SendError>>> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        let mut fed = 0;
        let mut ok = true;
        while let Some(item) = next.take() {
            let (text, done) = match item {
                Outgoing::Packet(packet) => match encode_outgoing(&session, &packet, &options) {
                    Ok(text) => (Some(tapped(&options, &packet, text)), None),
                    Err(_) => (None, None),
                },
                Outgoing::Tracked(packet, done) => {
                    match encode_outgoing(&session, &packet, &options) {
                        Ok(text) => (Some(tapped(&options, &packet, text)), Some(done)),
                        Err(error) => {
                            let _ = done.send(Err(error));
                            (None, None)
                        }
                    }
                }
                Outgoing::Close(code, reason) => {
                    let flushed = sink.flush().await.is_ok();
                    report(&mut tracked, flushed);
                    // A sink that failed once is never polled again: adapters such as
                    // `sink_map_err` and `sink::unfold` panic when used after an error.
                    if flushed && sink.send(Frame::Close(Some((code, reason)))).await.is_ok() {
                        let _ = sink.close().await;
                    }
                    return;
                }
            };
            if let Some(text) = text {
                if sink.feed(Frame::Text(text)).await.is_err() {
                    ok = false;
                    if let Some(done) = done {
                        let _ = done.send(Err(SendError::Closed));
                    }
                    break;
                }
                tracked.extend(done);
            }
            fed += 1;
            if fed < MAX_FRAMES_PER_FLUSH {
                next = rx.try_recv().ok();
            }
        }
        let flushed = ok && sink.flush().await.is_ok();
        report(&mut tracked, flushed);
        if !flushed {
            // Failed: not polled again (see the close frame above).
            return;
        }
    }
    let _ = sink.close().await;
}

/// `text` after the tap saw it with its packet.
fn tapped(options: &WriterOptions, packet: &Packet, text: String) -> String {
    if let Some(tap) = &options.tap {
        tap(packet, &text);
    }
    text
}

fn report(tracked: &mut Vec<oneshot::Sender<Result<(), SendError>>>, flushed: bool) {
    for done in tracked.drain(..) {
        let _ = done.send(if flushed { Ok(()) } else { Err(SendError::Closed) });
    }
}

/// The text of an outgoing packet, or why it must not be sent: the sequencing `Session` refuses
/// it (the channel closed meanwhile, or it breaks sequencing; decided before the packet is
/// encoded, so a withheld packet costs no serialisation), it cannot be encoded, the outbound
/// judge refuses it (the session then forgets it), or it is over the size limit (see
/// [`within_limit`]).
pub fn encode_outgoing(
    session: &Mutex<Session>,
    packet: &Packet,
    options: &WriterOptions,
) -> Result<String, SendError> {
    on_sent(session, packet)?;
    let text = encode(packet)?;
    if let Some(judge) = &options.judge
        && let Err(refusal) = judge.judge(packet, &text)
    {
        tracing::debug!(packet_type = packet.type_str(), rules = %refusal.message, "outgoing packet refused locally");
        // The session counted it as sent; it never leaves, so nothing waits for its answer.
        let mut session = lock(session);
        let side = session.side();
        if let Some(request_id) = &packet.request_id {
            session.forget_request(side, request_id);
        }
        session.forget_message(side, &packet.packet_id);
        return Err(SendError::Invalid(refusal));
    }
    let bytes = text.len();
    match within_limit(packet, text, options.max_packet_bytes) {
        Some(text) => Ok(text),
        None => Err(SendError::TooLarge { bytes, limit: options.max_packet_bytes }),
    }
}

fn on_sent(session: &Mutex<Session>, packet: &Packet) -> Result<(), SendError> {
    if let Err(rejection) = lock(session).on_sent(packet) {
        tracing::debug!(packet_type = packet.type_str(), code = %rejection.error.code, "outgoing packet withheld");
        return Err(SendError::Withheld(rejection.error));
    }
    Ok(())
}

fn encode(packet: &Packet) -> Result<String, SendError> {
    packet.to_json().map_err(|error| {
        tracing::error!(%error, "could not encode an outgoing packet");
        SendError::Encode(error.to_string())
    })
}

/// The last line of the outbound size rule: nothing leaves that the peer's packet limit would
/// refuse (a peer drops an oversized packet and reconnects, cutting every channel on the socket).
/// An oversized ack (a Tool result, say) is replaced by the same ack carrying
/// `payload_too_large`, so the request is still answered; any other oversized packet is withheld.
pub fn within_limit(packet: &Packet, text: String, limit: usize) -> Option<String> {
    if text.len() <= limit {
        return Some(text);
    }
    let packet_type = packet.type_str();
    tracing::warn!(packet_type, bytes = text.len(), limit, "outgoing packet over the size limit");
    let body = PacketBody::empty_ack(packet_type)?;
    let mut answer = Packet::new(crate::packet_id(), body).with_error(
        WireError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the answer is {} bytes as a packet and the data plane takes at most {limit}: ask for less (a narrower query, or a file through the Transfer Plane)",
                text.len()
            ),
        ),
    );
    answer.request_id = packet.request_id.clone();
    answer.reply_to = packet.reply_to.clone();
    answer.connector_channel_id = packet.connector_channel_id.clone();
    answer.time = packet.time;
    answer.to_json().ok().filter(|answer| answer.len() <= limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::{ChatMessage, ConnectorChannelId, RequestId, ToolInvokeAck};

    fn big_ack() -> Packet {
        let result = serde_json::json!({ "rows": "x".repeat(4096) });
        let mut ack = Packet::with_payload("pkt_ack", ToolInvokeAck::new("t_read", result))
            .channel(ConnectorChannelId::from("cch_1"));
        ack.request_id = Some(RequestId::from("req_1"));
        ack.reply_to = Some("pkt_req".into());
        ack
    }

    #[test]
    fn outbound_size_rule_an_oversized_ack_is_answered_with_payload_too_large() {
        let ack = big_ack();
        let text = ack.to_json().expect("encodes");
        let sent = within_limit(&ack, text, 1024).expect("the request is still answered");
        assert!(sent.len() <= 1024);
        let answer = Packet::decode_str(&sent).expect("a packet");
        assert_eq!(answer.type_str(), "tool.invoke.ack");
        assert_eq!(answer.error.as_ref().map(|e| e.code.clone()), Some(ErrorCode::PayloadTooLarge));
        assert_eq!(answer.request_id, ack.request_id, "same request_id");
        assert_eq!(answer.reply_to, ack.reply_to, "same reply_to");
        assert_eq!(answer.connector_channel_id, ack.connector_channel_id);
        assert!(!sent.contains("xxxx"), "none of the oversized result leaves");
    }

    #[test]
    fn outbound_size_rule_an_oversized_push_is_withheld_and_a_fitting_packet_passes() {
        let message = Packet::with_payload("pkt_m", ChatMessage::text("msg_1", "y".repeat(4096)))
            .channel(ConnectorChannelId::from("cch_1"));
        let text = message.to_json().expect("encodes");
        assert!(within_limit(&message, text.clone(), 1024).is_none());
        assert_eq!(within_limit(&message, text.clone(), text.len()), Some(text));
    }
}
