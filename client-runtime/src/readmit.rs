//! The data plane's admitted Card as an application reads it, and the health monitor wired to
//! it: a Card the monitor refetches and re-admits goes straight into the data plane's one home
//! of the admission (what the packet rules, the next hello, the Descriptor rules, Tool
//! resolution and projection read), so an application keeps no Card of its own.

use std::sync::Arc;
use std::time::Duration;

use xagent_protocol_types::ConnectorCard;

use crate::admission::check_card;
use crate::health::HealthMonitor;
use crate::store::{AdmissionSnapshot, XagentWrite};
use crate::{ClientError, DataPlane};

impl DataPlane {
    /// The admitted Card this data plane judges by: the one it started with, or the latest
    /// one re-admitted since ([`DataPlane::set_card`], [`DataPlane::monitor_health`]). `None`
    /// for a data plane started without a Card.
    pub fn card(&self) -> Option<Arc<ConnectorCard>> {
        self.shared().admission.card()
    }

    /// Starts the health monitor for this data plane's Connector: `/health` every
    /// `interval`; a changed Card and Skill are refetched and re-admitted (the same
    /// `connector_card_id`, a protocol version within the configured admission window) and
    /// the Card handed to this data plane before [`HealthMonitor::refreshed`] changes, so a
    /// listener reads the new Card from [`DataPlane::card`]. A re-admitted Card document and
    /// Skill also replace the store's Card snapshot and Skill cache ([`crate::admit_durably`]
    /// serves them on a start with the Connector unreachable); a refused one changes nothing.
    /// Fails without an admitted Card.
    pub fn monitor_health(&self, interval: Duration) -> Result<HealthMonitor, ClientError> {
        let card = self.card().map(|card| (*card).clone()).ok_or_else(|| {
            ClientError::NotAdmissible(
                "the data plane has no admitted Card to monitor; start it with ClientConfig::for_card".into(),
            )
        })?;
        let expected = card.connector_card_id.to_string();
        let window = self.shared().admission.window();
        let plane = self.clone();
        let store = self.shared().store.clone();
        let readmit = move |json: &serde_json::Value, skill: &crate::SkillDocument| {
            let card = check_card(json, skill, &window, Some(expected.as_str()))?;
            // Admitted: the Card document and Skill replace the stored snapshot, in one write.
            let snapshot = AdmissionSnapshot {
                card: json.clone(),
                skill: skill.markdown().map(str::to_owned),
            };
            let ticket = store.commit(None, vec![XagentWrite::Admission(snapshot)]);
            let card_id = card.connector_card_id.clone();
            tokio::spawn(async move {
                if let Err(error) = ticket.await {
                    tracing::warn!(card = %card_id, %error, "the re-admitted Card and Skill were not stored; a restart while the Connector is unreachable serves the previous ones");
                }
            });
            plane.set_card(card.clone());
            Ok(card)
        };
        Ok(HealthMonitor::spawn(
            self.control(),
            Arc::new(tokio::sync::RwLock::new(card)),
            interval,
            readmit,
        ))
    }
}
