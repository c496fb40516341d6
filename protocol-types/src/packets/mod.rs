//! Every packet type: its payload, its direction, its routing level, and how requests bind to
//! their acks.

mod auth;
mod channel;
mod connection;
mod im;
mod spec;
mod tool;

pub use auth::*;
pub use channel::*;
pub use connection::*;
pub use im::*;
pub use spec::*;
pub use tool::*;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A typed packet payload bound to its wire `type`.
pub trait Payload: Serialize + DeserializeOwned + Sized {
    /// The wire `type`.
    const TYPE: &'static str;
    /// Wraps the payload into the packet body enum.
    fn into_body(self) -> PacketBody;
    /// Borrows the payload out of a body of the right variant.
    fn from_body(body: &PacketBody) -> Option<&Self>;
    /// Static facts about this packet type.
    fn spec() -> &'static PacketSpec {
        match PacketType::spec_of(Self::TYPE) {
            Some(spec) => spec,
            None => unreachable!("every payload type is in the packet table"),
        }
    }
}

/// A request payload and the ack payload that answers it, so a caller cannot await the wrong
/// reply.
pub trait Request: Payload {
    /// The ack payload.
    type Ack: Payload;
}

macro_rules! packet_table {
    (
        $(
            $(#[$doc:meta])*
            $variant:ident = $wire:literal, $payload:ty, $dir:ident, $routing:ident, $role:expr, $presence:ident;
        )+
    ) => {
        /// The type of a packet: every known type, or an unknown one kept verbatim.
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum PacketType {
            $( $(#[$doc])* $variant, )+
            /// The `error` packet.
            Error,
            /// A type this version does not know.
            Unknown(String),
        }

        impl PacketType {
            /// Static facts about every known type, in protocol order.
            pub const TABLE: &'static [PacketSpec] = &[
                $( PacketSpec {
                    packet_type: $wire,
                    direction: Direction::$dir,
                    routing: Routing::$routing,
                    role: $role,
                    payload_required: packet_table!(@required $presence),
                }, )+
                PacketSpec {
                    packet_type: "error",
                    direction: Direction::Both,
                    routing: Routing::Either,
                    role: Role::Error,
                    payload_required: false,
                },
            ];

            /// Reads a wire type.
            pub fn parse(value: &str) -> Self {
                match value {
                    $( $wire => Self::$variant, )+
                    "error" => Self::Error,
                    other => Self::Unknown(other.to_owned()),
                }
            }

            /// The wire string.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $wire, )+
                    Self::Error => "error",
                    Self::Unknown(other) => other,
                }
            }

            /// Static facts, or `None` for an unknown type.
            pub fn spec(&self) -> Option<&'static PacketSpec> {
                Self::spec_of(self.as_str())
            }

            /// Static facts of a wire type string.
            pub fn spec_of(wire: &str) -> Option<&'static PacketSpec> {
                Self::TABLE.iter().find(|spec| spec.packet_type == wire)
            }
        }

        /// The payload of a packet, chosen by its `type`. Optional payloads (empty requests and
        /// acks that may carry an `error` instead) are `Option`s. Payloads larger than a JSON
        /// `Value` are boxed so a [`crate::Packet`] stays small as it moves from decode to the
        /// write queue; build bodies with [`Payload::into_body`] or `PacketBody::from(payload)`
        /// rather than writing `Box::new`.
        #[derive(Clone, Debug, PartialEq)]
        #[non_exhaustive]
        pub enum PacketBody {
            $( $(#[$doc])* $variant(packet_table!(@slot $presence $payload)), )+
            /// The `error` packet; the error is in the envelope. Any payload is kept.
            Error(Option<Value>),
            /// A type this version does not know, with its raw payload, so it can be answered
            /// with `unsupported_packet` or relayed.
            Unknown {
                /// The wire type.
                packet_type: String,
                /// The raw payload (boxed: unknown types are rare and a `Value` is large).
                payload: Option<Box<Value>>,
            },
        }

        impl PacketBody {
            /// The packet type of this body.
            pub fn packet_type(&self) -> PacketType {
                match self {
                    $( Self::$variant(_) => PacketType::$variant, )+
                    Self::Error(_) => PacketType::Error,
                    Self::Unknown { packet_type, .. } => PacketType::Unknown(packet_type.clone()),
                }
            }

            /// The wire type string.
            pub fn type_str(&self) -> &str {
                match self {
                    $( Self::$variant(_) => $wire, )+
                    Self::Error(_) => "error",
                    Self::Unknown { packet_type, .. } => packet_type,
                }
            }

            /// The payload as JSON, or `None` when absent.
            pub fn payload_value(&self) -> Result<Option<Value>, serde_json::Error> {
                match self {
                    $( Self::$variant(payload) => packet_table!(@to_value $presence payload), )+
                    Self::Error(payload) => Ok(payload.clone()),
                    Self::Unknown { payload, .. } => Ok(payload.as_deref().cloned()),
                }
            }

            pub(crate) fn serialize_payload<M: serde::ser::SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
                match self {
                    $( Self::$variant(payload) => packet_table!(@serialize $presence map payload), )+
                    Self::Error(Some(payload)) => map.serialize_entry("payload", payload),
                    Self::Unknown { payload: Some(payload), .. } => map.serialize_entry("payload", &**payload),
                    Self::Error(None) | Self::Unknown { payload: None, .. } => Ok(()),
                }
            }

            pub(crate) fn decode<S: crate::envelope::PayloadSource>(
                packet_type: &str,
                payload: Option<S>,
                has_error: bool,
            ) -> Result<Self, crate::envelope::PayloadError> {
                match packet_type {
                    $( $wire => Ok(Self::$variant(packet_table!(@decode $presence $payload, payload, has_error, $wire))), )+
                    "error" => Ok(Self::Error(match payload {
                        Some(source) => Some(source.to_value()?),
                        None => None,
                    })),
                    other => Ok(Self::Unknown {
                        packet_type: other.to_owned(),
                        payload: match payload {
                            Some(source) => Some(Box::new(source.to_value()?)),
                            None => None,
                        },
                    }),
                }
            }

            /// JSON Schema of every known payload, by wire type.
            pub fn payload_schemas(generator: &mut schemars::SchemaGenerator) -> Vec<(&'static str, schemars::Schema)> {
                vec![ $( ($wire, generator.subschema_for::<$payload>()), )+ ]
            }
        }

        $(
            impl Payload for $payload {
                const TYPE: &'static str = $wire;
                fn into_body(self) -> PacketBody {
                    PacketBody::$variant(packet_table!(@wrap $presence self))
                }
                fn from_body(body: &PacketBody) -> Option<&Self> {
                    match body {
                        PacketBody::$variant(payload) => packet_table!(@borrow $presence payload),
                        _ => None,
                    }
                }
            }

            impl From<$payload> for PacketBody {
                fn from(payload: $payload) -> Self {
                    payload.into_body()
                }
            }
        )+
    };

    (@required required) => { true };
    (@required optional) => { false };
    (@required boxed) => { true };
    (@required boxed_optional) => { false };
    (@slot required $payload:ty) => { $payload };
    (@slot optional $payload:ty) => { Option<$payload> };
    (@slot boxed $payload:ty) => { Box<$payload> };
    (@slot boxed_optional $payload:ty) => { Option<Box<$payload>> };
    (@wrap required $value:ident) => { $value };
    (@wrap optional $value:ident) => { Some($value) };
    (@wrap boxed $value:ident) => { Box::new($value) };
    (@wrap boxed_optional $value:ident) => { Some(Box::new($value)) };
    (@borrow required $value:ident) => { Some($value) };
    (@borrow optional $value:ident) => { $value.as_ref() };
    (@borrow boxed $value:ident) => { Some(&**$value) };
    (@borrow boxed_optional $value:ident) => { $value.as_deref() };
    (@to_value required $value:ident) => { serde_json::to_value($value).map(Some) };
    (@to_value boxed $value:ident) => { serde_json::to_value(&**$value).map(Some) };
    (@to_value optional $value:ident) => {
        match $value {
            Some(value) => serde_json::to_value(value).map(Some),
            None => Ok(None),
        }
    };
    (@to_value boxed_optional $value:ident) => {
        match $value {
            Some(value) => serde_json::to_value(&**value).map(Some),
            None => Ok(None),
        }
    };
    (@serialize required $map:ident $value:ident) => { $map.serialize_entry("payload", $value) };
    (@serialize boxed $map:ident $value:ident) => { $map.serialize_entry("payload", &**$value) };
    (@serialize optional $map:ident $value:ident) => {
        match $value {
            Some(value) => $map.serialize_entry("payload", value),
            None => Ok(()),
        }
    };
    (@serialize boxed_optional $map:ident $value:ident) => {
        match $value {
            Some(value) => $map.serialize_entry("payload", &**value),
            None => Ok(()),
        }
    };
    (@decode required $payload:ty, $source:ident, $has_error:ident, $wire:literal) => {
        match $source {
            Some(source) => source.parse::<$payload>()?,
            None => return Err(crate::envelope::PayloadError::Missing),
        }
    };
    (@decode boxed $payload:ty, $source:ident, $has_error:ident, $wire:literal) => {
        match $source {
            Some(source) => Box::new(source.parse::<$payload>()?),
            None => return Err(crate::envelope::PayloadError::Missing),
        }
    };
    (@decode optional $payload:ty, $source:ident, $has_error:ident, $wire:literal) => {{
        let _ = $has_error;
        match $source {
            Some(source) => Some(source.parse::<$payload>()?),
            None => None,
        }
    }};
    (@decode boxed_optional $payload:ty, $source:ident, $has_error:ident, $wire:literal) => {{
        let _ = $has_error;
        match $source {
            Some(source) => Some(Box::new(source.parse::<$payload>()?)),
            None => None,
        }
    }};
}

