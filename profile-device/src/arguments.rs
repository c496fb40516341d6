//! Device v1 rules on a Tool's *argument schema*, checked when the Connector is built: the
//! model must not be able to hand the device an arbitrary command (section 7: no arbitrary
//! shell or unconstrained commands as model Tools by default), and files travel through the
//! Transfer Plane, never as bytes in a Tool argument (section 6).
//!
//! [`unsafe_arguments`] walks an input schema (nested objects, arrays, `anyOf`/`oneOf`/`allOf`
//! and local `$ref`s into `$defs`) and reports every property that breaks one of those rules:
//! - a command-like property (a name word `command`, `cmd`, `cmdline`, `shell`, `script`) that
//!   accepts free-form strings: no `enum`, `const` or `pattern` narrows it;
//! - a byte-carrying property: a `contentEncoding: base64` or a `format` of `byte`/`binary`
//!   anywhere, or a string property named like bytes (`*_base64`, `*_b64`, `*_bytes`,
//!   `*_blob`, `image_data`, `file_data`, ...) that no `enum`/`const` narrows.
//!
//! The runtime refuses such a Tool at build unless the operator opted out for that exact Tool
//! and property (documented in docs/DEVICE.md).

use serde_json::{Map, Value};
use xagent_protocol_types::ToolId;

/// The Device v1 rule an argument breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ArgumentRule {
    /// Section 7: no arbitrary shell or unconstrained command as a model Tool.
    NoUnconstrainedCommand,
    /// Section 6: no file or media bytes in a Tool argument (use a Transfer Plane `file_ref`).
    NoBytesInArguments,
}

impl ArgumentRule {
    /// The stable rule id.
    pub fn id(self) -> &'static str {
        match self {
            Self::NoUnconstrainedCommand => "device.no_unconstrained_command",
            Self::NoBytesInArguments => "device.no_bytes_in_arguments",
        }
    }
}

impl std::fmt::Display for ArgumentRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            Self::NoUnconstrainedCommand => {
                "Device v1 section 7, no arbitrary shell or unconstrained command"
            }
            Self::NoBytesInArguments => "Device v1 section 6, no file bytes in Tool arguments",
        };
        write!(f, "{} ({text})", self.id())
    }
}

/// A Tool argument that breaks a Device v1 rule: the Tool, the property (a JSON pointer into
/// the arguments, e.g. `/steps/command`), the rule and what to do instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tool {tool}: argument {property} breaks {rule}: {fix}")]
pub struct UnsafeArgument {
    /// The Tool.
    pub tool: ToolId,
    /// Where the property is in the arguments (JSON pointer).
    pub property: String,
    /// The rule it breaks.
    pub rule: ArgumentRule,
    /// What to change.
    pub fix: &'static str,
}

const COMMAND_FIX: &str = "offer the allowed commands as an enum (or a pattern), or split them \
                           into Tools with bounded parameters";
const BYTES_FIX: &str = "take a Transfer Plane file_ref instead of the bytes";

/// Words of a property name that make it a command.
const COMMAND_WORDS: &[&str] =
    &["command", "commands", "cmd", "cmds", "cmdline", "commandline", "shell", "script", "scripts"];
/// Words that make a property name carry bytes wherever they appear.
const BYTES_WORDS: &[&str] = &["base64", "b64"];
/// Last words that make a property name carry bytes.
const BYTES_LAST_WORDS: &[&str] = &["bytes", "blob", "binary"];
/// Earlier words that make a last word `data` carry bytes (`image_data`, `fileData`).
const MEDIA_WORDS: &[&str] =
    &["image", "file", "photo", "picture", "video", "audio", "screenshot", "media", "content"];
/// How deep `$ref`s and nesting are followed (a cycle stops here).
const MAX_DEPTH: usize = 32;

