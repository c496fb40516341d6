//! Text the model reads: what a Skill or a Tool's descriptions may not name.
//!
//! The agent acts through Tools. Moving a file's bytes (the Transfer Plane) and framing packets
//! are the business of xAgent and the Connector: xAgent uploads a conversation file before it
//! calls the Tool that takes it (notes: upload-reference arguments), and the runtimes write
//! every packet. A Skill or a Tool description that sends the model to `/files/uploads` or
//! names `tool.invoke` asks it for something it cannot do and leaks the wire into the prompt.
//! [`wire_mentions`] is the one scan behind `skill.wire_reference` and
//! `card.tool_wire_reference`.
//!
//! What counts (see `docs/DECISIONS.md`):
//! - a Transfer Plane path, `/files/uploads` or `/files/refs` (after any prefix, ending at a
//!   character that cannot continue a path segment name), or an HTTP method followed by a path
//!   starting `/files` (`POST /files`, `GET /files/...`);
//! - a packet type of [`PacketType::TABLE`] that has a dot (`tool.invoke`, `chat.message`,
//!   `connector.hello`, ...), standing as a whole dotted name: not inside a longer one
//!   (`im.chat.message.send`), and a sentence's closing period does not extend it. The
//!   dotless types (`ping`, `pong`, `error`) and bare words (`message`, `invoke`) are English.
//!
//! Matching ignores ASCII case.
//!
//! ```
//! use xagent_protocol_validate::model_text::{WireMention, wire_mentions};
//!
//! let found = wire_mentions("Reply with chat.message.\nThen POST /files/uploads.");
//! assert_eq!(found.len(), 2);
//! assert_eq!(found[0].line, 1);
//! assert_eq!(found[0].mention, WireMention::Packet("chat.message"));
//! assert_eq!(found[1].mention, WireMention::TransferPlane("/files/uploads".to_owned()));
//! assert!(wire_mentions("Send a message with a file of the conversation.").is_empty());
//! ```

use std::fmt;

use xagent_protocol_types::{PacketType, paths};

/// One thing a text the model reads names that it must not.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireMention {
    /// A Transfer Plane endpoint, lowercased: `/files/uploads`, `/files/refs`, or a method and
    /// the Transfer Plane root such as `post /files`.
    TransferPlane(String),
    /// A wire packet type (`tool.invoke`, `chat.message`, ...).
    Packet(&'static str),
}

impl fmt::Display for WireMention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TransferPlane(endpoint) => write!(f, "the Transfer Plane endpoint {endpoint}"),
            Self::Packet(packet) => write!(f, "the wire packet {packet}"),
        }
    }
}

/// A [`WireMention`] and the line (from 1) where it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Found {
    /// Line number, from 1.
    pub line: usize,
    /// What was named.
    pub mention: WireMention,
}

/// HTTP methods that, before a `/files` path, make it an endpoint.
const METHODS: &[&str] = &["get", "post", "put", "patch", "delete", "head"];

/// A byte that continues a name (a path segment or a part of a dotted packet name).
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// The Transfer Plane paths a text must not name, from the endpoint constants.
fn transfer_paths() -> [&'static str; 2] {
    [paths::FILE_UPLOADS, paths::FILE_REFS_PREFIX.trim_end_matches('/')]
}

/// The Transfer Plane's root (`/files`), which a method in front of it names.
fn transfer_root() -> &'static str {
    paths::FILE_UPLOADS.rsplit_once('/').map_or(paths::FILE_UPLOADS, |(root, _)| root)
}

/// True when nothing continues the path that ends at `end`.
fn path_ends(bytes: &[u8], end: usize) -> bool {
    bytes.get(end).is_none_or(|b| !is_name_byte(*b))
}

/// True when the dotted name at `start..end` stands alone: no name byte or dot before it, and
/// after it neither a name byte nor a dot that a name byte follows.
fn dotted_name_stands(bytes: &[u8], start: usize, end: usize) -> bool {
    let before = start.checked_sub(1).and_then(|i| bytes.get(i));
    if before.is_some_and(|b| is_name_byte(*b) || *b == b'.') {
        return false;
    }
    match bytes.get(end) {
        None => true,
        Some(b'.') => bytes.get(end + 1).is_none_or(|b| !is_name_byte(*b)),
        Some(b) => !is_name_byte(*b),
    }
}

