//! A sans-I/O scheduler for device operations: per channel, side-effecting operations run one
//! at a time and alone, observations run concurrently (up to a limit), in arrival order. The
//! runtime submits operations, asks which may start, reports when each finishes, and polls
//! for timeouts.
//!
//! Arrival order is kept: an observation queued behind a side effect waits for it, so a
//! screenshot requested after a tap shows the result of the tap. A running operation keeps
//! its slot until [`Scheduler::finish`], even after it was reported as timed out, because the
//! device may still be acting on it; the runtime cancels it and then calls `finish`.

use std::collections::{BTreeMap, VecDeque};

use xagent_protocol_types::ConnectorChannelId;

use crate::{DeviceError, Effect};

/// Default maximum concurrent observations per channel.
pub const DEFAULT_MAX_CONCURRENT_OBSERVATIONS: usize = 4;
/// Default bound of queued operations per channel.
pub const DEFAULT_MAX_QUEUED_PER_CHANNEL: usize = 64;
/// Default time a running command may take before it is reported as `command_timeout`.
pub const DEFAULT_COMMAND_TIMEOUT_MS: u64 = 30_000;
/// Default time an operation may wait in the queue before it is dropped as `command_timeout`.
pub const DEFAULT_QUEUE_TIMEOUT_MS: u64 = 60_000;

/// Limits of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecutorConfig {
    /// Concurrent observations per channel.
    pub max_concurrent_observations: usize,
    /// Queued (not yet started) operations per channel.
    pub max_queued_per_channel: usize,
    /// Running time after which an operation is reported timed out.
    pub command_timeout_ms: u64,
    /// Waiting time after which a queued operation is dropped as timed out (never started).
    pub queue_timeout_ms: u64,
}

impl Default for ExecutorConfig {
    /// 4 observations, 64 queued, 30 s command timeout, 60 s queue timeout.
    fn default() -> Self {
        Self {
            max_concurrent_observations: DEFAULT_MAX_CONCURRENT_OBSERVATIONS,
            max_queued_per_channel: DEFAULT_MAX_QUEUED_PER_CHANNEL,
            command_timeout_ms: DEFAULT_COMMAND_TIMEOUT_MS,
            queue_timeout_ms: DEFAULT_QUEUE_TIMEOUT_MS,
        }
    }
}

/// Identifies one submitted operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

#[derive(Debug)]
struct Queued {
    id: OpId,
    effect: Effect,
    queued_at: u64,
}

#[derive(Debug)]
struct Running {
    id: OpId,
    effect: Effect,
    started_at: u64,
    timed_out: bool,
}

#[derive(Debug, Default)]
struct Lane {
    queue: VecDeque<Queued>,
    running: Vec<Running>,
}

/// A timeout the runtime must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimedOut {
    /// The channel.
    pub channel: ConnectorChannelId,
    /// The operation.
    pub op: OpId,
    /// True if it was running (cancel it, then call `finish`); false if it never started
    /// (it has been removed).
    pub was_running: bool,
    /// The error to answer with (`command_timeout`).
    pub error: DeviceError,
}

/// The per-channel scheduler of one Connector.
#[derive(Debug)]
pub struct Scheduler {
    config: ExecutorConfig,
    lanes: BTreeMap<ConnectorChannelId, Lane>,
    next_id: u64,
}

impl Scheduler {
    /// An empty scheduler.
    pub fn new(config: ExecutorConfig) -> Self {
        Self { config, lanes: BTreeMap::new(), next_id: 1 }
    }

    /// The limits in force.
    pub fn config(&self) -> &ExecutorConfig {
        &self.config
    }

    /// Queues an operation; refused with `capacity_exceeded` when the channel's queue is full.
    pub fn submit(
        &mut self,
        channel: &ConnectorChannelId,
        effect: Effect,
        now: u64,
    ) -> Result<OpId, DeviceError> {
        let max = self.config.max_queued_per_channel;
        let lane = self.lanes.entry(channel.clone()).or_default();
        if lane.queue.len() >= max {
            return Err(DeviceError::QueueFull(max));
        }
        let id = OpId(self.next_id);
        self.next_id += 1;
        lane.queue.push_back(Queued { id, effect, queued_at: now });
        Ok(id)
    }

