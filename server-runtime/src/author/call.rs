//! The one place the runtime calls author code. Each author trait or closure gets an
//! object-safe face here, and every call goes through [`contain`]: a panic in author code is
//! caught, logged and turned into a generic error (or nothing), so it can neither take a
//! connection down nor skip the runtime's bookkeeping. Callers never hold a runtime lock
//! while awaiting these calls.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use futures_util::FutureExt;
use serde_json::{Map, Value};
use xagent_profile_im::{ActivityAction, ActivityCapability};
use xagent_protocol_types::{ChatMessage, ErrorCode, FlowId, WireError};

use super::auth::{AuthError, AuthStep, BoundReason, FlowHandler};
use super::context::{AuthContext, AuthValues, ChannelContext, ToolContext};
use super::im::{DeliveryError, DeltaUpdate, FinalDelivery, ImTarget};
use super::tool::{RegisteredTool, ToolError};

/// A boxed, sendable future.
pub(crate) use futures_util::future::BoxFuture as BoxFut;

/// Author code panicked (already logged).
#[derive(Debug)]
pub(crate) struct Panicked;

/// Runs author code, catching a panic. `what` names the call in the log line.
pub(crate) async fn contain<T>(
    what: &'static str,
    call: impl Future<Output = T>,
) -> Result<T, Panicked> {
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(value) => Ok(value),
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(call = what, panic = %text, "Connector code panicked; contained");
            Err(Panicked)
        }
    }
}

fn panicked_auth() -> AuthError {
    AuthError::new(ErrorCode::InternalError, crate::error::INTERNAL_MESSAGE)
}

/// Object-safe face of [`FlowHandler`].
pub(crate) trait DynFlow: Send + Sync {
    fn start(&self, ctx: AuthContext, input: AuthValues)
    -> BoxFut<'_, Result<AuthStep, AuthError>>;
    fn status(&self, ctx: AuthContext, refresh: bool) -> BoxFut<'_, Result<AuthStep, AuthError>>;
    fn cancel(&self, ctx: AuthContext) -> BoxFut<'_, ()>;
}

/// Author code with the Connector's state bound to it: the runtime calls it with contexts
/// without state, and each call gets a clone of the state (see
/// [`crate::ConnectorBuilder::state`]).
pub(crate) struct WithState<C, S> {
    pub(crate) code: C,
    pub(crate) state: S,
}

impl<H, S> DynFlow for WithState<H, S>
where
    H: FlowHandler<S>,
    S: Clone + Send + Sync + 'static,
{
    fn start(
        &self,
        ctx: AuthContext,
        input: AuthValues,
    ) -> BoxFut<'_, Result<AuthStep, AuthError>> {
        Box::pin(self.code.start(ctx.with_state(self.state.clone()), input))
    }
    fn status(&self, ctx: AuthContext, refresh: bool) -> BoxFut<'_, Result<AuthStep, AuthError>> {
        Box::pin(self.code.status(ctx.with_state(self.state.clone()), refresh))
    }
    fn cancel(&self, ctx: AuthContext) -> BoxFut<'_, ()> {
        Box::pin(self.code.cancel(ctx.with_state(self.state.clone())))
    }
}

/// A typed form flow: the wire input deserialised into the author's struct.
pub(crate) struct FormFlow<Form, F> {
    pub(crate) handler: F,
    pub(crate) form: std::marker::PhantomData<fn() -> Form>,
}

impl<S, Form, F, Fut> FlowHandler<S> for FormFlow<Form, F>
where
    S: Send + 'static,
    Form: serde::de::DeserializeOwned + Send + 'static,
    F: Fn(AuthContext<S>, Form) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<AuthStep, AuthError>> + Send + 'static,
{
    async fn start(&self, ctx: AuthContext<S>, input: AuthValues) -> Result<AuthStep, AuthError> {
        let object: Map<String, Value> = input
            .iter()
            .map(|(name, value)| (name.to_owned(), Value::String(value.expose().to_owned())))
            .collect();
        // The serde error names the field, never its value.
        let form: Form = serde_json::from_value(Value::Object(object)).map_err(|error| {
            AuthError::new(
                ErrorCode::InvalidArguments,
                format!("the form input does not match the flow's fields: {error}"),
            )
        })?;
        (self.handler)(ctx, form).await
    }
}

