//! [`Binding`]: what the runtime keeps about a signed-in channel. A plain value with no runtime
//! parts, so storage can persist it without knowing the author API.

use std::collections::BTreeMap;

use xagent_protocol_types::{DescriptorTarget, Secret};

/// What the runtime keeps about a signed-in channel: display-level target facts (they go into
/// the Descriptor) and private material (tokens, cursors) that never leaves the Connector.
/// Persisted by the storage, restored after a restart. `Debug` shows only the secret names.
#[derive(Clone, PartialEq)]
pub struct Binding {
    /// Display-level account facts for the Descriptor's `target` (redacted hints only).
    pub target: DescriptorTarget,
    secrets: BTreeMap<String, Secret>,
}

impl Binding {
    /// A binding with its Descriptor target and no private material.
    pub fn new(target: DescriptorTarget) -> Self {
        Self { target, secrets: BTreeMap::new() }
    }

    /// Adds a private value (a target token, a cursor): persisted, never shown.
    #[must_use]
    pub fn with_secret(mut self, name: impl Into<String>, value: Secret) -> Self {
        self.secrets.insert(name.into(), value);
        self
    }

    /// A private value by name.
    pub fn secret(&self, name: &str) -> Option<&Secret> {
        self.secrets.get(name)
    }

    /// All private values.
    pub fn secrets(&self) -> &BTreeMap<String, Secret> {
        &self.secrets
    }
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("target", &self.target)
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .finish()
    }
}
