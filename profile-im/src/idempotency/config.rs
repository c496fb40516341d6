//! The receiver's bounds: [`IdempotencyConfig`] and its defaults.

/// Default number of completed ids kept per channel (in the store).
pub const DEFAULT_IDEMPOTENCY_CAPACITY: usize = 10_000;
/// Default age after which a completed id is forgotten: 24 h, well beyond a sender's 1 h TTL
/// plus backoff, so every redelivery a conforming sender can make is still recognised.
pub const DEFAULT_IDEMPOTENCY_MAX_AGE_MS: u64 = 24 * 60 * 60 * 1000;
/// Default time after which an admitted but never completed message is forgotten.
pub const DEFAULT_IN_PROGRESS_TIMEOUT_MS: u64 = 10 * 60 * 1000;
/// Default number of recently completed ids cached in memory, over all channels.
pub const DEFAULT_IDEMPOTENCY_CACHE: usize = 4_096;
/// Default interval between two age expiries in the store.
pub const DEFAULT_IDEMPOTENCY_EXPIRE_INTERVAL_MS: u64 = 60 * 1000;

/// Bounds of the idempotency set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdempotencyConfig {
    /// Completed ids kept per channel in the store; the oldest are deleted first (by a trim
    /// every `capacity_per_channel / 16` completions of the channel, so up to 1/16 more are
    /// kept in between).
    pub capacity_per_channel: usize,
    /// Age after which a completed id is forgotten (no longer answered `duplicate`, and
    /// deleted from the store by the next expiry).
    pub max_age_ms: u64,
    /// Age after which an unfinished admission is forgotten (the caller crashed or lost it).
    pub in_progress_timeout_ms: u64,
    /// Recently completed ids held in memory over all channels (about 200 bytes each), so a
    /// prompt redelivery is answered without reading the store. 0 reads the store every time.
    pub cache_capacity: usize,
    /// Least time between two age expiries in the store ([`ReceiverIdempotency::prune`](crate::ReceiverIdempotency::prune)).
    pub expire_interval_ms: u64,
}

impl Default for IdempotencyConfig {
    /// 10,000 ids per channel, 24 h, 10 min, 4,096 cached ids, expiry once a minute.
    fn default() -> Self {
        Self {
            capacity_per_channel: DEFAULT_IDEMPOTENCY_CAPACITY,
            max_age_ms: DEFAULT_IDEMPOTENCY_MAX_AGE_MS,
            in_progress_timeout_ms: DEFAULT_IN_PROGRESS_TIMEOUT_MS,
            cache_capacity: DEFAULT_IDEMPOTENCY_CACHE,
            expire_interval_ms: DEFAULT_IDEMPOTENCY_EXPIRE_INTERVAL_MS,
        }
    }
}

impl IdempotencyConfig {
    /// Completions of a channel between two capacity trims in the store.
    pub(super) fn trim_every(&self) -> usize {
        (self.capacity_per_channel / 16).max(1)
    }
}
