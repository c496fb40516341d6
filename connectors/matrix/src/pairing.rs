//! One-time pairing codes that bind a Matrix room to a channel (sans-I/O, time passed in).
//!
//! `auth.start` of `matrix_room` issues a code for its auth session; a member of a room the bot
//! joined posts it there, and the room is bound to that session's channel. A code:
//! - is 8 characters from an alphabet without look-alikes (about 40 bits), shown as
//!   `ABCD-EFGH`; case, spaces and dashes do not matter when it is posted;
//! - expires after [`CODE_TTL_MS`] and works once;
//! - is kept only as a SHA-256 digest, compared in constant time.
//!
//! Guessing is limited: a message in an unbound room that has the shape of a code but matches
//! none counts as a failure for that room and for its sender; after [`MAX_FAILURES`] within
//! [`FAILURE_WINDOW_MS`] the room (or sender) is ignored until the window passed, and after
//! [`MAX_GLOBAL_FAILURES`] failures from anywhere within the window every redemption waits.

use std::collections::{BTreeMap, VecDeque};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// How long a code stays valid: 10 minutes.
pub const CODE_TTL_MS: u64 = 10 * 60 * 1000;
/// Wrong codes tolerated per room and per sender within the window.
pub const MAX_FAILURES: u32 = 5;
/// Wrong codes tolerated from all rooms together within the window.
pub const MAX_GLOBAL_FAILURES: usize = 50;
/// The window failures are counted in: 15 minutes.
pub const FAILURE_WINDOW_MS: u64 = 15 * 60 * 1000;
/// Codes open at once (one per pending sign-in; older ones are dropped first).
pub const MAX_OPEN_CODES: usize = 1_000;
/// Rooms and senders whose failures are remembered at once.
const MAX_TRACKED: usize = 10_000;

/// The code alphabet: no 0/O, 1/I/L.
const ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";
/// Characters in a code.
pub const CODE_CHARS: usize = 8;

/// A code issued for one auth session.
#[derive(Clone, Debug)]
struct Open<S> {
    digest: [u8; 32],
    expires_at: u64,
    session: S,
}

/// What a posted text did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Redeem<S> {
    /// Not shaped like a code: an ordinary message (not counted).
    NotACode,
    /// A valid code: bind the room to this session's channel.
    Bound(S),
    /// Shaped like a code but wrong or expired (counted).
    Wrong,
    /// Too many wrong codes lately; ignored.
    Locked,
}

#[derive(Clone, Copy, Debug, Default)]
struct Failures {
    count: u32,
    since: u64,
}

/// The open codes and the failure counts.
#[derive(Debug)]
pub struct Pairing<S> {
    open: VecDeque<Open<S>>,
    failures: BTreeMap<String, Failures>,
    global: VecDeque<u64>,
}

impl<S: Clone + PartialEq> Default for Pairing<S> {
    fn default() -> Self {
        Self::new()
    }
}

fn digest(code: &str) -> [u8; 32] {
    Sha256::digest(code.as_bytes()).into()
}

/// The canonical form of a posted text when it has the shape of a code.
pub fn normalize(text: &str) -> Option<String> {
    let text = text.trim();
    if text.len() > 32 {
        return None;
    }
    let code: String =
        text.chars().filter(|c| !matches!(c, '-' | ' ')).map(|c| c.to_ascii_uppercase()).collect();
    (code.len() == CODE_CHARS && code.bytes().all(|b| ALPHABET.contains(&b))).then_some(code)
}

/// `ABCDEFGH` as shown: `ABCD-EFGH`.
pub fn display(code: &str) -> String {
    let (a, b) = code.split_at(code.len().min(4));
    format!("{a}-{b}")
}

impl<S: Clone + PartialEq> Pairing<S> {
    /// No codes.
    pub fn new() -> Self {
        Self { open: VecDeque::new(), failures: BTreeMap::new(), global: VecDeque::new() }
    }

    /// Issues a code for `session` (replacing one it had) and returns it as shown.
    pub fn issue(&mut self, session: S, now: u64) -> (String, u64) {
        self.open.retain(|o| o.session != session && o.expires_at > now);
        while self.open.len() >= MAX_OPEN_CODES {
            self.open.pop_front();
        }
        let code: String = (0..CODE_CHARS)
            .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
            .collect();
        let expires_at = now + CODE_TTL_MS;
        self.open.push_back(Open { digest: digest(&code), expires_at, session });
        (display(&code), expires_at)
    }

    /// Forgets `session`'s code.
    pub fn cancel(&mut self, session: &S) {
        self.open.retain(|o| &o.session != session);
    }

    /// Whether `session` still has a code that has not expired.
    pub fn is_open(&self, session: &S, now: u64) -> bool {
        self.open.iter().any(|o| &o.session == session && o.expires_at > now)
    }

