//! The visitor-facing limits and the join throttle: everything that bounds what one visitor
//! (or one address, or one room) can cost the Connector. Sans-I/O: time comes in as Unix ms.

use std::net::IpAddr;

/// Largest file a visitor can upload from the page (25 MiB, [`VisitorLimits::max_upload_bytes`]).
pub const MAX_PAGE_UPLOAD_BYTES: usize = 25 * 1024 * 1024;
/// Longest text a visitor can send ([`VisitorLimits::max_text_chars`]).
pub const MAX_TEXT_CHARS: usize = 16_000;

use crate::guess::{GuessLimiter, GuessPolicy, Refused};

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
    /// Wrong access codes one address gets before its backoff starts (5).
    pub join_free_failures: u32,
    /// First backoff of an address after its free failures (1 s); it doubles with every
    /// further wrong or refused try (a try during the backoff extends it).
    pub join_backoff_base_millis: u64,
    /// Longest backoff of an address (15 minutes).
    pub join_backoff_max_millis: u64,
    /// Wrong access codes one room takes at once from all addresses together (40); then it
    /// refuses joins until its budget refills (F5).
    pub join_room_burst: u32,
    /// The room's budget refills by one wrong code per this many ms (2 minutes).
    pub join_room_interval_millis: u64,
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

/// The join defaults.
const JOIN: GuessPolicy = GuessPolicy::join();

impl VisitorLimits {
    /// The guessing policy of `join` made of the `join_*` fields.
    pub fn join_policy(&self) -> GuessPolicy {
        let mut policy = GuessPolicy::join();
        policy.free_failures = self.join_free_failures;
        policy.backoff_base_millis = self.join_backoff_base_millis;
        policy.backoff_max_millis = self.join_backoff_max_millis;
        policy.room_burst = self.join_room_burst.max(1);
        policy.room_interval_millis = self.join_room_interval_millis;
        policy
    }
}

impl Default for VisitorLimits {
    fn default() -> Self {
        Self {
            max_text_chars: MAX_TEXT_CHARS,
            max_json_bytes: 64 * 1024,
            max_upload_bytes: MAX_PAGE_UPLOAD_BYTES as u64,
            concurrent_uploads: 4,
            room_upload_bytes_per_day: 256 * 1024 * 1024,
            room_upload_files_per_day: 500,
            visitor_upload_bytes_per_day: 2 * 1024 * 1024 * 1024,
            visitor_upload_files_per_day: 2_000,
            join_free_failures: JOIN.free_failures,
            join_backoff_base_millis: JOIN.backoff_base_millis,
            join_backoff_max_millis: JOIN.backoff_max_millis,
            join_room_burst: JOIN.room_burst,
            join_room_interval_millis: JOIN.room_interval_millis,
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

/// The join throttle (F5): wrong access codes limited per address (IPv6 per /64) with a
/// backoff that every refused try extends, and per room with a budget that refills. One
/// address can never close a room for visitors at other addresses; see [`crate::guess`].
#[derive(Debug)]
pub struct JoinThrottle {
    limiter: GuessLimiter<IpAddr>,
}

impl JoinThrottle {
    /// A throttle with the limits' join policy.
    pub fn new(limits: &VisitorLimits) -> Self {
        Self { limiter: GuessLimiter::new(limits.join_policy()) }
    }

    /// Whether a code from `addr` may be checked now, as far as the address goes. `Err` is
    /// refused (and counted against the address); `Ok` must be followed by the room's budget
    /// ([`JoinThrottle::refused_by_room`] when it is spent), then [`JoinThrottle::failed`] or
    /// [`JoinThrottle::succeeded`] under the same lock.
    pub fn admit(&mut self, addr: Option<IpAddr>, now: u64) -> Result<(), Refused> {
        self.limiter.admit(addr.map(addr_key).as_ref(), now)
    }

    /// The room's budget of wrong codes is spent (`room_wait` ms until it refills): the try
    /// counts against the address too.
    pub fn refused_by_room(&mut self, addr: Option<IpAddr>, room_wait: u64, now: u64) -> Refused {
        self.limiter.refused_by_room(addr.map(addr_key).as_ref(), room_wait, now)
    }

    /// The admitted code was wrong: it counts against the address (the room's budget kept
    /// its try).
    pub fn failed(&mut self, addr: Option<IpAddr>, now: u64) {
        self.limiter.wrong(addr.map(addr_key).as_ref(), now);
    }

    /// A right code from `addr`: its count starts over (never the room's).
    pub fn succeeded(&mut self, addr: Option<IpAddr>) {
        self.limiter.right(addr.map(addr_key).as_ref());
    }

    /// The rate at which a room's budget of wrong codes refills.
    pub(crate) fn room_rate(&self) -> crate::rate::CellRate {
        self.limiter.room_rate()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn h2_wrong_codes_lock_the_address_with_doubling_backoff_in_every_room() {
        let limits = VisitorLimits::default();
        let mut throttle = JoinThrottle::new(&limits);
        let a = addr("192.0.2.1");
        for _ in 0..=limits.join_free_failures {
            assert!(throttle.admit(a, 0).is_ok());
            throttle.failed(a, 0);
        }
        assert_eq!(throttle.admit(a, 0), Err(Refused::Key { wait_millis: 2_000 }));
        // The address is held back whatever room it tries next.
        assert!(throttle.admit(a, 500).is_err());
        // Another address is not (F5).
        assert!(throttle.admit(addr("198.51.100.7"), 500).is_ok());
    }

    #[test]
    fn right_code_from_another_address_is_checked_while_one_address_hammers() {
        let limits = VisitorLimits::default();
        let mut throttle = JoinThrottle::new(&limits);
        let attacker = addr("127.0.0.2");
        for step in 0..10_000u64 {
            if throttle.admit(attacker, step * 20).is_ok() {
                throttle.failed(attacker, step * 20);
            }
            if step % 50 == 0 {
                let visitor = addr(&format!("127.0.1.{}", step % 200));
                assert!(throttle.admit(visitor, step * 20).is_ok(), "at {step}");
                throttle.succeeded(visitor);
            }
        }
    }

    #[test]
    fn a_right_code_clears_the_address_per_64() {
        let limits = VisitorLimits::default();
        let mut throttle = JoinThrottle::new(&limits);
        for _ in 0..=limits.join_free_failures {
            assert!(throttle.admit(addr("2001:db8::1"), 0).is_ok());
            throttle.failed(addr("2001:db8::1"), 0);
        }
        assert!(throttle.admit(addr("2001:db8::3"), 1).is_err(), "the same /64 is held back");
        throttle.succeeded(addr("2001:db8::2"));
        assert!(throttle.admit(addr("2001:db8::1"), 1).is_ok(), "same /64: cleared");
        // A spent room budget counts against the address as well.
        let refused = throttle.refused_by_room(addr("2001:db8::1"), 500, 2);
        assert_eq!(refused, Refused::Room { wait_millis: 500 });
    }
}