// Presence: `required` / `optional` keep the payload inline (payloads no larger than a JSON
// `Value`, 72 bytes); `boxed` / `boxed_optional` box it (measured 96 to 776 bytes), so a
// `PacketBody` is about 80 bytes instead of 776 and a `Packet` about 240 instead of 936.
packet_table! {
    /// `connector.hello`.
    ConnectorHello = "connector.hello", ConnectorHello, XagentToConnector, System, Role::Request { ack: "connector.hello.ack" }, boxed;
    /// `connector.hello.ack`.
    ConnectorHelloAck = "connector.hello.ack", ConnectorHelloAck, ConnectorToXagent, System, Role::Ack { request: "connector.hello" }, boxed_optional;
    /// `channel.open`.
    ChannelOpen = "channel.open", ChannelOpen, XagentToConnector, ChannelOpen, Role::Request { ack: "channel.open.ack" }, optional;
    /// `channel.open.ack`.
    ChannelOpenAck = "channel.open.ack", ChannelOpenAck, ConnectorToXagent, Channel, Role::Ack { request: "channel.open" }, boxed_optional;
    /// `channel.close`.
    ChannelClose = "channel.close", ChannelClose, XagentToConnector, Channel, Role::Request { ack: "channel.close.ack" }, optional;
    /// `channel.close.ack`.
    ChannelCloseAck = "channel.close.ack", ChannelCloseAck, ConnectorToXagent, Channel, Role::Ack { request: "channel.close" }, boxed_optional;
    /// `auth.start`.
    AuthStart = "auth.start", AuthStart, XagentToConnector, Channel, Role::Request { ack: "auth.start.ack" }, boxed;
    /// `auth.start.ack`.
    AuthStartAck = "auth.start.ack", AuthStartAck, ConnectorToXagent, Channel, Role::Ack { request: "auth.start" }, boxed_optional;
    /// `auth.status`.
    AuthStatus = "auth.status", AuthStatusRequest, XagentToConnector, Channel, Role::Request { ack: "auth.status.ack" }, boxed;
    /// `auth.status.ack`.
    AuthStatusAck = "auth.status.ack", AuthStatusAck, ConnectorToXagent, Channel, Role::Ack { request: "auth.status" }, boxed_optional;
    /// `auth.cancel`.
    AuthCancel = "auth.cancel", AuthCancel, XagentToConnector, Channel, Role::Request { ack: "auth.cancel.ack" }, boxed;
    /// `auth.cancel.ack`.
    AuthCancelAck = "auth.cancel.ack", AuthCancelAck, ConnectorToXagent, Channel, Role::Ack { request: "auth.cancel" }, boxed_optional;
    /// `auth.logout`.
    AuthLogout = "auth.logout", AuthLogout, XagentToConnector, Channel, Role::Request { ack: "auth.logout.ack" }, optional;
    /// `auth.logout.ack`.
    AuthLogoutAck = "auth.logout.ack", AuthLogoutAck, ConnectorToXagent, Channel, Role::Ack { request: "auth.logout" }, boxed_optional;
    /// `connection.descriptor.get`.
    DescriptorGet = "connection.descriptor.get", DescriptorGet, XagentToConnector, Channel, Role::Request { ack: "connection.descriptor.get.ack" }, optional;
    /// `connection.descriptor.get.ack`.
    DescriptorGetAck = "connection.descriptor.get.ack", DescriptorGetAck, ConnectorToXagent, Channel, Role::Ack { request: "connection.descriptor.get" }, boxed_optional;
    /// `connection.descriptor.push`.
    DescriptorPush = "connection.descriptor.push", DescriptorPush, ConnectorToXagent, Channel, Role::Push, boxed;
    /// `tool.invoke`.
    ToolInvoke = "tool.invoke", ToolInvoke, XagentToConnector, Channel, Role::Request { ack: "tool.invoke.ack" }, boxed;
    /// `tool.invoke.ack`.
    ToolInvokeAck = "tool.invoke.ack", ToolInvokeAck, ConnectorToXagent, Channel, Role::Ack { request: "tool.invoke" }, boxed_optional;
    /// `tool.progress.push`.
    ToolProgressPush = "tool.progress.push", ToolProgressPush, ConnectorToXagent, Channel, Role::Push, boxed;
    /// `message.push` (IM v1).
    MessagePush = "message.push", MessagePush, ConnectorToXagent, Channel, Role::Push, boxed;
    /// `chat.message` (IM v2).
    ChatMessage = "chat.message", ChatMessage, Both, Channel, Role::Message, boxed;
    /// `chat.message.delta` (IM v2).
    ChatMessageDelta = "chat.message.delta", ChatMessageDelta, XagentToConnector, Channel, Role::Push, boxed;
    /// `chat.message.ack` (IM v2).
    ChatMessageAck = "chat.message.ack", ChatMessageAck, Both, Channel, Role::MessageAck, boxed;
    /// `chat.activity` (IM v2).
    ChatActivity = "chat.activity", ChatActivity, XagentToConnector, Channel, Role::Push, boxed;
    /// `ping`.
    Ping = "ping", Ping, Both, Either, Role::Request { ack: "pong" }, optional;
    /// `pong`.
    Pong = "pong", Pong, Both, Either, Role::Ack { request: "ping" }, optional;
}

