//! The one limiter on guessing a room's secrets (F5, F21): visitors' access codes on `join`
//! (keyed by address) and owner or access codes through `auth.start` (keyed by channel).
//! Sans-I/O: time comes in as Unix ms from the injected clock.
//!
//! Two limits work together:
//! - **Per key, exponential backoff.** A key (an address, a channel) gets
//!   [`GuessPolicy::free_failures`] wrong tries for free; each further one locks it for a
//!   doubling time (from [`GuessPolicy::backoff_base_millis`] up to
//!   [`GuessPolicy::backoff_max_millis`]). A try while locked is refused **and counts**: it
//!   extends the lock, so hammering never gets a try checked. A right secret clears the key.
//! - **Per room, a budget of wrong tries that refills** (a generic cell rate: up to
//!   [`GuessPolicy::room_burst`] at once, then one per [`GuessPolicy::room_interval_millis`]).
//!   It bounds guessing from many keys. It is sized so that one key, held back by its own
//!   backoff, can never empty it: a lone attacker never closes the room for anybody else.
//!
//! A try refused by either limit is never checked, so a refusal says nothing about the
//! secret.

use std::collections::HashMap;
use std::hash::Hash;

use crate::rate::CellRate;

/// How many wrong tries a key and a room get. Two sets of defaults: [`GuessPolicy::join`]
/// for visitors' access codes, [`GuessPolicy::sign_in`] for codes given through `auth.start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GuessPolicy {
    /// Wrong tries one key gets before its backoff starts.
    pub free_failures: u32,
    /// The first lock after the free tries; it doubles with every further try.
    pub backoff_base_millis: u64,
    /// The longest lock of one key.
    pub backoff_max_millis: u64,
    /// Wrong tries a room takes at once from all keys together.
    pub room_burst: u32,
    /// After the burst, one more wrong try per this many ms (the budget refills at this rate).
    pub room_interval_millis: u64,
}

impl GuessPolicy {
    /// Visitors' access codes on `join`, per address: 5 free, 1 s doubling to 15 min; per room
    /// 40 wrong codes at once, then one every 2 minutes (at most ~760 a day from any number of
    /// addresses; one address, held back by its backoff, checks at most ~110 a day).
    pub const fn join() -> Self {
        Self {
            free_failures: 5,
            backoff_base_millis: 1_000,
            backoff_max_millis: 15 * 60 * 1_000,
            room_burst: 40,
            room_interval_millis: 2 * 60 * 1_000,
        }
    }

    /// Owner and access codes through `auth.start`, per channel: 3 free, 1 s doubling to
    /// 15 min; per room 10 wrong codes at once, then one a minute.
    pub const fn sign_in() -> Self {
        Self {
            free_failures: 3,
            backoff_base_millis: 1_000,
            backoff_max_millis: 15 * 60 * 1_000,
            room_burst: 10,
            room_interval_millis: 60 * 1_000,
        }
    }

    /// The lock after the `count`-th wrong or refused try of a key (0 while free).
    fn backoff(&self, count: u32) -> u64 {
        if count <= self.free_failures {
            return 0;
        }
        let doublings = (count - self.free_failures - 1).min(40);
        self.backoff_base_millis.saturating_mul(1u64 << doublings).min(self.backoff_max_millis)
    }
}

/// Why a try was refused, and when to try again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// This key (address or channel) is in its backoff.
    Key {
        /// Ms until it may try again (a try before then extends it).
        wait_millis: u64,
    },
    /// The room took its budget of wrong tries (from many keys); it refills.
    Room {
        /// Ms until the room checks a code again.
        wait_millis: u64,
    },
}

impl Refused {
    /// Ms until a try may be checked again.
    pub fn wait_millis(self) -> u64 {
        match self {
            Self::Key { wait_millis } | Self::Room { wait_millis } => wait_millis,
        }
    }
}

/// Wrong and refused tries of one key.
#[derive(Clone, Copy, Debug, Default)]
struct KeyState {
    count: u32,
    locked_until: u64,
    last: u64,
}

/// How many keys are tracked at most: beyond it, quiet ones are forgotten, and new ones are
/// not tracked (the room budget still counts their wrong tries).
const MAX_KEYS: usize = 20_000;

/// Ms until a room checks a wrong try again (0: now), given the times of the wrong tries it
/// took (in any order): the crate's one cell-rate rule folded over them. The tries live in
/// the runtime's storage (`Store::begin_guess`), so every replica computes the same budget.
pub(crate) fn room_wait(rate: CellRate, tries: &[u64], now: u64) -> u64 {
    let mut sorted = tries.to_vec();
    sorted.sort_unstable();
    let full_at = sorted.into_iter().fold(0, |full_at, at| rate.add(full_at, at));
    rate.wait(full_at, now)
}

/// The per-key half of the limiter (see the module docs): each process keeps its keys'
/// backoff; the room budget is in the storage ([`room_wait`]).
#[derive(Debug)]
pub struct GuessLimiter<K> {
    policy: GuessPolicy,
    keys: HashMap<K, KeyState>,
}