    /// `text` was posted by `sender` in the unbound `room` at `now`.
    pub fn redeem(&mut self, room: &str, sender: &str, text: &str, now: u64) -> Redeem<S> {
        let Some(code) = normalize(text) else { return Redeem::NotACode };
        self.global.retain(|at| now.saturating_sub(*at) < FAILURE_WINDOW_MS);
        let (room_key, sender_key) = (format!("room {room}"), format!("user {sender}"));
        if self.global.len() >= MAX_GLOBAL_FAILURES
            || self.locked(&room_key, now)
            || self.locked(&sender_key, now)
        {
            return Redeem::Locked;
        }
        let posted = digest(&code);
        let found = self
            .open
            .iter()
            .position(|o| o.expires_at > now && bool::from(o.digest.ct_eq(&posted)));
        match found.and_then(|at| self.open.remove(at)) {
            Some(open) => Redeem::Bound(open.session),
            None => {
                self.fail(room_key, now);
                self.fail(sender_key, now);
                self.global.push_back(now);
                Redeem::Wrong
            }
        }
    }

    fn locked(&self, key: &str, now: u64) -> bool {
        self.failures.get(key).is_some_and(|f| {
            now.saturating_sub(f.since) < FAILURE_WINDOW_MS && f.count >= MAX_FAILURES
        })
    }

    fn fail(&mut self, key: String, now: u64) {
        if self.failures.len() >= MAX_TRACKED {
            self.failures.retain(|_, f| now.saturating_sub(f.since) < FAILURE_WINDOW_MS);
        }
        let entry = self.failures.entry(key).or_default();
        if now.saturating_sub(entry.since) >= FAILURE_WINDOW_MS {
            *entry = Failures { count: 0, since: now };
        }
        entry.count += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(shown: &str) -> String {
        shown.replace('-', "")
    }

    #[test]
    fn a_code_binds_once_whatever_its_case_and_dashes() {
        let mut p = Pairing::new();
        let (code, expires) = p.issue("s1", 0);
        assert_eq!(expires, CODE_TTL_MS);
        assert_eq!(
            p.redeem("!r", "@a", &format!("  {}  ", code.to_lowercase()), 1),
            Redeem::Bound("s1")
        );
        assert_eq!(p.redeem("!r", "@a", &code, 2), Redeem::Wrong, "single use");
        assert_eq!(p.redeem("!r", "@a", "hello there", 3), Redeem::NotACode);
        assert!(normalize(&raw(&code)).is_some());
    }

    #[test]
    fn an_expired_code_is_wrong() {
        let mut p = Pairing::new();
        let (code, _) = p.issue("s1", 0);
        assert!(p.is_open(&"s1", CODE_TTL_MS - 1));
        assert_eq!(p.redeem("!r", "@a", &code, CODE_TTL_MS), Redeem::Wrong);
    }

    #[test]
    fn wrong_codes_lock_the_room_and_the_sender_then_the_window_reopens() {
        let mut p = Pairing::new();
        let (code, _) = p.issue("s1", 0);
        for n in 0..MAX_FAILURES {
            assert_eq!(p.redeem("!r", "@a", "AAAA-AAAA", u64::from(n)), Redeem::Wrong);
        }
        // Even the right code is refused while the room is locked...
        assert_eq!(p.redeem("!r", "@b", &code, 10), Redeem::Locked);
        // ...and so is the sender, in another room.
        assert_eq!(p.redeem("!other", "@a", &code, 10), Redeem::Locked);
        // Another member in another room may still bind.
        assert_eq!(p.redeem("!other", "@b", &code, 11), Redeem::Bound("s1"));
        let (code, _) = p.issue("s2", FAILURE_WINDOW_MS);
        assert_eq!(p.redeem("!r", "@a", &code, FAILURE_WINDOW_MS + 5), Redeem::Bound("s2"));
    }

    #[test]
    fn many_rooms_guessing_together_pause_every_redemption() {
        let mut p = Pairing::new();
        let (code, _) = p.issue("s1", 0);
        for n in 0..MAX_GLOBAL_FAILURES {
            let room = format!("!r{n}");
            assert_eq!(p.redeem(&room, &format!("@u{n}"), "AAAA-AAAA", 1), Redeem::Wrong);
        }
        assert_eq!(p.redeem("!fresh", "@fresh", &code, 2), Redeem::Locked);
    }

    #[test]
    fn a_new_code_replaces_the_sessions_old_one() {
        let mut p = Pairing::new();
        let (old, _) = p.issue("s1", 0);
        let (new, _) = p.issue("s1", 1);
        assert_eq!(
            p.redeem("!r", "@a", &old, 2),
            if old == new { Redeem::Bound("s1") } else { Redeem::Wrong }
        );
        p.cancel(&"s1");
        assert!(!p.is_open(&"s1", 3));
    }
}
