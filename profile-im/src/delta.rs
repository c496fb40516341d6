//! Assembly of `chat.message.delta` fragments on the Connector.
//!
//! Sequences start at 1 and rise by one per `message_id`. An identical retransmission of a
//! sequence already seen is a no-op; a gap (or 0) or a retransmission with different text is
//! refused with `sequence_conflict` and changes nothing. The final `chat.message` carries the
//! complete content: [`DeltaAssembler::on_final`] clears the state and says whether to edit
//! the target message created while streaming or to send a new one. A final without any delta
//! works the same way.
//!
//! Order of calls for a final on the Connector: first [`crate::ReceiverIdempotency::begin`]
//! (a repeated final is a `duplicate` and must not reach the target again), then `on_final`.
//!
//! Tombstones: a finished (or expired) message leaves a tombstone so a late delta for it is
//! ignored ([`DeltaAction::Late`]) instead of starting a new stream, and an expired stream's
//! target handle is still found by its final. The Profile asks only that delta state be
//! bounded and cleared by the final; how long to remember finished ids is ours to choose. A
//! late delta comes right after its final (deltas are not acked, nobody retransmits them
//! hours later), so the assembler remembers the most recent finished ids over all channels
//! ([`DeltaConfig::max_tombstones`], default 4,096), each as a 64-bit keyed hash of channel
//! and id (about 40 bytes each), with the handle only for an expired stream. The memory stays
//! flat however many messages finish; a delta older than that window with `sequence` 1 starts
//! a new stream, with a later `sequence` it is refused as a gap.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};

use xagent_protocol_types::{ChatMessageDelta, ConnectorChannelId, MessageId};

use crate::DeltaError;
use crate::fifo::FifoMap;

/// Default lifetime of an unfinished message's delta state, from its last delta.
pub const DEFAULT_DELTA_TTL_MS: u64 = 10 * 60 * 1000;
/// Default number of unfinished messages tracked per channel.
pub const DEFAULT_DELTA_MESSAGES_PER_CHANNEL: usize = 32;
/// Default size limit of one message's assembled text.
pub const DEFAULT_DELTA_MAX_TEXT_BYTES: usize = 1024 * 1024;
/// Default number of finished or expired message ids remembered (over all channels) to ignore
/// late deltas and to find an expired stream's target message.
pub const DEFAULT_DELTA_TOMBSTONES: usize = 4_096;

/// How the Connector shows deltas, chosen per target capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeltaStrategy {
    /// The target can edit a sent message: create it on the first delta, update it with the
    /// full text so far on each later one, and replace it with the final content.
    StreamEdit,
    /// The target cannot edit: keep deltas locally (nothing user-visible) and send once when
    /// the final arrives. The default, because it works everywhere.
    #[default]
    BufferUntilFinal,
}

/// Bounds and strategy of the assembler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaConfig {
    /// Display strategy.
    pub strategy: DeltaStrategy,
    /// Lifetime of an unfinished message's state after its last delta.
    pub ttl_ms: u64,
    /// Unfinished messages per channel; a new message beyond it is refused with
    /// `capacity_exceeded` (its final still works).
    pub max_messages_per_channel: usize,
    /// Maximum assembled text per message.
    pub max_text_bytes: usize,
    /// Finished/expired ids remembered over all channels, the most recent first kept.
    pub max_tombstones: usize,
}

impl Default for DeltaConfig {
    /// Buffer strategy, TTL 10 min, 32 messages per channel, 1 MiB per message, 4,096
    /// tombstones.
    fn default() -> Self {
        Self {
            strategy: DeltaStrategy::default(),
            ttl_ms: DEFAULT_DELTA_TTL_MS,
            max_messages_per_channel: DEFAULT_DELTA_MESSAGES_PER_CHANNEL,
            max_text_bytes: DEFAULT_DELTA_MAX_TEXT_BYTES,
            max_tombstones: DEFAULT_DELTA_TOMBSTONES,
        }
    }
}

impl DeltaConfig {
    /// The defaults with another strategy.
    pub fn with_strategy(strategy: DeltaStrategy) -> Self {
        Self { strategy, ..Self::default() }
    }
}

