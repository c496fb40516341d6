//! The receiver's idempotency set: which `message_id`s of a channel have already been
//! processed, so a redelivery returns `duplicate` without a second side effect and a reused id
//! with different content is refused with `message_conflict`.
//!
//! Two-phase: [`ReceiverIdempotency::begin`] admits a message and hands out a [`Ticket`]; the
//! caller performs the target-side effect (post to the IM, hand to the Brain) and only then
//! calls [`ReceiverIdempotency::complete`], which records the id durably and returns the
//! `accepted` ack. A failed effect is reported with [`ReceiverIdempotency::abandon`], which
//! records nothing, so a retryable redelivery is processed again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use xagent_protocol_types::{
    ChatMessage, ChatMessageAck, ConnectorChannelId, ErrorCode, MessageId,
};

use crate::store::{CompletedRecord, IdempotencyStore, IdempotencyWrite, MemoryStore};
use crate::{Fingerprint, IdempotencyError};

/// Default number of completed ids remembered per channel.
pub const DEFAULT_IDEMPOTENCY_CAPACITY: usize = 10_000;
/// Default age after which a completed id is forgotten: 24 h, well beyond a sender's 1 h TTL
/// plus backoff, so every redelivery a conforming sender can make is still recognised.
pub const DEFAULT_IDEMPOTENCY_MAX_AGE_MS: u64 = 24 * 60 * 60 * 1000;
/// Default time after which an admitted but never completed message is forgotten.
pub const DEFAULT_IN_PROGRESS_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// Bounds of the idempotency set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdempotencyConfig {
    /// Completed ids per channel; the oldest is forgotten first.
    pub capacity_per_channel: usize,
    /// Age after which a completed id is forgotten.
    pub max_age_ms: u64,
    /// Age after which an unfinished admission is forgotten (the caller crashed or lost it).
    pub in_progress_timeout_ms: u64,
}

impl Default for IdempotencyConfig {
    /// 10,000 ids per channel, 24 h, 10 min.
    fn default() -> Self {
        Self {
            capacity_per_channel: DEFAULT_IDEMPOTENCY_CAPACITY,
            max_age_ms: DEFAULT_IDEMPOTENCY_MAX_AGE_MS,
            in_progress_timeout_ms: DEFAULT_IN_PROGRESS_TIMEOUT_MS,
        }
    }
}

/// Permission to perform the side effect of one admitted message. Give it back to
/// [`ReceiverIdempotency::complete`] or [`ReceiverIdempotency::abandon`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "complete or abandon the ticket, otherwise the message stays in progress"]
pub struct Ticket {
    channel: ConnectorChannelId,
    message_id: MessageId,
    fingerprint: Fingerprint,
}

impl Ticket {
    /// The channel.
    pub fn channel(&self) -> &ConnectorChannelId {
        &self.channel
    }
    /// The message.
    pub fn message_id(&self) -> &MessageId {
        &self.message_id
    }
}

/// The verdict of [`ReceiverIdempotency::begin`].
#[derive(Debug, PartialEq)]
pub enum Admission {
    /// First time: perform the side effect, then complete the ticket.
    Process(Ticket),
    /// Already completed with the same content: send this `duplicate` ack, do nothing else.
    Duplicate(ChatMessageAck),
    /// Same id, different content: send this `rejected` / `message_conflict` /
    /// `retryable: false` ack, do nothing else.
    Conflict(ChatMessageAck),
    /// The same message is being processed right now: send this `rejected` / `channel_busy` /
    /// `retryable: true` ack, so the sender retries after backoff and then gets `duplicate`.
    InProgress(ChatMessageAck),
}

/// A fingerprint as kept in memory: 32 bytes instead of its 64-character hex string. A
/// fingerprint that is not 64 lowercase hex digits (only a foreign store would hold one) is
/// kept as the SHA-256 of its text, so equal strings stay equal. The stored form is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Digest([u8; 32]);

