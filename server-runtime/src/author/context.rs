//! The values the runtime hands author code: a channel's binding, form input held as secrets,
//! and the contexts of auth steps, hooks and Tool calls (each with the runtime handle).

use std::collections::BTreeMap;

use serde_json::Value;
use xagent_protocol_types::{
    AuthInput, AuthSessionId, ConnectorChannelId, FlowId, RequestId, Secret, ToolCallId, ToolId,
    ToolProgressPush,
};

pub use crate::binding::Binding;
use crate::error::HandleError;
use crate::handle::ConnectorHandle;

/// Form values of an `auth.start`, every one held as a [`Secret`] so none can be logged.
#[derive(Clone, Default)]
pub struct AuthValues(BTreeMap<String, Secret>);

impl AuthValues {
    /// Reads the wire input; non-string values are kept as their JSON text.
    pub fn from_input(input: Option<&AuthInput>) -> Self {
        let mut values = BTreeMap::new();
        if let Some(input) = input {
            for (name, value) in &input.0 {
                let text = match value {
                    Value::String(text) => text.clone(),
                    Value::Null => continue,
                    other => other.to_string(),
                };
                values.insert(name.clone(), Secret::new(text));
            }
        }
        Self(values)
    }

    /// A value by field name.
    pub fn get(&self, name: &str) -> Option<&Secret> {
        self.0.get(name)
    }

    /// True when the field is present and not empty.
    pub fn has(&self, name: &str) -> bool {
        self.0.get(name).is_some_and(|value| !value.is_empty())
    }

    /// Every name with its value.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &Secret)> {
        self.0.iter().map(|(name, value)| (name.as_str(), value))
    }

    /// Field names (never values).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

impl std::fmt::Debug for AuthValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.keys().map(|k| (k, "<redacted>"))).finish()
    }
}

/// Where an auth step runs: the channel, the flow, the session, the runtime handle and the
/// Connector's state (see [`crate::ConnectorBuilder::state`]; `()` without one).
#[derive(Clone)]
pub struct AuthContext<S = ()> {
    /// The channel being authenticated.
    pub channel: ConnectorChannelId,
    /// The flow from the Card.
    pub flow_id: FlowId,
    /// The session this step belongs to.
    pub auth_session_id: AuthSessionId,
    /// The runtime.
    pub handle: ConnectorHandle,
    pub(crate) state: S,
}

/// A signed-in channel as seen by author code: its id, its binding, the runtime handle and
/// the Connector's state (see [`crate::ConnectorBuilder::state`]; `()` without one).
#[derive(Clone)]
pub struct ChannelContext<S = ()> {
    /// The channel.
    pub channel: ConnectorChannelId,
    /// Its binding (target facts and private material).
    pub binding: Binding,
    /// The runtime.
    pub handle: ConnectorHandle,
    pub(crate) state: S,
}

/// What a Tool handler gets besides its typed arguments, including the Connector's state
/// (see [`crate::ConnectorBuilder::state`]; `()` without one).
#[derive(Clone)]
pub struct ToolContext<S = ()> {
    /// The channel (from the envelope; the model's argument copy is never used).
    pub channel: ConnectorChannelId,
    /// The Tool.
    pub tool_id: ToolId,
    /// The request.
    pub request_id: Option<RequestId>,
    /// xAgent's call id, if given (correlation only, never authorization).
    pub tool_call_id: Option<ToolCallId>,
    /// The channel's binding.
    pub binding: Binding,
    /// The runtime.
    pub handle: ConnectorHandle,
    /// Author writes staged on this call (committed with its tool-call record).
    pub(crate) staged: crate::storage::author::Staged,
    pub(crate) state: S,
}

/// The channel every `for_test` context is on.
const TEST_CHANNEL: &str = "ch_test";

impl<S> AuthContext<S> {
    /// The Connector's state.
    pub fn state(&self) -> &S {
        &self.state
    }

    /// The same context with another state (how the builder hands its state to a handler).
    pub(crate) fn with_state<T>(self, state: T) -> AuthContext<T> {
        let Self { channel, flow_id, auth_session_id, handle, state: _ } = self;
        AuthContext { channel, flow_id, auth_session_id, handle, state }
    }