fn line_mentions(line: &str, out: &mut Vec<WireMention>) {
    let lower = line.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    for path in transfer_paths() {
        if lower.match_indices(path).any(|(at, _)| path_ends(bytes, at + path.len())) {
            out.push(WireMention::TransferPlane(path.to_owned()));
        }
    }
    // A method in front of a path already named adds nothing.
    let root = transfer_root();
    let path_named = !out.is_empty();
    for method in METHODS.iter().filter(|_| !path_named) {
        let named = lower.match_indices(method).any(|(at, _)| {
            let before = at.checked_sub(1).and_then(|i| bytes.get(i));
            if before.is_some_and(|b| is_name_byte(*b)) {
                return false;
            }
            let rest = &lower[at + method.len()..];
            let path = rest.trim_start_matches([' ', '\t']);
            if path.len() == rest.len() || !path.starts_with(root) {
                return false;
            }
            let end = lower.len() - path.len() + root.len();
            path_ends(bytes, end)
        });
        if named {
            out.push(WireMention::TransferPlane(format!("{method} {root}")));
        }
    }
    for spec in PacketType::TABLE.iter().filter(|s| s.packet_type.contains('.')) {
        let name = spec.packet_type;
        if lower.match_indices(name).any(|(at, _)| dotted_name_stands(bytes, at, at + name.len())) {
            out.push(WireMention::Packet(name));
        }
    }
}

/// Everything `text` names that a text the model reads must not: Transfer Plane endpoints and
/// wire packet types, each once per line, with its line, in line order.
pub fn wire_mentions(text: &str) -> Vec<Found> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut here = Vec::new();
        line_mentions(line, &mut here);
        out.extend(here.into_iter().map(|mention| Found { line: i + 1, mention }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(text: &str) -> Vec<String> {
        wire_mentions(text).into_iter().map(|f| f.mention.to_string()).collect()
    }

    #[test]
    fn transfer_plane_paths_and_methods_count() {
        for text in [
            "Upload it with POST /files/uploads first.",
            "Fetch https://c.example/prefix/files/refs/file_1 for the bytes.",
            "Call post /files with the file.",
            "GET /files/refs/{file_ref}",
            "the endpoint `/files/uploads`",
        ] {
            assert!(!named(text).is_empty(), "{text:?} passed");
        }
    }

    #[test]
    fn packet_names_with_their_dot_count_and_the_longest_is_named() {
        assert_eq!(named("Wait for tool.invoke."), ["the wire packet tool.invoke"]);
        assert_eq!(named("a `chat.message.delta` stream"), ["the wire packet chat.message.delta"]);
        assert_eq!(named("Send Connector.Hello first"), ["the wire packet connector.hello"]);
        assert_eq!(named("(message.push)"), ["the wire packet message.push"]);
    }

    #[test]
    fn words_other_dotted_names_and_other_paths_do_not_count() {
        for text in [
            "Send a message to the chat; invoke the Tool; ping the user on error.",
            "Use im.webchat.send_message or tool.invoked_at or chat.messages.",
            "x.tool.invoke and tool.invoke_id are other names.",
            "Files live in /files of the user; the /files/uploadsx page; repost /files",
            "POST /filesystem or GET /files-old",
            "A file from the conversation.",
        ] {
            assert!(named(text).is_empty(), "{text:?} tripped: {:?}", named(text));
        }
    }

    #[test]
    fn every_dotted_packet_type_of_the_table_is_found_and_lines_count_from_one() {
        for spec in PacketType::TABLE.iter().filter(|s| s.packet_type.contains('.')) {
            let found = wire_mentions(&format!("ok\nsee {}.", spec.packet_type));
            assert_eq!(found.len(), 1, "{}", spec.packet_type);
            assert_eq!(found[0].line, 2);
            assert_eq!(found[0].mention, WireMention::Packet(spec.packet_type));
        }
    }
}
