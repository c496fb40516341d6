//! Packets: hello and hello.ack, the envelope and each payload's rules.

use std::ops::ControlFlow;

use serde_json::{Map, Value};
use xagent_protocol_types::{
    AuthStatus, PACKET_SCHEMA as PACKET_SCHEMA_ID, Packet, PacketType, Role, Routing, Side,
};

use super::json::*;
use super::validator::Validator;
use crate::catalog;
use crate::facts::*;
use crate::im;
use crate::report::{Report, Rule, Severity, Sink, child};
use crate::rules::*;

impl Validator {
    /// Validates a `connector.hello` payload against the Card (Connector-side admission).
    pub fn hello(&self, payload: &Value, card: &CardFacts) -> Report {
        let mut sink = Sink::default();
        self.hello_at(&mut sink, payload, "", Some(card));
        sink.finish()
    }

    /// Validates a `connector.hello.ack` payload against the Card and the window.
    pub fn hello_ack(&self, payload: &Value, card: &CardFacts) -> Report {
        let mut sink = Sink::default();
        self.hello_ack_at(&mut sink, payload, "", Some(card));
        sink.finish()
    }

    pub(super) fn hello_at(
        &self,
        sink: &mut Sink,
        payload: &Value,
        base: &str,
        card: Option<&CardFacts>,
    ) {
        let Some(root) = payload.as_object() else { return };
        card_id_is_the_cards(sink, &HELLO_CARD_ID, root, base, card);
        let version = root.get("protocol_version");
        if version.is_some_and(|v| !v.is_string())
            || self.window.admit_hello(version.and_then(Value::as_str)).is_err()
        {
            let shown = version.and_then(Value::as_str).unwrap_or("omitted, read as 1.0");
            sink.push(
                &HELLO_PROTOCOL_VERSION,
                child(base, "protocol_version"),
                format!("protocol_version {shown} is not admitted; send {}", self.window.current),
            );
        }
        match root.get("supported_profiles").and_then(Value::as_array) {
            Some(list) if list.iter().all(Value::is_string) => {
                if let Some(card) = card
                    && !card.profiles.is_empty()
                    && !list
                        .iter()
                        .filter_map(Value::as_str)
                        .any(|p| card.profiles.iter().any(|c| c == p))
                {
                    sink.push(
                        &HELLO_NO_SHARED_PROFILE,
                        child(base, "supported_profiles"),
                        "no supported Profile is declared by the Card: no Profile packet can flow",
                    );
                }
            }
            _ => sink.push(
                &HELLO_SUPPORTED_PROFILES,
                child(base, "supported_profiles"),
                "supported_profiles must be sent explicitly as an array of Profile ids",
            ),
        }
    }

    pub(super) fn hello_ack_at(
        &self,
        sink: &mut Sink,
        payload: &Value,
        base: &str,
        card: Option<&CardFacts>,
    ) {
        let Some(root) = payload.as_object() else { return };
        card_id_is_the_cards(sink, &HELLO_ACK_CARD_ID, root, base, card);
        require_str(sink, &HELLO_ACK_CONNECTOR_ID, root, "connector_id", base);
        let version = root.get("protocol_version").and_then(Value::as_str);
        let in_window = self.window.admit(version).is_ok();
        let equals_card = match card.and_then(|c| c.protocol_version.as_deref()) {
            Some(card_version) => version == Some(card_version),
            None => true,
        };
        if !in_window || !equals_card {
            sink.push(
                &HELLO_ACK_PROTOCOL_VERSION,
                child(base, "protocol_version"),
                format!(
                    "protocol_version must equal the Card's and lie in {}..={}",
                    self.window.minimum, self.window.current
                ),
            );
        }
    }

