//! Receiver idempotency and delta assembly with a simulated clock.

use xagent_profile_im::{
    Admission, DeltaAction, DeltaAssembler, DeltaConfig, DeltaError, DeltaStrategy, FinalAction,
    Fingerprint, IdempotencyConfig, IdempotencyStore, IdempotencyWrite, MemoryStore,
    ReceiverIdempotency,
};
use xagent_protocol_types::{
    AckStatus, ChatFile, ChatMessage, ChatMessageDelta, ConnectorChannelId, ErrorCode, FileType,
    MessageId,
};

const T0: u64 = 1_790_000_000_000;

fn ch(name: &str) -> ConnectorChannelId {
    ConnectorChannelId::new(name)
}

fn process(set: &mut ReceiverIdempotency, c: &str, m: &ChatMessage, now: u64) -> AckStatus {
    match set.begin_chat(&ch(c), m, now).unwrap() {
        Admission::Process(ticket) => set.complete(ticket, now).unwrap().status,
        Admission::Duplicate(ack) | Admission::Conflict(ack) | Admission::InProgress(ack) => {
            ack.status
        }
    }
}

#[test]
fn repeat_returns_duplicate_without_side_effect() {
    let mut set = ReceiverIdempotency::in_memory(IdempotencyConfig::default());
    let m = ChatMessage::text("m1", "hi");
    let mut side_effects = 0;
    for _ in 0..3 {
        match set.begin_chat(&ch("a"), &m, T0).unwrap() {
            Admission::Process(t) => {
                side_effects += 1;
                assert_eq!(set.complete(t, T0).unwrap().status, AckStatus::Accepted);
            }
            Admission::Duplicate(ack) => assert_eq!(ack.status, AckStatus::Duplicate),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(side_effects, 1);
    assert_eq!(set.stats().duplicates, 2);
}

#[test]
fn same_id_different_text_or_files_is_message_conflict_not_retryable() {
    let mut set = ReceiverIdempotency::in_memory(IdempotencyConfig::default());
    let file = ChatFile::new(FileType::Image, "f1").with_download_url("/files/refs/f1");
    let m = ChatMessage::with_files("m1", Some("hi".into()), vec![file.clone()]);
    assert_eq!(process(&mut set, "a", &m, T0), AckStatus::Accepted);
    let other_text = ChatMessage::with_files("m1", Some("bye".into()), vec![file.clone()]);
    let other_files = ChatMessage::with_files("m1", Some("hi".into()), vec![]);
    for changed in [other_text, other_files] {
        let Admission::Conflict(ack) = set.begin_chat(&ch("a"), &changed, T0).unwrap() else {
            panic!("expected conflict")
        };
        assert_eq!(ack.status, AckStatus::Rejected);
        assert_eq!(ack.code, Some(ErrorCode::MessageConflict));
        assert_eq!(ack.retryable, Some(false));
    }
    // A re-signed download URL is the same message.
    let mut resigned = m.clone();
    resigned.files[0].download_url = Some("/files/refs/f1?exp=9".into());
    assert_eq!(process(&mut set, "a", &resigned, T0), AckStatus::Duplicate);
    // Identity is per channel.
    assert_eq!(process(&mut set, "b", &ChatMessage::text("m1", "bye"), T0), AckStatus::Accepted);
}

#[test]
fn two_phase_accepted_only_after_effect_and_in_progress_is_busy() {
    let mut set = ReceiverIdempotency::in_memory(IdempotencyConfig::default());
    let m = ChatMessage::text("m1", "hi");
    let Admission::Process(ticket) = set.begin_chat(&ch("a"), &m, T0).unwrap() else { panic!() };
    assert!(
        !set.is_completed(&ch("a"), &MessageId::new("m1")).unwrap(),
        "not accepted before the effect"
    );
    let Admission::InProgress(ack) = set.begin_chat(&ch("a"), &m, T0).unwrap() else { panic!() };
    assert_eq!((ack.code, ack.retryable), (Some(ErrorCode::ChannelBusy), Some(true)));
    let ack = set.complete(ticket, T0 + 5).unwrap();
    assert_eq!(ack.status, AckStatus::Accepted);
    assert!(set.is_completed(&ch("a"), &MessageId::new("m1")).unwrap());
}

#[test]
fn abandoned_effect_records_nothing_so_redelivery_is_processed() {
    let mut set = ReceiverIdempotency::in_memory(IdempotencyConfig::default());
    let m = ChatMessage::text("m1", "hi");
    let Admission::Process(t) = set.begin_chat(&ch("a"), &m, T0).unwrap() else { panic!() };
    let ack = set.abandon(t, ErrorCode::ChannelBusy, "rate limited", true);
    assert_eq!((ack.status, ack.retryable), (AckStatus::Rejected, Some(true)));
    assert!(matches!(set.begin_chat(&ch("a"), &m, T0 + 1).unwrap(), Admission::Process(_)));
}

#[test]
fn idempotency_set_is_bounded_by_size_and_age() {
    let config = IdempotencyConfig {
        capacity_per_channel: 3,
        max_age_ms: 1_000,
        in_progress_timeout_ms: 500,
        ..IdempotencyConfig::default()
    };
    let store = MemoryStore::new();
    let mut set = ReceiverIdempotency::open(config, store.clone(), T0).unwrap();
    for i in 0..5 {
        let Admission::Process(t) =
            set.begin_chat(&ch("a"), &ChatMessage::text(format!("m{i}"), "x"), T0 + i).unwrap()
        else {
            panic!()
        };
        set.complete(t, T0 + i).unwrap();
    }
    // The store keeps the channel's newest 3 (with capacity 3 the trim runs on every
    // completion); the two oldest are gone from it.
    assert_eq!(set.stats().capacity_trims, 5);
    assert_eq!(store.completed_len(), 3);
    let mut fresh = ReceiverIdempotency::open(config, store.clone(), T0 + 5).unwrap();
    assert!(!fresh.is_completed(&ch("a"), &MessageId::new("m0")).unwrap());
    assert!(fresh.is_completed(&ch("a"), &MessageId::new("m2")).unwrap());
    // Past the age bound an id is no longer a duplicate, and the expiry deletes it.
    let m4 = ChatMessage::text("m4", "x");
    assert!(matches!(set.begin_chat(&ch("a"), &m4, T0 + 1_003).unwrap(), Admission::Duplicate(_)));
    assert!(matches!(set.begin_chat(&ch("a"), &m4, T0 + 1_004).unwrap(), Admission::Process(_)));
    set.prune(T0 + 100_000).unwrap();
    assert_eq!(store.completed_len(), 0);
    // A lost ticket does not block its message forever.
    let m = ChatMessage::text("x", "y");
    let Admission::Process(_lost) = set.begin_chat(&ch("a"), &m, T0 + 200_000).unwrap() else {
        panic!()
    };
    assert!(matches!(set.begin_chat(&ch("a"), &m, T0 + 200_500).unwrap(), Admission::Process(_)));
}

#[test]
fn completed_ids_survive_restart() {
    let store = MemoryStore::new();
    let m = ChatMessage::text("m1", "hi");
    {
        let mut set =
            ReceiverIdempotency::open(IdempotencyConfig::default(), store.clone(), T0).unwrap();
        let Admission::Process(t) = set.begin_chat(&ch("a"), &m, T0).unwrap() else { panic!() };
        set.complete(t, T0).unwrap();
    }
    let mut set =
        ReceiverIdempotency::open(IdempotencyConfig::default(), store.clone(), T0 + 60_000)
            .unwrap();
    assert!(matches!(set.begin_chat(&ch("a"), &m, T0 + 60_000).unwrap(), Admission::Duplicate(_)));
    let changed = ChatMessage::text("m1", "changed");
    assert!(matches!(set.begin_chat(&ch("a"), &changed, T0).unwrap(), Admission::Conflict(_)));
    assert_eq!(
        store.completed_len(),
        1,
        "completed state is not deleted after the ack (independent of sender pending state)"
    );
    let fp = Fingerprint::of_chat_message(&m);
    assert_eq!(fp.as_str().len(), 64);
}

#[test]
fn completion_with_failing_store_still_remembers_in_memory() {
    let store = MemoryStore::new();
    let mut set =
        ReceiverIdempotency::open(IdempotencyConfig::default(), store.clone(), T0).unwrap();
    let m = ChatMessage::text("m1", "hi");
    let Admission::Process(t) = set.begin_chat(&ch("a"), &m, T0).unwrap() else { panic!() };
    store.set_failing(true);
    assert!(set.complete(t, T0).is_err());
    store.set_failing(false);
    assert!(matches!(set.begin_chat(&ch("a"), &m, T0).unwrap(), Admission::Duplicate(_)));
}

fn delta(m: &str, seq: u64, text: &str) -> ChatMessageDelta {
    ChatMessageDelta::new(m, seq, text)
}

#[test]
fn deltas_start_at_one_and_increase_strictly() {
    let mut d = DeltaAssembler::new(DeltaConfig::default());
    let err = d.on_delta(&ch("a"), &delta("m", 2, "x"), T0).unwrap_err();
    assert_eq!(err, DeltaError::SequenceGap { message_id: "m".into(), expected: 1, got: 2 });
    assert_eq!(err.code(), ErrorCode::SequenceConflict);
    let err = d.on_delta(&ch("a"), &delta("m", 0, "x"), T0).unwrap_err();
    assert_eq!(err.code(), ErrorCode::SequenceConflict);
    assert_eq!(d.on_delta(&ch("a"), &delta("m", 1, "Hel"), T0).unwrap(), DeltaAction::Buffered);
    assert_eq!(d.on_delta(&ch("a"), &delta("m", 2, "lo"), T0).unwrap(), DeltaAction::Buffered);
    assert_eq!(d.assembled_text(&ch("a"), &"m".into()).as_deref(), Some("Hello"));
}

#[test]
fn delta_gap_is_sequence_conflict_and_changes_nothing() {
    let mut d = DeltaAssembler::new(DeltaConfig::default());
    d.on_delta(&ch("a"), &delta("m", 1, "a"), T0).unwrap();
    let err = d.on_delta(&ch("a"), &delta("m", 3, "c"), T0).unwrap_err();
    assert_eq!(err, DeltaError::SequenceGap { message_id: "m".into(), expected: 2, got: 3 });
    d.on_delta(&ch("a"), &delta("m", 2, "b"), T0).unwrap();
    assert_eq!(d.assembled_text(&ch("a"), &"m".into()).as_deref(), Some("ab"));
}

#[test]
fn delta_identical_replay_is_noop_and_conflicting_replay_is_refused() {
    let mut d = DeltaAssembler::new(DeltaConfig::default());
    d.on_delta(&ch("a"), &delta("m", 1, "a"), T0).unwrap();
    d.on_delta(&ch("a"), &delta("m", 2, "b"), T0).unwrap();
    assert_eq!(d.on_delta(&ch("a"), &delta("m", 1, "a"), T0).unwrap(), DeltaAction::Replay);
    assert_eq!(d.on_delta(&ch("a"), &delta("m", 2, "b"), T0).unwrap(), DeltaAction::Replay);
    let err = d.on_delta(&ch("a"), &delta("m", 2, "B"), T0).unwrap_err();
    assert_eq!(err, DeltaError::ConflictingRetransmission { message_id: "m".into(), sequence: 2 });
    assert_eq!(err.code(), ErrorCode::SequenceConflict);
    assert_eq!(
        d.assembled_text(&ch("a"), &"m".into()).as_deref(),
        Some("ab"),
        "never appended twice"
    );
}

#[test]
fn final_without_any_delta_is_sent_new() {
    let mut d = DeltaAssembler::new(DeltaConfig::with_strategy(DeltaStrategy::StreamEdit));
    assert_eq!(d.on_final(&ch("a"), &"m".into()), FinalAction::SendNew);
}

#[test]
fn final_clears_state_and_late_deltas_are_ignored() {
    let mut d = DeltaAssembler::new(DeltaConfig::default());
    d.on_delta(&ch("a"), &delta("m", 1, "a"), T0).unwrap();
    assert_eq!(d.on_final(&ch("a"), &"m".into()), FinalAction::SendNew);
    assert_eq!(d.stats().open, 0);
    assert_eq!(d.assembled_text(&ch("a"), &"m".into()), None);
    assert_eq!(d.on_delta(&ch("a"), &delta("m", 2, "b"), T0).unwrap(), DeltaAction::Late);
}

#[test]
fn stream_strategy_creates_updates_and_edits_on_final() {
    let mut d = DeltaAssembler::new(DeltaConfig::with_strategy(DeltaStrategy::StreamEdit));
    let m: MessageId = "m".into();
    assert_eq!(
        d.on_delta(&ch("a"), &delta("m", 1, "Hel"), T0).unwrap(),
        DeltaAction::CreateTarget { text: "Hel".into() }
    );
    d.set_target_handle(&ch("a"), &m, "tg:42");
    assert_eq!(
        d.on_delta(&ch("a"), &delta("m", 2, "lo"), T0).unwrap(),
        DeltaAction::UpdateTarget { text: "Hello".into(), handle: Some("tg:42".into()) }
    );
    assert_eq!(d.on_final(&ch("a"), &m), FinalAction::EditTarget { handle: Some("tg:42".into()) });
}

#[test]
fn delta_state_is_bounded_by_ttl_and_capacity() {
    let config = DeltaConfig {
        strategy: DeltaStrategy::StreamEdit,
        ttl_ms: 1_000,
        max_messages_per_channel: 2,
        max_text_bytes: 8,
        max_tombstones: 4,
    };
    let mut d = DeltaAssembler::new(config);
    d.on_delta(&ch("a"), &delta("m1", 1, "a"), T0).unwrap();
    d.on_delta(&ch("a"), &delta("m2", 1, "a"), T0).unwrap();
    let err = d.on_delta(&ch("a"), &delta("m3", 1, "a"), T0).unwrap_err();
    assert_eq!(err.code(), ErrorCode::CapacityExceeded);
    let err = d.on_delta(&ch("a"), &delta("m1", 2, "123456789"), T0).unwrap_err();
    assert!(matches!(err, DeltaError::TooLarge { .. }));
    d.set_target_handle(&ch("a"), &"m1".into(), "h1");
    let expired = d.expire(T0 + 1_000);
    assert_eq!(expired.len(), 2);
    assert_eq!(d.stats().open, 0);
    // The streamed target message of an expired state is still edited by a late final.
    assert_eq!(
        d.on_final(&ch("a"), &"m1".into()),
        FinalAction::EditTarget { handle: Some("h1".into()) }
    );
    // A late delta for an expired message is a no-op.
    assert_eq!(d.on_delta(&ch("a"), &delta("m2", 2, "b"), T0 + 1_001).unwrap(), DeltaAction::Late);
    // New messages can start again.
    d.on_delta(&ch("a"), &delta("m3", 1, "a"), T0 + 1_001).unwrap();
}

#[test]
fn deferred_completion_reaches_the_store_only_through_the_callers_commit() {
    let config = IdempotencyConfig { capacity_per_channel: 1, ..IdempotencyConfig::default() };
    let store = MemoryStore::new();
    let mut set = ReceiverIdempotency::open(config, store.clone(), T0).unwrap();
    let opened = store.transactions();
    let mut commit = Vec::new();
    for i in 0..2 {
        let m = ChatMessage::text(format!("m{i}"), "x");
        let Admission::Process(t) = set.begin_chat(&ch("a"), &m, T0 + i).unwrap() else { panic!() };
        let (ack, writes) = set.complete_deferred(t, T0 + i);
        assert_eq!(ack.status, AckStatus::Accepted);
        commit.extend(writes);
    }
    // Nothing written yet: the caller holds the acks until its commit.
    assert_eq!(store.transactions(), opened);
    assert_eq!(
        commit.last(),
        Some(&IdempotencyWrite::Trim { channel: ch("a"), keep: 1 }),
        "the capacity trim travels in the same batch"
    );
    IdempotencyStore::apply(&mut store.clone(), &commit).unwrap();
    assert_eq!(store.transactions(), opened + 1);
    let mut restarted = ReceiverIdempotency::open(config, store.clone(), T0).unwrap();
    assert!(restarted.is_completed(&ch("a"), &MessageId::new("m1")).unwrap());
    assert!(!restarted.is_completed(&ch("a"), &MessageId::new("m0")).unwrap());
}

/// A small cache so that a few messages push an id out of memory.
fn small_cache() -> IdempotencyConfig {
    IdempotencyConfig { cache_capacity: 2, ..IdempotencyConfig::default() }
}

fn complete_all(set: &mut ReceiverIdempotency, channel: &str, ids: &[&str], now: u64) {
    for id in ids {
        let m = ChatMessage::text(*id, "filler");
        let Admission::Process(t) = set.begin_chat(&ch(channel), &m, now).unwrap() else {
            panic!("{id} is new")
        };
        set.complete(t, now).unwrap();
    }
}

#[test]
fn idempotency_rule_a_redelivery_after_cache_eviction_is_still_duplicate_from_the_store() {
    let store = MemoryStore::new();
    let mut set = ReceiverIdempotency::open(small_cache(), store.clone(), T0).unwrap();
    let m = ChatMessage::text("m1", "hi");
    assert_eq!(process(&mut set, "a", &m, T0), AckStatus::Accepted);
    complete_all(&mut set, "b", &["x1", "x2", "x3"], T0);
    assert_eq!(set.stats().remembered, 2, "m1 left the memory");
    let lookups = set.stats().store_lookups;
    assert_eq!(process(&mut set, "a", &m, T0 + 1), AckStatus::Duplicate);
    assert_eq!(set.stats().store_lookups, lookups + 1, "answered by the store");
    assert_eq!(set.stats().completed, 4, "no second side effect");
}

#[test]
fn idempotency_rule_a_reused_id_with_other_content_is_a_conflict_after_cache_eviction() {
    let store = MemoryStore::new();
    let mut set = ReceiverIdempotency::open(small_cache(), store.clone(), T0).unwrap();
    assert_eq!(process(&mut set, "a", &ChatMessage::text("m1", "hi"), T0), AckStatus::Accepted);
    complete_all(&mut set, "a", &["x1", "x2", "x3"], T0);
    let Admission::Conflict(ack) =
        set.begin_chat(&ch("a"), &ChatMessage::text("m1", "other"), T0 + 1).unwrap()
    else {
        panic!("expected message_conflict")
    };
    assert_eq!((ack.code, ack.retryable), (Some(ErrorCode::MessageConflict), Some(false)));
}

#[test]
fn idempotency_rule_duplicate_and_conflict_hold_across_a_restart_without_loading_the_set() {
    let store = MemoryStore::new();
    let m = ChatMessage::text("m1", "hi");
    {
        let mut set = ReceiverIdempotency::open(small_cache(), store.clone(), T0).unwrap();
        assert_eq!(process(&mut set, "a", &m, T0), AckStatus::Accepted);
    }
    let mut set = ReceiverIdempotency::open(small_cache(), store.clone(), T0 + 60_000).unwrap();
    assert_eq!(set.stats().remembered, 0, "nothing loaded into memory");
    assert_eq!(process(&mut set, "a", &m, T0 + 60_000), AckStatus::Duplicate);
    let other = ChatMessage::text("m1", "changed");
    assert!(matches!(
        set.begin_chat(&ch("a"), &other, T0 + 60_000).unwrap(),
        Admission::Conflict(_)
    ));
}

#[test]
fn idempotency_rule_an_uncommitted_completion_is_found_by_a_redelivery_before_the_store_has_it() {
    let store = MemoryStore::new();
    let mut set = ReceiverIdempotency::open(small_cache(), store.clone(), T0).unwrap();
    let m = ChatMessage::text("m1", "hi");
    let Admission::Process(t) = set.begin_chat(&ch("a"), &m, T0).unwrap() else { panic!() };
    let (_ack, writes) = set.complete_deferred(t, T0);
    // Many other completions (committed) push everything committed out of the cache.
    complete_all(&mut set, "b", &["x1", "x2", "x3", "x4"], T0);
    assert_eq!(set.stats().uncommitted, 1);
    // The store does not have m1 yet, but the redelivery is a duplicate, not a second effect.
    assert_eq!(process(&mut set, "a", &m, T0 + 1), AckStatus::Duplicate);
    assert!(matches!(
        set.begin_chat(&ch("a"), &ChatMessage::text("m1", "changed"), T0 + 1).unwrap(),
        Admission::Conflict(_)
    ));
    // The caller's commit lands; after that the store answers.
    IdempotencyStore::apply(&mut store.clone(), &writes).unwrap();
    set.committed(&ch("a"), &MessageId::new("m1"));
    assert_eq!(set.stats().uncommitted, 0);
    complete_all(&mut set, "b", &["y1", "y2"], T0 + 2);
    assert_eq!(process(&mut set, "a", &m, T0 + 3), AckStatus::Duplicate);
}

#[test]
fn idempotency_rule_a_failed_commit_keeps_the_id_in_memory_for_the_process() {
    let store = MemoryStore::new();
    let mut set = ReceiverIdempotency::open(small_cache(), store.clone(), T0).unwrap();
    let m = ChatMessage::text("m1", "hi");
    let Admission::Process(t) = set.begin_chat(&ch("a"), &m, T0).unwrap() else { panic!() };
    store.set_failing(true);
    assert!(set.complete(t, T0).is_err(), "the store error is reported");
    store.set_failing(false);
    complete_all(&mut set, "b", &["x1", "x2", "x3"], T0);
    assert_eq!(process(&mut set, "a", &m, T0 + 1), AckStatus::Duplicate);
}

#[test]
fn idempotency_rule_capacity_and_age_are_applied_in_the_store_not_in_memory() {
    let config = IdempotencyConfig {
        capacity_per_channel: 32,
        cache_capacity: 4,
        max_age_ms: 10_000,
        expire_interval_ms: 1_000,
        ..IdempotencyConfig::default()
    };
    let store = MemoryStore::new();
    let mut set = ReceiverIdempotency::open(config, store.clone(), T0).unwrap();
    let ids: Vec<String> = (0..40).map(|i| format!("m{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let at = T0 + i as u64;
        let Admission::Process(t) =
            set.begin_chat(&ch("a"), &ChatMessage::text(id.as_str(), "x"), at).unwrap()
        else {
            panic!()
        };
        set.complete(t, at).unwrap();
    }
    // A trim every 32 / 16 = 2 completions: 40 completions, the newest 32 kept.
    assert_eq!(set.stats().capacity_trims, 20);
    assert_eq!(store.completed_len(), 32);
    assert!(!set.is_completed(&ch("a"), &MessageId::new("m07")).unwrap());
    assert!(set.is_completed(&ch("a"), &MessageId::new("m08")).unwrap());
    assert_eq!(set.stats().remembered, 4);
    // Expiry: at most once per interval, deleting what is past the age bound.
    set.prune(T0 + 10_020).unwrap();
    assert_eq!(store.completed_len(), 20, "m20..m39 are not older than 10 s");
    set.prune(T0 + 10_500).unwrap();
    assert_eq!(store.completed_len(), 20, "not again within the interval");
    set.prune(T0 + 11_020).unwrap();
    assert_eq!(store.completed_len(), 0);
}

#[test]
fn rekey_rule_a_renamed_channel_keeps_its_completed_ids_in_memory_and_in_the_store() {
    let store = MemoryStore::new();
    let mut set =
        ReceiverIdempotency::open(IdempotencyConfig::default(), store.clone(), T0).unwrap();
    let m = ChatMessage::text("m1", "hi");
    assert_eq!(process(&mut set, "a", &m, T0), AckStatus::Accepted);
    store.rename_channel(&ch("a"), &ch("b")).unwrap();
    set.on_channel_renamed(&ch("a"), &ch("b"));
    // From the recent cache: the id moved with the channel.
    assert_eq!(process(&mut set, "b", &m, T0), AckStatus::Duplicate);
    // From the store, after a restart: the row moved too.
    let mut restarted =
        ReceiverIdempotency::open(IdempotencyConfig::default(), store.clone(), T0).unwrap();
    assert_eq!(process(&mut restarted, "b", &m, T0), AckStatus::Duplicate);
    assert!(!restarted.is_completed(&ch("a"), &MessageId::new("m1")).unwrap());
    // The old id is a channel of its own again (a new message there is processed).
    assert_eq!(process(&mut set, "a", &m, T0), AckStatus::Accepted);
}

#[test]
fn rekey_rule_the_store_refuses_to_merge_two_channels_completed_ids() {
    let store = MemoryStore::new();
    let mut set =
        ReceiverIdempotency::open(IdempotencyConfig::default(), store.clone(), T0).unwrap();
    process(&mut set, "a", &ChatMessage::text("m1", "hi"), T0);
    process(&mut set, "b", &ChatMessage::text("m2", "hi"), T0);
    assert!(store.rename_channel(&ch("a"), &ch("b")).is_err());
    assert!(set.is_completed(&ch("a"), &MessageId::new("m1")).unwrap());
    assert_eq!(store.completed_len(), 2);
}

#[test]
fn rekey_rule_a_message_in_progress_during_the_rename_is_recorded_under_the_new_id() {
    let store = MemoryStore::new();
    let mut set =
        ReceiverIdempotency::open(IdempotencyConfig::default(), store.clone(), T0).unwrap();
    let m = ChatMessage::text("m1", "hi");
    let ticket = match set.begin_chat(&ch("a"), &m, T0).unwrap() {
        Admission::Process(ticket) => ticket,
        other => panic!("expected a first admission, got {other:?}"),
    };
    store.rename_channel(&ch("a"), &ch("b")).unwrap();
    set.on_channel_renamed(&ch("a"), &ch("b"));
    // While the effect runs, a redelivery on the new id is in progress, not a new message.
    let during = set.begin_chat(&ch("b"), &m, T0).unwrap();
    assert!(matches!(during, Admission::InProgress(_)), "{during:?}");
    assert_eq!(set.complete(ticket, T0).unwrap().status, AckStatus::Accepted);
    let mut restarted =
        ReceiverIdempotency::open(IdempotencyConfig::default(), store.clone(), T0).unwrap();
    assert!(restarted.is_completed(&ch("b"), &MessageId::new("m1")).unwrap());
    assert!(!restarted.is_completed(&ch("a"), &MessageId::new("m1")).unwrap());
}
