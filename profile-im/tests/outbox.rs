//! Deterministic outbox scenarios with a simulated clock: one test per delivery promise.

use xagent_profile_im::{
    AckOutcome, Backoff, DeliveredBy, EnqueueOutcome, IgnoredAck, MemoryStore, MessagePushBuilder,
    Outbox, OutboxConfig, OutboxError, OutboxEvent, OutboxStore, OutboxWrite, OverflowPolicy,
    RetryOutcome, SentOutcome, WriteMode,
};
use xagent_protocol_types::{
    AckStatus, ChatMessage, ChatMessageAck, Clock, ConnectorChannelId, ErrorCode, ManualClock,
    MessageId, PacketId, Side,
};

const T0: u64 = 1_790_000_000_000;
const HOUR: u64 = 3_600_000;

fn ch(name: &str) -> ConnectorChannelId {
    ConnectorChannelId::new(name)
}

fn mid(name: &str) -> MessageId {
    MessageId::new(name)
}

fn msg(id: &str) -> ChatMessage {
    ChatMessage::text(id, format!("text of {id}"))
}

fn outbox(clock: &ManualClock) -> Outbox {
    Outbox::in_memory(OutboxConfig::new(Side::Connector), clock.now_millis())
}

/// Hands out the ready deliveries and marks each as written with packet `p-<id>-<attempt>`.
fn send_all<S: OutboxStore>(
    o: &mut Outbox<S>,
    now: u64,
) -> Vec<(ConnectorChannelId, MessageId, PacketId)> {
    let mut out = Vec::new();
    for d in o.next_ready(now).unwrap() {
        let packet = PacketId::new(format!("p-{}-{}", d.message_id, d.attempt));
        o.on_sent(&d.channel, &d.message_id, packet.clone(), now).unwrap();
        out.push((d.channel, d.message_id, packet));
    }
    out
}

#[test]
fn accepted_ack_delivers_and_removes() {
    let clock = ManualClock::new(T0);
    let mut o = outbox(&clock);
    o.enqueue(&ch("a"), msg("m1"), clock.now_millis()).unwrap();
    let sent = send_all(&mut o, clock.now_millis());
    assert_eq!(sent.len(), 1);
    let out = o.on_ack(&ch("a"), &ChatMessageAck::accepted("m1"), &sent[0].2, T0).unwrap();
    assert_eq!(out, AckOutcome::Delivered { status: AckStatus::Accepted });
    assert!(!o.is_pending(&ch("a"), &mid("m1")));
    assert_eq!(o.store().pending_len(), 0);
    assert_eq!(o.stats().totals.delivered, 1);
    // A second ack for the same message changes nothing: never accepted twice.
    let again = o.on_ack(&ch("a"), &ChatMessageAck::accepted("m1"), &sent[0].2, T0).unwrap();
    assert_eq!(again, AckOutcome::Ignored(IgnoredAck::UnknownMessage));
    assert_eq!(o.stats().totals.delivered, 1);
}

#[test]
fn duplicate_ack_is_terminal_delivery() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let sent = send_all(&mut o, T0);
    let out = o.on_ack(&ch("a"), &ChatMessageAck::duplicate("m1"), &sent[0].2, T0).unwrap();
    assert_eq!(out, AckOutcome::Delivered { status: AckStatus::Duplicate });
    assert_eq!(o.stats().totals.duplicates, 1);
    assert!(
        o.drain_events()
            .iter()
            .any(|e| matches!(e, OutboxEvent::Delivered { by: DeliveredBy::Duplicate, .. }))
    );
}

#[test]
fn timeout_is_not_delivery_and_redelivers_same_message_id() {
    let clock = ManualClock::new(T0);
    let mut o = outbox(&clock);
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let first = send_all(&mut o, T0);
    clock.advance(30_000);
    let timed_out = o.poll_timeouts(clock.now_millis()).unwrap();
    assert_eq!(timed_out.len(), 1);
    assert!(o.is_pending(&ch("a"), &mid("m1")));
    assert_eq!(o.stats().totals.delivered, 0);
    clock.advance(1_000);
    let again = o.next_ready(clock.now_millis()).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].message_id, first[0].1);
    assert_eq!(again[0].attempt, 2);
    assert_eq!(o.record(&ch("a"), &mid("m1")).unwrap().last_error.as_deref(), Some("ack timeout"));
}

#[test]
fn backoff_schedule_is_1_2_4_8_16_32_then_60_seconds() {
    let b = Backoff::default();
    let delays: Vec<u64> = (1..=9).map(|n| b.delay_ms(n)).collect();
    assert_eq!(delays, vec![1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000]);
    assert_eq!(b.delay_ms(0), 0);
    assert_eq!(b.delay_ms(u32::MAX), 60_000);

    // And the outbox follows it: each failed attempt n waits delay(n) before attempt n+1.
    let clock = ManualClock::new(T0);
    let mut o = outbox(&clock);
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    for attempt in 1..=8u32 {
        let now = clock.now_millis();
        let d = o.next_ready(now).unwrap();
        assert_eq!(d.len(), 1, "attempt {attempt} due");
        assert_eq!(d[0].attempt, attempt);
        o.on_sent(&ch("a"), &mid("m1"), PacketId::new(format!("p{attempt}")), now).unwrap();
        let out = o.on_timeout(&ch("a"), &mid("m1"), now).unwrap();
        let wait = b.delay_ms(attempt);
        assert_eq!(out, Some(RetryOutcome::Scheduled { next_attempt_at: now + wait }));
        clock.advance(wait - 1);
        assert!(o.next_ready(clock.now_millis()).unwrap().is_empty(), "not before backoff");
        clock.advance(1);
    }
}

#[test]
fn retryable_rejection_keeps_pending_and_backs_off() {
    let clock = ManualClock::new(T0);
    let mut o = outbox(&clock);
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let sent = send_all(&mut o, T0);
    let ack = ChatMessageAck::rejected("m1", ErrorCode::ChannelBusy, "busy", true);
    let out = o.on_ack(&ch("a"), &ack, &sent[0].2, T0).unwrap();
    assert_eq!(out, AckOutcome::Retry(RetryOutcome::Scheduled { next_attempt_at: T0 + 1_000 }));
    assert!(o.is_pending(&ch("a"), &mid("m1")));
    assert!(o.next_ready(T0 + 999).unwrap().is_empty());
    let d = o.next_ready(T0 + 1_000).unwrap();
    assert_eq!(d[0].message_id, mid("m1"));
}

