//! Reference-counted shared target consumers (a `getUpdates` poller, a platform connection):
//! started by the first channel that needs one, stopped when the last channel releases it
//! (sign-out, unregister).
//!
//! Replicated consumers (replicas on a shared database) are wanted on every replica but run
//! on one, under a lease of their own: the registry keeps how to start each again, and the
//! lease keeper starts it where the lease is won and stops it where the lease is lost.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use xagent_protocol_types::ConnectorChannelId;

pub(crate) use super::{StartFn, StopFn};

struct Entry {
    channels: HashSet<ConnectorChannelId>,
    stop: StopFn,
}

/// A replicated consumer: its users here, how to start it, and, while it runs here, the
/// fencing number of its lease and how to stop it.
struct Leased {
    channels: HashSet<ConnectorChannelId>,
    start: StartFn,
    running: Option<(u64, StopFn)>,
    /// Runs only on the replica holding xAgent's data plane (it serves the Tool calls that
    /// read what the consumer keeps).
    with_data_plane: bool,
}

/// A replicated consumer as the lease keeper sees it.
pub(crate) struct Wanted {
    pub(crate) key: String,
    /// The fencing number it runs with here, if it does.
    pub(crate) running: Option<u64>,
    /// Runs only beside the data plane.
    pub(crate) with_data_plane: bool,
}

/// The registry; lives inside the runtime state.
#[derive(Default)]
pub(crate) struct Consumers {
    entries: HashMap<String, Entry>,
    leased: HashMap<String, Leased>,
}

/// The lease of a replicated consumer `key`.
pub(crate) fn lease_name(key: &str) -> String {
    format!("consumer:{key}")
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

    /// Adds `channel` as a user of the replicated consumer `key`; true when nobody here
    /// wanted it before (the lease keeper should try for its lease now).
    pub(crate) fn want(
        &mut self,
        key: &str,
        channel: &ConnectorChannelId,
        start: StartFn,
        with_data_plane: bool,
    ) -> bool {
        match self.leased.get_mut(key) {
            Some(entry) => {
                entry.channels.insert(channel.clone());
                false
            }
            None => {
                let channels = std::iter::once(channel.clone()).collect();
                let entry = Leased { channels, start, running: None, with_data_plane };
                self.leased.insert(key.to_owned(), entry);
                true
            }
        }
    }

    /// The replicated consumers wanted here.
    pub(crate) fn wanted(&self) -> Vec<Wanted> {
        self.leased
            .iter()
            .map(|(key, e)| Wanted {
                key: key.clone(),
                running: e.running.as_ref().map(|r| r.0),
                with_data_plane: e.with_data_plane,
            })
            .collect()
    }

    /// How to start the replicated consumer `key`, when it is wanted and not running here.
    pub(crate) fn start_of(&self, key: &str) -> Option<StartFn> {
        self.leased.get(key).filter(|e| e.running.is_none()).map(|e| Arc::clone(&e.start))
    }

    /// Records that `key` runs here with `fence`; returns `stop` back when nobody wants it
    /// any more (or it runs already), to run it.
    pub(crate) fn started(&mut self, key: &str, fence: u64, stop: StopFn) -> Option<StopFn> {
        match self.leased.get_mut(key) {
            Some(entry) if entry.running.is_none() => {
                entry.running = Some((fence, stop));
                None
            }
            _ => Some(stop),
        }
    }

    /// The lease of `key` held with `fence` was lost: how to stop it, when it runs here so.
    pub(crate) fn lost(&mut self, key: &str, fence: u64) -> Option<StopFn> {
        let entry = self.leased.get_mut(key)?;
        if entry.running.as_ref().is_some_and(|(f, _)| *f == fence) {
            return entry.running.take().map(|(_, stop)| stop);
        }
        None
    }

    /// Removes `channel` from `key`; returns the stop function when it was the last user (the
    /// caller runs it outside any lock).
    pub(crate) fn detach(&mut self, key: &str, channel: &ConnectorChannelId) -> Option<StopFn> {
        if let Some(entry) = self.leased.get_mut(key) {
            entry.channels.remove(channel);
            if entry.channels.is_empty() {
                // Its lease runs out by itself once nobody renews it.
                return self.leased.remove(key).and_then(|e| e.running).map(|(_, stop)| stop);
            }
            return None;
        }
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
            .chain(
                self.leased
                    .iter()
                    .filter(|(_, entry)| entry.channels.contains(channel))
                    .map(|(key, _)| key.clone()),
            )
            .collect();
        keys.iter().filter_map(|key| self.detach(key, channel)).collect()
    }

    /// Number of users of `key` here (0 when not running, or not wanted when replicated).
    pub(crate) fn users(&self, key: &str) -> usize {
        match self.leased.get(key) {
            Some(entry) => entry.channels.len(),
            None => self.entries.get(key).map_or(0, |entry| entry.channels.len()),
        }
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
