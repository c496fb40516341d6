//! MCP tool annotations (`readOnlyHint`, `destructiveHint`, `idempotentHint`, `openWorldHint`,
//! `title`): hosts let an agent run a Tool unattended, or in a planning mode, only when they
//! say it is safe. Every Tool the bridge lists carries them:
//! - a Connector Tool, from its Card: read-only when the Card marks it so
//!   ([`xagent_protocol_types::TOOL_READ_ONLY_KEY`], set by this toolkit's runtime for
//!   `ToolSpec::read_only`); otherwise it may change the target system, and, since the bridge
//!   gives each MCP call a call id of its own, a repeated call is a new action;
//! - the bridge's own Tools, from what they do;
//! - then the operator's file (`--tool-annotations`), which overrides any of them per Tool.
//!
//! ```
//! use xagent_mcp::annotations::AnnotationOverrides;
//!
//! let file = r#"{"webchat_message_send": {"destructiveHint": false}}"#;
//! let overrides = AnnotationOverrides::parse(file).unwrap();
//! assert!(overrides.check_tools(["webchat_message_send", "connector_message_wait"]).is_ok());
//! let refused = overrides.check_tools(["other_tool"]).unwrap_err();
//! assert!(refused.to_string().contains("webchat_message_send"));
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use rmcp::model::ToolAnnotations;
use serde::Deserialize;
use xagent_protocol_types::CardTool;

use crate::projection::{TOOL_CHANNELS_LIST, TOOL_MESSAGE_SEND, TOOL_MESSAGE_WAIT};

/// Largest annotations file read (it holds a few lines per Tool).
pub const MAX_ANNOTATIONS_FILE_BYTES: u64 = 1024 * 1024;

/// What the operator sets for one Tool; each hint left out keeps the derived one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AnnotationOverride {
    /// The human title hosts show.
    pub title: Option<String>,
    /// The Tool does not change its environment.
    pub read_only_hint: Option<bool>,
    /// The Tool may delete or overwrite (meaningful when not read-only).
    pub destructive_hint: Option<bool>,
    /// Repeating a call with the same arguments has no further effect.
    pub idempotent_hint: Option<bool>,
    /// The Tool reaches outside systems.
    pub open_world_hint: Option<bool>,
}

/// The operator's annotations by Tool name (`--tool-annotations FILE`: a JSON object whose
/// keys are Tool names and whose values are [`AnnotationOverride`] objects).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnnotationOverrides(BTreeMap<String, AnnotationOverride>);

/// A bad annotations file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnnotationsError {
    /// The file could not be read.
    #[error("cannot read the tool annotations file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file is not the expected JSON.
    #[error(
        "the tool annotations file is not a JSON object of Tool names to {{\"title\", \"readOnlyHint\", \"destructiveHint\", \"idempotentHint\", \"openWorldHint\"}}: {0}"
    )]
    Parse(String),
    /// The file names Tools the bridge does not list.
    #[error(
        "the tool annotations file names {unknown:?}, which the Connector's Card and the bridge do not have; its Tools are {known:?}: fix or remove those entries"
    )]
    UnknownTools {
        /// The names not found.
        unknown: Vec<String>,
        /// The Tools there are.
        known: Vec<String>,
    },
}

impl AnnotationOverrides {
    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<Self, AnnotationsError> {
        serde_json::from_str(text).map(Self).map_err(|e| AnnotationsError::Parse(e.to_string()))
    }

    /// Reads and parses the file (at most [`MAX_ANNOTATIONS_FILE_BYTES`]).
    pub fn load(path: &Path) -> Result<Self, AnnotationsError> {
        use std::io::Read;
        let read_error =
            |reason: String| AnnotationsError::Read { path: path.display().to_string(), reason };
        let file = std::fs::File::open(path).map_err(|e| read_error(e.to_string()))?;
        let mut text = String::new();
        file.take(MAX_ANNOTATIONS_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| read_error(e.to_string()))?;
        if text.len() as u64 > MAX_ANNOTATIONS_FILE_BYTES {
            return Err(read_error(format!("larger than {MAX_ANNOTATIONS_FILE_BYTES} bytes")));
        }
        Self::parse(&text)
    }

    /// Whether no Tool is overridden.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Refuses entries naming none of `tools` (the Card's Tools and the bridge's own).
    pub fn check_tools<'a>(
        &self,
        tools: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), AnnotationsError> {
        let known: Vec<String> = tools.into_iter().map(str::to_owned).collect();
        let unknown: Vec<String> =
            self.0.keys().filter(|name| !known.contains(name)).cloned().collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(AnnotationsError::UnknownTools { unknown, known })
        }
    }

    /// The annotations of the Tool `name`: `derived`, with the operator's entry over it.
    pub fn apply(&self, name: &str, derived: ToolAnnotations) -> ToolAnnotations {
        let Some(set) = self.0.get(name) else { return derived };
        let mut out = derived;
        if set.title.is_some() {
            out.title.clone_from(&set.title);
        }
        out.read_only_hint = set.read_only_hint.or(out.read_only_hint);
        out.destructive_hint = set.destructive_hint.or(out.destructive_hint);
        out.idempotent_hint = set.idempotent_hint.or(out.idempotent_hint);
        out.open_world_hint = set.open_world_hint.or(out.open_world_hint);
        out
    }
}