/// What the Connector should do after a delta.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeltaAction {
    /// Stream strategy, first delta: create the target message with this text, then report its
    /// handle with [`DeltaAssembler::set_target_handle`].
    CreateTarget {
        /// Text so far.
        text: String,
    },
    /// Stream strategy, later delta: update the target message to this full text.
    UpdateTarget {
        /// Text so far.
        text: String,
        /// The handle reported for the message, if any yet.
        handle: Option<String>,
    },
    /// Buffer strategy: kept, nothing to show.
    Buffered,
    /// An identical retransmission: nothing to do.
    Replay,
    /// A delta for a message already finalised or expired: nothing to do.
    Late,
}

/// What the Connector should do with a final `chat.message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinalAction {
    /// Send the final content as a new target message (no streamed message exists).
    SendNew,
    /// Replace the streamed target message's content with the final content; never send the
    /// assembled text and the final as two messages.
    EditTarget {
        /// The handle reported with [`DeltaAssembler::set_target_handle`] (None if the
        /// Connector never reported one; it must then find the message itself).
        handle: Option<String>,
    },
}

#[derive(Debug)]
struct Assembly {
    fragments: Vec<String>,
    bytes: usize,
    touched_at: u64,
    streamed: bool,
    handle: Option<String>,
}

impl Assembly {
    fn text(&self) -> String {
        self.fragments.concat()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tombstone {
    Finalized,
    Expired { streamed: bool, handle: Option<String> },
}

#[derive(Debug, Default)]
struct ChannelDeltas {
    open: HashMap<MessageId, Assembly>,
}

/// The most recent finished or expired messages of all channels, by a keyed 64-bit hash of
/// `(channel, message_id)`; oldest first out, one lookup per delta.
#[derive(Debug, Default)]
struct Tombstones {
    hasher: RandomState,
    by_key: FifoMap<u64, Tombstone>,
}

impl Tombstones {
    fn key(&self, channel: &ConnectorChannelId, id: &MessageId) -> u64 {
        self.hasher.hash_one((channel.as_str(), id.as_str()))
    }

    fn get(&self, channel: &ConnectorChannelId, id: &MessageId) -> Option<&Tombstone> {
        self.by_key.get(&self.key(channel, id))
    }

    fn bury(&mut self, channel: &ConnectorChannelId, id: &MessageId, t: Tombstone, cap: usize) {
        let key = self.key(channel, id);
        self.by_key.insert(key, t, cap.max(1));
    }
}

/// Counters of the assembler.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeltaStats {
    /// Unfinished messages tracked.
    pub open: usize,
    /// Deltas appended.
    pub appended: u64,
    /// Identical retransmissions ignored.
    pub replays: u64,
    /// Gaps and conflicting retransmissions refused.
    pub conflicts: u64,
    /// Unfinished messages dropped by TTL.
    pub expired: u64,
    /// New messages refused for capacity or size.
    pub refused: u64,
}

/// The delta assembler of one Connector (all channels).
#[derive(Debug)]
pub struct DeltaAssembler {
    config: DeltaConfig,
    channels: BTreeMap<ConnectorChannelId, ChannelDeltas>,
    tombstones: Tombstones,
    stats: DeltaStats,
}

impl DeltaAssembler {
    /// An empty assembler.
    pub fn new(config: DeltaConfig) -> Self {
        Self {
            config,
            channels: BTreeMap::new(),
            tombstones: Tombstones::default(),
            stats: DeltaStats::default(),
        }
    }

    /// The policy in force.
    pub fn config(&self) -> &DeltaConfig {
        &self.config
    }