macro_rules! bind_requests {
    ($($request:ty => $ack:ty),+ $(,)?) => {
        $( impl Request for $request { type Ack = $ack; } )+
    };
}

bind_requests! {
    ConnectorHello => ConnectorHelloAck,
    ChannelOpen => ChannelOpenAck,
    ChannelClose => ChannelCloseAck,
    AuthStart => AuthStartAck,
    AuthStatusRequest => AuthStatusAck,
    AuthCancel => AuthCancelAck,
    AuthLogout => AuthLogoutAck,
    DescriptorGet => DescriptorGetAck,
    ToolInvoke => ToolInvokeAck,
    ChatMessage => ChatMessageAck,
    Ping => Pong,
}

/// The request-to-ack pairing, derived from [`PacketType::TABLE`] (the only place a pair is
/// written down) so no caller keeps its own map.
impl PacketType {
    /// The ack type answering `request` (`tool.invoke` -> `tool.invoke.ack`, `ping` -> `pong`;
    /// `chat.message` -> `chat.message.ack`), or `None` when `request` is not answered by an ack.
    pub fn ack_type_of(request: &str) -> Option<&'static str> {
        match Self::spec_of(request)?.role {
            Role::Request { ack } => Some(ack),
            Role::Message => Some("chat.message.ack"),
            _ => None,
        }
    }

    /// The request type an ack type answers, or `None` when `ack` is not an ack.
    pub fn request_type_of(ack: &str) -> Option<&'static str> {
        match Self::spec_of(ack)?.role {
            Role::Ack { request } => Some(request),
            Role::MessageAck => Some("chat.message"),
            _ => None,
        }
    }

    /// True for the acks that carry a result payload unless they carry an `error` instead:
    /// every request ack except `pong` (whose payload is optional either way).
    pub fn ack_needs_payload_unless_error(packet_type: &str) -> bool {
        Self::spec_of(packet_type).is_some_and(|spec| {
            matches!(spec.role, Role::Ack { .. }) && spec.routing != Routing::Either
        })
    }
}

