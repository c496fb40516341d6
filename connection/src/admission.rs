//! The one home of what was admitted: the Card (and the facts the packet rules judge by), the
//! Card id and Profiles a hello announces, and the protocol version window. Every connection
//! reads it when it starts, so a Card re-admitted meanwhile reaches the next hello, its ack's
//! checks and the session.

use std::sync::{Arc, RwLock};

use xagent_protocol_types::{
    ConnectorCard, ConnectorCardId, ConnectorHello, ConnectorId, ProfileId, Side,
};
use xagent_protocol_validate::{AdmissionWindow, CardFacts, Session};

/// What a side admitted, shared by every connection it makes or takes. Cheap to read; replaced
/// as a whole by [`Admission::set_card`].
#[derive(Debug)]
pub struct Admission {
    inner: RwLock<Admitted>,
}

/// One consistent reading of an [`Admission`].
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The Card id the peer must name.
    pub card_id: ConnectorCardId,
    /// The admitted Card, when known (without it only the Card id and Profiles are checked).
    pub card: Option<Arc<ConnectorCard>>,
    /// What the packet rules know of the Card (shared, not copied per packet).
    pub facts: Option<Arc<CardFacts>>,
    /// The Profiles a hello announces.
    pub profiles: Vec<ProfileId>,
    /// The protocol versions admitted.
    pub window: AdmissionWindow,
    /// Whether [`Admitted::profiles`] are the Card's (they follow a re-admitted Card).
    follows_card: bool,
}

impl Admission {
    /// Admits a Card: its id and Profiles are what a hello announces, and they follow the Card
    /// when it is replaced.
    pub fn for_card(card: ConnectorCard, window: AdmissionWindow) -> Self {
        let facts = Arc::new(CardFacts::from_card(&card));
        let admitted = Admitted {
            card_id: card.connector_card_id.clone(),
            profiles: card.supports.profiles.clone(),
            card: Some(Arc::new(card)),
            facts: Some(facts),
            window,
            follows_card: true,
        };
        Self { inner: RwLock::new(admitted) }
    }

    /// Admits by parts: the Card id, the Profiles this side supports, and optionally the Card.
    /// When `profiles` equal the Card's Profiles, they follow a re-admitted Card as with
    /// [`Admission::for_card`]; an explicit, different list stays as configured.
    pub fn from_parts(
        card_id: ConnectorCardId,
        profiles: Vec<ProfileId>,
        card: Option<ConnectorCard>,
        window: AdmissionWindow,
    ) -> Self {
        let follows_card = card.as_ref().is_some_and(|card| card.supports.profiles == profiles);
        let facts = card.as_ref().map(|card| Arc::new(CardFacts::from_card(card)));
        let admitted =
            Admitted { card_id, profiles, card: card.map(Arc::new), facts, window, follows_card };
        Self { inner: RwLock::new(admitted) }
    }

    /// Replaces the admitted Card (a refetch re-admitted an upgraded Connector): the packet
    /// rules, the Card id and, when they follow the Card, the announced Profiles change with it.
    pub fn set_card(&self, card: ConnectorCard) {
        let facts = Arc::new(CardFacts::from_card(&card));
        let mut inner = self.inner.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.card_id = card.connector_card_id.clone();
        if inner.follows_card {
            inner.profiles = card.supports.profiles.clone();
        }
        inner.facts = Some(facts);
        inner.card = Some(Arc::new(card));
    }

    /// One consistent reading (what a connection starts from).
    pub fn current(&self) -> Admitted {
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The packet rules' facts of the current Card.
    pub fn facts(&self) -> Option<Arc<CardFacts>> {
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner).facts.clone()
    }

    /// The current Card.
    pub fn card(&self) -> Option<Arc<ConnectorCard>> {
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner).card.clone()
    }

    /// The protocol version window.
    pub fn window(&self) -> AdmissionWindow {
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner).window
    }
}

impl Admitted {
    /// A fresh sequencing session for one connection of `side`, judged by this admission.
    pub fn session(&self, side: Side) -> Session {
        match &self.card {
            Some(card) => Session::new(side, card, self.window),
            None => {
                Session::from_parts(side, self.card_id.clone(), self.profiles.clone(), self.window)
            }
        }
    }

    /// The `connector.hello` an xAgent sends: the Card id, the announced Profiles, and the
    /// current version of the window; `connector_id` resumes an earlier runtime.
    pub fn hello(&self, connector_id: Option<&ConnectorId>) -> ConnectorHello {
        let mut hello = ConnectorHello::new(self.card_id.clone(), self.profiles.clone());
        hello.protocol_version = Some(self.window.current.to_string());
        if let Some(id) = connector_id {
            hello = hello.with_connector_id(id.clone());
        }
        hello
    }
}

#[cfg(test)]
mod tests {
    use xagent_protocol_types::{BuildInfo, ConnectorInfo, Supports, TargetType};
    use xagent_protocol_validate::ProtocolVersion;

    use super::*;

    fn card(profiles: &[&str]) -> ConnectorCard {
        ConnectorCard::new(
            "im.adm",
            BuildInfo::new("1"),
            ConnectorInfo::new("Adm", "1.0.0"),
            Supports::new(vec![TargetType::Im], profiles.iter().map(|p| (*p).into()).collect()),
        )
    }

    #[test]
    fn readmission_rule_the_hello_follows_a_readmitted_card_and_announces_the_window() {
        let window = AdmissionWindow::new(ProtocolVersion::new(3, 0), ProtocolVersion::new(3, 1));
        let admission = Admission::for_card(card(&["xagent.im.v2"]), window);
        admission.set_card(card(&["xagent.im.v2", "xagent.im.v1"]));
        let hello = admission.current().hello(Some(&"conn_1".into()));
        let profiles: Vec<String> = hello
            .supported_profiles
            .unwrap_or_default()
            .iter()
            .map(|p| p.as_str().to_owned())
            .collect();
        assert_eq!(profiles, ["xagent.im.v2", "xagent.im.v1"]);
        assert_eq!(hello.protocol_version.as_deref(), Some("3.1"));
        assert_eq!(hello.connector_id.as_ref().map(|c| c.as_str()), Some("conn_1"));
        assert!(admission.facts().is_some_and(|f| f.profiles.len() == 2), "the facts follow too");
    }

    #[test]
    fn readmission_rule_an_explicit_profile_list_is_kept_when_the_card_changes() {
        let admission = Admission::from_parts(
            "im.adm".into(),
            vec!["xagent.im.v2".into()],
            Some(card(&["xagent.im.v2", "xagent.im.v1"])),
            AdmissionWindow::default(),
        );
        admission.set_card(card(&["xagent.im.v2", "xagent.im.v1", "xagent.device.v1"]));
        assert_eq!(admission.current().profiles, vec![ProfileId::from("xagent.im.v2")]);
    }
}
