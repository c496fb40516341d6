//! IM payload rules checked before a payload is queued or sent, and the content fingerprint the
//! receiver uses to tell a duplicate from a conflict.

use std::ops::ControlFlow;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use xagent_protocol_types::{
    ActivityStatus, ChatActivity, ChatFile, ChatMessage, MessageId, PushFile, Side,
};

use xagent_protocol_validate::{im, rules};

use crate::PayloadError;

/// xAgent-internal identities that no IM payload may carry (the validator's list).
pub const FORBIDDEN_IDENTITY_FIELDS: &[&str] = im::FORBIDDEN_IDENTITY_FIELDS;

/// Field names that would carry file bytes or local paths (checked in unknown fields of messages
/// and file items). Files travel only as `file_ref` through the Transfer Plane. The validator's
/// list, so `xagent-connector check` and the runtime refuse the same fields.
pub const FORBIDDEN_BYTE_FIELDS: &[&str] = im::FORBIDDEN_BYTE_FIELDS;

/// Maximum size of `chat.activity.tool_name` in bytes.
pub const TOOL_NAME_MAX_BYTES: usize = xagent_protocol_types::ACTIVITY_TOOL_NAME_MAX_BYTES;

/// The first error a shared rule walk of `xagent_protocol_validate::im` reports, as the
/// [`PayloadError`] that names it (`file_ref` gives the reference of the file at an index).
pub(crate) fn first_error(
    walk: impl FnOnce(&mut im::Visit<'_>) -> ControlFlow<()>,
    file_ref: impl Fn(usize) -> String,
) -> Result<(), PayloadError> {
    let mut found = None;
    let mut visit = |b: im::Break<'_>| {
        if !b.is_error() {
            return ControlFlow::Continue(());
        }
        found = Some(to_error(&b, &file_ref));
        ControlFlow::Break(())
    };
    let _ = walk(&mut visit);
    found.map_or(Ok(()), Err)
}

/// The typed error of one broken shared rule.
fn to_error(b: &im::Break<'_>, file_ref: &dyn Fn(usize) -> String) -> PayloadError {
    let key = b.place.key().unwrap_or_default().to_owned();
    let file = || b.place.file().map(file_ref).unwrap_or_default();
    match b.rule.id {
        id if id == rules::IM_V2_MESSAGE_ID.id => PayloadError::MissingMessageId,
        id if id == rules::CHAT_MESSAGE_CONTENT.id => {
            PayloadError::EmptyMessage(MessageId::new(key))
        }
        id if id == rules::IM_FILE_REF.id => match file() {
            r if r.is_empty() => PayloadError::EmptyFileRef,
            r => PayloadError::DuplicateFileRef(r),
        },
        id if id == rules::IM_FILE_TYPE.id => {
            PayloadError::UnknownFileType { file_ref: file(), file_type: String::new() }
        }
        id if id == rules::CHAT_MESSAGE_DOWNLOAD_URL.id => PayloadError::MissingDownloadUrl(file()),
        id if id == rules::IM_DOWNLOAD_URL_SCHEME.id => PayloadError::BadDownloadUrl(file()),
        id if id == rules::IM_FILE_BYTES.id => PayloadError::FileBytesForbidden(key),
        id if id == rules::IM_V1_FORBIDDEN_FIELD.id || id == rules::IM_V2_FORBIDDEN_FIELD.id => {
            PayloadError::InternalIdentityForbidden(key)
        }
        id if id == rules::CHAT_ACTIVITY_STATUS.id => {
            PayloadError::UnknownActivityStatus(String::new())
        }
        id if id == rules::CHAT_ACTIVITY_TOOL_NAME.id => PayloadError::ToolNameForbidden,
        id if id == rules::MESSAGE_PUSH_REQUIRED_FIELD.id => match push_field(&key) {
            Some("message_id") => PayloadError::MissingMessageId,
            Some(name) => PayloadError::MissingPushField(name),
            None => PayloadError::Rule { rule: b.rule.id, place: b.place.pointer(), hint: b.hint },
        },
        id if id == rules::MESSAGE_PUSH_PROFILE.id => PayloadError::MissingPushField("profile"),
        id if id == rules::MESSAGE_PUSH_TARGET_SESSION.id => {
            PayloadError::MissingPushField("at most one target session reference")
        }
        _ => PayloadError::Rule { rule: b.rule.id, place: b.place.pointer(), hint: b.hint },
    }
}

