//! What a channel shows xAgent: its one target type, its Profiles, its Descriptor (each Card
//! Tool's view on it), and whether it is signed in and may run a Tool.

use xagent_protocol_types::{
    Connection, ConnectionDescriptor, ConnectionStatus, ConnectorChannelId, DescriptorTool,
    PermissionState, ProfileId, TargetType, ToolId, ToolStatus, WireError,
};

use crate::error::HandleError;
use crate::storage::ChannelRecord;

/// Something to write on a socket: the connection core's queue item.
use super::Shared;

/// How one Card Tool shows in a channel's Descriptor.
enum ToolView<'a> {
    /// As the author (or the device gate) reported it.
    Reported(&'a DescriptorTool),
    /// Unavailable: the channel is not signed in, or not connected.
    Unusable {
        /// Whether the channel has a binding.
        signed_in: bool,
    },
    /// Available (signed in and connected, nothing reported).
    Available,
    /// The Tool's Profile is not allowed on the channel's target type (a device Tool on an IM
    /// channel of a Card declaring both).
    OtherTargetType(&'a ProfileId),
}

impl Shared {
    /// The channel's one target type: the one of the flow it signed in with (kept with its
    /// binding). A channel not signed in yet gets the first Card target type some `offered`
    /// (negotiated) Profile allows, else the Card's first. A flow target type the Card does not
    /// declare (the Card validator warns about it) is passed over the same way, since xAgent
    /// refuses a Descriptor whose target type is not the Card's.
    pub(crate) fn channel_target_type(
        &self,
        record: &ChannelRecord,
        offered: &[ProfileId],
    ) -> TargetType {
        let declared = &self.def.card.supports.target_types;
        let signed_in = record
            .binding
            .as_ref()
            .and_then(|binding| binding.target_type())
            .filter(|target_type| declared.contains(target_type));
        let negotiated = || {
            declared.iter().find(|target_type| {
                offered
                    .iter()
                    .any(|p| xagent_profile_device::profile_allows_target_type(p, target_type))
            })
        };
        signed_in
            .or_else(negotiated)
            .or_else(|| declared.first())
            .cloned()
            .unwrap_or(TargetType::Im)
    }

    /// The target type of a channel and the Profiles it enables on a connection that
    /// negotiated `offered` (the Card's Profiles stand in when `offered` is empty: the author's
    /// view of a channel that is not routed). The enabled Profiles are the negotiated ones its
    /// target type allows and never any other: when the connection negotiated none of them (an
    /// xAgent that announced only IM reopening a device channel), the channel has no Descriptor
    /// on that connection and is `connector_channel_unavailable` there.
    pub(crate) fn channel_profiles(
        &self,
        record: &ChannelRecord,
        offered: &[ProfileId],
    ) -> Result<(TargetType, Vec<ProfileId>), WireError> {
        let offered = if offered.is_empty() { &self.def.card.supports.profiles } else { offered };
        let target_type = self.channel_target_type(record, offered);
        let enabled = xagent_profile_device::profiles_for_target_type(&target_type, offered);
        if enabled.is_empty() {
            return Err(WireError::connector_channel_unavailable(format!(
                "this is a {target_type} channel and the connection negotiated no Profile for \
                 {target_type}; reconnect announcing one in supported_profiles"
            )));
        }
        Ok((target_type, enabled))
    }

    /// The Descriptor of a channel as seen with `profiles` enabled (see
    /// [`Shared::channel_profiles`] for when there is none).
    pub(crate) fn descriptor_for(
        &self,
        record: &ChannelRecord,
        profiles: &[ProfileId],
    ) -> Result<ConnectionDescriptor, WireError> {
        let target = record
            .binding
            .as_ref()
            .map_or_else(|| self.def.unbound_target.clone(), |b| b.target.clone());
        let (target_type, profiles) = self.channel_profiles(record, profiles)?;
        let connection = Connection::new(
            self.def.card.connector_card_id.clone(),
            record.connector_id.clone(),
            record.id.clone(),
            target_type.clone(),
            profiles,
            record.status.clone(),
        );
        let tools = self
            .def
            .card
            .tools
            .iter()
            .map(|tool| match self.tool_view(record, &target_type, &tool.tool_id) {
                ToolView::Reported(reported) => reported.clone(),
                ToolView::OtherTargetType(profile) => DescriptorTool::new(
                    tool.tool_id.clone(),
                    ToolStatus::NotSupported,
                )
                .with_reason(format!(
                    "this Tool belongs to {profile}, which a {target_type} channel does not enable"
                )),
                ToolView::Unusable { signed_in } => {
                    let reason = if signed_in {
                        "the channel is not connected"
                    } else {
                        "sign in to the target system first"
                    };
                    let permission = if signed_in {
                        PermissionState::Unknown
                    } else {
                        PermissionState::RequiresReauth
                    };
                    DescriptorTool::new(tool.tool_id.clone(), ToolStatus::Unavailable)
                        .with_permission(permission)
                        .with_reason(reason)
                }
                ToolView::Available => DescriptorTool::available(tool.tool_id.clone()),
            })
            .collect();
        Ok(ConnectionDescriptor::new(connection, target).with_tools(tools))
    }

    /// How a Card Tool shows in a channel's Descriptor: the one rule behind
    /// [`Shared::descriptor_for`] and [`Shared::is_tool_available`]. A Tool of a Profile the
    /// channel's target type does not allow is never offered there.
    fn tool_view<'a>(
        &'a self,
        record: &'a ChannelRecord,
        target_type: &TargetType,
        tool_id: &ToolId,
    ) -> ToolView<'a> {
        let profile =
            self.def.tools.get(tool_id).and_then(|tool| tool.card.profile.as_ref()).filter(
                |profile| !xagent_profile_device::profile_allows_target_type(profile, target_type),
            );
        if let Some(profile) = profile {
            return ToolView::OtherTargetType(profile);
        }
        let signed_in = record.binding.is_some();
        let usable = signed_in
            && matches!(record.status, ConnectionStatus::Connected | ConnectionStatus::Degraded);
        // A device Tool's availability follows its device's binding state, whatever the
        // channel's status (a permission loss shows as `denied_by_target`).
        if signed_in
            && let Some(projected) = record.tool_overrides.get(tool_id)
            && self.device.as_ref().is_some_and(|d| d.covers(tool_id))
        {
            return ToolView::Reported(projected);
        }
        if !usable {
            return ToolView::Unusable { signed_in };
        }
        match record.tool_overrides.get(tool_id) {
            Some(reported) => ToolView::Reported(reported),
            None => ToolView::Available,
        }
    }

    /// `Ok` when the channel exists and is signed in; otherwise the handle error saying which
    /// (the one check behind the IM host's and the device status reports').
    pub(crate) fn require_signed_in(
        &self,
        channel: &ConnectorChannelId,
    ) -> Result<(), HandleError> {
        let state = self.state();
        let record = state
            .channels
            .get(channel)
            .ok_or_else(|| HandleError::UnknownChannel(channel.clone()))?;
        if record.binding.is_none() {
            return Err(HandleError::NotAuthenticated(channel.clone()));
        }
        Ok(())
    }

    /// Whether a Card Tool is `available` in the channel's Descriptor, decided without
    /// building the Descriptor (the per-call check of `tool.invoke`).
    pub(crate) fn is_tool_available(&self, record: &ChannelRecord, tool_id: &ToolId) -> bool {
        self.def.card.tools.iter().any(|tool| &tool.tool_id == tool_id)
            && match self.tool_view(record, &self.bound_target_type(record), tool_id) {
                ToolView::Reported(reported) => reported.status == ToolStatus::Available,
                ToolView::Unusable { .. } | ToolView::OtherTargetType(_) => false,
                ToolView::Available => true,
            }
    }

    /// Whether a Card Tool's Profile is allowed on the channel's target type (a device Tool is
    /// not offered on an IM channel of a Card declaring both).
    pub(crate) fn tool_fits_channel(&self, record: &ChannelRecord, tool_id: &ToolId) -> bool {
        let target_type = self.bound_target_type(record);
        !matches!(self.tool_view(record, &target_type, tool_id), ToolView::OtherTargetType(_))
    }

    /// The target type of a channel as a Tool call sees it (calls need a signed-in channel,
    /// whose binding decides; the Card's Profiles stand in for the negotiated ones).
    fn bound_target_type(&self, record: &ChannelRecord) -> TargetType {
        self.channel_target_type(record, &self.def.card.supports.profiles)
    }

    /// The Descriptor of a channel with the Profiles of its current route (or the Card's).
    pub(crate) fn current_descriptor(
        &self,
        channel: &ConnectorChannelId,
    ) -> Option<ConnectionDescriptor> {
        let state = self.state();
        let record = state.channels.get(channel)?;
        let profiles = state.route(channel).map(|r| r.link.profiles.clone()).unwrap_or_default();
        self.descriptor_for(record, &profiles).ok()
    }
}
