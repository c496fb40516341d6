//! The broker watch a bind took for its wait, handed over to the channel's own watch.
//!
//! A bind follows the device (a counted [`crate::link::HomieLink::watch`]) while it waits for
//! the device to be online and pins its description; the channel then keeps following it
//! through its own watch, a runtime consumer that runs beside xAgent's data plane. Alone, that
//! consumer starts at once; on replicas it starts a moment later, once the lease keeper won its
//! lease. Were the bind's watch let go before, the link would unsubscribe in between and start
//! over (retained burst, quiet window), and calls sent right after `authenticated`, with the
//! Descriptor saying the Tools are available, would be refused `device_offline`. So the bind's
//! watch ends only when the device's consumer runs here: at once when it already does,
//! otherwise when it starts. It also ends when the channel's binding ends here, or after
//! [`HANDOVER_LIMIT`] (the data plane moved to another replica before the consumer started
//! here, so it never will).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// How long a bind's watch waits for its channel's watch at most. The consumer starts on the
/// data plane's holder within about a second, or once a killed holder's lease (5 s) ran out.
pub(crate) const HANDOVER_LIMIT: Duration = Duration::from_secs(30);

/// Which device watches run here and which binds' watches wait for them.
#[derive(Debug, Default)]
pub(crate) struct Handovers {
    /// Devices whose channel watch (the data-plane consumer) runs in this process.
    running: HashSet<String>,
    /// Per device, the tokens of the binds' watches still waiting for it.
    waiting: HashMap<String, Vec<u64>>,
    next: u64,
}

/// What to do with a bind's watch handed over.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HandedOver {
    /// The device's watch runs here: let the bind's go now.
    ReleaseNow,
    /// It waits under this token (give it up after [`HANDOVER_LIMIT`]).
    Waiting(u64),
}

impl Handovers {
    /// A bind's watch of `device` is no longer the bind's to keep.
    pub(crate) fn hand_over(&mut self, device: &str) -> HandedOver {
        if self.running.contains(device) {
            return HandedOver::ReleaseNow;
        }
        self.next += 1;
        self.waiting.entry(device.to_owned()).or_default().push(self.next);
        HandedOver::Waiting(self.next)
    }

    /// The device's watch started here; returns how many binds' watches it takes over (to let
    /// go).
    pub(crate) fn started(&mut self, device: &str) -> usize {
        self.running.insert(device.to_owned());
        self.waiting.remove(device).map_or(0, |tokens| tokens.len())
    }

    /// The device's watch stopped here.
    pub(crate) fn stopped(&mut self, device: &str) {
        self.running.remove(device);
    }

    /// The binding of `device` ended here: how many binds' watches still waited (to let go).
    pub(crate) fn unbound(&mut self, device: &str) -> usize {
        self.waiting.remove(device).map_or(0, |tokens| tokens.len())
    }

    /// The bind's watch under `token` waited too long: true when it still waited (let it go).
    pub(crate) fn give_up(&mut self, device: &str, token: u64) -> bool {
        let Some(tokens) = self.waiting.get_mut(device) else { return false };
        let before = tokens.len();
        tokens.retain(|t| *t != token);
        let gone = tokens.len() < before;
        if tokens.is_empty() {
            self.waiting.remove(device);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binds_watch_waits_for_the_channels_watch_and_ends_when_it_starts() {
        let mut h = Handovers::default();
        let HandedOver::Waiting(first) = h.hand_over("d1") else { panic!("nothing runs yet") };
        assert!(matches!(h.hand_over("d1"), HandedOver::Waiting(_)), "a bind again, before it");
        assert!(matches!(h.hand_over("d2"), HandedOver::Waiting(_)));
        assert_eq!(h.started("d1"), 2, "it takes over both of d1's, none of d2's");
        assert!(!h.give_up("d1", first), "taken over: nothing left to give up");
        assert_eq!(h.hand_over("d1"), HandedOver::ReleaseNow, "it runs: let the bind's go");
        h.stopped("d1");
        assert!(matches!(h.hand_over("d1"), HandedOver::Waiting(_)), "stopped: waits again");
        assert_eq!(h.unbound("d1"), 1, "the binding ended: the waiting one goes");
        assert_eq!(h.unbound("d1"), 0);
    }

    #[test]
    fn a_binds_watch_given_up_ends_alone() {
        let mut h = Handovers::default();
        let HandedOver::Waiting(first) = h.hand_over("d1") else { panic!("waits") };
        let HandedOver::Waiting(second) = h.hand_over("d1") else { panic!("waits") };
        assert!(h.give_up("d1", first));
        assert!(!h.give_up("d1", first), "given up once");
        assert_eq!(h.started("d1"), 1, "the other still waited");
        assert!(!h.give_up("d1", second));
    }
}
