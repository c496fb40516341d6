//! One rate rule for every limiter of the crate that allows "a burst, then one per interval":
//! a generic cell rate, kept as one number per key (the Unix ms at which the key's bucket is
//! full again). The join rate per address and the room budget of wrong codes both use it.

/// A burst of `burst` events, then one per `interval_millis`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CellRate {
    /// Events allowed at once (at least one is always allowed from a full bucket).
    pub burst: u32,
    /// Time one event costs, in ms.
    pub interval_millis: u64,
}

impl CellRate {
    /// Ms until one more event is allowed for a key whose bucket is full again at `full_at`
    /// (0: now).
    pub fn wait(self, full_at: u64, now: u64) -> u64 {
        let ahead = full_at.saturating_sub(now);
        let allowed = u64::from(self.burst.saturating_sub(1)).saturating_mul(self.interval_millis);
        ahead.saturating_sub(allowed)
    }

    /// Counts one event at `now`: the key's new full-again time.
    pub fn add(self, full_at: u64, now: u64) -> u64 {
        full_at.max(now).saturating_add(self.interval_millis)
    }

    /// Gives one counted event back: the key's new full-again time.
    pub fn remove(self, full_at: u64, now: u64) -> u64 {
        full_at.saturating_sub(self.interval_millis).max(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_event_per_interval_and_a_refund() {
        let rate = CellRate { burst: 3, interval_millis: 10 };
        let mut full_at = 0;
        for _ in 0..3 {
            assert_eq!(rate.wait(full_at, 100), 0);
            full_at = rate.add(full_at, 100);
        }
        assert_eq!(rate.wait(full_at, 100), 10);
        assert_eq!(rate.wait(full_at, 105), 5);
        assert_eq!(rate.wait(full_at, 110), 0);
        full_at = rate.remove(full_at, 100);
        assert_eq!(rate.wait(full_at, 100), 0);
        // A long quiet time refills the burst, never more.
        assert_eq!(rate.add(full_at, 10_000), 10_010);
    }
}
