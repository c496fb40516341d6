//! Health monitoring: `/health` only, periodically. 401/403 is an authentication failure; other
//! failures count, one or two in a row give `degraded`, three or more `offline`; a success
//! resets. A change of connector version, protocol version or build asks for a Card and Skill
//! refetch. An incompatible Connector cannot stay online: while `/health`'s protocol version or
//! build differs from the admitted Card, also after the refetch, the status is `offline` with
//! that reason, until the two agree. A re-admitted Card goes to the data plane
//! ([`HealthMonitor::spawn_feeding`]), so the next hello and the Tool projection use it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{RwLock, watch};
use xagent_protocol_types::{ConnectorCard, HealthResponse};

use crate::{ClientError, ControlPlane};

/// Where a re-admitted Card goes (the data plane's `set_card`).
type CardHook = Box<dyn Fn(ConnectorCard) + Send + Sync>;

/// Consecutive failures from which the Connector is `offline`.
pub const OFFLINE_AFTER_FAILURES: u32 = 3;

/// What xAgent believes about a Connector's availability.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HealthStatus {
    /// Not probed yet.
    Unknown,
    /// The last probe succeeded and matched the Card.
    Online,
    /// One or two consecutive failures.
    Degraded {
        /// Failures in a row.
        failures: u32,
        /// The last failure.
        reason: String,
    },
    /// Three or more consecutive failures, or an incompatible Connector.
    Offline {
        /// Failures in a row.
        failures: u32,
        /// The last failure.
        reason: String,
    },
    /// The system API key was refused.
    AuthenticationFailed,
}

/// The result of one probe, as the tracker sees it.
#[derive(Debug, Clone)]
pub enum ProbeOutcome {
    /// 2xx with a health document.
    Healthy(Box<HealthResponse>),
    /// 401 or 403.
    Unauthorized,
    /// Anything else: a non-2xx answer or no answer.
    Failed(String),
}

impl From<Result<HealthResponse, ClientError>> for ProbeOutcome {
    fn from(result: Result<HealthResponse, ClientError>) -> Self {
        match result {
            Ok(health) => Self::Healthy(Box::new(health)),
            Err(ClientError::Unauthorized { .. }) => Self::Unauthorized,
            Err(other) => Self::Failed(other.to_string()),
        }
    }
}

/// What a probe changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthUpdate {
    /// The status after the probe.
    pub status: HealthStatus,
    /// True when the status differs from before.
    pub changed: bool,
    /// True when the Card and Skill must be fetched again.
    pub refetch_card: bool,
}

/// The health rules as a plain state machine.
#[derive(Debug, Clone)]
pub struct HealthTracker {
    status: HealthStatus,
    failures: u32,
}

impl Default for HealthTracker {
    fn default() -> Self {
        Self { status: HealthStatus::Unknown, failures: 0 }
    }
}

impl HealthTracker {
    /// A tracker that has probed nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current status.
    pub fn status(&self) -> &HealthStatus {
        &self.status
    }

    /// Applies one probe's outcome, judged against the cached Card.
    pub fn record(&mut self, outcome: ProbeOutcome, card: &ConnectorCard) -> HealthUpdate {
        let before = self.status.clone();
        let mut refetch_card = false;
        match outcome {
            ProbeOutcome::Unauthorized => {
                self.failures = 0;
                self.status = HealthStatus::AuthenticationFailed;
            }
            ProbeOutcome::Failed(reason) => self.fail(reason),
            ProbeOutcome::Healthy(health) => {
                if let Some(id) = &health.connector_card_id
                    && id != &card.connector_card_id
                {
                    // Another Connector answers at this URL: it cannot stay online.
                    self.failures = self.failures.max(OFFLINE_AFTER_FAILURES);
                    self.status = HealthStatus::Offline {
                        failures: self.failures,
                        reason: format!(
                            "/health reports card {id}, expected {}",
                            card.connector_card_id
                        ),
                    };
                } else if let Some(reason) = card_disagreement(&health, card) {
                    // The running Connector is not the admitted one: offline until a refetch
                    // brings a Card that agrees with it.
                    refetch_card = true;
                    self.failures = 0;
                    self.status = HealthStatus::Offline {
                        failures: 0,
                        reason: format!("{reason}; refetching the Card"),
                    };
                } else {
                    refetch_card = health
                        .connector_card_version
                        .as_ref()
                        .is_some_and(|v| v != &card.connector.version);
                    self.failures = 0;
                    self.status = HealthStatus::Online;
                }
            }
        }
        HealthUpdate { changed: self.status != before, status: self.status.clone(), refetch_card }
    }

