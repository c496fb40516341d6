//! What one visitor address or one room may take of the shared capacity (issue 23: F6, F12,
//! F13): the per-address join rate and the per-room share of the daily upload quota. The
//! stream caps per address live with the other stream caps in the hub. Sans-I/O: time comes in
//! as Unix ms from the injected clock.

use std::collections::HashMap;
use std::net::IpAddr;

use super::guard::{VisitorLimits, addr_key};
use crate::quota::UploadQuota;
use crate::rate::CellRate;

/// How many addresses the join rate keeps before forgetting those whose burst is full again.
const MAX_TRACKED_ADDRESSES: usize = 20_000;

/// The visitor sessions each address may start: a burst of
/// [`VisitorLimits::joins_per_address_burst`], then
/// [`VisitorLimits::joins_per_address_per_minute`] (the crate's [`CellRate`], one number per
/// address). IPv6 addresses count per /64.
#[derive(Debug, Default)]
pub struct JoinRate {
    /// Per address: when its bucket is full again (Unix ms).
    full_at: HashMap<IpAddr, u64>,
}

impl JoinRate {
    /// Takes one join for `addr` at `now`, or says after how many ms the next one is allowed.
    /// A join without a peer address (never the case over TCP) is not limited here.
    pub fn take(
        &mut self,
        addr: Option<IpAddr>,
        now: u64,
        limits: &VisitorLimits,
    ) -> Result<(), u64> {
        let (Some(addr), Some(rate)) = (addr, join_rate(limits)) else { return Ok(()) };
        if self.full_at.len() >= MAX_TRACKED_ADDRESSES {
            self.full_at.retain(|_, full_at| *full_at > now);
        }
        let full_at = self.full_at.entry(addr_key(addr)).or_insert(now);
        match rate.wait(*full_at, now) {
            0 => {
                *full_at = rate.add(*full_at, now);
                Ok(())
            }
            wait => Err(wait),
        }
    }

    /// Gives back a join taken by [`JoinRate::take`] that started no session (a wrong code:
    /// those are counted by the join throttle instead).
    pub fn refund(&mut self, addr: Option<IpAddr>, now: u64, limits: &VisitorLimits) {
        let (Some(addr), Some(rate)) = (addr, join_rate(limits)) else { return };
        if let Some(full_at) = self.full_at.get_mut(&addr_key(addr)) {
            *full_at = rate.remove(*full_at, now);
        }
    }
}

/// The join rate of one address; `None` when it is turned off.
fn join_rate(limits: &VisitorLimits) -> Option<CellRate> {
    (limits.joins_per_address_per_minute > 0).then(|| CellRate {
        burst: limits.joins_per_address_burst.max(1),
        interval_millis: (60_000 / u64::from(limits.joins_per_address_per_minute)).max(1),
    })
}

impl VisitorLimits {
    /// The upload quota in force: a room gets the smaller of its own limits and its share
    /// ([`VisitorLimits::room_upload_share_percent`]) of everybody's (F13).
    pub fn upload_quota(&self) -> UploadQuota {
        let percent = u64::from(self.room_upload_share_percent.clamp(1, 100));
        let share = |all: u64| {
            u64::try_from(u128::from(all) * u128::from(percent) / 100).unwrap_or(u64::MAX)
        };
        UploadQuota {
            room_bytes: self
                .room_upload_bytes_per_day
                .min(share(self.visitor_upload_bytes_per_day)),
            room_files: self
                .room_upload_files_per_day
                .min(share(self.visitor_upload_files_per_day).max(1)),
            all_bytes: self.visitor_upload_bytes_per_day,
            all_files: self.visitor_upload_files_per_day,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    fn limits(burst: u32, per_minute: u32) -> VisitorLimits {
        VisitorLimits {
            joins_per_address_burst: burst,
            joins_per_address_per_minute: per_minute,
            ..VisitorLimits::default()
        }
    }

    #[test]
    fn an_address_gets_its_burst_then_one_join_per_interval() {
        let limits = limits(3, 6); // one join per 10 s
        let mut rate = JoinRate::default();
        let a = addr("192.0.2.1");
        for _ in 0..3 {
            assert!(rate.take(a, 1_000, &limits).is_ok());
        }
        assert_eq!(rate.take(a, 1_000, &limits), Err(10_000));
        assert_eq!(rate.take(a, 6_000, &limits), Err(5_000));
        assert!(rate.take(a, 11_000, &limits).is_ok());
        assert!(rate.take(a, 11_000, &limits).is_err());
        // Another address has its own bucket; the same /64 shares one.
        assert!(rate.take(addr("192.0.2.2"), 11_000, &limits).is_ok());
        let v6 = addr("2001:db8::1");
        for _ in 0..3 {
            assert!(rate.take(v6, 0, &limits).is_ok());
        }
        assert!(rate.take(addr("2001:db8::ffff"), 0, &limits).is_err());
        // A long quiet time refills the burst, never more.
        for _ in 0..3 {
            assert!(rate.take(a, 10_000_000, &limits).is_ok());
        }
        assert!(rate.take(a, 10_000_000, &limits).is_err());
    }

    #[test]
    fn a_refund_gives_the_join_back_and_zero_turns_the_rate_off() {
        let limits = limits(1, 1);
        let mut rate = JoinRate::default();
        let a = addr("192.0.2.9");
        assert!(rate.take(a, 0, &limits).is_ok());
        assert!(rate.take(a, 0, &limits).is_err());
        rate.refund(a, 0, &limits);
        assert!(rate.take(a, 0, &limits).is_ok());
        let off = self::limits(1, 0);
        for _ in 0..100 {
            assert!(rate.take(a, 0, &off).is_ok());
        }
        assert!(rate.take(None, 0, &limits).is_ok());
    }

    #[test]
    fn a_room_gets_at_most_its_share_of_the_daily_quota() {
        let quota = VisitorLimits::default().upload_quota();
        assert_eq!(quota.room_files, 100);
        assert_eq!(quota.room_bytes, 2 * 1024 * 1024 * 1024 / 20);
        assert_eq!((quota.all_files, quota.all_bytes), (2_000, 2 * 1024 * 1024 * 1024));
        let tighter = VisitorLimits { room_upload_files_per_day: 7, ..VisitorLimits::default() }
            .upload_quota();
        assert_eq!(tighter.room_files, 7, "a smaller room limit wins");
        let whole = VisitorLimits { room_upload_share_percent: 100, ..VisitorLimits::default() }
            .upload_quota();
        assert_eq!(whole.room_files, 500);
    }
}
