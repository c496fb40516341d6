//! Model-based property test of the outbox: random interleavings of enqueues, sends, acks of
//! every status, write failures, timeouts, disconnects, channel close/reopen, restarts and
//! clock jumps (forwards and backwards), under both overflow policies, checked against a small
//! reference model:
//!
//! - no message is lost before its expiry (it stays pending until a terminal ack or a recorded
//!   capacity eviction, and is never evicted while in flight);
//! - none is handed out at or after its expiry;
//! - none is delivered twice, and none is handed out after it ended;
//! - at most `window` messages per channel are in flight (1 by default; also run with 3), and
//!   a message is never handed out while an older one of its channel waits (first
//!   transmissions in order, and nothing not yet sent overtakes a message in backoff).

use proptest::prelude::*;
use xagent_profile_im::{
    AckOutcome, EnqueueOutcome, MemoryStore, Outbox, OutboxConfig, OutboxError, OutboxStore,
    OverflowPolicy, RetryOutcome, SentOutcome, WriteMode,
};
use xagent_protocol_types::{
    ChatMessage, ChatMessageAck, ConnectorChannelId, ErrorCode, MessageId, PacketId, Side,
};

const T0: u64 = 1_790_000_000_000;
const TTL: u64 = 10 * 60_000;
const CAPACITY: usize = 4;
const CHANNELS: usize = 3;

#[derive(Clone, Debug)]
enum AckKind {
    Accepted,
    Duplicate,
    RetryableReject,
    FinalReject,
}

#[derive(Clone, Debug)]
enum Which {
    Latest,
    Oldest,
    Bogus,
}

#[derive(Clone, Debug)]
enum Op {
    Enqueue(usize),
    Send,
    SendFail,
    /// The ack overtakes `on_sent`.
    SendAckedEarly,
    Ack(usize, AckKind, Which),
    PollTimeouts,
    Disconnect,
    Close(usize),
    Reopen(usize),
    Restart,
    Maintain,
    Advance(u64),
    Jump(u64),
    Back(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        Just(AckKind::Accepted),
        Just(AckKind::Duplicate),
        Just(AckKind::RetryableReject),
        Just(AckKind::FinalReject),
    ];
    let which =
        prop_oneof![4 => Just(Which::Latest), 1 => Just(Which::Oldest), 1 => Just(Which::Bogus)];
    prop_oneof![
        4 => (0..CHANNELS).prop_map(Op::Enqueue),
        5 => Just(Op::Send),
        1 => Just(Op::SendFail),
        1 => Just(Op::SendAckedEarly),
        5 => (0..64usize, kind, which).prop_map(|(i, k, w)| Op::Ack(i, k, w)),
        2 => Just(Op::PollTimeouts),
        1 => Just(Op::Disconnect),
        1 => (0..CHANNELS).prop_map(Op::Close),
        2 => (0..CHANNELS).prop_map(Op::Reopen),
        1 => Just(Op::Restart),
        1 => Just(Op::Maintain),
        4 => (0..40_000u64).prop_map(Op::Advance),
        1 => (0..TTL).prop_map(Op::Jump),
        1 => (0..60_000u64).prop_map(Op::Back),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Pending,
    Delivered,
    Failed,
    Expired,
    Evicted,
}

#[derive(Debug)]
struct ModelMsg {
    channel: ConnectorChannelId,
    id: MessageId,
    seq: usize,
    expires_at: u64,
    fate: Fate,
    /// Packets sent since the last restart (acks for them are recognised).
    packets: Vec<PacketId>,
    /// The packet in flight, if any.
    current: Option<PacketId>,
}

struct Harness {
    store: MemoryStore,
    outbox: Outbox,
    config: OutboxConfig,
    now: u64,
    msgs: Vec<ModelMsg>,
    /// Handed out by next_ready but not yet written.
    unsent: Vec<usize>,
    next_packet: u64,
    /// Deliveries counted by outboxes dropped at a restart (counters live in memory).
    delivered_before_restarts: u64,
}

fn channel(i: usize) -> ConnectorChannelId {
    ConnectorChannelId::new(format!("c{i}"))
}

impl Harness {
    fn new(overflow: OverflowPolicy, write_mode: WriteMode, window: usize) -> Self {
        let mut config = OutboxConfig::new(Side::Xagent);
        config.window = window;
        config.overflow = overflow;
        config.write_mode = write_mode;
        config.ttl_ms = TTL;
        config.capacity_per_channel = CAPACITY;
        let store = MemoryStore::new();
        let outbox = Outbox::open(config, store.clone(), T0).unwrap();
        Self {
            store,
            outbox,
            config,
            now: T0,
            msgs: Vec::new(),
            unsent: Vec::new(),
            next_packet: 0,
            delivered_before_restarts: 0,
        }
    }