#[test]
fn non_retryable_rejection_is_failed_terminal_with_reason_kept() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let sent = send_all(&mut o, T0);
    let ack =
        ChatMessageAck::rejected("m1", ErrorCode::TargetDeliveryFailed, "platform refused", false);
    let out = o.on_ack(&ch("a"), &ack, &sent[0].2, T0).unwrap();
    let AckOutcome::Failed { code, reason } = out else { panic!("expected failure: {out:?}") };
    assert_eq!(code, ErrorCode::TargetDeliveryFailed);
    assert!(reason.contains("platform refused"));
    assert!(!o.is_pending(&ch("a"), &mid("m1")));
    let stats = o.stats();
    assert_eq!(stats.totals.failed, 1);
    assert_eq!(stats.totals.delivered, 0);
    assert!(stats.totals.last_error.unwrap().contains("target_delivery_failed"));
    // Never sent again.
    assert!(o.next_ready(T0 + HOUR).unwrap().is_empty());
}

#[test]
fn rejection_without_retryable_flag_is_not_retried() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let sent = send_all(&mut o, T0);
    let mut ack = ChatMessageAck::rejected("m1", ErrorCode::PermissionDenied, "no", false);
    ack.retryable = None;
    assert!(matches!(o.on_ack(&ch("a"), &ack, &sent[0].2, T0).unwrap(), AckOutcome::Failed { .. }));
}

#[test]
fn ack_must_match_reply_to() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    send_all(&mut o, T0);
    let out =
        o.on_ack(&ch("a"), &ChatMessageAck::accepted("m1"), &PacketId::new("other"), T0).unwrap();
    assert_eq!(out, AckOutcome::Ignored(IgnoredAck::ReplyToMismatch));
    assert!(o.is_pending(&ch("a"), &mid("m1")));
    // Wrong channel: unknown.
    let out = o.on_ack(&ch("b"), &ChatMessageAck::accepted("m1"), &PacketId::new("p-m1-1"), T0);
    assert_eq!(out.unwrap(), AckOutcome::Ignored(IgnoredAck::UnknownMessage));
}

#[test]
fn late_accept_of_an_earlier_transmission_counts_but_stale_retryable_does_not() {
    let clock = ManualClock::new(T0);
    let mut o = outbox(&clock);
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let first = send_all(&mut o, T0);
    o.on_timeout(&ch("a"), &mid("m1"), T0 + 30_000).unwrap();
    let second = send_all(&mut o, T0 + 31_000);
    assert_eq!(second.len(), 1);
    let stale = ChatMessageAck::rejected("m1", ErrorCode::ChannelBusy, "busy", true);
    assert_eq!(
        o.on_ack(&ch("a"), &stale, &first[0].2, T0 + 31_500).unwrap(),
        AckOutcome::Ignored(IgnoredAck::StaleRetryable)
    );
    let out = o.on_ack(&ch("a"), &ChatMessageAck::accepted("m1"), &first[0].2, T0 + 32_000);
    assert_eq!(out.unwrap(), AckOutcome::Delivered { status: AckStatus::Accepted });
}

#[test]
fn unknown_ack_status_keeps_message_pending() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let sent = send_all(&mut o, T0);
    let mut ack = ChatMessageAck::accepted("m1");
    ack.status = AckStatus::parse("maybe");
    assert_eq!(
        o.on_ack(&ch("a"), &ack, &sent[0].2, T0).unwrap(),
        AckOutcome::Ignored(IgnoredAck::UnknownStatus)
    );
    assert!(o.is_pending(&ch("a"), &mid("m1")));
}

#[test]
fn ttl_is_not_extended_by_retries() {
    let clock = ManualClock::new(T0);
    let mut o = outbox(&clock);
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let mut attempts = 0;
    while clock.now_millis() < T0 + 2 * HOUR {
        let now = clock.now_millis();
        for d in o.next_ready(now).unwrap() {
            assert!(now < d.expires_at, "handed out at or after expiry");
            assert_eq!(d.expires_at, T0 + HOUR);
            attempts += 1;
            o.on_sent(&d.channel, &d.message_id, PacketId::new(format!("p{attempts}")), now)
                .unwrap();
        }
        o.maintain(now).unwrap();
        if let Some(r) = o.record(&ch("a"), &mid("m1")) {
            assert_eq!(r.expires_at, T0 + HOUR);
            assert_eq!(r.first_responsibility_at, T0);
        }
        clock.advance(10_000);
    }
    assert!(attempts > 30, "retried many times: {attempts}");
    assert!(!o.is_pending(&ch("a"), &mid("m1")));
    let stats = o.stats();
    assert_eq!(stats.totals.expired, 1);
    assert_eq!(stats.totals.delivered, 0);
    assert!(
        o.drain_events().iter().any(
            |e| matches!(e, OutboxEvent::Expired { message_id, .. } if *message_id == mid("m1"))
        )
    );
}

#[test]
fn ttl_is_not_extended_by_restart() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::new();
    let config = OutboxConfig::new(Side::Connector);
    let mut o = Outbox::open(config, store.clone(), T0).unwrap();
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    o.enqueue(&ch("a"), msg("m2"), T0 + HOUR / 2).unwrap();
    send_all(&mut o, T0);
    drop(o); // crash while m1 is in flight

    clock.set(T0 + 40 * 60_000);
    let mut o = Outbox::open(config, store.clone(), clock.now_millis()).unwrap();
    assert_eq!(o.pending_ids(&ch("a")), vec![mid("m1"), mid("m2")], "FIFO order restored");
    let r = o.record(&ch("a"), &mid("m1")).unwrap();
    assert_eq!((r.first_responsibility_at, r.expires_at, r.attempts), (T0, T0 + HOUR, 1));
    // Redelivered with the same id after the restart.
    let d = o.next_ready(clock.now_millis()).unwrap();
    assert_eq!((d[0].message_id.clone(), d[0].attempt), (mid("m1"), 2));
    drop(o);

    // Restart again after m1's expiry: it expires at startup, m2 survives.
    let mut o = Outbox::open(config, store.clone(), T0 + HOUR).unwrap();
    assert_eq!(o.pending_ids(&ch("a")), vec![mid("m2")]);
    assert_eq!(o.stats().totals.expired, 1);
    assert!(o.drain_events().iter().any(|e| matches!(e, OutboxEvent::Expired { .. })));
    assert_eq!(store.pending_len(), 1);
}