/// The `on_bound` hook.
pub(crate) type BoundHook =
    dyn Fn(ChannelContext, BoundReason) -> BoxFut<'static, ()> + Send + Sync;
/// The `on_unbound` hook (sign-out and unregistration).
pub(crate) type UnboundHook =
    dyn Fn(ChannelContext) -> BoxFut<'static, Result<(), AuthError>> + Send + Sync;

/// Every piece of auth code of a Connector: per-flow handlers and the bound/unbound hooks.
#[derive(Default)]
pub(crate) struct AuthCode {
    pub(crate) flows: HashMap<FlowId, Arc<dyn DynFlow>>,
    pub(crate) on_bound: Option<Arc<BoundHook>>,
    pub(crate) on_unbound: Option<Arc<UnboundHook>>,
}

impl AuthCode {
    /// `auth.start` of `ctx.flow_id`.
    pub(crate) async fn start(
        &self,
        ctx: AuthContext,
        input: AuthValues,
    ) -> Result<AuthStep, AuthError> {
        let Some(flow) = self.flows.get(&ctx.flow_id) else {
            return Err(AuthError::unsupported("auth.start"));
        };
        contain("auth start", flow.start(ctx, input)).await.unwrap_or_else(|_| Err(panicked_auth()))
    }

    /// `auth.status` of a pending session.
    pub(crate) async fn status(
        &self,
        ctx: AuthContext,
        refresh: bool,
    ) -> Result<AuthStep, AuthError> {
        let Some(flow) = self.flows.get(&ctx.flow_id) else {
            return Err(AuthError::unsupported("auth.status"));
        };
        let call = flow.status(ctx, refresh);
        contain("auth status", call).await.unwrap_or_else(|_| Err(panicked_auth()))
    }

    /// Cancels a pending session (a panic is logged and ignored).
    pub(crate) async fn cancel(&self, ctx: AuthContext) {
        if let Some(flow) = self.flows.get(&ctx.flow_id) {
            let _ = contain("auth cancel", flow.cancel(ctx)).await;
        }
    }

    /// `auth.logout`: the author's sign-out in the target system.
    pub(crate) async fn logout(&self, ctx: ChannelContext) -> Result<(), AuthError> {
        let Some(hook) = &self.on_unbound else { return Ok(()) };
        contain("logout", hook(ctx)).await.unwrap_or_else(|_| Err(panicked_auth()))
    }

    /// Unregistration (lease expiry): sign-out cleanup; failures are logged.
    pub(crate) async fn unregister(&self, ctx: ChannelContext) {
        let Some(hook) = &self.on_unbound else { return };
        if let Ok(Err(error)) = contain("unregister", hook(ctx)).await {
            tracing::warn!(code = %error.code, "sign-out cleanup during unregister failed");
        }
    }

    /// A channel is bound (signed in, restored, or opened without auth flows).
    pub(crate) async fn bound(&self, ctx: ChannelContext, reason: BoundReason) {
        if let Some(hook) = &self.on_bound {
            let _ = contain("on_bound", hook(ctx, reason)).await;
        }
    }
}

/// Object-safe face of [`ImTarget`].
pub(crate) trait DynIm: Send + Sync {
    fn streams_deltas(&self) -> bool;
    fn deliver(
        &self,
        ctx: ChannelContext,
        message: ChatMessage,
        how: FinalDelivery,
    ) -> BoxFut<'_, Result<(), DeliveryError>>;
    fn delta(&self, ctx: ChannelContext, update: DeltaUpdate) -> BoxFut<'_, Option<String>>;
    fn activity_capability(&self) -> ActivityCapability;
    fn activity(&self, ctx: ChannelContext, action: ActivityAction) -> BoxFut<'_, ()>;
}

