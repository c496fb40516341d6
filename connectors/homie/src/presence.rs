//! Whether a watched device is there, and when that is reported (sans-I/O; the caller passes
//! the time, so tests use a manual clock).
//!
//! Two rules protect the Connector from what others publish on the broker:
//!
//! - **`$state lost` is confirmed by silence.** `lost` is what the broker publishes for a
//!   device that vanished (its last will), but anyone who can publish under the device's topics
//!   can also write it, retained. So a `lost` only takes the device offline once
//!   [`Presence::lost_grace`] has passed with no live message from the device (a property
//!   value or a picture that was not a retained copy); any live message from the device after
//!   the `lost` dismisses it. Until then the previous conclusion stands.
//! - **Reports are debounced.** A change of availability is reported at once when none was
//!   reported within the last [`Presence::debounce`]; otherwise it waits for the end of that
//!   window and only the availability then is reported (changes in between are coalesced, and
//!   nothing is reported when it ends where it started). A device (or someone) flipping
//!   `$state` thousands of times a second costs xAgent at most one Descriptor push per window.

use std::time::Duration;

use tokio::time::Instant;

/// A `$state lost` seen and not yet dismissed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LostClaim {
    since: Instant,
    dismissed: bool,
}

/// What the lost rule says about a device's `$state lost`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostVerdict {
    /// The device did not say `lost` (or the claim was dismissed by live traffic).
    NotLost,
    /// `lost` is recent and nothing live came since: keep the previous conclusion.
    Pending,
    /// `lost` held for the whole grace period without live traffic: offline.
    Confirmed,
}

/// One device's presence bookkeeping.
#[derive(Clone, Debug)]
pub struct Presence<A> {
    /// How long a `lost` must go without live traffic before it counts.
    pub lost_grace: Duration,
    /// Shortest time between two reports.
    pub debounce: Duration,
    lost: Option<LostClaim>,
    reported: Option<A>,
    reported_at: Option<Instant>,
}

impl<A: Clone + PartialEq> Presence<A> {
    /// Nothing seen, nothing reported.
    pub fn new(lost_grace: Duration, debounce: Duration) -> Self {
        Self { lost_grace, debounce, lost: None, reported: None, reported_at: None }
    }

    /// The device's `$state` changed at `now`: `lost` starts a claim, anything else ends it.
    pub fn on_state(&mut self, lost: bool, now: Instant) {
        self.lost = lost.then_some(LostClaim { since: now, dismissed: false });
    }

    /// A live message from the device itself (not a retained copy): dismisses a `lost`.
    pub fn on_live_traffic(&mut self) {
        if let Some(claim) = &mut self.lost {
            claim.dismissed = true;
        }
    }

    /// Forgets the claim (the device's topics are being read again from scratch).
    pub fn reset(&mut self) {
        self.lost = None;
    }

    /// The lost rule's verdict at `now` for a device whose `$state` is `lost` (or not).
    pub fn lost_verdict(&self, state_is_lost: bool, now: Instant) -> LostVerdict {
        if !state_is_lost {
            return LostVerdict::NotLost;
        }
        match self.lost {
            Some(LostClaim { dismissed: true, .. }) => LostVerdict::NotLost,
            Some(LostClaim { since, .. }) if now < since + self.lost_grace => LostVerdict::Pending,
            // Held for the whole grace period (a `lost` without a claim cannot happen: every
            // `$state` the tree takes goes through `on_state`).
            _ => LostVerdict::Confirmed,
        }
    }

    /// The availability to report at `now`, if one is due: `current` when it differs from the
    /// last report and no report was made within the debounce window.
    pub fn report(&mut self, current: &A, now: Instant) -> Option<A> {
        if self.reported.as_ref() == Some(current) {
            return None;
        }
        if self.reported_at.is_some_and(|at| now < at + self.debounce) {
            return None;
        }
        self.reported = Some(current.clone());
        self.reported_at = Some(now);
        Some(current.clone())
    }

    /// Records `current` as reported without reporting it (the first conclusion about a
    /// device that was just watched is announced by the one who watched it).
    pub fn assume_reported(&mut self, current: &A) {
        self.reported = Some(current.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(5);
    const WINDOW: Duration = Duration::from_secs(2);

    #[test]
    fn retained_lost_state_does_not_offline_a_live_device() {
        let t0 = Instant::now();
        let mut p: Presence<&str> = Presence::new(GRACE, WINDOW);
        p.on_state(true, t0);
        assert_eq!(p.lost_verdict(true, t0 + Duration::from_secs(1)), LostVerdict::Pending);
        // The device keeps publishing: the lost was not its own.
        p.on_live_traffic();
        assert_eq!(p.lost_verdict(true, t0 + Duration::from_secs(60)), LostVerdict::NotLost);
        // A device that really went silent is offline once the grace has passed.
        let mut q: Presence<&str> = Presence::new(GRACE, WINDOW);
        q.on_state(true, t0);
        assert_eq!(q.lost_verdict(true, t0 + GRACE), LostVerdict::Confirmed);
        // Another state ends the claim.
        q.on_state(false, t0 + GRACE);
        assert_eq!(q.lost_verdict(false, t0 + GRACE), LostVerdict::NotLost);
    }

    #[test]
    fn availability_flaps_are_debounced() {
        let t0 = Instant::now();
        let mut p: Presence<bool> = Presence::new(GRACE, WINDOW);
        let mut reports = 0;
        // 2,000 flips in one second (simulated time), then quiet.
        for i in 0..2_000u32 {
            let now = t0 + Duration::from_micros(u64::from(i) * 500);
            if p.report(&(i % 2 == 0), now).is_some() {
                reports += 1;
            }
        }
        assert_eq!(reports, 1, "the first change goes out at once, the rest wait");
        // The window ends: the state then (the last flip: false) is reported once.
        assert_eq!(p.report(&false, t0 + WINDOW), Some(false));
        assert_eq!(p.report(&false, t0 + WINDOW * 3), None, "nothing new");
        // Ending where the last report was: nothing to say.
        let mut q: Presence<bool> = Presence::new(GRACE, WINDOW);
        assert_eq!(q.report(&true, t0), Some(true));
        assert_eq!(q.report(&false, t0 + Duration::from_millis(1)), None);
        assert_eq!(q.report(&true, t0 + WINDOW), None);
    }
}
