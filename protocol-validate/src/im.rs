//! The IM payload rules (IM v1 file items, IM v2 `chat.*`), in one place. Every judge calls
//! these functions: the report form of this crate (`xagent-connector check`, the C ABI), the
//! single-pass form on the typed packet, and the typed IM checks of `xagent-profile-im` (which
//! both runtimes apply before a message is queued, sent or handed on). Each function walks one
//! payload, seen through a small view ([`FileItem`], [`Field`]), so the `serde_json::Value` form
//! and the typed form go through the same code, and reports each broken rule as a [`Break`]
//! (its rule, where, and for which sender) to a visitor that may stop the walk. Nothing here
//! allocates.
//!
//! - A `download_url` (or a file item's `url`) is an absolute `http`/`https` URL or a relative
//!   Connector URI (IM v2 §5). Any other scheme (`file:`, `data:`, `ftp:`, a Windows drive
//!   `C:`), a UNC or backslash path, whitespace or control characters, or an empty value is
//!   refused: such a value would point xAgent at a local file or carry bytes in the packet.
//! - File bytes, base64 and local paths never travel in an IM payload (IM v2 §5, Device §4):
//!   a message or file item with a field named in [`FORBIDDEN_BYTE_FIELDS`] is refused.
//! - xAgent-internal identities ([`FORBIDDEN_IDENTITY_FIELDS`]) never appear in an IM payload
//!   (IM v1 §10, IM v2 §3), at its top level or in a file item (a file item is part of the
//!   payload).
//! - A Connector-sent `chat.message` file carries `download_url` (IM v2 §5). Judged without a
//!   sender, the rule is applied for the Connector direction and the break names that sender.
//!
//! The generated schema of `chat.message` files expresses the URL and byte rules too
//! (`download_url` pattern [`xagent_protocol_types::DOWNLOAD_URL_PATTERN`], `propertyNames`);
//! a test keeps that pattern and [`download_url_allowed`] in agreement.

use std::ops::ControlFlow;

use serde_json::Value;
use xagent_protocol_types::{
    AckStatus, ActivityStatus, ChatActivity, ChatFile, ChatMessage, ChatMessageAck,
    ChatMessageDelta, FileType, MessageId, MessagePush, PushFile, Side,
};

use crate::report::{Rule, Severity};
use crate::rules::{
    CHAT_ACK_REJECTED, CHAT_ACK_STATUS, CHAT_ACTIVITY_CONTENT, CHAT_ACTIVITY_STATUS,
    CHAT_ACTIVITY_TOOL_NAME, CHAT_DELTA_FILES, CHAT_DELTA_SEQUENCE, CHAT_DELTA_TEXT,
    CHAT_MESSAGE_CONTENT, CHAT_MESSAGE_DOWNLOAD_URL, IM_DOWNLOAD_URL_SCHEME, IM_FILE_BYTES,
    IM_FILE_REF, IM_FILE_TYPE, IM_FILE_URL, IM_V1_FORBIDDEN_FIELD, IM_V2_FORBIDDEN_FIELD,
    IM_V2_MESSAGE_ID,
};

/// xAgent-internal identities no IM payload may carry.
pub const FORBIDDEN_IDENTITY_FIELDS: &[&str] =
    &["session_id", "user_connector_id", "user_id", "connector_id", "role"];

/// Field names that would carry file bytes or local paths, refused in messages and file items.
/// Files travel only as a `file_ref` through the Transfer Plane.
pub const FORBIDDEN_BYTE_FIELDS: &[&str] = xagent_protocol_types::FORBIDDEN_FILE_BYTE_FIELDS;

