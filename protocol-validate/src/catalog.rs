//! The Profile catalog, as data, and Profile negotiation.
//!
//! Every standard Profile is one entry of [`CATALOG`]: its id, the Card target types it may be
//! declared with, the packet types it adds (with direction and routing level), and the xAgent
//! outbound payload kinds it lets through to a Connector. Packet types of the common protocol
//! (everything in [`PacketType::TABLE`] that no Profile claims) are always allowed.
//!
//! Negotiation intersects the Card's `supports.profiles` with the hello's `supported_profiles`
//! into an immutable [`Negotiated`]; each channel then narrows it with its Descriptor's
//! `connection.profiles` into a [`ChannelProfiles`]. Those two objects are the only allowlist in
//! the project: nothing else may hard-code which packets a Profile permits.

use xagent_protocol_types::{
    Direction, PROFILE_DEVICE_V1, PROFILE_IM_V1, PROFILE_IM_V2, PacketSpec, PacketType, ProfileId,
    Routing, Side, TargetType,
};

/// One packet type a Profile adds to the common protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProfilePacket {
    /// Wire `type`.
    pub packet_type: &'static str,
    /// Who may send it.
    pub direction: Direction,
    /// Routing level.
    pub routing: Routing,
}

/// An xAgent-internal payload kind that a Profile lets out to the Connector, and the packet
/// type it is projected into. Internal signals not listed (session sync, history, UI
/// projection, ...) are never sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboundProjection {
    /// The xAgent payload kind (see [`outbound`]).
    pub kind: &'static str,
    /// The packet type carrying it.
    pub packet_type: &'static str,
}

/// Names of the xAgent outbound payload kinds the catalog knows.
pub mod outbound {
    /// A final, persisted assistant message (`chat.message`).
    pub const ASSISTANT_MESSAGE: &str = "assistant_message";
    /// A text delta of an assistant message in progress (`chat.message.delta`).
    pub const ASSISTANT_DELTA: &str = "assistant_delta";
    /// xAgent's acknowledgment of a user message (`chat.message.ack`).
    pub const MESSAGE_ACK: &str = "message_ack";
    /// A redacted activity snapshot: thinking, tool or idle (`chat.activity`).
    pub const ACTIVITY: &str = "activity";
}

/// One standard Profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProfileSpec {
    /// Profile id, e.g. `xagent.im.v2`.
    pub id: &'static str,
    /// Card / Descriptor target types the Profile may be used with.
    pub target_types: &'static [TargetType],
    /// Packet types the Profile adds.
    pub packets: &'static [ProfilePacket],
    /// xAgent outbound payload kinds the Profile permits.
    pub outbound: &'static [OutboundProjection],
}

impl ProfileSpec {
    /// The Profile's entry for a packet type, if it owns it.
    pub fn packet(&self, packet_type: &str) -> Option<&'static ProfilePacket> {
        self.packets.iter().find(|p| p.packet_type == packet_type)
    }

    /// True when the Profile may be used with this target type.
    pub fn allows_target_type(&self, target_type: &TargetType) -> bool {
        self.target_types.contains(target_type)
    }

    /// The packet type an outbound payload kind is projected into, if the Profile permits it.
    pub fn outbound_packet(&self, kind: &str) -> Option<&'static str> {
        self.outbound.iter().find(|o| o.kind == kind).map(|o| o.packet_type)
    }
}

const IM_TARGETS: &[TargetType] = &[TargetType::Im];
const DEVICE_TARGETS: &[TargetType] = &[TargetType::Device];

/// The catalog of standard Profiles.
pub const CATALOG: &[ProfileSpec] = &[
    ProfileSpec {
        id: PROFILE_IM_V1,
        target_types: IM_TARGETS,
        packets: &[ProfilePacket {
            packet_type: "message.push",
            direction: Direction::ConnectorToXagent,
            routing: Routing::Channel,
        }],
        outbound: &[],
    },
    ProfileSpec {
        id: PROFILE_IM_V2,
        target_types: IM_TARGETS,
        packets: &[
            ProfilePacket {
                packet_type: "chat.message",
                direction: Direction::Both,
                routing: Routing::Channel,
            },
            ProfilePacket {
                packet_type: "chat.message.delta",
                direction: Direction::XagentToConnector,
                routing: Routing::Channel,
            },
            ProfilePacket {
                packet_type: "chat.message.ack",
                direction: Direction::Both,
                routing: Routing::Channel,
            },
            ProfilePacket {
                packet_type: "chat.activity",
                direction: Direction::XagentToConnector,
                routing: Routing::Channel,
            },
        ],
        outbound: &[
            OutboundProjection { kind: outbound::ASSISTANT_MESSAGE, packet_type: "chat.message" },
            OutboundProjection {
                kind: outbound::ASSISTANT_DELTA,
                packet_type: "chat.message.delta",
            },
            OutboundProjection { kind: outbound::MESSAGE_ACK, packet_type: "chat.message.ack" },
            OutboundProjection { kind: outbound::ACTIVITY, packet_type: "chat.activity" },
        ],
    },
    ProfileSpec {
        id: PROFILE_DEVICE_V1,
        target_types: DEVICE_TARGETS,
        // Device Tools ride on the common tool.invoke / tool.progress.push packets.
        packets: &[],
        outbound: &[],
    },
];

