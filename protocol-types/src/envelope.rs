//! The packet envelope and two-step decoding: first the envelope with the payload left raw,
//! then the payload by `type`.

use serde::de::DeserializeOwned;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::{
    ConnectorChannelId, DecodeError, DecodeErrorKind, EnvelopeIds, PacketBody, PacketId,
    PacketType, Payload, RequestId, WireError,
};

/// One data-plane packet: the envelope fields and a typed body.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Packet {
    /// Unique id of this transmission.
    pub packet_id: PacketId,
    /// Correlates a request and its ack.
    pub request_id: Option<RequestId>,
    /// The `packet_id` this packet answers.
    pub reply_to: Option<PacketId>,
    /// The user channel (user-level packets).
    pub connector_channel_id: Option<ConnectorChannelId>,
    /// Send time, Unix milliseconds.
    pub time: Option<u64>,
    /// Protocol error (`error` packets) or business failure (acks).
    pub error: Option<WireError>,
    /// The typed payload, chosen by `type`.
    pub body: PacketBody,
}

impl Packet {
    /// A packet with a fresh id and the given body; other envelope fields are empty.
    pub fn new(packet_id: impl Into<PacketId>, body: PacketBody) -> Self {
        Self {
            packet_id: packet_id.into(),
            request_id: None,
            reply_to: None,
            connector_channel_id: None,
            time: None,
            error: None,
            body,
        }
    }

    /// A packet carrying a typed payload.
    pub fn with_payload<P: Payload>(packet_id: impl Into<PacketId>, payload: P) -> Self {
        Self::new(packet_id, payload.into_body())
    }

    /// An `error` packet.
    pub fn error(packet_id: impl Into<PacketId>, error: WireError) -> Self {
        Self { error: Some(error), ..Self::new(packet_id, PacketBody::Error(None)) }
    }

    setters! {
        /// Sets `request_id`.
        request_id(request_id: into RequestId);
        /// Sets `reply_to`.
        reply_to(reply_to: into PacketId);
        /// Sets `connector_channel_id`.
        channel(connector_channel_id: into ConnectorChannelId);
    }

    /// Sets `connector_channel_id` when one is given.
    #[must_use]
    pub fn maybe_channel(mut self, channel: Option<ConnectorChannelId>) -> Self {
        self.connector_channel_id = channel;
        self
    }

    setters! {
        /// Sets `time`.
        time(time: u64);
        /// Sets `error`.
        with_error(error: WireError);
    }

    /// Makes this packet answer `request`: same `request_id`, `reply_to` = its `packet_id`, and
    /// the same channel unless one is already set.
    #[must_use]
    pub fn answering(mut self, request: &Packet) -> Self {
        self.request_id = request.request_id.clone();
        self.reply_to = Some(request.packet_id.clone());
        if self.connector_channel_id.is_none() {
            self.connector_channel_id = request.connector_channel_id.clone();
        }
        self
    }

    /// The packet type.
    pub fn packet_type(&self) -> PacketType {
        self.body.packet_type()
    }

    /// The wire type string.
    pub fn type_str(&self) -> &str {
        self.body.type_str()
    }

    /// The typed payload, if this packet is of type `P` and carries one.
    pub fn payload<P: Payload>(&self) -> Option<&P> {
        P::from_body(&self.body)
    }

    /// Decodes a packet from JSON bytes (the fast path: the payload is parsed once, straight
    /// into its type).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        match serde_json::from_slice::<RawEnvelope<'_>>(bytes) {
            Ok(raw) => raw.into_packet(),
            Err(source) => Err(DecodeError::envelope(source, EnvelopeIds::salvage(bytes))),
        }
    }

    /// Decodes a packet from a JSON string.
    pub fn decode_str(text: &str) -> Result<Self, DecodeError> {
        Self::decode(text.as_bytes())
    }

    /// Decodes a packet from an already parsed JSON value.
    pub fn from_value(value: Value) -> Result<Self, DecodeError> {
        let ids = EnvelopeIds::from_value(&value);
        let raw: Envelope =
            serde_json::from_value(value).map_err(|source| DecodeError::envelope(source, ids))?;
        raw.into_packet()
    }

    /// The packet as a JSON value.
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::to_value(self)
    }

    /// The packet as compact JSON text, ready for a WebSocket text frame. The buffer starts
    /// at a size most packets fit (an ack with its ids is about 300 bytes), so encoding
    /// allocates once instead of growing from `serde_json`'s 128 bytes.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        let mut out = Vec::with_capacity(512);
        serde_json::to_writer(&mut out, self)?;
        String::from_utf8(out).map_err(<serde_json::Error as serde::ser::Error>::custom)
    }

    /// The ids a reply to this packet needs.
    pub fn ids(&self) -> EnvelopeIds {
        EnvelopeIds {
            packet_id: Some(self.packet_id.clone()),
            request_id: self.request_id.clone(),
            connector_channel_id: self.connector_channel_id.clone(),
            packet_type: Some(self.type_str().to_owned()),
        }
    }
}