    fn index(&self, channel: &ConnectorChannelId, id: &MessageId) -> usize {
        self.msgs.iter().position(|m| &m.channel == channel && &m.id == id).unwrap()
    }

    fn clear_in_flight(&mut self) {
        for m in &mut self.msgs {
            m.current = None;
        }
        self.unsent.clear();
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Enqueue(c) => {
                let seq = self.msgs.len();
                let id = MessageId::new(format!("m{seq}"));
                let ch = channel(c);
                let live =
                    self.msgs.iter().filter(|m| m.channel == ch && m.fate == Fate::Pending).count();
                match self.outbox.enqueue(&ch, ChatMessage::text(id.clone(), "x"), self.now) {
                    Ok(outcome) => {
                        if let EnqueueOutcome::Queued { evicted: Some(victim), .. } = outcome {
                            prop_assert!(live >= CAPACITY, "evicted below capacity");
                            let v = self.index(&ch, &victim);
                            prop_assert!(self.msgs[v].current.is_none(), "evicted in flight");
                            prop_assert!(self.msgs[v].fate == Fate::Pending, "evicted twice");
                            self.msgs[v].fate = Fate::Evicted;
                        }
                        self.msgs.push(ModelMsg {
                            channel: ch,
                            id,
                            seq,
                            expires_at: self.now + TTL,
                            fate: Fate::Pending,
                            packets: Vec::new(),
                            current: None,
                        });
                    }
                    Err(OutboxError::CapacityExceeded { .. }) => {
                        // Only when the channel really holds CAPACITY unfinished messages.
                        prop_assert!(live >= CAPACITY, "refused below capacity");
                    }
                    Err(e) => prop_assert!(false, "enqueue failed: {e}"),
                }
            }
            Op::Send | Op::SendFail | Op::SendAckedEarly => {
                let deliveries = self.outbox.next_ready(self.now).unwrap();
                // Judge the whole pass against the state before it (a failed write below
                // makes a message wait again, after later ones of the pass were handed out).
                let window = self.config.window.max(1);
                let mut handed: Vec<usize> = Vec::new();
                for d in &deliveries {
                    let i = self.index(&d.channel, &d.message_id);
                    let m = &self.msgs[i];
                    prop_assert!(self.now < m.expires_at, "handed out at/after expiry");
                    prop_assert_eq!(d.expires_at, m.expires_at, "TTL changed");
                    prop_assert_eq!(m.fate, Fate::Pending, "handed out after it ended");
                    prop_assert!(!handed.contains(&i), "handed out twice in one pass");
                    let in_flight = self
                        .msgs
                        .iter()
                        .enumerate()
                        .filter(|(j, o)| {
                            o.channel == d.channel
                                && o.fate == Fate::Pending
                                && (o.current.is_some()
                                    || self.unsent.contains(j)
                                    || handed.contains(j))
                        })
                        .count();
                    prop_assert!(in_flight < window, "more than the window in flight");
                    let older_waiting = self.msgs.iter().enumerate().any(|(j, o)| {
                        o.channel == d.channel
                            && o.seq < m.seq
                            && o.fate == Fate::Pending
                            && o.expires_at > self.now
                            && o.current.is_none()
                            && !self.unsent.contains(&j)
                            && !handed.contains(&j)
                    });
                    prop_assert!(!older_waiting, "overtook an older waiting message");
                    handed.push(i);
                }
                for d in deliveries {
                    let i = self.index(&d.channel, &d.message_id);
                    if matches!(op, Op::SendAckedEarly) {
                        self.next_packet += 1;
                        let p = PacketId::new(format!("p{}", self.next_packet));
                        let ack = ChatMessageAck::accepted(d.message_id.clone());
                        let early = self.outbox.on_ack(&d.channel, &ack, &p, self.now).unwrap();
                        prop_assert_eq!(early, AckOutcome::Deferred);
                        let sent = self.outbox.on_sent(&d.channel, &d.message_id, p, self.now);
                        prop_assert!(
                            matches!(sent, Ok(SentOutcome::Acked(AckOutcome::Delivered { .. }))),
                            "{:?}",
                            sent
                        );
                        self.msgs[i].fate = Fate::Delivered;
                    } else if matches!(op, Op::SendFail) {
                        self.outbox
                            .on_send_failed(&d.channel, &d.message_id, "io", self.now)
                            .unwrap();
                    } else {
                        self.next_packet += 1;
                        let p = PacketId::new(format!("p{}", self.next_packet));
                        self.outbox
                            .on_sent(&d.channel, &d.message_id, p.clone(), self.now)
                            .unwrap();
                        let m = &mut self.msgs[i];
                        m.packets.push(p.clone());
                        m.current = Some(p);
                    }
                }
            }
            Op::Ack(i, kind, which) => {
                if self.msgs.is_empty() {
                    return Ok(());
                }
                let i = i % self.msgs.len();
                let m = &self.msgs[i];
                let packet = match which {
                    Which::Latest => m.packets.last().cloned(),
                    Which::Oldest => m.packets.first().cloned(),
                    Which::Bogus => Some(PacketId::new("bogus")),
                };
                let Some(packet) = packet else { return Ok(()) };
                let ack = match kind {
                    AckKind::Accepted => ChatMessageAck::accepted(m.id.clone()),
                    AckKind::Duplicate => ChatMessageAck::duplicate(m.id.clone()),
                    AckKind::RetryableReject => {
                        ChatMessageAck::rejected(m.id.clone(), ErrorCode::ChannelBusy, "busy", true)
                    }
                    AckKind::FinalReject => ChatMessageAck::rejected(
                        m.id.clone(),
                        ErrorCode::TargetDeliveryFailed,
                        "no",
                        false,
                    ),
                };
                let known = m.packets.contains(&packet);
                let is_current = m.current.as_ref() == Some(&packet);
                let channel = m.channel.clone();
                let out = self.outbox.on_ack(&channel, &ack, &packet, self.now).unwrap();
                let m = &mut self.msgs[i];
                if m.fate != Fate::Pending {
                    prop_assert!(
                        matches!(out, AckOutcome::Ignored(_)),
                        "ended message changed: {out:?}"
                    );
                    return Ok(());
                }
                if !known {
                    prop_assert!(matches!(out, AckOutcome::Ignored(_)), "unknown packet acted on");
                    return Ok(());
                }
                if let AckOutcome::Ignored(_) = out
                    && !self.outbox.is_pending(&channel, &m.id)
                {
                    // Only a message past its expiry may have vanished.
                    prop_assert!(m.expires_at <= self.now, "message lost before expiry");
                    m.fate = Fate::Expired;
                    return Ok(());
                }
                match kind {
                    AckKind::Accepted | AckKind::Duplicate => {
                        prop_assert!(matches!(out, AckOutcome::Delivered { .. }), "{out:?}");
                        m.fate = Fate::Delivered;
                        m.current = None;
                    }
                    AckKind::FinalReject => {
                        prop_assert!(matches!(out, AckOutcome::Failed { .. }), "{out:?}");
                        m.fate = Fate::Failed;
                        m.current = None;
                    }
                    AckKind::RetryableReject if is_current => {
                        prop_assert!(matches!(out, AckOutcome::Retry(_)), "{out:?}");
                        if out == AckOutcome::Retry(RetryOutcome::Expired) {
                            m.fate = Fate::Expired;
                        }
                        m.current = None;
                    }
                    AckKind::RetryableReject => {
                        prop_assert!(matches!(out, AckOutcome::Ignored(_)), "{out:?}");
                    }
                }
            }
            Op::PollTimeouts => self.apply_timeouts()?,
            Op::Disconnect => {
                self.outbox.on_disconnect(self.now).unwrap();
                self.clear_in_flight();
            }
            Op::Close(c) => {
                self.outbox.on_channel_closed(&channel(c), self.now).unwrap();
                for m in self.msgs.iter_mut().filter(|m| m.channel == channel(c)) {
                    m.current = None;
                }
            }
            Op::Reopen(c) => self.outbox.on_channel_reopened(&channel(c), self.now).unwrap(),
            Op::Restart => {
                let totals = self.outbox.stats().totals;
                self.delivered_before_restarts += totals.delivered + totals.duplicates;
                self.outbox = Outbox::open(self.config, self.store.clone(), self.now).unwrap();
                self.clear_in_flight();
                for m in &mut self.msgs {
                    m.packets.clear();
                }
            }
            Op::Maintain => {
                // `maintain` runs the ack timeouts first; taking them here tells the model
                // which transmissions ended.
                self.apply_timeouts()?;
                self.outbox.maintain(self.now).unwrap();
            }
            Op::Advance(ms) | Op::Jump(ms) => self.now += ms,
            Op::Back(ms) => self.now = self.now.saturating_sub(ms).max(T0),
        }
        // Deferred writes: the runtime commits what each call collected before it acts on it
        // (here after every operation, so a restart sees everything that was acknowledged).
        let writes = self.outbox.take_writes();
        if !writes.is_empty() {
            OutboxStore::apply(&mut self.store.clone(), &writes).unwrap();
        }
        self.check()
    }