/// The catalog entry of a Profile id.
pub fn profile(id: &str) -> Option<&'static ProfileSpec> {
    CATALOG.iter().find(|spec| spec.id == id)
}

/// True for the IM Profiles (`xagent.im.v1`, `xagent.im.v2`): a Card declares at most one
/// of them, and their Tools are IM Tools.
pub fn is_im_profile(id: &str) -> bool {
    id == PROFILE_IM_V1 || id == PROFILE_IM_V2
}

/// The Profile that owns a packet type, if any.
pub fn owning_profile(packet_type: &str) -> Option<&'static ProfileSpec> {
    CATALOG.iter().find(|spec| spec.packet(packet_type).is_some())
}

/// What the catalog says about a packet type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PacketClass {
    /// A common-protocol packet, allowed on every connection.
    Common(&'static PacketSpec),
    /// A packet owned by a Profile.
    Profile(&'static ProfileSpec, &'static ProfilePacket),
    /// Not a packet type this version knows.
    Unknown,
}

/// Classifies a packet type.
pub fn classify(packet_type: &str) -> PacketClass {
    for spec in CATALOG {
        if let Some(packet) = spec.packet(packet_type) {
            return PacketClass::Profile(spec, packet);
        }
    }
    match PacketType::spec_of(packet_type) {
        Some(spec) => PacketClass::Common(spec),
        None => PacketClass::Unknown,
    }
}

/// The answer to "may this packet flow here".
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Permission {
    /// Allowed.
    Allowed,
    /// The type is unknown.
    UnknownType,
    /// The type exists but this side may not send it.
    WrongDirection,
    /// The owning Profile was not negotiated on this connection.
    ProfileNotNegotiated {
        /// The owning Profile.
        profile: &'static str,
    },
    /// The owning Profile is negotiated but not enabled on this channel.
    ProfileNotOnChannel {
        /// The owning Profile.
        profile: &'static str,
    },
}

impl Permission {
    /// True for [`Permission::Allowed`].
    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Allowed)
    }
}

/// The Profiles enabled on one connection: Card `supports.profiles` intersected with the
/// hello's `supported_profiles`. Immutable once built.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Negotiated {
    ids: Vec<ProfileId>,
    specs: Vec<&'static ProfileSpec>,
}

