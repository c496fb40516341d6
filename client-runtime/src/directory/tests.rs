//! Section 10.1 resolution and the Descriptor checks of the channel directory.

use super::*;
use serde_json::json;
use xagent_protocol_types::{
    BuildInfo, CardTool, Connection, ConnectorInfo, DescriptorTarget, DescriptorTool,
    PermissionState, Supports, TargetType, ToolStatus,
};

fn schema() -> serde_json::Map<String, serde_json::Value> {
    json!({"type": "object", "required": ["connector_channel_id"],
           "properties": {"connector_channel_id": {"type": "string"}}})
    .as_object()
    .cloned()
    .unwrap_or_default()
}

fn card() -> ConnectorCard {
    ConnectorCard::new(
        "im.x",
        BuildInfo::new("1"),
        ConnectorInfo::new("X", "1.0.0"),
        Supports::new(vec![TargetType::Im], vec!["xagent.im.v2".into()]),
    )
    .with_tool(CardTool::new("send", schema()).with_description("Send text"))
}

fn descriptor(
    channel: &str,
    status: ConnectionStatus,
    tool: DescriptorTool,
) -> ConnectionDescriptor {
    ConnectionDescriptor::new(
        Connection::new(
            "im.x",
            "conn_1",
            channel,
            TargetType::Im,
            vec!["xagent.im.v2".into()],
            status,
        ),
        DescriptorTarget::new("x", "X"),
    )
    .with_tool(tool)
}

fn directory(channels: &[(&str, &str, ConnectionStatus, DescriptorTool)]) -> ChannelDirectory {
    let mut directory = ChannelDirectory::new(Some(card()));
    for (channel, owner, status, tool) in channels {
        let id = ConnectorChannelId::new(*channel);
        directory.set_owner(&id, owner);
        directory
            .apply_descriptor(&id, &descriptor(channel, status.clone(), tool.clone()))
            .expect("a valid Descriptor");
    }
    directory
}

fn code(result: Result<ConnectorChannelId, WireError>) -> String {
    match result {
        Ok(channel) => format!("ok:{channel}"),
        Err(error) => error.code.to_string(),
    }
}

#[test]
fn resolution_10_1_step_3_session_binding_selects_only_its_channel() {
    let directory = directory(&[
        ("cch_a", "alice", ConnectionStatus::Connected, DescriptorTool::available("send")),
        ("cch_b", "alice", ConnectionStatus::Connected, DescriptorTool::available("send")),
    ]);
    let binding = SessionBinding::new("im.x", "cch_b");
    assert_eq!(code(directory.resolve("alice", Some(&binding), "send")), "ok:cch_b");
}

#[test]
fn resolution_10_1_step_1_binding_to_another_card_is_rejected() {
    let directory = directory(&[(
        "cch_a",
        "alice",
        ConnectionStatus::Connected,
        DescriptorTool::available("send"),
    )]);
    let binding = SessionBinding::new("im.other", "cch_a");
    assert_eq!(
        code(directory.resolve("alice", Some(&binding), "send")),
        "connector_channel_connector_mismatch"
    );
}

#[test]
fn resolution_10_1_step_3_binding_to_another_users_channel_is_not_owned() {
    let directory = directory(&[(
        "cch_b",
        "bob",
        ConnectionStatus::Connected,
        DescriptorTool::available("send"),
    )]);
    let binding = SessionBinding::new("im.x", "cch_b");
    assert_eq!(
        code(directory.resolve("alice", Some(&binding), "send")),
        "connector_channel_not_owned"
    );
}

#[test]
fn resolution_10_1_step_2_first_available_skips_unauthenticated_degraded_unavailable_and_denied() {
    let directory = directory(&[
        // Not signed in yet.
        ("cch_1", "alice", ConnectionStatus::Created, DescriptorTool::available("send")),
        // Degraded and the Tool went unavailable.
        (
            "cch_2",
            "alice",
            ConnectionStatus::Degraded,
            DescriptorTool::new("send", ToolStatus::Unavailable),
        ),
        // The target denies the permission.
        (
            "cch_3",
            "alice",
            ConnectionStatus::Connected,
            DescriptorTool::available("send").with_permission(PermissionState::Denied),
        ),
        // Another user's channel.
        ("cch_4", "bob", ConnectionStatus::Connected, DescriptorTool::available("send")),
        // The first one that qualifies.
        ("cch_5", "alice", ConnectionStatus::Degraded, DescriptorTool::available("send")),
        ("cch_6", "alice", ConnectionStatus::Connected, DescriptorTool::available("send")),
    ]);
    assert_eq!(code(directory.resolve("alice", None, "send")), "ok:cch_5");
}

