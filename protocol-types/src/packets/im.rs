//! IM Profile packets: `message.push` (v1) and the `chat.*` family (v2).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    AckStatus, ActivityStatus, ChatFile, ErrorCode, Extra, MessageId, PushFile, SkillId, ToolId,
};

/// `message.push` (Connector -> xAgent, IM v1): an inbound target message. Field requirements
/// come from the IM v1 Profile and are checked by the validator and the v1 builder, so reading
/// stays tolerant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct MessagePush {
    /// Target IM provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Always `xagent.im.v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// `im.message.received` for a regular message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_kind: Option<String>,
    /// Stable id within the channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<MessageId>,
    /// Sender id in the target system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_id: Option<String>,
    /// Sender display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_name: Option<String>,
    /// Sender display name (alternative field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Target conversation id (descriptive only, never a routing argument).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<String>,
    /// Conversation type, e.g. `p2p` or `group`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_type: Option<String>,
    /// Message type, e.g. `text`, `image`, `file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_type: Option<String>,
    /// Original user text (empty string when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_text: Option<String>,
    /// User-visible content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// User-visible content (alternative field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// User-visible content (alternative field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Execution guidance for the agent; not user-visible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_message: Option<String>,
    /// How to reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<ReplyHint>,
    /// The Skill to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<SkillHint>,
    /// File references.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<PushFile>,
    /// Target Session reference (at most one of the three).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_session_ref: Option<String>,
    /// Target Session reference (alternative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_ref: Option<String>,
    /// Target Session id (alternative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_session_id: Option<String>,
    /// Provider-specific fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `message.push.reply`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ReplyHint {
    /// Whether a reply is expected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    /// The Tool that replies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_id: Option<ToolId>,
    /// Opaque reference valid only for this channel and Tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_ref: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `message.push.skill`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct SkillHint {
    /// Skill name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<SkillId>,
    /// Related Tool ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_ids: Vec<ToolId>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `chat.message` (both directions, IM v2): one complete, persistable message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
#[schemars(transform = chat_message_needs_content)]
pub struct ChatMessage {
    /// Sender-chosen idempotency key, stable within the channel.
    #[schemars(length(min = 1))]
    pub message_id: MessageId,
    /// Complete text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Files, each with a unique `file_ref`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ChatFile>,
    /// Creation time (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<u64>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

fn chat_message_needs_content(schema: &mut schemars::Schema) {
    schema.insert(
        "anyOf".into(),
        serde_json::json!([
            { "required": ["text"], "properties": { "text": { "type": "string", "minLength": 1 } } },
            { "required": ["files"], "properties": { "files": { "type": "array", "minItems": 1 } } }
        ]),
    );
    if let Some(properties) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        let forbidden =
            crate::IM_FORBIDDEN_IDENTITY_FIELDS.iter().chain(crate::FORBIDDEN_FILE_BYTE_FIELDS);
        for name in forbidden {
            properties.insert((*name).into(), serde_json::Value::Bool(false));
        }
    }
}

impl ChatMessage {
    /// A text message.
    pub fn text(message_id: impl Into<MessageId>, text: impl Into<String>) -> Self {
        Self {
            message_id: message_id.into(),
            text: Some(text.into()),
            files: Vec::new(),
            created_at: None,
            extra: Extra::new(),
        }
    }

    /// A message with files and optional text.
    pub fn with_files(
        message_id: impl Into<MessageId>,
        text: Option<String>,
        files: Vec<ChatFile>,
    ) -> Self {
        Self { message_id: message_id.into(), text, files, created_at: None, extra: Extra::new() }
    }

    /// Sets the creation time.
    #[must_use]
    pub fn created_at(mut self, at: u64) -> Self {
        self.created_at = Some(at);
        self
    }
}

/// `chat.message.delta` (xAgent -> Connector, IM v2): a text fragment of an assistant message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ChatMessageDelta {
    /// The message the fragment belongs to.
    #[schemars(length(min = 1))]
    pub message_id: MessageId,
    /// 1, 2, 3, ... per message.
    #[schemars(range(min = 1))]
    pub sequence: u64,
    /// The fragment.
    pub text: String,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatMessageDelta {
    /// A fragment.
    pub fn new(message_id: impl Into<MessageId>, sequence: u64, text: impl Into<String>) -> Self {
        Self { message_id: message_id.into(), sequence, text: text.into(), extra: Extra::new() }
    }
}

