//! Tool invocation packets.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Extra, ToolCallId, ToolId};

/// `tool.invoke` (xAgent -> Connector). Routing uses only the envelope channel; the model's
/// copy of `connector_channel_id` in `arguments` is forwarded but never consumed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ToolInvoke {
    /// A Tool from the Card.
    #[schemars(length(min = 1))]
    pub tool_id: ToolId,
    /// Model arguments, unchanged.
    #[serde(default)]
    pub arguments: Map<String, Value>,
    /// xAgent correlation data; never authorization material.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ToolInvokeContext>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ToolInvoke {
    /// A call with arguments.
    pub fn new(tool_id: impl Into<ToolId>, arguments: Map<String, Value>) -> Self {
        Self { tool_id: tool_id.into(), arguments, context: None, extra: Extra::new() }
    }

    /// Sets the context.
    #[must_use]
    pub fn with_context(mut self, context: ToolInvokeContext) -> Self {
        self.context = Some(context);
        self
    }

    /// The `context.tool_call_id`, if any.
    pub fn tool_call_id(&self) -> Option<&ToolCallId> {
        self.context.as_ref().and_then(|c| c.tool_call_id.as_ref())
    }
}

/// `tool.invoke.context`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ToolInvokeContext {
    /// xAgent session (opaque to the Connector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The model's call id; the idempotency key of a repeated call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<ToolCallId>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ToolInvokeContext {
    /// A context with a call id.
    pub fn with_call_id(tool_call_id: impl Into<ToolCallId>) -> Self {
        Self { tool_call_id: Some(tool_call_id.into()), ..Self::default() }
    }
}

/// `tool.invoke.ack` (Connector -> xAgent). A failure carries the envelope `error` instead.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ToolInvokeAck {
    /// The Tool that ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_id: Option<ToolId>,
    /// The Tool's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ToolInvokeAck {
    /// A successful result.
    pub fn new(tool_id: impl Into<ToolId>, result: Value) -> Self {
        Self { tool_id: Some(tool_id.into()), result: Some(result), extra: Extra::new() }
    }
}

/// `tool.progress.push` (Connector -> xAgent): progress of a long-running Tool; never a
/// substitute for the ack.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ToolProgressPush {
    /// The running Tool.
    #[schemars(length(min = 1))]
    pub tool_id: ToolId,
    /// Status word such as `running`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Readable progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Fraction done, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub progress: Option<f64>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ToolProgressPush {
    /// Progress of a Tool.
    pub fn new(tool_id: impl Into<ToolId>) -> Self {
        Self {
            tool_id: tool_id.into(),
            status: Some("running".into()),
            message: None,
            progress: None,
            extra: Extra::new(),
        }
    }

    setters! {
        /// Sets the message.
        with_message(message: into String);
        /// Sets the fraction done.
        with_progress(progress: f64);
    }
}