impl Negotiated {
    /// Intersects the Card's Profiles with the peer's, keeping the Card's order. Profiles the
    /// catalog does not know stay in the id list but grant no packet type.
    pub fn negotiate(card_profiles: &[ProfileId], supported_profiles: &[ProfileId]) -> Self {
        let mut ids: Vec<ProfileId> = Vec::new();
        for id in card_profiles {
            if supported_profiles.contains(id) && !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        let specs = ids.iter().filter_map(|id| profile(id.as_str())).collect();
        Self { ids, specs }
    }

    /// The negotiated Profile ids, in the Card's order.
    pub fn profile_ids(&self) -> &[ProfileId] {
        &self.ids
    }

    /// True when the Profile was negotiated.
    pub fn contains(&self, profile_id: &str) -> bool {
        self.ids.iter().any(|id| id.as_str() == profile_id)
    }

    /// Narrows the connection's Profiles to those a channel's Descriptor enables
    /// (`connection.profiles`). Profiles the Descriptor lists but the connection did not
    /// negotiate are dropped.
    pub fn for_channel(&self, descriptor_profiles: &[ProfileId]) -> ChannelProfiles {
        let mut ids: Vec<ProfileId> = Vec::new();
        for id in descriptor_profiles {
            if self.ids.contains(id) && !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        let specs = ids.iter().filter_map(|id| profile(id.as_str())).collect();
        ChannelProfiles(std::sync::Arc::new(ProfileSet { ids, specs }))
    }

    /// Whether `packet_type`, sent by `sender`, may flow on this connection and, when given,
    /// on this channel. Common packets only need the right direction.
    pub fn decide(
        &self,
        packet_type: &str,
        sender: Side,
        channel: Option<&ChannelProfiles>,
    ) -> Permission {
        judge(packet_type, sender, |profile| {
            if !self.specs.iter().any(|s| s.id == profile.id) {
                Permission::ProfileNotNegotiated { profile: profile.id }
            } else if channel.is_some_and(|c| !c.0.specs.iter().any(|s| s.id == profile.id)) {
                Permission::ProfileNotOnChannel { profile: profile.id }
            } else {
                Permission::Allowed
            }
        })
    }

    /// Shorthand for [`Negotiated::decide`] being [`Permission::Allowed`].
    pub fn allows(
        &self,
        packet_type: &str,
        sender: Side,
        channel: Option<&ChannelProfiles>,
    ) -> bool {
        self.decide(packet_type, sender, channel).is_allowed()
    }
}

/// The direction rule every packet shares, then `gate` for a Profile packet: whether its
/// Profile is enabled where the packet would flow.
fn judge(
    packet_type: &str,
    sender: Side,
    gate: impl FnOnce(&'static ProfileSpec) -> Permission,
) -> Permission {
    match classify(packet_type) {
        PacketClass::Unknown => Permission::UnknownType,
        PacketClass::Common(spec) if spec.direction.allows(sender) => Permission::Allowed,
        PacketClass::Profile(profile, packet) if packet.direction.allows(sender) => gate(profile),
        PacketClass::Common(_) | PacketClass::Profile(..) => Permission::WrongDirection,
    }
}

/// The Profiles enabled on one channel (negotiated on the connection and listed in the
/// channel's Descriptor). Immutable: when the Descriptor's Profiles change, build a new one.
/// Shared, not copied: a clone is a reference count, and a [`crate::Session`] keeps one value
/// per distinct set for all its channels (typically one for every channel of a connection).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChannelProfiles(std::sync::Arc<ProfileSet>);

#[derive(Debug, Default, PartialEq, Eq)]
struct ProfileSet {
    ids: Vec<ProfileId>,
    specs: Vec<&'static ProfileSpec>,
}

impl ChannelProfiles {
    /// The enabled Profile ids.
    pub fn profile_ids(&self) -> &[ProfileId] {
        &self.0.ids
    }

    /// True when the Profile is enabled on the channel.
    pub fn contains(&self, profile_id: &str) -> bool {
        self.0.ids.iter().any(|id| id.as_str() == profile_id)
    }

    /// True when both are the same shared value (no comparison of the contents).
    pub fn ptr_eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether `packet_type`, sent by `sender`, may flow on this channel.
    pub fn decide(&self, packet_type: &str, sender: Side) -> Permission {
        judge(packet_type, sender, |profile| {
            if self.0.specs.iter().any(|s| s.id == profile.id) {
                Permission::Allowed
            } else {
                Permission::ProfileNotOnChannel { profile: profile.id }
            }
        })
    }

    /// Shorthand for [`ChannelProfiles::decide`] being [`Permission::Allowed`].
    pub fn allows(&self, packet_type: &str, sender: Side) -> bool {
        self.decide(packet_type, sender).is_allowed()
    }

    /// The packet type an xAgent outbound payload kind becomes on this channel, or `None` when
    /// no enabled Profile permits it (the signal must then be dropped silently).
    pub fn outbound_packet(&self, kind: &str) -> Option<&'static str> {
        self.0.specs.iter().find_map(|spec| spec.outbound_packet(kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<ProfileId> {
        list.iter().map(|s| ProfileId::from(*s)).collect()
    }

    #[test]
    fn catalog_agrees_with_the_packet_table() {
        for spec in CATALOG {
            for packet in spec.packets {
                let common = PacketType::spec_of(packet.packet_type)
                    .unwrap_or_else(|| panic!("{} missing from TABLE", packet.packet_type));
                assert_eq!(common.direction, packet.direction, "{}", packet.packet_type);
                assert_eq!(common.routing, packet.routing, "{}", packet.packet_type);
            }
            for projection in spec.outbound {
                let packet = spec.packet(projection.packet_type).unwrap();
                assert!(packet.direction.allows(Side::Xagent), "{}", projection.kind);
            }
        }
    }

    #[test]
    fn every_known_type_is_classified() {
        for spec in PacketType::TABLE {
            assert_ne!(classify(spec.packet_type), PacketClass::Unknown);
        }
        assert_eq!(classify("session.sync_request"), PacketClass::Unknown);
        assert!(matches!(classify("tool.progress.push"), PacketClass::Common(_)));
        assert!(
            matches!(classify("message.push"), PacketClass::Profile(p, _) if p.id == PROFILE_IM_V1)
        );
        for t in ["chat.message", "chat.message.delta", "chat.message.ack", "chat.activity"] {
            assert!(matches!(classify(t), PacketClass::Profile(p, _) if p.id == PROFILE_IM_V2));
        }
    }

    #[test]
    fn target_types_of_profiles() {
        assert!(profile(PROFILE_IM_V1).unwrap().allows_target_type(&TargetType::Im));
        assert!(profile(PROFILE_IM_V2).unwrap().allows_target_type(&TargetType::Im));
        assert!(!profile(PROFILE_IM_V2).unwrap().allows_target_type(&TargetType::Device));
        assert!(profile(PROFILE_DEVICE_V1).unwrap().allows_target_type(&TargetType::Device));
        assert!(profile("xagent.browser-runtime.v1").is_none());
    }

    #[test]
    fn negotiation_intersects_in_card_order() {
        let n = Negotiated::negotiate(
            &ids(&[PROFILE_IM_V2, PROFILE_DEVICE_V1]),
            &ids(&[PROFILE_IM_V1, PROFILE_IM_V2]),
        );
        assert_eq!(n.profile_ids(), ids(&[PROFILE_IM_V2]).as_slice());
        assert!(n.allows("chat.message", Side::Connector, None));
        assert!(n.allows("chat.message.delta", Side::Xagent, None));
        assert!(!n.allows("message.push", Side::Connector, None));
        assert_eq!(
            n.decide("message.push", Side::Connector, None),
            Permission::ProfileNotNegotiated { profile: PROFILE_IM_V1 }
        );
    }

    #[test]
    fn direction_is_enforced() {
        let n = Negotiated::negotiate(&ids(&[PROFILE_IM_V2]), &ids(&[PROFILE_IM_V2]));
        assert_eq!(
            n.decide("chat.message.delta", Side::Connector, None),
            Permission::WrongDirection
        );
        assert_eq!(n.decide("chat.activity", Side::Connector, None), Permission::WrongDirection);
        assert_eq!(n.decide("tool.invoke", Side::Connector, None), Permission::WrongDirection);
        assert_eq!(n.decide("tool.invoke.ack", Side::Xagent, None), Permission::WrongDirection);
        assert!(n.allows("ping", Side::Connector, None));
        assert!(n.allows("error", Side::Xagent, None));
    }

    #[test]
    fn common_packets_need_no_profile() {
        let n = Negotiated::negotiate(&[], &[]);
        assert!(n.allows("tool.invoke", Side::Xagent, None));
        assert!(n.allows("tool.progress.push", Side::Connector, None));
        assert!(!n.allows("chat.message", Side::Xagent, None));
        assert_eq!(n.decide("x.y", Side::Xagent, None), Permission::UnknownType);
    }

    #[test]
    fn channel_narrows_the_connection() {
        let n = Negotiated::negotiate(
            &ids(&[PROFILE_IM_V1, PROFILE_IM_V2]),
            &ids(&[PROFILE_IM_V1, PROFILE_IM_V2]),
        );
        let v1_only = n.for_channel(&ids(&[PROFILE_IM_V1, PROFILE_DEVICE_V1]));
        assert_eq!(v1_only.profile_ids(), ids(&[PROFILE_IM_V1]).as_slice());
        assert!(v1_only.allows("message.push", Side::Connector));
        assert!(!v1_only.allows("chat.message", Side::Connector));
        assert_eq!(
            n.decide("chat.message", Side::Connector, Some(&v1_only)),
            Permission::ProfileNotOnChannel { profile: PROFILE_IM_V2 }
        );
        assert!(v1_only.allows("tool.invoke", Side::Xagent));
    }

    #[test]
    fn outbound_kinds_are_filtered() {
        let n = Negotiated::negotiate(&ids(&[PROFILE_IM_V2]), &ids(&[PROFILE_IM_V2]));
        let channel = n.for_channel(&ids(&[PROFILE_IM_V2]));
        assert_eq!(channel.outbound_packet(outbound::ASSISTANT_DELTA), Some("chat.message.delta"));
        assert_eq!(channel.outbound_packet("session.sync_message"), None);
        let device = Negotiated::negotiate(&ids(&[PROFILE_DEVICE_V1]), &ids(&[PROFILE_DEVICE_V1]))
            .for_channel(&ids(&[PROFILE_DEVICE_V1]));
        assert_eq!(device.outbound_packet(outbound::ASSISTANT_MESSAGE), None);
    }
}
