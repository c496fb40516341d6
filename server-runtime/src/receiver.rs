//! What a Connector's receiver of target-system events needs around its loop (sans-I/O, time
//! passed in): [`Backoff`] between failed attempts (doubling, capped, with the target's own
//! "retry after" honoured), and [`LinkHealth`], which turns a run of failures into the
//! `connection.status` every bound channel should show (`degraded` at the first failure,
//! `offline` once the target stayed unreachable for a while, `connected` at the first success).
//!
//! ```
//! use std::time::Duration;
//! use xagent_server_runtime::{Backoff, LinkHealth};
//! use xagent_protocol_types::ConnectionStatus;
//!
//! let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
//! assert_eq!(backoff.next_delay(None), Duration::from_millis(500));
//! assert_eq!(backoff.next_delay(None), Duration::from_secs(1));
//! // The target said "retry after 5 s": never sooner than that.
//! assert_eq!(backoff.next_delay(Some(Duration::from_secs(5))), Duration::from_secs(5));
//!
//! let mut health = LinkHealth::new(Duration::from_secs(30));
//! assert_eq!(health.failed(0), Some(ConnectionStatus::Degraded));
//! assert_eq!(health.failed(10_000), None);
//! assert_eq!(health.failed(31_000), Some(ConnectionStatus::Offline));
//! assert_eq!(health.succeeded(), Some(ConnectionStatus::Connected));
//! ```

use std::time::Duration;

use xagent_protocol_types::ConnectionStatus;

/// Delays between failed attempts: `initial`, doubling up to `max`; never shorter than a
/// retry-after the target asked for (itself capped at 10 minutes, so a hostile or broken
/// target cannot park the receiver for ever). [`Backoff::reset`] after a success.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

/// The longest retry-after a target may impose.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

impl Backoff {
    /// Starts at `initial` and doubles up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        Self { initial, max: max.max(initial), next: initial }
    }

    /// The delay before the next attempt, given what the target asked for (a 429's
    /// `retry_after_ms`, a `Retry-After` header).
    pub fn next_delay(&mut self, retry_after: Option<Duration>) -> Duration {
        let ours = self.next;
        self.next = (self.next * 2).min(self.max);
        match retry_after {
            Some(asked) => ours.max(asked.min(MAX_RETRY_AFTER)),
            None => ours,
        }
    }

    /// Back to `initial` (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// The status a receiver's failures and successes imply for the channels it serves; each
/// call returns `Some(status)` only when that status changes.
#[derive(Clone, Debug)]
pub struct LinkHealth {
    offline_after_ms: u64,
    failing_since: Option<u64>,
    shown: ConnectionStatus,
}

impl LinkHealth {
    /// `offline` once failures went on for `offline_after`.
    pub fn new(offline_after: Duration) -> Self {
        Self {
            offline_after_ms: u64::try_from(offline_after.as_millis()).unwrap_or(u64::MAX),
            failing_since: None,
            shown: ConnectionStatus::Connected,
        }
    }

    /// An attempt failed at `now_ms` (Unix ms or any monotonic count of ms).
    pub fn failed(&mut self, now_ms: u64) -> Option<ConnectionStatus> {
        let since = *self.failing_since.get_or_insert(now_ms);
        let status = if now_ms.saturating_sub(since) >= self.offline_after_ms {
            ConnectionStatus::Offline
        } else {
            ConnectionStatus::Degraded
        };
        self.show(status)
    }

    /// An attempt succeeded.
    pub fn succeeded(&mut self) -> Option<ConnectionStatus> {
        self.failing_since = None;
        self.show(ConnectionStatus::Connected)
    }

    /// What the channels should show now.
    pub fn status(&self) -> ConnectionStatus {
        self.shown.clone()
    }

    fn show(&mut self, status: ConnectionStatus) -> Option<ConnectionStatus> {
        if self.shown == status {
            return None;
        }
        self.shown = status.clone();
        Some(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_starts_over_after_a_success() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let delays: Vec<_> = (0..4).map(|_| b.next_delay(None).as_millis()).collect();
        assert_eq!(delays, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay(None), Duration::from_millis(100));
    }

    #[test]
    fn a_retry_after_is_honoured_but_capped() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(b.next_delay(Some(Duration::from_millis(40))), Duration::from_millis(100));
        assert_eq!(b.next_delay(Some(Duration::from_secs(86_400))), MAX_RETRY_AFTER);
    }

    #[test]
    fn health_reports_only_changes() {
        let mut h = LinkHealth::new(Duration::from_millis(1_000));
        assert_eq!(h.succeeded(), None);
        assert_eq!(h.failed(5_000), Some(ConnectionStatus::Degraded));
        assert_eq!(h.failed(5_999), None);
        assert_eq!(h.failed(6_000), Some(ConnectionStatus::Offline));
        assert_eq!(h.failed(9_000), None);
        assert_eq!(h.status(), ConnectionStatus::Offline);
        assert_eq!(h.succeeded(), Some(ConnectionStatus::Connected));
        // A new run of failures counts from its own start.
        assert_eq!(h.failed(20_000), Some(ConnectionStatus::Degraded));
    }
}
