//! The receiver's state and admission: tickets, the recent cache, and how a message id is
//! admitted, found completed or refused while in progress.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use xagent_protocol_types::{
    ChatMessage, ChatMessageAck, ConnectorChannelId, ErrorCode, MessageId,
};

use crate::fifo::FifoMap;
use crate::store::{CompletedRecord, IdempotencyStore, MemoryStore};
use crate::{Fingerprint, IdempotencyError};

use super::config::*;

/// Permission to perform the side effect of one admitted message. Give it back to
/// [`ReceiverIdempotency::complete`] or [`ReceiverIdempotency::abandon`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "complete or abandon the ticket, otherwise the message stays in progress"]
pub struct Ticket {
    pub(super) channel: ConnectorChannelId,
    pub(super) message_id: MessageId,
    pub(super) fingerprint: Fingerprint,
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
pub(super) struct Digest(pub(super) [u8; 32]);

impl Digest {
    pub(super) fn of(fingerprint: &Fingerprint) -> Self {
        let hex = fingerprint.as_str();
        let mut bytes = [0u8; 32];
        let lowercase = hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if hex.len() == 64 && lowercase && hex::decode_to_slice(hex, &mut bytes).is_ok() {
            return Self(bytes);
        }
        Self(Sha256::digest(hex.as_bytes()).into())
    }
}

pub(super) type Key = (ConnectorChannelId, MessageId);

/// One channel's admissions in progress, and its completions since the last trim.
#[derive(Debug, Default)]
pub(super) struct ChannelState {
    pub(super) in_progress: HashMap<MessageId, (Digest, u64)>,
    pub(super) since_trim: usize,
}

/// The recently completed ids, oldest first out; one allocation per id shared by the map
/// and the order.
pub(super) type RecentCache = FifoMap<Arc<Key>, (Digest, u64)>;

/// Counters of the idempotency set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdempotencyStats {
    /// Completed ids held in memory: the recent cache plus the completions not committed yet.
    pub remembered: usize,
    /// Completions whose write the caller has not reported committed yet.
    pub uncommitted: usize,
    /// Admissions in progress.
    pub in_progress: usize,
    /// Messages completed.
    pub completed: u64,
    /// Duplicates answered.
    pub duplicates: u64,
    /// Conflicts answered.
    pub conflicts: u64,
    /// Ids the memory did not hold and the store was asked for.
    pub store_lookups: u64,
    /// Ids dropped from the recent cache (still in the store).
    pub cache_evictions: u64,
    /// Capacity trims handed to the store ([`IdempotencyWrite::Trim`](crate::IdempotencyWrite::Trim)).
    pub capacity_trims: u64,
    /// Age expiries handed to the store ([`IdempotencyWrite::Expire`](crate::IdempotencyWrite::Expire)).
    pub age_expiries: u64,
}

/// The receiver-side idempotency set, persisted through an [`IdempotencyStore`].
#[derive(Debug)]
pub struct ReceiverIdempotency<S: IdempotencyStore = MemoryStore> {
    pub(super) config: IdempotencyConfig,
    pub(super) store: S,
    pub(super) channels: BTreeMap<ConnectorChannelId, ChannelState>,
    /// Completed, written (or handed out to be written), not yet reported committed: held
    /// until [`ReceiverIdempotency::committed`], because the store may not show them yet.
    pub(super) uncommitted: HashMap<Key, (Digest, u64)>,
    pub(super) recent: RecentCache,
    /// Admissions in progress when their channel was renamed: the ticket still names the old
    /// id, its completion is recorded under the new one.
    pub(super) moved_tickets: HashMap<Key, ConnectorChannelId>,
    pub(super) last_expiry: Option<u64>,
    pub(super) stats: IdempotencyStats,
}

/// Where [`ReceiverIdempotency`] gets a stored record it does not hold in memory.
pub(super) enum Lookup {
    /// Ask the synchronous store.
    Store,
    /// The caller fetched it (async backends).
    Given(Option<CompletedRecord>),
}

/// What `begin_with_stored` answers if the impossible happens (a failed lookup that was never
/// made): a retryable refusal rather than a panic.
pub(super) fn unreachable_admission(message_id: &MessageId) -> Admission {
    Admission::InProgress(ChatMessageAck::rejected(
        message_id.clone(),
        ErrorCode::ChannelBusy,
        "the receiver could not check this message_id; retry later",
        true,
    ))
}

impl ReceiverIdempotency<crate::DeferredStore> {
    /// A set driven by async code: lookups come from [`ReceiverIdempotency::needs_lookup`] +
    /// [`ReceiverIdempotency::begin_with_stored`], writes from `complete_deferred` and
    /// `prune_deferred` (call it once after opening for the first age expiry).
    pub fn deferred(config: IdempotencyConfig) -> Self {
        Self::with_store(config, crate::DeferredStore::default())
    }
}