    fn apply_timeouts(&mut self) -> Result<(), TestCaseError> {
        for (c, id, outcome) in self.outbox.poll_timeouts(self.now).unwrap() {
            let i = self.index(&c, &id);
            prop_assert!(self.msgs[i].current.is_some(), "timed out while not in flight");
            self.msgs[i].current = None;
            self.unsent.retain(|u| *u != i);
            if outcome == RetryOutcome::Expired {
                self.msgs[i].fate = Fate::Expired;
            }
        }
        Ok(())
    }

    fn check(&mut self) -> Result<(), TestCaseError> {
        for m in &mut self.msgs {
            let pending = self.outbox.is_pending(&m.channel, &m.id);
            match m.fate {
                Fate::Pending if !pending => {
                    prop_assert!(m.expires_at <= self.now, "{} lost before expiry", m.id);
                    m.fate = Fate::Expired;
                    m.current = None;
                }
                Fate::Delivered | Fate::Failed | Fate::Expired | Fate::Evicted => {
                    prop_assert!(!pending, "{} pending again after it ended", m.id);
                }
                Fate::Pending => {
                    let r = self.outbox.record(&m.channel, &m.id).unwrap();
                    prop_assert_eq!(r.expires_at, m.expires_at, "TTL extended");
                    let stored = self.store.pending(&m.channel, &m.id);
                    prop_assert!(stored.is_some(), "pending message missing from the store");
                }
            }
        }
        let stats = self.outbox.stats();
        let delivered = self.msgs.iter().filter(|m| m.fate == Fate::Delivered).count() as u64;
        prop_assert_eq!(
            self.delivered_before_restarts + stats.totals.delivered + stats.totals.duplicates,
            delivered,
            "delivery counted without a terminal ack"
        );
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn outbox_matches_reference_model(ops in proptest::collection::vec(op(), 1..80)) {
        run(ops, OverflowPolicy::RejectNew)?;
    }

    #[test]
    fn outbox_with_eviction_matches_reference_model(ops in proptest::collection::vec(op(), 1..80)) {
        run(ops, OverflowPolicy::EvictOldest)?;
    }

    #[test]
    fn deferred_writes_outbox_matches_reference_model(ops in proptest::collection::vec(op(), 1..80)) {
        run_with(ops, OverflowPolicy::RejectNew, WriteMode::Deferred, 1)?;
    }

    #[test]
    fn windowed_outbox_matches_reference_model(ops in proptest::collection::vec(op(), 1..80)) {
        run_with(ops, OverflowPolicy::RejectNew, WriteMode::Through, 3)?;
    }

    #[test]
    fn windowed_outbox_with_eviction_and_deferred_writes_matches_reference_model(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        run_with(ops, OverflowPolicy::EvictOldest, WriteMode::Deferred, 3)?;
    }
}

fn run(ops: Vec<Op>, overflow: OverflowPolicy) -> Result<(), TestCaseError> {
    run_with(ops, overflow, WriteMode::Through, 1)
}

fn run_with(
    ops: Vec<Op>,
    overflow: OverflowPolicy,
    mode: WriteMode,
    window: usize,
) -> Result<(), TestCaseError> {
    let mut h = Harness::new(overflow, mode, window);
    for op in ops {
        h.apply(op)?;
    }
    // Drain: keep the transport healthy and accept everything; every message ends as
    // delivered or (only past its TTL) expired, never lost.
    for c in 0..CHANNELS {
        h.apply(Op::Reopen(c))?;
    }
    for _ in 0..200 {
        h.apply(Op::Send)?;
        let latest: Vec<usize> = h
            .msgs
            .iter()
            .enumerate()
            .filter(|(_, m)| m.fate == Fate::Pending && m.current.is_some())
            .map(|(i, _)| i)
            .collect();
        for i in latest {
            h.apply(Op::Ack(i, AckKind::Accepted, Which::Latest))?;
        }
        h.apply(Op::Advance(30_000))?;
        h.apply(Op::PollTimeouts)?;
    }
    for m in &h.msgs {
        prop_assert!(m.fate != Fate::Pending, "{} never finished", m.id);
    }
    let stats = h.outbox.stats();
    prop_assert_eq!(stats.pending, 0);
    prop_assert_eq!(h.store.pending_len(), 0);
    let delivered = h.msgs.iter().filter(|m| m.fate == Fate::Delivered).count() as u64;
    prop_assert_eq!(
        h.delivered_before_restarts + stats.totals.delivered + stats.totals.duplicates,
        delivered
    );
    Ok(())
}