    /// A refetched Card was admitted again: the Connector is online when the `/health` that
    /// asked for the refetch agrees with it, and stays offline (with the reason) when its
    /// protocol version or build still differs.
    pub fn readmitted(&mut self, health: &HealthResponse, card: &ConnectorCard) -> HealthUpdate {
        let before = self.status.clone();
        self.failures = 0;
        self.status = match card_disagreement(health, card) {
            None => HealthStatus::Online,
            Some(reason) => HealthStatus::Offline {
                failures: 0,
                reason: format!("{reason}, also after the refetch; offline until they agree"),
            },
        };
        HealthUpdate {
            changed: self.status != before,
            status: self.status.clone(),
            refetch_card: false,
        }
    }

    /// Marks the Connector offline after a refetched Card turned out incompatible.
    pub fn incompatible(&mut self, reason: String) -> HealthUpdate {
        let before = self.status.clone();
        self.failures = self.failures.max(OFFLINE_AFTER_FAILURES);
        self.status = HealthStatus::Offline { failures: self.failures, reason };
        HealthUpdate {
            changed: self.status != before,
            status: self.status.clone(),
            refetch_card: false,
        }
    }

    fn fail(&mut self, reason: String) {
        self.failures = self.failures.saturating_add(1);
        self.status = if self.failures >= OFFLINE_AFTER_FAILURES {
            HealthStatus::Offline { failures: self.failures, reason }
        } else {
            HealthStatus::Degraded { failures: self.failures, reason }
        };
    }
}

/// The health rule's one home: `/health` must report the admitted Card's protocol version and
/// build. `Some(reason)` when it does not.
fn card_disagreement(health: &HealthResponse, card: &ConnectorCard) -> Option<String> {
    let protocol = health.protocol_version != card.protocol_version;
    let build = health.build != card.build;
    let what = match (protocol, build) {
        (false, false) => return None,
        (true, false) => format!(
            "protocol {} (the admitted Card says {})",
            health.protocol_version, card.protocol_version
        ),
        (false, true) => format!(
            "build {} (the admitted Card says {})",
            health.build.build_time, card.build.build_time
        ),
        (true, true) => format!(
            "protocol {} and build {} (the admitted Card says {} and {})",
            health.protocol_version,
            health.build.build_time,
            card.protocol_version,
            card.build.build_time
        ),
    };
    Some(format!("/health reports {what}"))
}

/// A running health monitor: probes `/health` every `interval`, refetches and re-admits the
/// Card when the health document says it changed, and publishes the status.
#[derive(Debug)]
pub struct HealthMonitor {
    status: watch::Receiver<HealthStatus>,
    refreshed: watch::Receiver<u64>,
    skill: Arc<RwLock<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

/// Decides whether a refetched Card (its JSON and the skill document) is still admissible,
/// giving the Card to use or why not.
pub trait Readmit:
    Fn(&serde_json::Value, &crate::SkillDocument) -> Result<ConnectorCard, String>
    + Send
    + Sync
    + 'static
{
}

impl<F> Readmit for F where
    F: Fn(&serde_json::Value, &crate::SkillDocument) -> Result<ConnectorCard, String>
        + Send
        + Sync
        + 'static
{
}

impl HealthMonitor {
    /// Starts probing. `card` is the admitted Card; it is replaced when a refetch admits a new
    /// one. `readmit` decides whether a refetched Card is still admissible.
    pub fn spawn<F>(
        control: ControlPlane,
        card: Arc<RwLock<ConnectorCard>>,
        interval: Duration,
        readmit: F,
    ) -> Self
    where
        F: Readmit,
    {
        Self::start(control, card, interval, readmit, None)
    }

    /// Like [`HealthMonitor::spawn`], and every re-admitted Card also goes to `on_card` before
    /// [`HealthMonitor::refreshed`] changes. Give it the data plane's
    /// [`crate::DataPlane::set_card`], so the next hello, the packet rules and the Tool
    /// projection read the new Card.
    pub fn spawn_feeding<F, C>(
        control: ControlPlane,
        card: Arc<RwLock<ConnectorCard>>,
        interval: Duration,
        readmit: F,
        on_card: C,
    ) -> Self
    where
        F: Readmit,
        C: Fn(ConnectorCard) + Send + Sync + 'static,
    {
        Self::start(control, card, interval, readmit, Some(Box::new(on_card)))
    }

