//! The names the Connector is known by (Card, provider, flow, Tools, Skill) and the keys it
//! keeps in bindings and in the author store.

/// The Card id.
pub const CARD_ID: &str = "im.matrix";
/// The provider named in the Card and the Descriptor.
pub const PROVIDER: &str = "matrix";
/// The flow that binds a room to a channel.
pub const ROOM_FLOW: &str = "matrix_room";
/// Send a text to the bound room.
pub const TOOL_MESSAGE_SEND: &str = "matrix_message_send";
/// Send a file to the bound room.
pub const TOOL_FILE_SEND: &str = "matrix_file_send";
/// The primary Skill (`connector-im-matrix`).
pub const SKILL: &str = include_str!("../assets/skill.md");

/// The binding's private entry naming the room.
pub(crate) const ROOM_SECRET: &str = "matrix_room_id";
/// Author records: inbound events already handed to the outbox (key: message id).
pub(crate) const SEEN_NS: &str = "matrix.seen";
/// Author records: the sync position (key [`SYNC_KEY`]).
pub(crate) const SYNC_NS: &str = "matrix.sync";
pub(crate) const SYNC_KEY: &str = "next_batch";
/// Author records: encrypted events not decrypted yet (key: event id).
pub(crate) const UTD_NS: &str = "matrix.utd";
/// The binding's private entry: when the room was paired (Unix ms); no gap is filled from
/// before it.
pub(crate) const PAIRED_AT_SECRET: &str = "matrix_paired_at";