#[test]
fn resolution_10_1_unknown_tool_id_is_tool_not_found() {
    let directory = directory(&[(
        "cch_a",
        "alice",
        ConnectionStatus::Connected,
        DescriptorTool::available("send"),
    )]);
    assert_eq!(code(directory.resolve("alice", None, "delete_all")), "tool_not_found");
}

#[test]
fn resolution_10_1_unavailable_tool_is_connector_channel_unavailable() {
    let directory = directory(&[(
        "cch_a",
        "alice",
        ConnectionStatus::Connected,
        DescriptorTool::new("send", ToolStatus::RequiresReauth),
    )]);
    assert_eq!(code(directory.resolve("alice", None, "send")), "connector_channel_unavailable");
    let binding = SessionBinding::new("im.x", "cch_a");
    assert_eq!(
        code(directory.resolve("alice", Some(&binding), "send")),
        "connector_channel_unavailable"
    );
}

/// Protocol 9: `offline` and `error` are signed in but inactive. A user whose only channel
/// is in one of them is told the channel is unavailable, not that none is signed in, even
/// where its Descriptor still lists the Tool as available.
#[test]
fn resolution_10_1_offline_and_error_channels_are_connector_channel_unavailable() {
    for status in [ConnectionStatus::Offline, ConnectionStatus::Error] {
        let directory =
            directory(&[("cch_a", "alice", status.clone(), DescriptorTool::available("send"))]);
        assert_eq!(
            code(directory.resolve("alice", None, "send")),
            "connector_channel_unavailable",
            "{status:?}"
        );
        let binding = SessionBinding::new("im.x", "cch_a");
        assert_eq!(
            code(directory.resolve("alice", Some(&binding), "send")),
            "connector_channel_unavailable",
            "{status:?}"
        );
    }
}

#[test]
fn resolution_10_1_no_signed_in_channel_is_connection_not_found() {
    let directory = directory(&[(
        "cch_a",
        "alice",
        ConnectionStatus::Authenticating,
        DescriptorTool::available("send"),
    )]);
    assert_eq!(code(directory.resolve("alice", None, "send")), "connection_not_found");
    assert_eq!(code(directory.resolve("carol", None, "send")), "connection_not_found");
}

#[test]
fn descriptor_rule_identity_must_match_the_channel() {
    let mut directory = ChannelDirectory::new(Some(card()));
    let other =
        descriptor("cch_other", ConnectionStatus::Connected, DescriptorTool::available("send"));
    let refused = directory
        .apply_descriptor(&ConnectorChannelId::new("cch_a"), &other)
        .expect_err("identity mismatch");
    assert!(refused.0.contains("descriptor.channel_mismatch"), "{refused}");
}

#[test]
fn descriptor_rule_profiles_must_be_within_the_card() {
    let mut directory = ChannelDirectory::new(Some(card()));
    let mut bad =
        descriptor("cch_a", ConnectionStatus::Connected, DescriptorTool::available("send"));
    bad.connection.profiles = vec!["xagent.device.v1".into()];
    let refused = directory
        .apply_descriptor(&ConnectorChannelId::new("cch_a"), &bad)
        .expect_err("Profile outside the Card");
    assert!(refused.0.contains("descriptor.profile_not_in_card"), "{refused}");
}

#[test]
fn descriptor_rule_target_type_must_be_the_cards() {
    let mut directory = ChannelDirectory::new(Some(card()));
    let mut bad =
        descriptor("cch_a", ConnectionStatus::Connected, DescriptorTool::available("send"));
    bad.connection.target_type = TargetType::Email;
    let refused = directory
        .apply_descriptor(&ConnectorChannelId::new("cch_a"), &bad)
        .expect_err("target type outside the Card");
    assert!(refused.0.contains("descriptor.target_type"), "{refused}");
    assert!(directory.get(&ConnectorChannelId::new("cch_a")).is_none());
}

#[test]
fn descriptor_rule_tools_must_be_in_the_card() {
    let mut directory = ChannelDirectory::new(Some(card()));
    let bad = descriptor("cch_a", ConnectionStatus::Connected, DescriptorTool::available("ghost"));
    let refused = directory
        .apply_descriptor(&ConnectorChannelId::new("cch_a"), &bad)
        .expect_err("Tool outside the Card");
    assert!(refused.0.contains("descriptor.tool_not_in_card"), "{refused}");
}
