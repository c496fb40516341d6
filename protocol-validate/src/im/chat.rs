//! The IM v2 `chat.*` payloads and the file items and extra keys they carry.

use std::ops::ControlFlow;

use xagent_protocol_types::{
    AckStatus, ActivityStatus, ChatActivity, ChatMessage, ChatMessageAck, ChatMessageDelta,
    FileType, Side,
};

use crate::rules::{
    CHAT_ACK_REJECTED, CHAT_ACK_STATUS, CHAT_ACTIVITY_CONTENT, CHAT_ACTIVITY_STATUS,
    CHAT_ACTIVITY_TOOL_NAME, CHAT_DELTA_FILES, CHAT_DELTA_SEQUENCE, CHAT_DELTA_TEXT,
    CHAT_MESSAGE_CONTENT, CHAT_MESSAGE_DOWNLOAD_URL, IM_DOWNLOAD_URL_SCHEME, IM_FILE_BYTES,
    IM_FILE_REF, IM_FILE_TYPE, IM_FILE_URL, IM_V2_MESSAGE_ID,
};

use super::view::report;
/// xAgent-internal identities no IM payload may carry.
use super::*;

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