/// Argument names of IM Tools that would let the model pick where a message goes or hand the
/// Connector a platform credential (IM v1 §4, §6): conversation, room and contact ids, user
/// and sender ids, phone numbers, bot and context tokens. The channel's binding decides the
/// target; a reply to one message takes an opaque `reply_ref`. Compared without case, `_` and
/// `-` ([`crate::argument_name_in`]), so `chatId` and `CHAT-ID` are refused as `chat_id` is.
pub const FORBIDDEN_TOOL_ARGUMENTS: &[&str] = &[
    "chat",
    "chat_id",
    "chat_ids",
    "conversation",
    "conversation_id",
    "room",
    "room_id",
    "thread_id",
    "group_id",
    "channel_id",
    "contact",
    "contact_id",
    "contact_name",
    "contacts",
    "recipient",
    "recipient_id",
    "recipients",
    "receiver",
    "receiver_id",
    "to",
    "to_user",
    "to_user_id",
    "target",
    "target_id",
    "peer",
    "peer_id",
    "user",
    "user_id",
    "open_id",
    "union_id",
    "sender_id",
    "phone",
    "phone_number",
    "bot_token",
    "token",
    "access_token",
    "context_token",
    "api_key",
    "app_secret",
    "secret",
    "password",
];

/// True when an IM Tool argument named `name` would be a send target or a platform credential
/// ([`FORBIDDEN_TOOL_ARGUMENTS`]).
pub fn is_forbidden_tool_argument(name: &str) -> bool {
    crate::argument_name_in(name, FORBIDDEN_TOOL_ARGUMENTS)
}

/// Fields no `chat.activity` may carry (IM v2 §8): the model's reasoning, a Tool call's
/// arguments or result, error details. (Identities and byte fields have their own rules.)
pub const FORBIDDEN_ACTIVITY_FIELDS: &[&str] = &[
    "reasoning",
    "reasoning_content",
    "thought",
    "thoughts",
    "arguments",
    "args",
    "input",
    "result",
    "results",
    "output",
    "error",
    "error_message",
    "errors",
    "stack",
    "url",
];

/// True when a `chat.activity` field named `key` would leak reasoning, a Tool call's
/// arguments or result, or error details ([`FORBIDDEN_ACTIVITY_FIELDS`]).
pub fn is_forbidden_activity_field(key: &str) -> bool {
    FORBIDDEN_ACTIVITY_FIELDS.contains(&key)
}

/// True when an activity's `tool_name` is a path or a URL rather than a name: it contains a
/// slash or a backslash, or starts with a drive letter (`C:`) or a URL scheme such as `https:`,
/// `file:` or `data:`. (`server:tool`-style names with another prefix pass.)
pub fn tool_name_is_path_or_url(name: &str) -> bool {
    const URL_SCHEMES: &[&str] =
        &["http", "https", "file", "data", "ftp", "ftps", "mailto", "javascript", "ws", "wss"];
    name.contains(['/', '\\'])
        || scheme_of(name).is_some_and(|scheme| {
            scheme.len() == 1 || URL_SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme))
        })
}

/// True when `key` names an xAgent-internal identity.
pub fn is_forbidden_identity_field(key: &str) -> bool {
    FORBIDDEN_IDENTITY_FIELDS.contains(&key)
}

/// True when `key` would carry file bytes, base64 or a local path.
pub fn is_forbidden_byte_field(key: &str) -> bool {
    FORBIDDEN_BYTE_FIELDS.contains(&key)
}

/// True when `url` may be a file item's `download_url`: non-empty, no whitespace, control
/// characters or U+FEFF, not starting with a backslash, and either scheme-less (a relative Connector
/// URI such as `/files/refs/file_1`) or with the scheme `http` or `https` (any case).
pub fn download_url_allowed(url: &str) -> bool {
    // U+FEFF counts as whitespace in ECMA-262 regular expressions (the schema pattern) though
    // not in Unicode's White_Space; refuse it here too so both forms agree.
    let invisible = |c: char| c.is_whitespace() || c.is_control() || c == '\u{feff}';
    if url.is_empty() || url.starts_with('\\') || url.chars().any(invisible) {
        return false;
    }
    match scheme_of(url) {
        None => true,
        Some(scheme) => scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"),
    }
}

/// The URI scheme `url` starts with (RFC 3986: a letter, then letters, digits, `+`, `-`, `.`,
/// then `:`), if any.
fn scheme_of(url: &str) -> Option<&str> {
    let (candidate, _) = url.split_once(':')?;
    let mut bytes = candidate.bytes();
    let first = bytes.next()?;
    (first.is_ascii_alphabetic()
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')))
    .then_some(candidate)
}

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
    fn identity_rule(self) -> &'static Rule {
        match self {
            Self::V1 => &IM_V1_FORBIDDEN_FIELD,
            Self::V2 => &IM_V2_FORBIDDEN_FIELD,
        }
    }
}