/// Names of the bridge's own Tools.
pub const BRIDGE_TOOLS: [&str; 3] = [TOOL_CHANNELS_LIST, TOOL_MESSAGE_SEND, TOOL_MESSAGE_WAIT];

/// What the Card says of a Connector Tool. A Tool the Card does not mark read-only may change
/// the target system, and each MCP call is a new action (a new call id).
/// (`None`: a Tool the Card does not list, which says nothing either.)
pub fn connector_tool(tool: Option<&CardTool>) -> ToolAnnotations {
    let read_only = tool.and_then(CardTool::read_only_hint) == Some(true);
    let title = tool.and_then(|tool| tool.title.clone());
    let annotations = ToolAnnotations::from_raw(title, Some(read_only), None, None, Some(true));
    if read_only {
        annotations.destructive(false).idempotent(true)
    } else {
        // Nothing tells an additive Tool from a destructive one: the MCP default (may be).
        annotations.destructive(true).idempotent(false)
    }
}

/// What the bridge's own Tools do: listing channels and taking the next inbound message only
/// read the Connector's world (taking a message moves it out of the bridge's own inbox); a sent
/// chat message adds to a conversation and is a new message each time.
pub fn bridge_tool(name: &str) -> ToolAnnotations {
    let read = |open_world: bool| {
        ToolAnnotations::from_raw(None, Some(true), Some(false), Some(true), Some(open_world))
    };
    match name {
        TOOL_CHANNELS_LIST => read(false),
        TOOL_MESSAGE_WAIT => read(true).idempotent(false),
        _ => ToolAnnotations::from_raw(None, Some(false), Some(false), Some(false), Some(true)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    #[test]
    fn a_read_only_card_tool_is_read_only_idempotent_and_not_destructive() {
        let tool = CardTool::new("look", Map::new()).with_read_only_hint(true).with_title("Look");
        let got = connector_tool(Some(&tool));
        assert_eq!(got.read_only_hint, Some(true));
        assert_eq!(got.destructive_hint, Some(false));
        assert_eq!(got.idempotent_hint, Some(true));
        assert_eq!(got.title.as_deref(), Some("Look"));
    }

    #[test]
    fn a_card_tool_not_marked_may_change_things_and_is_not_idempotent() {
        let got = connector_tool(Some(&CardTool::new("send", Map::new())));
        assert_eq!(got.read_only_hint, Some(false));
        assert_eq!(got.destructive_hint, Some(true));
        assert_eq!(got.idempotent_hint, Some(false));
        assert_eq!(got.open_world_hint, Some(true));
    }

    #[test]
    fn the_bridge_tools_say_what_they_do() {
        assert_eq!(bridge_tool(TOOL_MESSAGE_WAIT).read_only_hint, Some(true));
        assert_eq!(bridge_tool(TOOL_CHANNELS_LIST).open_world_hint, Some(false));
        let send = bridge_tool(TOOL_MESSAGE_SEND);
        assert_eq!((send.read_only_hint, send.destructive_hint), (Some(false), Some(false)));
    }

    #[test]
    fn an_override_replaces_only_the_hints_it_sets() {
        let overrides =
            AnnotationOverrides::parse(r#"{"send": {"destructiveHint": false, "title": "Send"}}"#)
                .unwrap();
        let got = overrides.apply("send", connector_tool(Some(&CardTool::new("send", Map::new()))));
        assert_eq!(got.destructive_hint, Some(false));
        assert_eq!(got.title.as_deref(), Some("Send"));
        assert_eq!(got.read_only_hint, Some(false), "kept");
        let other = overrides.apply("other", bridge_tool(TOOL_MESSAGE_WAIT));
        assert_eq!(other, bridge_tool(TOOL_MESSAGE_WAIT));
    }

    #[test]
    fn a_misspelt_hint_or_a_non_object_is_refused() {
        assert!(AnnotationOverrides::parse(r#"{"send": {"readonlyHint": true}}"#).is_err());
        assert!(AnnotationOverrides::parse(r#"["send"]"#).is_err());
        assert!(AnnotationOverrides::parse(r#"{"send": {"readOnlyHint": "yes"}}"#).is_err());
    }

    #[test]
    fn an_unknown_tool_is_refused_by_name() {
        let overrides = AnnotationOverrides::parse(r#"{"typo_send": {}}"#).unwrap();
        let error = overrides.check_tools(["send", TOOL_MESSAGE_WAIT]).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("typo_send") && text.contains("send"), "{text}");
    }

    #[test]
    fn a_file_over_the_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.json");
        let big = usize::try_from(MAX_ANNOTATIONS_FILE_BYTES).unwrap() + 2;
        std::fs::write(&path, " ".repeat(big)).unwrap();
        let error = AnnotationOverrides::load(&path).unwrap_err();
        assert!(matches!(error, AnnotationsError::Read { .. }), "{error}");
        assert!(matches!(
            AnnotationOverrides::load(&dir.path().join("missing.json")),
            Err(AnnotationsError::Read { .. })
        ));
    }
}
