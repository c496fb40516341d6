//! The single-pass packet validator: the hot-path form of [`Validator::packet`].
//!
//! [`Validator::check_packet`] decodes the bytes once, straight into the typed [`Packet`]
//! (no `serde_json::Value`), checks the rules on the typed packet, and runs the secret-leak
//! rule over the strings of the same bytes with an allocation-free lexical scan (no tree, no
//! JSON pointers). It returns the typed packet when the packet is valid. A runtime that decodes
//! the packet itself runs the same typed rules on its packet with [`Validator::check_decoded`]
//! (or [`Validator::accept_decoded`]), so it decodes once. Only when it cannot
//! accept a packet does it build the report form ([`Validator::packet`], with every
//! violation and its JSON pointer), whose verdict is then final.
//!
//! So the two forms agree by construction as long as the typed form accepts nothing the report
//! form refuses; `tests/single_pass.rs` checks that on every fixture and on generated
//! mutations of them. The typed form defers to the report form, rather than guessing, when the
//! typed decode cannot tell what the report form distinguishes:
//!
//! - an explicit `null` in the envelope, in `error` or among a payload's own fields (the typed
//!   decode reads it as absent, the report form as a wrongly typed value);
//! - packet types outside the per-message set: `connector.hello(.ack)`, `channel.*`, `auth.*`,
//!   `connection.descriptor.*` and `message.push` (once per connection or channel, or legacy;
//!   several carry a whole Descriptor), which always take the report form;
//! - anything the typed decode refuses (the report form then names the violation).
//!
//! The per-message set (`tool.invoke`, `tool.invoke.ack`, `tool.progress.push`, `chat.*`,
//! `ping`, `pong`, `error`) is checked with every rule of the report form.

use xagent_protocol_types::{Packet, PacketBody, PacketType, Role, Routing};

use crate::catalog;
use crate::facts::PacketContext;
use crate::im;
use crate::report::Report;
use crate::secrets::SecretScanner;
use crate::validate::Validator;

/// The outcome of [`Validator::check_packet`].
pub type Checked = Result<Packet, Report>;

impl Validator {
    /// Validates one packet given as JSON bytes: the hot-path form. Returns the typed packet
    /// when it breaks no error rule (warnings are not computed), else the full report of
    /// [`Validator::packet`]. Same verdict as `Validator::packet` on the parsed bytes.
    pub fn check_packet(&self, bytes: &[u8], context: PacketContext<'_>) -> Checked {
        if let Some(packet) = self.accept_packet(bytes, context) {
            return Ok(packet);
        }
        let report = self.packet_bytes(bytes, context);
        if report.valid {
            // The report form accepted what the typed form deferred (a control packet, a
            // `null`): decode it for the caller.
            return Packet::decode(bytes).map_err(|e| {
                Report::new(vec![
                    crate::rules::PACKET_PAYLOAD_INVALID.at("/payload", e.to_string()),
                ])
            });
        }
        Err(report)
    }

    /// True when the packet breaks no error rule: the verdict of [`Validator::check_packet`]
    /// without keeping the packet (the report form runs only when the typed form defers).
    pub fn packet_is_valid(&self, bytes: &[u8], context: PacketContext<'_>) -> bool {
        self.accept_packet(bytes, context).is_some() || self.packet_bytes(bytes, context).valid
    }

    /// The report form on bytes: parse into a `Value` and run [`Validator::packet`]; text that
    /// is not JSON (or not UTF-8) gets `document.not_json`.
    pub fn packet_bytes(&self, bytes: &[u8], context: PacketContext<'_>) -> Report {
        match std::str::from_utf8(bytes) {
            Ok(text) => match crate::parse_document(text) {
                Ok(value) => self.packet(&value, context),
                Err(report) => report,
            },
            Err(_) => Report::new(vec![
                crate::rules::DOCUMENT_NOT_JSON
                    .at("", "the packet is not UTF-8; JSON text must be UTF-8"),
            ]),
        }
    }

