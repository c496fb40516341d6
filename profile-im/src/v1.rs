//! IM Profile v1: the `message.push` builder and its payload rules.
//!
//! v1 has no business acknowledgement: once `message.push` has been written to the socket the
//! sender has no further signal. The [`crate::Outbox`] therefore treats a successful write
//! ([`crate::Outbox::on_sent`]) as the delivery boundary for a push. Before the write the
//! same retention rules as v2 hold (TTL from first responsibility, never extended, expiry
//! never delivered, bounded capacity); after it the message is gone from the outbox. A crash
//! between the write and the store update can replay the push once after restart, with the same
//! `message_id`, so a v1 receiver should deduplicate by `message_id` (e.g. with
//! [`crate::ReceiverIdempotency`] and [`Fingerprint::of_message_push`]).

use xagent_protocol_types::{MessageId, MessagePush, PushFile, ReplyHint, SkillHint};
use xagent_protocol_validate::{CardFacts, im};

use crate::payload::first_error;
use crate::{Fingerprint, PayloadError};

/// The fixed `profile` value of a v1 push.
pub const IM_V1_PROFILE: &str = "xagent.im.v1";
/// The `event_kind` of a regular inbound message.
pub const EVENT_MESSAGE_RECEIVED: &str = "im.message.received";

/// Checks a `message.push` against the IM v1 rules: the Must fields are present, `profile` is
/// `xagent.im.v1`, every file has a non-empty unique `file_ref` and a download URL, at most one
/// target-Session reference is set, and no internal identity or byte field is present. What the
/// push cites of the Card needs the Card: [`validate_message_push_for`].
pub fn validate_message_push(push: &MessagePush) -> Result<(), PayloadError> {
    push_error(push, None)
}

/// [`validate_message_push`] and, against the Card's facts, `message_push.card_reference`:
/// `reply.tool_id` and `skill.tool_ids` are Card Tools, `skill.name` is the Card's Skill, and
/// the Skill names and Tool ids its `activation_message` cites are the Card's (IM v1 §6). The
/// check `xagent-connector check packet --card` applies to the same push.
pub fn validate_message_push_for(push: &MessagePush, card: &CardFacts) -> Result<(), PayloadError> {
    push_error(push, Some(card))
}

fn push_error(push: &MessagePush, card: Option<&CardFacts>) -> Result<(), PayloadError> {
    // Every rule is the shared one (`im.file_url` is a warning: a file without any URL is
    // allowed, as `xagent-connector check` says).
    first_error(
        |visit| im::check_typed_push(push, card, visit),
        |i| push.files.get(i).map(|f| f.file_ref.to_string()).unwrap_or_default(),
    )
    .map_err(|error| match error {
        PayloadError::UnknownFileType { file_ref, .. } => {
            let file_type = push
                .files
                .iter()
                .find(|f| f.file_ref.as_str() == file_ref)
                .and_then(|f| f.file_type.as_ref())
                .map(ToString::to_string)
                .unwrap_or_default();
            PayloadError::UnknownFileType { file_ref, file_type }
        }
        other => other,
    })
}

impl Fingerprint {
    /// The fingerprint of a `message.push`: its raw and visible text and its ordered files by
    /// `type`, `file_ref`, `filename`, `mime_type`, `byte_size` (URLs and expiry left out, as
    /// for v2).
    pub fn of_message_push(push: &MessagePush) -> Self {
        let files: Vec<serde_json::Value> = push.files.iter().map(Self::file_facts).collect();
        Self::of_value(&serde_json::json!({
            "raw_text": push.raw_text,
            "text": push.text.as_ref().or(push.content.as_ref()).or(push.message.as_ref()),
            "files": files,
        }))
    }
}

/// Hides most of a target-system id for display: keeps two characters at each end.
pub fn redact_id(id: &str) -> String {
    let chars: Vec<char> = id.chars().collect();
    if chars.len() <= 4 {
        return "***".to_owned();
    }
    let head: String = chars.iter().take(2).collect();
    let tail: String = chars.iter().skip(chars.len() - 2).collect();
    format!("{head}***{tail}")
}

/// Builds a v1 `message.push` with the standard fields filled in (`profile`, `event_kind`,
/// `raw_text`) and a user-visible `text` in the recommended layout (see
/// [`MessagePushBuilder::visible_text`]).
#[derive(Clone, Debug)]
#[must_use]
pub struct MessagePushBuilder {
    push: MessagePush,
    source_name: Option<String>,
}

