//! [`DeviceGate`]: every Device Profile rule a Connector runtime applies to a device Tool call,
//! in one sans-I/O object. The runtime keeps one gate per Connector (behind its state lock),
//! asks it before a call reaches the author's code, tells it when the call ends, and feeds it
//! the device's online / offline / permission reports. Repeated calls are not the gate's
//! business: the runtime's one repeated-call registry answers them before the gate is asked.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use xagent_protocol_types::{ConnectorChannelId, ToolId};

use crate::{
    BindingEvent, BindingState, Confirmation, ConfirmationLedger, Correction,
    DEFAULT_CONFIRMATION_TTL_MS, DeviceBindings, DeviceError, DeviceTool, ExecutorConfig,
    HighRiskPolicy, OpId, RiskLevel, Scheduler, TimedOut, check_call, check_result,
};

/// The device policies of one Connector (all documented defaults, all configurable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Scheduling limits and timeouts.
    pub executor: ExecutorConfig,
    /// What happens to high-risk Tools.
    pub high_risk: HighRiskPolicy,
    /// How long a user's confirmation of a high-risk Tool stays usable.
    pub confirmation_ttl_ms: u64,
    /// Whether several channels may bind the same device.
    pub shared_devices: bool,
}

impl Default for DeviceConfig {
    /// Default executor limits, high-risk Tools need confirmation (5 min grants), a device is
    /// bound to one channel at a time.
    fn default() -> Self {
        Self {
            executor: ExecutorConfig::default(),
            high_risk: HighRiskPolicy::RequireConfirmation,
            confirmation_ttl_ms: DEFAULT_CONFIRMATION_TTL_MS,
            shared_devices: false,
        }
    }
}

/// A call the gate let through: it is queued (or already running) as `op` on the channel's
/// lane and operates on `device` (the Connector's own key for the bound device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The scheduled operation; report its end with [`DeviceGate::finish`].
    pub op: OpId,
    /// The device bound to the channel.
    pub device: String,
}

/// The Device Profile rules of one Connector: declared Tools, bindings and their Descriptor
/// projection, risk policy and confirmations, the per-channel scheduler, and result checks.
#[derive(Debug)]
pub struct DeviceGate {
    tools: BTreeMap<ToolId, DeviceTool>,
    config: DeviceConfig,
    bindings: DeviceBindings,
    scheduler: Scheduler,
    confirmations: ConfirmationLedger,
}

impl DeviceGate {
    /// A gate for these Tool declarations. Refused when a Tool id is declared twice (each
    /// declaration was already checked by [`DeviceTool::new`]: no device facts as parameters).
    pub fn new(
        tools: impl IntoIterator<Item = DeviceTool>,
        config: DeviceConfig,
    ) -> Result<Self, DeviceError> {
        let mut map = BTreeMap::new();
        for tool in tools {
            let id = tool.tool_id.clone();
            if map.insert(id.clone(), tool).is_some() {
                return Err(DeviceError::InvalidDeclaration(format!(
                    "device tool {id} is declared twice"
                )));
            }
        }
        let bindings = if config.shared_devices {
            DeviceBindings::shared()
        } else {
            DeviceBindings::exclusive()
        };
        Ok(Self {
            tools: map,
            config,
            bindings,
            scheduler: Scheduler::new(config.executor),
            confirmations: ConfirmationLedger::new(config.confirmation_ttl_ms),
        })
    }

    /// The policies in force.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// A declared device Tool.
    pub fn tool(&self, tool_id: &ToolId) -> Option<&DeviceTool> {
        self.tools.get(tool_id)
    }

    /// Every declared device Tool, by id.
    pub fn tools(&self) -> impl Iterator<Item = &DeviceTool> {
        self.tools.values()
    }

    /// Binds a device that has just answered to a channel: projected `connected`.
    pub fn bind(
        &mut self,
        channel: &ConnectorChannelId,
        device: impl Into<String>,
    ) -> Result<Correction, DeviceError> {
        self.bindings.bind(channel, device)
    }