/// The words of a property name: split at `_`, `-`, `.`, spaces and lower-to-upper case
/// changes, lower-cased (`shellCommand` -> `shell`, `command`).
fn words(name: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    for c in name.chars() {
        if matches!(c, '_' | '-' | '.' | ' ') {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            previous_lower = false;
            continue;
        }
        if c.is_uppercase() && previous_lower && !current.is_empty() {
            words.push(std::mem::take(&mut current));
        }
        previous_lower = c.is_lowercase() || c.is_ascii_digit();
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

fn is_command_name(name: &str) -> bool {
    words(name).iter().any(|w| COMMAND_WORDS.contains(&w.as_str()))
}

fn is_bytes_name(name: &str) -> bool {
    let words = words(name);
    let Some((last, before)) = words.split_last() else { return false };
    words.iter().any(|w| BYTES_WORDS.contains(&w.as_str()))
        || BYTES_LAST_WORDS.contains(&last.as_str())
        || (last == "data" && before.iter().any(|w| MEDIA_WORDS.contains(&w.as_str())))
}

/// Every property of `schema` (a Tool's argument schema) that breaks a Device v1 argument rule,
/// in schema order. Empty when the schema is safe.
pub fn unsafe_arguments(tool_id: &ToolId, schema: &Map<String, Value>) -> Vec<UnsafeArgument> {
    let mut walk = Walk { tool: tool_id, root: schema, found: Vec::new(), refs: Vec::new() };
    walk.node(schema, "", None, 0);
    walk.found
}

struct Walk<'a> {
    tool: &'a ToolId,
    root: &'a Map<String, Value>,
    found: Vec<UnsafeArgument>,
    /// The `$ref`s followed on the way to the current node: one met again is a cycle.
    refs: Vec<&'a str>,
}

impl<'a> Walk<'a> {
    /// The schema a local `$ref` points to (`#/$defs/X`, `#/definitions/X`), with the
    /// reference itself; `None` for no reference, a remote one, or one already being followed.
    fn resolve(&self, node: &'a Map<String, Value>) -> Option<(&'a str, &'a Map<String, Value>)> {
        let reference = node.get("$ref")?.as_str()?;
        if self.refs.contains(&reference) {
            return None;
        }
        Some((reference, self.target(reference)?))
    }

    fn target(&self, reference: &str) -> Option<&'a Map<String, Value>> {
        let target = reference.strip_prefix('#')?;
        if target.is_empty() {
            return Some(self.root);
        }
        let mut at: &Value = self.root.get(target.trim_start_matches('/').split('/').next()?)?;
        for part in target.trim_start_matches('/').split('/').skip(1) {
            at = at.get(part.replace("~1", "/").replace("~0", "~"))?;
        }
        at.as_object()
    }

    fn report(&mut self, path: &str, rule: ArgumentRule) {
        let property = if path.is_empty() { "/".to_owned() } else { path.to_owned() };
        if self.found.iter().any(|f| f.property == property && f.rule == rule) {
            return;
        }
        let fix = match rule {
            ArgumentRule::NoUnconstrainedCommand => COMMAND_FIX,
            ArgumentRule::NoBytesInArguments => BYTES_FIX,
        };
        self.found.push(UnsafeArgument { tool: self.tool.clone(), property, rule, fix });
    }

    /// Walks one schema node; `name` is the property it belongs to (kept through `items`,
    /// combinators and `$ref`s, so `commands: [string]` is still a command).
    fn node(&mut self, node: &'a Map<String, Value>, path: &str, name: Option<&str>, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        if let Some((reference, target)) = self.resolve(node) {
            self.refs.push(reference);
            self.node(target, path, name, depth + 1);
            self.refs.pop();
        }
        let encoded = node
            .get("contentEncoding")
            .and_then(Value::as_str)
            .is_some_and(|e| e.eq_ignore_ascii_case("base64"));
        let binary = node
            .get("format")
            .and_then(Value::as_str)
            .is_some_and(|f| f.eq_ignore_ascii_case("byte") || f.eq_ignore_ascii_case("binary"));
        if encoded || binary {
            self.report(path, ArgumentRule::NoBytesInArguments);
        }
        if let Some(name) = name {
            if is_command_name(name) && self.free_string(node, true, depth) {
                self.report(path, ArgumentRule::NoUnconstrainedCommand);
            }
            if is_bytes_name(name) && self.free_string(node, false, depth) {
                self.report(path, ArgumentRule::NoBytesInArguments);
            }
        }
        if let Some(Value::Object(properties)) = node.get("properties") {
            for (property, sub) in properties {
                if let Value::Object(sub) = sub {
                    let path = format!("{path}/{property}");
                    self.node(sub, &path, Some(property), depth + 1);
                } else if sub == &Value::Bool(true)
                    && (is_command_name(property) || is_bytes_name(property))
                {
                    // `true` accepts anything, strings included.
                    let rule = if is_command_name(property) {
                        ArgumentRule::NoUnconstrainedCommand
                    } else {
                        ArgumentRule::NoBytesInArguments
                    };
                    self.report(&format!("{path}/{property}"), rule);
                }
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(Value::Object(sub)) = node.get(key) {
                self.node(sub, path, name, depth + 1);
            }
        }
        for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
            if let Some(Value::Array(subs)) = node.get(key) {
                for sub in subs.iter().filter_map(Value::as_object) {
                    self.node(sub, path, name, depth + 1);
                }
            }
        }
    }

    /// Whether `node` accepts a string no `enum`/`const` (and, when `pattern_narrows`, no
    /// `pattern`) narrows, directly or as an array's items.
    fn free_string(
        &mut self,
        node: &'a Map<String, Value>,
        pattern_narrows: bool,
        depth: usize,
    ) -> bool {
        if depth > MAX_DEPTH {
            return false;
        }
        if let Some((reference, target)) = self.resolve(node) {
            self.refs.push(reference);
            let free = self.free_string(target, pattern_narrows, depth + 1);
            self.refs.pop();
            return free;
        }
        if node.contains_key("enum")
            || node.contains_key("const")
            || (pattern_narrows && node.contains_key("pattern"))
        {
            return false;
        }
        for (key, any) in [("anyOf", true), ("oneOf", true), ("allOf", false)] {
            let Some(subs) = node.get(key).and_then(Value::as_array) else { continue };
            let mut frees = Vec::with_capacity(subs.len());
            for sub in subs {
                frees.push(match sub {
                    Value::Object(sub) => self.free_string(sub, pattern_narrows, depth + 1),
                    other => other == &Value::Bool(true),
                });
            }
            return if any { frees.contains(&true) } else { !frees.contains(&false) };
        }
        let types: Vec<&str> = match node.get("type") {
            None => return true,
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            Some(_) => return false,
        };
        if types.contains(&"string") {
            return true;
        }
        if types.contains(&"array") {
            return match node.get("items") {
                None | Some(Value::Bool(true)) => true,
                Some(Value::Object(items)) => self.free_string(items, pattern_narrows, depth + 1),
                Some(_) => false,
            };
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn findings(schema: Value) -> Vec<(String, ArgumentRule)> {
        let schema = schema.as_object().cloned().unwrap_or_default();
        unsafe_arguments(&ToolId::new("t"), &schema)
            .into_iter()
            .map(|f| (f.property, f.rule))
            .collect()
    }

    #[test]
    fn name_words_split_at_separators_and_case_changes() {
        assert_eq!(words("shellCommand"), ["shell", "command"]);
        assert_eq!(words("image_base64"), ["image", "base64"]);
        assert_eq!(words("Run-Script.v2"), ["run", "script", "v2"]);
        assert!(is_command_name("cmd") && is_command_name("run_command"));
        assert!(!is_command_name("commander_name") && !is_command_name("description"));
        assert!(is_bytes_name("image_base64") && is_bytes_name("fileBytes"));
        assert!(
            is_bytes_name("image_data") && !is_bytes_name("data") && !is_bytes_name("metadata")
        );
    }

    #[test]
    fn rule_device_no_unconstrained_command_in_arguments() {
        use ArgumentRule::NoUnconstrainedCommand as Command;
        for (schema, at) in [
            (json!({"type": "object", "properties": {"command": {"type": "string"}}}), "/command"),
            (
                json!({"type": "object", "properties": {"shell": {"type": "string", "maxLength": 64}}}),
                "/shell",
            ),
            (json!({"type": "object", "properties": {"script": {}}}), "/script"),
            (
                json!({"type": "object", "properties": {"commands": {"type": "array",
                    "items": {"type": "string"}}}}),
                "/commands",
            ),
            (
                json!({"type": "object", "properties": {"run_cmd": {"type": ["string", "null"]}}}),
                "/run_cmd",
            ),
            (
                json!({"type": "object", "properties": {"step": {"$ref": "#/$defs/Step"}},
                    "$defs": {"Step": {"type": "object",
                        "properties": {"shellCommand": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}}),
                "/step/shellCommand",
            ),
        ] {
            assert_eq!(findings(schema.clone()), vec![(at.to_owned(), Command)], "{schema}");
        }
    }

    #[test]
    fn a_command_narrowed_by_an_enum_a_const_or_a_pattern_is_allowed() {
        for schema in [
            json!({"type": "object", "properties": {"command": {"type": "string", "enum": ["on", "off"]}}}),
            json!({"type": "object", "properties": {"command": {"const": "reboot"}}}),
            json!({"type": "object", "properties": {"command": {"type": "string", "pattern": "^(on|off)$"}}}),
            json!({"type": "object", "properties": {"command": {"$ref": "#/$defs/Cmd"}},
                "$defs": {"Cmd": {"type": "string", "enum": ["home", "back"]}}}),
            json!({"type": "object", "properties": {"command": {"oneOf": [
                {"const": "on"}, {"const": "off"}]}}}),
            json!({"type": "object", "properties": {"command_count": {"type": "integer"}}}),
            json!({"type": "object", "properties": {"node": {"type": "string"}, "value": {}}}),
        ] {
            assert_eq!(findings(schema.clone()), vec![], "{schema}");
        }
    }

    #[test]
    fn rule_device_no_bytes_in_arguments() {
        use ArgumentRule::NoBytesInArguments as Bytes;
        for (schema, at) in [
            (
                json!({"type": "object", "properties": {"image_base64": {"type": "string"}}}),
                "/image_base64",
            ),
            (
                json!({"type": "object", "properties": {"file_bytes": {"type": "array",
                    "items": {"type": "string"}}}}),
                "/file_bytes",
            ),
            (
                json!({"type": "object", "properties": {"picture": {"type": "string",
                    "contentEncoding": "base64"}}}),
                "/picture",
            ),
            (
                json!({"type": "object", "properties": {"upload": {"type": "string", "format": "byte"}}}),
                "/upload",
            ),
            (
                json!({"type": "object", "properties": {"images": {"type": "array",
                    "items": {"type": "string", "format": "binary"}}}}),
                "/images",
            ),
            (
                json!({"type": "object", "properties": {"imageData": {"type": "string",
                    "pattern": "^[A-Za-z0-9+/=]*$"}}}),
                "/imageData",
            ),
        ] {
            assert_eq!(findings(schema.clone()), vec![(at.to_owned(), Bytes)], "{schema}");
        }
        // Sizes and references are not bytes.
        let fine = json!({"type": "object", "properties": {
            "max_bytes": {"type": "integer"}, "file_ref": {"type": "string"},
            "metadata": {"type": "object"}}});
        assert_eq!(findings(fine), vec![]);
    }

    #[test]
    fn a_ref_cycle_ends() {
        let schema = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}},
            "$defs": {"A": {"type": "object", "properties": {"next": {"$ref": "#/$defs/A"}}}}});
        assert_eq!(findings(schema), vec![]);
    }

    #[test]
    fn the_error_names_the_tool_the_property_and_the_rule() {
        let schema = json!({"type": "object", "properties": {"command": {"type": "string"}}});
        let found = unsafe_arguments(
            &ToolId::new("device_exec"),
            schema.as_object().unwrap_or(&Map::new()),
        );
        let text = found.first().map(ToString::to_string).unwrap_or_default();
        assert!(text.contains("device_exec"), "{text}");
        assert!(text.contains("/command"), "{text}");
        assert!(text.contains("device.no_unconstrained_command"), "{text}");
        assert!(text.contains("Device v1"), "{text}");
    }
}
