//! One target type per channel. A channel's `connection.target_type` is the one of the auth
//! flow it signed in with (`auth_flows[].target_type`); the channel then enables only the
//! negotiated Profiles allowed for that target type ([`profiles_for_target_type`]). A Card that
//! declares both `im` and `device` thus gets `target_type: device` with `xagent.device.v1` on a
//! channel signed in through its device flow, and `im` with the IM Profiles on the others.
//! [`channel_target_type`] answers the converse question: which target type a set of enabled
//! Profiles implies.
//!
//! Which target types a standard Profile may be used with comes from the validator's Profile
//! catalog ([`xagent_protocol_validate::catalog::profile`]), the one place that knows it.

use xagent_protocol_types::{ProfileId, TargetType};
use xagent_protocol_validate::catalog::{CATALOG, profile};

/// Why no target type could be chosen for a channel.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetTypeError {
    /// The channel enables no Profile.
    #[error("the channel enables no Profile; enable at least one of the Card's Profiles")]
    NoProfiles,
    /// The Card declares no target type.
    #[error("the Card declares no target type; declare a target (supports.targets)")]
    NoTargetTypes,
    /// The enabled Profiles have no target type in common with the Card.
    #[error(
        "the Profiles enabled on the channel ({profiles}) share no target type declared by the \
         Card ({target_types}); enable Profiles of one target type per channel"
    )]
    NoCommonTargetType {
        /// The enabled Profiles, comma-separated.
        profiles: String,
        /// The Card's target types, comma-separated.
        target_types: String,
    },
}

/// The `target_type` of a channel whose Descriptor enables `enabled` Profiles, for a Card
/// declaring `card_target_types` (in Card order).
///
/// Standard Profiles narrow the choice to their catalog target types (all of them must agree);
/// Profiles the catalog does not know (a Connector-defined Profile, e.g. for email) do not
/// narrow it. Among the target types left, the first one in Card order wins, except that a
/// target type claimed by a standard Profile that is *not* enabled is passed over when another
/// candidate remains (a Card with `im` and `device` enabling only a Connector-defined Profile
/// still does not project `im`).
pub fn channel_target_type(
    enabled: &[ProfileId],
    card_target_types: &[TargetType],
) -> Result<TargetType, TargetTypeError> {
    if enabled.is_empty() {
        return Err(TargetTypeError::NoProfiles);
    }
    if card_target_types.is_empty() {
        return Err(TargetTypeError::NoTargetTypes);
    }
    let mut candidates: Vec<&TargetType> = card_target_types.iter().collect();
    for id in enabled {
        if let Some(spec) = profile(id.as_str()) {
            candidates.retain(|t| spec.allows_target_type(t));
        }
    }
    let Some(first) = candidates.first() else {
        return Err(TargetTypeError::NoCommonTargetType {
            profiles: join(enabled.iter().map(ProfileId::as_str)),
            target_types: join(card_target_types.iter().map(TargetType::as_str)),
        });
    };
    let all_unknown = enabled.iter().all(|id| profile(id.as_str()).is_none());
    if all_unknown {
        // Prefer a target type that no standard Profile claims (a Connector-defined one).
        let claimed = |t: &TargetType| CATALOG.iter().any(|spec| spec.allows_target_type(t));
        if let Some(own) = candidates.iter().find(|t| !claimed(t)) {
            return Ok((*own).clone());
        }
    }
    Ok((*first).clone())
}

/// The Profiles a channel of `target_type` enables out of `offered` (in their order): every
/// standard Profile whose catalog target types include it, and every Profile the catalog does
/// not know (a Connector-defined one is the Connector's to scope).
pub fn profiles_for_target_type(target_type: &TargetType, offered: &[ProfileId]) -> Vec<ProfileId> {
    offered.iter().filter(|id| profile_allows_target_type(id, target_type)).cloned().collect()
}

