//! The small views every rule walk reads a payload through ([`Field`], [`FileItem`]), and what
//! a walk reports ([`Place`], [`Break`]).

use std::ops::ControlFlow;

use serde_json::Value;
use xagent_protocol_types::{ChatFile, FileType, PushFile, Side};

use crate::report::{Rule, Severity};
use crate::rules::{IM_V1_FORBIDDEN_FIELD, IM_V2_FORBIDDEN_FIELD};

/// Where a broken rule sits in a packet, relative to its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Place<'a> {
    /// The payload as a whole.
    Payload,
    /// A field of the payload.
    Field(&'a str),
    /// A field of the file item at this index of `payload.files`.
    File(usize, &'a str),
    /// A member of an object field of the payload (`reply.tool_id`), or with an index, an
    /// item of an array member (`skill.tool_ids[2]`).
    Member(&'a str, &'a str, Option<usize>),
}

impl Place<'_> {
    /// The JSON pointer of the place in the packet, e.g. `/payload/files/0/download_url`.
    pub fn pointer(&self) -> String {
        match self {
            Self::Payload => String::from("/payload"),
            Self::Field(key) => crate::report::child("/payload", key),
            Self::File(i, key) => {
                crate::report::child(&crate::report::index("/payload/files", *i), key)
            }
            Self::Member(field, member, item) => {
                let path = crate::report::child(&crate::report::child("/payload", field), member);
                match item {
                    Some(i) => crate::report::index(&path, *i),
                    None => path,
                }
            }
        }
    }

    /// The file index, for a place inside a file item.
    pub fn file(&self) -> Option<usize> {
        match self {
            Self::File(i, _) => Some(*i),
            _ => None,
        }
    }

    /// The field name, for a place that is a field.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Payload => None,
            Self::Field(key) | Self::File(_, key) | Self::Member(_, key, _) => Some(key),
        }
    }
}

/// One broken rule, as the rule functions of this module report it: the rule, the place, a
/// short fixed hint, and the sender it holds for when the payload was judged without one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Break<'a> {
    /// The rule broken.
    pub rule: &'static Rule,
    /// Where.
    pub place: Place<'a>,
    /// What is wrong and what to do (no value from the payload, so never a secret).
    pub hint: &'static str,
    /// Set when the rule depends on who sends the packet and no sender was given: the break
    /// holds for a packet sent by this side.
    pub sender: Option<Side>,
}

impl Break<'_> {
    /// True for an error (a warning does not make a payload invalid).
    pub fn is_error(&self) -> bool {
        self.rule.severity == Severity::Error
    }
}

/// The visitor every rule function reports to: return `ControlFlow::Break(())` to stop the walk
/// (the single-pass form stops at the first error), `Continue` to see every break (the report
/// form).
pub type Visit<'v> = dyn FnMut(Break<'_>) -> ControlFlow<()> + 'v;

/// A JSON field as the rules see it: absent, `null`, a string, or present with another JSON
/// type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field<'a> {
    /// Not there.
    Absent,
    /// An explicit `null`.
    Null,
    /// A string.
    Text(&'a str),
    /// Present, neither a string nor `null`.
    Other,
}

impl<'a> Field<'a> {
    /// The field of a JSON object member.
    pub fn of(value: Option<&'a Value>) -> Self {
        match value {
            None => Self::Absent,
            Some(Value::Null) => Self::Null,
            Some(Value::String(s)) => Self::Text(s),
            Some(_) => Self::Other,
        }
    }

    /// An optional string of the typed model.
    pub fn opt(value: Option<&'a str>) -> Self {
        value.map_or(Self::Absent, Self::Text)
    }

    /// The string, when it is a non-empty one.
    pub fn non_empty(self) -> Option<&'a str> {
        match self {
            Self::Text(s) if !s.is_empty() => Some(s),
            _ => None,
        }
    }
}

/// A file item as the file rules see it: the typed `ChatFile`/`PushFile` or a JSON value.
pub trait FileItem {
    /// The field `name` (`file_ref`, `type`, `download_url`, `url`, ...).
    fn field(&self, name: &str) -> Field<'_>;
    /// The names of the fields the typed model does not define (for a JSON value, every key):
    /// the only ones that can be a forbidden name.
    fn extra_keys(&self) -> impl Iterator<Item = &str>;
}

impl FileItem for Value {
    fn field(&self, name: &str) -> Field<'_> {
        Field::of(self.as_object().and_then(|map| map.get(name)))
    }

    fn extra_keys(&self) -> impl Iterator<Item = &str> {
        self.as_object().into_iter().flat_map(|map| map.keys().map(String::as_str))
    }
}

impl FileItem for ChatFile {
    fn field(&self, name: &str) -> Field<'_> {
        match name {
            "file_ref" => Field::Text(self.file_ref.as_str()),
            "type" => Field::Text(self.file_type.as_str()),
            "download_url" => Field::opt(self.download_url.as_deref()),
            "filename" => Field::opt(self.filename.as_deref()),
            "mime_type" => Field::opt(self.mime_type.as_deref()),
            other => Field::of(self.extra.get(other)),
        }
    }

    fn extra_keys(&self) -> impl Iterator<Item = &str> {
        self.extra.keys().map(String::as_str)
    }
}

impl FileItem for PushFile {
    fn field(&self, name: &str) -> Field<'_> {
        match name {
            "file_ref" => Field::Text(self.file_ref.as_str()),
            "type" => Field::opt(self.file_type.as_ref().map(FileType::as_str)),
            "download_url" => Field::opt(self.download_url.as_deref()),
            "url" => Field::opt(self.url.as_deref()),
            "filename" => Field::opt(self.filename.as_deref()),
            "mime_type" => Field::opt(self.mime_type.as_deref()),
            other => Field::of(self.extra.get(other)),
        }
    }

    fn extra_keys(&self) -> impl Iterator<Item = &str> {
        self.extra.keys().map(String::as_str)
    }
}

/// Which IM Profile a payload belongs to: the identity rule id and the file rules differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Profile {
    /// IM v1 (`message.push`).
    V1,
    /// IM v2 (`chat.*`).
    V2,
}

impl Profile {
    pub(super) fn identity_rule(self) -> &'static Rule {
        match self {
            Self::V1 => &IM_V1_FORBIDDEN_FIELD,
            Self::V2 => &IM_V2_FORBIDDEN_FIELD,
        }
    }
}

/// Reports `rule` at `place` and returns whether to go on.
pub(super) fn report(
    visit: &mut Visit<'_>,
    rule: &'static Rule,
    place: Place<'_>,
    hint: &'static str,
) -> ControlFlow<()> {
    visit(Break { rule, place, hint, sender: None })
}
