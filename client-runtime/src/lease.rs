//! The holder lease's timing and verdicts, without I/O: when to renew, when a lease counts as
//! lost, how long a standby process waits between attempts. The driver (`crate::driver`) runs
//! them against the store; every time is a value of the injected clock, so the rules are
//! tested with simulated time.
//!
//! Several xAgent processes sharing one database keep one data plane per Connector Card: the
//! one whose lease row names it connects `/ws`; the others stand by and try again every
//! [`HolderLease::renew_every`]. The holder renews on the same interval; the lease lasts
//! [`HolderLease::ttl`] from its last renewal, so a holder that dies is replaced within
//! `ttl + renew_every`.

use std::time::Duration;

use crate::store::{Fence, LeaseState};

/// Default interval between two renewals (and between two attempts of a standby process).
pub const DEFAULT_LEASE_RENEW_EVERY: Duration = Duration::from_secs(1);
/// Default lifetime of a lease after its last renewal.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(4);

/// The holder lease of a data plane: this process's holder id and the lease's timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderLease {
    /// This process's holder id, unique per process start (see [`HolderLease::random`]).
    pub holder: String,
    /// How often the holder renews, and how often a standby process tries to take over.
    pub renew_every: Duration,
    /// How long the lease lasts after a renewal; longer than `renew_every` (a few renewals may
    /// be late before the lease is lost).
    pub ttl: Duration,
}

impl HolderLease {
    /// A lease for `holder` with the default timing (renewed every 1 s, lasting 4 s).
    pub fn new(holder: impl Into<String>) -> Self {
        Self {
            holder: holder.into(),
            renew_every: DEFAULT_LEASE_RENEW_EVERY,
            ttl: DEFAULT_LEASE_TTL,
        }
    }

    /// A lease with a fresh random holder id (`xagent-` and 16 hex digits).
    pub fn random() -> Self {
        Self::new(format!("xagent-{:016x}", rand::random::<u64>()))
    }

    /// The lease lifetime in ms (at least one more than the renewal interval).
    pub fn ttl_ms(&self) -> u64 {
        millis(self.ttl).max(millis(self.renew_every).saturating_add(1))
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// What the holder does after a renewal answer or a clock check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Still the holder until the given time.
    Keep,
    /// The lease is lost: close the data plane now.
    Lost(String),
}

/// The holder's view of its lease: its fence and until when it holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keeper {
    fence: Fence,
    expires_at: u64,
}

impl Keeper {
    /// A lease just granted.
    pub(crate) fn new(fence: Fence, expires_at: u64) -> Self {
        Self { fence, expires_at }
    }

    /// The fence to write under.
    pub(crate) fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The verdict of a renewal answer received at `now`: extended when the row still carries
    /// this fence; lost when it shows another holder or fencing number, or the renewal failed
    /// (a holder that cannot reach the database cannot prove it still holds the lease).
    pub(crate) fn on_renewal(&mut self, answer: Result<LeaseState, String>, now: u64) -> Verdict {
        match answer {
            Ok(LeaseState::Held { fence, expires_at }) if fence == self.fence => {
                self.expires_at = expires_at;
                self.check(now)
            }
            Ok(LeaseState::Held { fence, .. }) => Verdict::Lost(format!(
                "the lease row carries fencing number {} now, not {}",
                fence.number, self.fence.number
            )),
            Ok(LeaseState::Other { holder, number, .. }) => Verdict::Lost(format!(
                "{holder} took the lease over (fencing number {number}, this process had {})",
                self.fence.number
            )),
            Err(error) => Verdict::Lost(format!("the lease could not be renewed: {error}")),
        }
    }

    /// The verdict of the clock alone: lost once `now` reached the expiry.
    pub(crate) fn check(&self, now: u64) -> Verdict {
        if now >= self.expires_at {
            Verdict::Lost(format!(
                "the lease expired at {} before a renewal succeeded (now {now})",
                self.expires_at
            ))
        } else {
            Verdict::Keep
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::ConnectorCardId;

    fn fence(number: u64) -> Fence {
        Fence { card: ConnectorCardId::new("im.example"), holder: "a".into(), number }
    }

    #[test]
    fn lease_rule_a_renewal_that_carries_the_fence_extends_the_lease() {
        let mut keeper = Keeper::new(fence(3), 4_000);
        let renewed = Ok(LeaseState::Held { fence: fence(3), expires_at: 5_000 });
        assert_eq!(keeper.on_renewal(renewed, 1_000), Verdict::Keep);
        assert_eq!(keeper.check(4_999), Verdict::Keep, "extended to 5,000");
        assert!(matches!(keeper.check(5_000), Verdict::Lost(_)), "expired at 5,000");
    }

    #[test]
    fn lease_rule_another_holder_a_higher_fencing_number_or_a_failed_renewal_lose_it_at_once() {
        let mut keeper = Keeper::new(fence(3), 4_000);
        let other = Ok(LeaseState::Other { holder: "b".into(), number: 4, expires_at: 9_000 });
        assert!(
            matches!(keeper.on_renewal(other, 1_000), Verdict::Lost(r) if r.contains("b took"))
        );
        let mut keeper = Keeper::new(fence(3), 4_000);
        let higher = Ok(LeaseState::Held { fence: fence(4), expires_at: 9_000 });
        assert!(matches!(keeper.on_renewal(higher, 1_000), Verdict::Lost(r) if r.contains('4')));
        let mut keeper = Keeper::new(fence(3), 4_000);
        let failed = Err("connection refused".to_owned());
        assert!(
            matches!(keeper.on_renewal(failed, 1_000), Verdict::Lost(r) if r.contains("refused")),
            "lost long before the expiry"
        );
    }

    #[test]
    fn lease_rule_a_renewal_answered_after_the_expiry_does_not_revive_the_lease() {
        let mut keeper = Keeper::new(fence(3), 4_000);
        // The database answered, but the answer arrived when the old expiry had passed and
        // names an expiry that has passed too.
        let late = Ok(LeaseState::Held { fence: fence(3), expires_at: 4_500 });
        assert!(matches!(keeper.on_renewal(late, 4_500), Verdict::Lost(_)));
    }

    #[test]
    fn lease_rule_the_lifetime_is_longer_than_the_renewal_interval() {
        let mut lease = HolderLease::new("a");
        assert_eq!((lease.renew_every, lease.ttl_ms()), (Duration::from_secs(1), 4_000));
        lease.ttl = Duration::from_millis(500);
        assert_eq!(lease.ttl_ms(), 1_001, "a lifetime shorter than the interval is raised");
        assert!(HolderLease::random().holder.starts_with("xagent-"));
    }
}
