//! The binding between a channel and a device, and the Descriptor corrections each state
//! implies. The Connector owns the device facts (serial, address, account): it finds the
//! device through the channel, never through an argument.

use std::collections::BTreeMap;

use xagent_protocol_types::{
    ConnectionDescriptor, ConnectionStatus, ConnectorChannelId, PermissionState, ToolStatus,
};

use crate::DeviceError;

/// Where a channel's device binding stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindingState {
    /// No device bound.
    Unbound,
    /// Bound (restored after a restart) but not yet checked to be reachable.
    Verifying,
    /// Bound, reachable, permitted.
    Online,
    /// Bound but unreachable.
    Offline,
    /// Bound but the device or target revoked permission.
    PermissionLost,
}

/// Something that happened to the binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindingEvent {
    /// A device was bound and checked reachable.
    Bound,
    /// A binding was loaded after a restart; reachability unknown.
    Restored,
    /// A reachability check succeeded.
    Verified,
    /// The device stopped answering.
    WentOffline,
    /// The device answers again.
    CameOnline,
    /// Permission was revoked.
    PermissionLost,
    /// Permission was granted again.
    PermissionRestored,
    /// The device was unbound.
    Unbound,
}

impl BindingState {
    /// The state after an event. Events that do not apply leave the state unchanged (an
    /// offline report for an unbound channel, a reachability check while permission is lost).
    pub fn next(self, event: BindingEvent) -> Self {
        use BindingEvent as E;
        use BindingState as S;
        match (self, event) {
            (_, E::Bound) => S::Online,
            (_, E::Restored) => S::Verifying,
            (_, E::Unbound) => S::Unbound,
            (S::Unbound, _) => S::Unbound,
            (S::PermissionLost, E::PermissionRestored) => S::Verifying,
            (S::PermissionLost, _) => S::PermissionLost,
            (_, E::PermissionLost) => S::PermissionLost,
            (S::Verifying | S::Offline | S::Online, E::Verified | E::CameOnline) => S::Online,
            (S::Verifying | S::Online | S::Offline, E::WentOffline) => S::Offline,
            (state, E::PermissionRestored) => state,
        }
    }

    /// The Descriptor projection of this state.
    pub fn correction(self) -> Correction {
        use BindingState as S;
        let (connection_status, tool_status, permission, reason) = match self {
            S::Online => {
                (ConnectionStatus::Connected, ToolStatus::Available, PermissionState::Granted, None)
            }
            S::Verifying => (
                ConnectionStatus::Degraded,
                ToolStatus::Unavailable,
                PermissionState::Unknown,
                Some("checking that the device is still reachable"),
            ),
            S::Offline => (
                ConnectionStatus::Offline,
                ToolStatus::Unavailable,
                PermissionState::Granted,
                Some("the device is offline"),
            ),
            S::PermissionLost => (
                ConnectionStatus::Revoked,
                ToolStatus::DeniedByTarget,
                PermissionState::Denied,
                Some("the device revoked permission"),
            ),
            S::Unbound => (
                ConnectionStatus::Created,
                ToolStatus::RequiresReauth,
                PermissionState::RequiresReauth,
                Some("no device is bound; bind one again"),
            ),
        };
        Correction { connection_status, tool_status, permission, reason }
    }

    /// Whether a Tool may run now: `Online` only; otherwise the stable error to answer with.
    pub fn admit(self) -> Result<(), DeviceError> {
        match self {
            Self::Online => Ok(()),
            Self::Verifying | Self::Offline => Err(DeviceError::DeviceOffline),
            Self::PermissionLost => {
                Err(DeviceError::PermissionDenied("the device revoked permission".into()))
            }
            Self::Unbound => Err(DeviceError::NotBound),
        }
    }
}

/// What the Descriptor must say for a binding state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Correction {
    /// `connection.status`.
    pub connection_status: ConnectionStatus,
    /// `tools[].status` for every device Tool.
    pub tool_status: ToolStatus,
    /// `tools[].target_permission_state`.
    pub permission: PermissionState,
    /// `tools[].reason` (None when available).
    pub reason: Option<&'static str>,
}

