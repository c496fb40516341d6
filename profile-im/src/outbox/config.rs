//! The outbox's policy: defaults, backoff, overflow and write modes, [`OutboxConfig`].

use xagent_protocol_types::Side;

/// Default TTL of a pending message: one hour from first responsibility.
pub const DEFAULT_TTL_MS: u64 = 60 * 60 * 1000;
/// Default per-channel capacity of pending messages.
pub const DEFAULT_CAPACITY_PER_CHANNEL: usize = 1000;
/// Default ack timeout after a write.
pub const DEFAULT_ACK_TIMEOUT_MS: u64 = 30_000;
/// Default cleanup interval (always capped at TTL/2).
pub const DEFAULT_CLEANUP_INTERVAL_MS: u64 = 60_000;
/// Default number of messages per channel in flight at once: one (strict order even when a
/// transmission fails; see [`OutboxConfig::window`]).
pub const DEFAULT_WINDOW: usize = 1;
/// How many past `packet_id`s of one message are remembered to match late acks.
pub(super) const REMEMBERED_PACKETS: usize = 16;
/// How many acks that overtake `on_sent` are kept per message.
pub(super) const MAX_EARLY_ACKS: usize = 4;

/// Exponential backoff between transmissions of one message. The n-th failed attempt waits
/// `min(initial_ms * multiplier^(n-1), max_ms)`; there is no jitter, so schedules are
/// reproducible. Retries are bounded by the TTL, not by a count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub initial_ms: u64,
    /// Growth factor per further failure.
    pub multiplier: u32,
    /// Upper bound of a delay.
    pub max_ms: u64,
}

impl Default for Backoff {
    /// 1 s, 2 s, 4 s, 8 s, 16 s, 32 s, then 60 s.
    fn default() -> Self {
        Self { initial_ms: 1_000, multiplier: 2, max_ms: 60_000 }
    }
}

impl Backoff {
    /// The delay after `failures` failed attempts (0 failures: no delay).
    pub fn delay_ms(&self, failures: u32) -> u64 {
        if failures == 0 {
            return 0;
        }
        let mut delay = self.initial_ms.min(self.max_ms);
        for _ in 1..failures {
            delay = delay.saturating_mul(u64::from(self.multiplier));
            if delay >= self.max_ms {
                return self.max_ms;
            }
        }
        delay
    }
}

/// What to do when a channel already holds `capacity_per_channel` pending messages (after
/// expired messages have been removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OverflowPolicy {
    /// Refuse the new message with `capacity_exceeded` (backpressure: the caller still owns
    /// it and may stop advancing the target system's cursor). The default.
    #[default]
    RejectNew,
    /// Drop the oldest message that is not in flight, record it as evicted with
    /// `capacity_exceeded`, and accept the new one.
    EvictOldest,
}

/// When the outbox's writes reach its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// Every call writes through to the store before it changes the outbox (one store batch
    /// per call: a pass of [`Outbox::next_ready`](crate::Outbox::next_ready) over many channels is one batch). A store
    /// failure leaves the outbox unchanged. The default.
    #[default]
    Through,
    /// Calls change the outbox and collect their writes; the runtime takes them with
    /// [`Outbox::take_writes`](crate::Outbox::take_writes) and commits them, grouped with other work, before it
    /// acknowledges anything that depends on them (the enqueue of a message). Attempt counts
    /// and removals then cost no transaction of their own: they ride along with the next
    /// commit. A crash before that commit forgets them, which only means a redelivery the
    /// receiver answers with `duplicate` (a removal) or one transmission not counted (an
    /// attempt); a message the caller was told is queued is never lost.
    Deferred,
}

/// Outbox policy. All values are documented defaults and may be changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutboxConfig {
    /// Which side sends (decides e.g. whether files need `download_url`).
    pub sender: Side,
    /// Lifetime of a pending message from first responsibility.
    pub ttl_ms: u64,
    /// Pending messages per channel (in flight included).
    pub capacity_per_channel: usize,
    /// Behaviour when a channel is full.
    pub overflow: OverflowPolicy,
    /// Delay schedule between transmissions.
    pub backoff: Backoff,
    /// How long to wait for a `chat.message.ack` (or for `on_sent` after `next_ready`).
    pub ack_timeout_ms: u64,
    /// Desired cleanup interval; the effective one is capped at TTL/2.
    pub cleanup_interval_ms: u64,
    /// Maximum undrained events kept; older ones are dropped and counted.
    pub event_log_capacity: usize,
    /// When writes reach the store.
    pub write_mode: WriteMode,
    /// Messages of one channel that may be in flight (sent, ack not yet received) at once; 0
    /// is read as 1. They are handed out in queue order, so on one ordered transport the
    /// receiver sees first transmissions in order. With a window above 1 a message whose
    /// transmission fails (timeout, retryable rejection, lost write) is sent again after later
    /// messages that were already in flight and may have been accepted meanwhile: order then
    /// holds for everything not yet sent, not for what was in flight. With 1, order is strict.
    pub window: usize,
}

impl OutboxConfig {
    /// Defaults for the given sender: TTL 1 h, 1,000 per channel, reject-new on overflow,
    /// backoff 1 s doubling to 60 s, ack timeout 30 s, cleanup every 60 s.
    pub fn new(sender: Side) -> Self {
        Self {
            sender,
            ttl_ms: DEFAULT_TTL_MS,
            capacity_per_channel: DEFAULT_CAPACITY_PER_CHANNEL,
            overflow: OverflowPolicy::RejectNew,
            backoff: Backoff::default(),
            ack_timeout_ms: DEFAULT_ACK_TIMEOUT_MS,
            cleanup_interval_ms: DEFAULT_CLEANUP_INTERVAL_MS,
            event_log_capacity: 10_000,
            write_mode: WriteMode::Through,
            window: DEFAULT_WINDOW,
        }
    }

    /// The cleanup interval actually used: the configured one, at most TTL/2, at least 1 ms.
    pub fn effective_cleanup_interval_ms(&self) -> u64 {
        self.cleanup_interval_ms.min(self.ttl_ms / 2).max(1)
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self::new(Side::Connector)
    }
}
