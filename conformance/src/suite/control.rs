//! The control plane: the Card, the Skill and `/health`.

use super::*;

impl Run {
    pub(super) async fn control_plane(&mut self) {
        // Card.
        let card_json = self.control.card_json().await;
        let outcome = match &card_json {
            Ok(value) if value.is_object() => pass("200 with a JSON object, no API key sent"),
            Ok(other) => fail(format!("not a JSON object: {other}")),
            Err(e) => fail(e.to_string()),
        };
        self.report.record(
            ("control.card.public", "§4.1 GET /connector-card.json is public and a JSON object"),
            outcome,
        );
        if let Ok(value) = card_json
            && value.is_object()
        {
            self.card_document(value);
        }

        // Skill.
        let outcome = match (self.control.skill().await, &self.card) {
            (Ok(SkillDocument::Absent), _) => skip("no primary Skill (204/404)"),
            (Ok(SkillDocument::Present(markdown)), Some(card)) => {
                let expected = card.primary_skill_name();
                match xagent_client_runtime::admission::skill_name(&markdown) {
                    Some(name) if name == expected => pass(format!("name {name}")),
                    Some(name) => fail(format!("name {name}, expected {expected}")),
                    None => fail("no `name:` in the front matter"),
                }
            }
            (Ok(SkillDocument::Present(_)), None) => skip("no valid Card to compare with"),
            (Err(e), _) => fail(e.to_string()),
        };
        self.report.record(("skill.name_card", "§4.2 Skill name is connector-<card id>"), outcome);

        // API key on /health.
        let outcome = if self.options.api_key.is_some() {
            let anonymous =
                ControlPlane::new(self.options.base_url.clone(), None).with_tls(&self.options.tls);
            let wrong = ControlPlane::new(
                self.options.base_url.clone(),
                Some(Secret::new("xagent-conformance-wrong-key")),
            )
            .with_tls(&self.options.tls);
            let none = anonymous.health().await;
            let bad = wrong.health().await;
            let refused =
                |r: &Result<_, ClientError>| matches!(r, Err(ClientError::Unauthorized { .. }));
            if refused(&none) && refused(&bad) {
                pass("401/403 without a key and with a wrong key")
            } else {
                fail(format!(
                    "without key: {}, wrong key: {}",
                    none.as_ref().map(|_| "2xx".to_owned()).unwrap_or_else(|e| e.to_string()),
                    bad.as_ref().map(|_| "2xx".to_owned()).unwrap_or_else(|e| e.to_string())
                ))
            }
        } else {
            skip("no --api-key given")
        };
        self.report.record(
            (
                "control.health.api_key_enforced",
                "§3 /health requires the system API key when configured",
            ),
            outcome,
        );

        // Health matches the Card.
        let outcome = match (self.control.health().await, &self.card) {
            (Ok(health), Some(card)) => {
                let mut problems = Vec::new();
                if let Some(id) = &health.connector_card_id
                    && id != &card.connector_card_id
                {
                    problems
                        .push(format!("connector_card_id {id} != Card {}", card.connector_card_id));
                }
                if health.protocol_version != card.protocol_version {
                    problems.push(format!(
                        "protocol_version {} != Card {}",
                        health.protocol_version, card.protocol_version
                    ));
                }
                if health.build != card.build {
                    problems.push("build differs from the Card's".into());
                }
                if let Some(version) = &health.connector_card_version
                    && version != &card.connector.version
                {
                    problems.push(format!(
                        "connector_card_version {version} != Card {}",
                        card.connector.version
                    ));
                }
                verdict(problems, "card id, versions and build match")
            }
            (Ok(_), None) => skip("no valid Card"),
            (Err(e), _) => fail(e.to_string()),
        };
        self.report
            .record(("control.health.matches_card", "§4.3 /health matches the Card"), outcome);
    }

    /// The checks of a Card document that is a JSON object: valid, in the admission window,
    /// and (for a device Card) declaring the device target type.
    pub(super) fn card_document(&mut self, value: Value) {
        let report = xagent_protocol_validate::validate_card(&value);
        let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
        let warnings = format!("{} warning(s)", report.warnings().count());
        self.report.record(
            ("control.card.valid", "§4.1 Card schema and hard validation"),
            verdict(errors, warnings),
        );
        let outcome = match serde_json::from_value::<ConnectorCard>(value.clone()) {
            Ok(card) => {
                let outcome = match AdmissionWindow::default().admit(Some(&card.protocol_version)) {
                    Ok(_) => pass(format!("protocol_version {}", card.protocol_version)),
                    Err(e) => fail(e.to_string()),
                };
                self.card = Some(card);
                outcome
            }
            Err(e) => fail(format!("the Card does not parse: {e}")),
        };
        self.report.record(("card.protocol_version", "§12 admission window [3.0, 3.0]"), outcome);
        if let Some(card) = self.card.as_ref().filter(|card| device::applies(card)) {
            let outcome = match device::card_declares(card) {
                Ok(detail) => pass(detail),
                Err(detail) => fail(detail),
            };
            self.report.record((device::CARD_DECLARES, device::CARD_RULE), outcome);
        }
        self.card_json = Some(value);
    }
}
