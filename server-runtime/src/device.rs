//! Device Profile v1 in the runtime: the author's [`crate::DeviceTarget`] and device Tools,
//! run under the rules of `xagent-profile-device` (one [`DeviceGate`] per Connector).
//!
//! A device Tool call, after the common checks and the repeated-call registry
//! (`handlers/tool.rs`), goes through [`DeviceRuntime::run`]: the gate admits it (bound and
//! online device, arguments, risk and confirmation, queue room) or refuses it with a stable
//! code (`device_offline`, `permission_denied`, `confirmation_required`, ...); control Tools
//! then wait for their turn (one at a time per channel, observations together, arrival order),
//! the author's handler runs with the command timeout (`command_timeout`), and the result is
//! checked on the way out (media only as a `file_ref`). A call refused before it reached the
//! device is not stored as the call's outcome, so a retry after the device is back may run.
//!
//! Binding state changes (bound, restored, online, offline, permission) become the channel's
//! `connection.status` and every device Tool's availability in the Descriptor.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::oneshot;
use xagent_profile_device::{
    BindingEvent, BindingState, Correction, DeviceConfig, DeviceError, DeviceGate, DeviceTool, OpId,
};
use xagent_protocol_types::{ConnectorChannelId, DescriptorTool, ToolId, WireError};

use crate::author::DeviceStatus;
use crate::author::call::DeviceCode;
use crate::storage::ChannelRecord;
use crate::tool_calls::ToolOutcome;

/// The arrival order of device calls per channel: each call takes a number when it arrives
/// and may reach the gate once every earlier call of its channel did (or gave up).
#[derive(Default)]
struct Turns {
    waiting: Mutex<HashMap<ConnectorChannelId, std::collections::BTreeSet<u64>>>,
    next: std::sync::atomic::AtomicU64,
    changed: tokio::sync::Notify,
}

impl Turns {
    fn take(&self, channel: &ConnectorChannelId) -> Turn<'_> {
        let number = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut waiting = self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        waiting.entry(channel.clone()).or_default().insert(number);
        Turn { turns: self, channel: channel.clone(), number }
    }
}

/// One call's place in its channel's arrival order; dropping it gives the place up.
pub(crate) struct Turn<'a> {
    turns: &'a Turns,
    channel: ConnectorChannelId,
    number: u64,
}

impl Turn<'_> {
    fn is_first(&self) -> bool {
        let waiting = self.turns.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        waiting.get(&self.channel).and_then(|set| set.first()) == Some(&self.number)
    }

    /// Resolves once every earlier call of the channel reached the gate or gave up.
    async fn wait(&self) {
        loop {
            let changed = self.turns.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.is_first() {
                return;
            }
            changed.await;
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut waiting =
            self.turns.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(set) = waiting.get_mut(&self.channel) {
            set.remove(&self.number);
            if set.is_empty() {
                waiting.remove(&self.channel);
            }
        }
        drop(waiting);
        self.turns.changed.notify_waiters();
    }
}

/// What the builder collected: the author's target, the device Tool declarations, policies.
pub(crate) struct DeviceDef {
    pub(crate) code: DeviceCode,
    pub(crate) tools: Vec<DeviceTool>,
    pub(crate) config: DeviceConfig,
}

type Started = oneshot::Sender<Result<(), DeviceError>>;

struct Inner {
    gate: DeviceGate,
    waiting: HashMap<OpId, Started>,
}

/// The media check every Tool result of a device Connector passes on its way out (device Tool
/// or not): media only as a Transfer Plane `file_ref`, never bytes, base64 or `data:` URLs.
pub(crate) fn checked_result(
    channel: &ConnectorChannelId,
    tool_id: &ToolId,
    value: Value,
) -> ToolOutcome {
    match xagent_profile_device::check_result(&value) {
        Ok(()) => Ok(value),
        Err(e) => {
            tracing::error!(%channel, %tool_id, error = %e, "tool result of a device Connector refused");
            Err(wire(&e))
        }
    }
}