    /// Loads a persisted binding after a restart: `degraded`, Tools unavailable, until the
    /// device answers ([`BindingEvent::Verified`]).
    pub fn restore(
        &mut self,
        channel: &ConnectorChannelId,
        device: impl Into<String>,
    ) -> Correction {
        self.bindings.restore(channel, device)
    }

    /// Applies a report about the channel's device and returns the Descriptor correction. When
    /// the device can no longer take commands, operations still waiting in the channel's queue
    /// are dropped and returned, to be answered with the state's error (running ones finish or
    /// time out on their own).
    pub fn on_event(
        &mut self,
        channel: &ConnectorChannelId,
        event: BindingEvent,
    ) -> (Correction, Vec<(OpId, DeviceError)>) {
        let correction = self.bindings.on_event(channel, event);
        let state = self.bindings.state(channel);
        let dropped = match state.admit() {
            Ok(()) => Vec::new(),
            Err(e) => {
                self.scheduler.drain_queue(channel).into_iter().map(|op| (op, e.clone())).collect()
            }
        };
        (correction, dropped)
    }

    /// Forgets a deleted channel (its binding; queued operations are returned like
    /// [`Self::on_event`] does).
    pub fn remove(&mut self, channel: &ConnectorChannelId) -> Vec<OpId> {
        self.bindings.remove(channel);
        self.scheduler.drain_queue(channel)
    }

    /// The binding state of a channel.
    pub fn state(&self, channel: &ConnectorChannelId) -> BindingState {
        self.bindings.state(channel)
    }

    /// The Descriptor projection of a channel's current binding state.
    pub fn correction(&self, channel: &ConnectorChannelId) -> Correction {
        self.bindings.state(channel).correction()
    }

    /// The user confirmed the call of a high-risk `tool` on `channel` with exactly these
    /// `arguments` (out of band: a prompt on the device, an approval page); the grant is
    /// one-shot, expires, and confirms no call with other arguments.
    pub fn grant_confirmation(
        &mut self,
        channel: &ConnectorChannelId,
        tool: &ToolId,
        arguments: &Map<String, Value>,
        now: u64,
    ) {
        self.confirmations.grant(channel, tool, arguments, now);
    }

    /// Decides whether a call may go to the device, in this order: the Tool is a declared
    /// device Tool (`tool_not_found`), the channel's device is bound and online
    /// (`connection_not_found`, `device_offline`, `permission_denied`), the arguments are in
    /// range (`invalid_arguments`), a high-risk Tool is confirmed or allowed
    /// (`confirmation_required`, `permission_denied`), and the channel's queue has room
    /// (`capacity_exceeded`). An admitted call is queued; it may run when
    /// [`Self::start_ready`] returns its `op`.
    pub fn admit(
        &mut self,
        channel: &ConnectorChannelId,
        tool_id: &ToolId,
        arguments: &Map<String, Value>,
        now: u64,
    ) -> Result<Admitted, DeviceError> {
        let tool =
            self.tools.get(tool_id).ok_or_else(|| DeviceError::ToolNotFound(tool_id.clone()))?;
        let device = self.bindings.device_for(channel)?.to_owned();
        tool.validate_arguments(arguments)?;
        let confirmation = if tool.risk == RiskLevel::High
            && self.config.high_risk == HighRiskPolicy::RequireConfirmation
        {
            self.confirmations.take(channel, tool_id, arguments, now)
        } else {
            Confirmation::None
        };
        check_call(tool, arguments, self.config.high_risk, confirmation)?;
        let op = self.scheduler.submit(channel, tool.effect, now)?;
        Ok(Admitted { op, device })
    }

    /// Operations that may start now (side effects alone on their channel, observations
    /// together, arrival order kept).
    pub fn start_ready(&mut self, now: u64) -> Vec<(ConnectorChannelId, OpId)> {
        self.scheduler.start_ready(now)
    }

