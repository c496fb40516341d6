//! [`EditThrottle`]: how often a streamed message may be edited in place on a target that
//! limits its request rate (sans-I/O, time passed in). The first version goes out at once;
//! after that at most one edit per interval, and only the newest text: versions offered in
//! between replace each other, and the last one goes out when the interval has passed (or is
//! taken by the final message, which always wins).
//!
//! ```
//! use std::time::Duration;
//! use xagent_server_runtime::{EditThrottle, Offer};
//!
//! let mut t = EditThrottle::new(Duration::from_millis(1_000));
//! assert_eq!(t.offer(0, "He".into()), Offer::SendNow("He".into()));
//! assert_eq!(t.offer(200, "Hello".into()), Offer::Later { at_ms: 1_000 });
//! assert_eq!(t.offer(400, "Hello, wo".into()), Offer::Queued);
//! assert_eq!(t.due(999), None);
//! assert_eq!(t.due(1_000), Some("Hello, wo".into()));
//! ```

use std::time::Duration;

/// What to do with an offered version of a streamed text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Offer {
    /// Send this text now (and report it with [`EditThrottle::sent`] if it was sent later).
    SendNow(String),
    /// Too soon: the text is kept; arrange to call [`EditThrottle::due`] at `at_ms`.
    Later {
        /// When the kept text may go.
        at_ms: u64,
    },
    /// Too soon, and a call to [`EditThrottle::due`] is already arranged: the newer text
    /// replaced the kept one.
    Queued,
}

/// One streamed message's edit pacing; see the module docs.
#[derive(Clone, Debug)]
pub struct EditThrottle {
    interval_ms: u64,
    last_sent_ms: Option<u64>,
    kept: Option<String>,
    wake_at: Option<u64>,
}

impl EditThrottle {
    /// At most one edit per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            last_sent_ms: None,
            kept: None,
            wake_at: None,
        }
    }

    /// A newer text at `now_ms`.
    pub fn offer(&mut self, now_ms: u64, text: String) -> Offer {
        let next = self.last_sent_ms.map(|last| last.saturating_add(self.interval_ms));
        match next {
            Some(at_ms) if now_ms < at_ms => {
                self.kept = Some(text);
                if self.wake_at.is_some() {
                    Offer::Queued
                } else {
                    self.wake_at = Some(at_ms);
                    Offer::Later { at_ms }
                }
            }
            _ => {
                self.kept = None;
                self.last_sent_ms = Some(now_ms);
                Offer::SendNow(text)
            }
        }
    }

    /// The kept text, when its time came at `now_ms` (the caller sends it).
    pub fn due(&mut self, now_ms: u64) -> Option<String> {
        let at = self.wake_at?;
        if now_ms < at {
            return None;
        }
        self.wake_at = None;
        let text = self.kept.take()?;
        self.last_sent_ms = Some(now_ms);
        Some(text)
    }

    /// Moves the last edit's time to `now_ms` (when sending it took a while).
    pub fn sent(&mut self, now_ms: u64) {
        self.last_sent_ms = Some(now_ms);
    }

    /// The final message takes over: nothing kept is sent any more.
    pub fn finish(&mut self) {
        self.kept = None;
        self.wake_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_newest_text_goes_out_once_per_interval() {
        let mut t = EditThrottle::new(Duration::from_millis(500));
        assert_eq!(t.offer(0, "a".into()), Offer::SendNow("a".into()));
        assert_eq!(t.offer(100, "ab".into()), Offer::Later { at_ms: 500 });
        assert_eq!(t.offer(200, "abc".into()), Offer::Queued);
        assert_eq!(t.due(500), Some("abc".into()));
        assert_eq!(t.due(600), None, "nothing kept, nothing due");
        assert_eq!(t.offer(1_200, "abcd".into()), Offer::SendNow("abcd".into()));
    }

    #[test]
    fn the_final_message_drops_what_was_kept() {
        let mut t = EditThrottle::new(Duration::from_millis(500));
        let _ = t.offer(0, "a".into());
        let _ = t.offer(10, "ab".into());
        t.finish();
        assert_eq!(t.due(10_000), None);
    }
}