/// Reports `rule` at `place` and returns whether to go on.
fn report(
    visit: &mut Visit<'_>,
    rule: &'static Rule,
    place: Place<'_>,
    hint: &'static str,
) -> ControlFlow<()> {
    visit(Break { rule, place, hint, sender: None })
}

/// `im_v1.forbidden_field` / `im_v2.forbidden_field` and `im.file_bytes` on the extra keys of a
/// payload (`file: None`) or of a file item.
pub fn check_keys<'k>(
    keys: impl Iterator<Item = &'k str>,
    profile: Profile,
    bytes: bool,
    file: Option<usize>,
    visit: &mut Visit<'_>,
) -> ControlFlow<()> {
    for key in keys {
        let place = match file {
            Some(i) => Place::File(i, key),
            None => Place::Field(key),
        };
        if is_forbidden_identity_field(key) {
            report(
                visit,
                profile.identity_rule(),
                place,
                "an xAgent-internal identity must not appear in an IM payload; routing is by connector_channel_id",
            )?;
        }
        if bytes && is_forbidden_byte_field(key) {
            report(
                visit,
                &IM_FILE_BYTES,
                place,
                "this field would carry file bytes or a local path; upload the file and send its file_ref",
            )?;
        }
    }
    ControlFlow::Continue(())
}

/// The file-item rules over `files` (`payload.files`): `im.file_ref` (present, unique),
/// `im.file_bytes`, the identity rule, `im.download_url_scheme` on `download_url` and `url`,
/// `im.file_type` (required in v2, checked when present in v1), and the URL rule of the
/// Profile: `chat_message.download_url` for a Connector-sent v2 file, the `im.file_url`
/// warning for a v1 file without any URL. `sender: None` applies the Connector-direction rule
/// and names that sender in the break.
pub fn check_files<F: FileItem>(
    files: &[F],
    profile: Profile,
    sender: Option<Side>,
    visit: &mut Visit<'_>,
) -> ControlFlow<()> {
    for (i, file) in files.iter().enumerate() {
        match file.field("file_ref").non_empty() {
            None => report(
                visit,
                &IM_FILE_REF,
                Place::File(i, "file_ref"),
                "each file item needs a non-empty file_ref",
            )?,
            Some(file_ref) => {
                if files[..i].iter().any(|f| f.field("file_ref") == Field::Text(file_ref)) {
                    report(
                        visit,
                        &IM_FILE_REF,
                        Place::File(i, "file_ref"),
                        "file_ref must be unique within the message",
                    )?;
                }
            }
        }
        check_keys(file.extra_keys(), profile, true, Some(i), visit)?;
        for key in ["download_url", "url"] {
            if let Field::Text(url) = file.field(key)
                && !download_url_allowed(url)
            {
                report(
                    visit,
                    &IM_DOWNLOAD_URL_SCHEME,
                    Place::File(i, key),
                    "must be an http(s) URL or a relative Connector URI, never a file:, data: or other scheme or a local path",
                )?;
            }
        }
        let file_type = file.field("type");
        let type_ok = matches!(file_type, Field::Text(t) if FileType::parse(t).is_known());
        if (profile == Profile::V2 || file_type != Field::Absent) && !type_ok {
            report(
                visit,
                &IM_FILE_TYPE,
                Place::File(i, "type"),
                "type must be image, video, audio or file",
            )?;
        }
        let has_url = file.field("download_url").non_empty().is_some();
        match profile {
            Profile::V2 => {
                if !has_url && sender != Some(Side::Xagent) {
                    visit(Break {
                        rule: &CHAT_MESSAGE_DOWNLOAD_URL,
                        place: Place::File(i, "download_url"),
                        hint: "a Connector-to-xAgent file needs download_url",
                        sender: sender.is_none().then_some(Side::Connector),
                    })?;
                }
            }
            Profile::V1 => {
                if !has_url && file.field("url").non_empty().is_none() {
                    report(
                        visit,
                        &IM_FILE_URL,
                        Place::File(i, "download_url"),
                        "xAgent reads files through download_url (or url)",
                    )?;
                }
            }
        }
    }
    ControlFlow::Continue(())
}