/// The static name of a Must field of `message.push` (for [`PayloadError::MissingPushField`]).
fn push_field(key: &str) -> Option<&'static str> {
    ["provider", "event_kind", "message_id", "sender_id", "message_type", "raw_text", "text"]
        .into_iter()
        .find(|name| *name == key)
}

/// Checks a `chat.message` against the IM v2 payload rules for the given sender: the shared
/// rules of `xagent_protocol_validate::im` (the ones `xagent-connector check` applies), so a
/// non-empty `message_id`; text or files; known file types; a unique, non-empty `file_ref` per
/// file; `download_url` on every Connector -> xAgent file; `http(s)` or relative URLs in
/// `download_url` and `url`; no bytes, local paths or internal identities in the message or its
/// files.
pub fn validate_chat_message(message: &ChatMessage, sender: Side) -> Result<(), PayloadError> {
    first_error(
        |visit| im::check_typed_chat_message(message, Some(sender), visit),
        |i| message.files.get(i).map(|f| f.file_ref.to_string()).unwrap_or_default(),
    )
    .map_err(|error| match error {
        PayloadError::EmptyMessage(_) => PayloadError::EmptyMessage(message.message_id.clone()),
        PayloadError::UnknownFileType { file_ref, .. } => {
            let file_type = message
                .files
                .iter()
                .find(|f| f.file_ref.as_str() == file_ref)
                .map(|f| f.file_type.to_string())
                .unwrap_or_default();
            PayloadError::UnknownFileType { file_ref, file_type }
        }
        other => other,
    })
}

/// Checks a `chat.activity` with the shared rules: a known status; `tool_name` (1..=256 bytes)
/// exactly when the status is `tool`; no internal identities or byte fields.
pub fn validate_activity(activity: &ChatActivity) -> Result<(), PayloadError> {
    first_error(|visit| im::check_typed_activity(activity, visit), |_| String::new()).map_err(
        |error| match (error, &activity.status, &activity.tool_name) {
            (PayloadError::UnknownActivityStatus(_), status, _) => {
                PayloadError::UnknownActivityStatus(status.to_string())
            }
            (PayloadError::ToolNameForbidden, ActivityStatus::Tool, None) => {
                PayloadError::ToolNameRequired
            }
            (PayloadError::ToolNameForbidden, ActivityStatus::Tool, Some(name)) => {
                PayloadError::ToolNameLength(name.len())
            }
            (other, _, _) => other,
        },
    )
}

/// Builds a `chat.message` that passes [`validate_chat_message`] for its sender, so an invalid
/// message cannot be constructed by this path.
#[derive(Clone, Debug)]
#[must_use]
pub struct ChatMessageBuilder {
    message_id: MessageId,
    text: Option<String>,
    files: Vec<ChatFile>,
    created_at: Option<u64>,
}

impl ChatMessageBuilder {
    /// Starts a message with its sender-chosen id.
    pub fn new(message_id: impl Into<MessageId>) -> Self {
        Self { message_id: message_id.into(), text: None, files: Vec::new(), created_at: None }
    }

    /// Sets the complete text.
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }

    /// Adds a file item.
    pub fn file(mut self, file: ChatFile) -> Self {
        self.files.push(file);
        self
    }

    /// Sets the creation time (Unix ms).
    pub fn created_at(mut self, at: u64) -> Self {
        self.created_at = Some(at);
        self
    }

    /// Builds and checks the message for the given sender.
    pub fn build(self, sender: Side) -> Result<ChatMessage, PayloadError> {
        let text = self.text.filter(|t| !t.is_empty());
        let mut message = ChatMessage::with_files(self.message_id, text, self.files);
        message.created_at = self.created_at;
        validate_chat_message(&message, sender)?;
        Ok(message)
    }
}

