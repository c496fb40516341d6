//! Who gets a connection slot (sans-I/O: the caller passes the time).
//!
//! Three rules, checked right after `accept` and before a byte is read:
//! - **Per address**: one client address (IPv4 per address, IPv6 per /64) holds at most
//!   [`ServeLimits::max_connections_per_address`] connections and opens new ones at a
//!   token-bucket rate ([`ServeLimits::new_connections_per_address_per_second`], bursts of
//!   [`ServeLimits::new_connection_burst_per_address`]). Trusted proxies are exempt.
//! - **Budgets**: connections that are not an authenticated data plane share
//!   `max_connections - reserved_data_plane_connections` slots; a connection whose `/ws`
//!   upgrade passed the API key check moves into the reserved slots.
//! - **Eviction**: when the shared slots are full, a new connection takes the slot of the
//!   connection that has waited longest without a request in progress (a half-sent header, an
//!   idle keep-alive); only when none is waiting does it get one of the reserved slots "on
//!   probation" (it may only become a data plane), and only when every slot is taken is it
//!   refused.
//!
//! A refusal costs a hash-map lookup; it is counted and reported at most once per
//! [`REPORT_EVERY`], never logged one line per connection.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ServeLimits;

/// How often refusals and evictions are summarised in the log (at most).
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(10);

/// How often idle per-address entries are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The unit the per-address limits count: one IPv4 address, or one IPv6 /64 (what one
/// customer of an ISP usually gets; an IPv4-mapped IPv6 address counts as its IPv4 address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum AddressGroup {
    /// One IPv4 address.
    V4(u32),
    /// The upper 64 bits of an IPv6 address.
    V6(u64),
}

impl AddressGroup {
    /// The group `ip` belongs to.
    pub(crate) fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::V4(u32::from(v4)),
                None => Self::V6((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

/// A token bucket: `burst` tokens at most, refilled at `per_second`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TokenBucket {
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub(crate) fn full(now: Instant, burst: u32) -> Self {
        Self { tokens: f64::from(burst), updated: now }
    }

    fn refill(&mut self, now: Instant, per_second: u32, burst: u32) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * f64::from(per_second)).min(f64::from(burst));
        self.updated = now;
    }

    /// Takes one token if there is one.
    pub(crate) fn take(&mut self, now: Instant, per_second: u32, burst: u32) -> bool {
        self.refill(now, per_second, burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// True when the bucket has refilled completely (its entry can be forgotten).
    pub(crate) fn is_full(&self, now: Instant, per_second: u32, burst: u32) -> bool {
        let mut copy = *self;
        copy.refill(now, per_second, burst);
        copy.tokens >= f64::from(burst)
    }
}

/// Why a new connection was closed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its address already holds `max_connections_per_address`.
    AddressCap,
    /// Its address opened connections faster than its rate.
    AddressRate,
    /// Every slot is taken by a connection with a request in progress or a data plane.
    Full,
}

/// What a connection holds: which budget it counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Budget {
    /// The slots every connection shares.
    Shared,
    /// A reserved slot taken while the shared ones were full: only a data-plane upgrade may
    /// happen on it.
    Probation,
    /// A reserved slot of an authenticated data plane.
    DataPlane,
}

struct Conn {
    group: Option<AddressGroup>,
    budget: Budget,
    /// Requests in progress (HTTP/1.1: zero or one).
    busy: usize,
    upgraded: bool,
    /// Its key in `waiting` while it waits (no request in progress, not upgraded).
    waiting_since: Option<u64>,
    evict: CancellationToken,
}

struct GroupState {
    open: usize,
    bucket: TokenBucket,
}

#[derive(Default)]
struct Counts {
    address_cap: u64,
    address_rate: u64,
    full: u64,
    evicted: u64,
}

impl Counts {
    fn any(&self) -> bool {
        self.address_cap + self.address_rate + self.full + self.evicted > 0
    }
}

struct State {
    conns: HashMap<u64, Conn>,
    groups: HashMap<AddressGroup, GroupState>,
    /// Waiting connections by the order they started waiting: the first is evicted first.
    waiting: BTreeMap<u64, u64>,
    shared: usize,
    reserved: usize,
    next: u64,
    last_sweep: Instant,
    counts: Counts,
    last_report: Instant,
    /// Summaries logged so far.
    reports: u64,
}

/// The admission state of one listener.
pub(crate) struct Admission {
    limits: ServeLimits,
    state: Mutex<State>,
}

/// A connection's slot; dropping it frees the slot.
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    id: u64,
    evict: CancellationToken,
}

