//! What an author writes and what the runtime hands them.
//!
//! - `context`: bindings, form values held as secrets, the contexts of auth steps, hooks and
//!   Tool calls (each carrying the [`crate::ConnectorHandle`]).
//! - `auth`: auth steps and errors, [`FlowHandler`] (a flow declared with its code), typed form
//!   flows, [`BoundReason`] for the `on_bound` hook.
//! - `tool`: [`ToolSpec`], [`ToolError`], typed Tool registration.
//! - `im`: [`ImTarget`] and delivery errors.
//! - `im_tools`: the shared IM send Tools (typed arguments and results, checks, the file
//!   opened by the runtime) over an author's [`ImSender`].
//! - `call` (crate-private): the one place the runtime calls author code; every call is
//!   panic-contained and made without a runtime lock held.
//!
//! A device target (Device Profile v1) gets its own `device.rs` here, next to `im.rs`, with
//! its calls added to `call.rs`.

pub(crate) mod auth;
pub(crate) mod call;
pub(crate) mod context;
pub(crate) mod device;
pub(crate) mod im;
pub(crate) mod im_tools;
pub(crate) mod tool;

pub use auth::{AuthError, AuthPrompt, AuthStep, BoundReason, FlowHandler, FlowSpec};
pub use context::{AuthContext, AuthValues, Binding, ChannelContext, ToolContext};
pub use device::{
    DeviceConfig, DeviceStatus, DeviceTarget, HighRiskPolicy, RiskLevel, ToolCategory,
};
pub use im::{DeliveryError, DeliveryOutcome, DeltaUpdate, FinalDelivery, ImTarget};
pub use im_tools::{
    FileSendArgs, FileSent, ImSender, MAX_CAPTION_CHARS, MAX_MESSAGE_CHARS, MessageSendArgs,
    MessageSent, OpenedFile, SendStatus, im_tool_ids,
};
pub use tool::{ToolError, ToolSpec};