/// Whether a Profile may be enabled on a channel of `target_type` (a Profile the catalog does
/// not know always may).
pub fn profile_allows_target_type(id: &ProfileId, target_type: &TargetType) -> bool {
    profile(id.as_str()).is_none_or(|spec| spec.allows_target_type(target_type))
}

fn join<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::{PROFILE_DEVICE_V1, PROFILE_IM_V1, PROFILE_IM_V2};

    fn p(ids: &[&str]) -> Vec<ProfileId> {
        ids.iter().map(|id| ProfileId::new(*id)).collect()
    }

    #[test]
    fn rule_target_type_follows_enabled_profiles_for_an_im_and_device_card() {
        let card = [TargetType::Im, TargetType::Device];
        assert_eq!(
            channel_target_type(&p(&[PROFILE_DEVICE_V1]), &card).unwrap(),
            TargetType::Device
        );
        assert_eq!(channel_target_type(&p(&[PROFILE_IM_V2]), &card).unwrap(), TargetType::Im);
        let reversed = [TargetType::Device, TargetType::Im];
        assert_eq!(
            channel_target_type(&p(&[PROFILE_IM_V1, PROFILE_IM_V2]), &reversed).unwrap(),
            TargetType::Im
        );
    }

    #[test]
    fn single_target_cards_keep_their_type() {
        assert_eq!(
            channel_target_type(&p(&[PROFILE_DEVICE_V1]), &[TargetType::Device]).unwrap(),
            TargetType::Device
        );
        assert_eq!(
            channel_target_type(&p(&[PROFILE_IM_V2]), &[TargetType::Im]).unwrap(),
            TargetType::Im
        );
        // A Connector-defined Profile on an email Card.
        assert_eq!(
            channel_target_type(&p(&["acme.mail.v1"]), &[TargetType::Email]).unwrap(),
            TargetType::Email
        );
    }

    #[test]
    fn connector_defined_profile_prefers_an_unclaimed_target_type() {
        let card = [TargetType::Im, TargetType::Ticket];
        assert_eq!(
            channel_target_type(&p(&["acme.tickets.v1"]), &card).unwrap(),
            TargetType::Ticket
        );
        // Beside a standard Profile, the standard Profile decides.
        assert_eq!(
            channel_target_type(&p(&["acme.tickets.v1", PROFILE_IM_V2]), &card).unwrap(),
            TargetType::Im
        );
    }

    #[test]
    fn rule_a_channel_enables_only_the_profiles_of_its_target_type() {
        let offered = p(&[PROFILE_IM_V2, PROFILE_DEVICE_V1, PROFILE_IM_V1, "acme.extra.v1"]);
        assert_eq!(
            profiles_for_target_type(&TargetType::Im, &offered),
            p(&[PROFILE_IM_V2, PROFILE_IM_V1, "acme.extra.v1"])
        );
        assert_eq!(
            profiles_for_target_type(&TargetType::Device, &offered),
            p(&[PROFILE_DEVICE_V1, "acme.extra.v1"])
        );
        assert!(profiles_for_target_type(&TargetType::Device, &p(&[PROFILE_IM_V2])).is_empty());
    }

    #[test]
    fn rule_profiles_of_different_target_types_on_one_channel_are_refused() {
        let card = [TargetType::Im, TargetType::Device];
        let err = channel_target_type(&p(&[PROFILE_IM_V2, PROFILE_DEVICE_V1]), &card).unwrap_err();
        assert!(matches!(err, TargetTypeError::NoCommonTargetType { .. }), "{err}");
        let err = channel_target_type(&p(&[PROFILE_DEVICE_V1]), &[TargetType::Im]).unwrap_err();
        assert!(err.to_string().contains("xagent.device.v1"), "{err}");
        assert_eq!(channel_target_type(&[], &card).unwrap_err(), TargetTypeError::NoProfiles);
        assert_eq!(
            channel_target_type(&p(&[PROFILE_IM_V2]), &[]).unwrap_err(),
            TargetTypeError::NoTargetTypes
        );
    }
}