impl<T, S> DynIm for WithState<T, S>
where
    T: ImTarget<S>,
    S: Clone + Send + Sync + 'static,
{
    fn streams_deltas(&self) -> bool {
        T::STREAMS_DELTAS
    }
    fn deliver(
        &self,
        ctx: ChannelContext,
        message: ChatMessage,
        how: FinalDelivery,
    ) -> BoxFut<'_, Result<(), DeliveryError>> {
        Box::pin(self.code.deliver(ctx.with_state(self.state.clone()), message, how))
    }
    fn delta(&self, ctx: ChannelContext, update: DeltaUpdate) -> BoxFut<'_, Option<String>> {
        Box::pin(self.code.delta(ctx.with_state(self.state.clone()), update))
    }
    fn activity_capability(&self) -> ActivityCapability {
        T::ACTIVITY
    }
    fn activity(&self, ctx: ChannelContext, action: ActivityAction) -> BoxFut<'_, ()> {
        Box::pin(self.code.activity(ctx.with_state(self.state.clone()), action))
    }
}

/// The author's IM target behind contained calls.
#[derive(Clone)]
pub(crate) struct ImCode(pub(crate) Arc<dyn DynIm>);

impl ImCode {
    pub(crate) fn streams_deltas(&self) -> bool {
        self.0.streams_deltas()
    }

    pub(crate) fn activity_capability(&self) -> ActivityCapability {
        self.0.activity_capability()
    }

    /// Delivers a final message; a panic becomes a final (not retryable) `internal_error`:
    /// running the same code again would panic again.
    pub(crate) async fn deliver(
        &self,
        ctx: ChannelContext,
        message: ChatMessage,
        how: FinalDelivery,
    ) -> Result<(), DeliveryError> {
        contain("deliver", self.0.deliver(ctx, message, how)).await.unwrap_or_else(|_| {
            Err(DeliveryError::permanent(ErrorCode::InternalError, crate::error::INTERNAL_MESSAGE))
        })
    }

    pub(crate) async fn delta(&self, ctx: ChannelContext, update: DeltaUpdate) -> Option<String> {
        contain("delta", self.0.delta(ctx, update)).await.ok().flatten()
    }

    pub(crate) async fn activity(&self, ctx: ChannelContext, action: ActivityAction) {
        let _ = contain("activity", self.0.activity(ctx, action)).await;
    }
}

/// Runs a registered Tool; a panic becomes `internal_error` with a generic message. The
/// author's [`ToolError`] becomes the wire error here, once: the registry, the stored record
/// and the ack carry that [`WireError`] unchanged.
pub(crate) async fn call_tool(
    tool: &RegisteredTool,
    ctx: ToolContext,
    arguments: Map<String, Value>,
) -> Result<Value, WireError> {
    match contain("tool", (tool.call)(ctx, arguments)).await {
        Ok(outcome) => outcome.map_err(ToolError::into_wire),
        Err(Panicked) => {
            Err(WireError::new(ErrorCode::InternalError, crate::error::INTERNAL_MESSAGE))
        }
    }
}

/// Object-safe face of [`super::device::DeviceTarget`].
pub(crate) trait DynDevice: Send + Sync {
    fn device_key(&self, binding: &super::context::Binding) -> Option<String>;
    fn check(&self, ctx: ChannelContext) -> BoxFut<'_, super::device::DeviceStatus>;
}

impl<T, S> DynDevice for WithState<T, S>
where
    T: super::device::DeviceTarget<S>,
    S: Clone + Send + Sync + 'static,
{
    fn device_key(&self, binding: &super::context::Binding) -> Option<String> {
        self.code.device_key(binding)
    }
    fn check(&self, ctx: ChannelContext) -> BoxFut<'_, super::device::DeviceStatus> {
        Box::pin(self.code.check(ctx.with_state(self.state.clone())))
    }
}

/// The author's device target behind contained calls.
#[derive(Clone)]
pub(crate) struct DeviceCode(pub(crate) Arc<dyn DynDevice>);

impl DeviceCode {
    /// The device key of a binding; a panic counts as "no device".
    pub(crate) fn device_key(&self, binding: &super::context::Binding) -> Option<String> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.0.device_key(binding)))
            .unwrap_or_else(|_| {
                tracing::error!(call = "device_key", "Connector code panicked; contained");
                None
            })
    }

    /// Asks the device whether it answers; a panic counts as offline.
    pub(crate) async fn check(&self, ctx: ChannelContext) -> super::device::DeviceStatus {
        contain("device check", self.0.check(ctx))
            .await
            .unwrap_or(super::device::DeviceStatus::Offline)
    }
}