impl Correction {
    /// Writes the correction into a Descriptor. Tools marked `not_supported` keep that status:
    /// a binding change does not make an unsupported Tool callable.
    pub fn apply_to(&self, descriptor: &mut ConnectionDescriptor) {
        descriptor.connection.status = self.connection_status.clone();
        for tool in &mut descriptor.tools {
            if tool.status == ToolStatus::NotSupported {
                continue;
            }
            tool.status = self.tool_status.clone();
            tool.target_permission_state = Some(self.permission.clone());
            tool.reason = self.reason.map(str::to_owned);
        }
    }
}

/// The bindings of all channels of one Connector: which device (an opaque, Connector-owned
/// key) each channel is bound to and in which state.
#[derive(Debug, Default)]
pub struct DeviceBindings {
    channels: BTreeMap<ConnectorChannelId, (String, BindingState)>,
    shared: bool,
}

impl DeviceBindings {
    /// Bindings where a device belongs to at most one channel (the default; side effects of
    /// two channels on one device would otherwise interleave).
    pub fn exclusive() -> Self {
        Self::default()
    }

    /// Bindings where several channels may share a device. The executor still serialises
    /// side effects per channel only, so a Connector choosing this should key its
    /// [`crate::Scheduler`] by device instead.
    pub fn shared() -> Self {
        Self { channels: BTreeMap::new(), shared: true }
    }

    /// Binds `device` to `channel` (checked reachable by the caller).
    pub fn bind(
        &mut self,
        channel: &ConnectorChannelId,
        device: impl Into<String>,
    ) -> Result<Correction, DeviceError> {
        let device = device.into();
        if !self.shared
            && self
                .channels
                .iter()
                .any(|(c, (d, s))| c != channel && *d == device && *s != BindingState::Unbound)
        {
            return Err(DeviceError::PermissionDenied(
                "the device is already bound to another channel".into(),
            ));
        }
        self.channels.insert(channel.clone(), (device, BindingState::Online));
        Ok(BindingState::Online.correction())
    }

    /// Loads a binding after a restart: projected as `degraded` with every Tool unavailable
    /// until [`BindingEvent::Verified`] (the device answered).
    pub fn restore(
        &mut self,
        channel: &ConnectorChannelId,
        device: impl Into<String>,
    ) -> Correction {
        self.channels.insert(channel.clone(), (device.into(), BindingState::Verifying));
        BindingState::Verifying.correction()
    }

    /// Applies an event to a channel's binding and returns the new projection.
    pub fn on_event(&mut self, channel: &ConnectorChannelId, event: BindingEvent) -> Correction {
        let state = match self.channels.get_mut(channel) {
            Some((_, state)) => {
                *state = state.next(event);
                *state
            }
            None => BindingState::Unbound,
        };
        state.correction()
    }

    /// The state of a channel's binding.
    pub fn state(&self, channel: &ConnectorChannelId) -> BindingState {
        self.channels.get(channel).map_or(BindingState::Unbound, |(_, s)| *s)
    }

    /// The device to operate on for a call on `channel`: only the channel's own, online device.
    pub fn device_for(&self, channel: &ConnectorChannelId) -> Result<&str, DeviceError> {
        let (device, state) = self.channels.get(channel).ok_or(DeviceError::NotBound)?;
        state.admit()?;
        Ok(device)
    }