impl Digest {
    fn of(fingerprint: &Fingerprint) -> Self {
        let hex = fingerprint.as_str();
        let mut bytes = [0u8; 32];
        let lowercase = hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if hex.len() == 64 && lowercase && hex::decode_to_slice(hex, &mut bytes).is_ok() {
            return Self(bytes);
        }
        Self(Sha256::digest(hex.as_bytes()).into())
    }
}

/// One channel's ids. A completed id is held once (`Arc<str>`, shared by the map key and the
/// age queue), with its fingerprint as 32 bytes: about 140 bytes per remembered id instead
/// of 250 (two `String` copies of the id and a hex `String` fingerprint).
#[derive(Debug, Default)]
struct ChannelSet {
    completed: HashMap<Arc<str>, (Digest, u64)>,
    order: VecDeque<Arc<str>>,
    in_progress: HashMap<MessageId, (Digest, u64)>,
}

impl ChannelSet {
    /// Records a completed id (oldest first in `order`); false when it was already there.
    fn remember(&mut self, message_id: &MessageId, digest: Digest, at: u64) -> bool {
        if let Some(known) = self.completed.get_mut(message_id.as_str()) {
            *known = (digest, at);
            return false;
        }
        let id: Arc<str> = Arc::from(message_id.as_str());
        self.completed.insert(Arc::clone(&id), (digest, at));
        self.order.push_back(id);
        true
    }

    /// Forgets the oldest completed id; returns it.
    fn forget_oldest(&mut self) -> Option<MessageId> {
        let id = self.order.pop_front()?;
        self.completed.remove(&id);
        Some(MessageId::new(&*id))
    }
}

/// Counters of the idempotency set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdempotencyStats {
    /// Completed ids remembered over all channels.
    pub remembered: usize,
    /// Admissions in progress.
    pub in_progress: usize,
    /// Messages completed.
    pub completed: u64,
    /// Duplicates answered.
    pub duplicates: u64,
    /// Conflicts answered.
    pub conflicts: u64,
    /// Ids forgotten because of the capacity bound.
    pub evicted_capacity: u64,
    /// Ids forgotten because of the age bound.
    pub evicted_age: u64,
}

/// The receiver-side idempotency set, persisted through an [`IdempotencyStore`].
#[derive(Debug)]
pub struct ReceiverIdempotency<S: IdempotencyStore = MemoryStore> {
    config: IdempotencyConfig,
    store: S,
    channels: BTreeMap<ConnectorChannelId, ChannelSet>,
    stats: IdempotencyStats,
}

impl<S: IdempotencyStore> ReceiverIdempotency<S> {
    /// Opens the set over a store, loading the completed ids (restart) and dropping those past
    /// the age bound.
    pub fn open(
        config: IdempotencyConfig,
        mut store: S,
        now: u64,
    ) -> Result<Self, IdempotencyError> {
        let mut records = store.load_completed()?;
        records.sort_by_key(|r| r.completed_at);
        let mut set =
            Self { config, store, channels: BTreeMap::new(), stats: IdempotencyStats::default() };
        for r in records {
            let ch = set.channels.entry(r.channel).or_default();
            ch.remember(&r.message_id, Digest::of(&r.fingerprint), r.completed_at);
        }
        set.prune(now)?;
        Ok(set)
    }

    /// Admits a `chat.message` (see [`ReceiverIdempotency::begin`]).
    pub fn begin_chat(
        &mut self,
        channel: &ConnectorChannelId,
        message: &ChatMessage,
        now: u64,
    ) -> Result<Admission, IdempotencyError> {
        let fingerprint = Fingerprint::of_chat_message(message);
        self.begin(channel, &message.message_id, fingerprint, now)
    }