    /// Applies one delta. Errors change nothing; the caller answers them with an `error`
    /// packet carrying [`DeltaError::code`].
    pub fn on_delta(
        &mut self,
        channel: &ConnectorChannelId,
        delta: &ChatMessageDelta,
        now: u64,
    ) -> Result<DeltaAction, DeltaError> {
        self.expire_channel(channel, now);
        let config = self.config;
        let id = &delta.message_id;
        let open = self.channels.get_mut(channel).and_then(|ch| ch.open.get_mut(id));
        let Some(assembly) = open else {
            if self.tombstones.get(channel, id).is_some() {
                return Ok(DeltaAction::Late);
            }
            if delta.sequence != 1 {
                self.stats.conflicts += 1;
                return Err(DeltaError::SequenceGap {
                    message_id: id.clone(),
                    expected: 1,
                    got: delta.sequence,
                });
            }
            if delta.text.len() > config.max_text_bytes {
                self.stats.refused += 1;
                return Err(DeltaError::TooLarge {
                    message_id: id.clone(),
                    limit: config.max_text_bytes,
                });
            }
            let streamed = config.strategy == DeltaStrategy::StreamEdit;
            let ch = self.channels.entry(channel.clone()).or_default();
            if ch.open.len() >= config.max_messages_per_channel {
                self.stats.refused += 1;
                return Err(DeltaError::CapacityExceeded(channel.clone()));
            }
            ch.open.insert(
                id.clone(),
                Assembly {
                    fragments: vec![delta.text.clone()],
                    bytes: delta.text.len(),
                    touched_at: now,
                    streamed,
                    handle: None,
                },
            );
            self.stats.appended += 1;
            return Ok(if streamed {
                DeltaAction::CreateTarget { text: delta.text.clone() }
            } else {
                DeltaAction::Buffered
            });
        };
        let seen = assembly.fragments.len() as u64;
        if delta.sequence >= 1 && delta.sequence <= seen {
            let index = usize::try_from(delta.sequence - 1).unwrap_or(usize::MAX);
            return if assembly.fragments.get(index) == Some(&delta.text) {
                self.stats.replays += 1;
                Ok(DeltaAction::Replay)
            } else {
                self.stats.conflicts += 1;
                Err(DeltaError::ConflictingRetransmission {
                    message_id: id.clone(),
                    sequence: delta.sequence,
                })
            };
        }
        if delta.sequence != seen + 1 {
            self.stats.conflicts += 1;
            return Err(DeltaError::SequenceGap {
                message_id: id.clone(),
                expected: seen + 1,
                got: delta.sequence,
            });
        }
        if assembly.bytes.saturating_add(delta.text.len()) > config.max_text_bytes {
            self.stats.refused += 1;
            return Err(DeltaError::TooLarge {
                message_id: id.clone(),
                limit: config.max_text_bytes,
            });
        }
        assembly.fragments.push(delta.text.clone());
        assembly.bytes += delta.text.len();
        assembly.touched_at = now;
        self.stats.appended += 1;
        Ok(if assembly.streamed {
            DeltaAction::UpdateTarget { text: assembly.text(), handle: assembly.handle.clone() }
        } else {
            DeltaAction::Buffered
        })
    }

    /// Records the target-system handle of the message created for a streamed delta, so the
    /// final (or a later update) can edit it.
    pub fn set_target_handle(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        handle: impl Into<String>,
    ) {
        if let Some(a) = self.channels.get_mut(channel).and_then(|ch| ch.open.get_mut(message_id)) {
            a.handle = Some(handle.into());
        }
    }

