//! Jittered exponential backoff for reconnecting.

use std::time::Duration;

/// Reconnect policy: delays grow from `initial` by `factor` up to `max`, each drawn uniformly
/// from `[delay/2, delay]` ("equal jitter") so that many clients do not reconnect in step. The
/// client never gives up: after `max_failures` consecutive failed attempts it reports `offline`
/// and keeps trying at the capped delay.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Growth per failure.
    pub factor: f64,
    /// Consecutive failures from which the state is `offline` rather than `degraded` (`None`:
    /// never `offline`). Reconnecting goes on either way.
    pub max_failures: Option<u32>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(30),
            factor: 2.0,
            max_failures: Some(3),
        }
    }
}

impl Backoff {
    /// The upper bound of the delay before attempt `failures + 1`.
    pub fn ceiling(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(32);
        let grown = self.initial.as_secs_f64() * self.factor.powi(exponent as i32);
        Duration::from_secs_f64(grown.min(self.max.as_secs_f64()))
    }

    /// The jittered delay before the next attempt after `failures` failures in a row.
    pub fn delay(&self, failures: u32) -> Duration {
        let ceiling = self.ceiling(failures);
        let half = ceiling / 2;
        let spread = ceiling.saturating_sub(half).as_millis() as u64;
        half + Duration::from_millis(if spread == 0 { 0 } else { rand::random_range(0..=spread) })
    }

    /// True when `failures` consecutive failures make the Connector `offline`.
    pub fn exhausted(&self, failures: u32) -> bool {
        self.max_failures.is_some_and(|limit| failures >= limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_are_capped() {
        let backoff = Backoff::default();
        assert_eq!(backoff.ceiling(1), Duration::from_millis(200));
        assert_eq!(backoff.ceiling(2), Duration::from_millis(400));
        assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
        assert_eq!(backoff.ceiling(40), Duration::from_secs(30));
    }

    #[test]
    fn jitter_stays_within_half_and_full_ceiling() {
        let backoff = Backoff::default();
        for failures in 1..12 {
            let ceiling = backoff.ceiling(failures);
            for _ in 0..50 {
                let delay = backoff.delay(failures);
                assert!(delay >= ceiling / 2 && delay <= ceiling, "{delay:?} vs {ceiling:?}");
            }
        }
    }

    #[test]
    fn failure_limit() {
        let backoff = Backoff { max_failures: Some(3), ..Backoff::default() };
        // Offline from the third failure on; reconnecting itself never stops.
        assert!(!backoff.exhausted(2));
        assert!(backoff.exhausted(3));
        assert!(!Backoff { max_failures: None, ..backoff }.exhausted(1_000));
    }
}
