//! Reference-counted shared target consumers (a `getUpdates` poller, a platform connection):
//! started by the first channel that needs one, stopped when the last channel releases it
//! (sign-out, unregister).

use std::collections::{HashMap, HashSet};

use xagent_protocol_types::ConnectorChannelId;

pub(crate) use crate::handle::StopFn;

struct Entry {
    channels: HashSet<ConnectorChannelId>,
    stop: StopFn,
}

/// The registry; lives inside the runtime state.
#[derive(Default)]
pub(crate) struct Consumers {
    entries: HashMap<String, Entry>,
}

impl Consumers {
    /// Adds `channel` as a user of `key` when the consumer runs; false when it does not (the
    /// caller starts it outside the lock and calls [`Consumers::insert`]).
    pub(crate) fn join(&mut self, key: &str, channel: &ConnectorChannelId) -> bool {
        match self.entries.get_mut(key) {
            Some(entry) => {
                entry.channels.insert(channel.clone());
                true
            }
            None => false,
        }
    }

    /// Records a consumer started for `channel`. When another start won the race meanwhile,
    /// `channel` joins that one and the surplus stop function is returned (to run it).
    pub(crate) fn insert(
        &mut self,
        key: &str,
        channel: &ConnectorChannelId,
        stop: StopFn,
    ) -> Option<StopFn> {
        if self.join(key, channel) {
            return Some(stop);
        }
        let channels = std::iter::once(channel.clone()).collect();
        self.entries.insert(key.to_owned(), Entry { channels, stop });
        None
    }

    /// Removes `channel` from `key`; returns the stop function when it was the last user (the
    /// caller runs it outside any lock).
    pub(crate) fn detach(&mut self, key: &str, channel: &ConnectorChannelId) -> Option<StopFn> {
        let entry = self.entries.get_mut(key)?;
        entry.channels.remove(channel);
        if entry.channels.is_empty() {
            return self.entries.remove(key).map(|entry| entry.stop);
        }
        None
    }

    /// Removes `channel` from every consumer; returns the stop functions of those it was the
    /// last user of.
    pub(crate) fn release_channel(&mut self, channel: &ConnectorChannelId) -> Vec<StopFn> {
        let keys: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, entry)| entry.channels.contains(channel))
            .map(|(key, _)| key.clone())
            .collect();
        keys.iter().filter_map(|key| self.detach(key, channel)).collect()
    }

    /// Number of users of `key` (0 when not running).
    pub(crate) fn users(&self, key: &str) -> usize {
        self.entries.get(key).map_or(0, |entry| entry.channels.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn shared_consumer_stops_with_its_last_channel() {
        let started = Arc::new(AtomicUsize::new(0));
        let stopped = Arc::new(AtomicUsize::new(0));
        let mut consumers = Consumers::default();
        let (a, b) = (ConnectorChannelId::new("a"), ConnectorChannelId::new("b"));
        for channel in [&a, &b] {
            if !consumers.join("poller", channel) {
                started.fetch_add(1, Ordering::SeqCst);
                let stopped = stopped.clone();
                let stop: StopFn = Box::new(move || {
                    stopped.fetch_add(1, Ordering::SeqCst);
                });
                assert!(consumers.insert("poller", channel, stop).is_none());
            }
        }
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert_eq!(consumers.users("poller"), 2);
        for stop in consumers.release_channel(&a) {
            stop();
        }
        assert_eq!(stopped.load(Ordering::SeqCst), 0);
        for stop in consumers.release_channel(&b) {
            stop();
        }
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
        assert_eq!(consumers.users("poller"), 0);
    }
}
