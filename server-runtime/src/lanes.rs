//! Per-channel ordering with cross-channel concurrency: work for one channel runs one job at a
//! time in arrival order, work for different channels runs side by side, so a slow target
//! delivery on one channel never holds up another channel on the same socket.
//!
//! A lane (a task and a small queue) exists only while its channel has work: the task removes
//! its lane when the queue is empty, so an idle channel costs nothing here. A full lane refuses
//! new work ([`LaneFull`]) instead of making the caller (the socket's reader) wait, which would
//! stall every other channel; the caller answers with a retryable refusal.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;

/// A unit of work in a lane.
pub(crate) type Job = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The lane of this channel already holds its maximum of queued jobs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LaneFull;

/// Ordered lanes keyed by channel.
pub(crate) struct Lanes<K> {
    lanes: Arc<Mutex<HashMap<K, mpsc::Sender<Job>>>>,
    capacity: usize,
}

impl<K> std::fmt::Debug for Lanes<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<K: Eq + Hash + Clone + Send + 'static> Lanes<K> {
    /// Lanes queueing at most `capacity` jobs per channel (the one running included).
    pub(crate) fn new(capacity: usize) -> Self {
        Self { lanes: Arc::new(Mutex::new(HashMap::new())), capacity: capacity.max(1) }
    }

    /// Queues `job` behind the channel's earlier jobs; never waits. Must be called inside a
    /// tokio runtime (a new lane spawns its task).
    pub(crate) fn submit(
        &self,
        key: &K,
        job: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), LaneFull> {
        let job: Job = Box::pin(job);
        let mut lanes = lock(&self.lanes);
        let job = match lanes.get(key) {
            None => job,
            Some(sender) => match sender.try_send(job) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Full(_)) => return Err(LaneFull),
                // The task is gone (it only exits under this lock after removing its entry,
                // so this is a task that panicked): replace the lane.
                Err(mpsc::error::TrySendError::Closed(job)) => job,
            },
        };
        // Started under the same lock that found no lane, so two submitters of one key never
        // both start one (which would run the channel's jobs in two tasks, out of order).
        self.start_lane(&mut lanes, key, job);
        Ok(())
    }

    fn start_lane(&self, lanes: &mut HashMap<K, mpsc::Sender<Job>>, key: &K, first: Job) {
        let (sender, mut receiver) = mpsc::channel::<Job>(self.capacity);
        // A fresh channel has room for the first job.
        let _ = sender.try_send(first);
        lanes.insert(key.clone(), sender);
        let lanes = self.lanes.clone();
        let key = key.clone();
        tokio::spawn(async move {
            loop {
                while let Ok(job) = receiver.try_recv() {
                    job.await;
                }
                // Empty: leave, unless a job arrived meanwhile (submitters hold the same lock).
                let mut map = lock(&lanes);
                match receiver.try_recv() {
                    Ok(job) => {
                        drop(map);
                        job.await;
                    }
                    Err(_) => {
                        map.remove(&key);
                        return;
                    }
                }
            }
        });
    }

    /// Channels with queued or running work.
    #[cfg(test)]
    pub(crate) fn active(&self) -> usize {
        lock(&self.lanes).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::{Notify, oneshot};

    #[tokio::test]
    async fn one_channels_jobs_run_in_order_and_a_blocked_channel_does_not_block_others() {
        let lanes: Lanes<&'static str> = Lanes::new(16);
        let gate = Arc::new(Notify::new());
        let log = Arc::new(Mutex::new(Vec::new()));
        // Channel "slow": its first job waits for the gate, then two more queue behind it.
        for i in 0..3 {
            let (gate, log) = (gate.clone(), log.clone());
            lanes
                .submit(&"slow", async move {
                    if i == 0 {
                        gate.notified().await;
                    }
                    lock(&log).push(format!("slow{i}"));
                })
                .unwrap();
        }
        // 50 other channels complete while "slow" is blocked.
        let mut done = Vec::new();
        for c in 0..50 {
            let (tx, rx) = oneshot::channel();
            let log = log.clone();
            let key: &'static str = Box::leak(format!("fast{c}").into_boxed_str());
            lanes
                .submit(&key, async move {
                    lock(&log).push(key.to_string());
                    let _ = tx.send(());
                })
                .unwrap();
            done.push(rx);
        }
        for rx in done {
            rx.await.unwrap();
        }
        assert!(lock(&log).iter().all(|e| e.starts_with("fast")), "slow ran before its gate");
        assert_eq!(lock(&log).len(), 50);
        gate.notify_one();
        let (tx, rx) = oneshot::channel();
        lanes.submit(&"slow", async move { tx.send(()).unwrap() }).unwrap();
        rx.await.unwrap();
        let slow: Vec<String> =
            lock(&log).iter().filter(|e| e.starts_with("slow")).cloned().collect();
        assert_eq!(slow, vec!["slow0", "slow1", "slow2"], "per-channel order kept");
    }

    #[tokio::test]
    async fn a_full_lane_refuses_instead_of_waiting_and_idle_lanes_go_away() {
        let lanes: Lanes<u32> = Lanes::new(2);
        let gate = Arc::new(Notify::new());
        let waiting = gate.clone();
        lanes.submit(&1, async move { waiting.notified().await }).unwrap();
        // The running job may or may not have left the queue yet: fill until refused.
        let mut accepted = 0;
        while lanes.submit(&1, async {}).is_ok() {
            accepted += 1;
            assert!(accepted <= 2, "the lane holds more than its capacity");
        }
        assert_eq!(lanes.submit(&1, async {}), Err(LaneFull));
        // Another channel is not affected.
        let (tx, rx) = oneshot::channel();
        lanes.submit(&2, async move { tx.send(()).unwrap() }).unwrap();
        rx.await.unwrap();
        gate.notify_one();
        // Once everything ran, no lane is left.
        for _ in 0..100 {
            if lanes.active() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(lanes.active(), 0);
    }
}