/// What the `chat.message` rules read of a message.
#[derive(Clone, Copy, Debug)]
pub struct MessageView<'a, F, K> {
    /// `message_id`.
    pub message_id: Field<'a>,
    /// `text`.
    pub text: Field<'a>,
    /// `files`, when it is an array.
    pub files: Option<&'a [F]>,
    /// The payload keys the typed model does not define.
    pub extra_keys: K,
}

/// The `chat.message` rules (IM v2 §3, §5): the identity and byte rules on the payload,
/// `im_v2.message_id`, `chat_message.content` and the file rules ([`check_files`]) for `sender`.
pub fn check_chat_message<'a, F: FileItem, K: Iterator<Item = &'a str>>(
    message: MessageView<'a, F, K>,
    sender: Option<Side>,
    visit: &mut Visit<'_>,
) -> ControlFlow<()> {
    check_keys(message.extra_keys, Profile::V2, true, None, visit)?;
    check_message_id(message.message_id, visit)?;
    let has_text = message.text.non_empty().is_some();
    let has_files = message.files.is_some_and(|f| !f.is_empty());
    if !has_text && !has_files {
        report(
            visit,
            &CHAT_MESSAGE_CONTENT,
            Place::Payload,
            "a chat.message needs non-empty text or files",
        )?;
    }
    match message.files {
        Some(files) => check_files(files, Profile::V2, sender, visit),
        None => ControlFlow::Continue(()),
    }
}

/// `chat.message` rules on the typed message.
pub fn check_typed_chat_message(
    message: &ChatMessage,
    sender: Option<Side>,
    visit: &mut Visit<'_>,
) -> ControlFlow<()> {
    check_chat_message(
        MessageView {
            message_id: Field::Text(message.message_id.as_str()),
            text: Field::opt(message.text.as_deref()),
            files: Some(&message.files),
            extra_keys: message.extra.keys().map(String::as_str),
        },
        sender,
        visit,
    )
}

/// `im_v2.message_id`: a non-empty string.
pub fn check_message_id(message_id: Field<'_>, visit: &mut Visit<'_>) -> ControlFlow<()> {
    if message_id.non_empty().is_none() {
        report(
            visit,
            &IM_V2_MESSAGE_ID,
            Place::Field("message_id"),
            "message_id must be a non-empty string",
        )?;
    }
    ControlFlow::Continue(())
}

/// The `chat.message.delta` rules (IM v2 §6): the identity rule, `im_v2.message_id`,
/// `chat_delta.sequence` (`sequence`: `None` when missing or not a non-negative integer),
/// `chat_delta.text` (`text_is_string`) and `chat_delta.files` (`has_files`: a `files` key).
pub fn check_delta<'k>(
    message_id: Field<'_>,
    sequence: Option<u64>,
    text_is_string: bool,
    extra_keys: impl Iterator<Item = &'k str>,
    visit: &mut Visit<'_>,
) -> ControlFlow<()> {
    let mut has_files = false;
    let keys = extra_keys.inspect(|k| has_files |= *k == "files");
    check_keys(keys, Profile::V2, false, None, visit)?;
    check_message_id(message_id, visit)?;
    if sequence.is_none_or(|s| s < 1) {
        report(
            visit,
            &CHAT_DELTA_SEQUENCE,
            Place::Field("sequence"),
            "sequence must be an integer starting at 1",
        )?;
    }
    if !text_is_string {
        report(
            visit,
            &CHAT_DELTA_TEXT,
            Place::Field("text"),
            "a delta carries its text as a string",
        )?;
    }
    if has_files {
        report(
            visit,
            &CHAT_DELTA_FILES,
            Place::Field("files"),
            "files belong in the final chat.message, not in a delta",
        )?;
    }
    ControlFlow::Continue(())
}

/// `chat.message.delta` rules on the typed delta.
pub fn check_typed_delta(delta: &ChatMessageDelta, visit: &mut Visit<'_>) -> ControlFlow<()> {
    check_delta(
        Field::Text(delta.message_id.as_str()),
        Some(delta.sequence),
        true,
        delta.extra.keys().map(String::as_str),
        visit,
    )
}

