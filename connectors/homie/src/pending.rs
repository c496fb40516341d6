//! Sets waiting for the device to confirm (sans-I/O).
//!
//! A `/set` is confirmed when the device publishes the property's value and that value is the
//! one asked for (compared as a value of the property's datatype, so `21.50` confirms `21.5`).
//! A different value does not confirm it; it is remembered so a timeout can say what the device
//! reported instead. The caller owns the clock: it waits as long as it chooses and then takes
//! the entry back with [`PendingSets::take`].

use crate::model::PropertySpec;

/// Identifies one waiting set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetId(pub u64);

/// A set waiting for confirmation.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingSet {
    /// Device id.
    pub device: String,
    /// Node id.
    pub node: String,
    /// Property id.
    pub property: String,
    /// The property as described when the set was sent.
    pub spec: PropertySpec,
    /// The payload published on `/set`.
    pub payload: String,
    /// The last other value the device published meanwhile, if any.
    pub last_seen: Option<String>,
}

/// All sets waiting for confirmation on one broker link.
#[derive(Debug, Default)]
pub struct PendingSets {
    next: u64,
    items: Vec<(SetId, PendingSet)>,
}

impl PendingSets {
    /// Nothing waiting.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a set before it is published (so a fast answer is not missed).
    pub fn add(&mut self, set: PendingSet) -> SetId {
        self.next += 1;
        let id = SetId(self.next);
        self.items.push((id, set));
        id
    }

    /// A value was published: returns the sets it confirms (removed) and remembers it for the
    /// others on that property.
    pub fn on_value(
        &mut self,
        device: &str,
        node: &str,
        property: &str,
        payload: &str,
    ) -> Vec<SetId> {
        let mut confirmed = Vec::new();
        self.items.retain_mut(|(id, p)| {
            if p.device != device || p.node != node || p.property != property {
                return true;
            }
            if p.spec.same_value(payload, &p.payload) {
                confirmed.push(*id);
                false
            } else {
                p.last_seen = Some(payload.chars().take(128).collect());
                true
            }
        });
        confirmed
    }

    /// Removes a set (confirmed elsewhere, timed out or abandoned) and returns it.
    pub fn take(&mut self, id: SetId) -> Option<PendingSet> {
        let at = self.items.iter().position(|(i, _)| *i == id)?;
        Some(self.items.remove(at).1)
    }

    /// The sets waiting on a device (e.g. it went offline).
    pub fn of_device(&self, device: &str) -> Vec<SetId> {
        self.items.iter().filter(|(_, p)| p.device == device).map(|(id, _)| *id).collect()
    }

    /// How many sets wait.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Datatype, Format};

    fn set(node: &str, payload: &str) -> PendingSet {
        PendingSet {
            device: "d".into(),
            node: node.into(),
            property: "target".into(),
            spec: PropertySpec {
                name: "Target".into(),
                datatype: Datatype::Float,
                format: Format::None,
                format_text: None,
                settable: true,
                retained: true,
                unit: None,
            },
            payload: payload.into(),
            last_seen: None,
        }
    }

    #[test]
    fn rule_set_is_confirmed_only_by_the_requested_value() {
        let mut p = PendingSets::new();
        let a = p.add(set("t", "22.0"));
        let b = p.add(set("other", "22.0"));
        assert!(p.on_value("d", "t", "target", "21.0").is_empty());
        assert_eq!(p.on_value("d", "t", "target", "22"), vec![a]);
        assert_eq!(p.len(), 1);
        assert_eq!(p.of_device("d"), vec![b]);
        assert!(p.on_value("x", "other", "target", "22.0").is_empty(), "other device");
        let left = p.take(b).unwrap();
        assert_eq!(left.last_seen, None);
        assert!(p.is_empty());
    }

    #[test]
    fn a_timed_out_set_reports_what_the_device_said_instead() {
        let mut p = PendingSets::new();
        let a = p.add(set("t", "22.0"));
        p.on_value("d", "t", "target", "19.5");
        assert_eq!(p.take(a).unwrap().last_seen.as_deref(), Some("19.5"));
        assert!(p.take(a).is_none());
    }
}
