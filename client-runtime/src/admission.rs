//! Admission: decide whether a Connector may be integrated. Fetch and check the Card, fetch the
//! Skill and check it with every Skill rule the Connector's build applies, probe `/health`
//! against the Card, and admit only within the configured protocol version window.

use serde_json::Value;
use xagent_protocol_types::{ConnectorCard, HealthResponse, SkillId};
use xagent_protocol_validate::AdmissionWindow;

use crate::store::{AdmissionSnapshot, XagentStore, XagentWrite};
use crate::{ClientError, ControlPlane, SkillDocument};

/// An admitted Connector: its Card, its primary Skill (if any) and the health it reported.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The validated Card.
    pub card: ConnectorCard,
    /// The primary Skill's Markdown.
    pub skill: Option<String>,
    /// The first health document.
    pub health: HealthResponse,
}

/// Reads the `name:` of a `SKILL.md` front matter block (between `---` lines). The validator's
/// reader ([`xagent_protocol_validate::skill_front_matter_name`]), so admission and
/// `xagent-connector check` agree (a leading byte-order mark is skipped by both).
pub fn skill_name(markdown: &str) -> Option<SkillId> {
    xagent_protocol_validate::skill_front_matter_name(markdown).map(SkillId::new)
}

/// Checks a fetched Card document and Skill and returns the typed Card. Used at admission and
/// again whenever health says the Card changed. The Skill is checked with the validator the
/// Connector's build and `xagent-connector check skill` use (`skill.secret_leak`,
/// `skill.related_skill_ids`, ...), and must carry exactly the primary Skill name.
pub fn check_card(
    card_json: &Value,
    skill: &SkillDocument,
    window: &AdmissionWindow,
    expected_card_id: Option<&str>,
) -> Result<ConnectorCard, String> {
    let report = xagent_protocol_validate::validate_card(card_json);
    let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
    if !errors.is_empty() {
        return Err(format!("the Card breaks the protocol: {}", errors.join("; ")));
    }
    let card: ConnectorCard = serde_json::from_value(card_json.clone())
        .map_err(|e| format!("the Card does not parse: {e}"))?;
    window.admit(Some(&card.protocol_version)).map_err(|e| e.to_string())?;
    if let Some(expected) = expected_card_id
        && card.connector_card_id.as_str() != expected
    {
        return Err(format!(
            "the Card is {}, but this Base URL is configured for {expected}",
            card.connector_card_id
        ));
    }
    // The Skill rules the Connector's build applies (`xagent-connector check skill`): its name,
    // no secret in it, and the Card's `related_skill_ids` naming it (or, when none is served,
    // naming nothing).
    let facts = xagent_protocol_validate::CardFacts::from_value(card_json);
    let validator = xagent_protocol_validate::Validator::default();
    let report = match skill {
        SkillDocument::Present(markdown) => {
            let expected = card.primary_skill_name();
            match skill_name(markdown) {
                Some(name) if name == expected => {}
                Some(name) => {
                    return Err(format!("the Skill is named {name}, expected {expected}"));
                }
                None => return Err("the Skill has no front matter name".into()),
            }
            validator.skill(markdown, &facts)
        }
        SkillDocument::Absent => validator.absent_skill(&facts),
    };
    let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
    if !errors.is_empty() {
        return Err(format!("the Skill breaks the protocol: {}", errors.join("; ")));
    }
    Ok(card)
}

/// Runs admission against a Connector.
pub async fn admit(
    control: &ControlPlane,
    window: &AdmissionWindow,
    expected_card_id: Option<&str>,
) -> Result<Admitted, ClientError> {
    admit_documents(control, window, expected_card_id).await.map(|(admitted, _)| admitted)
}

