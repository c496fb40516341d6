//! The Device Profile v1 checks, run when the Card declares `xagent.device.v1`: the Card's and
//! the authenticated Descriptor's declarations (Profile §2), and no bytes or base64 in a Tool
//! result (Profile §6, judged by `xagent-profile-device`'s own result check). Each is a pure
//! function of what the suite observed, so its negative cases are tested here without a peer.

use serde_json::Value;
use xagent_protocol_types::{ConnectionDescriptor, ConnectorCard, PROFILE_DEVICE_V1, TargetType};

/// Check id of the Card declaration (the validator's rule id).
pub(crate) const CARD_DECLARES: &str = "card.profile_target_type";
/// Rule text of [`CARD_DECLARES`].
pub(crate) const CARD_RULE: &str =
    "Device §2 a Card declaring xagent.device.v1 declares the device target type";
/// Check id of the Descriptor declaration (the validator's rule id).
pub(crate) const DESCRIPTOR_DECLARES: &str = "descriptor.profile_target_type";
/// Rule text of [`DESCRIPTOR_DECLARES`].
pub(crate) const DESCRIPTOR_RULE: &str = "Device §2 an authenticated device channel's Descriptor has target_type device and enables xagent.device.v1";
/// Check id of the result scan (no validator rule covers Tool results).
pub(crate) const RESULT_NO_BYTES: &str = "device.result_no_bytes";
/// Rule text of [`RESULT_NO_BYTES`].
pub(crate) const RESULT_RULE: &str =
    "Device §6 media only as a Transfer Plane file_ref: no bytes, base64 or data: URLs in a result";

/// True when the Card declares the Device Profile (the device checks apply).
pub(crate) fn applies(card: &ConnectorCard) -> bool {
    card.supports.profiles.iter().any(|p| p.as_str() == PROFILE_DEVICE_V1)
}

/// The Card lists `device` among its target types next to the Profile.
pub(crate) fn card_declares(card: &ConnectorCard) -> Result<String, String> {
    if !applies(card) {
        return Err(format!("supports.profiles does not list {PROFILE_DEVICE_V1}"));
    }
    if card.supports.target_types.contains(&TargetType::Device) {
        Ok(format!("supports.target_types lists device next to {PROFILE_DEVICE_V1}"))
    } else {
        let listed: Vec<&str> = card.supports.target_types.iter().map(|t| t.as_str()).collect();
        Err(format!(
            "supports.profiles lists {PROFILE_DEVICE_V1} but supports.target_types is [{}], without device",
            listed.join(", ")
        ))
    }
}

/// One authenticated Descriptor (`where_` names where it came from): the channel enables the
/// Device Profile and its target type is `device`. A Card that also declares other Profiles
/// may bind a channel to one of those instead: only the pairing is checked then.
pub(crate) fn descriptor_declares(
    card: &ConnectorCard,
    descriptor: &ConnectionDescriptor,
    where_: &str,
) -> Result<(), String> {
    let connection = &descriptor.connection;
    let enabled = connection.profiles.iter().any(|p| p.as_str() == PROFILE_DEVICE_V1);
    let only_device = card.supports.profiles.iter().all(|p| p.as_str() == PROFILE_DEVICE_V1);
    if !enabled && only_device {
        let listed: Vec<&str> = connection.profiles.iter().map(|p| p.as_str()).collect();
        return Err(format!(
            "{where_}: connection.profiles is [{}]; the Card declares only {PROFILE_DEVICE_V1} and the hello enabled it",
            listed.join(", ")
        ));
    }
    if enabled && connection.target_type != TargetType::Device {
        return Err(format!(
            "{where_}: connection.target_type is {} on a channel enabling {PROFILE_DEVICE_V1}; it must be device",
            connection.target_type.as_str()
        ));
    }
    Ok(())
}