    /// Validates one data-plane packet: the envelope, the fields its type requires, its
    /// payload rules and a secret scan.
    pub fn packet(&self, packet: &Value, context: PacketContext<'_>) -> Report {
        let mut sink = Sink::default();
        let Some(root) = packet.as_object() else {
            sink.push(&DOCUMENT_NOT_OBJECT, "", "a packet must be a JSON object");
            return sink.finish();
        };
        if root.get("schema").and_then(Value::as_str) != Some(PACKET_SCHEMA_ID) {
            sink.push(&PACKET_SCHEMA, "/schema", format!("schema must be \"{PACKET_SCHEMA_ID}\""));
        }
        if non_empty_str(root.get("packet_id")).is_none() {
            sink.push(&PACKET_PACKET_ID, "/packet_id", "packet_id must be a non-empty string");
        }
        for key in ["request_id", "reply_to", "connector_channel_id"] {
            if root.get(key).is_some_and(|v| !v.is_string()) {
                sink.push(&PACKET_FIELD_TYPE, child("", key), format!("{key} must be a string"));
            }
        }
        match root.get("time") {
            None => sink.push(&PACKET_TIME, "/time", "time (Unix milliseconds) is recommended"),
            Some(time) if time.as_u64().is_none() => sink.push(
                &PACKET_FIELD_TYPE,
                "/time",
                "time must be a non-negative integer (Unix ms)",
            ),
            Some(_) => {}
        }
        let payload = root.get("payload").filter(|p| !p.is_null());
        if payload.is_some_and(|p| !p.is_object()) {
            sink.push(&PACKET_FIELD_TYPE, "/payload", "payload must be an object");
        }
        let error = root.get("error").filter(|e| !e.is_null());
        if let Some(error) = error {
            if non_empty_str(error.get("code")).is_none() {
                sink.push(
                    &PACKET_ERROR_CODE,
                    "/error/code",
                    "error must be an object with a non-empty string code",
                );
            }
            if error.get("message").is_some_and(|m| !m.is_string()) {
                sink.push(&PACKET_FIELD_TYPE, "/error/message", "error.message must be a string");
            }
        }
        let Some(packet_type) = non_empty_str(root.get("type")) else {
            sink.push(&PACKET_TYPE, "/type", "type must be a non-empty string");
            self.scan(&mut sink, &PACKET_SECRET_LEAK, packet, "", "the packet");
            return sink.finish();
        };
        let Some(spec) = PacketType::spec_of(packet_type) else {
            sink.push(
                &PACKET_TYPE_UNKNOWN,
                "/type",
                format!("packet type {packet_type:?} is not supported"),
            );
            self.scan(&mut sink, &PACKET_SECRET_LEAK, packet, "", "the packet");
            return sink.finish();
        };
        // A packet type only one side sends is judged as sent by that side.
        let context =
            PacketContext { sender: context.sender.or(only_sender(spec.direction)), ..context };
        let has_request_id = non_empty_str(root.get("request_id")).is_some();
        let is_request_or_ack = matches!(spec.role, Role::Request { .. } | Role::Ack { .. });
        if is_request_or_ack && spec.routing != Routing::Either && !has_request_id {
            sink.push(
                &PACKET_REQUEST_ID,
                "/request_id",
                format!("{packet_type} needs the request_id of its exchange"),
            );
        }
        if matches!(spec.role, Role::Ack { .. }) && non_empty_str(root.get("reply_to")).is_none() {
            sink.push(
                &PACKET_REPLY_TO,
                "/reply_to",
                "an ack should set reply_to to the request's packet_id",
            );
        }
        if spec.role == Role::MessageAck && non_empty_str(root.get("reply_to")).is_none() {
            sink.push(
                &CHAT_ACK_REPLY_TO,
                "/reply_to",
                "chat.message.ack must set reply_to to the message's packet_id",
            );
        }
        let channel = non_empty_str(root.get("connector_channel_id"));
        if spec.routing == Routing::Channel && channel.is_none() {
            sink.push(
                &PACKET_CHANNEL_REQUIRED,
                "/connector_channel_id",
                format!("{packet_type} is a user-level packet; set connector_channel_id"),
            );
        }
        if spec.payload_required && payload.is_none() {
            sink.push(
                &PACKET_PAYLOAD_REQUIRED,
                "/payload",
                format!("{packet_type} needs a payload object"),
            );
        }
        if packet_type == "error" && error.is_none() {
            sink.push(
                &PACKET_ERROR_REQUIRED,
                "/error",
                "an error packet carries an error object {code, message}",
            );
        }
        if let (Some(card), Some(profile)) = (context.card, catalog::owning_profile(packet_type))
            && !card.profiles.iter().any(|p| p == profile.id)
        {
            sink.push(
                &PACKET_PROFILE_NOT_DECLARED,
                "/type",
                format!(
                    "{packet_type} belongs to Profile {}, which the Card does not declare",
                    profile.id
                ),
            );
        }
        let before = sink.violations.iter().filter(|v| v.path.starts_with("/payload")).count();
        let body = payload.and_then(Value::as_object);
        let failed = error.is_some();
        if let Some(body) = body {
            self.payload_rules(&mut sink, packet_type, body, channel, context);
        } else if !failed && PacketType::ack_needs_payload_unless_error(packet_type) {
            sink.push(
                &PACKET_PAYLOAD_REQUIRED,
                "/payload",
                format!("{packet_type} without an error needs a payload"),
            );
        }
        let after = sink.violations.iter().filter(|v| v.path.starts_with("/payload")).count();
        let no_error_yet = !sink.violations.iter().any(|v| v.severity == Severity::Error);
        if after == before && no_error_yet {
            // Everything specific passed: let the typed model find what the rules do not name.
            if let Err(e) = <Packet as serde::Deserialize>::deserialize(packet) {
                sink.push(
                    &PACKET_PAYLOAD_INVALID,
                    "/payload",
                    xagent_protocol_types::redact_quoted(&e.to_string()),
                );
            }
        }
        // auth.start legitimately carries the user's form input: leave it out of the scan.
        if packet_type == "auth.start" {
            let mut copy = packet.clone();
            if let Some(p) = copy.get_mut("payload").and_then(Value::as_object_mut) {
                p.remove("input");
            }
            self.scan(&mut sink, &PACKET_SECRET_LEAK, &copy, "", "the packet");
        } else {
            self.scan(&mut sink, &PACKET_SECRET_LEAK, packet, "", "the packet");
        }
        sink.finish()
    }