#[test]
fn ttl_is_not_extended_by_channel_reopen() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    send_all(&mut o, T0);
    o.on_channel_closed(&ch("a"), T0 + 1).unwrap();
    assert!(o.next_ready(T0 + 10_000).unwrap().is_empty(), "closed channel is paused");
    o.on_channel_reopened(&ch("a"), T0 + HOUR - 5).unwrap();
    let d = o.next_ready(T0 + HOUR - 5).unwrap();
    assert_eq!(d[0].expires_at, T0 + HOUR);
    o.on_channel_closed(&ch("a"), T0 + HOUR - 4).unwrap();
    o.on_channel_reopened(&ch("a"), T0 + HOUR).unwrap();
    assert!(o.next_ready(T0 + HOUR).unwrap().is_empty());
    assert!(!o.is_pending(&ch("a"), &mid("m1")));
    assert_eq!(o.stats().totals.expired, 1);
}

#[test]
fn expired_message_is_never_delivered_even_when_due() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    // First chance to send is exactly at expiry.
    assert!(o.next_ready(T0 + HOUR).unwrap().is_empty());
    assert_eq!(o.stats().totals.expired, 1);
    assert_eq!(o.stats().totals.attempts, 0);
}

#[test]
fn in_flight_message_past_ttl_expires_on_timeout_not_redelivered() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let now = T0 + HOUR - 1;
    o.next_ready(T0).unwrap();
    o.on_send_failed(&ch("a"), &mid("m1"), "io", T0).unwrap();
    let d = o.next_ready(now).unwrap();
    o.on_sent(&d[0].channel, &d[0].message_id, PacketId::new("late"), now).unwrap();
    let out = o.on_timeout(&ch("a"), &mid("m1"), now + 30_000).unwrap();
    assert_eq!(out, Some(RetryOutcome::Expired));
    assert!(o.next_ready(now + 60_000).unwrap().is_empty());
    assert_eq!(o.stats().totals.expired, 1);
}

#[test]
fn head_of_line_pause_per_channel_while_other_channels_flow() {
    let clock = ManualClock::new(T0);
    let mut o = outbox(&clock);
    o.enqueue(&ch("a"), msg("a1"), T0).unwrap();
    o.enqueue(&ch("a"), msg("a2"), T0).unwrap();
    o.enqueue(&ch("b"), msg("b1"), T0).unwrap();
    o.enqueue(&ch("b"), msg("b2"), T0).unwrap();
    let sent = send_all(&mut o, T0);
    let ids: Vec<_> = sent.iter().map(|s| s.1.clone()).collect();
    assert_eq!(ids, vec![mid("a1"), mid("b1")], "one in flight per channel");
    // a1 fails temporarily: channel a pauses (a2 must not overtake), b continues.
    let ack = ChatMessageAck::rejected("a1", ErrorCode::ChannelBusy, "busy", true);
    o.on_ack(&ch("a"), &ack, &sent[0].2, T0).unwrap();
    o.on_ack(&ch("b"), &ChatMessageAck::accepted("b1"), &sent[1].2, T0).unwrap();
    let next = send_all(&mut o, T0 + 10);
    assert_eq!(next.iter().map(|s| s.1.clone()).collect::<Vec<_>>(), vec![mid("b2")]);
    let next = send_all(&mut o, T0 + 1_000);
    assert_eq!(next.iter().map(|s| s.1.clone()).collect::<Vec<_>>(), vec![mid("a1")]);
    o.on_ack(&ch("a"), &ChatMessageAck::accepted("a1"), &next[0].2, T0 + 1_000).unwrap();
    let next = send_all(&mut o, T0 + 1_001);
    assert_eq!(next.iter().map(|s| s.1.clone()).collect::<Vec<_>>(), vec![mid("a2")]);
}

#[test]
fn disconnect_keeps_messages_pending() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    o.enqueue(&ch("b"), msg("m2"), T0).unwrap();
    send_all(&mut o, T0);
    o.on_disconnect(T0 + 5).unwrap();
    let stats = o.stats();
    assert_eq!((stats.pending, stats.in_flight, stats.totals.delivered), (2, 0, 0));
    assert_eq!(stats.totals.last_error.as_deref(), Some("disconnected"));
    assert_eq!(o.next_ready(T0 + 1_005).unwrap().len(), 2);
}

#[test]
fn capacity_reject_new_is_recorded_and_not_delivery() {
    let mut config = OutboxConfig::new(Side::Connector);
    config.capacity_per_channel = 2;
    let mut o = Outbox::in_memory(config, T0);
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    o.enqueue(&ch("a"), msg("m2"), T0).unwrap();
    let err = o.enqueue(&ch("a"), msg("m3"), T0).unwrap_err();
    assert!(matches!(err, OutboxError::CapacityExceeded { capacity: 2, .. }));
    assert_eq!(err.code(), ErrorCode::CapacityExceeded);
    let stats = o.stats();
    assert_eq!((stats.totals.capacity_rejected, stats.totals.delivered), (1, 0));
    assert!(stats.totals.last_error.unwrap().starts_with("capacity_exceeded"));
    // Other channels are not affected.
    o.enqueue(&ch("b"), msg("m3"), T0).unwrap();
    // Expired messages are removed before capacity is judged.
    o.enqueue(&ch("a"), msg("m4"), T0 + HOUR).unwrap();
    assert_eq!(o.pending_ids(&ch("a")), vec![mid("m4")]);
}

#[test]
fn capacity_evict_oldest_is_recorded_and_not_delivery() {
    let mut config = OutboxConfig::new(Side::Connector);
    config.capacity_per_channel = 2;
    config.overflow = OverflowPolicy::EvictOldest;
    let mut o = Outbox::in_memory(config, T0);
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    o.enqueue(&ch("a"), msg("m2"), T0).unwrap();
    send_all(&mut o, T0); // m1 in flight: never evicted while in flight
    let out = o.enqueue(&ch("a"), msg("m3"), T0).unwrap();
    assert_eq!(out, EnqueueOutcome::Queued { expires_at: T0 + HOUR, evicted: Some(mid("m2")) });
    assert_eq!(o.pending_ids(&ch("a")), vec![mid("m1"), mid("m3")]);
    let stats = o.stats();
    assert_eq!((stats.totals.evicted, stats.totals.delivered), (1, 0));
    let events = o.drain_events();
    assert!(
        events.iter().any(
            |e| matches!(e, OutboxEvent::Evicted { message_id, .. } if *message_id == mid("m2"))
        )
    );
    assert!(!events.iter().any(|e| matches!(e, OutboxEvent::Delivered { .. })));
    assert!(o.store().pending(&ch("a"), &mid("m2")).is_none());
}

