//! Errors of the Homie Connector, each with its stable wire code (through the Device Profile's
//! [`DeviceError`], the one map from device failures to codes).

use xagent_profile_device::DeviceError;
use xagent_protocol_types::{ErrorCode, WireError};

/// What went wrong talking to a Homie device.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HomieError {
    /// The device is not online (lost, disconnected, sleeping, not described yet, or the broker
    /// is unreachable).
    #[error("the device is offline ({0}); retry when it is back")]
    Offline(String),
    /// The device does not describe this node.
    #[error("the device has no node {0:?}; call the describe tool to see its nodes")]
    NoSuchNode(String),
    /// The node does not describe this property.
    #[error("node {node:?} has no property {property:?}; call the describe tool to see them")]
    NoSuchProperty {
        /// Node id.
        node: String,
        /// Property id.
        property: String,
    },
    /// The value does not fit the property (datatype, range, enum, read-only).
    #[error("{node}/{property}: {problem}")]
    BadValue {
        /// Node id.
        node: String,
        /// Property id.
        property: String,
        /// What is wrong and what is allowed.
        problem: String,
    },
    /// The property cannot be used (the device described it with an unknown datatype or a bad
    /// format).
    #[error("{node}/{property} cannot be used: {problem}")]
    Unusable {
        /// Node id.
        node: String,
        /// Property id.
        property: String,
        /// What the device described wrongly.
        problem: String,
    },
    /// The device did not confirm (or answer) in time.
    #[error("the device did not answer within {after_ms} ms{detail}")]
    Timeout {
        /// How long the Connector waited.
        after_ms: u64,
        /// More about what was seen meanwhile (starts with "; " when not empty).
        detail: String,
    },
    /// The node does not implement the snapshot extension.
    #[error(
        "node {0:?} does not take snapshots; pick a node whose description says snapshot: true"
    )]
    NoSnapshot(String),
    /// A snapshot larger than the limit.
    #[error("the snapshot is larger than {0} bytes and was refused")]
    SnapshotTooLarge(usize),
    /// The channel has no usable pinned description of its device (bound by an older version,
    /// or the description could not be kept): bind the device again.
    #[error(
        "this channel has no pinned description of its device ({0}); bind the device again with homie_bind"
    )]
    NotPinned(String),
    /// A snapshot's declared type is not an allowed image type, or its bytes are not that type.
    #[error("snapshot refused: {0}")]
    BadSnapshot(String),
    /// Too many requests waiting on the broker link.
    #[error("too many device requests are waiting ({0}); retry shortly")]
    Busy(usize),
}

impl HomieError {
    /// The Device Profile error this maps to (which carries the stable code).
    pub fn to_device_error(&self) -> DeviceError {
        match self {
            Self::Offline(_) => DeviceError::DeviceOffline,
            Self::NoSuchNode(_)
            | Self::NoSuchProperty { .. }
            | Self::BadValue { .. }
            | Self::NoSnapshot(_) => DeviceError::InvalidArguments {
                name: self.argument().into(),
                problem: self.to_string(),
            },
            Self::Timeout { after_ms, .. } => DeviceError::CommandTimeout(*after_ms),
            Self::Unusable { .. }
            | Self::SnapshotTooLarge(_)
            | Self::NotPinned(_)
            | Self::BadSnapshot(_) => DeviceError::Failed(self.to_string()),
            Self::Busy(n) => DeviceError::QueueFull(*n),
        }
    }

    /// The stable wire code.
    pub fn code(&self) -> ErrorCode {
        self.to_device_error().code()
    }

    /// The wire error: the stable code with this error's own explanation.
    pub fn to_wire(&self) -> WireError {
        WireError::new(self.code(), self.to_string())
    }

    fn argument(&self) -> &'static str {
        match self {
            Self::NoSuchNode(_) | Self::NoSnapshot(_) => "node",
            Self::NoSuchProperty { .. } => "property",
            _ => "value",
        }
    }
}

/// Why an MQTT URL was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}; expected mqtt://HOST:PORT (plain TCP, port 1883 when omitted)")]
pub struct BadMqttUrl(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_offline_timeout_and_bad_values_have_distinct_stable_codes() {
        assert_eq!(HomieError::Offline("lost".into()).code(), ErrorCode::DeviceOffline);
        let t = HomieError::Timeout { after_ms: 5_000, detail: "; it reported 19.5".into() };
        assert_eq!(t.code(), ErrorCode::CommandTimeout);
        assert!(t.to_wire().message.unwrap_or_default().contains("19.5"));
        let bad = HomieError::BadValue {
            node: "t".into(),
            property: "p".into(),
            problem: "read-only".into(),
        };
        assert_eq!(bad.code(), ErrorCode::InvalidArguments);
        assert_eq!(HomieError::NoSnapshot("t".into()).code(), ErrorCode::InvalidArguments);
        assert_eq!(HomieError::SnapshotTooLarge(1).code(), ErrorCode::ToolInvokeFailed);
        assert_eq!(HomieError::Busy(16).code(), ErrorCode::CapacityExceeded);
    }
}
