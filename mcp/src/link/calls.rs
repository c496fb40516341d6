//! What the agent calls through the bridge: the projected Card Tools and the built-in channel
//! Tools, each through the runtime.

use std::time::Duration;

use serde_json::{Map, Value, json};
use xagent_client_runtime::prelude::*;
use xagent_client_runtime::{FunctionDeclaration, builtin_tools};
use xagent_protocol_types::{AckStatus, ChatMessageAck, MessageId};

use super::{Link, OWNER, ProgressSink, ToolFailure, lock};
use crate::uris::channel_uri;

impl Link {
    /// The Card Tools the bridge's user can call now, as the runtime projects them for a
    /// model (upload references shown as file references).
    pub fn model_tools(&self) -> Vec<FunctionDeclaration> {
        if self.withdrawn().is_some() {
            return Vec::new();
        }
        self.plane.model_tools(OWNER)
    }

    /// The runtime's built-in model Tools (`connector_channels_list`, `connector_message_send`).
    pub fn builtin_tools(&self) -> Vec<FunctionDeclaration> {
        builtin_tools()
    }

    /// `connector_channels_list`: the runtime's answer, with what an MCP client also needs per
    /// channel (the messages resource, pending messages, the target's account and the sign-in).
    pub async fn channels_list(&self) -> Result<Value, ToolFailure> {
        let mut listed =
            self.plane.call_builtin(OWNER, "connector_channels_list", &Map::new()).await?;
        let directory = self.plane.directory();
        let sign_in = self.sign_in();
        if let Some(channels) = listed.get_mut("channels").and_then(Value::as_array_mut) {
            for channel in channels {
                let Some(object) = channel.as_object_mut() else { continue };
                let Some(id) = object.get("connector_channel_id").and_then(Value::as_str) else {
                    continue;
                };
                let id = id.to_owned();
                let account = directory
                    .get(&ConnectorChannelId::new(id.as_str()))
                    .and_then(|e| e.descriptor.as_ref())
                    .and_then(|d| d.target.account_hint.clone());
                if let (Some(account), Some(target)) =
                    (account, object.get_mut("target").and_then(Value::as_object_mut))
                {
                    target.insert("account_hint".into(), Value::String(account));
                }
                object.insert(
                    "pending_messages".into(),
                    json!(self.inbox.pending(Some(&id)).await.unwrap_or(0)),
                );
                object.insert("messages_resource".into(), json!(channel_uri(&id)));
                object.insert(
                    "sign_in".into(),
                    json!({
                        "status": sign_in.status,
                        "flow": sign_in.flow,
                        "link": sign_in.qr_code_text,
                        "message": sign_in.message,
                    }),
                );
            }
        }
        Ok(listed)
    }

    /// Calls a Card Tool with the model's arguments through the runtime, which resolves the
    /// channel by section 10.1 (the bridge's user has no session binding: the first of its
    /// channels where the Tool is available), uploads file references on it and returns the
    /// result. The model's `connector_channel_id` selects nothing: a value given is passed on
    /// unchanged, a missing one is filled with the resolved channel, since the Card's schema
    /// asks for it. Progress pushes go to `progress` while the call runs.
    pub async fn invoke(
        &self,
        tool_id: &str,
        arguments: Map<String, Value>,
        progress: Option<ProgressSink>,
    ) -> Result<Value, ToolFailure> {
        if let Some(why) = self.withdrawn() {
            return Err(ToolFailure::new(
                ErrorCode::ConnectorChannelUnavailable,
                format!(
                    "the Connector's Tools are withdrawn: {why}; they come back when its /health answers again"
                ),
            ));
        }
        if let Some(sink) = progress {
            lock(&self.progress).insert(tool_id.to_owned(), sink);
        }
        let options = ToolCallOptions {
            tool_call_id: Some(xagent_protocol_types::mint_prefixed("call_mcp_", rand::random())),
            fill_channel_argument: true,
            ..ToolCallOptions::default()
        };
        let outcome = self.plane.invoke_tool_with(OWNER, None, tool_id, arguments, options).await;
        lock(&self.progress).remove(tool_id);
        let outcome = outcome?;
        tracing::debug!(tool = tool_id, channel = %outcome.channel, "tool call answered");
        Ok(outcome.ack.result.unwrap_or(Value::Null))
    }

    /// `connector_message_send` through the runtime (ownership checked there, outbox until
    /// acked), then up to `wait` for the ack that settles it.
    pub async fn send_message(
        &self,
        arguments: &Map<String, Value>,
        wait: Duration,
    ) -> Result<Value, ToolFailure> {
        let mut queued =
            self.plane.call_builtin(OWNER, "connector_message_send", arguments).await?;
        let channel = arguments.get("connector_channel_id").and_then(Value::as_str);
        let message_id = queued.get("message_id").and_then(Value::as_str);
        let (Some(channel), Some(message_id)) = (channel, message_id) else {
            return Ok(queued);
        };
        let channel = ConnectorChannelId::new(channel);
        let message_id = MessageId::new(message_id);
        match self.plane.settled_ack(&channel, &message_id, wait).await {
            Some(ack) => ack_result(ack, queued),
            None => {
                if let Some(object) = queued.as_object_mut() {
                    object.insert(
                        "note".into(),
                        json!(
                            "not acknowledged yet; it is redelivered until the Connector accepts it"
                        ),
                    );
                }
                Ok(queued)
            }
        }
    }
}

fn ack_result(ack: ChatMessageAck, queued: Value) -> Result<Value, ToolFailure> {
    match ack.status {
        AckStatus::Accepted | AckStatus::Duplicate => {
            Ok(json!({ "status": "accepted", "message_id": queued.get("message_id") }))
        }
        _ => Err(ToolFailure::new(
            ack.code.unwrap_or(ErrorCode::TargetDeliveryFailed),
            ack.message.unwrap_or_else(|| "the Connector rejected the message".into()),
        )),
    }
}
