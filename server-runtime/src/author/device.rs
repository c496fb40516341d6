//! The device target an author implements (Device Profile v1, `xagent.device.v1`): which
//! device a binding names, and whether that device answers. The rules themselves (Tool
//! categories and risk, per-channel serialisation, confirmations, result checks, Descriptor
//! corrections) live in `xagent-profile-device`; the runtime applies them around the author's
//! code.

use std::future::Future;

pub use xagent_profile_device::{DeviceConfig, HighRiskPolicy, RiskLevel, ToolCategory};

use super::context::{Binding, ChannelContext};

pub use crate::handle::DeviceStatus;

/// The device side of a Device Connector. Register it with
/// [`crate::ConnectorBuilder::device_target`] and declare device Tools with
/// [`crate::ConnectorBuilder::device_tool`].
///
/// The runtime projects a channel `connected` only after [`DeviceTarget::check`] answered
/// [`DeviceStatus::Online`]: a binding restored at startup is `degraded` with its Tools
/// unavailable until then. Later changes are reported with
/// [`crate::ConnectorHandle::device_status`]; the runtime corrects the Descriptor and every
/// device Tool's availability and pushes the Descriptor.
///
/// `S` is the Connector's state ([`crate::ConnectorBuilder::state`]; `()` without one): the
/// target reads it with [`ChannelContext::state`] in `check`.
pub trait DeviceTarget<S = ()>: Send + Sync + 'static {
    /// The Connector's own key of the device a binding names (a serial, a Homie device id),
    /// used to keep a device bound to one channel at a time. Never shown to xAgent.
    fn device_key(&self, binding: &Binding) -> Option<String>;

    /// Checks that the bound device answers; called for every binding restored at startup.
    fn check(&self, ctx: ChannelContext<S>) -> impl Future<Output = DeviceStatus> + Send;
}