#[test]
fn same_message_id_with_other_content_is_a_conflict_on_enqueue() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    assert_eq!(o.enqueue(&ch("a"), msg("m1"), T0).unwrap(), EnqueueOutcome::AlreadyPending);
    let err = o.enqueue(&ch("a"), ChatMessage::text("m1", "other"), T0).unwrap_err();
    assert_eq!(err.code(), ErrorCode::MessageConflict);
    // The same id on another channel is another message.
    o.enqueue(&ch("b"), ChatMessage::text("m1", "other"), T0).unwrap();
}

#[test]
fn invalid_payload_is_refused_on_enqueue() {
    let mut o = outbox(&ManualClock::new(T0));
    let err = o.enqueue(&ch("a"), ChatMessage::with_files("m1", None, vec![]), T0).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidPacket);
    assert_eq!(o.stats().pending, 0);
}

#[test]
fn storage_failure_leaves_no_half_state() {
    let store = MemoryStore::new();
    let mut o = Outbox::open(OutboxConfig::default(), store.clone(), T0).unwrap();
    store.set_failing(true);
    assert!(matches!(o.enqueue(&ch("a"), msg("m1"), T0), Err(OutboxError::Store(_))));
    assert!(!o.is_pending(&ch("a"), &mid("m1")));
    store.set_failing(false);
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    store.set_failing(true);
    assert!(o.next_ready(T0).is_err());
    store.set_failing(false);
    assert_eq!(o.next_ready(T0).unwrap()[0].attempt, 1, "the failed hand-out did not count");
}

#[test]
fn v1_push_is_delivered_by_the_write() {
    let mut o = outbox(&ManualClock::new(T0));
    let push =
        MessagePushBuilder::new("telegram", "m1", "u1", "text").raw_text("hi").build().unwrap();
    o.enqueue(&ch("a"), push, T0).unwrap();
    let d = o.next_ready(T0).unwrap();
    assert_eq!(d[0].payload.packet_type(), "message.push");
    // A write failure keeps it pending with the same retention rules.
    o.on_send_failed(&ch("a"), &mid("m1"), "broken pipe", T0).unwrap();
    assert!(o.is_pending(&ch("a"), &mid("m1")));
    let d = o.next_ready(T0 + 1_000).unwrap();
    let out = o.on_sent(&d[0].channel, &d[0].message_id, PacketId::new("p"), T0 + 1_000).unwrap();
    assert_eq!(out, SentOutcome::DeliveredByWrite);
    assert!(!o.is_pending(&ch("a"), &mid("m1")));
    assert_eq!(o.stats().totals.delivered, 1);
}

#[test]
fn cleanup_interval_is_at_most_half_the_ttl() {
    let mut config = OutboxConfig::default();
    assert_eq!(config.effective_cleanup_interval_ms(), 60_000);
    config.ttl_ms = 60_000;
    assert_eq!(config.effective_cleanup_interval_ms(), 30_000);
    let o = Outbox::in_memory(config, T0);
    assert_eq!(o.stats().cleanup_interval_ms, 30_000);
    assert_eq!(o.next_wakeup(), T0 + 30_000);
}

#[test]
fn next_wakeup_tracks_retries_deadlines_and_expiry() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    assert_eq!(o.next_wakeup(), T0);
    send_all(&mut o, T0);
    assert_eq!(o.next_wakeup(), T0 + 30_000, "ack deadline");
    o.on_timeout(&ch("a"), &mid("m1"), T0 + 30_000).unwrap();
    assert_eq!(o.next_wakeup(), T0 + 31_000, "backoff");
}

#[test]
fn removed_channel_discards_without_claiming_delivery() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    o.remove_channel(&ch("a")).unwrap();
    let stats = o.stats();
    assert_eq!((stats.pending, stats.totals.discarded, stats.totals.delivered), (0, 1, 0));
    assert_eq!(o.store().pending_len(), 0);
}

#[test]
fn corrupt_stored_record_is_discarded_and_reported() {
    use xagent_profile_im::{OutboxStore, PendingRecord};
    let mut store = MemoryStore::new();
    store
        .save_pending(&PendingRecord {
            channel: ch("a"),
            message_id: mid("m1"),
            seq: 1,
            payload: "{not json".into(),
            attempts: 0,
            first_responsibility_at: T0,
            expires_at: T0 + HOUR,
            next_attempt_at: T0,
            last_error: None,
        })
        .unwrap();
    let mut o = Outbox::open(OutboxConfig::default(), store.clone(), T0).unwrap();
    assert_eq!(o.stats().totals.discarded, 1);
    assert!(matches!(o.drain_events()[0], OutboxEvent::Discarded { .. }));
    assert_eq!(store.pending_len(), 0);
}

#[test]
fn delivery_builds_its_packet_with_a_fresh_packet_id() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let d = o.next_ready(T0).unwrap().remove(0);
    let packet = d.to_packet("pkt_9");
    let json = packet.to_value().unwrap();
    assert_eq!(json["type"], "chat.message");
    assert_eq!(json["packet_id"], "pkt_9");
    assert_eq!(json["connector_channel_id"], "a");
    assert_eq!(json["payload"]["message_id"], "m1");
}

#[test]
fn re_enqueue_after_unswept_expiry_is_a_new_message_not_already_pending() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let out = o.enqueue(&ch("a"), msg("m1"), T0 + HOUR).unwrap();
    assert_eq!(out, EnqueueOutcome::Queued { expires_at: T0 + 2 * HOUR, evicted: None });
    assert_eq!(o.stats().totals.expired, 1);
}

#[test]
fn ack_overtaking_on_sent_is_deferred_then_applied() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let d = o.next_ready(T0).unwrap().remove(0);
    let packet = PacketId::new("pkt_fast");
    // The receiver answered before the runtime recorded the write.
    let early = o.on_ack(&ch("a"), &ChatMessageAck::accepted("m1"), &packet, T0).unwrap();
    assert_eq!(early, AckOutcome::Deferred);
    assert!(o.is_pending(&ch("a"), &mid("m1")));
    let sent = o.on_sent(&d.channel, &d.message_id, packet, T0).unwrap();
    assert_eq!(sent, SentOutcome::Acked(AckOutcome::Delivered { status: AckStatus::Accepted }));
    assert!(!o.is_pending(&ch("a"), &mid("m1")));
    assert_eq!(o.stats().totals.delivered, 1);
}

