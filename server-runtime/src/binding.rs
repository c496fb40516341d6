//! [`Binding`]: what the runtime keeps about a signed-in channel. A plain value with no runtime
//! parts, so storage can persist it without knowing the author API.

use xagent_protocol_types::{DescriptorTarget, Secret, TargetType};

/// What the runtime keeps about a signed-in channel: display-level target facts (they go into
/// the Descriptor) and private material (tokens, cursors) that never leaves the Connector.
/// Persisted by the storage, restored after a restart. `Debug` shows only the secret names.
#[derive(Clone, PartialEq)]
pub struct Binding {
    /// Display-level account facts for the Descriptor's `target` (redacted hints only).
    pub target: DescriptorTarget,
    /// Sorted by name. A boxed slice, not a map: a signed-in channel usually holds one or two
    /// secrets, and a `BTreeMap` node would cost about half a kilobyte per channel.
    secrets: Box<[(String, Secret)]>,
    /// The target type of the flow the channel signed in with (`auth_flows[].target_type`),
    /// stamped by the runtime: the channel's `connection.target_type`.
    target_type: Option<TargetType>,
}

impl Binding {
    /// A binding with its Descriptor target and no private material.
    pub fn new(target: DescriptorTarget) -> Self {
        Self { target, secrets: Box::default(), target_type: None }
    }

    /// The binding with the target type of the flow it came from (the runtime sets it at
    /// sign-in; a [`crate::storage::Storage`] sets it when it restores a binding).
    #[must_use]
    pub fn with_target_type(mut self, target_type: TargetType) -> Self {
        self.target_type = Some(target_type);
        self
    }

    /// The target type of the flow the channel signed in with, when known: the channel's
    /// `connection.target_type`.
    pub fn target_type(&self) -> Option<&TargetType> {
        self.target_type.as_ref()
    }

    /// Adds a private value (a target token, a cursor): persisted, never shown.
    #[must_use]
    pub fn with_secret(mut self, name: impl Into<String>, value: Secret) -> Self {
        let name = name.into();
        let mut secrets = std::mem::take(&mut self.secrets).into_vec();
        match secrets.binary_search_by(|(n, _)| n.as_str().cmp(&name)) {
            Ok(at) => secrets[at].1 = value,
            Err(at) => secrets.insert(at, (name, value)),
        }
        self.secrets = secrets.into_boxed_slice();
        self
    }

    /// A private value by name.
    pub fn secret(&self, name: &str) -> Option<&Secret> {
        let at = self.secrets.binary_search_by(|(n, _)| n.as_str().cmp(name)).ok()?;
        Some(&self.secrets[at].1)
    }

    /// All private values.
    pub fn secrets(&self) -> impl Iterator<Item = (&str, &Secret)> {
        self.secrets.iter().map(|(name, value)| (name.as_str(), value))
    }
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("target", &self.target)
            .field("secrets", &self.secrets.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .field("target_type", &self.target_type)
            .finish()
    }
}
