//! The visitor-facing limits and the join throttle: everything that bounds what one visitor
//! (or one address, or one room) can cost the Connector. Sans-I/O: time comes in as Unix ms.

use std::collections::HashMap;
use std::net::IpAddr;

/// Every limit the chat page's API enforces, with its default. SECURITY.md lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct VisitorLimits {
    /// Longest text of a message, on `/messages` and with an upload (16,000 characters).
    pub max_text_chars: usize,
    /// Largest JSON body of any visitor route (64 KiB).
    pub max_json_bytes: usize,
    /// Largest file a visitor can upload from the page (25 MiB); larger ones get 413.
    pub max_upload_bytes: u64,
    /// Page uploads processed at once over the whole Connector (4); more wait their turn.
    pub concurrent_uploads: usize,
    /// Bytes one room's visitors may upload per day (256 MiB); then 507.
    pub room_upload_bytes_per_day: u64,
    /// Files one room's visitors may upload per day (500); then 507.
    pub room_upload_files_per_day: u64,
    /// Bytes all visitors together may upload per day (2 GiB): the rest of the file store
    /// (10 GiB by default) stays available to xAgent.
    pub visitor_upload_bytes_per_day: u64,
    /// Files all visitors together may upload per day (2,000 of the store's 10,000).
    pub visitor_upload_files_per_day: u64,
    /// Wrong access codes tolerated per room and per address before backoff starts (5).
    pub join_free_failures: u32,
    /// First backoff after the free failures (1 s); it doubles with every further failure.
    pub join_backoff_base_millis: u64,
    /// Longest backoff (15 minutes).
    pub join_backoff_max_millis: u64,
    /// Live event streams one visitor token may hold (4).
    pub streams_per_token: usize,
    /// Live event streams per room (64).
    pub streams_per_room: usize,
    /// Live event streams over the whole Connector (512).
    pub streams_total: usize,
    /// Live event streams one visitor address may hold over all its sessions and rooms (16;
    /// IPv6 per /64), so one address never holds a room's or the Connector's streams (F6).
    pub streams_per_address: usize,
    /// Visitor sessions one address may start at once before the rate below applies (60).
    pub joins_per_address_burst: u32,
    /// Visitor sessions one address may start per minute once its burst is spent (60); a
    /// join beyond it gets 429 with `Retry-After` (F12). 0 turns the limit off.
    pub joins_per_address_per_minute: u32,
    /// The most one room may use of the daily visitor upload quota, in percent of
    /// [`VisitorLimits::visitor_upload_bytes_per_day`] and of
    /// [`VisitorLimits::visitor_upload_files_per_day`] (5 %: with the defaults 100 files and
    /// about 102 MiB), so a few rooms cannot use it up for everyone (F13). The room limits
    /// above still apply when they are smaller.
    pub room_upload_share_percent: u8,
    /// Largest snapshot a page receives on (re)connecting (256 KiB of JSON): the oldest
    /// messages are left out beyond it.
    pub snapshot_bytes: usize,
    /// How long a visitor token lives (7 days).
    pub token_lifetime_millis: u64,
}

impl Default for VisitorLimits {
    fn default() -> Self {
        Self {
            max_text_chars: super::MAX_TEXT_CHARS,
            max_json_bytes: 64 * 1024,
            max_upload_bytes: super::MAX_PAGE_UPLOAD_BYTES as u64,
            concurrent_uploads: 4,
            room_upload_bytes_per_day: 256 * 1024 * 1024,
            room_upload_files_per_day: 500,
            visitor_upload_bytes_per_day: 2 * 1024 * 1024 * 1024,
            visitor_upload_files_per_day: 2_000,
            join_free_failures: 5,
            join_backoff_base_millis: 1_000,
            join_backoff_max_millis: 15 * 60 * 1_000,
            streams_per_token: 4,
            streams_per_room: 64,
            streams_total: 512,
            streams_per_address: 16,
            joins_per_address_burst: 60,
            joins_per_address_per_minute: 60,
            room_upload_share_percent: 5,
            snapshot_bytes: 256 * 1024,
            token_lifetime_millis: 7 * 24 * 60 * 60 * 1_000,
        }
    }
}

/// Failures of one key (a room or an address) and when it may try again.
#[derive(Clone, Copy, Debug, Default)]
struct Failures {
    count: u32,
    locked_until: u64,
    last: u64,
}

/// How many keys each table keeps before forgetting quiet ones.
const MAX_TRACKED: usize = 20_000;