impl PacketBody {
    /// The ack body answering `request` with no payload, the shape of an ack that carries an
    /// `error` instead of a result. `None` when the request type has no payload-optional ack
    /// (pushes, `chat.message`, `error`, unknown types): answer those with an `error` packet.
    pub fn empty_ack_for(request: &PacketBody) -> Option<PacketBody> {
        Self::empty_ack(PacketType::ack_type_of(request.type_str())?)
    }

    /// The body of an ack of type `ack` with no payload (to carry an `error`), or `None` when
    /// `ack` is not an ack type whose payload may be absent.
    pub fn empty_ack(ack: &str) -> Option<PacketBody> {
        PacketType::request_type_of(ack)?;
        let spec = PacketType::spec_of(ack)?;
        if spec.payload_required {
            return None;
        }
        PacketBody::decode::<Value>(ack, None, true).ok()
    }
}

impl std::fmt::Display for PacketType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PacketType {
    /// True for types this version knows.
    pub fn is_known(&self) -> bool {
        !matches!(self, Self::Unknown(_))
    }
}

#[cfg(test)]
mod pairing_tests {
    use super::*;

    #[test]
    fn request_and_ack_roles_of_the_table_point_at_each_other() {
        for spec in PacketType::TABLE {
            if let Some(ack) = PacketType::ack_type_of(spec.packet_type) {
                assert_eq!(PacketType::request_type_of(ack), Some(spec.packet_type));
            }
            if let Some(request) = PacketType::request_type_of(spec.packet_type) {
                assert_eq!(PacketType::ack_type_of(request), Some(spec.packet_type));
            }
        }
    }

