//! The repeated-call registry: a retried `tool.invoke` (same channel and
//! `context.tool_call_id`, or the `request_id` when there is none) gets the first call's outcome
//! instead of acting on the device twice. The same key with different arguments is refused
//! with `idempotency_conflict`. Outcomes are kept for a bounded window and count.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use xagent_protocol_types::{ConnectorChannelId, RequestId, ToolCallId, ToolId, WireError};

use crate::DeviceError;
use crate::tools::CHANNEL_ARGUMENT;

/// Default time a completed call's outcome is kept: the project's one repeated-call window,
/// 24 hours ([`xagent_protocol_types::REPEATED_CALL_WINDOW_MS`]), as for every other
/// side-effecting Tool.
pub const DEFAULT_REPEAT_WINDOW_MS: u64 = xagent_protocol_types::REPEATED_CALL_WINDOW_MS;
/// Default number of calls remembered per channel.
pub const DEFAULT_REPEAT_CAPACITY: usize = 1024;

/// The outcome replayed to a repeat: the Tool's result or the wire error it ended with.
pub type CallOutcome = Result<Value, WireError>;

/// The idempotency key of a call within its channel.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CallKey {
    /// `context.tool_call_id`.
    ToolCall(ToolCallId),
    /// The `request_id`, when the call has no `tool_call_id`.
    Request(RequestId),
}

impl CallKey {
    /// The key of a call: its `tool_call_id` if any, else its `request_id`.
    pub fn of(tool_call_id: Option<&ToolCallId>, request_id: &RequestId) -> Self {
        match tool_call_id {
            Some(id) => Self::ToolCall(id.clone()),
            None => Self::Request(request_id.clone()),
        }
    }
}

/// Bounds of the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepeatConfig {
    /// How long a completed outcome is replayed.
    pub window_ms: u64,
    /// Calls remembered per channel (oldest completed forgotten first).
    pub capacity_per_channel: usize,
}

impl Default for RepeatConfig {
    /// 24 hours (the shared repeated-call window), 1,024 calls per channel.
    fn default() -> Self {
        Self { window_ms: DEFAULT_REPEAT_WINDOW_MS, capacity_per_channel: DEFAULT_REPEAT_CAPACITY }
    }
}

/// Permission to run a call once. Give it back to [`RepeatedCalls::complete`] or
/// [`RepeatedCalls::abandon`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "complete or abandon the ticket, otherwise repeats wait forever"]
pub struct CallTicket {
    channel: ConnectorChannelId,
    key: CallKey,
}

/// The verdict on an incoming call.
#[derive(Debug, PartialEq)]
pub enum CallAdmission {
    /// First time: run it, then complete the ticket.
    Run(CallTicket),
    /// Already done: answer with this outcome, do not touch the device.
    Replay(CallOutcome),
    /// The first call is still running: do not run; [`RepeatedCalls::complete`] returns this
    /// request so the runtime answers it with the first outcome.
    InProgress,
    /// Same key, different arguments: answer with this error (`idempotency_conflict`).
    Conflict(DeviceError),
}

#[derive(Debug)]
enum Slot {
    Running { waiters: Vec<RequestId> },
    Done { outcome: CallOutcome, at: u64 },
}

#[derive(Debug)]
struct Call {
    fingerprint: String,
    slot: Slot,
}

#[derive(Debug, Default)]
struct ChannelCalls {
    calls: HashMap<CallKey, Call>,
    done_order: VecDeque<CallKey>,
}

/// The registry of one Connector.
#[derive(Debug)]
pub struct RepeatedCalls {
    config: RepeatConfig,
    channels: BTreeMap<ConnectorChannelId, ChannelCalls>,
}

