//! `chat.activity` on the Connector: each snapshot replaces the previous one; the indicator is
//! cleared on `idle`, on a final message, on the first visible delta and after a local timeout;
//! what is shown depends on what the target supports (custom status, typing only, nothing).
//!
//! The tracker is independent of message delivery: an activity that cannot be shown never
//! rejects, retries or duplicates a chat message.

use std::collections::BTreeMap;

use xagent_protocol_types::{ActivityStatus, ChatActivity, ChatMessageDelta, ConnectorChannelId};

use crate::{PayloadError, validate_activity};

/// Default local timeout of a shown activity: 2 minutes without a new snapshot.
pub const DEFAULT_ACTIVITY_TIMEOUT_MS: u64 = 2 * 60 * 1000;

/// What the target system can show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ActivityCapability {
    /// A custom status line (e.g. "running web_search").
    CustomStatus,
    /// Only a typing indicator: `thinking` and `tool` degrade to typing.
    #[default]
    TypingOnly,
    /// Nothing: every activity is a no-op.
    Unsupported,
}

/// Tracker policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActivityConfig {
    /// What the target can show.
    pub capability: ActivityCapability,
    /// Local timeout after which a shown activity is cleared.
    pub timeout_ms: u64,
}

impl Default for ActivityConfig {
    /// Typing only, 2-minute timeout.
    fn default() -> Self {
        Self { capability: ActivityCapability::default(), timeout_ms: DEFAULT_ACTIVITY_TIMEOUT_MS }
    }
}

/// What the Connector should do on the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActivityAction {
    /// Show this status (custom-status targets).
    Show {
        /// `thinking` or `tool`.
        status: ActivityStatus,
        /// The Tool's name with `tool`.
        tool_name: Option<String>,
    },
    /// Show (or refresh) the typing indicator.
    Typing,
    /// Remove the indicator.
    Clear,
    /// Nothing to do.
    Noop,
}

#[derive(Debug)]
struct Shown {
    snapshot: ChatActivity,
    since: u64,
}

/// Per-channel activity state of one Connector.
#[derive(Debug)]
pub struct ActivityTracker {
    config: ActivityConfig,
    channels: BTreeMap<ConnectorChannelId, Shown>,
}

impl ActivityTracker {
    /// An empty tracker.
    pub fn new(config: ActivityConfig) -> Self {
        Self { config, channels: BTreeMap::new() }
    }

    /// The policy in force.
    pub fn config(&self) -> &ActivityConfig {
        &self.config
    }

    /// A `chat.activity` snapshot arrived. It is checked first (an invalid one is refused and
    /// changes nothing), then replaces the channel's previous snapshot.
    pub fn on_activity(
        &mut self,
        channel: &ConnectorChannelId,
        activity: &ChatActivity,
        now: u64,
    ) -> Result<ActivityAction, PayloadError> {
        validate_activity(activity)?;
        if activity.status == ActivityStatus::Idle {
            return Ok(self.clear(channel));
        }
        self.channels.insert(channel.clone(), Shown { snapshot: activity.clone(), since: now });
        Ok(match self.config.capability {
            ActivityCapability::CustomStatus => ActivityAction::Show {
                status: activity.status.clone(),
                tool_name: activity.tool_name.clone(),
            },
            ActivityCapability::TypingOnly => ActivityAction::Typing,
            ActivityCapability::Unsupported => ActivityAction::Noop,
        })
    }

    /// A final `chat.message` was delivered on the channel: clear the indicator.
    pub fn on_final_message(&mut self, channel: &ConnectorChannelId) -> ActivityAction {
        self.clear(channel)
    }

    /// A delta arrived: the first one with visible text clears the indicator.
    pub fn on_delta(
        &mut self,
        channel: &ConnectorChannelId,
        delta: &ChatMessageDelta,
    ) -> ActivityAction {
        if delta.text.is_empty() { ActivityAction::Noop } else { self.clear(channel) }
    }

    /// Clears indicators older than the local timeout; returns the channels to clear.
    pub fn expire(&mut self, now: u64) -> Vec<(ConnectorChannelId, ActivityAction)> {
        let timeout = self.config.timeout_ms;
        let stale: Vec<ConnectorChannelId> = self
            .channels
            .iter()
            .filter(|(_, s)| now.saturating_sub(s.since) >= timeout)
            .map(|(c, _)| c.clone())
            .collect();
        stale
            .into_iter()
            .map(|c| {
                let action = self.clear(&c);
                (c, action)
            })
            .filter(|(_, a)| *a != ActivityAction::Noop)
            .collect()
    }

