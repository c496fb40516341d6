//! The repeated-call registry of `tool.invoke`: one window for every side-effecting Tool.
//!
//! A call is keyed by channel + `tool_call_id` (or the `request_id` without one) and
//! fingerprinted by Tool id + arguments. Without I/O of its own, [`ToolCalls::begin`] decides
//! from the calls in flight and [`Running::judge_stored`] from the stored record the caller
//! read (side-effecting Tools only):
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
use xagent_protocol_types::{ConnectorChannelId, ErrorCode, WireError};

use crate::storage::ToolCallRecord;

/// A Tool call's outcome as kept, replayed and acked: the author's error is the wire error.
pub(crate) type ToolOutcome = Result<Value, WireError>;

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
    /// Judges the stored record of this call's key: `Some(answer)` when the call must not run
    /// (the outcome of an identical call completed within the window, or a conflict with
    /// other arguments used within it); `None` to run. Past the window the key is forgotten,
    /// even before maintenance prunes it. Finish with the answer, so waiters get it too.
    pub(crate) fn judge_stored(
        &self,
        stored: Option<ToolCallRecord>,
        window: u64,
        now: u64,
    ) -> Option<ToolOutcome> {
        let record = stored?;
        if now.saturating_sub(record.completed_at) > window {
            return None;
        }
        if record.fingerprint != self.fingerprint {
            return Some(Err(conflict()));
        }
        Some(match record.error {
            Some((code, message)) => Err(WireError::new(ErrorCode::parse(&code), message)),
            None => Ok(record.result.unwrap_or(Value::Null)),
        })
    }

    /// The record to store for the outcome.
    pub(crate) fn record(&self, outcome: &ToolOutcome, now: u64) -> ToolCallRecord {
        ToolCallRecord {
            fingerprint: self.fingerprint.clone(),
            result: outcome.as_ref().ok().cloned(),
            error: outcome.as_ref().err().map(|e| (e.code.to_string(), e.message().to_owned())),
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
            let _ = self.done.send(Some(Err(unfinished())));
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

    /// Decides a call from what is in flight: wait for the identical running call, refuse a
    /// running call of the key with other arguments, or claim the key and run. A durable
    /// Tool's caller then reads the stored record and asks [`Running::judge_stored`] before
    /// running: the key is claimed first, so no identical call can start while it reads.
    pub(crate) fn begin(&self, call: CallKey<'_>) -> Plan<'_> {
        let CallKey { channel, key, fingerprint } = call;
        let map_key = (channel.clone(), key.to_owned());
        let mut inflight = self.lock();
        match inflight.get(&map_key) {
            Some((fp, rx)) if fp == fingerprint => return Plan::Wait(rx.clone()),
            Some(_) => return Plan::Conflict,
            None => {}
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

/// The answer to a reuse of a key with other arguments.
pub(crate) fn conflict() -> WireError {
    WireError::new(
        ErrorCode::IdempotencyConflict,
        "this tool_call_id was already used with different arguments; use a new call id",
    )
}

/// The answer to repeats of a call whose first run ended without an outcome.
pub(crate) fn unfinished() -> WireError {
    WireError::new(
        ErrorCode::InternalError,
        "the first call of this tool_call_id did not finish; call again",
    )
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

    /// The first call of `key` runs; an identical second one waits for it.
    fn run_and_wait<'a>(
        calls: &'a ToolCalls,
        key: CallKey<'_>,
    ) -> (Running<'a>, watch::Receiver<Option<ToolOutcome>>) {
        let Plan::Run(running) = calls.begin(key) else { panic!("first call must run") };
        let Plan::Wait(rx) = calls.begin(key) else { panic!("a concurrent repeat must wait") };
        (running, rx)
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
        let judge = |fingerprint: &str, now: u64| {
            let Plan::Run(running) =
                calls.begin(CallKey { channel: &channel, key: "call:1", fingerprint })
            else {
                panic!("nothing in flight: the call claims its key");
            };
            running.judge_stored(Some(record("fp", 0)), 10, now)
        };
        assert!(matches!(judge("fp", 10), Some(Ok(_))), "replayed within the window");
        assert!(
            matches!(judge("other", 10), Some(Err(e)) if e.code == ErrorCode::IdempotencyConflict),
            "other arguments within the window conflict"
        );
        assert!(judge("fp", 11).is_none(), "past the window it runs again");
    }

    #[test]
    fn a_call_reading_its_stored_record_holds_its_key() {
        // While a durable call reads its stored record, an identical call waits for it instead
        // of reading a record that is about to be written.
        let calls = ToolCalls::default();
        let channel = ConnectorChannelId::new("cch_a");
        let key = CallKey { channel: &channel, key: "call:1", fingerprint: "fp" };
        let (first, rx) = run_and_wait(&calls, key);
        let answer = first.judge_stored(Some(record("fp", 5)), 10, 6).expect("a replay");
        first.finish(&answer);
        assert!(matches!(rx.borrow().as_ref(), Some(Ok(v)) if v == &Value::from(1)));
    }

    #[test]
    fn a_finished_run_hands_its_outcome_to_waiters_and_releases_the_key() {
        let calls = ToolCalls::default();
        let channel = ConnectorChannelId::new("cch_a");
        let key = CallKey { channel: &channel, key: "k", fingerprint: "fp" };
        let (running, rx) = run_and_wait(&calls, key);
        running.finish(&Ok(Value::from(7)));
        assert!(matches!(rx.borrow().as_ref(), Some(Ok(v)) if v == &Value::from(7)));
        // Without waiters the outcome is not kept; the key is free for the next call.
        let Plan::Run(running) = calls.begin(key) else {
            panic!("the key was released");
        };
        running.finish(&Ok(Value::Null));
        assert!(matches!(calls.begin(key), Plan::Run(_)));
    }

    #[test]
    fn a_dropped_run_releases_its_waiters() {
        let calls = ToolCalls::default();
        let channel = ConnectorChannelId::new("cch_a");
        let key = CallKey { channel: &channel, key: "k", fingerprint: "fp" };
        let (running, rx) = run_and_wait(&calls, key);
        drop(running);
        assert!(matches!(rx.borrow().as_ref(), Some(Err(e)) if e.code == ErrorCode::InternalError));
        assert!(matches!(calls.begin(key), Plan::Run(_)));
    }

    #[test]
    fn a_running_call_of_the_key_with_other_arguments_conflicts() {
        let calls = ToolCalls::default();
        let channel = ConnectorChannelId::new("cch_a");
        let Plan::Run(_running) =
            calls.begin(CallKey { channel: &channel, key: "k", fingerprint: "fp" })
        else {
            panic!("first call must run");
        };
        let other = calls.begin(CallKey { channel: &channel, key: "k", fingerprint: "other" });
        assert!(matches!(other, Plan::Conflict));
    }
}
