//! Outbox wake-ups from other replicas, taken in batches: each channel read once with its
//! named records merged, the order kept against the other events behind them.

use tokio::sync::broadcast::error::RecvError;
use xagent_protocol_types::{ConnectorChannelId, MessageId};

use crate::handle::Broadcast;
use crate::storage::ClusterEvent;

/// At most this many queued wake-ups are taken together.
const WAKEUP_BATCH: usize = 256;

/// What outbox wake-ups ask the socket holder to adopt, for one channel.
#[derive(Debug)]
pub(super) struct Want {
    pub(super) channel: ConnectorChannelId,
    /// The named records, or `None` for all of the channel's.
    pub(super) ids: Option<Vec<MessageId>>,
    /// Those of them the wake-ups carried (need not be read).
    pub(super) records: Vec<xagent_profile_im::PendingRecord>,
}

/// By channel, in the order first woken.
pub(super) type Wanted = Vec<Want>;

/// What `first` and the outbox wake-ups queued right behind it ask to read (each channel once,
/// its ids merged), and the first other event, which must be handled after them to keep the
/// order. Author broadcasts queued in between go to `broadcast` as they come: they say
/// nothing about outbox records, and under load every other wake-up is one of them (without
/// this, a broadcast between each two wake-ups would leave one read per wake-up).
pub(super) fn drain_outbox_wakeups(
    events: &mut tokio::sync::broadcast::Receiver<ClusterEvent>,
    first: ClusterEvent,
    mut broadcast: impl FnMut(Broadcast),
) -> (Wanted, Option<Result<ClusterEvent, RecvError>>) {
    use tokio::sync::broadcast::error::TryRecvError;
    let mut wanted: Wanted = Vec::new();
    let mut add = |event: ClusterEvent| {
        let (channel, ids, records) = match event {
            ClusterEvent::Outbox(channel) => (channel, None, Vec::new()),
            ClusterEvent::OutboxRecords { channel, ids, records } => (channel, Some(ids), records),
            ClusterEvent::Broadcast { topic, message } => {
                broadcast(Broadcast { topic, message });
                return None;
            }
            other => return Some(other),
        };
        let Some(want) = wanted.iter_mut().find(|w| w.channel == channel) else {
            wanted.push(Want { channel, ids, records });
            return None;
        };
        match (want.ids.as_mut(), ids) {
            (Some(known), Some(ids)) => {
                for id in ids {
                    if !known.contains(&id) {
                        known.push(id);
                    }
                }
                // A later wake-up about the same record carries its later form.
                for record in records {
                    want.records.retain(|r| r.message_id != record.message_id);
                    want.records.push(record);
                }
            }
            // One of them asks for all of the channel's records: they are read.
            _ => {
                want.ids = None;
                want.records.clear();
            }
        }
        None
    };
    if let Some(other) = add(first) {
        return (Vec::new(), Some(Ok(other)));
    }
    for _ in 0..WAKEUP_BATCH {
        match events.try_recv() {
            Ok(event) => {
                if let Some(other) = add(event) {
                    return (wanted, Some(Ok(other)));
                }
            }
            Err(TryRecvError::Lagged(missed)) => {
                return (wanted, Some(Err(RecvError::Lagged(missed))));
            }
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Closed) => return (wanted, Some(Err(RecvError::Closed))),
        }
    }
    (wanted, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox(id: &str) -> ClusterEvent {
        ClusterEvent::Outbox(ConnectorChannelId::new(id))
    }

    fn records(channel: &str, ids: &[&str]) -> ClusterEvent {
        ClusterEvent::OutboxRecords {
            channel: ConnectorChannelId::new(channel),
            ids: ids.iter().map(|id| MessageId::new(*id)).collect(),
            records: Vec::new(),
        }
    }

    fn record(channel: &str, id: &str, attempts: u32) -> xagent_profile_im::PendingRecord {
        xagent_profile_im::PendingRecord {
            channel: ConnectorChannelId::new(channel),
            message_id: MessageId::new(id),
            seq: 1,
            payload: "{}".into(),
            attempts,
            first_responsibility_at: 0,
            expires_at: 0,
            next_attempt_at: 0,
            last_error: None,
        }
    }

    /// A wake-up carrying its records (`attempts` tells the versions apart).
    fn carrying(channel: &str, ids: &[(&str, u32)]) -> ClusterEvent {
        ClusterEvent::OutboxRecords {
            channel: ConnectorChannelId::new(channel),
            ids: ids.iter().map(|(id, _)| MessageId::new(*id)).collect(),
            records: ids.iter().map(|(id, a)| record(channel, id, *a)).collect(),
        }
    }

    fn shown(wanted: &Wanted) -> Vec<(&str, Option<Vec<&str>>)> {
        wanted
            .iter()
            .map(|w| {
                let ids = w.ids.as_ref().map(|ids| ids.iter().map(MessageId::as_str).collect());
                (w.channel.as_str(), ids)
            })
            .collect()
    }

    #[test]
    fn carried_records_are_merged_the_later_form_kept_and_dropped_when_all_are_read() {
        let (tx, mut rx) = tokio::sync::broadcast::channel(16);
        for event in
            [carrying("cch_a", &[("m2", 0)]), carrying("cch_a", &[("m1", 3)]), outbox("cch_b")]
        {
            tx.send(event).ok();
        }
        tx.send(carrying("cch_b", &[("m9", 0)])).ok();
        let (wanted, next) = drain_outbox_wakeups(&mut rx, carrying("cch_a", &[("m1", 1)]), |_| {});
        assert!(next.is_none());
        assert_eq!(shown(&wanted), [("cch_a", Some(vec!["m1", "m2"])), ("cch_b", None)]);
        let carried: Vec<(&str, u32)> =
            wanted[0].records.iter().map(|r| (r.message_id.as_str(), r.attempts)).collect();
        assert_eq!(carried, [("m2", 0), ("m1", 3)], "m1 in the form of its later wake-up");
        assert!(wanted[1].records.is_empty(), "the channel is read whole: nothing carried");
    }

    #[test]
    fn queued_outbox_wakeups_read_each_channel_once_and_keep_what_follows_in_order() {
        let (tx, mut rx) = tokio::sync::broadcast::channel(16);
        for event in [
            records("cch_b", &["m1"]),
            records("cch_a", &["m2"]),
            records("cch_b", &["m3", "m1"]),
            ClusterEvent::Broadcast { topic: "t".into(), message: "between".into() },
            outbox("cch_c"),
            records("cch_c", &["m4"]),
            ClusterEvent::Resync,
        ] {
            tx.send(event).ok();
        }
        tx.send(outbox("cch_d")).ok();
        let mut passed = Vec::new();
        let (wanted, next) =
            drain_outbox_wakeups(&mut rx, records("cch_a", &["m0"]), |b| passed.push(b.message));
        assert_eq!(passed, ["between"], "a broadcast in between is handed on at once");
        assert_eq!(
            shown(&wanted),
            [("cch_a", Some(vec!["m0", "m2"])), ("cch_b", Some(vec!["m1", "m3"])), ("cch_c", None),],
            "each channel once, its ids merged; one asking for all reads all"
        );
        assert!(matches!(next, Some(Ok(ClusterEvent::Resync))), "the resync comes next");
        assert!(matches!(rx.try_recv(), Ok(ClusterEvent::Outbox(c)) if c.as_str() == "cch_d"));
        let (wanted, next) = drain_outbox_wakeups(&mut rx, outbox("cch_e"), |_| {});
        assert_eq!(shown(&wanted), [("cch_e", None)]);
        assert!(next.is_none(), "nothing queued");
    }
}
