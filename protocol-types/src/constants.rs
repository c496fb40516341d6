//! Fixed names of the protocol family: schema ids, the subprotocol, versions, endpoint paths.

/// `schema` of a Connector Card.
pub const CARD_SCHEMA: &str = "xagent.connector/v1";
/// `schema` of a current Connection Descriptor.
pub const DESCRIPTOR_SCHEMA: &str = "xagent.connection/v2";
/// `schema` of a legacy Connection Descriptor, read and normalised but never emitted.
pub const DESCRIPTOR_SCHEMA_V1: &str = "xagent.connection/v1";
/// `schema` of every data-plane packet.
pub const PACKET_SCHEMA: &str = "xagent.connector.packet/v1";
/// WebSocket subprotocol the data plane must negotiate.
pub const SUBPROTOCOL: &str = "xagent.connector.packet.v1";
/// The protocol version this crate implements.
pub const PROTOCOL_VERSION: &str = "3.0";
/// The version a hello or hello.ack means when it omits `protocol_version`.
pub const IMPLIED_PROTOCOL_VERSION: &str = "1.0";

/// Profile id of the legacy IM Profile (`message.push`).
pub const PROFILE_IM_V1: &str = "xagent.im.v1";
/// Profile id of the current IM Profile (`chat.*` packets).
pub const PROFILE_IM_V2: &str = "xagent.im.v2";
/// Profile id of the Device Profile.
pub const PROFILE_DEVICE_V1: &str = "xagent.device.v1";

/// Endpoint paths, relative to the Base URL (which may carry a path prefix).
pub mod paths {
    /// Public Connector Card.
    pub const CONNECTOR_CARD: &str = "/connector-card.json";
    /// Public primary Skill (Markdown), 204/404 when absent.
    pub const SKILL: &str = "/skill.md";
    /// System health probe.
    pub const HEALTH: &str = "/health";
    /// WebSocket data plane.
    pub const WS: &str = "/ws";
    /// Transfer Plane upload endpoint.
    pub const FILE_UPLOADS: &str = "/files/uploads";
    /// Transfer Plane download prefix; the file_ref follows.
    pub const FILE_REFS_PREFIX: &str = "/files/refs/";
}

/// HTTP header that names the channel of an upload.
pub const CHANNEL_HEADER: &str = "X-XAgent-Connector-Channel-ID";

/// Name of the reserved model argument every Tool input schema carries.
pub const CHANNEL_ARGUMENT: &str = "connector_channel_id";

/// Longest allowed `tool_id` (it becomes a model function name).
pub const TOOL_ID_MAX_LEN: usize = 256;
/// Longest allowed `chat.activity` `tool_name`, in bytes.
pub const ACTIVITY_TOOL_NAME_MAX_BYTES: usize = 256;

/// How long a side-effecting `tool.invoke`'s outcome is kept for repeats (same channel and
/// `tool_call_id`, else `request_id`): 24 hours, in milliseconds, for every Tool, device or not
/// (project spec notes). The one home of this window.
pub const REPEATED_CALL_WINDOW_MS: u64 = 24 * 60 * 60 * 1000;