#[test]
fn deferred_ack_for_another_packet_is_dropped() {
    let mut o = outbox(&ManualClock::new(T0));
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let d = o.next_ready(T0).unwrap().remove(0);
    let other = PacketId::new("someone_else");
    assert_eq!(
        o.on_ack(&ch("a"), &ChatMessageAck::accepted("m1"), &other, T0).unwrap(),
        AckOutcome::Deferred
    );
    let sent = o.on_sent(&d.channel, &d.message_id, PacketId::new("mine"), T0).unwrap();
    assert_eq!(sent, SentOutcome::AwaitingAck { ack_deadline: T0 + 30_000 });
    assert!(o.is_pending(&ch("a"), &mid("m1")));
}

#[test]
fn one_pass_over_many_channels_counts_its_attempts_in_one_store_batch() {
    let store = MemoryStore::new();
    let mut o = Outbox::open(OutboxConfig::new(Side::Connector), store.clone(), T0).unwrap();
    for c in 0..16 {
        o.enqueue(&ch(&format!("c{c}")), msg(&format!("m{c}")), T0).unwrap();
    }
    let before = store.transactions();
    let ready = o.next_ready(T0).unwrap();
    assert_eq!(ready.len(), 16);
    assert_eq!(store.transactions() - before, 1, "16 attempt counts, one batch");
    assert!(ready.iter().all(|d| store.pending(&d.channel, &d.message_id).unwrap().attempts == 1));
}

#[test]
fn a_failed_attempt_batch_hands_out_nothing_and_changes_nothing() {
    let store = MemoryStore::new();
    let mut o = Outbox::open(OutboxConfig::new(Side::Connector), store.clone(), T0).unwrap();
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    o.enqueue(&ch("b"), msg("m2"), T0).unwrap();
    store.set_failing(true);
    assert!(o.next_ready(T0).is_err());
    store.set_failing(false);
    assert_eq!(o.stats().in_flight, 0);
    assert_eq!(o.record(&ch("a"), &mid("m1")).unwrap().attempts, 0);
    assert_eq!(o.next_ready(T0).unwrap().len(), 2);
}

fn deferred(store: &MemoryStore) -> Outbox<MemoryStore> {
    let mut config = OutboxConfig::new(Side::Connector);
    config.write_mode = WriteMode::Deferred;
    Outbox::open(config, store.clone(), T0).unwrap()
}

/// Commits what the outbox collected, as a runtime's group commit would: one batch.
fn commit(o: &mut Outbox<MemoryStore>, store: &MemoryStore) {
    let writes = o.take_writes();
    if !writes.is_empty() {
        OutboxStore::apply(&mut store.clone(), &writes).unwrap();
    }
}

#[test]
fn deferred_writes_cost_one_transaction_per_commit_not_per_message() {
    // Steady state: 64 channels, each round enqueues one message per channel, sends and acks
    // the previous one; the runtime commits once per round. Attempt counts and removals ride
    // along with the enqueues' commit.
    let store = MemoryStore::new();
    let mut o = deferred(&store);
    let rounds = 10;
    let mut in_flight: Vec<(ConnectorChannelId, MessageId, PacketId)> = Vec::new();
    for round in 0..rounds {
        for c in 0..64 {
            o.enqueue(&ch(&format!("c{c}")), msg(&format!("m{round}-{c}")), T0).unwrap();
        }
        for (channel, id, packet) in in_flight.drain(..) {
            let ack = ChatMessageAck::accepted(id);
            assert!(matches!(
                o.on_ack(&channel, &ack, &packet, T0).unwrap(),
                AckOutcome::Delivered { .. }
            ));
        }
        in_flight = send_all(&mut o, T0);
        assert_eq!(in_flight.len(), 64);
        assert_eq!(store.transactions(), round, "nothing reaches the store before the commit");
        commit(&mut o, &store);
    }
    // 640 messages enqueued, 640 attempts counted, 576 removed: 10 transactions.
    assert_eq!(store.transactions(), rounds);
    assert_eq!(store.pending_len(), 64);
    for (channel, id, _) in &in_flight {
        assert_eq!(store.pending(channel, id).unwrap().attempts, 1);
    }
}

#[test]
fn deferred_writes_coalesce_a_message_enqueued_and_acked_before_the_commit() {
    let store = MemoryStore::new();
    let mut o = deferred(&store);
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    let sent = send_all(&mut o, T0);
    o.on_ack(&ch("a"), &ChatMessageAck::accepted("m1"), &sent[0].2, T0).unwrap();
    // Save (enqueue), Attempt (send), Delete (ack): only the delete is left to commit.
    assert_eq!(o.take_writes(), vec![OutboxWrite::Delete(ch("a"), mid("m1"))]);
    assert!(!o.has_writes());
}

#[test]
fn crash_before_the_commit_forgets_only_what_was_not_acknowledged() {
    let store = MemoryStore::new();
    let mut o = deferred(&store);
    // m1 was enqueued and committed (the caller was told), then sent and acked, but the
    // removal was not committed yet when the process died.
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    commit(&mut o, &store);
    let sent = send_all(&mut o, T0);
    o.on_ack(&ch("a"), &ChatMessageAck::accepted("m1"), &sent[0].2, T0).unwrap();
    // m2 was enqueued but its commit never happened: the caller was never told it is queued.
    o.enqueue(&ch("a"), msg("m2"), T0).unwrap();
    drop(o);
    let mut restarted = deferred(&store);
    // m1 comes back and is delivered again (the receiver answers `duplicate`); m2 is the
    // caller's still, so it is not there.
    assert_eq!(restarted.pending_ids(&ch("a")), vec![mid("m1")]);
    let again = send_all(&mut restarted, T0);
    let dup = ChatMessageAck::duplicate("m1");
    assert!(matches!(
        restarted.on_ack(&ch("a"), &dup, &again[0].2, T0).unwrap(),
        AckOutcome::Delivered { status: AckStatus::Duplicate }
    ));
    commit(&mut restarted, &store);
    assert_eq!(store.pending_len(), 0);
}

fn windowed(window: usize) -> Outbox {
    let config = OutboxConfig { window, ..OutboxConfig::new(Side::Connector) };
    Outbox::in_memory(config, T0)
}

fn ids(sent: &[(ConnectorChannelId, MessageId, PacketId)]) -> Vec<MessageId> {
    sent.iter().map(|s| s.1.clone()).collect()
}

