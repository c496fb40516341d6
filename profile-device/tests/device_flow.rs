//! End-to-end Device Profile flows with a simulated clock: binding, serialisation, repeated
//! calls, timeouts and the stable error codes.

use serde_json::{Map, Value, json};
use xagent_profile_device::{
    BindingEvent, CallAdmission, CallKey, Confirmation, ConfirmationLedger, DeviceBindings,
    DeviceError, DeviceTool, Effect, ExecutorConfig, HighRiskPolicy, ParamKind, ParamRule,
    RepeatConfig, RepeatedCalls, RiskLevel, Scheduler, ToolCategory, check_call,
};
use xagent_protocol_types::{
    Clock, ConnectorChannelId, ErrorCode, ManualClock, RequestId, ToolCallId, WireError,
};

const T0: u64 = 1_790_000_000_000;

/// A tiny Connector built from the crate's pieces; `device_log` records what the "device" did.
struct Connector {
    clock: ManualClock,
    bindings: DeviceBindings,
    scheduler: Scheduler,
    calls: RepeatedCalls,
    confirmations: ConfirmationLedger,
    device_log: Vec<String>,
}

enum Answer {
    Now(Result<Value, WireError>),
    Started(xagent_profile_device::OpId, xagent_profile_device::CallTicket),
    Queued(xagent_profile_device::OpId, xagent_profile_device::CallTicket),
    Parked,
}

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

fn wipe() -> DeviceTool {
    DeviceTool::new("device_wipe", ToolCategory::Control, RiskLevel::High, vec![]).unwrap()
}

fn args(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap()
}

impl Connector {
    fn new() -> Self {
        let mut bindings = DeviceBindings::exclusive();
        bindings.bind(&channel(), "serial-1").unwrap();
        Self {
            clock: ManualClock::new(T0),
            bindings,
            scheduler: Scheduler::new(ExecutorConfig::default()),
            calls: RepeatedCalls::new(RepeatConfig::default()),
            confirmations: ConfirmationLedger::default(),
            device_log: Vec::new(),
        }
    }

    fn invoke(
        &mut self,
        tool: &DeviceTool,
        call: &str,
        request: &str,
        a: &Map<String, Value>,
    ) -> Answer {
        let now = self.clock.now_millis();
        let request = RequestId::new(request);
        let key = CallKey::of(Some(&ToolCallId::new(call)), &request);
        let ticket = match self.calls.begin(&channel(), key, &request, &tool.tool_id, a, now) {
            CallAdmission::Run(t) => t,
            CallAdmission::Replay(out) => return Answer::Now(out),
            CallAdmission::InProgress => return Answer::Parked,
            CallAdmission::Conflict(e) => return Answer::Now(Err(e.to_wire())),
        };
        let refused = |this: &mut Self, ticket, e: DeviceError| {
            this.calls.abandon(ticket);
            Answer::Now(Err(e.to_wire()))
        };
        if let Err(e) = self.bindings.device_for(&channel()) {
            return refused(self, ticket, e);
        }
        let confirmation = if tool.risk == RiskLevel::High {
            self.confirmations.take(&channel(), &tool.tool_id, now)
        } else {
            Confirmation::None
        };
        if let Err(e) = check_call(tool, a, HighRiskPolicy::RequireConfirmation, confirmation) {
            return refused(self, ticket, e);
        }
        let op = match self.scheduler.submit(&channel(), tool.effect, now) {
            Ok(op) => op,
            Err(e) => return refused(self, ticket, e),
        };
        if self.scheduler.start_ready(now).iter().any(|(_, o)| *o == op) {
            self.device_log.push(format!("{} {}", tool.tool_id, Value::Object(a.clone())));
            Answer::Started(op, ticket)
        } else {
            Answer::Queued(op, ticket)
        }
    }
}

fn code(answer: &Answer) -> Option<ErrorCode> {
    match answer {
        Answer::Now(Err(e)) => Some(e.code.clone()),
        _ => None,
    }
}

#[test]
fn network_retry_of_a_tap_does_not_tap_twice() {
    let mut c = Connector::new();
    let a = args(json!({"x": 5, "y": 6, "connector_channel_id": "cch_1"}));
    let Answer::Started(op, ticket) = c.invoke(&tap(), "call_1", "req_1", &a) else { panic!() };
    // The retry arrives while the tap runs: parked, no second tap.
    assert!(matches!(c.invoke(&tap(), "call_1", "req_2", &a), Answer::Parked));
    c.clock.advance(200);
    c.scheduler.finish(&channel(), op);
    let waiting = c.calls.complete(ticket, Ok(json!({"tapped": true})), c.clock.now_millis());
    assert_eq!(waiting, vec![RequestId::new("req_2")]);
    // A later retry gets the first outcome.
    let Answer::Now(out) = c.invoke(&tap(), "call_1", "req_3", &a) else { panic!() };
    assert_eq!(out, Ok(json!({"tapped": true})));
    assert_eq!(c.device_log.len(), 1);
    // Same call id, other arguments: idempotency_conflict.
    let other = args(json!({"x": 7, "y": 6}));
    assert_eq!(
        code(&c.invoke(&tap(), "call_1", "req_4", &other)),
        Some(ErrorCode::IdempotencyConflict)
    );
}