impl MessagePushBuilder {
    /// Starts a push with the Must fields: provider (e.g. `telegram`), the stable message id,
    /// the sender's target-system id and the message type (`text`, `image`, `file`, ...).
    pub fn new(
        provider: impl Into<String>,
        message_id: impl Into<MessageId>,
        sender_id: impl Into<String>,
        message_type: impl Into<String>,
    ) -> Self {
        let mut push = MessagePush::default();
        push.provider = Some(provider.into());
        push.profile = Some(IM_V1_PROFILE.to_owned());
        push.event_kind = Some(EVENT_MESSAGE_RECEIVED.to_owned());
        push.message_id = Some(message_id.into());
        push.sender_id = Some(sender_id.into());
        push.message_type = Some(message_type.into());
        Self { push, source_name: None }
    }

    /// The original user text (left as `""` when never set).
    pub fn raw_text(mut self, text: impl Into<String>) -> Self {
        self.push.raw_text = Some(text.into());
        self
    }

    /// The sender's display name.
    pub fn sender_name(mut self, name: impl Into<String>) -> Self {
        self.push.sender_name = Some(name.into());
        self
    }

    /// The conversation type (`p2p`, `group`, ...).
    pub fn chat_type(mut self, chat_type: impl Into<String>) -> Self {
        self.push.chat_type = Some(chat_type.into());
        self
    }

    /// The descriptive conversation id (never a routing argument).
    pub fn chat_id(mut self, chat_id: impl Into<String>) -> Self {
        self.push.chat_id = Some(chat_id.into());
        self
    }

    /// The human name of the source shown in the visible text (defaults to the provider).
    pub fn source_name(mut self, name: impl Into<String>) -> Self {
        self.source_name = Some(name.into());
        self
    }

    /// Execution guidance for the agent (not user-visible).
    pub fn activation_message(mut self, text: impl Into<String>) -> Self {
        self.push.activation_message = Some(text.into());
        self
    }

    /// The reply hint (reply Tool and opaque reply reference).
    pub fn reply(mut self, reply: ReplyHint) -> Self {
        self.push.reply = Some(reply);
        self
    }

    /// The Skill hint.
    pub fn skill(mut self, skill: SkillHint) -> Self {
        self.push.skill = Some(skill);
        self
    }

    /// Adds a file reference.
    pub fn file(mut self, file: PushFile) -> Self {
        self.push.files.push(file);
        self
    }

    /// The recommended user-visible layout: source, sender (name or redacted id),
    /// conversation type, message type, user text (`none` when empty), then file names.
    pub fn visible_text(&self) -> String {
        let p = &self.push;
        let source = self.source_name.as_deref().or(p.provider.as_deref()).unwrap_or("IM");
        let sender = p
            .sender_name
            .clone()
            .or_else(|| p.display_name.clone())
            .unwrap_or_else(|| redact_id(p.sender_id.as_deref().unwrap_or_default()));
        let raw = p.raw_text.as_deref().filter(|t| !t.is_empty()).unwrap_or("none");
        let mut text = format!(
            "User message from {source}:\nSender: {sender}\nConversation type: {}\nMessage type: {}\nUser text: {raw}",
            p.chat_type.as_deref().unwrap_or("unknown"),
            p.message_type.as_deref().unwrap_or("unknown"),
        );
        if !p.files.is_empty() {
            let names: Vec<&str> = p
                .files
                .iter()
                .map(|f| f.filename.as_deref().unwrap_or(f.file_ref.as_str()))
                .collect();
            text.push_str("\nFiles: ");
            text.push_str(&names.join(", "));
        }
        text
    }

