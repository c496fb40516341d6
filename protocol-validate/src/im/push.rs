//! IM v1 `message.push`: its content, files and what it cites from the Card.

use std::ops::ControlFlow;

use xagent_protocol_types::{MessageId, MessagePush};

use super::view::report;
/// xAgent-internal identities no IM payload may carry.
use super::*;

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
    card: &crate::facts::CardFacts,
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
    card: Option<&crate::facts::CardFacts>,
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
    card: Option<&crate::facts::CardFacts>,
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