    /// Starts every operation that may start now and returns them (in arrival order per
    /// channel). A side effect starts only on an idle channel and blocks everything behind it;
    /// observations start while no side effect runs, up to the concurrency limit.
    pub fn start_ready(&mut self, now: u64) -> Vec<(ConnectorChannelId, OpId)> {
        let max_obs = self.config.max_concurrent_observations.max(1);
        let mut started = Vec::new();
        for (channel, lane) in &mut self.lanes {
            while let Some(front) = lane.queue.front() {
                let side_effect_running =
                    lane.running.iter().any(|r| r.effect == Effect::SideEffect);
                let may_start = match front.effect {
                    Effect::SideEffect => lane.running.is_empty(),
                    Effect::Observe => !side_effect_running && lane.running.len() < max_obs,
                };
                if !may_start {
                    break;
                }
                let Some(q) = lane.queue.pop_front() else { break };
                lane.running.push(Running {
                    id: q.id,
                    effect: q.effect,
                    started_at: now,
                    timed_out: false,
                });
                started.push((channel.clone(), q.id));
            }
        }
        started
    }

    /// The operation ended (success, failure or after cancellation): frees its slot. Returns
    /// false if it was not running.
    pub fn finish(&mut self, channel: &ConnectorChannelId, op: OpId) -> bool {
        let Some(lane) = self.lanes.get_mut(channel) else { return false };
        let before = lane.running.len();
        lane.running.retain(|r| r.id != op);
        let removed = lane.running.len() < before;
        if lane.running.is_empty() && lane.queue.is_empty() {
            self.lanes.remove(channel);
        }
        removed
    }

    /// Reports running operations past the command timeout (once each) and drops queued
    /// operations past the queue timeout.
    pub fn poll_timeouts(&mut self, now: u64) -> Vec<TimedOut> {
        let ExecutorConfig { command_timeout_ms, queue_timeout_ms, .. } = self.config;
        let mut out = Vec::new();
        for (channel, lane) in &mut self.lanes {
            for r in &mut lane.running {
                if !r.timed_out && now.saturating_sub(r.started_at) >= command_timeout_ms {
                    r.timed_out = true;
                    out.push(TimedOut {
                        channel: channel.clone(),
                        op: r.id,
                        was_running: true,
                        error: DeviceError::CommandTimeout(command_timeout_ms),
                    });
                }
            }
            lane.queue.retain(|q| {
                let stale = now.saturating_sub(q.queued_at) >= queue_timeout_ms;
                if stale {
                    out.push(TimedOut {
                        channel: channel.clone(),
                        op: q.id,
                        was_running: false,
                        error: DeviceError::CommandTimeout(queue_timeout_ms),
                    });
                }
                !stale
            });
        }
        out
    }

    /// Drops every queued operation of the channel (device offline, unbound, permission lost)
    /// and returns them; running ones are left to finish or be cancelled.
    pub fn drain_queue(&mut self, channel: &ConnectorChannelId) -> Vec<OpId> {
        let Some(lane) = self.lanes.get_mut(channel) else { return Vec::new() };
        lane.queue.drain(..).map(|q| q.id).collect()
    }

    /// Removes one queued (not yet started) operation, e.g. its caller stopped waiting.
    /// Returns false when it is not queued (already started, finished or unknown).
    pub fn cancel(&mut self, channel: &ConnectorChannelId, op: OpId) -> bool {
        let Some(lane) = self.lanes.get_mut(channel) else { return false };
        let before = lane.queue.len();
        lane.queue.retain(|q| q.id != op);
        let removed = lane.queue.len() < before;
        if lane.running.is_empty() && lane.queue.is_empty() {
            self.lanes.remove(channel);
        }
        removed
    }

    /// Operations running on a channel.
    pub fn running(&self, channel: &ConnectorChannelId) -> Vec<OpId> {
        self.lanes
            .get(channel)
            .map(|l| l.running.iter().map(|r| r.id).collect())
            .unwrap_or_default()
    }