impl<K: Hash + Eq + Clone> GuessLimiter<K> {
    /// An empty limiter with this policy.
    pub fn new(policy: GuessPolicy) -> Self {
        Self { policy, keys: HashMap::new() }
    }

    /// Asks to check one try from `key` at `now`. `Ok` means ask the room's budget next
    /// ([`GuessLimiter::refused_by_room`] when it is spent), then check the secret and report
    /// the result with [`GuessLimiter::wrong`] or [`GuessLimiter::right`] (hold the
    /// limiter's lock across it). `Err` means refused without checking; the refusal has
    /// been counted against the key already.
    pub fn admit(&mut self, key: Option<&K>, now: u64) -> Result<(), Refused> {
        let key_wait = key
            .and_then(|k| self.keys.get(k))
            .map_or(0, |state| state.locked_until.saturating_sub(now));
        if key_wait > 0 {
            let wait_millis = self.count_key(key, now).max(key_wait);
            return Err(Refused::Key { wait_millis });
        }
        Ok(())
    }

    /// The room's budget refused the try admitted last (`room_wait` ms until it refills): it
    /// counts against the key, and the refusal says when to try again.
    pub fn refused_by_room(&mut self, key: Option<&K>, room_wait: u64, now: u64) -> Refused {
        let key_wait = self.count_key(key, now);
        Refused::Room { wait_millis: room_wait.max(key_wait) }
    }

    /// The try admitted last was wrong: it counts against the key (the caller kept it in the
    /// room's budget).
    pub fn wrong(&mut self, key: Option<&K>, now: u64) {
        self.count_key(key, now);
    }

    /// The try admitted last was right: the key starts over (the room's budget does not, so
    /// a key cannot refill a room with a secret of its own).
    pub fn right(&mut self, key: Option<&K>) {
        if let Some(key) = key {
            self.keys.remove(key);
        }
    }

    /// The room budget's refill: the crate's one cell-rate rule.
    pub(crate) fn room_rate(&self) -> CellRate {
        CellRate {
            burst: self.policy.room_burst,
            interval_millis: self.policy.room_interval_millis,
        }
    }

    /// Counts one wrong or refused try of `key`; returns its lock from `now` (0 while free).
    fn count_key(&mut self, key: Option<&K>, now: u64) -> u64 {
        let Some(key) = key else { return 0 };
        if self.keys.len() >= MAX_KEYS && !self.keys.contains_key(key) {
            self.prune(now);
            if self.keys.len() >= MAX_KEYS {
                return 0;
            }
        }
        let state = self.keys.entry(key.clone()).or_default();
        state.count = state.count.saturating_add(1);
        state.last = now;
        let wait = self.policy.backoff(state.count);
        if wait > 0 {
            state.locked_until = now.saturating_add(wait);
        }
        wait
    }