/// Every `--tool` success result (tool id, result) scanned with the Device Profile's result
/// check; the failure names the Tool and the JSON pointer of the offending field.
pub(crate) fn results_carry_no_bytes(results: &[(String, Value)]) -> Result<String, String> {
    let mut problems = Vec::new();
    for (tool, result) in results {
        if let Err(error) = xagent_profile_device::check_result(result) {
            problems.push(format!("{tool}: {error}"));
        }
    }
    if problems.is_empty() {
        Ok(format!("{} result(s) scanned, no bytes or base64", results.len()))
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn card(target_types: &[&str], profiles: &[&str]) -> ConnectorCard {
        let mut card = ConnectorCard::new(
            "device.lab",
            xagent_protocol_types::BuildInfo::new("2026-01-01T00:00:00Z"),
            xagent_protocol_types::ConnectorInfo::new("Lab", "1.0.0"),
            xagent_protocol_types::Supports::new(
                target_types.iter().map(|t| TargetType::from(*t)).collect(),
                profiles.iter().map(|p| (*p).into()).collect(),
            ),
        );
        card.tools.clear();
        card
    }

    fn descriptor(target_type: &str, profiles: &[&str]) -> ConnectionDescriptor {
        serde_json::from_value(json!({
            "schema": "xagent.connection/v2",
            "connection": {
                "connector_card_id": "device.lab",
                "connector_id": "con_1",
                "connector_channel_id": "cch_1",
                "target_type": target_type,
                "profiles": profiles,
                "status": "connected"
            },
            "target": {"provider": "lab", "display_name": "Lab"}
        }))
        .expect("a Descriptor")
    }

    #[test]
    fn card_profile_target_type_rule_a_device_profile_without_the_device_target_type_fails() {
        let error = card_declares(&card(&["im"], &[PROFILE_DEVICE_V1])).expect_err("refused");
        assert!(error.contains("without device"), "{error}");
        assert!(
            card_declares(&card(&["im", "device"], &["xagent.im.v2", PROFILE_DEVICE_V1])).is_ok()
        );
    }

    #[test]
    fn descriptor_profile_target_type_rule_a_device_channel_with_target_type_im_fails() {
        let card = card(&["device"], &[PROFILE_DEVICE_V1]);
        let error = descriptor_declares(&card, &descriptor("im", &[PROFILE_DEVICE_V1]), "auth")
            .expect_err("refused");
        assert!(error.contains("target_type is im"), "{error}");
        assert!(
            descriptor_declares(&card, &descriptor("device", &[PROFILE_DEVICE_V1]), "auth").is_ok()
        );
    }

    #[test]
    fn descriptor_profile_target_type_rule_a_device_only_card_whose_channel_drops_the_profile_fails()
     {
        let card = card(&["device"], &[PROFILE_DEVICE_V1]);
        let error =
            descriptor_declares(&card, &descriptor("device", &["xagent.im.v2"]), "descriptor.get")
                .expect_err("refused");
        assert!(error.starts_with("descriptor.get:"), "{error}");
        // A Card with an IM Profile too may bind this channel to IM: not a device failure.
        let both = self::card(&["im", "device"], &["xagent.im.v2", PROFILE_DEVICE_V1]);
        assert!(descriptor_declares(&both, &descriptor("im", &["xagent.im.v2"]), "auth").is_ok());
    }

    #[test]
    fn device_result_no_bytes_rule_base64_and_data_urls_fail_with_their_pointer() {
        let results = vec![
            ("lab_read".to_owned(), json!({"level": 3})),
            ("lab_picture".to_owned(), json!({"picture": {"base64": "iVBORw0KGgo="}})),
        ];
        let error = results_carry_no_bytes(&results).expect_err("refused");
        assert!(error.contains("lab_picture") && error.contains("/picture/base64"), "{error}");
        let data_url = vec![("lab_photo".to_owned(), json!({"url": "data:image/png;base64,AAAA"}))];
        let error = results_carry_no_bytes(&data_url).expect_err("refused");
        assert!(error.contains("/url"), "{error}");
        let file_ref = vec![(
            "lab_snapshot".to_owned(),
            json!({"file": {"file_ref": "file_1", "download_url": "/files/refs/file_1"}}),
        )];
        assert!(results_carry_no_bytes(&file_ref).is_ok());
    }
}