    pub(super) fn payload_rules(
        &self,
        sink: &mut Sink,
        packet_type: &str,
        body: &Map<String, Value>,
        channel: Option<&str>,
        context: PacketContext<'_>,
    ) {
        let payload = Value::Object(body.clone());
        let descriptor_context = DescriptorContext { card: context.card, channel };
        let field = |key: &str| im::Field::of(body.get(key));
        match packet_type {
            "connector.hello" => self.hello_at(sink, &payload, "/payload", context.card),
            "connector.hello.ack" => self.hello_ack_at(sink, &payload, "/payload", context.card),
            "channel.open.ack" => {
                match non_empty_str(body.get("connector_channel_id")) {
                    Some(c) if channel.is_none_or(|e| e == c) => {}
                    _ => sink.push(
                        &CHANNEL_OPEN_ACK_CHANNEL,
                        "/payload/connector_channel_id",
                        "payload.connector_channel_id is required and equals the envelope's",
                    ),
                }
                self.nested_descriptor(sink, body, true, descriptor_context);
            }
            "connection.descriptor.get.ack" | "connection.descriptor.push" => {
                self.nested_descriptor(sink, body, true, descriptor_context);
            }
            "channel.close.ack" | "auth.logout.ack" => {
                status(sink, body, &["ok"]);
                if packet_type == "auth.logout.ack" {
                    self.nested_descriptor(sink, body, false, descriptor_context);
                }
            }
            "auth.start.ack" | "auth.status.ack" => {
                let allowed: Vec<&str> = AuthStatus::KNOWN
                    .iter()
                    .copied()
                    .filter(|s| packet_type == "auth.status.ack" || *s != "unauthenticated")
                    .collect();
                status(sink, body, &allowed);
                self.nested_descriptor(sink, body, false, descriptor_context);
            }
            "auth.cancel.ack" => {
                status(sink, body, &["canceled", "ignored", "not_found"]);
                if let Some(s) = body.get("auth_status")
                    && !s.as_str().is_some_and(|s| AuthStatus::parse(s).is_known())
                {
                    sink.push(
                        &PACKET_STATUS,
                        "/payload/auth_status",
                        "auth_status must be an authentication status",
                    );
                }
                self.nested_descriptor(sink, body, false, descriptor_context);
            }
            "auth.start" => {
                if let Some(flow) = require_str(sink, &AUTH_FLOW_ID, body, "flow_id", "/payload")
                    && context.card.is_some_and(|c| !c.flow_ids.iter().any(|f| f == flow))
                {
                    sink.push(
                        &AUTH_FLOW_ID,
                        "/payload/flow_id",
                        format!("flow {flow:?} is not declared in the Card's auth_flows"),
                    );
                }
            }
            "auth.status" | "auth.cancel" => {
                require_str(sink, &AUTH_SESSION_ID, body, "auth_session_id", "/payload");
            }
            "tool.invoke" => {
                if let Some(tool) =
                    require_str(sink, &TOOL_INVOKE_TOOL_ID, body, "tool_id", "/payload")
                    && context.card.is_some_and(|c| !c.tool_ids.iter().any(|t| t == tool))
                {
                    sink.push(
                        &TOOL_INVOKE_TOOL_ID,
                        "/payload/tool_id",
                        format!("Tool {tool:?} is not declared in the Card"),
                    );
                }
                if body.get("arguments").is_some_and(|a| !a.is_object()) {
                    sink.push(
                        &TOOL_INVOKE_ARGUMENTS,
                        "/payload/arguments",
                        "arguments must be an object",
                    );
                }
            }
            "tool.progress.push" => {
                require_str(sink, &TOOL_PROGRESS_TOOL_ID, body, "tool_id", "/payload");
                if let Some(progress) = body.get("progress")
                    && !progress.as_f64().is_some_and(|p| (0.0..=1.0).contains(&p))
                {
                    sink.push(
                        &TOOL_PROGRESS_PROGRESS,
                        "/payload/progress",
                        "progress must be a number from 0 to 1",
                    );
                }
            }
            "message.push" => message_push(sink, body, context.card),
            "chat.message" => chat_message(sink, body, context.sender),
            "chat.message.delta" => walk(sink, |visit| {
                let sequence = body.get("sequence").and_then(Value::as_u64);
                let text = body.get("text").is_some_and(Value::is_string);
                im::check_delta(field("message_id"), sequence, text, keys(body), visit)
            }),
            "chat.message.ack" => walk(sink, |visit| {
                let (id, status, code) = (field("message_id"), field("status"), field("code"));
                let retryable = body.get("retryable").is_some_and(Value::is_boolean);
                im::check_ack(id, status, code, retryable, keys(body), visit)
            }),
            "chat.activity" => walk(sink, |visit| {
                im::check_activity(field("status"), field("tool_name"), keys(body), visit)
            }),
            _ => {}
        }
    }
}