/// The `chat.message.ack` rules (IM v2 §7) on the payload: the identity rule,
/// `im_v2.message_id`, `chat_ack.status` and `chat_ack.rejected` (`code` a non-empty string,
/// `retryable_is_bool`).
pub fn check_ack<'k>(
    message_id: Field<'_>,
    status: Field<'_>,
    code: Field<'_>,
    retryable_is_bool: bool,
    extra_keys: impl Iterator<Item = &'k str>,
    visit: &mut Visit<'_>,
) -> ControlFlow<()> {
    check_keys(extra_keys, Profile::V2, false, None, visit)?;
    check_message_id(message_id, visit)?;
    let status = match status {
        Field::Text(s) => Some(AckStatus::parse(s)),
        _ => None,
    };
    if !status.as_ref().is_some_and(AckStatus::is_known) {
        report(
            visit,
            &CHAT_ACK_STATUS,
            Place::Field("status"),
            "status must be accepted, duplicate or rejected",
        )?;
    }
    if status == Some(AckStatus::Rejected) {
        if code.non_empty().is_none() {
            report(
                visit,
                &CHAT_ACK_REJECTED,
                Place::Field("code"),
                "a rejected ack gives a stable code",
            )?;
        }
        if !retryable_is_bool {
            report(
                visit,
                &CHAT_ACK_REJECTED,
                Place::Field("retryable"),
                "a rejected ack gives a Boolean retryable",
            )?;
        }
    }
    ControlFlow::Continue(())
}

/// `chat.message.ack` rules on the typed ack.
pub fn check_typed_ack(ack: &ChatMessageAck, visit: &mut Visit<'_>) -> ControlFlow<()> {
    check_ack(
        Field::Text(ack.message_id.as_str()),
        Field::Text(ack.status.as_str()),
        Field::opt(ack.code.as_ref().map(|c| c.as_str())),
        ack.retryable.is_some(),
        ack.extra.keys().map(String::as_str),
        visit,
    )
}

/// The `chat.activity` rules (IM v2 §8): the identity and byte rules, `chat_activity.status`,
/// `chat_activity.tool_name` (required for `tool`, 1 to 256 bytes; forbidden otherwise) and
/// `chat_activity.content` (no reasoning, Tool arguments or results, or error details among
/// the fields, [`FORBIDDEN_ACTIVITY_FIELDS`]; no path or URL as `tool_name`).
pub fn check_activity<'k>(
    status: Field<'_>,
    tool_name: Field<'_>,
    extra_keys: impl Iterator<Item = &'k str>,
    visit: &mut Visit<'_>,
) -> ControlFlow<()> {
    for key in extra_keys {
        check_keys(std::iter::once(key), Profile::V2, true, None, visit)?;
        if is_forbidden_activity_field(key) {
            report(
                visit,
                &CHAT_ACTIVITY_CONTENT,
                Place::Field(key),
                "an activity is a redacted state: no reasoning, Tool arguments or results, or error details",
            )?;
        }
    }
    let status = match status {
        Field::Text(s) => Some(ActivityStatus::parse(s)),
        _ => None,
    };
    if !status.as_ref().is_some_and(ActivityStatus::is_known) {
        report(
            visit,
            &CHAT_ACTIVITY_STATUS,
            Place::Field("status"),
            "status must be thinking, tool or idle",
        )?;
    }
    let is_tool = status == Some(ActivityStatus::Tool);
    let name_ok = |name: &str| {
        !name.is_empty() && name.len() <= xagent_protocol_types::ACTIVITY_TOOL_NAME_MAX_BYTES
    };
    match (is_tool, tool_name) {
        (true, Field::Text(name)) if name_ok(name) => {}
        (true, _) => report(
            visit,
            &CHAT_ACTIVITY_TOOL_NAME,
            Place::Field("tool_name"),
            "status tool needs a tool_name of 1 to 256 bytes",
        )?,
        (false, Field::Absent) => {}
        (false, _) => report(
            visit,
            &CHAT_ACTIVITY_TOOL_NAME,
            Place::Field("tool_name"),
            "tool_name is allowed only with status tool",
        )?,
    }
    if let Field::Text(name) = tool_name
        && tool_name_is_path_or_url(name)
    {
        report(
            visit,
            &CHAT_ACTIVITY_CONTENT,
            Place::Field("tool_name"),
            "tool_name names the Tool; a path or URL does not belong in an activity",
        )?;
    }
    ControlFlow::Continue(())
}