    /// Fills `raw_text` (empty when unset) and `text`, then checks the v1 rules.
    pub fn build(mut self) -> Result<MessagePush, PayloadError> {
        if self.push.raw_text.is_none() {
            self.push.raw_text = Some(String::new());
        }
        let text = self.visible_text();
        self.push.text = Some(text);
        validate_message_push(&self.push)?;
        Ok(self.push)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::{ChatFile, FileType};

    fn file(r: &str) -> PushFile {
        PushFile::from(
            ChatFile::new(FileType::Image, r)
                .with_filename("a.png")
                .with_download_url(format!("/files/refs/{r}")),
        )
    }

    #[test]
    fn builder_fills_standard_fields_and_layout() {
        let push = MessagePushBuilder::new("telegram", "m1", "user_12345", "text")
            .raw_text("hello")
            .chat_type("p2p")
            .source_name("Telegram")
            .file(file("f1"))
            .build()
            .unwrap();
        assert_eq!(push.profile.as_deref(), Some("xagent.im.v1"));
        assert_eq!(push.event_kind.as_deref(), Some("im.message.received"));
        assert_eq!(
            push.text.as_deref(),
            Some(
                "User message from Telegram:\nSender: us***45\nConversation type: p2p\nMessage type: text\nUser text: hello\nFiles: a.png"
            )
        );
        let json = serde_json::to_value(&push).unwrap();
        assert_eq!(json["raw_text"], "hello");
    }

    #[test]
    fn raw_text_defaults_to_empty_and_text_says_none() {
        let push = MessagePushBuilder::new("wechat", "m1", "u", "image")
            .sender_name("Ann")
            .file(file("f1"))
            .build()
            .unwrap();
        assert_eq!(push.raw_text.as_deref(), Some(""));
        assert!(push.text.unwrap().contains("Sender: Ann\n"));
    }

    /// `im.file_url` is a Should of IM v1 (a warning of `xagent-connector check`): a push file
    /// without any URL builds, as the shared rule says; a bad URL in `url` does not.
    #[test]
    fn rule_im_file_url_is_a_warning_for_push_files() {
        let mut f = file("f1");
        f.download_url = None;
        MessagePushBuilder::new("x", "m", "u", "file").file(f.clone()).build().unwrap();
        f.url = Some("file:///etc/passwd".into());
        let err = MessagePushBuilder::new("x", "m", "u", "file").file(f.clone()).build();
        assert_eq!(err, Err(PayloadError::BadDownloadUrl("f1".into())));
        f.url = Some("https://cdn/x".into());
        MessagePushBuilder::new("x", "m", "u", "file").file(f).build().unwrap();
    }

    #[test]
    fn rule_push_file_ref_unique() {
        let err = MessagePushBuilder::new("x", "m", "u", "file").file(file("f")).file(file("f"));
        assert_eq!(err.build(), Err(PayloadError::DuplicateFileRef("f".into())));
    }

    #[test]
    fn rule_push_must_fields() {
        let ok = MessagePushBuilder::new("x", "m", "u", "text").build().unwrap();
        let mut p = ok.clone();
        p.provider = None;
        assert_eq!(validate_message_push(&p), Err(PayloadError::MissingPushField("provider")));
        let mut p = ok.clone();
        p.profile = Some("xagent.im.v2".into());
        assert_eq!(validate_message_push(&p), Err(PayloadError::MissingPushField("profile")));
        let mut p = ok.clone();
        p.message_id = None;
        assert_eq!(validate_message_push(&p), Err(PayloadError::MissingMessageId));
        let mut p = ok.clone();
        p.raw_text = None;
        assert_eq!(validate_message_push(&p), Err(PayloadError::MissingPushField("raw_text")));
        let mut p = ok.clone();
        p.session_ref = Some("a".into());
        p.target_session_id = Some("b".into());
        assert!(validate_message_push(&p).is_err());
        let mut p = ok;
        p.extra.insert("user_id".into(), serde_json::json!("u"));
        assert_eq!(
            validate_message_push(&p),
            Err(PayloadError::InternalIdentityForbidden("user_id".into()))
        );
    }

    #[test]
    fn redaction_keeps_only_ends() {
        assert_eq!(redact_id("abcdefgh"), "ab***gh");
        assert_eq!(redact_id("abc"), "***");
    }

    #[test]
    fn push_fingerprint_tracks_content() {
        let a = MessagePushBuilder::new("x", "m", "u", "text").raw_text("a").build().unwrap();
        let b = MessagePushBuilder::new("x", "m", "u", "text").raw_text("b").build().unwrap();
        assert_ne!(Fingerprint::of_message_push(&a), Fingerprint::of_message_push(&b));
        assert_eq!(Fingerprint::of_message_push(&a), Fingerprint::of_message_push(&a.clone()));
    }
}