/// `chat.message.ack` (both directions, IM v2). `reply_to` in the envelope names the message
/// packet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
#[schemars(transform = rejected_needs_code)]
pub struct ChatMessageAck {
    /// The acknowledged message.
    #[schemars(length(min = 1))]
    pub message_id: MessageId,
    /// `accepted`, `duplicate` or `rejected`.
    pub status: AckStatus,
    /// Stable reason (required with `rejected`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    /// Short readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Whether the same message may be redelivered (required with `rejected`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

fn rejected_needs_code(schema: &mut schemars::Schema) {
    schema.insert(
        "if".into(),
        serde_json::json!({ "properties": { "status": { "const": "rejected" } } }),
    );
    schema.insert("then".into(), serde_json::json!({ "required": ["code", "retryable"] }));
    let branches = crate::schema::conditional_branches(
        schema,
        "status",
        "rejected".into(),
        crate::schema::known_except(AckStatus::KNOWN, "rejected"),
        serde_json::json!({ "required": ["code", "retryable"] }),
        serde_json::json!({}),
    );
    schema.insert("anyOf".into(), branches);
}

impl ChatMessageAck {
    /// `accepted`.
    pub fn accepted(message_id: impl Into<MessageId>) -> Self {
        Self::with_status(message_id.into(), AckStatus::Accepted)
    }

    /// `duplicate`.
    pub fn duplicate(message_id: impl Into<MessageId>) -> Self {
        Self::with_status(message_id.into(), AckStatus::Duplicate)
    }

    /// `rejected` with a code, a message and whether a retry may succeed.
    pub fn rejected(
        message_id: impl Into<MessageId>,
        code: ErrorCode,
        message: impl Into<String>,
        retryable: bool,
    ) -> Self {
        Self {
            code: Some(code),
            message: Some(message.into()),
            retryable: Some(retryable),
            ..Self::with_status(message_id.into(), AckStatus::Rejected)
        }
    }

    fn with_status(message_id: MessageId, status: AckStatus) -> Self {
        Self { message_id, status, code: None, message: None, retryable: None, extra: Extra::new() }
    }
}

/// `chat.activity` (xAgent -> Connector, IM v2): a snapshot that replaces the previous one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
#[schemars(transform = tool_name_only_with_tool)]
pub struct ChatActivity {
    /// `thinking`, `tool` or `idle`.
    pub status: ActivityStatus,
    /// The running Tool (only with `tool`, at most 256 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub tool_name: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

fn tool_name_only_with_tool(schema: &mut schemars::Schema) {
    schema.insert(
        "if".into(),
        serde_json::json!({ "properties": { "status": { "const": "tool" } } }),
    );
    schema.insert("then".into(), serde_json::json!({ "required": ["tool_name"] }));
    schema.insert("else".into(), serde_json::json!({ "not": { "required": ["tool_name"] } }));
    let branches = crate::schema::conditional_branches(
        schema,
        "status",
        "tool".into(),
        crate::schema::known_except(ActivityStatus::KNOWN, "tool"),
        serde_json::json!({ "required": ["tool_name"] }),
        serde_json::json!({ "properties": { "tool_name": false } }),
    );
    schema.insert("anyOf".into(), branches);
}

impl ChatActivity {
    /// `thinking`.
    pub fn thinking() -> Self {
        Self { status: ActivityStatus::Thinking, tool_name: None, extra: Extra::new() }
    }

    /// `tool` with the Tool's name.
    pub fn tool(name: impl Into<String>) -> Self {
        Self { status: ActivityStatus::Tool, tool_name: Some(name.into()), extra: Extra::new() }
    }

    /// `idle`.
    pub fn idle() -> Self {
        Self { status: ActivityStatus::Idle, tool_name: None, extra: Extra::new() }
    }
}