#[test]
fn window_sends_several_per_channel_in_queue_order_and_never_more_than_the_window() {
    let mut o = windowed(3);
    for i in 1..=5 {
        o.enqueue(&ch("a"), msg(&format!("a{i}")), T0).unwrap();
    }
    o.enqueue(&ch("b"), msg("b1"), T0).unwrap();
    let sent = send_all(&mut o, T0);
    assert_eq!(ids(&sent), vec![mid("a1"), mid("a2"), mid("a3"), mid("b1")]);
    assert_eq!(o.stats().in_flight, 4);
    assert_eq!(o.stats().channels[&ch("a")].in_flight_count, 3);
    // The window is full: nothing more for `a` until an ack frees a place.
    assert!(send_all(&mut o, T0).is_empty());
    // Acks may arrive in any order; each frees one place, filled in queue order.
    o.on_ack(&ch("a"), &ChatMessageAck::accepted("a2"), &sent[1].2, T0).unwrap();
    assert_eq!(ids(&send_all(&mut o, T0)), vec![mid("a4")]);
    o.on_ack(&ch("a"), &ChatMessageAck::accepted("a1"), &sent[0].2, T0).unwrap();
    assert_eq!(ids(&send_all(&mut o, T0)), vec![mid("a5")]);
    assert!(send_all(&mut o, T0).is_empty());
}

#[test]
fn window_zero_is_read_as_one() {
    let mut o = windowed(0);
    o.enqueue(&ch("a"), msg("a1"), T0).unwrap();
    o.enqueue(&ch("a"), msg("a2"), T0).unwrap();
    assert_eq!(ids(&send_all(&mut o, T0)), vec![mid("a1")]);
}

/// Profile IM v2 section 9: a retryable rejection is not delivery and the message is sent
/// again with its `message_id` after backoff; with a window, later messages that were not yet
/// sent never overtake it.
#[test]
fn window_a_message_in_backoff_is_never_overtaken_by_one_not_yet_sent() {
    let mut o = windowed(2);
    for i in 1..=4 {
        o.enqueue(&ch("a"), msg(&format!("a{i}")), T0).unwrap();
    }
    let sent = send_all(&mut o, T0);
    assert_eq!(ids(&sent), vec![mid("a1"), mid("a2")]);
    let busy = ChatMessageAck::rejected("a1", ErrorCode::ChannelBusy, "busy", true);
    let out = o.on_ack(&ch("a"), &busy, &sent[0].2, T0).unwrap();
    assert_eq!(out, AckOutcome::Retry(RetryOutcome::Scheduled { next_attempt_at: T0 + 1_000 }));
    // a2 was already in flight: its acceptance stands.
    o.on_ack(&ch("a"), &ChatMessageAck::accepted("a2"), &sent[1].2, T0).unwrap();
    // A place is free, but a3 must wait behind a1's backoff.
    assert!(send_all(&mut o, T0 + 10).is_empty());
    assert!(send_all(&mut o, T0 + 999).is_empty());
    // The backoff running out is enough to wake the channel (no other event needed).
    let next = send_all(&mut o, T0 + 1_000);
    assert_eq!(ids(&next), vec![mid("a1"), mid("a3")]);
    assert_eq!(o.record(&ch("a"), &mid("a1")).unwrap().attempts, 2);
}

/// Profile IM v2 section 7: a disconnection is not `accepted`. Every message of the window is
/// still pending and goes out again, in order, under its original `message_id`.
#[test]
fn window_disconnect_is_not_delivery_and_the_whole_window_is_redelivered_in_order() {
    let mut o = windowed(3);
    for i in 1..=3 {
        o.enqueue(&ch("a"), msg(&format!("a{i}")), T0).unwrap();
    }
    assert_eq!(send_all(&mut o, T0).len(), 3);
    o.on_disconnect(T0).unwrap();
    assert_eq!(o.stats().totals.delivered, 0);
    assert_eq!(o.pending_ids(&ch("a")), vec![mid("a1"), mid("a2"), mid("a3")]);
    // A closed channel that reopens sends its whole window at once, oldest first.
    o.on_channel_closed(&ch("a"), T0 + 1).unwrap();
    assert!(send_all(&mut o, T0 + 5_000).is_empty(), "a closed channel sends nothing");
    o.on_channel_reopened(&ch("a"), T0 + 5_000).unwrap();
    let again = send_all(&mut o, T0 + 5_000);
    assert_eq!(ids(&again), vec![mid("a1"), mid("a2"), mid("a3")]);
    assert!(again.iter().all(|(_, id, p)| p.as_str() == format!("p-{id}-2")));
}

#[test]
fn window_not_sent_returns_messages_at_once_without_backoff_or_a_counted_attempt() {
    let mut o = windowed(2);
    o.enqueue(&ch("a"), msg("a1"), T0).unwrap();
    o.enqueue(&ch("a"), msg("a2"), T0).unwrap();
    let ready = o.next_ready(T0).unwrap();
    assert_eq!(ready.len(), 2);
    // The transport had no room: both go back, in order, due now.
    assert!(o.on_not_sent(&ch("a"), &mid("a1")).unwrap());
    assert!(o.on_not_sent(&ch("a"), &mid("a2")).unwrap());
    assert_eq!(o.stats().totals.attempts, 0);
    assert_eq!(o.stats().totals.retries, 0);
    let again = o.next_ready(T0).unwrap();
    assert_eq!(
        again.iter().map(|d| (d.message_id.clone(), d.attempt)).collect::<Vec<_>>(),
        vec![(mid("a1"), 1), (mid("a2"), 1)]
    );
    // Only a message being handed out can go back; one already written cannot.
    o.on_sent(&ch("a"), &mid("a1"), PacketId::new("p1"), T0).unwrap();
    assert!(!o.on_not_sent(&ch("a"), &mid("a1")).unwrap());
    assert!(!o.on_not_sent(&ch("zz"), &mid("a1")).unwrap());
}

#[test]
fn next_ready_hands_out_nothing_twice_and_finds_channels_after_restart() {
    let store = MemoryStore::new();
    let config = OutboxConfig { window: 4, ..OutboxConfig::new(Side::Connector) };
    let mut o = Outbox::open(config, store.clone(), T0).unwrap();
    for c in 0..50 {
        o.enqueue(&ch(&format!("c{c}")), msg(&format!("m{c}")), T0).unwrap();
    }
    assert_eq!(o.next_ready(T0).unwrap().len(), 50);
    assert!(o.next_ready(T0).unwrap().is_empty(), "nothing changed: nothing handed out");
    drop(o);
    // A restarted outbox looks at every loaded channel once.
    let mut o = Outbox::open(config, store, T0 + 10).unwrap();
    assert_eq!(o.next_ready(T0 + 10).unwrap().len(), 50);
}

