//! The names the Connector is known by: its Card, provider, auth flows, Tools and Skill.

/// Card id.
pub const CARD_ID: &str = "im.webchat";

/// Target provider.
pub const PROVIDER: &str = "webchat";

/// The QR pairing flow.
pub const QR_FLOW: &str = "webchat_qr_login";

/// The room form flow.
pub const ROOM_FLOW: &str = "webchat_room";

/// Tool: send text to the room.
pub const TOOL_MESSAGE_SEND: &str = "webchat_message_send";

/// Tool: send a file to the room.
pub const TOOL_FILE_SEND: &str = "webchat_file_send";

/// Binding secret holding the room id.
pub(crate) const ROOM_SECRET: &str = "room_id";

/// The primary Skill, served at `/skill.md`.
pub const SKILL: &str = include_str!("../assets/skill.md");