impl Admission {
    /// An empty admission state for `limits`.
    pub(crate) fn new(limits: ServeLimits, now: Instant) -> Arc<Self> {
        Arc::new(Self {
            limits,
            state: Mutex::new(State {
                conns: HashMap::new(),
                groups: HashMap::new(),
                waiting: BTreeMap::new(),
                shared: 0,
                reserved: 0,
                next: 0,
                last_sweep: now,
                counts: Counts::default(),
                last_report: now,
                reports: 0,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Slots every connection shares (at least one).
    fn shared_cap(&self) -> usize {
        let reserved = self.limits.reserved_data_plane_connections.min(self.limits.max_connections);
        self.limits.max_connections.saturating_sub(reserved).max(1)
    }

    /// True when `ip` is one of the trusted proxies (exempt from the per-address limits).
    pub(crate) fn trusted(&self, ip: IpAddr) -> bool {
        self.limits.is_trusted_proxy(ip)
    }

    /// Admits a connection from `peer` or says why not.
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr, now: Instant) -> Result<Ticket, Refusal> {
        let limits = &self.limits;
        let (rate, burst) = (
            limits.new_connections_per_address_per_second,
            limits.new_connection_burst_per_address.max(1),
        );
        let shared_cap = self.shared_cap();
        let mut state = self.lock();
        let state = &mut *state;
        if now.saturating_duration_since(state.last_sweep) >= SWEEP_EVERY {
            sweep(state, now, rate, burst, limits.max_connections);
        }
        let group = (!self.trusted(peer)).then(|| AddressGroup::of(peer));
        let verdict = self.decide(state, group, now, shared_cap);
        let result = match verdict {
            Ok(budget) => {
                state.next += 1;
                let id = state.next;
                let evict = CancellationToken::new();
                let order = state.next;
                state.waiting.insert(order, id);
                state.conns.insert(
                    id,
                    Conn {
                        group,
                        budget,
                        busy: 0,
                        upgraded: false,
                        waiting_since: Some(order),
                        evict: evict.clone(),
                    },
                );
                if let Some(group) = group
                    && let Some(entry) = state.groups.get_mut(&group)
                {
                    entry.open += 1;
                }
                match budget {
                    Budget::Shared => state.shared += 1,
                    Budget::Probation | Budget::DataPlane => state.reserved += 1,
                }
                Ok(Ticket { admission: Arc::clone(self), id, evict })
            }
            Err(refusal) => {
                match refusal {
                    Refusal::AddressCap => state.counts.address_cap += 1,
                    Refusal::AddressRate => state.counts.address_rate += 1,
                    Refusal::Full => state.counts.full += 1,
                }
                Err(refusal)
            }
        };
        self.report(state, now);
        result
    }

    /// The budget a new connection gets, evicting the longest-waiting one if it must.
    fn decide(
        &self,
        state: &mut State,
        group: Option<AddressGroup>,
        now: Instant,
        shared_cap: usize,
    ) -> Result<Budget, Refusal> {
        let limits = &self.limits;
        let (rate, burst) = (
            limits.new_connections_per_address_per_second,
            limits.new_connection_burst_per_address.max(1),
        );
        if let Some(group) = group {
            let entry = state
                .groups
                .entry(group)
                .or_insert_with(|| GroupState { open: 0, bucket: TokenBucket::full(now, burst) });
            if entry.open >= limits.max_connections_per_address {
                return Err(Refusal::AddressCap);
            }
            if !entry.bucket.take(now, rate, burst) {
                return Err(Refusal::AddressRate);
            }
        }
        if state.shared < shared_cap && state.shared + state.reserved < limits.max_connections {
            return Ok(Budget::Shared);
        }
        if let Some((_, victim)) = state.waiting.pop_first() {
            let freed = release(state, victim);
            state.counts.evicted += 1;
            return Ok(match freed {
                Some(Budget::Shared) => Budget::Shared,
                _ => Budget::Probation,
            });
        }
        if state.shared + state.reserved < limits.max_connections {
            return Ok(Budget::Probation);
        }
        Err(Refusal::Full)
    }

    /// Logs what was refused and evicted since the last report, at most every [`REPORT_EVERY`].
    fn report(&self, state: &mut State, now: Instant) {
        if !state.counts.any() || now.saturating_duration_since(state.last_report) < REPORT_EVERY {
            return;
        }
        let counts = std::mem::take(&mut state.counts);
        let seconds = now.saturating_duration_since(state.last_report).as_secs();
        state.last_report = now;
        state.reports += 1;
        tracing::warn!(
            over_address_cap = counts.address_cap,
            over_address_rate = counts.address_rate,
            all_slots_busy = counts.full,
            evicted_waiting = counts.evicted,
            open = state.shared + state.reserved,
            max_connections = self.limits.max_connections,
            max_per_address = self.limits.max_connections_per_address,
            "listener refused or evicted connections in the last {seconds} s"
        );
    }

    /// Open connections: (shared slots, reserved slots).
    #[cfg(test)]
    pub(crate) fn open(&self) -> (usize, usize) {
        let state = self.lock();
        (state.shared, state.reserved)
    }
}

/// Forgets per-address entries of addresses with nothing open whose bucket refilled; keeps
/// the map bounded even when many addresses come and go.
fn sweep(state: &mut State, now: Instant, rate: u32, burst: u32, max_connections: usize) {
    state.last_sweep = now;
    state.groups.retain(|_, g| g.open > 0 || !g.bucket.is_full(now, rate, burst));
    let bound = max_connections.saturating_mul(4).saturating_add(1_024);
    if state.groups.len() > bound {
        state.groups.retain(|_, g| g.open > 0);
    }
}

/// Frees connection `id`'s slot (once); returns the budget it held.
fn release(state: &mut State, id: u64) -> Option<Budget> {
    let conn = state.conns.remove(&id)?;
    if let Some(order) = conn.waiting_since {
        state.waiting.remove(&order);
    }
    if let Some(group) = conn.group
        && let Some(entry) = state.groups.get_mut(&group)
    {
        entry.open = entry.open.saturating_sub(1);
    }
    match conn.budget {
        Budget::Shared => state.shared = state.shared.saturating_sub(1),
        Budget::Probation | Budget::DataPlane => {
            state.reserved = state.reserved.saturating_sub(1);
        }
    }
    conn.evict.cancel();
    Some(conn.budget)
}

impl Ticket {
    /// Completes when the listener took this connection's slot for a newer one.
    pub(crate) fn evicted(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.evict.clone().cancelled_owned()
    }

    /// True while the connection is on probation: only a data-plane upgrade may happen on it.
    pub(crate) fn on_probation(&self) -> bool {
        let state = self.admission.lock();
        state.conns.get(&self.id).is_some_and(|c| c.budget == Budget::Probation)
    }

    /// True while the connection waits: no request in progress, not upgraded.
    pub(crate) fn is_waiting(&self) -> bool {
        let state = self.admission.lock();
        state.conns.get(&self.id).is_some_and(|c| c.waiting_since.is_some())
    }

    /// A request started: the connection is not waiting (not evictable) until it ends.
    pub(crate) fn busy(&self) {
        let mut state = self.admission.lock();
        let state = &mut *state;
        let Some(conn) = state.conns.get_mut(&self.id) else { return };
        conn.busy += 1;
        if let Some(order) = conn.waiting_since.take() {
            state.waiting.remove(&order);
        }
    }

    /// A request ended (its response body was sent or dropped): the connection waits again.
    pub(crate) fn done(&self) {
        let mut state = self.admission.lock();
        let state = &mut *state;
        let Some(conn) = state.conns.get_mut(&self.id) else { return };
        conn.busy = conn.busy.saturating_sub(1);
        if conn.busy == 0 && !conn.upgraded && conn.waiting_since.is_none() {
            state.next += 1;
            let order = state.next;
            conn.waiting_since = Some(order);
            state.waiting.insert(order, self.id);
        }
    }

    /// The connection became xAgent's authenticated data plane: never evicted again, and moved
    /// into a reserved slot when one is free (it keeps its shared slot otherwise).
    pub(crate) fn promote(&self) {
        let limits = &self.admission.limits;
        let reserved_cap = limits.reserved_data_plane_connections.min(limits.max_connections);
        let mut state = self.admission.lock();
        self.mark_upgraded(&mut state);
        let state = &mut *state;
        let Some(conn) = state.conns.get_mut(&self.id) else { return };
        match conn.budget {
            Budget::Probation => conn.budget = Budget::DataPlane,
            Budget::Shared if state.reserved < reserved_cap => {
                conn.budget = Budget::DataPlane;
                state.shared = state.shared.saturating_sub(1);
                state.reserved += 1;
            }
            Budget::Shared | Budget::DataPlane => {}
        }
    }

    /// Another kind of upgrade (an author's WebSocket): never evicted, keeps its budget.
    pub(crate) fn upgraded(&self) {
        self.mark_upgraded(&mut self.admission.lock());
    }

    /// Marks the connection upgraded (never evicted again) while the caller holds the lock.
    fn mark_upgraded(&self, state: &mut State) {
        let Some(conn) = state.conns.get_mut(&self.id) else { return };
        conn.upgraded = true;
        if let Some(order) = conn.waiting_since.take() {
            state.waiting.remove(&order);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.admission.lock();
        release(&mut state, self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(
        max: usize,
        per_address: usize,
        rate: u32,
        burst: u32,
        reserved: usize,
    ) -> ServeLimits {
        ServeLimits {
            max_connections: max,
            max_connections_per_address: per_address,
            new_connections_per_address_per_second: rate,
            new_connection_burst_per_address: burst,
            reserved_data_plane_connections: reserved,
            ..ServeLimits::default()
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ipv4_groups_per_address_and_ipv6_per_64() {
        assert_ne!(AddressGroup::of(ip("203.0.113.1")), AddressGroup::of(ip("203.0.113.2")));
        assert_eq!(
            AddressGroup::of(ip("2001:db8:1:2:aaaa::1")),
            AddressGroup::of(ip("2001:db8:1:2:bbbb::2"))
        );
        assert_ne!(
            AddressGroup::of(ip("2001:db8:1:2::1")),
            AddressGroup::of(ip("2001:db8:1:3::1"))
        );
        assert_eq!(AddressGroup::of(ip("::ffff:203.0.113.1")), AddressGroup::of(ip("203.0.113.1")));
    }

    #[test]
    fn the_token_bucket_allows_a_burst_then_refills_at_its_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(start, 3);
        assert!((0..3).all(|_| bucket.take(start, 2, 3)));
        assert!(!bucket.take(start, 2, 3), "the burst is spent");
        let later = start + Duration::from_millis(499);
        assert!(!bucket.take(later, 2, 3), "half a second at 2/s is not quite one token");
        assert!(bucket.take(start + Duration::from_millis(500), 2, 3));
        assert!(!bucket.is_full(start + Duration::from_millis(1_000), 2, 3));
        assert!(bucket.is_full(start + Duration::from_millis(2_000), 2, 3));
        // Never more than the burst, however long it rested.
        let rested = start + Duration::from_secs(3_600);
        assert!((0..3).all(|_| bucket.take(rested, 2, 3)));
        assert!(!bucket.take(rested, 2, 3));
    }

    #[test]
    fn one_address_is_capped_below_the_global_cap() {
        let now = Instant::now();
        let admission = Admission::new(limits(10, 3, 100, 100, 2), now);
        let held: Vec<_> = (0..3).map(|_| admission.admit(ip("127.0.0.2"), now).unwrap()).collect();
        assert_eq!(admission.admit(ip("127.0.0.2"), now).err(), Some(Refusal::AddressCap));
        // Another address still gets in.
        let other = admission.admit(ip("127.0.0.1"), now).unwrap();
        drop(held);
        assert!(admission.admit(ip("127.0.0.2"), now).is_ok(), "closing frees the address's slots");
        drop(other);
    }

    #[test]
    fn new_connections_per_address_are_rate_limited_with_simulated_time() {
        let now = Instant::now();
        let admission = Admission::new(limits(100, 100, 2, 4, 0), now);
        for _ in 0..4 {
            drop(admission.admit(ip("198.51.100.7"), now).unwrap());
        }
        assert_eq!(admission.admit(ip("198.51.100.7"), now).err(), Some(Refusal::AddressRate));
        assert!(admission.admit(ip("198.51.100.8"), now).is_ok(), "rates are per address");
        let later = now + Duration::from_millis(500);
        assert!(admission.admit(ip("198.51.100.7"), later).is_ok(), "one token after 0.5 s at 2/s");
        assert_eq!(admission.admit(ip("198.51.100.7"), later).err(), Some(Refusal::AddressRate));
    }

    #[test]
    fn trusted_proxies_are_exempt_from_the_per_address_limits() {
        let now = Instant::now();
        let mut limits = limits(10, 1, 100, 100, 0);
        limits.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
        let admission = Admission::new(limits, now);
        let held: Vec<_> = (0..5).map(|_| admission.admit(ip("10.1.2.3"), now).unwrap()).collect();
        let _one = admission.admit(ip("192.0.2.1"), now).unwrap();
        assert_eq!(admission.admit(ip("192.0.2.1"), now).err(), Some(Refusal::AddressCap));
        drop(held);
    }

    #[test]
    fn when_the_shared_slots_are_full_the_longest_waiting_connection_is_evicted() {
        let now = Instant::now();
        // 4 slots, 1 reserved: 3 shared.
        let admission = Admission::new(limits(4, 10, 100, 100, 1), now);
        let [first, second, third] = tickets(&admission, now, false);
        // The first is busy with a request (say, an event stream): never evicted.
        first.busy();
        let fourth = admission.admit(ip("192.0.2.4"), now).unwrap();
        assert!(second.evict.is_cancelled(), "the longest-waiting one made room");
        assert!(!first.evict.is_cancelled() && !third.evict.is_cancelled());
        assert!(!fourth.on_probation());
        assert_eq!(admission.open(), (3, 0));
        drop(second);
        assert_eq!(admission.open(), (3, 0), "an evicted ticket frees nothing twice");
        drop((first, third, fourth));
        assert_eq!(admission.open(), (0, 0));
    }

    /// `N` connections from 192.0.2.1.., each busy with a request when `busy`.
    fn tickets<const N: usize>(
        admission: &Arc<Admission>,
        now: Instant,
        busy: bool,
    ) -> [Ticket; N] {
        std::array::from_fn(|i| {
            let ticket = admission.admit(ip(&format!("192.0.2.{}", i + 1)), now).unwrap();
            if busy {
                ticket.busy();
            }
            ticket
        })
    }

    #[test]
    fn a_data_plane_upgrade_moves_into_the_reserved_slots_and_is_never_evicted() {
        let now = Instant::now();
        let admission = Admission::new(limits(4, 10, 100, 100, 1), now);
        let xagent = admission.admit(ip("192.0.2.9"), now).unwrap();
        xagent.busy();
        xagent.promote();
        assert_eq!(admission.open(), (0, 1));
        // The shared slots fill with busy requests; the next one finds nobody waiting and
        // nothing free: refused. The data plane is untouched.
        let busy: [_; 3] = tickets(&admission, now, true);
        assert_eq!(admission.admit(ip("192.0.2.5"), now).err(), Some(Refusal::Full));
        assert!(!xagent.evict.is_cancelled());
        drop(busy);
        drop(xagent);
        assert_eq!(admission.open(), (0, 0));
    }

    #[test]
    fn a_new_connection_gets_a_reserved_slot_on_probation_when_nobody_waits() {
        let now = Instant::now();
        let admission = Admission::new(limits(4, 10, 100, 100, 1), now);
        let busy: [_; 3] = tickets(&admission, now, true);
        let newcomer = admission.admit(ip("192.0.2.9"), now).unwrap();
        assert!(newcomer.on_probation());
        newcomer.busy();
        newcomer.promote();
        assert!(!newcomer.on_probation());
        assert_eq!(admission.open(), (3, 1));
        drop(busy);
        drop(newcomer);
    }

    #[test]
    fn a_finished_request_makes_the_connection_evictable_again() {
        let now = Instant::now();
        let admission = Admission::new(limits(2, 10, 100, 100, 0), now);
        let [a, b] = tickets(&admission, now, true);
        a.done();
        let _c = admission.admit(ip("192.0.2.3"), now).unwrap();
        assert!(a.evict.is_cancelled(), "the idle keep-alive made room");
        assert!(!b.evict.is_cancelled());
    }

    #[test]
    fn refusals_are_summarised_at_most_once_per_report_interval() {
        let start = Instant::now();
        let admission = Admission::new(limits(10, 1, 100, 100, 0), start);
        let _held = admission.admit(ip("127.0.0.2"), start).unwrap();
        for n in 0..1_000u64 {
            let now = start + Duration::from_millis(n * 5);
            assert_eq!(admission.admit(ip("127.0.0.2"), now).err(), Some(Refusal::AddressCap));
        }
        assert_eq!(admission.lock().reports, 0, "5 s of refusals: not yet reported");
        let later = start + REPORT_EVERY;
        assert!(admission.admit(ip("127.0.0.2"), later).is_err());
        assert_eq!(admission.lock().reports, 1, "one summary for 1,001 refusals");
        assert!(admission.admit(ip("127.0.0.2"), later + Duration::from_secs(1)).is_err());
        assert_eq!(admission.lock().reports, 1);
    }

    #[test]
    fn per_address_entries_are_forgotten_once_idle_and_refilled() {
        let now = Instant::now();
        let admission = Admission::new(limits(10, 10, 10, 10, 0), now);
        for n in 0..50u32 {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0xc000_0200 + n));
            drop(admission.admit(ip, now).unwrap());
        }
        assert_eq!(admission.lock().groups.len(), 50);
        let later = now + Duration::from_secs(2);
        let _kept = admission.admit(ip("203.0.113.1"), later).unwrap();
        assert_eq!(admission.lock().groups.len(), 1, "only the open one is left");
    }
}