    #[test]
    fn the_request_trait_agrees_with_the_table() {
        fn pair<R: Request>() -> (&'static str, &'static str) {
            (R::TYPE, <R::Ack as Payload>::TYPE)
        }
        for (request, ack) in [
            pair::<ConnectorHello>(),
            pair::<ChannelOpen>(),
            pair::<ChannelClose>(),
            pair::<AuthStart>(),
            pair::<AuthStatusRequest>(),
            pair::<AuthCancel>(),
            pair::<AuthLogout>(),
            pair::<DescriptorGet>(),
            pair::<ToolInvoke>(),
            pair::<ChatMessage>(),
            pair::<Ping>(),
        ] {
            assert_eq!(PacketType::ack_type_of(request), Some(ack), "{request}");
        }
    }

    #[test]
    fn a_packet_stays_small_because_large_payloads_are_boxed() {
        // A `Packet` moves by value from decode through validation to the write queue; with
        // every payload inline it was 936 bytes. Boxed payloads keep the body at the size of
        // a JSON `Value` plus its tag.
        assert!(std::mem::size_of::<PacketBody>() <= std::mem::size_of::<Value>() + 8);
        assert!(std::mem::size_of::<crate::Packet>() <= 256);
    }

    #[test]
    fn empty_acks_have_the_ack_type_and_no_payload() {
        let body =
            PacketBody::empty_ack_for(&PacketBody::from(ToolInvoke::new("t", Default::default())));
        assert!(matches!(body, Some(PacketBody::ToolInvokeAck(None))));
        assert!(matches!(
            PacketBody::empty_ack_for(&PacketBody::Ping(None)),
            Some(PacketBody::Pong(None))
        ));
        assert!(PacketBody::empty_ack_for(&PacketBody::Error(None)).is_none());
        let requests =
            PacketType::TABLE.iter().filter(|s| matches!(s.role, Role::Request { .. })).count();
        let needing = PacketType::TABLE
            .iter()
            .filter(|s| PacketType::ack_needs_payload_unless_error(s.packet_type))
            .count();
        assert_eq!(needing, requests - 1, "every request's ack but pong");
    }
}
