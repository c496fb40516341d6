//! Device Profile flows through the [`DeviceGate`] with a simulated clock: binding and its
//! Descriptor corrections, serialisation, timeouts, confirmations and the stable error codes.

use serde_json::{Map, Value, json};
use xagent_profile_device::{
    BindingEvent, DeviceConfig, DeviceGate, DeviceTool, ParamKind, ParamRule, RiskLevel,
    ToolCategory,
};
use xagent_protocol_types::{
    Clock, ConnectionStatus, ConnectorChannelId, ErrorCode, ManualClock, ToolId,
};

const T0: u64 = 1_790_000_000_000;

fn channel() -> ConnectorChannelId {
    ConnectorChannelId::new("cch_1")
}

fn tap() -> DeviceTool {
    DeviceTool::new(
        "device_tap",
        ToolCategory::Control,
        RiskLevel::Medium,
        vec![
            ParamRule::required("x", ParamKind::Integer { min: 0, max: 1079 }),
            ParamRule::required("y", ParamKind::Integer { min: 0, max: 2399 }),
        ],
    )
    .unwrap()
}

fn screenshot() -> DeviceTool {
    DeviceTool::new("device_screenshot", ToolCategory::Media, RiskLevel::Low, vec![]).unwrap()
}

fn wipe() -> DeviceTool {
    DeviceTool::new("device_wipe", ToolCategory::Control, RiskLevel::High, vec![]).unwrap()
}

fn args(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap()
}

fn gate() -> (DeviceGate, ManualClock) {
    let mut gate = DeviceGate::new([tap(), screenshot(), wipe()], DeviceConfig::default()).unwrap();
    gate.bind(&channel(), "serial-1").unwrap();
    (gate, ManualClock::new(T0))
}

fn id(tool: &str) -> ToolId {
    ToolId::new(tool)
}

#[test]
fn side_effects_on_one_device_are_serialised_and_a_later_screenshot_waits() {
    let (mut g, clock) = gate();
    let now = clock.now_millis();
    let a = args(json!({"x": 1, "y": 1}));
    let first = g.admit(&channel(), &id("device_tap"), &a, now).unwrap().op;
    let second = g.admit(&channel(), &id("device_tap"), &a, now).unwrap().op;
    let shot = g.admit(&channel(), &id("device_screenshot"), &Map::new(), now).unwrap().op;
    assert_eq!(g.start_ready(now), vec![(channel(), first)]);
    assert!(g.start_ready(now).is_empty());
    g.finish(&channel(), first);
    assert_eq!(g.start_ready(now), vec![(channel(), second)]);
    g.finish(&channel(), second);
    assert_eq!(g.start_ready(now), vec![(channel(), shot)], "the screenshot shows both taps");
}

#[test]
fn command_timeout_is_reported_after_the_configured_time() {
    let (mut g, clock) = gate();
    let a = args(json!({"x": 1, "y": 1}));
    let op = g.admit(&channel(), &id("device_tap"), &a, clock.now_millis()).unwrap().op;
    g.start_ready(clock.now_millis());
    clock.advance(29_999);
    assert!(g.poll_timeouts(clock.now_millis()).is_empty());
    clock.advance(1);
    let timeouts = g.poll_timeouts(clock.now_millis());
    assert_eq!(timeouts.len(), 1);
    assert_eq!((timeouts[0].op, timeouts[0].error.code()), (op, ErrorCode::CommandTimeout));
}

#[test]
fn offline_device_answers_device_offline_until_it_is_back() {
    let (mut g, clock) = gate();
    let a = args(json!({"x": 1, "y": 1}));
    let (correction, _) = g.on_event(&channel(), BindingEvent::WentOffline);
    assert_eq!(correction.connection_status, ConnectionStatus::Offline);
    let err = g.admit(&channel(), &id("device_tap"), &a, clock.now_millis()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::DeviceOffline);
    g.on_event(&channel(), BindingEvent::CameOnline);
    g.admit(&channel(), &id("device_tap"), &a, clock.now_millis()).unwrap();
}

#[test]
fn permission_loss_and_unbinding_have_their_own_codes() {
    let (mut g, clock) = gate();
    let a = args(json!({"x": 1, "y": 1}));
    g.on_event(&channel(), BindingEvent::PermissionLost);
    let err = g.admit(&channel(), &id("device_tap"), &a, clock.now_millis()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    g.on_event(&channel(), BindingEvent::Unbound);
    let err = g.admit(&channel(), &id("device_tap"), &a, clock.now_millis()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ConnectionNotFound);
}

#[test]
fn high_risk_tool_needs_a_live_confirmation() {
    let (mut g, clock) = gate();
    let none = Map::new();
    let err = g.admit(&channel(), &id("device_wipe"), &none, clock.now_millis()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ConfirmationRequired);
    g.grant_confirmation(&channel(), &id("device_wipe"), &none, clock.now_millis());
    clock.advance(5 * 60 * 1000);
    let err = g.admit(&channel(), &id("device_wipe"), &none, clock.now_millis()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ConfirmationRequired, "the grant expired");
    g.grant_confirmation(&channel(), &id("device_wipe"), &none, clock.now_millis());
    g.admit(&channel(), &id("device_wipe"), &none, clock.now_millis()).unwrap();
}

#[test]
fn out_of_range_arguments_never_reach_the_queue() {
    let (mut g, clock) = gate();
    let err = g
        .admit(&channel(), &id("device_tap"), &args(json!({"x": 5000, "y": 1})), clock.now_millis())
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments);
    assert!(g.start_ready(clock.now_millis()).is_empty());
}