    /// A context for calling an auth step in a unit test: channel `ch_test`, session
    /// `as_test`, a [`ConnectorHandle::detached`] handle. The fields are public: change them
    /// as the test needs.
    pub fn for_test(flow_id: impl Into<FlowId>, state: S) -> Result<Self, HandleError> {
        Ok(Self {
            channel: ConnectorChannelId::new(TEST_CHANNEL),
            flow_id: flow_id.into(),
            auth_session_id: AuthSessionId::new("as_test"),
            handle: ConnectorHandle::detached()?,
            state,
        })
    }
}

impl<S> ChannelContext<S> {
    /// The Connector's state.
    pub fn state(&self) -> &S {
        &self.state
    }

    /// The same context with another state (how the builder hands its state to a handler).
    pub(crate) fn with_state<T>(self, state: T) -> ChannelContext<T> {
        let Self { channel, binding, handle, state: _ } = self;
        ChannelContext { channel, binding, handle, state }
    }

    /// A context for calling a hook or a delivery in a unit test: channel `ch_test` with
    /// `binding`, a [`ConnectorHandle::detached`] handle. The fields are public: change them
    /// as the test needs.
    pub fn for_test(binding: Binding, state: S) -> Result<Self, HandleError> {
        Ok(Self {
            channel: ConnectorChannelId::new(TEST_CHANNEL),
            binding,
            handle: ConnectorHandle::detached()?,
            state,
        })
    }
}

impl<S> ToolContext<S> {
    /// The Connector's state.
    pub fn state(&self) -> &S {
        &self.state
    }

    /// The same context with another state (how the builder hands its state to a handler).
    pub(crate) fn with_state<T>(self, state: T) -> ToolContext<T> {
        let Self { channel, tool_id, request_id, tool_call_id, binding, handle, staged, state: _ } =
            self;
        ToolContext { channel, tool_id, request_id, tool_call_id, binding, handle, staged, state }
    }

    /// A context for calling a Tool handler in a unit test: channel `ch_test` with `binding`,
    /// Tool `test_tool`, no request or call id, a [`ConnectorHandle::detached`] handle (its
    /// author store is in memory; whatever needs xAgent answers
    /// [`HandleError::Detached`]). Writes staged with [`ToolContext::stage`] are kept, not
    /// committed: no runtime records the call. The fields are public: change them as the test
    /// needs (share one detached handle between calls by setting `handle`).
    ///
    #[doc = include_str!("for_test.md")]
    pub fn for_test(binding: Binding, state: S) -> Result<Self, HandleError> {
        Ok(Self {
            channel: ConnectorChannelId::new(TEST_CHANNEL),
            tool_id: ToolId::new("test_tool"),
            request_id: None,
            tool_call_id: None,
            binding,
            handle: ConnectorHandle::detached()?,
            staged: crate::storage::author::Staged::default(),
            state,
        })
    }

    /// Stages an author write on this call: it commits in the same transaction as the call's
    /// tool-call record (or alone, for a Tool that records no calls), and the Tool's answer
    /// goes out only after that commit. A repeat of the call finds both or neither; when the
    /// commit fails, the call is answered with an error and nothing staged happened. A call
    /// that returns an error commits none of its staged writes.
    pub fn stage(&self, write: crate::AuthorWrite) {
        self.staged.push(write);
    }

    /// Runs `run` once this call's staged writes committed (e.g. showing a message that is
    /// now durable); never runs when the commit failed.
    pub fn after_commit(&self, run: impl FnOnce() + Send + 'static) {
        self.staged.after_commit(Box::new(run));
    }

    /// The author store, for reads and for writes committed on their own.
    pub fn author_store(&self) -> crate::AuthorStore {
        self.handle.author_store()
    }