    /// The typed form alone: `Some(packet)` when it can prove the packet valid, `None` when it
    /// found a violation or cannot decide (see the module docs). Public so tests and
    /// benchmarks can tell the two paths apart; callers want [`Validator::check_packet`].
    pub fn accept_packet(&self, bytes: &[u8], context: PacketContext<'_>) -> Option<Packet> {
        let packet = Packet::decode(bytes).ok()?;
        self.accept_decoded(&packet, bytes, context).then_some(packet)
    }

    /// The typed form on a packet the caller has already decoded from `bytes` (with
    /// [`Packet::decode`]), so a runtime that needs the typed packet anyway decodes once: the
    /// same rules and verdict as [`Validator::accept_packet`] without its decode. `true` when
    /// it can prove the packet valid; `false` for a violation or a packet it leaves to the
    /// report form (see the module docs), whose verdict is then final
    /// ([`Validator::check_decoded`] does both). `packet` must be the decode of `bytes`: the
    /// secret-leak rule and the explicit-`null` check read the bytes, the other rules the
    /// packet.
    pub fn accept_decoded(
        &self,
        packet: &Packet,
        bytes: &[u8],
        context: PacketContext<'_>,
    ) -> bool {
        let Some(spec) = PacketType::spec_of(packet.type_str()) else {
            return false;
        };
        // A packet type only one side sends is judged as sent by that side (as the report form).
        let context = PacketContext {
            sender: context.sender.or(crate::facts::only_sender(spec.direction)),
            ..context
        };
        // Envelope rules the typed decode does not already enforce.
        if let Some(error) = &packet.error
            && error.code.as_str().is_empty()
        {
            return false;
        }
        let has_request_id = packet.request_id.as_ref().is_some_and(|r| !r.is_empty());
        if matches!(spec.role, Role::Request { .. } | Role::Ack { .. })
            && spec.routing != Routing::Either
            && !has_request_id
        {
            return false;
        }
        if spec.role == Role::MessageAck && packet.reply_to.as_ref().is_none_or(|r| r.is_empty()) {
            return false;
        }
        let channel = packet.connector_channel_id.as_ref().filter(|c| !c.is_empty());
        if spec.routing == Routing::Channel && channel.is_none() {
            return false;
        }
        if let (Some(card), Some(profile)) =
            (context.card, catalog::owning_profile(packet.type_str()))
            && !card.profiles.iter().any(|p| p == profile.id)
        {
            return false;
        }
        if !payload_ok(packet, context) {
            return false;
        }
        scan(bytes, &self.scanner).is_some_and(|facts| !facts.leak)
    }

    /// [`Validator::check_packet`] for a packet the caller has already decoded from `bytes`:
    /// `Ok` when it breaks no error rule, else the full report of [`Validator::packet`] (with
    /// every violation and its JSON pointer). The typed form runs on `packet` (no second
    /// decode); only a packet it cannot accept is parsed again for the report.
    pub fn check_decoded(
        &self,
        packet: &Packet,
        bytes: &[u8],
        context: PacketContext<'_>,
    ) -> Result<(), Report> {
        if self.accept_decoded(packet, bytes, context) {
            return Ok(());
        }
        let report = self.packet_bytes(bytes, context);
        if report.valid { Ok(()) } else { Err(report) }
    }
}

/// The payload rules of the per-message packet types, on the typed payload: the shared rule
/// functions of [`im`] for the IM packets. `false` for a violation or a type this form leaves
/// to the report form.
fn payload_ok(packet: &Packet, context: PacketContext<'_>) -> bool {
    let failed = packet.error.is_some();
    match &packet.body {
        PacketBody::Ping(_) | PacketBody::Pong(_) => true,
        PacketBody::Error(_) => failed,
        PacketBody::ToolInvoke(invoke) => {
            !invoke.tool_id.is_empty()
                && context
                    .card
                    .is_none_or(|c| c.tool_ids.iter().any(|t| t == invoke.tool_id.as_str()))
        }
        PacketBody::ToolInvokeAck(ack) => {
            ack.is_some()
                || failed
                || !PacketType::ack_needs_payload_unless_error("tool.invoke.ack")
        }
        PacketBody::ToolProgressPush(push) => {
            !push.tool_id.is_empty() && push.progress.is_none_or(|p| (0.0..=1.0).contains(&p))
        }
        PacketBody::ChatMessage(message) => {
            im::passes(|visit| im::check_typed_chat_message(message, context.sender, visit))
        }
        PacketBody::ChatMessageDelta(delta) => {
            im::passes(|visit| im::check_typed_delta(delta, visit))
        }
        PacketBody::ChatMessageAck(ack) => im::passes(|visit| im::check_typed_ack(ack, visit)),
        PacketBody::ChatActivity(activity) => {
            im::passes(|visit| im::check_typed_activity(activity, visit))
        }
        // Control, Descriptor-carrying and legacy packets: the report form decides.
        _ => false,
    }
}

