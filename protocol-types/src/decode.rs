//! Why a packet could not be decoded, the envelope ids salvaged for the error reply, and the
//! redaction of parser messages.

use serde_json::Value;

use crate::{ConnectorChannelId, ErrorCode, PacketId, RequestId, WireError};

/// The envelope ids that could be read from a packet, even a broken one, so that an error
/// reply can still echo `request_id` and the channel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnvelopeIds {
    /// `packet_id`, if it was a string.
    pub packet_id: Option<PacketId>,
    /// `request_id`, if it was a string.
    pub request_id: Option<RequestId>,
    /// `connector_channel_id`, if it was a string.
    pub connector_channel_id: Option<ConnectorChannelId>,
    /// `type`, if it was a string.
    pub packet_type: Option<String>,
}

impl EnvelopeIds {
    pub(crate) fn salvage(bytes: &[u8]) -> Self {
        serde_json::from_slice::<Value>(bytes)
            .map(|value| Self::from_value(&value))
            .unwrap_or_default()
    }

    pub(crate) fn from_value(value: &Value) -> Self {
        let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        Self {
            packet_id: text("packet_id").map(PacketId::from),
            request_id: text("request_id").map(RequestId::from),
            connector_channel_id: text("connector_channel_id").map(ConnectorChannelId::from),
            packet_type: text("type"),
        }
    }
}

/// Why a packet could not be decoded. Every case maps to `invalid_packet`.
#[derive(Debug)]
#[non_exhaustive]
pub struct DecodeError {
    /// What went wrong.
    pub kind: DecodeErrorKind,
    /// The envelope ids that could be salvaged.
    pub ids: Box<EnvelopeIds>,
}

/// The cases of [`DecodeError`].
#[derive(Debug)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// Not JSON, not an object, or an envelope field of the wrong type or missing.
    Envelope(serde_json::Error),
    /// `schema` is not `xagent.connector.packet/v1`.
    WrongSchema(String),
    /// A required envelope string is empty.
    EmptyField(&'static str),
    /// `payload` is present but not an object.
    PayloadNotObject,
    /// The type needs a payload and there is none.
    MissingPayload(String),
    /// The payload does not match its type.
    InvalidPayload {
        /// The packet type.
        packet_type: String,
        /// The parse error.
        source: serde_json::Error,
    },
}

impl DecodeError {
    pub(crate) fn envelope(source: serde_json::Error, ids: EnvelopeIds) -> Self {
        Self { kind: DecodeErrorKind::Envelope(source), ids: Box::new(ids) }
    }

    /// The wire code to answer with: always `invalid_packet`.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::InvalidPacket
    }

    /// The wire error to answer with.
    pub fn to_wire(&self) -> WireError {
        WireError::new(self.code(), self.to_string())
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            DecodeErrorKind::Envelope(source) => write!(
                f,
                "the packet is not a valid envelope ({}); send one JSON object with schema, packet_id and type",
                redact_quoted(&source.to_string())
            ),
            DecodeErrorKind::WrongSchema(schema) => {
                write!(f, "envelope schema is {schema:?}; it must be \"{}\"", crate::PACKET_SCHEMA)
            }
            DecodeErrorKind::EmptyField(field) => {
                write!(f, "envelope field {field} must not be empty")
            }
            DecodeErrorKind::PayloadNotObject => f.write_str("payload must be a JSON object"),
            DecodeErrorKind::MissingPayload(packet_type) => {
                write!(f, "a {packet_type} packet needs a payload object")
            }
            DecodeErrorKind::InvalidPayload { packet_type, source } => {
                write!(f, "invalid {packet_type} payload: {}", redact_quoted(&source.to_string()))
            }
        }
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            DecodeErrorKind::Envelope(source) => Some(source),
            DecodeErrorKind::InvalidPayload { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A parser message with every quoted part (between `"` or backticks) replaced by `"…"`:
/// parser messages quote offending values, which could be secrets, so the shape stays and the
/// text goes. The one redaction of decode errors, here and in `xagent-protocol-validate`.
pub fn redact_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut inside = false;
    for c in message.chars() {
        if c == '"' || c == '`' {
            if !inside {
                out.push_str("\"…\"");
            }
            inside = !inside;
        } else if !inside {
            out.push(c);
        }
    }
    out
}