/// Where the Card and Skill a start runs with came from ([`admit_durably`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum DurableAdmission {
    /// The Connector answered and was admitted; its Card and Skill replaced the stored ones.
    Fresh(Box<Admitted>),
    /// The Connector did not answer; the stored Card snapshot and Skill cache passed admission
    /// again and are served until it answers.
    Stored {
        /// The stored Card, checked again with today's rules and window.
        card: Box<ConnectorCard>,
        /// The stored Skill.
        skill: Option<String>,
        /// Why the Connector could not be reached.
        unreachable: String,
    },
}

impl DurableAdmission {
    /// The admitted Card.
    pub fn card(&self) -> &ConnectorCard {
        match self {
            Self::Fresh(admitted) => &admitted.card,
            Self::Stored { card, .. } => card,
        }
    }

    /// The admitted Skill's Markdown, if the Connector serves one.
    pub fn skill(&self) -> Option<&str> {
        match self {
            Self::Fresh(admitted) => admitted.skill.as_deref(),
            Self::Stored { skill, .. } => skill.as_deref(),
        }
    }
}

/// True when `error` says the Connector did not answer (no HTTP response, or a gateway's 5xx),
/// as opposed to an answer that was refused.
fn unreachable(error: &ClientError) -> bool {
    match error {
        ClientError::Transport { .. } => true,
        ClientError::Http { status, .. } => *status >= 500,
        _ => false,
    }
}

/// Admission with the durable Card snapshot and Skill cache (architecture 5.1 and 10): the
/// Connector is admitted as [`admit`] does and, only once that passed, its Card document and
/// Skill replace the stored ones in one write. When the Connector cannot be reached, the stored
/// snapshot is checked again ([`check_card`], so a raised admission floor still applies) and
/// served. A Connector that answers with a Card or Skill admission refuses gets the refusal,
/// and the stored snapshot stays as it was.
pub async fn admit_durably(
    control: &ControlPlane,
    window: &AdmissionWindow,
    expected_card_id: Option<&str>,
    store: &dyn XagentStore,
) -> Result<DurableAdmission, ClientError> {
    match admit_documents(control, window, expected_card_id).await {
        Ok((admitted, card_json)) => {
            let snapshot = AdmissionSnapshot { card: card_json, skill: admitted.skill.clone() };
            store.commit(None, vec![XagentWrite::Admission(snapshot)]).await?;
            Ok(DurableAdmission::Fresh(Box::new(admitted)))
        }
        Err(error) if unreachable(&error) => {
            let Some(stored) = store.load_admission().await? else {
                return Err(error);
            };
            let skill = SkillDocument::from(stored.skill.clone());
            let card =
                check_card(&stored.card, &skill, window, expected_card_id).map_err(|refused| {
                    ClientError::NotAdmissible(format!("the stored Card snapshot: {refused}"))
                })?;
            Ok(DurableAdmission::Stored {
                card: Box::new(card),
                skill: stored.skill,
                unreachable: error.to_string(),
            })
        }
        Err(error) => Err(error),
    }
}