/// What the lexical scan of the packet text found.
struct ScanFacts {
    /// A string would be reported by the secret-leak rule.
    leak: bool,
}

/// One open object or array during the scan.
struct Frame<'t> {
    object: bool,
    /// The key of the member being read (objects only).
    key: Option<std::borrow::Cow<'t, str>>,
    /// The next string in this object is a key.
    expect_key: bool,
}

/// Walks the JSON text once, without building a tree: every string (keys and values) goes
/// through the secret scanner exactly as the report form's tree walk would see it, and an
/// explicit `null` where the typed decode would hide it makes the scan give up (`None`). The
/// text was already accepted by the typed decode, so it is well-formed JSON; anything
/// unexpected also gives up.
fn scan(bytes: &[u8], scanner: &SecretScanner) -> Option<ScanFacts> {
    let text = std::str::from_utf8(bytes).ok()?;
    let b = text.as_bytes();
    let mut stack: Vec<Frame<'_>> = Vec::with_capacity(8);
    let mut leak = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b' ' | b'\t' | b'\n' | b'\r' | b',' | b':' => {
                if b[i] == b','
                    && let Some(top) = stack.last_mut()
                    && top.object
                {
                    top.expect_key = true;
                    top.key = None;
                }
                i += 1;
            }
            b'{' | b'[' => {
                stack.push(Frame { object: b[i] == b'{', key: None, expect_key: b[i] == b'{' });
                i += 1;
            }
            b'}' | b']' => {
                stack.pop();
                i += 1;
            }
            b'"' => {
                let start = i + 1;
                let mut j = start;
                let mut escaped = false;
                while j < b.len() && b[j] != b'"' {
                    if b[j] == b'\\' {
                        escaped = true;
                        j += 1;
                    }
                    j += 1;
                }
                if j >= b.len() {
                    return None;
                }
                let value: std::borrow::Cow<'_, str> = if escaped {
                    std::borrow::Cow::Owned(serde_json::from_str::<String>(&text[i..=j]).ok()?)
                } else {
                    std::borrow::Cow::Borrowed(&text[start..j])
                };
                i = j + 1;
                match stack.last_mut() {
                    Some(top) if top.object && top.expect_key => {
                        leak |= scanner.string_leaks(&value, true, None);
                        top.key = Some(value);
                        top.expect_key = false;
                    }
                    Some(top) => {
                        let key = if top.object { top.key.as_deref() } else { None };
                        leak |= scanner.string_leaks(&value, false, key);
                    }
                    None => leak |= scanner.string_leaks(&value, false, None),
                }
            }
            b'n' => {
                // `null`: hidden by the typed decode in the envelope (depth 1, except `payload`
                // and `error`, which both forms read as absent) and in the direct members of
                // `payload` and `error` (depth 2).
                let depth = stack.len();
                let key = stack.last().and_then(|f| f.key.as_deref());
                let in_object = stack.last().is_some_and(|f| f.object);
                let absent_alike = depth == 1 && matches!(key, Some("payload" | "error"));
                if in_object && depth <= 2 && !absent_alike {
                    return None;
                }
                i += 4;
            }
            _ => {
                // Numbers, `true`, `false`: skip to the next delimiter.
                while i < b.len()
                    && !matches!(b[i], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                {
                    i += 1;
                }
            }
        }
    }
    Some(ScanFacts { leak })
}