/// A content fingerprint: hex SHA-256 over a canonical form of a message's business content.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// Wraps a stored fingerprint (e.g. read back from SQLite).
    pub fn from_hex(hex: impl Into<String>) -> Self {
        Self(hex.into())
    }

    /// The hex form, for storage.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Fingerprints a JSON value in canonical form (object keys sorted at every level).
    pub fn of_value(value: &Value) -> Self {
        Self(hex::encode(Sha256::digest(canonical_json(value).as_bytes())))
    }

    /// The fingerprint of a `chat.message`: its complete text (absent = empty) and its ordered
    /// file list by `type`, `file_ref`, `filename`, `mime_type` and `byte_size`.
    /// `download_url` and `expires_at` are left out on purpose: a sender may re-sign a URL when
    /// it redelivers, which is the same message.
    pub fn of_chat_message(message: &ChatMessage) -> Self {
        let files: Vec<Value> =
            message.files.iter().map(|f| Self::file_facts(&PushFile::from(f.clone()))).collect();
        Self::of_value(&serde_json::json!({
            "text": message.text.as_deref().unwrap_or_default(),
            "files": files,
        }))
    }
}

impl Fingerprint {
    /// The facts of one file that a fingerprint covers (no URL, no expiry), v1 and v2 alike.
    pub(crate) fn file_facts(f: &PushFile) -> Value {
        serde_json::json!({
            "type": f.file_type.as_ref().map(|t| t.as_str()),
            "file_ref": f.file_ref.as_str(),
            "filename": f.filename,
            "mime_type": f.mime_type,
            "byte_size": f.byte_size,
        })
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `value` as JSON text with object keys sorted at every level: equal values give equal text
/// whatever the insertion order of their maps. What [`Fingerprint::of_value`] hashes; also a
/// collision-free key where an exact comparison is all that is needed (no hashing).
pub fn canonical_json(value: &Value) -> String {
    let mut text = String::with_capacity(64);
    write_canonical(value, &mut text);
    text
}

/// Writes `value` as JSON with object keys sorted, so equal values give equal text whatever the
/// insertion order of their maps.
pub(crate) fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => write_object(map, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn write_object(map: &Map<String, Value>, out: &mut String) {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    out.push('{');
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&Value::String((*key).clone()).to_string());
        out.push(':');
        if let Some(v) = map.get(*key) {
            write_canonical(v, out);
        }
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use xagent_protocol_types::FileType;

    fn inbound_file(r: &str) -> ChatFile {
        ChatFile::new(FileType::Image, r).with_download_url(format!("/files/refs/{r}"))
    }

    #[test]
    fn valid_text_and_file_messages_pass() {
        let m = ChatMessage::text("m1", "hi");
        validate_chat_message(&m, Side::Connector).unwrap();
        let m = ChatMessage::with_files("m2", None, vec![inbound_file("f1")]);
        validate_chat_message(&m, Side::Connector).unwrap();
        let m = ChatMessage::with_files("m3", None, vec![ChatFile::new(FileType::File, "f1")]);
        validate_chat_message(&m, Side::Xagent).unwrap();
    }

    #[test]
    fn rule_message_needs_text_or_files() {
        let m = ChatMessage::with_files("m1", Some(String::new()), vec![]);
        assert_eq!(
            validate_chat_message(&m, Side::Xagent),
            Err(PayloadError::EmptyMessage("m1".into()))
        );
        let m = ChatMessage::with_files("m1", None, vec![]);
        assert!(validate_chat_message(&m, Side::Xagent).is_err());
    }

    #[test]
    fn rule_message_id_required() {
        let m = ChatMessage::text("", "x");
        assert_eq!(validate_chat_message(&m, Side::Xagent), Err(PayloadError::MissingMessageId));
    }

    #[test]
    fn rule_file_type_enum() {
        let f = ChatFile::new(FileType::parse("document"), "f1").with_download_url("/f");
        let m = ChatMessage::with_files("m", None, vec![f]);
        assert!(matches!(
            validate_chat_message(&m, Side::Connector),
            Err(PayloadError::UnknownFileType { .. })
        ));
    }

    #[test]
    fn rule_file_ref_unique_per_message() {
        let m = ChatMessage::with_files("m", None, vec![inbound_file("f1"), inbound_file("f1")]);
        assert_eq!(
            validate_chat_message(&m, Side::Connector),
            Err(PayloadError::DuplicateFileRef("f1".into()))
        );
        let m = ChatMessage::with_files("m", None, vec![ChatFile::new(FileType::File, "")]);
        assert_eq!(validate_chat_message(&m, Side::Xagent), Err(PayloadError::EmptyFileRef));
    }

    #[test]
    fn rule_inbound_files_need_download_url() {
        let m = ChatMessage::with_files("m", None, vec![ChatFile::new(FileType::Image, "f1")]);
        assert_eq!(
            validate_chat_message(&m, Side::Connector),
            Err(PayloadError::MissingDownloadUrl("f1".into()))
        );
    }

    #[test]
    fn rule_no_bytes_or_local_paths_in_files() {
        for url in ["data:image/png;base64,AAAA", "file:///etc/passwd", "C:\\x.png", "ftp://h/x"] {
            let f = ChatFile::new(FileType::Image, "f1").with_download_url(url);
            let m = ChatMessage::with_files("m", None, vec![f]);
            assert_eq!(
                validate_chat_message(&m, Side::Connector),
                Err(PayloadError::BadDownloadUrl("f1".into())),
                "{url}"
            );
        }
        for url in ["https://h/x", "http://h/x", "/files/refs/f1?exp=1&sig=ab"] {
            let f = ChatFile::new(FileType::Image, "f1").with_download_url(url);
            let m = ChatMessage::with_files("m", None, vec![f]);
            validate_chat_message(&m, Side::Connector).unwrap();
        }
        let mut f = inbound_file("f1");
        f.extra.insert("base64".into(), json!("AAAA"));
        let m = ChatMessage::with_files("m", None, vec![f]);
        assert_eq!(
            validate_chat_message(&m, Side::Connector),
            Err(PayloadError::FileBytesForbidden("base64".into()))
        );
    }

    #[test]
    fn rule_no_internal_identities_in_payload() {
        for field in FORBIDDEN_IDENTITY_FIELDS {
            let mut m = ChatMessage::text("m", "x");
            m.extra.insert((*field).into(), json!("v"));
            assert_eq!(
                validate_chat_message(&m, Side::Xagent),
                Err(PayloadError::InternalIdentityForbidden((*field).into()))
            );
            let mut a = ChatActivity::thinking();
            a.extra.insert((*field).into(), json!("v"));
            assert!(validate_activity(&a).is_err());
        }
    }

    /// Issue 22: a file item's `url` obeys the download URL rule here as in
    /// `xagent-connector check` (the runtimes accepted `file:///etc/passwd` before).
    #[test]
    fn rule_im_download_url_scheme_covers_a_file_items_url() {
        let mut f = inbound_file("f1");
        f.extra.insert("url".into(), json!("file:///etc/passwd"));
        let m = ChatMessage::with_files("m", None, vec![f]);
        for sender in [Side::Connector, Side::Xagent] {
            let error = validate_chat_message(&m, sender).unwrap_err();
            assert_eq!(error, PayloadError::BadDownloadUrl("f1".into()));
            assert_eq!(error.rule(), "im.download_url_scheme");
        }
    }

    /// Issue 22: an internal identity in a file item is refused by every judge (IM v2 §3: the
    /// payload, file items included).
    #[test]
    fn rule_im_v2_forbidden_field_in_a_file_item() {
        let mut f = inbound_file("f1");
        f.extra.insert("user_id".into(), json!("u1"));
        let m = ChatMessage::with_files("m", None, vec![f]);
        let error = validate_chat_message(&m, Side::Connector).unwrap_err();
        assert_eq!(error, PayloadError::InternalIdentityForbidden("user_id".into()));
        assert_eq!(error.rule(), "im_v2.forbidden_field");
    }

    /// Every payload error names the rule id the validator reports for the same payload.
    #[test]
    fn payload_errors_name_the_rule_the_validator_reports() {
        use xagent_protocol_validate::{PacketContext, Validator};
        let mut bad = vec![
            ChatMessage::text("", "x"),
            ChatMessage::with_files("m", None, vec![]),
            ChatMessage::with_files("m", None, vec![inbound_file("f"), inbound_file("f")]),
            ChatMessage::with_files("m", None, vec![ChatFile::new(FileType::Image, "f")]),
            ChatMessage::with_files(
                "m",
                None,
                vec![ChatFile::new(FileType::parse("doc"), "f").with_download_url("/f")],
            ),
            ChatMessage::with_files("m", None, vec![inbound_file("f").with_download_url("data:x")]),
        ];
        let mut with_bytes = inbound_file("f");
        with_bytes.extra.insert("base64".into(), json!("AA"));
        bad.push(ChatMessage::with_files("m", None, vec![with_bytes]));
        let mut with_role = ChatMessage::text("m", "x");
        with_role.extra.insert("role".into(), json!("user"));
        bad.push(with_role);
        for message in bad {
            let error = validate_chat_message(&message, Side::Connector).unwrap_err();
            let packet =
                xagent_protocol_types::Packet::with_payload("p", message.clone()).channel("cch_1");
            let value = packet.to_value().unwrap();
            let context = PacketContext { card: None, sender: Some(Side::Connector) };
            let report = Validator::default().packet(&value, context);
            assert!(!report.valid, "{message:?}");
            assert!(report.has(error.rule()), "{error:?} vs {report:?}");
        }
    }

    #[test]
    fn rule_activity_tool_name() {
        validate_activity(&ChatActivity::tool("web_search")).unwrap();
        validate_activity(&ChatActivity::thinking()).unwrap();
        validate_activity(&ChatActivity::idle()).unwrap();
        let mut a = ChatActivity::tool("x");
        a.tool_name = None;
        assert_eq!(validate_activity(&a), Err(PayloadError::ToolNameRequired));
        let mut a = ChatActivity::thinking();
        a.tool_name = Some("x".into());
        assert_eq!(validate_activity(&a), Err(PayloadError::ToolNameForbidden));
        assert_eq!(
            validate_activity(&ChatActivity::tool("a".repeat(257))),
            Err(PayloadError::ToolNameLength(257))
        );
        validate_activity(&ChatActivity::tool("a".repeat(256))).unwrap();
        assert_eq!(
            validate_activity(&ChatActivity::tool("")),
            Err(PayloadError::ToolNameLength(0))
        );
        let mut a = ChatActivity::idle();
        a.status = ActivityStatus::parse("sleeping");
        assert!(matches!(validate_activity(&a), Err(PayloadError::UnknownActivityStatus(_))));
    }

    #[test]
    fn builder_refuses_invalid_messages() {
        assert!(ChatMessageBuilder::new("m").build(Side::Xagent).is_err());
        let m = ChatMessageBuilder::new("m").text("hi").created_at(5).build(Side::Xagent).unwrap();
        assert_eq!(m.created_at, Some(5));
        assert!(
            ChatMessageBuilder::new("m")
                .file(ChatFile::new(FileType::Image, "f"))
                .build(Side::Connector)
                .is_err()
        );
    }

    #[test]
    fn fingerprint_ignores_map_order_and_url_resigning() {
        let a = Fingerprint::of_value(&json!({"a": 1, "b": [1, {"x": 1, "y": 2}]}));
        let mut m = Map::new();
        m.insert("b".into(), json!([1, {"y": 2, "x": 1}]));
        m.insert("a".into(), json!(1));
        assert_eq!(a, Fingerprint::of_value(&Value::Object(m)));

        let m1 = ChatMessage::with_files(
            "m",
            Some("t".into()),
            vec![inbound_file("f").with_expires_at(1)],
        );
        let mut m2 = m1.clone();
        m2.files[0].download_url = Some("/files/refs/f?exp=2".into());
        m2.files[0].expires_at = Some(2);
        assert_eq!(Fingerprint::of_chat_message(&m1), Fingerprint::of_chat_message(&m2));
        let m3 = ChatMessage::with_files("m", Some("t2".into()), m1.files.clone());
        assert_ne!(Fingerprint::of_chat_message(&m1), Fingerprint::of_chat_message(&m3));
        let m4 = ChatMessage::with_files("m", Some("t".into()), vec![]);
        assert_ne!(Fingerprint::of_chat_message(&m1), Fingerprint::of_chat_message(&m4));
    }
}
