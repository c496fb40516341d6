//! `SKILL.md`, `/health` and the Base URL.

use serde_json::Value;
use xagent_protocol_types::primary_skill_name;

use super::json::*;
use super::validator::Validator;
use crate::facts::*;
use crate::model_text;
use crate::report::{Report, Sink};
use crate::rules::*;

impl Validator {
    /// Validates a `SKILL.md`: its front-matter name against the Card, and a secret scan.
    /// Paths are `/front_matter/name` for the name and `/line/<n>` for body findings.
    pub fn skill(&self, skill: &str, card: &CardFacts) -> Report {
        let mut sink = Sink::default();
        if skill.starts_with(BYTE_ORDER_MARK) {
            sink.push(
                &SKILL_BYTE_ORDER_MARK,
                "/front_matter",
                "SKILL.md starts with a byte-order mark; readers skip it, but save the file as UTF-8 without one",
            );
        }
        match skill_front_matter_name(skill) {
            None => sink.push(
                &SKILL_FRONT_MATTER,
                "/front_matter",
                "SKILL.md must start with a --- front matter block containing name: <skill name>",
            ),
            Some(name) => {
                if !is_skill_name(&name) {
                    sink.push(
                        &SKILL_NAME_FORMAT,
                        "/front_matter/name",
                        "the Skill name must be lowercase hyphen-case (a-z, 0-9, single inner hyphens)",
                    );
                }
                if let Some(card_id) = &card.card_id
                    && !skill_name_matches_card(&name, card_id)
                {
                    let primary = primary_skill_name(card_id);
                    sink.push(
                        &SKILL_NAME_CARD,
                        "/front_matter/name",
                        format!("the Skill name must be {primary} or {primary}-<purpose>"),
                    );
                }
                // The Skill a Connector serves is its primary one: the Card's Tools can point
                // at no other (protocol 4.2 has no endpoint for a `-<purpose>` Skill).
                if card.card_id.as_deref().is_some_and(|id| primary_skill_name(id) == name.as_str())
                {
                    related_skills(&mut sink, card, Some(&name));
                }
            }
        }
        for found in model_text::wire_mentions(skill) {
            sink.push(
                &SKILL_WIRE_REFERENCE,
                format!("/line/{}", found.line),
                format!(
                    "the Skill names {}; the agent acts through the Connector's Tools (a file argument takes a file from the conversation), so name the Tool instead",
                    found.mention
                ),
            );
        }
        for leak in self.scanner.scan_text(skill) {
            let line = leak.location.split(':').next().unwrap_or("0").to_owned();
            sink.push(
                &SKILL_SECRET_LEAK,
                format!("/line/{line}"),
                format!("the Skill contains {}; remove it", leak.kind),
            );
        }
        sink.finish()
    }

    /// What the Card's `related_skill_ids` say when the Connector serves no Skill (`/skill.md`
    /// answers 204 or 404): each one names a Skill that cannot be fetched
    /// (`skill.related_skill_ids`). The served case is part of [`Validator::skill`].
    pub fn absent_skill(&self, card: &CardFacts) -> Report {
        let mut sink = Sink::default();
        related_skills(&mut sink, card, None);
        sink.finish()
    }

    /// Validates a `/health` body against the Card.
    pub fn health(&self, health: &Value, card: &CardFacts) -> Report {
        let mut sink = Sink::default();
        let Some(root) = health.as_object() else {
            sink.push(&DOCUMENT_NOT_OBJECT, "", "a health response must be a JSON object");
            return sink.finish();
        };
        if !root.get("status").is_some_and(Value::is_string) {
            sink.push(
                &HEALTH_STATUS,
                "/status",
                "status is a required string (\"ok\" when healthy)",
            );
        }
        if let (Some(id), Some(card_id)) = (root.get("connector_card_id"), &card.card_id)
            && id.as_str() != Some(card_id.as_str())
        {
            sink.push(
                &HEALTH_CARD_ID,
                "/connector_card_id",
                format!("connector_card_id must be {card_id:?}"),
            );
        }
        if root.get("protocol_version").and_then(Value::as_str) != card.protocol_version.as_deref()
        {
            sink.push(
                &HEALTH_PROTOCOL_VERSION,
                "/protocol_version",
                "protocol_version must equal the Card's",
            );
        }
        if root.get("build") != card.build.as_ref() {
            sink.push(&HEALTH_BUILD, "/build", "build must equal the Card's build exactly");
        }
        if let Some(version) = root.get("connector_card_version")
            && version.as_str() != card.connector_version.as_deref()
        {
            sink.push(
                    &HEALTH_CARD_VERSION,
                    "/connector_card_version",
                    "connector_card_version differs from the Card's connector.version: refetch the Card and Skill",
                );
        }
        sink.finish()
    }
}

