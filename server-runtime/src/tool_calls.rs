//! The repeated-call registry of `tool.invoke`: one window for every side-effecting Tool.
//!
//! A call is keyed by channel + `tool_call_id` (or the `request_id` without one) and
//! fingerprinted by Tool id + arguments. [`ToolCalls::begin`] decides, without I/O of its own
//! (the stored record is read through the closure it is given):
//! - run it (first call, or the stored record is older than the window);
//! - wait for the identical call still running;
//! - replay the stored outcome of an identical completed call;
//! - refuse a reuse of the key with other arguments (`idempotency_conflict`).
//!
//! The running call holds a [`Running`] guard; dropping it (done or cancelled) always releases
//! the waiters, so a repeat never waits forever.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;
use tokio::sync::watch;
use xagent_protocol_types::{ConnectorChannelId, ErrorCode};

use crate::storage::ToolCallRecord;

/// A Tool call's outcome as kept and replayed.
pub(crate) type ToolOutcome = Result<Value, (ErrorCode, String)>;

type Key = (ConnectorChannelId, String);
/// Keyed by the peer's `tool_call_id`: the seeded foldhash (a peer cannot predict the seed),
/// never an unseeded hasher (docs/DECISIONS.md, "Hashers of internal maps").
type Inflight =
    HashMap<Key, (String, watch::Receiver<Option<ToolOutcome>>), foldhash::fast::RandomState>;

/// The registry of calls in flight.
#[derive(Default)]
pub(crate) struct ToolCalls {
    inflight: Mutex<Inflight>,
}

/// What to do with a call.
pub(crate) enum Plan<'a> {
    /// Run the handler; finish with [`Running::finish`].
    Run(Running<'a>),
    /// The identical call is running: wait for its outcome.
    Wait(watch::Receiver<Option<ToolOutcome>>),
    /// The identical call completed within the window: answer with its outcome.
    Replay(ToolOutcome),
    /// The key was used with other arguments.
    Conflict,
}

/// The running first call of a key.
pub(crate) struct Running<'a> {
    calls: &'a ToolCalls,
    key: Key,
    fingerprint: String,
    done: watch::Sender<Option<ToolOutcome>>,
    /// The key was released and the waiters were told (by [`Running::finish`]).
    finished: bool,
}

impl Running<'_> {
    /// The record to store for the outcome.
    pub(crate) fn record(&self, outcome: &ToolOutcome, now: u64) -> ToolCallRecord {
        ToolCallRecord {
            fingerprint: self.fingerprint.clone(),
            result: outcome.as_ref().ok().cloned(),
            error: outcome.as_ref().err().map(|(c, m)| (c.to_string(), m.clone())),
            completed_at: now,
        }
    }

    /// Releases the key and hands the outcome to the repeats waiting for it. The key goes
    /// first: from then on no new repeat can start waiting, so when none waits the outcome
    /// is not copied at all (the common case).
    pub(crate) fn finish(mut self, outcome: &ToolOutcome) {
        self.calls.lock().remove(&self.key);
        self.finished = true;
        if self.done.receiver_count() > 0 {
            let _ = self.done.send(Some(outcome.clone()));
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if self.done.borrow().is_none() {
            let unfinished = Err((
                ErrorCode::InternalError,
                "the first call of this tool_call_id did not finish; call again".to_owned(),
            ));
            let _ = self.done.send(Some(unfinished));
        }
        self.calls.lock().remove(&self.key);
    }
}

/// Which call: its channel, repeated-call key and fingerprint.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallKey<'a> {
    pub(crate) channel: &'a ConnectorChannelId,
    pub(crate) key: &'a str,
    pub(crate) fingerprint: &'a str,
}

/// The repeated-call key of a call: `call:<tool_call_id>`, else `req:<request_id>`, else
/// `pkt:<packet_id>`.
pub(crate) fn call_key(
    tool_call_id: Option<&str>,
    request_id: Option<&str>,
    packet_id: &str,
) -> String {
    // Concatenated by hand: one exact allocation per call, no formatting machinery.
    let (prefix, id) = match (tool_call_id, request_id) {
        (Some(call), _) => ("call:", call),
        (None, Some(request)) => ("req:", request),
        (None, None) => ("pkt:", packet_id),
    };
    let mut key = String::with_capacity(prefix.len() + id.len());
    key.push_str(prefix);
    key.push_str(id);
    key
}