/// Per-room and per-address backoff on wrong access codes. A key gets
/// [`VisitorLimits::join_free_failures`] wrong codes for free; each further one locks it for
/// a doubling time up to the maximum. A right code clears the address (never the room, so an
/// attacker cannot reset a room's count with a code of its own room).
#[derive(Debug, Default)]
pub struct JoinThrottle {
    rooms: HashMap<String, Failures>,
    addrs: HashMap<IpAddr, Failures>,
}

/// IPv6 addresses are counted per /64 (one subscriber usually holds a whole /64).
pub(crate) fn addr_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => {
            let mut octets = v6.octets();
            octets[8..].fill(0);
            IpAddr::from(octets)
        }
        v4 => v4,
    }
}

impl JoinThrottle {
    /// `Err(retry_after_millis)` while the room or the address is locked.
    pub fn check(&self, room: &str, addr: Option<IpAddr>, now: u64) -> Result<(), u64> {
        let room_wait = self.rooms.get(room).map_or(0, |f| f.locked_until.saturating_sub(now));
        let addr_wait = addr
            .and_then(|a| self.addrs.get(&addr_key(a)))
            .map_or(0, |f| f.locked_until.saturating_sub(now));
        let wait = room_wait.max(addr_wait);
        if wait > 0 { Err(wait) } else { Ok(()) }
    }

    /// Counts a wrong code against the room and the address.
    pub fn failed(&mut self, room: &str, addr: Option<IpAddr>, now: u64, limits: &VisitorLimits) {
        if self.rooms.len() + self.addrs.len() > MAX_TRACKED {
            self.prune(now, limits);
        }
        let bump = |f: &mut Failures| {
            f.count = f.count.saturating_add(1);
            f.last = now;
            if f.count > limits.join_free_failures {
                let doublings = (f.count - limits.join_free_failures - 1).min(30);
                let wait = limits
                    .join_backoff_base_millis
                    .saturating_mul(1u64 << doublings)
                    .min(limits.join_backoff_max_millis);
                f.locked_until = now.saturating_add(wait);
            }
        };
        bump(self.rooms.entry(room.to_owned()).or_default());
        if let Some(addr) = addr {
            bump(self.addrs.entry(addr_key(addr)).or_default());
        }
    }

    /// A right code from `addr`: its count starts over.
    pub fn succeeded(&mut self, addr: Option<IpAddr>) {
        if let Some(addr) = addr {
            self.addrs.remove(&addr_key(addr));
        }
    }

    /// Forgets keys that have been quiet for twice the longest backoff.
    pub fn prune(&mut self, now: u64, limits: &VisitorLimits) {
        let quiet = limits.join_backoff_max_millis.saturating_mul(2);
        let keep = |f: &Failures| now < f.locked_until || now.saturating_sub(f.last) < quiet;
        self.rooms.retain(|_, f| keep(f));
        self.addrs.retain(|_, f| keep(f));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn h2_wrong_codes_lock_the_room_and_the_address_with_doubling_backoff() {
        let limits = VisitorLimits::default();
        let mut throttle = JoinThrottle::default();
        let a = addr("192.0.2.1");
        for _ in 0..limits.join_free_failures {
            assert!(throttle.check("lobby", a, 0).is_ok());
            throttle.failed("lobby", a, 0, &limits);
        }
        assert!(throttle.check("lobby", a, 0).is_ok(), "the free failures are free");
        throttle.failed("lobby", a, 0, &limits);
        assert_eq!(throttle.check("lobby", a, 0), Err(1_000));
        // Another address is still held back by the room's count.
        assert_eq!(throttle.check("lobby", addr("198.51.100.7"), 500), Err(500));
        // The same address is held back in another room.
        assert_eq!(throttle.check("other", a, 500), Err(500));
        throttle.failed("lobby", a, 1_000, &limits);
        assert_eq!(throttle.check("lobby", None, 1_000), Err(2_000));
        for step in 0..40 {
            throttle.failed("lobby", a, 10_000 + step, &limits);
        }
        let wait = throttle.check("lobby", None, 10_040).unwrap_err();
        assert!(wait <= limits.join_backoff_max_millis && wait > 14 * 60 * 1_000, "{wait}");
    }

    #[test]
    fn a_right_code_clears_the_address_but_not_the_room() {
        let limits = VisitorLimits::default();
        let mut throttle = JoinThrottle::default();
        let a = addr("2001:db8::1");
        for _ in 0..=limits.join_free_failures {
            throttle.failed("lobby", a, 0, &limits);
        }
        throttle.succeeded(addr("2001:db8::2"));
        assert!(throttle.check("other", a, 1).is_ok(), "same /64: cleared");
        assert!(throttle.check("lobby", None, 1).is_err(), "the room keeps its count");
        throttle.prune(u64::MAX / 2, &limits);
        assert!(throttle.check("lobby", None, u64::MAX / 2).is_ok());
    }
}