    /// The snapshot currently shown on the channel.
    pub fn current(&self, channel: &ConnectorChannelId) -> Option<&ChatActivity> {
        self.channels.get(channel).map(|s| &s.snapshot)
    }

    /// The channel was closed or deleted: forget its state.
    pub fn remove_channel(&mut self, channel: &ConnectorChannelId) {
        self.channels.remove(channel);
    }

    fn clear(&mut self, channel: &ConnectorChannelId) -> ActivityAction {
        match (self.channels.remove(channel), self.config.capability) {
            (Some(_), ActivityCapability::CustomStatus | ActivityCapability::TypingOnly) => {
                ActivityAction::Clear
            }
            _ => ActivityAction::Noop,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch() -> ConnectorChannelId {
        ConnectorChannelId::new("c")
    }

    fn tracker(capability: ActivityCapability) -> ActivityTracker {
        ActivityTracker::new(ActivityConfig { capability, timeout_ms: 1_000 })
    }

    #[test]
    fn snapshots_replace_each_other_and_idle_clears() {
        let mut t = tracker(ActivityCapability::CustomStatus);
        assert_eq!(
            t.on_activity(&ch(), &ChatActivity::thinking(), 0).unwrap(),
            ActivityAction::Show { status: ActivityStatus::Thinking, tool_name: None }
        );
        assert_eq!(
            t.on_activity(&ch(), &ChatActivity::tool("web_search"), 1).unwrap(),
            ActivityAction::Show {
                status: ActivityStatus::Tool,
                tool_name: Some("web_search".into())
            }
        );
        assert_eq!(t.current(&ch()).unwrap().tool_name.as_deref(), Some("web_search"));
        assert_eq!(t.on_activity(&ch(), &ChatActivity::idle(), 2).unwrap(), ActivityAction::Clear);
        assert!(t.current(&ch()).is_none());
        assert_eq!(t.on_activity(&ch(), &ChatActivity::idle(), 3).unwrap(), ActivityAction::Noop);
    }

    #[test]
    fn cleared_by_final_message_and_first_visible_delta() {
        let mut t = tracker(ActivityCapability::TypingOnly);
        assert_eq!(
            t.on_activity(&ch(), &ChatActivity::thinking(), 0).unwrap(),
            ActivityAction::Typing
        );
        assert_eq!(t.on_final_message(&ch()), ActivityAction::Clear);
        t.on_activity(&ch(), &ChatActivity::tool("x"), 0).unwrap();
        assert_eq!(t.on_delta(&ch(), &ChatMessageDelta::new("m", 1, "")), ActivityAction::Noop);
        assert_eq!(t.on_delta(&ch(), &ChatMessageDelta::new("m", 2, "Hi")), ActivityAction::Clear);
        assert_eq!(t.on_delta(&ch(), &ChatMessageDelta::new("m", 3, "!")), ActivityAction::Noop);
    }

    #[test]
    fn activity_local_timeout_clears() {
        let clock = xagent_protocol_types::ManualClock::new(10_000);
        use xagent_protocol_types::Clock;
        let mut t = tracker(ActivityCapability::CustomStatus);
        t.on_activity(&ch(), &ChatActivity::thinking(), clock.now_millis()).unwrap();
        clock.advance(999);
        assert!(t.expire(clock.now_millis()).is_empty());
        clock.advance(1);
        assert_eq!(t.expire(clock.now_millis()), vec![(ch(), ActivityAction::Clear)]);
        assert!(t.current(&ch()).is_none());
    }

    #[test]
    fn unsupported_target_degrades_to_noop() {
        let mut t = tracker(ActivityCapability::Unsupported);
        assert_eq!(
            t.on_activity(&ch(), &ChatActivity::thinking(), 0).unwrap(),
            ActivityAction::Noop
        );
        assert_eq!(t.on_final_message(&ch()), ActivityAction::Noop);
        assert!(t.expire(5_000).is_empty());
    }

    #[test]
    fn rule_invalid_activity_is_refused_and_changes_nothing() {
        let mut t = tracker(ActivityCapability::CustomStatus);
        t.on_activity(&ch(), &ChatActivity::thinking(), 0).unwrap();
        let mut bad = ChatActivity::thinking();
        bad.tool_name = Some("x".into());
        assert_eq!(t.on_activity(&ch(), &bad, 1), Err(PayloadError::ToolNameForbidden));
        assert_eq!(t.current(&ch()).unwrap().status, ActivityStatus::Thinking);
    }
}
