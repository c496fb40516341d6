//! The Profile's own wire examples (tests/fixtures, see the README there) through the machines.

use xagent_profile_im::{
    AckOutcome, ActivityAction, ActivityCapability, ActivityConfig, ActivityTracker, Admission,
    DeltaAction, DeltaAssembler, DeltaConfig, FinalAction, IdempotencyConfig, Outbox, OutboxConfig,
    ReceiverIdempotency, validate_chat_message,
};
use xagent_protocol_types::{
    ChatActivity, ChatMessage, ChatMessageAck, ChatMessageDelta, ErrorCode, Packet, PacketId, Side,
};

fn packet(name: &str) -> Packet {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    Packet::decode_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn example_inbound_message_is_valid_and_accepted_once() {
    let p = packet("im_v2_chat_message.json");
    let channel = p.connector_channel_id.clone().unwrap();
    let message: &ChatMessage = p.payload().unwrap();
    validate_chat_message(message, Side::Connector).unwrap();
    let mut set = ReceiverIdempotency::in_memory(IdempotencyConfig::default());
    let Admission::Process(t) = set.begin_chat(&channel, message, 1_790_000_000_000).unwrap()
    else {
        panic!()
    };
    set.complete(t, 1_790_000_000_001).unwrap();
    assert!(matches!(
        set.begin_chat(&channel, message, 1_790_000_000_002).unwrap(),
        Admission::Duplicate(_)
    ));
}

#[test]
fn example_message_without_download_url_is_refused_inbound() {
    let p = packet("im_v2_chat_message.json");
    let mut message: ChatMessage = p.payload::<ChatMessage>().unwrap().clone();
    message.files[0].download_url = None;
    assert!(validate_chat_message(&message, Side::Connector).is_err());
    validate_chat_message(&message, Side::Xagent).unwrap();
}

#[test]
fn example_delta_then_final() {
    let p = packet("im_v2_delta.json");
    let channel = p.connector_channel_id.clone().unwrap();
    let delta: &ChatMessageDelta = p.payload().unwrap();
    let mut d = DeltaAssembler::new(DeltaConfig::default());
    assert_eq!(d.on_delta(&channel, delta, 0).unwrap(), DeltaAction::Buffered);
    assert_eq!(d.on_delta(&channel, delta, 1).unwrap(), DeltaAction::Replay);
    assert_eq!(d.on_final(&channel, &delta.message_id), FinalAction::SendNew);
}

#[test]
fn example_rejected_ack_ends_the_message_as_failed() {
    let p = packet("im_v2_ack_rejected.json");
    let channel = p.connector_channel_id.clone().unwrap();
    let reply_to = p.reply_to.clone().unwrap();
    let ack: &ChatMessageAck = p.payload().unwrap();
    let mut o = Outbox::in_memory(OutboxConfig::new(Side::Connector), 0);
    o.enqueue(&channel, ChatMessage::text(ack.message_id.clone(), "Summarize"), 0).unwrap();
    o.next_ready(0).unwrap();
    o.on_sent(&channel, &ack.message_id, reply_to.clone(), 0).unwrap();
    let out = o.on_ack(&channel, ack, &reply_to, 1).unwrap();
    assert!(
        matches!(out, AckOutcome::Failed { code: ErrorCode::TargetDeliveryFailed, .. }),
        "{out:?}"
    );
    assert_eq!(
        o.on_ack(&channel, ack, &PacketId::new("x"), 2).unwrap(),
        AckOutcome::Ignored(xagent_profile_im::IgnoredAck::UnknownMessage)
    );
}

#[test]
fn example_activity_is_shown_or_degraded() {
    let p = packet("im_v2_activity_tool.json");
    let channel = p.connector_channel_id.clone().unwrap();
    let activity: &ChatActivity = p.payload().unwrap();
    let mut custom = ActivityTracker::new(ActivityConfig {
        capability: ActivityCapability::CustomStatus,
        ..ActivityConfig::default()
    });
    assert!(matches!(
        custom.on_activity(&channel, activity, 0).unwrap(),
        ActivityAction::Show { .. }
    ));
    let mut typing = ActivityTracker::new(ActivityConfig::default());
    assert_eq!(typing.on_activity(&channel, activity, 0).unwrap(), ActivityAction::Typing);
}