    fn start<F>(
        control: ControlPlane,
        card: Arc<RwLock<ConnectorCard>>,
        interval: Duration,
        readmit: F,
        on_card: Option<CardHook>,
    ) -> Self
    where
        F: Readmit,
    {
        let (sender, status) = watch::channel(HealthStatus::Unknown);
        let (refresh, refreshed) = watch::channel(0u64);
        let skill: Arc<RwLock<Option<String>>> = Arc::default();
        let kept_skill = skill.clone();
        let task = tokio::spawn(async move {
            let mut tracker = HealthTracker::new();
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let before = tracker.status().clone();
                let outcome = ProbeOutcome::from(control.health().await);
                let probed = match &outcome {
                    ProbeOutcome::Healthy(health) => Some(health.clone()),
                    _ => None,
                };
                let current = card.read().await.clone();
                let mut update = tracker.record(outcome, &current);
                if let (true, Some(health)) = (update.refetch_card, probed) {
                    let refetched = async {
                        let json = control.card_json().await.map_err(|e| e.to_string())?;
                        let skill = control.skill().await.map_err(|e| e.to_string())?;
                        readmit(&json, &skill).map(|card| (card, skill))
                    }
                    .await;
                    match refetched {
                        Ok((new_card, new_skill)) => {
                            let new_skill = match new_skill {
                                crate::SkillDocument::Present(text) => Some(text),
                                crate::SkillDocument::Absent => None,
                            };
                            let skill_changed = *kept_skill.read().await != new_skill;
                            let card_changed = new_card != current;
                            if card_changed || skill_changed {
                                tracing::info!(card = %new_card.connector_card_id, version = %new_card.connector.version, "Card refetched after a health change");
                                *card.write().await = new_card.clone();
                                *kept_skill.write().await = new_skill;
                                if let Some(on_card) = &on_card {
                                    on_card(new_card.clone());
                                }
                                refresh.send_modify(|generation| *generation += 1);
                            }
                            update = tracker.readmitted(&health, &new_card);
                        }
                        Err(reason) => update = tracker.incompatible(reason),
                    }
                }
                if update.status != before {
                    tracing::info!(status = ?update.status, "Connector health changed");
                }
                if sender.send(update.status).is_err() {
                    break;
                }
            }
        });
        Self { status, refreshed, skill, task }
    }

    /// Changes each time a refetch admitted a changed Card or Skill: the application refreshes
    /// the model's Tool list (a monitor started with [`HealthMonitor::spawn_feeding`] has
    /// already handed the Card on; otherwise give it to [`crate::DataPlane::set_card`]).
    pub fn refreshed(&self) -> watch::Receiver<u64> {
        self.refreshed.clone()
    }

    /// The Skill of the latest refetch (`None` before one, or when the Connector has none).
    pub async fn refetched_skill(&self) -> Option<String> {
        self.skill.read().await.clone()
    }

    /// The latest status.
    pub fn status(&self) -> HealthStatus {
        self.status.borrow().clone()
    }

    /// A receiver that sees every status change.
    pub fn subscribe(&self) -> watch::Receiver<HealthStatus> {
        self.status.clone()
    }