    /// Admits a message by id and content fingerprint. Only `message_id` decides identity;
    /// the fingerprint only separates a duplicate from a conflict.
    pub fn begin(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        fingerprint: Fingerprint,
        now: u64,
    ) -> Result<Admission, IdempotencyError> {
        self.prune_channel(channel, now)?;
        let ch = self.channels.entry(channel.clone()).or_default();
        let digest = Digest::of(&fingerprint);
        let completed = ch.completed.get(message_id.as_str());
        let known = completed.or_else(|| ch.in_progress.get(message_id));
        if let Some((known_fp, _)) = known {
            if *known_fp != digest {
                self.stats.conflicts += 1;
                return Ok(Admission::Conflict(ChatMessageAck::rejected(
                    message_id.clone(),
                    ErrorCode::MessageConflict,
                    "this message_id was already used with different content",
                    false,
                )));
            }
            if completed.is_some() {
                self.stats.duplicates += 1;
                return Ok(Admission::Duplicate(ChatMessageAck::duplicate(message_id.clone())));
            }
            return Ok(Admission::InProgress(ChatMessageAck::rejected(
                message_id.clone(),
                ErrorCode::ChannelBusy,
                "this message is still being processed; retry later",
                true,
            )));
        }
        ch.in_progress.insert(message_id.clone(), (digest, now));
        Ok(Admission::Process(Ticket {
            channel: channel.clone(),
            message_id: message_id.clone(),
            fingerprint,
        }))
    }

    /// The side effect is done: records the id (store first, one batch with the ids it
    /// evicts for capacity) and returns the `accepted` ack. If the store fails the id is still
    /// remembered in memory (the effect happened, a repeat in this process must stay a
    /// duplicate) and the error is returned for the caller to log; the caller should still
    /// send `accepted`.
    pub fn complete(
        &mut self,
        ticket: Ticket,
        now: u64,
    ) -> Result<ChatMessageAck, IdempotencyError> {
        let (ack, writes) = self.complete_deferred(ticket, now);
        self.store.apply(&writes)?;
        Ok(ack)
    }

    /// [`ReceiverIdempotency::complete`] without touching the store: returns the ack and the
    /// writes that record it. The caller commits the writes (grouped with other work) and
    /// sends the ack only after that commit succeeded, so a crash never leaves an `accepted`
    /// ack whose id the restarted receiver does not know.
    pub fn complete_deferred(
        &mut self,
        ticket: Ticket,
        now: u64,
    ) -> (ChatMessageAck, Vec<IdempotencyWrite>) {
        let Ticket { channel, message_id, fingerprint } = ticket;
        let mut writes = vec![IdempotencyWrite::Save(CompletedRecord {
            channel: channel.clone(),
            message_id: message_id.clone(),
            fingerprint: fingerprint.clone(),
            completed_at: now,
        })];
        let ch = self.channels.entry(channel.clone()).or_default();
        ch.in_progress.remove(&message_id);
        ch.remember(&message_id, Digest::of(&fingerprint), now);
        self.stats.completed += 1;
        let capacity = self.config.capacity_per_channel.max(1);
        while ch.order.len() > capacity {
            let Some(oldest) = ch.forget_oldest() else { break };
            self.stats.evicted_capacity += 1;
            writes.push(IdempotencyWrite::Delete(channel.clone(), oldest));
        }
        (ChatMessageAck::accepted(message_id), writes)
    }

    /// The side effect failed: nothing is recorded and the `rejected` ack is returned. Use
    /// `retryable: true` for temporary failures (rate limit, network, busy) and `false` for
    /// deterministic ones (invalid payload, permission denied, target refused).
    pub fn abandon(
        &mut self,
        ticket: Ticket,
        code: ErrorCode,
        message: impl Into<String>,
        retryable: bool,
    ) -> ChatMessageAck {
        if let Some(ch) = self.channels.get_mut(&ticket.channel) {
            ch.in_progress.remove(&ticket.message_id);
        }
        ChatMessageAck::rejected(ticket.message_id, code, message, retryable)
    }

    /// True when the id is remembered as completed on the channel.
    pub fn is_completed(&self, channel: &ConnectorChannelId, message_id: &MessageId) -> bool {
        self.channels.get(channel).is_some_and(|ch| ch.completed.contains_key(message_id.as_str()))
    }

    /// Forgets completed ids past the age bound and stale admissions, on every channel.
    pub fn prune(&mut self, now: u64) -> Result<(), IdempotencyError> {
        let ids: Vec<ConnectorChannelId> = self.channels.keys().cloned().collect();
        for id in ids {
            self.prune_channel(&id, now)?;
        }
        Ok(())
    }