impl Serialize for Packet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("schema", crate::PACKET_SCHEMA)?;
        map.serialize_entry("packet_id", &self.packet_id)?;
        if let Some(request_id) = &self.request_id {
            map.serialize_entry("request_id", request_id)?;
        }
        if let Some(reply_to) = &self.reply_to {
            map.serialize_entry("reply_to", reply_to)?;
        }
        if let Some(channel) = &self.connector_channel_id {
            map.serialize_entry("connector_channel_id", channel)?;
        }
        map.serialize_entry("type", self.body.type_str())?;
        if let Some(time) = self.time {
            map.serialize_entry("time", &time)?;
        }
        self.body.serialize_payload(&mut map)?;
        if let Some(error) = &self.error {
            map.serialize_entry("error", error)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Packet {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Envelope::deserialize(deserializer)?;
        raw.into_packet().map_err(serde::de::Error::custom)
    }
}

/// Where a payload is read from: a raw slice of the original text, or a parsed value.
pub(crate) trait PayloadSource {
    fn parse<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error>;
    fn to_value(&self) -> Result<Value, serde_json::Error>;
    fn is_object(&self) -> bool;
}

impl PayloadSource for &RawValue {
    fn parse<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.get())
    }
    fn to_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(self.get())
    }
    fn is_object(&self) -> bool {
        self.get().trim_start().starts_with('{')
    }
}

impl PayloadSource for Value {
    fn parse<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(self)
    }
    fn to_value(&self) -> Result<Value, serde_json::Error> {
        Ok(self.clone())
    }
    fn is_object(&self) -> bool {
        self.is_object()
    }
}

/// Why a payload could not be read.
#[derive(Debug)]
pub(crate) enum PayloadError {
    Missing,
    Invalid(serde_json::Error),
}

impl From<serde_json::Error> for PayloadError {
    fn from(source: serde_json::Error) -> Self {
        Self::Invalid(source)
    }
}

#[derive(Deserialize)]
struct RawEnvelope<'a> {
    schema: std::borrow::Cow<'a, str>,
    packet_id: PacketId,
    #[serde(default)]
    request_id: Option<RequestId>,
    #[serde(default)]
    reply_to: Option<PacketId>,
    #[serde(default)]
    connector_channel_id: Option<ConnectorChannelId>,
    #[serde(rename = "type")]
    packet_type: std::borrow::Cow<'a, str>,
    #[serde(default)]
    time: Option<u64>,
    #[serde(default, borrow)]
    payload: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<WireError>,
}

const_str!(
    /// The `schema` discriminator of a packet: always `xagent.connector.packet/v1`.
    PacketSchema = "xagent.connector.packet/v1"
);

/// The envelope alone, with the payload kept as JSON: the first step of decoding, and what a
/// relay forwards unchanged. [`Envelope::into_packet`] is the second step. Unknown envelope
/// fields are kept in `extra`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Envelope {
    /// The `schema` string as received (checked by `into_packet`).
    pub schema: String,
    /// `packet_id`.
    pub packet_id: PacketId,
    /// `request_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<RequestId>,
    /// `reply_to`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<PacketId>,
    /// `connector_channel_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector_channel_id: Option<ConnectorChannelId>,
    /// `type`.
    #[serde(rename = "type")]
    pub packet_type: String,
    /// `time`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<u64>,
    /// The raw payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
    /// Unknown envelope fields.
    #[serde(flatten)]
    pub extra: crate::Extra,
}

struct EnvelopeParts<S> {
    schema_ok: bool,
    schema: String,
    packet: Packet,
    packet_type: String,
    payload: Option<S>,
}

fn finish<S: PayloadSource>(parts: EnvelopeParts<S>) -> Result<Packet, DecodeError> {
    let EnvelopeParts { schema_ok, schema, mut packet, packet_type, payload } = parts;
    let ids = EnvelopeIds {
        packet_id: Some(packet.packet_id.clone()),
        request_id: packet.request_id.clone(),
        connector_channel_id: packet.connector_channel_id.clone(),
        packet_type: Some(packet_type.clone()),
    };
    if !schema_ok {
        return Err(DecodeError { kind: DecodeErrorKind::WrongSchema(schema), ids: Box::new(ids) });
    }
    if packet.packet_id.is_empty() {
        return Err(DecodeError {
            kind: DecodeErrorKind::EmptyField("packet_id"),
            ids: ids.clone().into(),
        });
    }
    if packet_type.is_empty() {
        return Err(DecodeError {
            kind: DecodeErrorKind::EmptyField("type"),
            ids: ids.clone().into(),
        });
    }
    // `payload: null` is treated as absent.
    if let Some(source) = &payload
        && !source.is_object()
    {
        return Err(DecodeError { kind: DecodeErrorKind::PayloadNotObject, ids: ids.into() });
    }
    let has_error = packet.error.is_some();
    match PacketBody::decode(&packet_type, payload, has_error) {
        Ok(body) => {
            packet.body = body;
            Ok(packet)
        }
        Err(PayloadError::Missing) => Err(DecodeError {
            kind: DecodeErrorKind::MissingPayload(packet_type),
            ids: ids.clone().into(),
        }),
        Err(PayloadError::Invalid(source)) => Err(DecodeError {
            kind: DecodeErrorKind::InvalidPayload { packet_type, source },
            ids: ids.into(),
        }),
    }
}

