//! Property test of the delta assembler: whatever mix of in-order deltas, identical replays,
//! conflicting replays and gaps arrives, the assembled text is exactly the accepted fragments in
//! sequence order, each once.

use proptest::prelude::*;
use xagent_profile_im::{DeltaAction, DeltaAssembler, DeltaConfig, DeltaError};
use xagent_protocol_types::{ChatMessageDelta, ConnectorChannelId, MessageId};

#[derive(Clone, Debug)]
enum Step {
    Next(String),
    Replay(usize),
    Conflict(usize),
    Gap(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => "[a-z]{0,4}".prop_map(Step::Next),
        2 => (0..20usize).prop_map(Step::Replay),
        1 => (0..20usize).prop_map(Step::Conflict),
        1 => (2..5u64).prop_map(Step::Gap),
    ]
}

proptest! {
    #[test]
    fn deltas_never_append_twice(steps in proptest::collection::vec(step(), 1..60)) {
        let channel = ConnectorChannelId::new("c");
        let id = MessageId::new("m");
        let mut d = DeltaAssembler::new(DeltaConfig::default());
        let mut accepted: Vec<String> = Vec::new();
        for s in steps {
            let next = accepted.len() as u64 + 1;
            match s {
                Step::Next(text) => {
                    let r = d.on_delta(&channel, &ChatMessageDelta::new("m", next, text.clone()), 0);
                    prop_assert!(matches!(r, Ok(DeltaAction::Buffered)));
                    accepted.push(text);
                }
                Step::Replay(i) if !accepted.is_empty() => {
                    let i = i % accepted.len();
                    let r = d.on_delta(&channel, &ChatMessageDelta::new("m", i as u64 + 1, accepted[i].clone()), 0);
                    prop_assert_eq!(r, Ok(DeltaAction::Replay));
                }
                Step::Conflict(i) if !accepted.is_empty() => {
                    let i = i % accepted.len();
                    let changed = format!("{}!", accepted[i]);
                    let r = d.on_delta(&channel, &ChatMessageDelta::new("m", i as u64 + 1, changed), 0);
                    let is_conflict = matches!(r, Err(DeltaError::ConflictingRetransmission { .. }));
                    prop_assert!(is_conflict);
                }
                Step::Gap(skip) => {
                    let r = d.on_delta(&channel, &ChatMessageDelta::new("m", next + skip - 1, "x"), 0);
                    let is_gap = matches!(r, Err(DeltaError::SequenceGap { .. }));
                    prop_assert!(is_gap);
                }
                _ => {}
            }
            if !accepted.is_empty() {
                prop_assert_eq!(d.assembled_text(&channel, &id), Some(accepted.concat()));
            }
        }
    }
}