#[test]
fn enqueue_encoded_stores_the_given_encoding_and_behaves_like_enqueue() {
    use xagent_profile_im::OutboundPayload;
    let store = MemoryStore::new();
    let mut o = Outbox::open(OutboxConfig::new(Side::Connector), store.clone(), T0).unwrap();
    let payload = OutboundPayload::from(msg("m1"));
    let json = payload.to_json().unwrap();
    let outcome = o.enqueue_encoded(&ch("a"), payload.clone(), json.clone(), T0).unwrap();
    assert!(matches!(outcome, EnqueueOutcome::Queued { evicted: None, .. }));
    let stored = store.pending(&ch("a"), &mid("m1")).unwrap();
    assert_eq!(stored.payload, json, "the record keeps the encoding it was given");
    assert_eq!(OutboundPayload::from_json(&stored.payload).unwrap(), payload);
    // The same message again is already pending; other content under its id a conflict.
    let again = o.enqueue_encoded(&ch("a"), payload.clone(), json, T0).unwrap();
    assert_eq!(again, EnqueueOutcome::AlreadyPending);
    let other = OutboundPayload::from(ChatMessage::text("m1", "other text"));
    let other_json = other.to_json().unwrap();
    assert!(matches!(
        o.enqueue_encoded(&ch("a"), other, other_json, T0),
        Err(OutboxError::MessageConflict { .. })
    ));
    // A payload that breaks the Profile rules is refused as by enqueue.
    let empty = OutboundPayload::from(ChatMessage::text("m2", ""));
    let empty_json = empty.to_json().unwrap();
    assert!(o.enqueue_encoded(&ch("a"), empty, empty_json, T0).is_err());
    // Delivered the same way: one attempt handed out with the payload.
    let ready = o.next_ready(T0).unwrap();
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].payload, payload);
    assert_eq!(store.pending(&ch("a"), &mid("m1")).unwrap().attempts, 1);
}

#[test]
fn attempt_bookkeeping_is_written_narrowly_and_a_restart_restores_it() {
    let store = MemoryStore::new();
    let mut o = deferred(&store);
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    commit(&mut o, &store);
    let sent = send_all(&mut o, T0);
    assert_eq!(sent.len(), 1);
    // The transmission changes only the attempt count: no second copy of the payload.
    let writes = o.take_writes();
    assert!(
        matches!(writes.as_slice(), [OutboxWrite::Attempt(a)] if a.attempts == 1),
        "{writes:?}"
    );
    OutboxStore::apply(&mut store.clone(), &writes).unwrap();
    // No ack in time: redelivery after a backoff, with the reason kept.
    assert!(o.on_timeout(&ch("a"), &mid("m1"), T0 + 1_000).unwrap().is_some());
    let writes = o.take_writes();
    assert!(matches!(writes.as_slice(), [OutboxWrite::Attempt(_)]), "{writes:?}");
    OutboxStore::apply(&mut store.clone(), &writes).unwrap();
    let before = o.record(&ch("a"), &mid("m1")).unwrap().clone();
    assert!(before.next_attempt_at > T0 + 1_000);
    drop(o);
    let restarted = deferred(&store);
    let after = restarted.record(&ch("a"), &mid("m1")).unwrap();
    assert_eq!(after.attempts, 1);
    assert_eq!(after.next_attempt_at, before.next_attempt_at);
    assert_eq!(after.last_error.as_deref(), Some("ack timeout"));
    assert_eq!(after.payload, before.payload);
}

#[test]
fn an_attempt_in_the_same_batch_as_its_enqueue_keeps_the_insert() {
    let store = MemoryStore::new();
    let mut o = deferred(&store);
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    assert_eq!(send_all(&mut o, T0).len(), 1);
    // Save (enqueue) then Attempt: one save that already holds the attempt.
    let writes = o.take_writes();
    assert!(matches!(writes.as_slice(), [OutboxWrite::Save(r)] if r.attempts == 1), "{writes:?}");
    OutboxStore::apply(&mut store.clone(), &writes).unwrap();
    drop(o);
    let restarted = deferred(&store);
    assert_eq!(restarted.record(&ch("a"), &mid("m1")).unwrap().attempts, 1);
}

#[test]
fn attempt_writes_in_write_through_mode_reach_the_store() {
    let store = MemoryStore::new();
    let mut o = Outbox::open(OutboxConfig::new(Side::Connector), store.clone(), T0).unwrap();
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    assert_eq!(send_all(&mut o, T0).len(), 1);
    assert_eq!(store.pending(&ch("a"), &mid("m1")).unwrap().attempts, 1);
    o.on_timeout(&ch("a"), &mid("m1"), T0 + 1_000).unwrap();
    let stored = store.pending(&ch("a"), &mid("m1")).unwrap();
    assert_eq!(stored.last_error.as_deref(), Some("ack timeout"));
    assert_eq!(stored.next_attempt_at, o.record(&ch("a"), &mid("m1")).unwrap().next_attempt_at);
}

#[test]
fn coalescing_keeps_a_delete_over_a_later_attempt_and_a_save_over_an_earlier_one() {
    use xagent_profile_im::{AttemptUpdate, PendingRecord, coalesce_outbox_writes};
    let record = PendingRecord {
        channel: ch("a"),
        message_id: mid("m1"),
        seq: 1,
        payload: "{}".into(),
        attempts: 0,
        first_responsibility_at: T0,
        expires_at: T0 + HOUR,
        next_attempt_at: T0,
        last_error: None,
    };
    let attempt = |n| {
        let mut a = AttemptUpdate::of(&record);
        a.attempts = n;
        OutboxWrite::Attempt(a)
    };
    let delete = OutboxWrite::Delete(ch("a"), mid("m1"));
    // An attempt after a delete has no row to change: the delete stays.
    assert_eq!(coalesce_outbox_writes(vec![delete.clone(), attempt(1)]), vec![delete.clone()]);
    // A save after attempts replaces them; the last of two attempts wins.
    let save = OutboxWrite::Save(record.clone());
    assert_eq!(coalesce_outbox_writes(vec![attempt(1), save.clone()]), vec![save.clone()]);
    assert_eq!(coalesce_outbox_writes(vec![attempt(1), attempt(2)]), vec![attempt(2)]);
    // Save, attempt, attempt: one save holding the last count; other keys keep their order.
    let other = OutboxWrite::Delete(ch("b"), mid("m9"));
    let mut folded = record.clone();
    folded.attempts = 2;
    assert_eq!(
        coalesce_outbox_writes(vec![save, other.clone(), attempt(1), attempt(2)]),
        vec![OutboxWrite::Save(folded), other]
    );
}