/// Records a break of one of the shared IM rules ([`im`]) as a violation with its pointer; a
/// break that holds for one sender only names it.
pub(super) fn push_break(sink: &mut Sink, b: im::Break<'_>) -> ControlFlow<()> {
    let mut violation = b.rule.at(b.place.pointer(), b.hint);
    if let Some(side) = b.sender {
        violation.message.push_str(match side {
            Side::Connector => " (when the Connector sends it)",
            Side::Xagent => " (when xAgent sends it)",
        });
        violation.sender = Some(crate::report::side_name(side).to_owned());
    }
    sink.violations.push(violation);
    ControlFlow::Continue(())
}

/// Runs one of the shared IM rule walks, collecting every break.
pub(super) fn walk(sink: &mut Sink, f: impl FnOnce(&mut im::Visit<'_>) -> ControlFlow<()>) {
    let mut visit = |b: im::Break<'_>| push_break(sink, b);
    let _ = f(&mut visit);
}

pub(super) fn keys(body: &Map<String, Value>) -> impl Iterator<Item = &str> {
    body.keys().map(String::as_str)
}

pub(super) fn message_push(sink: &mut Sink, body: &Map<String, Value>, card: Option<&CardFacts>) {
    let files = body.get("files").and_then(Value::as_array).map(Vec::as_slice);
    let member = |field: &str, key: &str| body.get(field).and_then(|f| f.get(key));
    let citations = im::PushCitations {
        reply_tool_id: im::Field::of(member("reply", "tool_id")),
        skill_name: im::Field::of(member("skill", "name")),
        skill_tool_ids: member("skill", "tool_ids")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|t| im::Field::of(Some(t))),
        activation_message: im::Field::of(body.get("activation_message")),
    };
    walk(sink, |visit| {
        im::check_push(
            |key| im::Field::of(body.get(key)),
            files,
            keys(body),
            citations,
            card,
            visit,
        )
    });
}

pub(super) fn chat_message(sink: &mut Sink, body: &Map<String, Value>, sender: Option<Side>) {
    let message = im::MessageView {
        message_id: im::Field::of(body.get("message_id")),
        text: im::Field::of(body.get("text")),
        files: body.get("files").and_then(Value::as_array).map(Vec::as_slice),
        extra_keys: keys(body),
    };
    walk(sink, |visit| im::check_chat_message(message, sender, visit));
}

/// `connector_card_id` of a hello or hello.ack at `base`: a non-empty string, and the Card's
/// id when a Card is known (`rule` is the packet's own rule).
fn card_id_is_the_cards(
    sink: &mut Sink,
    rule: &Rule,
    root: &Map<String, Value>,
    base: &str,
    card: Option<&CardFacts>,
) {
    if let Some(id) = require_str(sink, rule, root, "connector_card_id", base)
        && let Some(card_id) = card.and_then(|c| c.card_id.as_deref())
        && id != card_id
    {
        sink.push(
            rule,
            child(base, "connector_card_id"),
            format!("connector_card_id must be {card_id:?}"),
        );
    }
}