    /// Forgets a channel (deleted).
    pub fn remove(&mut self, channel: &ConnectorChannelId) {
        self.channels.remove(channel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::{
        Connection, DescriptorTarget, DescriptorTool, ErrorCode, ProfileId, TargetType,
    };

    fn descriptor() -> ConnectionDescriptor {
        let connection = Connection::new(
            "device.adb",
            "conn_1",
            "cch_1",
            TargetType::Device,
            vec![ProfileId::new("xagent.device.v1")],
            ConnectionStatus::Connected,
        );
        ConnectionDescriptor::new(connection, DescriptorTarget::new("adb", "Pixel"))
            .with_tool(DescriptorTool::available("device_tap"))
            .with_tool(DescriptorTool::new("device_record", ToolStatus::NotSupported))
    }

    #[test]
    fn every_state_has_a_descriptor_projection() {
        let cases = [
            (BindingState::Online, ConnectionStatus::Connected, ToolStatus::Available),
            (BindingState::Verifying, ConnectionStatus::Degraded, ToolStatus::Unavailable),
            (BindingState::Offline, ConnectionStatus::Offline, ToolStatus::Unavailable),
            (BindingState::PermissionLost, ConnectionStatus::Revoked, ToolStatus::DeniedByTarget),
            (BindingState::Unbound, ConnectionStatus::Created, ToolStatus::RequiresReauth),
        ];
        for (state, status, tool) in cases {
            let mut d = descriptor();
            state.correction().apply_to(&mut d);
            assert_eq!(d.connection.status, status, "{state:?}");
            assert_eq!(d.tools[0].status, tool, "{state:?}");
            assert_eq!(d.tools[1].status, ToolStatus::NotSupported, "unsupported stays");
        }
    }

    #[test]
    fn rule_offline_and_permission_loss_correct_the_descriptor() {
        let mut b = DeviceBindings::exclusive();
        let c = ConnectorChannelId::new("cch_1");
        let mut d = descriptor();
        b.bind(&c, "serial-123").unwrap().apply_to(&mut d);
        assert!(d.is_tool_available("device_tap"));
        b.on_event(&c, BindingEvent::WentOffline).apply_to(&mut d);
        assert_eq!(d.connection.status, ConnectionStatus::Offline);
        assert!(!d.is_tool_available("device_tap"));
        assert_eq!(b.device_for(&c).unwrap_err().code(), ErrorCode::DeviceOffline);
        b.on_event(&c, BindingEvent::CameOnline).apply_to(&mut d);
        assert_eq!(b.device_for(&c).unwrap(), "serial-123");
        b.on_event(&c, BindingEvent::PermissionLost).apply_to(&mut d);
        assert_eq!(d.tools[0].target_permission_state, Some(PermissionState::Denied));
        assert_eq!(b.device_for(&c).unwrap_err().code(), ErrorCode::PermissionDenied);
        // A reachability report does not hide a permission loss.
        assert_eq!(
            b.on_event(&c, BindingEvent::CameOnline).connection_status,
            ConnectionStatus::Revoked
        );
        b.on_event(&c, BindingEvent::PermissionRestored);
        assert_eq!(b.state(&c), BindingState::Verifying);
        b.on_event(&c, BindingEvent::Verified);
        assert_eq!(b.state(&c), BindingState::Online);
        b.on_event(&c, BindingEvent::Unbound).apply_to(&mut d);
        assert_eq!(d.connection.status, ConnectionStatus::Created);
        assert_eq!(b.device_for(&c).unwrap_err().code(), ErrorCode::ConnectionNotFound);
    }

    #[test]
    fn rule_restored_binding_is_not_connected_until_verified() {
        let mut b = DeviceBindings::exclusive();
        let c = ConnectorChannelId::new("cch_1");
        let corr = b.restore(&c, "serial-1");
        assert_eq!(corr.connection_status, ConnectionStatus::Degraded);
        assert_eq!(corr.tool_status, ToolStatus::Unavailable);
        assert!(b.device_for(&c).is_err());
        assert_eq!(
            b.on_event(&c, BindingEvent::Verified).connection_status,
            ConnectionStatus::Connected
        );
    }

    #[test]
    fn rule_a_device_serves_one_channel_unless_shared() {
        let mut b = DeviceBindings::exclusive();
        b.bind(&ConnectorChannelId::new("a"), "dev").unwrap();
        assert!(b.bind(&ConnectorChannelId::new("b"), "dev").is_err());
        b.on_event(&ConnectorChannelId::new("a"), BindingEvent::Unbound);
        b.bind(&ConnectorChannelId::new("b"), "dev").unwrap();
        let mut s = DeviceBindings::shared();
        s.bind(&ConnectorChannelId::new("a"), "dev").unwrap();
        s.bind(&ConnectorChannelId::new("b"), "dev").unwrap();
        // Events for unknown channels project "unbound".
        assert_eq!(
            s.on_event(&ConnectorChannelId::new("z"), BindingEvent::CameOnline).connection_status,
            ConnectionStatus::Created
        );
    }
}