/// The envelope fields of `$envelope` (a `RawEnvelope` or an [`Envelope`], which name them
/// alike) as a packet whose body is decoded next.
macro_rules! packet_head {
    ($envelope:ident) => {
        Packet {
            packet_id: $envelope.packet_id,
            request_id: $envelope.request_id,
            reply_to: $envelope.reply_to,
            connector_channel_id: $envelope.connector_channel_id,
            time: $envelope.time,
            error: $envelope.error,
            body: PacketBody::Error(None),
        }
    };
}

impl<'a> RawEnvelope<'a> {
    fn into_packet(self) -> Result<Packet, DecodeError> {
        let payload = self.payload.filter(|raw| raw.get().trim() != "null");
        finish(EnvelopeParts {
            schema_ok: self.schema == crate::PACKET_SCHEMA,
            schema: self.schema.into_owned(),
            packet: packet_head!(self),
            packet_type: self.packet_type.into_owned(),
            payload,
        })
    }
}

impl Envelope {
    /// Parses the payload by `type` into a typed [`Packet`] (unknown envelope fields are not
    /// carried over).
    pub fn into_packet(self) -> Result<Packet, DecodeError> {
        let payload = self.payload.filter(|value| !value.is_null());
        finish(EnvelopeParts {
            schema_ok: self.schema == crate::PACKET_SCHEMA,
            schema: self.schema,
            packet: packet_head!(self),
            packet_type: self.packet_type,
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChatMessage, ChatMessageAck, ErrorCode, ToolInvoke, ToolInvokeAck};
    use serde_json::json;

    #[test]
    fn exact_round_trip_of_a_request() {
        let wire = json!({
            "schema": "xagent.connector.packet/v1",
            "packet_id": "pkt_1",
            "request_id": "req_1",
            "connector_channel_id": "cch_1",
            "type": "tool.invoke",
            "time": 1_790_000_000_000u64,
            "payload": { "tool_id": "t", "arguments": { "x": 1 }, "future": true }
        });
        let packet = Packet::from_value(wire.clone()).expect("decodes");
        let invoke: &ToolInvoke = packet.payload().expect("tool.invoke");
        assert_eq!(invoke.tool_id, "t");
        assert_eq!(invoke.extra["future"], json!(true), "unknown payload fields are kept");
        assert_eq!(packet.to_value().expect("encodes"), wire);
    }

    #[test]
    fn answering_copies_request_id_reply_to_and_channel() {
        let request = Packet::with_payload("pkt_req", ToolInvoke::new("t", Default::default()))
            .request_id("req_7")
            .channel("cch_7");
        let ack = Packet::with_payload("pkt_ack", ToolInvokeAck::new("t", json!({"ok": true})))
            .answering(&request);
        assert_eq!(ack.request_id.as_ref().map(RequestId::as_str), Some("req_7"));
        assert_eq!(ack.reply_to.as_ref().map(PacketId::as_str), Some("pkt_req"));
        assert_eq!(ack.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_7"));
    }

    #[test]
    fn ack_with_error_and_no_payload_decodes() {
        let packet = Packet::decode_str(
            r#"{"schema":"xagent.connector.packet/v1","packet_id":"p","request_id":"r","type":"channel.open.ack","error":{"code":"connection_not_found"}}"#,
        )
        .expect("an ack may carry only an error");
        assert!(matches!(packet.body, PacketBody::ChannelOpenAck(None)));
        assert_eq!(packet.error.map(|e| e.code), Some(ErrorCode::ConnectionNotFound));
    }

    #[test]
    fn null_payload_counts_as_absent() {
        let packet = Packet::decode_str(
            r#"{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"ping","payload":null}"#,
        )
        .expect("decodes");
        assert!(matches!(packet.body, PacketBody::Ping(None)));
    }

    #[test]
    fn request_and_ack_types_are_bound() {
        fn ack_type<R: crate::Request>() -> &'static str {
            <R::Ack as Payload>::TYPE
        }
        assert_eq!(ack_type::<ToolInvoke>(), "tool.invoke.ack");
        assert_eq!(ack_type::<ChatMessage>(), ChatMessageAck::TYPE);
        assert_eq!(ack_type::<crate::ConnectorHello>(), "connector.hello.ack");
    }

    #[test]
    fn every_table_entry_round_trips_its_type_string() {
        for spec in PacketType::TABLE {
            let parsed = PacketType::parse(spec.packet_type);
            assert!(parsed.is_known());
            assert_eq!(parsed.as_str(), spec.packet_type);
            assert_eq!(parsed.spec(), Some(spec));
        }
    }

    #[test]
    fn error_packet_encodes_code_and_message() {
        let packet =
            Packet::error("pkt_e", WireError::hello_required("send connector.hello first"))
                .request_id("req_1");
        let value = packet.to_value().expect("encodes");
        assert_eq!(value["type"], "error");
        assert_eq!(value["error"]["code"], "hello_required");
        assert!(value.get("payload").is_none());
    }
}
