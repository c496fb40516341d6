//! The book of settled acks behind [`crate::DataPlane::settled_ack`]: the ack that ended an
//! assistant message's delivery, by persisted channel and message id, kept for the last
//! [`RECENT_SETTLED_ACKS`] messages, and the callers waiting for one. Part of the data plane's
//! shared state; the outbox's ack handling (`im`) records into it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;
use xagent_protocol_types::{ChatMessageAck, ConnectorChannelId, MessageId};

/// How many settled acks are kept for callers that ask after the ack arrived.
pub const RECENT_SETTLED_ACKS: usize = 256;

type Key = (ConnectorChannelId, MessageId);

#[derive(Default)]
struct Book {
    recent: VecDeque<(Key, ChatMessageAck)>,
    waiting: HashMap<Key, Vec<oneshot::Sender<ChatMessageAck>>>,
}

/// Settled acks and the callers waiting for them, by (persisted channel, message id).
#[derive(Default)]
pub(crate) struct SettledAcks(Mutex<Book>);

impl std::fmt::Debug for SettledAcks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettledAcks").finish_non_exhaustive()
    }
}

/// Either the ack (already settled) or where it will arrive.
enum Ticket {
    Settled(ChatMessageAck),
    Waiting(oneshot::Receiver<ChatMessageAck>),
}

impl SettledAcks {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the ack that ended a message's delivery on `channel` (the persisted id) and
    /// hands it to everyone waiting.
    pub(crate) fn settle(&self, channel: &ConnectorChannelId, ack: &ChatMessageAck) {
        let key = (channel.clone(), ack.message_id.clone());
        let mut book = self.book();
        for waiter in book.waiting.remove(&key).unwrap_or_default() {
            let _ = waiter.send(ack.clone());
        }
        book.recent.retain(|(kept, _)| kept != &key);
        book.recent.push_back((key, ack.clone()));
        while book.recent.len() > RECENT_SETTLED_ACKS {
            book.recent.pop_front();
        }
    }

    fn ticket(&self, channel: &ConnectorChannelId, message_id: &MessageId) -> Ticket {
        let key = (channel.clone(), message_id.clone());
        let mut book = self.book();
        if let Some((_, ack)) = book.recent.iter().find(|(kept, _)| kept == &key) {
            return Ticket::Settled(ack.clone());
        }
        let (sender, receiver) = oneshot::channel();
        book.waiting.entry(key).or_default().push(sender);
        Ticket::Waiting(receiver)
    }

    /// Forgets waiters that gave up.
    fn prune(&self, channel: &ConnectorChannelId, message_id: &MessageId) {
        let key = (channel.clone(), message_id.clone());
        let mut book = self.book();
        if let Some(waiters) = book.waiting.get_mut(&key) {
            waiters.retain(|w| !w.is_closed());
            if waiters.is_empty() {
                book.waiting.remove(&key);
            }
        }
    }

    /// Waits up to `within` for the settling ack of a message on `channel` (persisted id).
    pub(crate) async fn wait(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        within: Duration,
    ) -> Option<ChatMessageAck> {
        let receiver = match self.ticket(channel, message_id) {
            Ticket::Settled(ack) => return Some(ack),
            Ticket::Waiting(receiver) => receiver,
        };
        let answer = tokio::time::timeout(within, receiver).await.ok().and_then(Result::ok);
        if answer.is_none() {
            self.prune(channel, message_id);
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::ErrorCode;

    fn channel() -> ConnectorChannelId {
        ConnectorChannelId::new("cch_1")
    }

    #[tokio::test(start_paused = true)]
    async fn settled_ack_rule_an_ack_before_the_wait_is_still_found() {
        let acks = SettledAcks::default();
        acks.settle(&channel(), &ChatMessageAck::accepted("msg_1"));
        let found = acks.wait(&channel(), &"msg_1".into(), Duration::ZERO).await;
        assert_eq!(found.map(|a| a.status.to_string()), Some("accepted".into()));
        // Another channel's message of the same id is another message.
        let other = acks.wait(&"cch_2".into(), &"msg_1".into(), Duration::from_secs(1)).await;
        assert!(other.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn settled_ack_rule_a_waiter_hears_the_ack_and_a_late_one_times_out() {
        let acks = std::sync::Arc::new(SettledAcks::default());
        let waiting = {
            let acks = acks.clone();
            tokio::spawn(async move {
                acks.wait(&channel(), &"msg_2".into(), Duration::from_secs(10)).await
            })
        };
        tokio::task::yield_now().await;
        let rejected =
            ChatMessageAck::rejected("msg_2", ErrorCode::TargetDeliveryFailed, "no", false);
        acks.settle(&channel(), &rejected);
        let heard = waiting.await.ok().flatten();
        assert_eq!(heard.and_then(|a| a.code), Some(ErrorCode::TargetDeliveryFailed));
        let late = acks.wait(&channel(), &"msg_3".into(), Duration::from_secs(10)).await;
        assert!(late.is_none());
        assert!(acks.book().waiting.is_empty(), "a waiter that gave up is forgotten");
    }

    #[test]
    fn settled_ack_rule_only_the_latest_acks_are_kept() {
        let acks = SettledAcks::default();
        for n in 0..RECENT_SETTLED_ACKS + 10 {
            acks.settle(&channel(), &ChatMessageAck::accepted(format!("msg_{n}")));
        }
        let book = acks.book();
        assert_eq!(book.recent.len(), RECENT_SETTLED_ACKS);
        assert_eq!(book.recent.front().map(|(k, _)| k.1.as_str()), Some("msg_10"));
    }
}