    /// Withdraws a call still waiting in its channel's queue (its caller gave up waiting).
    pub fn cancel(&mut self, channel: &ConnectorChannelId, op: OpId) -> bool {
        self.scheduler.cancel(channel, op)
    }

    /// An operation ended (whatever its outcome): frees its slot.
    pub fn finish(&mut self, channel: &ConnectorChannelId, op: OpId) -> bool {
        self.scheduler.finish(channel, op)
    }

    /// Running operations past the command timeout and queued ones past the queue timeout.
    pub fn poll_timeouts(&mut self, now: u64) -> Vec<TimedOut> {
        self.confirmations.prune(now);
        self.scheduler.poll_timeouts(now)
    }

    /// Checks a device Tool's result before it is sent: media only as a Transfer Plane
    /// `file_ref`, never bytes, base64 or `data:` URLs.
    pub fn check_result(&self, result: &Value) -> Result<(), DeviceError> {
        check_result(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ParamKind, ParamRule, ToolCategory};
    use serde_json::json;
    use xagent_protocol_types::{ConnectionStatus, ErrorCode};

    fn ch() -> ConnectorChannelId {
        ConnectorChannelId::new("cch_1")
    }

    fn gate() -> DeviceGate {
        let set = DeviceTool::new(
            "set",
            ToolCategory::Control,
            RiskLevel::Low,
            vec![ParamRule::required("v", ParamKind::Integer { min: 0, max: 9 })],
        )
        .unwrap();
        let read =
            DeviceTool::new("read", ToolCategory::Observation, RiskLevel::Low, vec![]).unwrap();
        let reset =
            DeviceTool::new("reset", ToolCategory::Control, RiskLevel::High, vec![]).unwrap();
        DeviceGate::new([set, read, reset], DeviceConfig::default()).unwrap()
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn duplicate_tool_ids_are_refused_at_build() {
        let t = DeviceTool::new("a", ToolCategory::Observation, RiskLevel::Low, vec![]).unwrap();
        assert!(DeviceGate::new([t.clone(), t], DeviceConfig::default()).is_err());
    }

    #[test]
    fn rule_calls_are_checked_in_order_and_get_stable_codes() {
        let mut g = gate();
        let a = args(json!({"v": 1}));
        let code = |r: Result<Admitted, DeviceError>| r.unwrap_err().code();
        assert_eq!(code(g.admit(&ch(), &ToolId::new("nope"), &a, 0)), ErrorCode::ToolNotFound);
        assert_eq!(code(g.admit(&ch(), &ToolId::new("set"), &a, 0)), ErrorCode::ConnectionNotFound);
        g.restore(&ch(), "dev-1");
        assert_eq!(code(g.admit(&ch(), &ToolId::new("set"), &a, 0)), ErrorCode::DeviceOffline);
        g.on_event(&ch(), BindingEvent::Verified);
        let bad = args(json!({"v": 10}));
        assert_eq!(code(g.admit(&ch(), &ToolId::new("set"), &bad, 0)), ErrorCode::InvalidArguments);
        assert_eq!(
            code(g.admit(&ch(), &ToolId::new("reset"), &Map::new(), 0)),
            ErrorCode::ConfirmationRequired
        );
        g.grant_confirmation(&ch(), &ToolId::new("reset"), &Map::new(), 0);
        let ok = g.admit(&ch(), &ToolId::new("reset"), &Map::new(), 1).unwrap();
        assert_eq!(ok.device, "dev-1");
        g.on_event(&ch(), BindingEvent::PermissionLost);
        assert_eq!(code(g.admit(&ch(), &ToolId::new("read"), &a, 0)), ErrorCode::PermissionDenied);
    }

    #[test]
    fn rule_control_serialised_observations_concurrent() {
        let mut g = gate();
        g.bind(&ch(), "dev-1").unwrap();
        let set = ToolId::new("set");
        let read = ToolId::new("read");
        let a = args(json!({"v": 1}));
        let s1 = g.admit(&ch(), &set, &a, 0).unwrap().op;
        let s2 = g.admit(&ch(), &set, &a, 0).unwrap().op;
        assert_eq!(g.start_ready(0), vec![(ch(), s1)]);
        assert!(g.start_ready(0).is_empty(), "the second set waits for the first");
        g.finish(&ch(), s1);
        assert_eq!(g.start_ready(1), vec![(ch(), s2)]);
        g.finish(&ch(), s2);
        let r1 = g.admit(&ch(), &read, &Map::new(), 2).unwrap().op;
        let r2 = g.admit(&ch(), &read, &Map::new(), 2).unwrap().op;
        assert_eq!(g.start_ready(2), vec![(ch(), r1), (ch(), r2)]);
    }

    #[test]
    fn rule_going_offline_drops_queued_calls_with_device_offline() {
        let mut g = gate();
        g.bind(&ch(), "dev-1").unwrap();
        let a = args(json!({"v": 1}));
        let first = g.admit(&ch(), &ToolId::new("set"), &a, 0).unwrap().op;
        let queued = g.admit(&ch(), &ToolId::new("set"), &a, 0).unwrap().op;
        g.start_ready(0);
        let (corr, dropped) = g.on_event(&ch(), BindingEvent::WentOffline);
        assert_eq!(corr.connection_status, ConnectionStatus::Offline);
        assert_eq!(dropped, vec![(queued, DeviceError::DeviceOffline)]);
        assert!(g.finish(&ch(), first), "the running call keeps its slot until it ends");
        let (corr, dropped) = g.on_event(&ch(), BindingEvent::CameOnline);
        assert_eq!(corr.connection_status, ConnectionStatus::Connected);
        assert!(dropped.is_empty());
    }

    #[test]
    fn rule_results_carry_media_only_as_file_ref() {
        let g = gate();
        g.check_result(&json!({"file_ref": "file_1", "download_url": "/files/refs/file_1"}))
            .unwrap();
        let err = g.check_result(&json!({"image": {"base64": "AAAA"}})).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ToolInvokeFailed);
    }

    #[test]
    fn refused_high_risk_policy_never_runs() {
        let reset =
            DeviceTool::new("reset", ToolCategory::Control, RiskLevel::High, vec![]).unwrap();
        let config = DeviceConfig { high_risk: HighRiskPolicy::Refuse, ..DeviceConfig::default() };
        let mut g = DeviceGate::new([reset], config).unwrap();
        g.bind(&ch(), "d").unwrap();
        g.grant_confirmation(&ch(), &ToolId::new("reset"), &Map::new(), 0);
        let err = g.admit(&ch(), &ToolId::new("reset"), &Map::new(), 0).unwrap_err();
        assert_eq!(err.code(), ErrorCode::PermissionDenied);
    }

    #[test]
    fn confirmation_grant_for_one_call_does_not_admit_another() {
        let open = DeviceTool::new(
            "open_valve",
            ToolCategory::Control,
            RiskLevel::High,
            vec![ParamRule::required("percent", ParamKind::Integer { min: 0, max: 100 })],
        )
        .unwrap();
        let mut g = DeviceGate::new([open], DeviceConfig::default()).unwrap();
        g.bind(&ch(), "d").unwrap();
        let tool = ToolId::new("open_valve");
        g.grant_confirmation(&ch(), &tool, &args(json!({"percent": 5})), 0);
        let other = g.admit(&ch(), &tool, &args(json!({"percent": 100})), 1).unwrap_err();
        assert_eq!(other.code(), ErrorCode::ConfirmationRequired);
        g.admit(&ch(), &tool, &args(json!({"percent": 5})), 2).unwrap();
    }
}
