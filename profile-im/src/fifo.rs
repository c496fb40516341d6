//! A map that keeps at most a given number of entries and forgets the oldest first: the
//! receiver's cache of recently completed ids and the delta assembler's tombstones.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// Entries in insertion order; a key is cloned once into the order queue (cheap for the
/// `Arc` and integer keys it is used with).
#[derive(Debug)]
pub(crate) struct FifoMap<K, V> {
    pub(crate) map: HashMap<K, V>,
    pub(crate) order: VecDeque<K>,
}

impl<K, V> Default for FifoMap<K, V> {
    fn default() -> Self {
        Self { map: HashMap::new(), order: VecDeque::new() }
    }
}

impl<K: Hash + Eq + Clone, V> FifoMap<K, V> {
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(key)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Sets the value of a known key in place (its age is kept), or adds a new entry and
    /// forgets the oldest beyond `capacity` (0 keeps nothing); returns how many were forgotten.
    pub(crate) fn insert(&mut self, key: K, value: V, capacity: usize) -> usize {
        if let Some(known) = self.map.get_mut(&key) {
            *known = value;
            return 0;
        }
        if capacity == 0 {
            return 0;
        }
        self.map.insert(key.clone(), value);
        self.order.push_back(key);
        let mut forgotten = 0;
        while self.map.len() > capacity {
            let Some(oldest) = self.order.pop_front() else { break };
            self.map.remove(&oldest);
            forgotten += 1;
        }
        forgotten
    }

    /// Keeps only the entries whose key passes `keep`.
    pub(crate) fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.map.retain(|key, _| keep(key));
        self.order.retain(|key| keep(key));
    }

    /// Gives the entries whose key `rename` maps a new key, in place: their age (position in
    /// the order) and value are kept. The new keys must not be in the map already.
    pub(crate) fn rekey(&mut self, rename: impl Fn(&K) -> Option<K>) {
        for key in self.order.iter_mut() {
            if let Some(new_key) = rename(key)
                && let Some(value) = self.map.remove(key)
            {
                self.map.insert(new_key.clone(), value);
                *key = new_key;
            }
        }
    }
}