/// [`admit`], also returning the Card document as fetched (what the snapshot stores).
async fn admit_documents(
    control: &ControlPlane,
    window: &AdmissionWindow,
    expected_card_id: Option<&str>,
) -> Result<(Admitted, Value), ClientError> {
    let card_json = control.card_json().await?;
    let skill = control.skill().await?;
    let card = check_card(&card_json, &skill, window, expected_card_id)
        .map_err(ClientError::NotAdmissible)?;
    let health = control.health().await?;
    if let Some(id) = &health.connector_card_id
        && id != &card.connector_card_id
    {
        return Err(ClientError::NotAdmissible(format!(
            "/health reports card {id}, the Card says {}",
            card.connector_card_id
        )));
    }
    if health.protocol_version != card.protocol_version || health.build != card.build {
        return Err(ClientError::NotAdmissible(
            "/health does not match the Card (protocol_version or build differ)".into(),
        ));
    }
    let skill = match skill {
        SkillDocument::Present(text) => Some(text),
        SkillDocument::Absent => None,
    };
    Ok((Admitted { card, skill, health }, card_json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_rule_a_malformed_card_is_refused_naming_the_rule() {
        let card = serde_json::json!({
            "schema": "xagent.connector.card/v1",
            "connector_card_id": "im.x",
            "protocol_version": "3.0",
            "tools": [{"tool_id": "bad name!", "input_schema": {"type": "object"}}]
        });
        let refused = check_card(&card, &SkillDocument::Absent, &AdmissionWindow::default(), None)
            .expect_err("a malformed Card is not admitted");
        assert!(refused.contains("[card."), "the rule id is named: {refused}");
        let old = serde_json::json!({"connector_card_id": "im.x", "protocol_version": "2.0"});
        let refused = check_card(&old, &SkillDocument::Absent, &AdmissionWindow::default(), None)
            .expect_err("a version outside the window is not admitted");
        assert!(refused.contains("card.protocol_version") || refused.contains("2.0"), "{refused}");
    }

    fn card_with_related_skill() -> Value {
        serde_json::json!({
            "schema": "xagent.connector/v1",
            "protocol_version": "3.0",
            "build": {"build_time": "2607241200"},
            "connector_card_id": "im.x",
            "connector": {"name": "X", "version": "1.0.0"},
            "supports": {"target_types": ["im"], "profiles": ["xagent.im.v2"]},
            "tools": [{
                "tool_id": "x_send",
                "profile": "xagent.im.v2",
                "related_skill_ids": ["connector-im-x"],
                "input_schema": {
                    "type": "object",
                    "properties": {"connector_channel_id": {"type": "string"}},
                    "required": ["connector_channel_id"]
                }
            }]
        })
    }

    /// Issue 38: admission checked only the Skill's name, although the build refuses a Skill
    /// holding a secret. It now applies the same validator.
    #[test]
    fn rule_skill_secret_leak_admission_refuses_what_the_build_refuses() {
        let card = card_with_related_skill();
        let window = AdmissionWindow::default();
        let clean = "---\nname: connector-im-x\n---\nUse x_send.\n";
        check_card(&card, &SkillDocument::Present(clean.into()), &window, None)
            .expect("a clean Skill is admitted");
        let leaky =
            "---\nname: connector-im-x\n---\nUse token ghp_abcdefghijklmnopqrstuvwxyz0123456789\n";
        let refused = check_card(&card, &SkillDocument::Present(leaky.into()), &window, None)
            .expect_err("a Skill with a secret is not admitted");
        assert!(refused.contains("skill.secret_leak"), "{refused}");
    }

    #[test]
    fn rule_skill_related_skill_ids_admission_needs_the_related_skill_served() {
        let card = card_with_related_skill();
        let refused = check_card(&card, &SkillDocument::Absent, &AdmissionWindow::default(), None)
            .expect_err("a Tool relating a Skill that is not served is not admitted");
        assert!(refused.contains("skill.related_skill_ids"), "{refused}");
    }

    #[test]
    fn skill_name_is_read_from_front_matter() {
        let md = "---\nname: connector-im-x\ndescription: d\n---\n# Body";
        assert_eq!(skill_name(md), Some(SkillId::new("connector-im-x")));
        assert_eq!(skill_name("# no front matter"), None);
        assert_eq!(skill_name("---\ndescription: d\n---\n"), None);
        assert_eq!(
            skill_name("---\nname: \"quoted-name\"\n---"),
            Some(SkillId::new("quoted-name"))
        );
    }

    #[test]
    fn rule_skill_byte_order_mark_is_read_as_check_reads_it() {
        // skill.byte_order_mark: check warns but accepts; admission reads the same name.
        let md = "\u{feff}---\nname: connector-im-x\n---\n# Body";
        assert_eq!(skill_name(md), Some(SkillId::new("connector-im-x")));
        let card = xagent_protocol_validate::CardFacts::from_value(
            &serde_json::json!({"connector_card_id": "im.x"}),
        );
        let report = xagent_protocol_validate::validate_skill(md, &card);
        assert!(report.valid && report.has("skill.byte_order_mark"), "{report:?}");
    }
}