fn fingerprint(tool_id: &ToolId, arguments: &Map<String, Value>) -> String {
    let mut args = arguments.clone();
    args.remove(CHANNEL_ARGUMENT);
    let mut text = String::new();
    canonical(&Value::Object(args), &mut text);
    let mut hasher = Sha256::new();
    hasher.update(tool_id.as_str().as_bytes());
    hasher.update([0]);
    hasher.update(text.as_bytes());
    hex::encode(hasher.finalize())
}

fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(k) {
                    canonical(v, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

impl RepeatedCalls {
    /// An empty registry.
    pub fn new(config: RepeatConfig) -> Self {
        Self { config, channels: BTreeMap::new() }
    }

    /// The bounds in force.
    pub fn config(&self) -> &RepeatConfig {
        &self.config
    }

    /// Admits a call. `request_id` identifies this delivery (to be answered later if the first
    /// call is still running). Arguments are compared without `connector_channel_id` and
    /// independently of key order.
    pub fn begin(
        &mut self,
        channel: &ConnectorChannelId,
        key: CallKey,
        request_id: &RequestId,
        tool_id: &ToolId,
        arguments: &Map<String, Value>,
        now: u64,
    ) -> CallAdmission {
        self.prune_channel(channel, now);
        let fp = fingerprint(tool_id, arguments);
        let calls = self.channels.entry(channel.clone()).or_default();
        if let Some(call) = calls.calls.get_mut(&key) {
            if call.fingerprint != fp {
                let shown = match &key {
                    CallKey::ToolCall(id) => id.to_string(),
                    CallKey::Request(id) => id.to_string(),
                };
                return CallAdmission::Conflict(DeviceError::IdempotencyConflict(shown));
            }
            return match &mut call.slot {
                Slot::Done { outcome, .. } => CallAdmission::Replay(outcome.clone()),
                Slot::Running { waiters } => {
                    waiters.push(request_id.clone());
                    CallAdmission::InProgress
                }
            };
        }
        calls.calls.insert(
            key.clone(),
            Call { fingerprint: fp, slot: Slot::Running { waiters: Vec::new() } },
        );
        CallAdmission::Run(CallTicket { channel: channel.clone(), key })
    }

    /// The call ran (whatever the result, including `command_timeout`: the device may have
    /// acted): stores the outcome for repeats and returns the requests that arrived while it
    /// ran, to be answered with the same outcome.
    pub fn complete(
        &mut self,
        ticket: CallTicket,
        outcome: CallOutcome,
        now: u64,
    ) -> Vec<RequestId> {
        let cap = self.config.capacity_per_channel.max(1);
        let calls = self.channels.entry(ticket.channel).or_default();
        let waiters = match calls.calls.get_mut(&ticket.key) {
            Some(call) => {
                match std::mem::replace(&mut call.slot, Slot::Done { outcome, at: now }) {
                    Slot::Running { waiters } => waiters,
                    Slot::Done { .. } => Vec::new(),
                }
            }
            None => Vec::new(),
        };
        calls.done_order.push_back(ticket.key);
        while calls.done_order.len() > cap {
            if let Some(old) = calls.done_order.pop_front() {
                calls.calls.remove(&old);
            }
        }
        waiters
    }

    /// The call never reached the device (refused by validation, offline, confirmation
    /// required, queue full): nothing is stored, so a later retry may run. Returns the waiting
    /// repeats, which the runtime answers with the same refusal.
    pub fn abandon(&mut self, ticket: CallTicket) -> Vec<RequestId> {
        let Some(calls) = self.channels.get_mut(&ticket.channel) else { return Vec::new() };
        match calls.calls.remove(&ticket.key) {
            Some(Call { slot: Slot::Running { waiters }, .. }) => waiters,
            _ => Vec::new(),
        }
    }

    /// Forgets outcomes older than the window on every channel.
    pub fn prune(&mut self, now: u64) {
        let ids: Vec<ConnectorChannelId> = self.channels.keys().cloned().collect();
        for id in ids {
            self.prune_channel(&id, now);
        }
        self.channels.retain(|_, c| !c.calls.is_empty());
    }

    /// Calls remembered on a channel (running and done).
    pub fn len(&self, channel: &ConnectorChannelId) -> usize {
        self.channels.get(channel).map_or(0, |c| c.calls.len())
    }

    /// True when nothing is remembered on the channel.
    pub fn is_empty(&self, channel: &ConnectorChannelId) -> bool {
        self.len(channel) == 0
    }

    /// The channel was deleted: forget it.
    pub fn remove_channel(&mut self, channel: &ConnectorChannelId) {
        self.channels.remove(channel);
    }

    fn prune_channel(&mut self, channel: &ConnectorChannelId, now: u64) {
        let window = self.config.window_ms;
        let Some(calls) = self.channels.get_mut(channel) else { return };
        while let Some(front) = calls.done_order.front() {
            let expired = match calls.calls.get(front) {
                Some(Call { slot: Slot::Done { at, .. }, .. }) => now.saturating_sub(*at) >= window,
                _ => true,
            };
            if !expired {
                break;
            }
            if let Some(key) = calls.done_order.pop_front() {
                calls.calls.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use xagent_protocol_types::ErrorCode;

    fn ch() -> ConnectorChannelId {
        ConnectorChannelId::new("c")
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn key(id: &str) -> CallKey {
        CallKey::ToolCall(ToolCallId::new(id))
    }

    #[test]
    fn retried_call_returns_first_outcome_without_acting_twice() {
        let mut r = RepeatedCalls::new(RepeatConfig::default());
        let tool = ToolId::new("device_tap");
        let a = args(json!({"x": 1, "y": 2, "connector_channel_id": "c"}));
        let mut taps = 0;
        for attempt in 0..3 {
            let req = RequestId::new(format!("req{attempt}"));
            match r.begin(&ch(), key("call_1"), &req, &tool, &a, 1_000) {
                CallAdmission::Run(t) => {
                    taps += 1;
                    assert!(r.complete(t, Ok(json!({"ok": true})), 1_000).is_empty());
                }
                CallAdmission::Replay(out) => assert_eq!(out, Ok(json!({"ok": true}))),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(taps, 1);
    }

    #[test]
    fn repeat_during_run_waits_for_the_first_outcome() {
        let mut r = RepeatedCalls::new(RepeatConfig::default());
        let tool = ToolId::new("t");
        let a = args(json!({"x": 1}));
        let CallAdmission::Run(t) = r.begin(&ch(), key("k"), &RequestId::new("r1"), &tool, &a, 0)
        else {
            panic!()
        };
        assert_eq!(
            r.begin(&ch(), key("k"), &RequestId::new("r2"), &tool, &a, 1),
            CallAdmission::InProgress
        );
        let err = WireError::new(ErrorCode::CommandTimeout, "slow");
        assert_eq!(r.complete(t, Err(err.clone()), 2), vec![RequestId::new("r2")]);
        assert_eq!(
            r.begin(&ch(), key("k"), &RequestId::new("r3"), &tool, &a, 3),
            CallAdmission::Replay(Err(err))
        );
    }

    #[test]
    fn same_key_different_arguments_is_idempotency_conflict() {
        let mut r = RepeatedCalls::new(RepeatConfig::default());
        let tool = ToolId::new("t");
        let req = RequestId::new("r");
        let CallAdmission::Run(t) =
            r.begin(&ch(), key("k"), &req, &tool, &args(json!({"x": 1, "y": 2})), 0)
        else {
            panic!()
        };
        r.complete(t, Ok(json!(null)), 0);
        // Key order and the channel argument do not matter.
        let same = args(json!({"y": 2, "x": 1, "connector_channel_id": "c"}));
        assert!(matches!(
            r.begin(&ch(), key("k"), &req, &tool, &same, 0),
            CallAdmission::Replay(_)
        ));
        let CallAdmission::Conflict(e) =
            r.begin(&ch(), key("k"), &req, &tool, &args(json!({"x": 2, "y": 2})), 0)
        else {
            panic!()
        };
        assert_eq!(e.code(), ErrorCode::IdempotencyConflict);
        // Another tool under the same key also conflicts.
        assert!(matches!(
            r.begin(&ch(), key("k"), &req, &ToolId::new("u"), &same, 0),
            CallAdmission::Conflict(_)
        ));
    }

    #[test]
    fn key_falls_back_to_request_id_and_is_per_channel() {
        let k = CallKey::of(None, &RequestId::new("req_9"));
        assert_eq!(k, CallKey::Request(RequestId::new("req_9")));
        let mut r = RepeatedCalls::new(RepeatConfig::default());
        let tool = ToolId::new("t");
        let a = Map::new();
        let CallAdmission::Run(t) =
            r.begin(&ch(), k.clone(), &RequestId::new("req_9"), &tool, &a, 0)
        else {
            panic!()
        };
        r.complete(t, Ok(json!(1)), 0);
        let other = ConnectorChannelId::new("other");
        assert!(matches!(
            r.begin(&other, k, &RequestId::new("req_9"), &tool, &a, 0),
            CallAdmission::Run(_)
        ));
    }

    #[test]
    fn abandoned_call_may_run_again() {
        let mut r = RepeatedCalls::new(RepeatConfig::default());
        let (tool, a, req) = (ToolId::new("t"), Map::new(), RequestId::new("r"));
        let CallAdmission::Run(t) = r.begin(&ch(), key("k"), &req, &tool, &a, 0) else { panic!() };
        r.abandon(t);
        assert!(matches!(r.begin(&ch(), key("k"), &req, &tool, &a, 0), CallAdmission::Run(_)));
    }

    #[test]
    fn rule_repeated_call_window_is_the_shared_24_hours() {
        // notes (Device Profile): one repeated-call record kept 24 h for every side-effecting
        // Tool; the runtime and this registry read the same constant.
        assert_eq!(DEFAULT_REPEAT_WINDOW_MS, 24 * 60 * 60 * 1000);
        let mut r = RepeatedCalls::new(RepeatConfig::default());
        let (tool, a, req) = (ToolId::new("t"), Map::new(), RequestId::new("r"));
        let CallAdmission::Run(t) = r.begin(&ch(), key("k"), &req, &tool, &a, 0) else { panic!() };
        r.complete(t, Ok(json!("done")), 0);
        let eleven_minutes = 11 * 60 * 1000;
        r.prune(eleven_minutes);
        assert!(matches!(
            r.begin(&ch(), key("k"), &req, &tool, &a, eleven_minutes),
            CallAdmission::Replay(Ok(_))
        ));
        r.prune(DEFAULT_REPEAT_WINDOW_MS - 1);
        assert_eq!(r.len(&ch()), 1, "still kept one millisecond before 24 h");
        r.prune(DEFAULT_REPEAT_WINDOW_MS);
        assert_eq!(r.len(&ch()), 0, "forgotten at 24 h");
    }

    #[test]
    fn registry_is_bounded_by_window_and_capacity() {
        let mut r = RepeatedCalls::new(RepeatConfig { window_ms: 1_000, capacity_per_channel: 2 });
        let (tool, a) = (ToolId::new("t"), Map::new());
        for i in 0..3 {
            let CallAdmission::Run(t) =
                r.begin(&ch(), key(&format!("k{i}")), &RequestId::new("r"), &tool, &a, 0)
            else {
                panic!()
            };
            r.complete(t, Ok(json!(i)), 0);
        }
        assert_eq!(r.len(&ch()), 2);
        assert!(matches!(
            r.begin(&ch(), key("k0"), &RequestId::new("r"), &tool, &a, 0),
            CallAdmission::Run(_)
        ));
        r.prune(1_000);
        assert_eq!(r.len(&ch()), 1, "only the running k0 is left");
    }
}
