//! Property test of the scheduler: under random submits, starts, finishes and timeouts, a side
//! effect never runs beside anything else on its channel, observations never exceed the limit,
//! and operations of a channel start in submission order.

use std::collections::HashMap;

use proptest::prelude::*;
use xagent_profile_device::{Effect, ExecutorConfig, OpId, Scheduler};
use xagent_protocol_types::ConnectorChannelId;

#[derive(Clone, Debug)]
enum Op {
    Submit(usize, bool),
    Start,
    Finish(usize),
    Advance(u64),
    Poll,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, any::<bool>()).prop_map(|(c, s)| Op::Submit(c, s)),
        3 => Just(Op::Start),
        3 => (0..16usize).prop_map(Op::Finish),
        1 => (0..40_000u64).prop_map(Op::Advance),
        1 => Just(Op::Poll),
    ]
}

proptest! {
    #[test]
    fn scheduler_serialises_side_effects(ops in proptest::collection::vec(op(), 1..120)) {
        let config = ExecutorConfig { max_concurrent_observations: 2, max_queued_per_channel: 8, ..ExecutorConfig::default() };
        let mut s = Scheduler::new(config);
        let channels = [ConnectorChannelId::new("a"), ConnectorChannelId::new("b")];
        let mut effects: HashMap<OpId, (usize, Effect)> = HashMap::new();
        let mut last_started: HashMap<usize, OpId> = HashMap::new();
        let mut now = 0u64;
        for op in ops {
            match op {
                Op::Submit(c, side) => {
                    let effect = if side { Effect::SideEffect } else { Effect::Observe };
                    if let Ok(id) = s.submit(&channels[c], effect, now) {
                        effects.insert(id, (c, effect));
                    }
                }
                Op::Start => {
                    for (ch, id) in s.start_ready(now) {
                        let c = channels.iter().position(|x| *x == ch).unwrap();
                        if let Some(prev) = last_started.get(&c) {
                            prop_assert!(*prev < id, "started out of order");
                        }
                        last_started.insert(c, id);
                    }
                }
                Op::Finish(i) => {
                    let c = i % 2;
                    let running = s.running(&channels[c]);
                    if let Some(id) = running.get(i / 2 % running.len().max(1)) {
                        prop_assert!(s.finish(&channels[c], *id));
                    }
                }
                Op::Advance(ms) => now += ms,
                Op::Poll => {
                    s.poll_timeouts(now);
                }
            }
            for ch in &channels {
                let running = s.running(ch);
                let sides = running.iter().filter(|id| effects[id].1 == Effect::SideEffect).count();
                prop_assert!(sides <= 1, "two side effects at once");
                if sides == 1 {
                    prop_assert_eq!(running.len(), 1, "side effect beside an observation");
                }
                prop_assert!(running.len() <= 2, "observation limit exceeded");
            }
        }
    }
}