/// `chat.activity` rules on the typed activity.
pub fn check_typed_activity(activity: &ChatActivity, visit: &mut Visit<'_>) -> ControlFlow<()> {
    check_activity(
        Field::Text(activity.status.as_str()),
        Field::opt(activity.tool_name.as_deref()),
        activity.extra.keys().map(String::as_str),
        visit,
    )
}

/// What a `message.push` cites of its Card (IM v1 §6): the reply Tool, the Skill and the Skill's
/// Tools, and the Connector's guidance text. Read from the payload by [`check_push`].
#[derive(Clone, Copy, Debug)]
pub struct PushCitations<'a, T> {
    /// `reply.tool_id`.
    pub reply_tool_id: Field<'a>,
    /// `skill.name`.
    pub skill_name: Field<'a>,
    /// `skill.tool_ids[]`.
    pub skill_tool_ids: T,
    /// `activation_message`: written by the Connector for the Agent, so a Skill name or Tool id
    /// in it is a citation. (`text` quotes the user's words and is not read.)
    pub activation_message: Field<'a>,
}

/// The words of a Connector-written text that cite a Skill (they start with `connector-`) or a
/// Tool of the Card's Tool namespace (they start with the part before the first `_` of a Card
/// Tool id, plus `_`, as `wechat_` for `wechat_message_send`): each as `(word, is_skill)`.
fn cited_words<'t>(
    text: &'t str,
    tool_ids: &'t [String],
) -> impl Iterator<Item = (&'t str, bool)> + 't {
    let word_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    text.split(move |c: char| !word_char(c)).map(|w| w.trim_end_matches(['.', '-'])).filter_map(
        move |word| {
            if word.starts_with(xagent_protocol_types::SKILL_NAME_PREFIX)
                && word.len() > xagent_protocol_types::SKILL_NAME_PREFIX.len()
            {
                return Some((word, true));
            }
            let namespace = |id: &String| {
                id.split_once('_').is_some_and(|(head, _)| {
                    !head.is_empty() && word.strip_prefix(head).is_some_and(|r| r.starts_with('_'))
                })
            };
            tool_ids.iter().any(namespace).then_some((word, false))
        },
    )
}

/// `message_push.card_reference` over what a push cites, against the Card's facts: the reply
/// Tool and the Skill's Tools are Card Tools, the Skill name is one the Card declares (its
/// primary Skill or a `related_skill_ids` entry), and every Skill name or Tool id the
/// `activation_message` cites (see [`PushCitations::activation_message`]) is too.
pub fn check_push_citations<'a, T: Iterator<Item = Field<'a>>>(
    citations: PushCitations<'a, T>,
    card: &crate::CardFacts,
    visit: &mut Visit<'_>,
) -> ControlFlow<()> {
    use crate::rules::MESSAGE_PUSH_CARD_REFERENCE;
    let is_tool = |id: &str| card.tool_ids.iter().any(|t| t == id);
    // A Skill the Card declares: its primary Skill, or one a Tool relates.
    let is_skill = |name: &str| {
        card.card_id.as_deref().is_none_or(|id| {
            xagent_protocol_types::primary_skill_name(id).as_str() == name
                || card.related_skill_ids.iter().any(|r| r == name)
        })
    };
    if let Field::Text(tool) = citations.reply_tool_id
        && !is_tool(tool)
    {
        report(
            visit,
            &MESSAGE_PUSH_CARD_REFERENCE,
            Place::Member("reply", "tool_id", None),
            "reply.tool_id must be a Tool the Card declares",
        )?;
    }
    if let Field::Text(name) = citations.skill_name
        && !is_skill(name)
    {
        report(
            visit,
            &MESSAGE_PUSH_CARD_REFERENCE,
            Place::Member("skill", "name", None),
            "skill.name must be the Card's primary Skill or one its Tools relate",
        )?;
    }
    for (i, tool) in citations.skill_tool_ids.enumerate() {
        if !matches!(tool, Field::Text(t) if is_tool(t)) {
            report(
                visit,
                &MESSAGE_PUSH_CARD_REFERENCE,
                Place::Member("skill", "tool_ids", Some(i)),
                "skill.tool_ids must name Tools the Card declares",
            )?;
        }
    }
    if let Field::Text(text) = citations.activation_message {
        for (word, skill) in cited_words(text, &card.tool_ids) {
            if (skill && !is_skill(word)) || (!skill && !is_tool(word)) {
                report(
                    visit,
                    &MESSAGE_PUSH_CARD_REFERENCE,
                    Place::Field("activation_message"),
                    "the guidance cites a Skill or Tool the Card does not declare; cite the Card's names exactly",
                )?;
            }
        }
    }
    ControlFlow::Continue(())
}

/// The `message.push` rules (IM v1 §5, §6, §9, §10; protocol 8.21): the Must fields
/// (`message_push.required_field`), `message_push.profile`, the Should fields (warnings),
/// at most one target Session reference, then the identity and byte rules, the v1 file rules
/// and, given the Card, what the push cites of it ([`check_push_citations`]). `get` reads a
/// payload field by name.
pub fn check_push<'a, F: FileItem, K: Iterator<Item = &'a str>, T: Iterator<Item = Field<'a>>>(
    get: impl Fn(&str) -> Field<'a>,
    files: Option<&'a [F]>,
    extra_keys: K,
    citations: PushCitations<'a, T>,
    card: Option<&crate::CardFacts>,
    visit: &mut Visit<'_>,
) -> ControlFlow<()> {
    use crate::rules::{
        MESSAGE_PUSH_PROFILE, MESSAGE_PUSH_RECOMMENDED_FIELD, MESSAGE_PUSH_REQUIRED_FIELD,
        MESSAGE_PUSH_TARGET_SESSION,
    };
    for key in ["provider", "event_kind", "message_id", "sender_id", "message_type"] {
        if get(key).non_empty().is_none() {
            report(
                visit,
                &MESSAGE_PUSH_REQUIRED_FIELD,
                Place::Field(key),
                "a Must field of IM v1: a non-empty string",
            )?;
        }
    }
    if !matches!(get("raw_text"), Field::Text(_)) {
        report(
            visit,
            &MESSAGE_PUSH_REQUIRED_FIELD,
            Place::Field("raw_text"),
            "raw_text is required (empty string when there is no text)",
        )?;
    }
    if ["text", "content", "message"].iter().all(|k| get(k).non_empty().is_none()) {
        report(
            visit,
            &MESSAGE_PUSH_REQUIRED_FIELD,
            Place::Field("text"),
            "text (or content) with the user-visible message is required",
        )?;
    }
    if get("profile") != Field::Text(xagent_protocol_types::PROFILE_IM_V1) {
        report(
            visit,
            &MESSAGE_PUSH_PROFILE,
            Place::Field("profile"),
            "profile must be \"xagent.im.v1\"",
        )?;
    }
    if ["sender_name", "display_name"].iter().all(|k| get(k).non_empty().is_none()) {
        report(
            visit,
            &MESSAGE_PUSH_RECOMMENDED_FIELD,
            Place::Field("display_name"),
            "a sender_name or display_name should be given",
        )?;
    }
    for key in ["chat_type", "activation_message", "reply", "skill"] {
        if get(key) == Field::Absent {
            report(
                visit,
                &MESSAGE_PUSH_RECOMMENDED_FIELD,
                Place::Field(key),
                "a Should field of IM v1",
            )?;
        }
    }
    let targets = ["target_session_ref", "session_ref", "target_session_id"]
        .iter()
        .filter(|k| !matches!(get(k), Field::Absent | Field::Null))
        .count();
    if targets > 1 {
        report(
            visit,
            &MESSAGE_PUSH_TARGET_SESSION,
            Place::Payload,
            "give at most one target Session reference",
        )?;
    }
    check_keys(extra_keys, Profile::V1, true, None, visit)?;
    if let Some(files) = files {
        check_files(files, Profile::V1, None, visit)?;
    }
    match card {
        Some(card) => check_push_citations(citations, card, visit),
        None => ControlFlow::Continue(()),
    }
}