/// `skill.related_skill_ids`: every `related_skill_ids` entry of the Card is the name of the
/// Skill the Connector serves (`served`), exactly; with none served, there is nothing to name.
pub(super) fn related_skills(sink: &mut Sink, card: &CardFacts, served: Option<&str>) {
    for related in &card.related_skill_ids {
        if Some(related.as_str()) == served {
            continue;
        }
        let message = match served {
            Some(name) => format!(
                "a Card Tool relates Skill {related:?}, but the Connector serves {name:?}; name the served Skill exactly"
            ),
            None => format!(
                "a Card Tool relates Skill {related:?}, but the Connector serves no Skill; serve it at /skill.md or drop the reference"
            ),
        };
        let path = if served.is_some() { "/front_matter/name" } else { "" };
        sink.push(&SKILL_RELATED_SKILL_IDS, path, message);
    }
}

/// Validates a Base URL.
pub fn validate_base_url(url: &str) -> Report {
    let mut sink = Sink::default();
    base_url(&mut sink, url);
    sink.finish()
}

/// The UTF-8 byte-order mark a `SKILL.md` may start with.
pub(super) const BYTE_ORDER_MARK: char = '\u{feff}';

/// The `name` of a `SKILL.md` front matter block, if there is one. The one reader of a Skill's
/// name: `xagent-connector check` and admission both call it, so they agree. A leading
/// byte-order mark is skipped (the texts say only "Markdown text"; tolerant on read, and
/// [`Validator::skill`] warns with `skill.byte_order_mark`).
pub fn skill_front_matter_name(skill: &str) -> Option<String> {
    let text = skill.strip_prefix(BYTE_ORDER_MARK).unwrap_or(skill);
    let mut lines = text.lines();
    if lines.next()?.trim_end() != "---" {
        return None;
    }
    for line in lines {
        let trimmed = line.trim_end();
        if trimmed == "---" {
            return None;
        }
        if let Some(value) = trimmed.strip_prefix("name:") {
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(value);
            return Some(value.to_owned()).filter(|v| !v.is_empty());
        }
    }
    None
}

pub(super) fn base_url(sink: &mut Sink, url: &str) {
    if url.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        sink.push(&BASE_URL_SYNTAX, "", "the Base URL must be an absolute URL without spaces");
        return;
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        sink.push(
            &BASE_URL_SYNTAX,
            "",
            "the Base URL must be absolute, e.g. https://connector.example",
        );
        return;
    };
    let scheme_ok = scheme.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        sink.push(&BASE_URL_SYNTAX, "", "the Base URL has an invalid scheme");
        return;
    }
    if !matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") {
        sink.push(&BASE_URL_SCHEME, "", "the Base URL scheme must be http or https");
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let host_port = match authority.rsplit_once('@') {
        Some((_, host)) => {
            sink.push(&BASE_URL_USERINFO, "", "the Base URL must not contain user:password@");
            host
        }
        None => authority,
    };
    let (host, port) =
        if let Some(v6) = host_port.strip_prefix('[') {
            match v6.split_once(']') {
                Some((addr, after)) => {
                    if addr.is_empty()
                        || !addr.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
                    {
                        sink.push(&BASE_URL_SYNTAX, "", "the Base URL has an invalid IPv6 host");
                    }
                    (addr, after.strip_prefix(':'))
                }
                None => {
                    sink.push(&BASE_URL_SYNTAX, "", "the Base URL has an unterminated IPv6 host");
                    return;
                }
            }
        } else {
            match host_port.rsplit_once(':') {
                Some((h, p)) => {
                    if !h.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'%')
                    }) {
                        sink.push(&BASE_URL_SYNTAX, "", "the Base URL host has invalid characters");
                    }
                    (h, Some(p))
                }
                None => {
                    if !host_port.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'%')
                    }) {
                        sink.push(&BASE_URL_SYNTAX, "", "the Base URL host has invalid characters");
                    }
                    (host_port, None)
                }
            }
        };
    if host.is_empty() {
        sink.push(&BASE_URL_HOST, "", "the Base URL must name a host");
    }
    if let Some(port) = port
        && !port.is_empty()
        && port.parse::<u16>().is_err()
    {
        sink.push(&BASE_URL_SYNTAX, "", "the Base URL port must be a number up to 65535");
    }
    if let Some(q) = tail.find('?') {
        let before_hash = tail.find('#').is_none_or(|h| q < h);
        if before_hash {
            sink.push(&BASE_URL_QUERY, "", "the Base URL must not contain a query (?...)");
        }
    }
    if tail.contains('#') {
        sink.push(&BASE_URL_FRAGMENT, "", "the Base URL must not contain a fragment (#...)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter() {
        assert_eq!(skill_front_matter_name("---\nname: a-b\n---\nbody").as_deref(), Some("a-b"));
        assert_eq!(skill_front_matter_name("---\nname: \"a\"\n---").as_deref(), Some("a"));
        assert_eq!(skill_front_matter_name("# no front matter"), None);
        assert_eq!(skill_front_matter_name("---\ntitle: x\n---\nname: y"), None);
    }

    #[test]
    fn base_urls() {
        for ok in [
            "https://connector.example",
            "http://127.0.0.1:8080/prefix/",
            "https://[::1]:9000",
            "HTTPS://Example.COM/a/b",
        ] {
            assert!(validate_base_url(ok).valid, "{ok}");
        }
    }

    #[test]
    fn build_times() {
        assert!(is_build_time("2607241200"));
        assert!(!is_build_time("2613241200"));
        assert!(!is_build_time("260724120"));
    }
}
