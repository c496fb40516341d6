//! The IM target an author implements: where xAgent's messages go, how deltas and activity
//! are shown, and why a delivery failed.

use std::future::Future;

use xagent_profile_im::{ActivityAction, ActivityCapability};
use xagent_protocol_types::{ChatMessage, ErrorCode, MessageId};

use super::context::ChannelContext;

/// Why the target system did not take a message; `retryable` decides between a retry and a
/// final rejection (`chat.message.ack`).
#[derive(Clone, Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct DeliveryError {
    /// Stable code (`target_delivery_failed`, `channel_busy`, `permission_denied`, ...).
    pub code: ErrorCode,
    /// Short readable reason without secrets.
    pub message: String,
    /// Whether the same message may be delivered again later.
    pub retryable: bool,
}

impl DeliveryError {
    /// A failure that a retry will not fix.
    pub fn permanent(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), retryable: false }
    }

    /// A temporary failure (network, rate limit, busy).
    pub fn temporary(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), retryable: true }
    }

    /// An internal failure (a database, a bug): the cause is logged here and xAgent gets a
    /// retryable `internal_error` with a generic message, without the cause.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(%cause, "delivery failed internally");
        Self::temporary(ErrorCode::InternalError, crate::error::INTERNAL_MESSAGE)
    }
}

/// A streamed assistant message as assembled from `chat.message.delta`s (only with
/// [`ImTarget::STREAMS_DELTAS`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeltaUpdate {
    /// The assistant message.
    pub message_id: MessageId,
    /// True for the first delta: create the target message. Later: update it.
    pub first: bool,
    /// All text assembled so far.
    pub text_so_far: String,
    /// The target message handle returned for the first delta, if any.
    pub handle: Option<String>,
}

/// How a final message reaches the target: as a new message, or by editing the message that
/// streamed its deltas (never both).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FinalDelivery {
    /// Send a new target message.
    New,
    /// Replace the content of the streamed target message.
    Edit {
        /// The handle returned by [`ImTarget::delta`], if one was returned.
        handle: Option<String>,
    },
}

/// The IM target of a Connector: where outbound messages go. Inbound messages are handed to
/// the runtime through [`crate::ConnectorHandle`].
///
/// `S` is the Connector's state ([`crate::ConnectorBuilder::state`]; `()` without one): the
/// target reads it with [`ChannelContext::state`].
pub trait ImTarget<S = ()>: Send + Sync + 'static {
    /// True when the target can edit a sent message, so deltas are shown as they stream;
    /// false (default) keeps deltas in the runtime and only the final message is delivered.
    const STREAMS_DELTAS: bool = false;

    /// Delivers a final `chat.message` from xAgent to the target system. Called once per
    /// accepted `message_id` (the runtime answers duplicates and conflicts itself); return only
    /// when every side effect is done.
    fn deliver(
        &self,
        ctx: ChannelContext<S>,
        message: ChatMessage,
        how: FinalDelivery,
    ) -> impl Future<Output = Result<(), DeliveryError>> + Send;

    /// A streamed message grew (only with [`ImTarget::STREAMS_DELTAS`]); return the target
    /// message handle when `update.first` created one.
    fn delta(
        &self,
        ctx: ChannelContext<S>,
        update: DeltaUpdate,
    ) -> impl Future<Output = Option<String>> + Send {
        let _ = (ctx, update);
        async { None }
    }

    /// What the target can show of `chat.activity` (default: a typing indicator only).
    const ACTIVITY: ActivityCapability = ActivityCapability::TypingOnly;

    /// Show, refresh or clear the activity indicator, as decided by the runtime's activity
    /// tracker from `chat.activity` snapshots, deltas, final messages and the local timeout.
    /// Failures must be swallowed: activity never affects message delivery. Default: nothing.
    fn activity(
        &self,
        ctx: ChannelContext<S>,
        action: ActivityAction,
    ) -> impl Future<Output = ()> + Send {
        let _ = (ctx, action);
        async {}
    }
}

/// What a delivery closure may return: `()` (delivered) or a `Result`.
pub trait DeliveryOutcome: Send {
    /// The delivery result.
    fn into_result(self) -> Result<(), DeliveryError>;
}

impl DeliveryOutcome for () {
    fn into_result(self) -> Result<(), DeliveryError> {
        Ok(())
    }
}

impl DeliveryOutcome for Result<(), DeliveryError> {
    fn into_result(self) -> Result<(), DeliveryError> {
        self
    }
}

/// An [`ImTarget`] made of one delivery closure (see
/// [`crate::ConnectorBuilder::on_message`]): final messages only, typing-only activity.
pub(crate) struct DeliverFn<F>(pub(crate) F);

impl<S, F, Fut> ImTarget<S> for DeliverFn<F>
where
    S: Send + 'static,
    F: Fn(ChannelContext<S>, ChatMessage) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: DeliveryOutcome,
{
    async fn deliver(
        &self,
        ctx: ChannelContext<S>,
        message: ChatMessage,
        _how: FinalDelivery,
    ) -> Result<(), DeliveryError> {
        (self.0)(ctx, message).await.into_result()
    }
}