impl<S: IdempotencyStore> ReceiverIdempotency<S> {
    /// Opens the set over a store. Nothing is loaded (the store answers lookups); the ids
    /// past the age bound are deleted from the store at once.
    pub fn open(config: IdempotencyConfig, store: S, now: u64) -> Result<Self, IdempotencyError> {
        let mut set = Self::with_store(config, store);
        set.prune(now)?;
        Ok(set)
    }

    pub(super) fn with_store(config: IdempotencyConfig, store: S) -> Self {
        Self {
            config,
            store,
            channels: BTreeMap::new(),
            uncommitted: HashMap::new(),
            recent: RecentCache::default(),
            moved_tickets: HashMap::new(),
            last_expiry: None,
            stats: IdempotencyStats::default(),
        }
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
    /// the fingerprint only separates a duplicate from a conflict. An id not in memory is
    /// looked up in the store (one point read).
    pub fn begin(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        fingerprint: Fingerprint,
        now: u64,
    ) -> Result<Admission, IdempotencyError> {
        self.admit(channel, message_id, fingerprint, Lookup::Store, now)
    }

    /// True when admitting this id needs the stored record: it is neither held in memory
    /// (uncommitted, recently completed, or in progress). A caller with an async backend
    /// fetches the record then and admits with [`ReceiverIdempotency::begin_with_stored`].
    pub fn needs_lookup(&self, channel: &ConnectorChannelId, message_id: &MessageId) -> bool {
        let key = (channel.clone(), message_id.clone());
        !(self.uncommitted.contains_key(&key)
            || self.recent.get(&key).is_some()
            || self.channels.get(channel).is_some_and(|c| c.in_progress.contains_key(message_id)))
    }

    /// Admits a `chat.message` with the record the caller fetched (see
    /// [`ReceiverIdempotency::begin_with_stored`]).
    pub fn begin_chat_with_stored(
        &mut self,
        channel: &ConnectorChannelId,
        message: &ChatMessage,
        stored: Option<CompletedRecord>,
        now: u64,
    ) -> Admission {
        let fingerprint = Fingerprint::of_chat_message(message);
        self.begin_with_stored(channel, &message.message_id, fingerprint, stored, now)
    }

    /// [`ReceiverIdempotency::begin`] for an async backend: the store is never asked; `stored`
    /// is the record the caller fetched for this id (`None` when absent, or when
    /// [`ReceiverIdempotency::needs_lookup`] said no lookup was needed). What memory holds
    /// wins over `stored`, so a completion made while the caller was fetching still counts.
    pub fn begin_with_stored(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        fingerprint: Fingerprint,
        stored: Option<CompletedRecord>,
        now: u64,
    ) -> Admission {
        match self.admit(channel, message_id, fingerprint, Lookup::Given(stored), now) {
            Ok(admission) => admission,
            // Only a store lookup can fail, and none is made here.
            Err(_) => unreachable_admission(message_id),
        }
    }

    pub(super) fn admit(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        fingerprint: Fingerprint,
        lookup: Lookup,
        now: u64,
    ) -> Result<Admission, IdempotencyError> {
        self.expire_admissions(channel, now);
        let digest = Digest::of(&fingerprint);
        let completed = self.completed_digest(channel, message_id, Some(now), lookup)?;
        let in_progress =
            || self.channels.get(channel).and_then(|c| c.in_progress.get(message_id)).map(|v| v.0);
        let known = completed.or_else(in_progress);
        if let Some(known_digest) = known {
            if known_digest != digest {
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
        let state = self.channels.entry(channel.clone()).or_default();
        state.in_progress.insert(message_id.clone(), (digest, now));
        Ok(Admission::Process(Ticket {
            channel: channel.clone(),
            message_id: message_id.clone(),
            fingerprint,
        }))
    }

    /// The digest of a completed id: from the uncommitted completions, the recent cache or
    /// the store (whose answer is then cached). With `now`, an id past the age bound counts
    /// as unknown.
    pub(super) fn completed_digest(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        now: Option<u64>,
        lookup: Lookup,
    ) -> Result<Option<Digest>, IdempotencyError> {
        let max_age = self.config.max_age_ms;
        let fresh = |at: u64| now.is_none_or(|now| now.saturating_sub(at) < max_age);
        let key = (channel.clone(), message_id.clone());
        if let Some((digest, _)) = self.uncommitted.get(&key) {
            return Ok(Some(*digest));
        }
        if let Some((digest, at)) = self.recent.get(&key).copied() {
            return Ok(fresh(at).then_some(digest));
        }
        let record = match lookup {
            Lookup::Store => {
                self.stats.store_lookups += 1;
                self.store.lookup_completed(channel, message_id)?
            }
            Lookup::Given(record) => {
                self.stats.store_lookups += 1;
                record.filter(|r| &r.channel == channel && &r.message_id == message_id)
            }
        };
        let Some(record) = record else {
            return Ok(None);
        };
        if !fresh(record.completed_at) {
            return Ok(None);
        }
        let digest = Digest::of(&record.fingerprint);
        self.stats.cache_evictions += self.recent.insert(
            Arc::new(key),
            (digest, record.completed_at),
            self.config.cache_capacity,
        ) as u64;
        Ok(Some(digest))
    }

    pub(super) fn expire_admissions(&mut self, channel: &ConnectorChannelId, now: u64) {
        let timeout = self.config.in_progress_timeout_ms;
        if let Some(state) = self.channels.get_mut(channel) {
            state.in_progress.retain(|_, (_, at)| now.saturating_sub(*at) < timeout);
        }
    }
}

impl ReceiverIdempotency<MemoryStore> {
    /// A set over a fresh in-memory store.
    pub fn in_memory(config: IdempotencyConfig) -> Self {
        Self::with_store(config, MemoryStore::new())
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

    fn admit(set: &mut ReceiverIdempotency, message: &ChatMessage, now: u64) -> Ticket {
        match set.begin_chat(&ConnectorChannelId::new("cch_1"), message, now) {
            Ok(Admission::Process(ticket)) => ticket,
            other => panic!("expected a first admission, got {other:?}"),
        }
    }

    #[test]
    fn a_deferred_receiver_admits_with_the_record_its_caller_fetched() {
        let channel = ConnectorChannelId::new("cch_1");
        let mut set = ReceiverIdempotency::deferred(IdempotencyConfig::default());
        let message = ChatMessage::text("m_1", "hi");
        assert!(set.needs_lookup(&channel, &message.message_id), "unknown ids need the store");
        // The record an async backend found: the same content is a duplicate ...
        let stored = CompletedRecord {
            channel: channel.clone(),
            message_id: message.message_id.clone(),
            fingerprint: Fingerprint::of_chat_message(&message),
            completed_at: 5,
        };
        let again = set.begin_chat_with_stored(&channel, &message, Some(stored.clone()), 10);
        assert!(matches!(again, Admission::Duplicate(_)), "{again:?}");
        // ... and other content under the same id a conflict.
        let other = ChatMessage::text("m_1", "something else");
        let conflict = set.begin_chat_with_stored(&channel, &other, Some(stored), 10);
        assert!(matches!(conflict, Admission::Conflict(_)), "{conflict:?}");
        // A record of another id is never taken for this one.
        let fresh = ChatMessage::text("m_2", "hi");
        let wrong = CompletedRecord {
            channel: channel.clone(),
            message_id: MessageId::new("m_9"),
            fingerprint: Fingerprint::of_chat_message(&fresh),
            completed_at: 5,
        };
        let Admission::Process(ticket) =
            set.begin_chat_with_stored(&channel, &fresh, Some(wrong), 10)
        else {
            panic!("a new id is processed");
        };
        // Completed but not yet committed: memory answers, no lookup needed.
        let (_, writes) = set.complete_deferred(ticket, 11);
        assert!(!writes.is_empty(), "the completion comes back as writes to commit");
        assert!(!set.needs_lookup(&channel, &fresh.message_id));
        let repeat = set.begin_chat_with_stored(&channel, &fresh, None, 12);
        assert!(matches!(repeat, Admission::Duplicate(_)), "{repeat:?}");
    }

    #[test]
    fn a_deferred_store_refuses_writes_instead_of_dropping_them() {
        let mut set = ReceiverIdempotency::deferred(IdempotencyConfig::default());
        let channel = ConnectorChannelId::new("cch_1");
        let message = ChatMessage::text("m_1", "hi");
        let Admission::Process(ticket) = set.begin_chat_with_stored(&channel, &message, None, 1)
        else {
            panic!("a new id is processed");
        };
        assert!(set.complete(ticket, 2).is_err(), "a write-through on a deferred set fails loudly");
        let mut store = crate::DeferredStore::default();
        assert!(store.lookup_completed(&channel, &message.message_id).is_err());
        assert!(IdempotencyStore::apply(&mut store, &[]).is_ok(), "nothing to write is fine");
    }

    #[test]
    fn memory_holds_only_the_recent_cache_however_many_ids_complete() {
        let config = IdempotencyConfig { cache_capacity: 8, ..IdempotencyConfig::default() };
        let mut set = ReceiverIdempotency::in_memory(config);
        for i in 0..100 {
            let ticket = admit(&mut set, &ChatMessage::text(format!("m_{i}"), "hi"), 1);
            set.complete(ticket, 1).expect("completes");
        }
        let stats = set.stats();
        assert_eq!((stats.remembered, stats.uncommitted), (8, 0));
        assert_eq!(stats.cache_evictions, 92);
        assert_eq!(set.recent.order.len(), 8, "the order queue is bounded with the map");
        let key = set.recent.order.back().expect("newest");
        assert!(
            Arc::ptr_eq(set.recent.map.get_key_value(&**key).expect("cached").0, key),
            "one allocation per cached id"
        );
    }
}