#[test]
fn side_effects_on_one_device_are_serialised() {
    let mut c = Connector::new();
    let a = args(json!({"x": 1, "y": 1}));
    let Answer::Started(first, t1) = c.invoke(&tap(), "call_1", "r1", &a) else { panic!() };
    let Answer::Queued(second, t2) = c.invoke(&tap(), "call_2", "r2", &a) else { panic!() };
    assert_eq!(c.scheduler.running(&channel()), vec![first]);
    c.scheduler.finish(&channel(), first);
    let _ = c.calls.complete(t1, Ok(json!(1)), T0);
    assert_eq!(c.scheduler.start_ready(T0 + 1), vec![(channel(), second)]);
    c.scheduler.finish(&channel(), second);
    let _ = c.calls.complete(t2, Ok(json!(2)), T0 + 1);
}

#[test]
fn command_timeout_is_the_outcome_a_retry_sees() {
    let mut c = Connector::new();
    let a = args(json!({"x": 1, "y": 1}));
    let Answer::Started(op, ticket) = c.invoke(&tap(), "call_1", "r1", &a) else { panic!() };
    c.clock.advance(30_000);
    let timeouts = c.scheduler.poll_timeouts(c.clock.now_millis());
    assert_eq!(timeouts.len(), 1);
    assert_eq!(timeouts[0].error.code(), ErrorCode::CommandTimeout);
    let _ = c.calls.complete(ticket, Err(timeouts[0].error.to_wire()), c.clock.now_millis());
    c.scheduler.finish(&channel(), op); // after cancelling the command
    assert_eq!(code(&c.invoke(&tap(), "call_1", "r2", &a)), Some(ErrorCode::CommandTimeout));
    assert_eq!(c.device_log.len(), 1, "the timed-out tap is not repeated");
}

#[test]
fn offline_device_answers_device_offline_and_a_later_retry_runs() {
    let mut c = Connector::new();
    let a = args(json!({"x": 1, "y": 1}));
    c.bindings.on_event(&channel(), BindingEvent::WentOffline);
    assert_eq!(code(&c.invoke(&tap(), "call_1", "r1", &a)), Some(ErrorCode::DeviceOffline));
    c.bindings.on_event(&channel(), BindingEvent::CameOnline);
    assert!(matches!(c.invoke(&tap(), "call_1", "r2", &a), Answer::Started(..)));
}

#[test]
fn permission_loss_and_unbinding_have_their_own_codes() {
    let mut c = Connector::new();
    let a = args(json!({"x": 1, "y": 1}));
    c.bindings.on_event(&channel(), BindingEvent::PermissionLost);
    assert_eq!(code(&c.invoke(&tap(), "call_1", "r1", &a)), Some(ErrorCode::PermissionDenied));
    c.bindings.on_event(&channel(), BindingEvent::Unbound);
    assert_eq!(code(&c.invoke(&tap(), "call_2", "r2", &a)), Some(ErrorCode::ConnectionNotFound));
}

#[test]
fn high_risk_tool_needs_a_live_confirmation() {
    let mut c = Connector::new();
    let none = Map::new();
    assert_eq!(
        code(&c.invoke(&wipe(), "call_1", "r1", &none)),
        Some(ErrorCode::ConfirmationRequired)
    );
    c.confirmations.grant(&channel(), &wipe().tool_id, c.clock.now_millis());
    c.clock.advance(5 * 60 * 1000);
    assert_eq!(
        code(&c.invoke(&wipe(), "call_1", "r2", &none)),
        Some(ErrorCode::ConfirmationRequired)
    );
    c.confirmations.grant(&channel(), &wipe().tool_id, c.clock.now_millis());
    assert!(matches!(c.invoke(&wipe(), "call_1", "r3", &none), Answer::Started(..)));
}

#[test]
fn out_of_range_arguments_never_reach_the_device() {
    let mut c = Connector::new();
    let a = args(json!({"x": 5000, "y": 1}));
    assert_eq!(code(&c.invoke(&tap(), "call_1", "r1", &a)), Some(ErrorCode::InvalidArguments));
    assert!(c.device_log.is_empty());
    assert_eq!(tap().effect, Effect::SideEffect);
}