    /// Stops probing.
    pub fn stop(self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::{BuildInfo, ConnectorInfo, Supports, TargetType};

    fn card() -> ConnectorCard {
        ConnectorCard::new(
            "im.x",
            BuildInfo::new("2611291200"),
            ConnectorInfo::new("X", "1.0.0"),
            Supports::new(vec![TargetType::Im], vec!["xagent.im.v2".into()]),
        )
    }

    fn healthy() -> ProbeOutcome {
        ProbeOutcome::Healthy(Box::new(HealthResponse::for_card(&card())))
    }

    #[test]
    fn health_rule_one_or_two_failures_degrade_three_go_offline() {
        let card = card();
        let mut tracker = HealthTracker::new();
        assert_eq!(tracker.record(healthy(), &card).status, HealthStatus::Online);
        let first = tracker.record(ProbeOutcome::Failed("503".into()), &card);
        assert!(matches!(first.status, HealthStatus::Degraded { failures: 1, .. }));
        let second = tracker.record(ProbeOutcome::Failed("timeout".into()), &card);
        assert!(matches!(second.status, HealthStatus::Degraded { failures: 2, .. }));
        let third = tracker.record(ProbeOutcome::Failed("refused".into()), &card);
        assert!(matches!(third.status, HealthStatus::Offline { failures: 3, .. }));
        let fourth = tracker.record(ProbeOutcome::Failed("refused".into()), &card);
        assert!(matches!(fourth.status, HealthStatus::Offline { failures: 4, .. }));
        assert!(!fourth.changed || matches!(fourth.status, HealthStatus::Offline { .. }));
    }

    #[test]
    fn health_rule_success_resets_failures() {
        let card = card();
        let mut tracker = HealthTracker::new();
        tracker.record(ProbeOutcome::Failed("x".into()), &card);
        tracker.record(ProbeOutcome::Failed("x".into()), &card);
        assert_eq!(tracker.record(healthy(), &card).status, HealthStatus::Online);
        let after = tracker.record(ProbeOutcome::Failed("x".into()), &card);
        assert!(matches!(after.status, HealthStatus::Degraded { failures: 1, .. }));
    }

    #[test]
    fn health_rule_401_403_is_authentication_failure_not_a_counted_failure() {
        let card = card();
        let mut tracker = HealthTracker::new();
        let update = tracker.record(ProbeOutcome::Unauthorized, &card);
        assert_eq!(update.status, HealthStatus::AuthenticationFailed);
    }

    #[test]
    fn health_rule_changed_version_or_build_triggers_refetch() {
        let card = card();
        let mut tracker = HealthTracker::new();
        assert!(!tracker.record(healthy(), &card).refetch_card);
        let mut newer = HealthResponse::for_card(&card);
        newer.connector_card_version = Some("1.1.0".into());
        assert!(tracker.record(ProbeOutcome::Healthy(Box::new(newer)), &card).refetch_card);
        let mut rebuilt = HealthResponse::for_card(&card);
        rebuilt.build = BuildInfo::new("2612010000");
        assert!(tracker.record(ProbeOutcome::Healthy(Box::new(rebuilt)), &card).refetch_card);
        let mut protocol = HealthResponse::for_card(&card);
        protocol.protocol_version = "3.1".into();
        assert!(tracker.record(ProbeOutcome::Healthy(Box::new(protocol)), &card).refetch_card);
    }

    #[test]
    fn health_rule_protocol_or_build_disagreeing_with_the_card_is_offline_until_readmitted() {
        let card = card();
        let mut tracker = HealthTracker::new();
        let mut rebuilt = HealthResponse::for_card(&card);
        rebuilt.build = BuildInfo::new("2612010000");
        let update = tracker.record(ProbeOutcome::Healthy(Box::new(rebuilt)), &card);
        assert!(matches!(update.status, HealthStatus::Offline { .. }), "{update:?}");
        assert!(update.refetch_card);
        // The refetch brought a Card that agrees with /health: online again.
        let mut readmitted = card.clone();
        readmitted.build = BuildInfo::new("2612010000");
        let agreeing = HealthResponse::for_card(&readmitted);
        assert_eq!(tracker.readmitted(&agreeing, &readmitted).status, HealthStatus::Online);
        let card = readmitted;
        // A newer connector.version alone refetches but stays online.
        let mut newer = HealthResponse::for_card(&card);
        newer.connector_card_version = Some("1.1.0".into());
        let update = tracker.record(ProbeOutcome::Healthy(Box::new(newer)), &card);
        assert_eq!(update.status, HealthStatus::Online);
        assert!(update.refetch_card);
    }

    #[test]
    fn health_rule_an_incompatible_connector_stays_offline_when_the_refetched_card_still_differs() {
        let card = card();
        let mut tracker = HealthTracker::new();
        let mut other_protocol = HealthResponse::for_card(&card);
        other_protocol.protocol_version = "3.1".into();
        for _ in 0..3 {
            let update =
                tracker.record(ProbeOutcome::Healthy(Box::new(other_protocol.clone())), &card);
            assert!(update.refetch_card);
            // The refetch brought the same Card again: it still disagrees.
            let after = tracker.readmitted(&other_protocol, &card);
            match &after.status {
                HealthStatus::Offline { reason, .. } => {
                    assert!(reason.contains("protocol 3.1"), "{reason}");
                    assert!(reason.contains("after the refetch"), "{reason}");
                }
                other => panic!("an incompatible Connector cannot be online: {other:?}"),
            }
        }
    }

    #[test]
    fn health_rule_card_id_mismatch_cannot_stay_online() {
        let card = card();
        let mut tracker = HealthTracker::new();
        let mut other = HealthResponse::for_card(&card);
        other.connector_card_id = Some("im.other".into());
        let update = tracker.record(ProbeOutcome::Healthy(Box::new(other)), &card);
        assert!(matches!(update.status, HealthStatus::Offline { .. }));
    }
}
