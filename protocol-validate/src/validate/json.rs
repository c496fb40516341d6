//! Small reads of a JSON document that every validator shares: typed lookups, a required
//! string, key searches, and the Skill name and Tool id shapes.

use serde_json::{Map, Value};
use xagent_protocol_types::primary_skill_name;

use crate::report::{Rule, Sink, child, index};
use crate::rules::*;

pub(super) fn obj(value: Option<&Value>) -> Option<&Map<String, Value>> {
    value.and_then(Value::as_object)
}

pub(super) fn non_empty_str(value: Option<&Value>) -> Option<&str> {
    value.and_then(Value::as_str).filter(|s| !s.is_empty())
}

pub(super) fn describe(value: Option<&Value>) -> &'static str {
    match value {
        None => "missing",
        Some(Value::Null) => "null",
        Some(Value::String(s)) if s.is_empty() => "empty",
        Some(Value::String(_)) => "a string",
        Some(Value::Bool(_)) => "a boolean",
        Some(Value::Number(_)) => "a number",
        Some(Value::Array(_)) => "an array",
        Some(Value::Object(_)) => "an object",
    }
}

/// Requires a non-empty string; returns it.
pub(super) fn require_str<'v>(
    sink: &mut Sink,
    rule: &Rule,
    object: &'v Map<String, Value>,
    key: &str,
    path: &str,
) -> Option<&'v str> {
    let value = object.get(key);
    match non_empty_str(value) {
        Some(text) => Some(text),
        None => {
            sink.push(
                rule,
                child(path, key),
                format!("{key} must be a non-empty string, it is {}", describe(value)),
            );
            None
        }
    }
}

pub(super) fn is_skill_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('-').all(|part| {
            !part.is_empty() && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// True when `name` is the primary Skill name of `card_id` or that plus `-<purpose>`.
pub fn skill_name_matches_card(name: &str, card_id: &str) -> bool {
    let primary = primary_skill_name(card_id);
    let primary = primary.as_str();
    name == primary
        || name
            .strip_prefix(primary)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(is_skill_name)
}

/// `[A-Za-z0-9_.-]{1,256}`.
pub fn is_valid_tool_id(tool_id: &str) -> bool {
    !tool_id.is_empty()
        && tool_id.len() <= xagent_protocol_types::TOOL_ID_MAX_LEN
        && tool_id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

pub(super) fn has_key(value: &Value, key: &str) -> bool {
    match value {
        Value::Object(map) => map.iter().any(|(k, v)| k == key || has_key(v, key)),
        Value::Array(items) => items.iter().any(|item| has_key(item, key)),
        _ => false,
    }
}

pub(super) fn find_key(value: &Value, key: &str, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let p = child(path, k);
                if k == key {
                    out.push(p.clone());
                }
                find_key(v, key, &p, out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                find_key(item, key, &index(path, i), out);
            }
        }
        _ => {}
    }
}

pub(super) fn status(sink: &mut Sink, body: &Map<String, Value>, allowed: &[&str]) {
    if !body.get("status").and_then(Value::as_str).is_some_and(|s| allowed.contains(&s)) {
        sink.push(
            &PACKET_STATUS,
            "/payload/status",
            format!("status must be one of {}", allowed.join(", ")),
        );
    }
}

pub(super) fn is_build_time(text: &str) -> bool {
    let b = text.as_bytes();
    if b.len() != 10 || !b.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let two = |i: usize| u32::from(b[i] - b'0') * 10 + u32::from(b[i + 1] - b'0');
    (1..=12).contains(&two(2)) && (1..=31).contains(&two(4)) && two(6) < 24 && two(8) < 60
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skill_names() {
        assert!(skill_name_matches_card("connector-im-wechat", "im.wechat"));
        assert!(skill_name_matches_card("connector-im-wechat-file", "im.wechat"));
        assert!(!skill_name_matches_card("connector-im-wechat-", "im.wechat"));
        assert!(!skill_name_matches_card("connector-im-wechatx", "im.wechat"));
        assert!(!skill_name_matches_card("im-connector-reply", "im.wechat"));
        assert!(skill_name_matches_card("connector-device-adb", "device.adb"));
    }
}