    /// Forgets keys quiet for twice the longest backoff.
    pub fn prune(&mut self, now: u64) {
        let quiet = self.policy.backoff_max_millis.saturating_mul(2);
        self.keys.retain(|_, s| now < s.locked_until || now.saturating_sub(s.last) < quiet);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small policy for readable numbers: 2 free, 1 s doubling to 8 s; room 6 at once, then
    /// one per 10 s.
    fn small() -> GuessPolicy {
        GuessPolicy {
            free_failures: 2,
            backoff_base_millis: 1_000,
            backoff_max_millis: 8_000,
            room_burst: 6,
            room_interval_millis: 10_000,
        }
    }

    /// A limiter with the wrong tries of each room kept beside it (what the storage keeps).
    struct Rooms {
        limiter: GuessLimiter<u32>,
        tries: HashMap<String, Vec<u64>>,
    }

    impl Rooms {
        fn new(policy: GuessPolicy) -> Self {
            Self { limiter: GuessLimiter::new(policy), tries: HashMap::new() }
        }

        /// The admission of a try: the key, then the room's budget.
        fn admit(&mut self, room: &str, key: Option<&u32>, now: u64) -> Result<(), Refused> {
            self.limiter.admit(key, now)?;
            let tries = self.tries.get(room).map_or(&[][..], Vec::as_slice);
            let wait = room_wait(self.limiter.room_rate(), tries, now);
            if wait > 0 {
                return Err(self.limiter.refused_by_room(key, wait, now));
            }
            Ok(())
        }

        fn wrong(&mut self, room: &str, key: Option<&u32>, now: u64) {
            self.tries.entry(room.to_owned()).or_default().push(now);
            self.limiter.wrong(key, now);
        }
    }

    fn try_once(limiter: &mut Rooms, key: u32, now: u64, right: bool) -> Result<(), Refused> {
        limiter.admit("room", Some(&key), now)?;
        if right {
            limiter.limiter.right(Some(&key));
        } else {
            limiter.wrong("room", Some(&key), now);
        }
        Ok(())
    }

    #[test]
    fn a_key_gets_its_free_tries_then_a_doubling_lock() {
        let mut limiter = Rooms::new(small());
        assert!(try_once(&mut limiter, 1, 0, false).is_ok());
        assert!(try_once(&mut limiter, 1, 0, false).is_ok());
        // The third wrong try is checked and locks the key for 1 s.
        assert!(try_once(&mut limiter, 1, 0, false).is_ok());
        assert_eq!(limiter.admit("room", Some(&1), 500), Err(Refused::Key { wait_millis: 2_000 }));
        // That refused try counted: the lock is now 2 s from 500 ms.
        assert!(limiter.admit("room", Some(&1), 2_499).is_err());
        assert!(limiter.admit("room", Some(&1), 2_499 + 8_000).is_ok(), "the longest lock ends");
    }

    #[test]
    fn refused_tries_count_so_hammering_never_gets_a_try_checked() {
        let mut limiter = Rooms::new(small());
        let mut checked = 0;
        // One wrong try every 20 ms for ten simulated minutes.
        for step in 0..30_000u64 {
            if try_once(&mut limiter, 7, step * 20, false).is_ok() {
                checked += 1;
            }
        }
        assert_eq!(checked, 3, "the free tries and the one that locked the key");
    }

    #[test]
    fn one_hammering_key_never_closes_the_room_for_another_key() {
        let policy = GuessPolicy::join();
        let mut limiter = Rooms::new(policy);
        // The attacker at key 1 tries every 20 ms for a simulated day; a visitor (a new key
        // each time) brings the right code every 10 s and must always be checked.
        let mut visitors_refused = 0;
        let mut attacker_checked = 0;
        for step in 0..(24 * 60 * 60 * 50u64) {
            let now = step * 20;
            if try_once(&mut limiter, 1, now, false).is_ok() {
                attacker_checked += 1;
            }
            if step % 500 == 0 {
                let visitor = 1_000 + u32::try_from(step / 500).unwrap_or(0);
                if try_once(&mut limiter, visitor, now, true).is_err() {
                    visitors_refused += 1;
                }
            }
        }
        assert_eq!(visitors_refused, 0);
        assert_eq!(attacker_checked, policy.free_failures + 1);
    }

    #[test]
    fn a_patient_key_that_waits_out_every_lock_still_cannot_close_the_room() {
        let policy = GuessPolicy::join();
        let mut limiter = Rooms::new(policy);
        let mut now = 0;
        let mut checked = 0;
        while now < 24 * 60 * 60 * 1_000 {
            match try_once(&mut limiter, 1, now, false) {
                Ok(()) => checked += 1,
                Err(refused) => panic!("a patient key is refused at {now}: {refused:?}"),
            }
            now += policy.backoff(checked).max(1);
            assert!(limiter.admit("room", Some(&2), now).is_ok(), "another key is checked");
        }
        assert!(checked < 120, "{checked} tries a day");
    }

    #[test]
    fn many_keys_empty_the_room_budget_which_refills() {
        let mut limiter = Rooms::new(small());
        // Six keys, one wrong try each, at once: the burst.
        for key in 0..6 {
            assert!(try_once(&mut limiter, key, 0, false).is_ok(), "key {key}");
        }
        // The room now refuses every key, even a new one with the right secret, and that is
        // never checked: a refusal says nothing about the secret.
        assert_eq!(limiter.admit("room", Some(&99), 0), Err(Refused::Room { wait_millis: 10_000 }));
        assert!(limiter.admit("other room", Some(&98), 0).is_ok(), "other rooms are not affected");
        // One more wrong try per interval.
        assert!(try_once(&mut limiter, 50, 10_000, true).is_ok());
        assert!(try_once(&mut limiter, 51, 10_000, false).is_ok());
        assert!(limiter.admit("room", Some(&52), 10_001).is_err());
        // Quiet long enough, the whole burst is back.
        for key in 60..66 {
            assert!(try_once(&mut limiter, key, 100_000, false).is_ok(), "key {key}");
        }
    }

    #[test]
    fn a_right_secret_clears_the_key_not_the_room() {
        let mut limiter = Rooms::new(small());
        for _ in 0..3 {
            try_once(&mut limiter, 1, 0, false).unwrap();
        }
        for key in 2..5 {
            try_once(&mut limiter, key, 0, false).unwrap();
        }
        limiter.limiter.right(Some(&1));
        assert!(limiter.admit("room", Some(&1), 0).is_err(), "the room's budget stays spent");
        assert!(limiter.admit("other", Some(&1), 0).is_ok(), "the key starts over");
    }

    #[test]
    fn prune_forgets_quiet_keys() {
        let mut limiter = Rooms::new(small());
        for _ in 0..4 {
            let _ = try_once(&mut limiter, 1, 0, false);
        }
        limiter.limiter.prune(1_000_000);
        assert!(limiter.limiter.keys.is_empty());
    }
}