    /// Operations waiting on a channel.
    pub fn queued(&self, channel: &ConnectorChannelId) -> usize {
        self.lanes.get(channel).map_or(0, |l| l.queue.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::ErrorCode;

    fn ch(n: &str) -> ConnectorChannelId {
        ConnectorChannelId::new(n)
    }

    #[test]
    fn side_effects_are_serialised_per_channel() {
        let mut s = Scheduler::new(ExecutorConfig::default());
        let a = s.submit(&ch("c"), Effect::SideEffect, 0).unwrap();
        let b = s.submit(&ch("c"), Effect::SideEffect, 0).unwrap();
        assert_eq!(s.start_ready(0), vec![(ch("c"), a)]);
        assert!(s.start_ready(1).is_empty(), "second tap waits for the first");
        assert!(s.finish(&ch("c"), a));
        assert_eq!(s.start_ready(2), vec![(ch("c"), b)]);
    }

    #[test]
    fn observations_run_concurrently_up_to_the_limit() {
        let mut s = Scheduler::new(ExecutorConfig {
            max_concurrent_observations: 2,
            ..ExecutorConfig::default()
        });
        let ids: Vec<OpId> =
            (0..3).map(|_| s.submit(&ch("c"), Effect::Observe, 0).unwrap()).collect();
        assert_eq!(s.start_ready(0).len(), 2);
        s.finish(&ch("c"), ids[0]);
        assert_eq!(s.start_ready(0), vec![(ch("c"), ids[2])]);
    }

    #[test]
    fn side_effect_waits_for_observations_and_blocks_later_ones() {
        let mut s = Scheduler::new(ExecutorConfig::default());
        let o1 = s.submit(&ch("c"), Effect::Observe, 0).unwrap();
        let tap = s.submit(&ch("c"), Effect::SideEffect, 0).unwrap();
        let o2 = s.submit(&ch("c"), Effect::Observe, 0).unwrap();
        assert_eq!(s.start_ready(0), vec![(ch("c"), o1)]);
        s.finish(&ch("c"), o1);
        assert_eq!(s.start_ready(0), vec![(ch("c"), tap)]);
        assert!(s.start_ready(0).is_empty(), "the screenshot after the tap waits for it");
        s.finish(&ch("c"), tap);
        assert_eq!(s.start_ready(0), vec![(ch("c"), o2)]);
    }

    #[test]
    fn channels_do_not_block_each_other() {
        let mut s = Scheduler::new(ExecutorConfig::default());
        s.submit(&ch("a"), Effect::SideEffect, 0).unwrap();
        s.submit(&ch("b"), Effect::SideEffect, 0).unwrap();
        assert_eq!(s.start_ready(0).len(), 2);
    }

    #[test]
    fn command_timeout_is_reported_once_and_keeps_the_slot() {
        let mut s = Scheduler::new(ExecutorConfig::default());
        let tap = s.submit(&ch("c"), Effect::SideEffect, 0).unwrap();
        let next = s.submit(&ch("c"), Effect::SideEffect, 0).unwrap();
        s.start_ready(0);
        assert!(s.poll_timeouts(29_999).is_empty());
        let t = s.poll_timeouts(30_000);
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].op, t[0].was_running), (tap, true));
        assert_eq!(t[0].error.code(), ErrorCode::CommandTimeout);
        assert!(s.poll_timeouts(30_001).is_empty(), "reported once");
        assert!(s.start_ready(30_001).is_empty(), "slot held until finish");
        s.finish(&ch("c"), tap);
        assert_eq!(s.start_ready(30_002), vec![(ch("c"), next)]);
    }

    #[test]
    fn queued_operation_times_out_without_starting() {
        let mut s = Scheduler::new(ExecutorConfig::default());
        let tap = s.submit(&ch("c"), Effect::SideEffect, 0).unwrap();
        let waiting = s.submit(&ch("c"), Effect::SideEffect, 0).unwrap();
        s.start_ready(0);
        s.finish(&ch("c"), tap);
        let t = s.poll_timeouts(60_000);
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].op, t[0].was_running), (waiting, false));
        assert!(s.start_ready(60_000).is_empty());
    }

    #[test]
    fn queue_is_bounded_and_drained_when_offline() {
        let mut s = Scheduler::new(ExecutorConfig {
            max_queued_per_channel: 2,
            ..ExecutorConfig::default()
        });
        s.submit(&ch("c"), Effect::SideEffect, 0).unwrap();
        s.submit(&ch("c"), Effect::SideEffect, 0).unwrap();
        let err = s.submit(&ch("c"), Effect::SideEffect, 0).unwrap_err();
        assert_eq!(err.code(), ErrorCode::CapacityExceeded);
        assert_eq!(s.drain_queue(&ch("c")).len(), 2);
        assert_eq!(s.queued(&ch("c")), 0);
        let a = s.submit(&ch("c"), Effect::SideEffect, 0).unwrap();
        let b = s.submit(&ch("c"), Effect::SideEffect, 0).unwrap();
        assert_eq!(s.start_ready(0), vec![(ch("c"), a)]);
        assert!(!s.cancel(&ch("c"), a), "a running operation is not cancelled here");
        assert!(s.cancel(&ch("c"), b));
        assert_eq!(s.queued(&ch("c")), 0);
    }
}