/// `message.push` rules on the typed push, against the Card's facts when given.
pub fn check_typed_push(
    push: &MessagePush,
    card: Option<&crate::CardFacts>,
    visit: &mut Visit<'_>,
) -> ControlFlow<()> {
    let get = |key: &str| -> Field<'_> {
        fn text(v: &Option<String>) -> Field<'_> {
            Field::opt(v.as_deref())
        }
        let some = |present: bool| if present { Field::Other } else { Field::Absent };
        match key {
            "provider" => text(&push.provider),
            "profile" => text(&push.profile),
            "event_kind" => text(&push.event_kind),
            "message_id" => Field::opt(push.message_id.as_ref().map(MessageId::as_str)),
            "sender_id" => text(&push.sender_id),
            "sender_name" => text(&push.sender_name),
            "display_name" => text(&push.display_name),
            "chat_type" => text(&push.chat_type),
            "message_type" => text(&push.message_type),
            "raw_text" => text(&push.raw_text),
            "text" => text(&push.text),
            "content" => text(&push.content),
            "message" => text(&push.message),
            "activation_message" => text(&push.activation_message),
            "reply" => some(push.reply.is_some()),
            "skill" => some(push.skill.is_some()),
            "target_session_ref" => text(&push.target_session_ref),
            "session_ref" => text(&push.session_ref),
            "target_session_id" => text(&push.target_session_id),
            other => Field::of(push.extra.get(other)),
        }
    };
    let citations = PushCitations {
        reply_tool_id: Field::opt(
            push.reply.as_ref().and_then(|r| r.tool_id.as_ref()).map(|t| t.as_str()),
        ),
        skill_name: Field::opt(
            push.skill.as_ref().and_then(|s| s.name.as_ref()).map(|n| n.as_str()),
        ),
        skill_tool_ids: push
            .skill
            .iter()
            .flat_map(|s| s.tool_ids.iter())
            .map(|t| Field::Text(t.as_str())),
        activation_message: Field::opt(push.activation_message.as_deref()),
    };
    check_push(
        get,
        Some(&push.files),
        push.extra.keys().map(String::as_str),
        citations,
        card,
        visit,
    )
}