/// The device rules of a running Connector.
pub(crate) struct DeviceRuntime {
    pub(crate) code: DeviceCode,
    /// Arrival order of each channel's device calls, kept across the read of their stored
    /// record (an await that may finish out of order) until the gate admitted them.
    turns: Turns,
    /// The device Tool ids, fixed when the Connector is built: asked on every `tool.invoke`
    /// (and under the state lock), so answered without taking the gate's lock.
    tool_ids: std::collections::BTreeSet<ToolId>,
    inner: Mutex<Inner>,
}

fn wire(e: &DeviceError) -> WireError {
    WireError::new(e.code(), e.to_string())
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

impl DeviceRuntime {
    pub(crate) fn new(def: DeviceDef) -> Result<Self, DeviceError> {
        let gate = DeviceGate::new(def.tools, def.config)?;
        let tool_ids = gate.tools().map(|t| t.tool_id.clone()).collect();
        Ok(Self {
            code: def.code,
            tool_ids,
            turns: Turns::default(),
            inner: Mutex::new(Inner { gate, waiting: HashMap::new() }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes the next place in the channel's arrival order (without waiting): call it when
    /// the call arrives, and hand the turn to [`DeviceRuntime::run`].
    pub(crate) fn turn(&self, channel: &ConnectorChannelId) -> Turn<'_> {
        self.turns.take(channel)
    }

    /// True for a Tool declared as a device Tool.
    pub(crate) fn covers(&self, tool: &ToolId) -> bool {
        self.tool_ids.contains(tool)
    }

    /// The device Tool ids.
    pub(crate) fn tool_ids(&self) -> Vec<ToolId> {
        self.tool_ids.iter().cloned().collect()
    }

    fn start_ready(inner: &mut Inner, now: u64) {
        for (_, op) in inner.gate.start_ready(now) {
            if let Some(tx) = inner.waiting.remove(&op) {
                let _ = tx.send(Ok(()));
            }
        }
    }

    /// Runs a device Tool call under the gate. Returns the outcome and whether the call
    /// reached the device (only then is it stored as the call's outcome).
    pub(crate) async fn run(
        &self,
        channel: &ConnectorChannelId,
        tool_id: &ToolId,
        arguments: &Map<String, Value>,
        now: u64,
        turn: Turn<'_>,
        call: impl Future<Output = Result<Value, WireError>>,
    ) -> (ToolOutcome, bool) {
        // The gate admits calls in the order they arrived on the channel.
        turn.wait().await;
        let (tx, rx) = oneshot::channel();
        let (op, config) = {
            let mut inner = self.lock();
            let admitted = match inner.gate.admit(channel, tool_id, arguments, now) {
                Ok(a) => a,
                Err(e) => return (Err(wire(&e)), false),
            };
            inner.waiting.insert(admitted.op, tx);
            Self::start_ready(&mut inner, now);
            (admitted.op, *inner.gate.config())
        };
        drop(turn);
        match tokio::time::timeout(millis(config.executor.queue_timeout_ms), rx).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => return (Err(wire(&e)), false),
            Ok(Err(_)) | Err(_) => {
                let mut inner = self.lock();
                inner.waiting.remove(&op);
                if inner.gate.cancel(channel, op) {
                    let e = DeviceError::CommandTimeout(config.executor.queue_timeout_ms);
                    return (Err(wire(&e)), false);
                }
                // It started just now: run it.
            }
        }
        let outcome = match tokio::time::timeout(millis(config.executor.command_timeout_ms), call)
            .await
        {
            Ok(Ok(value)) => checked_result(channel, tool_id, value),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(wire(&DeviceError::CommandTimeout(config.executor.command_timeout_ms))),
        };
        let mut inner = self.lock();
        inner.gate.finish(channel, op);
        Self::start_ready(&mut inner, now);
        (outcome, true)
    }

    /// A freshly signed-in binding (its device answered during sign-in).
    pub(crate) fn bind(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
    ) -> Result<Correction, DeviceError> {
        self.lock().gate.bind(channel, key)
    }

    /// A binding restored at startup: not connected until the device answers.
    pub(crate) fn restore(&self, channel: &ConnectorChannelId, key: &str) -> Correction {
        self.lock().gate.restore(channel, key)
    }

    /// The author's report about a channel's device; queued calls the device can no longer
    /// take are answered with the new state's error. `None` when the gate knows no device for
    /// the channel (a binding without a device key): nothing to correct.
    pub(crate) fn report(
        &self,
        channel: &ConnectorChannelId,
        status: &DeviceStatus,
    ) -> Option<Correction> {
        let mut inner = self.lock();
        let state = inner.gate.state(channel);
        if state == BindingState::Unbound {
            return None;
        }
        let events: &[BindingEvent] = match (status, state) {
            (DeviceStatus::Online, BindingState::PermissionLost) => {
                &[BindingEvent::PermissionRestored, BindingEvent::Verified]
            }
            (DeviceStatus::Online, _) => &[BindingEvent::Verified],
            (DeviceStatus::Offline, _) => &[BindingEvent::WentOffline],
            (DeviceStatus::PermissionLost, _) => &[BindingEvent::PermissionLost],
        };
        let mut correction = inner.gate.correction(channel);
        for event in events {
            let (c, dropped) = inner.gate.on_event(channel, *event);
            correction = c;
            for (op, error) in dropped {
                if let Some(tx) = inner.waiting.remove(&op) {
                    let _ = tx.send(Err(error));
                }
            }
        }
        Some(correction)
    }

    /// The channel was signed out or unregistered.
    pub(crate) fn forget(&self, channel: &ConnectorChannelId) {
        let mut inner = self.lock();
        for op in inner.gate.remove(channel) {
            if let Some(tx) = inner.waiting.remove(&op) {
                let _ = tx.send(Err(DeviceError::NotBound));
            }
        }
    }

    /// The user confirmed a call of a high-risk Tool with these arguments.
    pub(crate) fn grant(
        &self,
        channel: &ConnectorChannelId,
        tool: &ToolId,
        arguments: &serde_json::Map<String, serde_json::Value>,
        now: u64,
    ) {
        self.lock().gate.grant_confirmation(channel, tool, arguments, now);
    }

    /// Writes a correction into a channel record: its status and the availability of every
    /// device Tool. Returns true when something changed.
    pub(crate) fn project(&self, record: &mut ChannelRecord, correction: &Correction) -> bool {
        let before = (record.status.clone(), record.tool_overrides.clone());
        record.status = correction.connection_status.clone();
        for tool_id in self.tool_ids() {
            let mut tool = DescriptorTool::new(tool_id.clone(), correction.tool_status.clone())
                .with_permission(correction.permission.clone());
            if let Some(reason) = correction.reason {
                tool = tool.with_reason(reason);
            }
            record.tool_overrides.insert(tool_id, tool);
        }
        before != (record.status.clone(), record.tool_overrides.clone())
    }
}

#[cfg(test)]
mod turn_tests {
    use super::*;

    #[tokio::test]
    async fn device_calls_reach_the_gate_in_arrival_order_whatever_order_they_get_ready_in() {
        let turns = Turns::default();
        let channel = ConnectorChannelId::new("cch_a");
        let first = turns.take(&channel);
        let second = turns.take(&channel);
        let other = turns.take(&ConnectorChannelId::new("cch_b"));
        // Another channel never waits for this one.
        other.wait().await;
        // The second is ready first (its stored-record read came back first): it waits.
        let waiting = tokio::time::timeout(Duration::from_millis(50), second.wait()).await;
        assert!(waiting.is_err(), "the second call waits for the first");
        first.wait().await;
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), second.wait())
            .await
            .expect("once the first reached the gate, the second goes");
    }

    #[tokio::test]
    async fn a_call_that_gives_up_its_turn_lets_the_next_go() {
        let turns = Turns::default();
        let channel = ConnectorChannelId::new("cch_a");
        let replayed = turns.take(&channel);
        let next = turns.take(&channel);
        drop(replayed); // answered from its stored record, never reaching the gate
        tokio::time::timeout(Duration::from_secs(5), next.wait()).await.expect("not blocked");
        drop(next);
        assert!(turns.waiting.lock().unwrap().is_empty(), "no state kept for an idle channel");
    }
}