    /// The stable id of this call's side effect (a posted message, a created record): the
    /// same for every repeat of the call, different for another channel, Tool or call, so a
    /// target that deduplicates by an id (a transaction id, a message id) acts once even when
    /// a repeat arrives after the runtime's repeated-call record is gone.
    ///
    /// 32 lowercase hex digits: the first 16 bytes of SHA-256 over the channel, the Tool id
    /// and the call's key as the runtime keys repeated calls (`call:<tool_call_id>`, else
    /// `req:<request_id>`), newline-separated. A call with neither id cannot be told from
    /// another, so it gets a fresh random id (a repeat of it is a new effect, as it is a new
    /// call for the runtime).
    pub fn effect_id(&self) -> String {
        effect_id_of(
            &self.channel,
            &self.tool_id,
            self.tool_call_id.as_ref().map(ToolCallId::as_str),
            self.request_id.as_ref().map(RequestId::as_str),
        )
    }

    /// Sends a `tool.progress.push` for this call (never replaces the ack).
    pub async fn progress(&self, message: impl Into<String>, fraction: Option<f64>) {
        let mut push = ToolProgressPush::new(self.tool_id.clone()).with_message(message);
        if let Some(fraction) = fraction {
            push = push.with_progress(fraction.clamp(0.0, 1.0));
        }
        self.handle.push_tool_progress(&self.channel, push).await;
    }
}

// `Debug` without the state, so a state need not be `Debug`.
impl<S> std::fmt::Debug for AuthContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthContext")
            .field("channel", &self.channel)
            .field("flow_id", &self.flow_id)
            .field("auth_session_id", &self.auth_session_id)
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl<S> std::fmt::Debug for ChannelContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelContext")
            .field("channel", &self.channel)
            .field("binding", &self.binding)
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl<S> std::fmt::Debug for ToolContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("channel", &self.channel)
            .field("tool_id", &self.tool_id)
            .field("request_id", &self.request_id)
            .field("tool_call_id", &self.tool_call_id)
            .field("binding", &self.binding)
            .field("handle", &self.handle)
            .field("staged", &self.staged)
            .finish_non_exhaustive()
    }
}

/// [`ToolContext::effect_id`] from its parts.
fn effect_id_of(
    channel: &ConnectorChannelId,
    tool_id: &ToolId,
    tool_call_id: Option<&str>,
    request_id: Option<&str>,
) -> String {
    use sha2::{Digest, Sha256};
    if tool_call_id.is_none() && request_id.is_none() {
        return hex::encode(rand::random::<[u8; 16]>());
    }
    let key = crate::tool_calls::call_key(tool_call_id, request_id, "");
    let digest = Sha256::new()
        .chain_update(channel.as_str())
        .chain_update("\n")
        .chain_update(tool_id.as_str())
        .chain_update("\n")
        .chain_update(key)
        .finalize();
    hex::encode(&digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(channel: &str, tool: &str, call: Option<&str>, request: Option<&str>) -> String {
        effect_id_of(&ConnectorChannelId::new(channel), &ToolId::new(tool), call, request)
    }

    #[test]
    fn effect_id_is_the_same_for_a_repeat_of_one_call() {
        let first = id("cch_a", "x_message_send", Some("call_1"), Some("req_1"));
        // A repeat carries the same call id (its request id may differ).
        assert_eq!(first, id("cch_a", "x_message_send", Some("call_1"), Some("req_9")));
        assert_eq!(first.len(), 32);
        assert!(first.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        let by_request = id("cch_a", "x_message_send", None, Some("req_1"));
        assert_eq!(by_request, id("cch_a", "x_message_send", None, Some("req_1")));
    }

    #[test]
    fn effect_id_differs_by_channel_tool_and_call() {
        let base = id("cch_a", "x_message_send", Some("call_1"), None);
        for other in [
            id("cch_b", "x_message_send", Some("call_1"), None),
            id("cch_a", "x_file_send", Some("call_1"), None),
            id("cch_a", "x_message_send", Some("call_2"), None),
            // A request id equal to another call's call id is another call.
            id("cch_a", "x_message_send", None, Some("call_1")),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn effect_id_without_any_call_id_is_fresh_each_time() {
        let (a, b) = (id("cch_a", "t", None, None), id("cch_a", "t", None, None));
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
    }
}