/// True when `visit`-style walking of `walk` finds no error: the verdict alone, stopping at
/// the first error (the single-pass form).
pub fn passes(walk: impl FnOnce(&mut Visit<'_>) -> ControlFlow<()>) -> bool {
    let mut visit = |b: Break<'_>| {
        if b.is_error() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    };
    walk(&mut visit).is_continue()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples shared by this test and the schema-agreement test in `tests/im_rules.rs`.
    pub(crate) const ALLOWED: &[&str] = &[
        "/files/refs/file_1?exp=2&sig=ab",
        "files/refs/file_1",
        "https://cdn.example/x.png",
        "HTTP://h/x",
        "HtTpS://h:8080/a/b",
        "?x=1",
        "a/b:c",
    ];
    pub(crate) const REFUSED: &[&str] = &[
        "",
        "file:///etc/passwd",
        "FILE:///etc/passwd",
        "file:relative",
        "data:image/png;base64,AAAA",
        "ftp://h/x",
        "mailto:a@b",
        "javascript:alert(1)",
        "C:\\x.png",
        "c:/x.png",
        "\\\\server\\share\\x",
        "\\x",
        " file:///etc/passwd",
        "/files/refs/f 1",
        "/files/refs/f\n",
    ];

    #[test]
    fn rule_im_download_url_scheme() {
        for url in ALLOWED {
            assert!(download_url_allowed(url), "{url:?} should be allowed");
        }
        for url in REFUSED {
            assert!(!download_url_allowed(url), "{url:?} should be refused");
        }
    }

    #[test]
    fn rule_im_file_bytes_and_identities() {
        for key in ["base64", "bytes", "data", "content_base64", "local_path", "path"] {
            assert!(is_forbidden_byte_field(key), "{key}");
        }
        for key in ["filename", "mime_type", "download_url", "file_ref"] {
            assert!(!is_forbidden_byte_field(key), "{key}");
        }
        for key in ["session_id", "user_id", "user_connector_id", "connector_id", "role"] {
            assert!(is_forbidden_identity_field(key), "{key}");
        }
    }
}