    /// The channel was permanently deleted: forget all its state.
    pub fn remove_channel(&mut self, channel: &ConnectorChannelId) -> Result<(), IdempotencyError> {
        if let Some(ch) = self.channels.get_mut(channel) {
            while let Some(id) = ch.order.front() {
                self.store.delete_completed(channel, &MessageId::new(&**id))?;
                ch.forget_oldest();
            }
        }
        self.channels.remove(channel);
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> IdempotencyStats {
        IdempotencyStats {
            remembered: self.channels.values().map(|c| c.completed.len()).sum(),
            in_progress: self.channels.values().map(|c| c.in_progress.len()).sum(),
            ..self.stats.clone()
        }
    }

    /// The bounds in force.
    pub fn config(&self) -> &IdempotencyConfig {
        &self.config
    }

    fn prune_channel(
        &mut self,
        channel: &ConnectorChannelId,
        now: u64,
    ) -> Result<(), IdempotencyError> {
        let Some(ch) = self.channels.get_mut(channel) else { return Ok(()) };
        let max_age = self.config.max_age_ms;
        while let Some(front) = ch.order.front() {
            let old =
                ch.completed.get(front).is_none_or(|(_, at)| now.saturating_sub(*at) >= max_age);
            if !old {
                break;
            }
            self.store.delete_completed(channel, &MessageId::new(&**front))?;
            if ch.forget_oldest().is_some() {
                self.stats.evicted_age += 1;
            }
        }
        let timeout = self.config.in_progress_timeout_ms;
        ch.in_progress.retain(|_, (_, at)| now.saturating_sub(*at) < timeout);
        Ok(())
    }
}

impl ReceiverIdempotency<MemoryStore> {
    /// A set over a fresh in-memory store.
    pub fn in_memory(config: IdempotencyConfig) -> Self {
        Self {
            config,
            store: MemoryStore::new(),
            channels: BTreeMap::new(),
            stats: IdempotencyStats::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hex_fingerprint_is_kept_as_its_32_bytes_and_other_text_stays_distinct() {
        let real = Fingerprint::of_value(&serde_json::json!({"text": "hi"}));
        let digest = Digest::of(&real);
        let mut expected = [0u8; 32];
        hex::decode_to_slice(real.as_str(), &mut expected).expect("64 hex digits");
        assert_eq!(digest, Digest(expected));
        assert_eq!(digest, Digest::of(&Fingerprint::from_hex(real.as_str())));
        // Not a lowercase SHA-256 hex: compared as text, through its own hash.
        let upper = Fingerprint::from_hex(real.as_str().to_uppercase());
        assert_ne!(Digest::of(&upper), digest, "different strings stay different");
        assert_eq!(
            Digest::of(&Fingerprint::from_hex("ab")),
            Digest::of(&Fingerprint::from_hex("ab"))
        );
        assert_ne!(
            Digest::of(&Fingerprint::from_hex("ab")),
            Digest::of(&Fingerprint::from_hex("ac"))
        );
    }

    #[test]
    fn a_completed_id_is_held_once_for_the_map_and_the_age_queue() {
        let mut set = ReceiverIdempotency::in_memory(IdempotencyConfig::default());
        let channel = ConnectorChannelId::new("cch_1");
        let message = ChatMessage::text(MessageId::new("m_1"), "hi");
        let Admission::Process(ticket) = set.begin_chat(&channel, &message, 1).expect("admits")
        else {
            panic!("a first message is processed");
        };
        set.complete(ticket, 2).expect("completes");
        let ch = &set.channels[&channel];
        let (key, _) = ch.completed.get_key_value("m_1").expect("remembered");
        assert!(Arc::ptr_eq(key, &ch.order[0]), "one allocation for the id");
        // Still a duplicate with the same content and a conflict with other content.
        assert!(matches!(set.begin_chat(&channel, &message, 3), Ok(Admission::Duplicate(_))));
        let other = ChatMessage::text(MessageId::new("m_1"), "changed");
        assert!(matches!(set.begin_chat(&channel, &other, 3), Ok(Admission::Conflict(_))));
    }
}