#[test]
fn rekey_rule_a_renamed_channel_keeps_its_queue_in_flight_state_and_acks() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::new();
    let mut o = Outbox::open(OutboxConfig::new(Side::Xagent), store.clone(), T0).unwrap();
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    o.enqueue(&ch("a"), msg("m2"), T0).unwrap();
    let sent = send_all(&mut o, clock.now_millis());
    assert_eq!(sent.len(), 1, "one in flight per channel");
    // The Connector re-keyed `a` as `b`: the store moves the rows, then the outbox its queue.
    store.rename_channel(&ch("a"), &ch("b")).unwrap();
    o.on_channel_renamed(&ch("a"), &ch("b")).unwrap();
    assert!(o.pending_ids(&ch("a")).is_empty());
    assert_eq!(o.pending_ids(&ch("b")), vec![mid("m1"), mid("m2")], "order kept");
    assert!(store.pending(&ch("b"), &mid("m1")).is_some());
    assert!(store.pending(&ch("a"), &mid("m1")).is_none());
    // The ack of the transmission made before the rename arrives on the new id.
    let out = o.on_ack(&ch("b"), &ChatMessageAck::accepted("m1"), &sent[0].2, T0).unwrap();
    assert_eq!(out, AckOutcome::Delivered { status: AckStatus::Accepted });
    let next = send_all(&mut o, T0);
    assert_eq!(next.iter().map(|s| (&s.0, &s.1)).collect::<Vec<_>>(), vec![(&ch("b"), &mid("m2"))]);
    // A restart over the same store finds the message under the new id.
    drop(o);
    let mut o = Outbox::open(OutboxConfig::new(Side::Xagent), store, T0).unwrap();
    assert_eq!(o.pending_ids(&ch("b")), vec![mid("m2")]);
    assert!(send_all(&mut o, T0).iter().all(|s| s.0 == ch("b")));
}

#[test]
fn rekey_rule_renaming_onto_a_channel_with_messages_is_refused_and_changes_nothing() {
    let store = MemoryStore::new();
    let mut o = Outbox::open(OutboxConfig::new(Side::Xagent), store.clone(), T0).unwrap();
    o.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    o.enqueue(&ch("b"), msg("m2"), T0).unwrap();
    assert!(store.rename_channel(&ch("a"), &ch("b")).is_err(), "the store refuses a merge");
    let refused = o.on_channel_renamed(&ch("a"), &ch("b"));
    assert!(matches!(refused, Err(OutboxError::RenameTargetTaken { .. })), "{refused:?}");
    assert_eq!(o.pending_ids(&ch("a")), vec![mid("m1")]);
    assert_eq!(o.pending_ids(&ch("b")), vec![mid("m2")]);
    assert!(store.pending(&ch("a"), &mid("m1")).is_some());
    // Renaming an unknown channel moves nothing and is no error for the outbox.
    o.on_channel_renamed(&ch("zz"), &ch("yy")).unwrap();
    assert!(o.pending_ids(&ch("yy")).is_empty());
}

#[test]
fn a_deferred_outbox_opens_from_records_its_caller_loaded() {
    // An async backend loads the records itself and hands them over once.
    let store = MemoryStore::new();
    let mut first = deferred(&store);
    first.enqueue(&ch("a"), msg("m1"), T0).unwrap();
    first.enqueue(&ch("a"), msg("m2"), T0).unwrap();
    commit(&mut first, &store);
    let loaded = OutboxStore::load_pending(&mut store.clone()).unwrap();
    let mut config = OutboxConfig::new(Side::Connector);
    config.write_mode = WriteMode::Deferred;
    let mut reopened =
        Outbox::open(config, xagent_profile_im::DeferredStore::with_pending(loaded), T0).unwrap();
    assert!(reopened.is_pending(&ch("a"), &mid("m1")) && reopened.is_pending(&ch("a"), &mid("m2")));
    // Its writes come back to the caller, never into the hand-over store.
    let sent = send_all(&mut reopened, T0);
    assert_eq!(sent.len(), 1, "one in flight per channel, in order");
    assert!(!reopened.take_writes().is_empty(), "the attempt count is the caller's to commit");
}

/// Two replicas share one store: A takes responsibility for a message of a channel whose
/// socket is on B, forgets it in memory; B adopts the stored record and delivers it once, and
/// a second adopt (a repeated wake-up) adds nothing. A's forgetting writes nothing.
#[test]
fn a_record_written_by_one_replica_is_adopted_by_another_and_delivered_once() {
    let store = MemoryStore::new();
    let config = OutboxConfig::new(Side::Connector);
    let mut a = Outbox::open(config, store.clone(), T0).unwrap();
    let mut b = Outbox::open(config, store.clone(), T0).unwrap();
    b.raise_seq(T0 * 1024);
    a.raise_seq(T0 * 1024);
    a.enqueue(&ch("x"), msg("m1"), T0).unwrap();
    a.forget_channel(&ch("x"));
    assert!(a.pending_ids(&ch("x")).is_empty());
    assert!(a.take_writes().is_empty(), "forgetting writes nothing");
    assert_eq!(store.pending_len(), 1, "the record stays for the other replica");

    let stored = stored_of(&store);
    assert_eq!(b.adopt(stored.clone(), T0 + 1).unwrap(), 1);
    assert_eq!(b.adopt(stored, T0 + 2).unwrap(), 0, "already queued");
    let sent = send_all(&mut b, T0 + 2);
    assert_eq!(sent.len(), 1);
    let out = b.on_ack(&ch("x"), &ChatMessageAck::accepted("m1"), &sent[0].2, T0 + 3).unwrap();
    assert_eq!(out, AckOutcome::Delivered { status: AckStatus::Accepted });
    assert_eq!(store.pending_len(), 0);
    assert!(send_all(&mut b, T0 + 4).is_empty(), "delivered once");
}

/// An adopted record past its TTL expires instead of being delivered.
#[test]
fn an_adopted_record_past_its_ttl_expires() {
    let store = MemoryStore::new();
    let config = OutboxConfig::new(Side::Connector);
    let mut a = Outbox::open(config, store.clone(), T0).unwrap();
    a.enqueue(&ch("x"), msg("m1"), T0).unwrap();
    a.forget_channel(&ch("x"));
    let mut b = Outbox::open(config, MemoryStore::new(), T0 + HOUR).unwrap();
    b.adopt(stored_of(&store), T0 + HOUR).unwrap();
    assert!(send_all(&mut b, T0 + HOUR).is_empty());
    assert_eq!(b.stats().totals.expired, 1);
}

/// Every record in `store`.
fn stored_of(store: &MemoryStore) -> Vec<xagent_profile_im::PendingRecord> {
    store.clone().load_pending().unwrap()
}