    /// The sequence the next delta of `message_id` must carry to be appended: 1 for a message
    /// not seen yet, one past the last accepted delta otherwise, `None` once the message was
    /// finalised or expired. A sender that numbers its own deltas asks this (and then
    /// [`DeltaAssembler::on_delta`], which also applies the TTL) so it never sends 0 or a gap.
    pub fn next_sequence(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Option<u64> {
        match self.channels.get(channel).and_then(|ch| ch.open.get(message_id)) {
            Some(assembly) => Some(assembly.fragments.len() as u64 + 1),
            None if self.tombstones.get(channel, message_id).is_some() => None,
            None => Some(1),
        }
    }

    /// Takes back the last delta of `message_id` if it carried `sequence`, as if it had never
    /// been accepted: for a sender whose write of that delta failed, so the receiver never saw
    /// it and the same number must be used again. Returns whether it was taken back.
    pub fn withdraw(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        sequence: u64,
    ) -> bool {
        let Some(ch) = self.channels.get_mut(channel) else { return false };
        let Some(assembly) = ch.open.get_mut(message_id) else { return false };
        if assembly.fragments.len() as u64 != sequence {
            return false;
        }
        if let Some(fragment) = assembly.fragments.pop() {
            assembly.bytes = assembly.bytes.saturating_sub(fragment.len());
        }
        if assembly.fragments.is_empty() {
            ch.open.remove(message_id);
        }
        if ch.open.is_empty() {
            self.channels.remove(channel);
        }
        self.stats.appended = self.stats.appended.saturating_sub(1);
        true
    }

    /// The text assembled so far for an unfinished message.
    pub fn assembled_text(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Option<String> {
        self.channels.get(channel)?.open.get(message_id).map(Assembly::text)
    }

    /// The final `chat.message` for `message_id` arrived: clears its delta state and says how
    /// to show the final content (always the final's own text and files, never the buffer).
    pub fn on_final(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> FinalAction {
        let cap = self.config.max_tombstones;
        let assembly = self.channels.get_mut(channel).and_then(|ch| ch.open.remove(message_id));
        if self.channels.get(channel).is_some_and(|ch| ch.open.is_empty()) {
            self.channels.remove(channel);
        }
        let action = match assembly {
            Some(a) if a.streamed => FinalAction::EditTarget { handle: a.handle },
            Some(_) => FinalAction::SendNew,
            None => match self.tombstones.get(channel, message_id) {
                Some(Tombstone::Expired { streamed: true, handle }) => {
                    FinalAction::EditTarget { handle: handle.clone() }
                }
                _ => FinalAction::SendNew,
            },
        };
        self.tombstones.bury(channel, message_id, Tombstone::Finalized, cap);
        action
    }

    /// Drops unfinished messages whose last delta is older than the TTL; returns them. A
    /// streamed one keeps its handle in a tombstone so a late final still edits it.
    pub fn expire(&mut self, now: u64) -> Vec<(ConnectorChannelId, MessageId)> {
        let ids: Vec<ConnectorChannelId> = self.channels.keys().cloned().collect();
        let mut out = Vec::new();
        for id in ids {
            for m in self.expire_channel(&id, now) {
                out.push((id.clone(), m));
            }
        }
        self.channels.retain(|_, ch| !ch.open.is_empty());
        out
    }

    /// The channel was deleted: forget its unfinished messages (its tombstones, being hashes,
    /// leave with the oldest ones).
    pub fn remove_channel(&mut self, channel: &ConnectorChannelId) {
        self.channels.remove(channel);
    }

    /// Counters.
    pub fn stats(&self) -> DeltaStats {
        DeltaStats {
            open: self.channels.values().map(|c| c.open.len()).sum(),
            ..self.stats.clone()
        }
    }

    fn expire_channel(&mut self, channel: &ConnectorChannelId, now: u64) -> Vec<MessageId> {
        let ttl = self.config.ttl_ms;
        let cap = self.config.max_tombstones;
        let Some(ch) = self.channels.get_mut(channel) else { return Vec::new() };
        let stale: Vec<MessageId> = ch
            .open
            .iter()
            .filter(|(_, a)| now.saturating_sub(a.touched_at) >= ttl)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &stale {
            if let Some(a) = ch.open.remove(id) {
                self.tombstones.bury(
                    channel,
                    id,
                    Tombstone::Expired { streamed: a.streamed, handle: a.handle },
                    cap,
                );
                self.stats.expired += 1;
            }
        }
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(id: &str, sequence: u64, text: &str) -> ChatMessageDelta {
        ChatMessageDelta::new(id, sequence, text)
    }

    #[test]
    fn im_v2_delta_rule_next_sequence_follows_the_accepted_deltas_withdrawals_and_the_final() {
        let mut d = DeltaAssembler::new(DeltaConfig::default());
        let (channel, id) = (ConnectorChannelId::new("cch_a"), MessageId::new("m1"));
        assert_eq!(d.next_sequence(&channel, &id), Some(1));
        d.on_delta(&channel, &delta("m1", 1, "a"), 1).expect("first");
        assert_eq!(d.next_sequence(&channel, &id), Some(2));
        assert!(d.on_delta(&channel, &delta("m1", 3, "c"), 1).is_err(), "a gap is refused");
        assert_eq!(d.next_sequence(&channel, &id), Some(2), "a refused delta changes nothing");
        assert!(!d.withdraw(&channel, &id, 3), "only the last accepted delta is taken back");
        d.on_delta(&channel, &delta("m1", 2, "b"), 1).expect("second");
        assert!(d.withdraw(&channel, &id, 2));
        assert_eq!(d.next_sequence(&channel, &id), Some(2), "its number is free again");
        assert_eq!(d.assembled_text(&channel, &id).as_deref(), Some("a"));
        assert!(d.withdraw(&channel, &id, 1));
        assert!(d.channels.is_empty(), "a message with nothing left leaves no state");
        assert_eq!(d.next_sequence(&channel, &id), Some(1));
        d.on_delta(&channel, &delta("m1", 1, "a"), 1).expect("first again");
        d.on_final(&channel, &id);
        assert_eq!(d.next_sequence(&channel, &id), None);
    }

    #[test]
    fn im_v2_delta_rule_late_deltas_after_the_final_are_ignored_within_a_bounded_window() {
        let config = DeltaConfig { max_tombstones: 8, ..DeltaConfig::default() };
        let mut d = DeltaAssembler::new(config);
        let (a, b) = (ConnectorChannelId::new("cch_a"), ConnectorChannelId::new("cch_b"));
        for i in 0..100 {
            let channel = if i % 2 == 0 { &a } else { &b };
            d.on_delta(channel, &delta(&format!("m{i}"), 1, "hi"), 1).expect("first delta");
            assert_eq!(d.on_final(channel, &MessageId::new(format!("m{i}"))), FinalAction::SendNew);
        }
        // Bounded over all channels, however many messages finished; no channel state left.
        assert_eq!(d.tombstones.by_key.len(), 8);
        assert_eq!(d.tombstones.by_key.order.len(), 8);
        assert!(d.channels.is_empty(), "a finished message leaves no per-channel state");
        // A late delta of a recent message (its channel's own id) is ignored, not a new stream.
        assert_eq!(d.on_delta(&b, &delta("m99", 1, "hi"), 2), Ok(DeltaAction::Late));
        assert_eq!(d.on_delta(&a, &delta("m98", 2, "there"), 2), Ok(DeltaAction::Late));
        // Keyed by channel too: the same id on another channel is a different message.
        assert_eq!(d.on_delta(&a, &delta("m99", 1, "hi"), 2), Ok(DeltaAction::Buffered));
        // Beyond the window: a later sequence is a gap, refused.
        assert!(matches!(
            d.on_delta(&a, &delta("m0", 2, "x"), 2),
            Err(DeltaError::SequenceGap { .. })
        ));
    }

    #[test]
    fn im_v2_delta_rule_an_expired_stream_keeps_its_handle_for_the_final() {
        let config = DeltaConfig {
            max_tombstones: 2,
            ttl_ms: 10,
            ..DeltaConfig::with_strategy(DeltaStrategy::StreamEdit)
        };
        let mut d = DeltaAssembler::new(config);
        let a = ConnectorChannelId::new("cch_a");
        d.on_delta(&a, &delta("s", 1, "he"), 0).expect("first delta");
        d.set_target_handle(&a, &MessageId::new("s"), "h1");
        assert_eq!(d.expire(10).len(), 1);
        assert_eq!(
            d.on_final(&a, &MessageId::new("s")),
            FinalAction::EditTarget { handle: Some("h1".into()) }
        );
        // The final turned the expired tombstone into a finished one: one entry, not two.
        assert_eq!(d.tombstones.by_key.len(), 1);
        assert_eq!(d.on_delta(&a, &delta("s", 3, "x"), 11), Ok(DeltaAction::Late));
    }
}
