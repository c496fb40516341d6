//! The Descriptor's `connection.target_type` for a channel: it follows the Profiles enabled on
//! that channel, not the order of the Card's `supports.target_types`. A Card that declares both
//! `im` and `device` and enables `xagent.device.v1` on a channel gets `target_type: device` on
//! that channel, as the Device Profile requires.
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