impl ToolCalls {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inflight> {
        self.inflight.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Decides a call. `durable` is false for read-only Tools (no stored record is consulted);
    /// `stored` reads the stored record; `window` and `now` are in ms.
    pub(crate) fn begin(
        &self,
        call: CallKey<'_>,
        durable: bool,
        stored: impl FnOnce() -> Option<ToolCallRecord>,
        window: u64,
        now: u64,
    ) -> Plan<'_> {
        let CallKey { channel, key, fingerprint } = call;
        let map_key = (channel.clone(), key.to_owned());
        let mut inflight = self.lock();
        match inflight.get(&map_key) {
            Some((fp, rx)) if fp == fingerprint => return Plan::Wait(rx.clone()),
            Some(_) => return Plan::Conflict,
            None => {}
        }
        if durable && let Some(record) = stored() {
            // Past the window the key is forgotten, even before maintenance prunes it.
            let within = now.saturating_sub(record.completed_at) <= window;
            if within && record.fingerprint == fingerprint {
                return Plan::Replay(match record.error {
                    Some((code, message)) => Err((ErrorCode::parse(&code), message)),
                    None => Ok(record.result.unwrap_or(Value::Null)),
                });
            }
            if within {
                return Plan::Conflict;
            }
        }
        let (done, rx) = watch::channel(None);
        inflight.insert(map_key.clone(), (fingerprint.to_owned(), rx));
        drop(inflight);
        Plan::Run(Running {
            calls: self,
            key: map_key,
            fingerprint: fingerprint.to_owned(),
            done,
            finished: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(fingerprint: &str, completed_at: u64) -> ToolCallRecord {
        ToolCallRecord {
            fingerprint: fingerprint.into(),
            result: Some(Value::from(1)),
            error: None,
            completed_at,
        }
    }

    #[test]
    fn the_call_key_is_the_tool_call_id_else_the_request_id_else_the_packet_id() {
        assert_eq!(call_key(Some("c1"), Some("r1"), "p1"), "call:c1");
        assert_eq!(call_key(None, Some("r1"), "p1"), "req:r1");
        assert_eq!(call_key(None, None, "p1"), "pkt:p1");
    }

    #[test]
    fn repeats_replay_within_the_window_and_run_again_after_it() {
        let calls = ToolCalls::default();
        let channel = ConnectorChannelId::new("cch_a");
        let replay = calls.begin(
            CallKey { channel: &channel, key: "call:1", fingerprint: "fp" },
            true,
            || Some(record("fp", 0)),
            10,
            10,
        );
        assert!(matches!(replay, Plan::Replay(Ok(_))));
        let conflict = calls.begin(
            CallKey { channel: &channel, key: "call:1", fingerprint: "other" },
            true,
            || Some(record("fp", 0)),
            10,
            10,
        );
        assert!(matches!(conflict, Plan::Conflict));
        let expired = calls.begin(
            CallKey { channel: &channel, key: "call:1", fingerprint: "fp" },
            true,
            || Some(record("fp", 0)),
            10,
            11,
        );
        assert!(matches!(expired, Plan::Run(_)));
    }

    #[test]
    fn a_finished_run_hands_its_outcome_to_waiters_and_releases_the_key() {
        let calls = ToolCalls::default();
        let channel = ConnectorChannelId::new("cch_a");
        let key = CallKey { channel: &channel, key: "k", fingerprint: "fp" };
        let Plan::Run(running) = calls.begin(key, false, || None, 10, 0) else {
            panic!("first call must run");
        };
        let Plan::Wait(rx) = calls.begin(key, false, || None, 10, 0) else {
            panic!("a concurrent repeat must wait");
        };
        running.finish(&Ok(Value::from(7)));
        assert!(matches!(rx.borrow().as_ref(), Some(Ok(v)) if v == &Value::from(7)));
        // Without waiters the outcome is not kept; the key is free for the next call.
        let Plan::Run(running) = calls.begin(key, false, || None, 10, 0) else {
            panic!("the key was released");
        };
        running.finish(&Ok(Value::Null));
        assert!(matches!(calls.begin(key, false, || None, 10, 0), Plan::Run(_)));
    }

    #[test]
    fn a_dropped_run_releases_its_waiters() {
        let calls = ToolCalls::default();
        let channel = ConnectorChannelId::new("cch_a");
        let Plan::Run(running) = calls.begin(
            CallKey { channel: &channel, key: "k", fingerprint: "fp" },
            false,
            || None,
            10,
            0,
        ) else {
            panic!("first call must run");
        };
        let Plan::Wait(rx) = calls.begin(
            CallKey { channel: &channel, key: "k", fingerprint: "fp" },
            false,
            || None,
            10,
            0,
        ) else {
            panic!("a concurrent repeat must wait");
        };
        drop(running);
        assert!(matches!(rx.borrow().as_ref(), Some(Err((ErrorCode::InternalError, _)))));
        assert!(matches!(
            calls.begin(
                CallKey { channel: &channel, key: "k", fingerprint: "fp" },
                false,
                || None,
                10,
                0
            ),
            Plan::Run(_)
        ));
    }
}
