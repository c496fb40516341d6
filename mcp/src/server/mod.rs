//! The MCP face of the bridge (rmcp `ServerHandler`): the Connector's Tools plus the built-in
//! channel Tools, the Skill as a prompt and in the instructions, the inbox as resources with
//! update notifications, progress and tool errors.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, ListPromptsResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken, Prompt,
    PromptMessage, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Role,
    ServerCapabilities, ServerConfig, SubscribeRequestParams, SubscriptionFilter, Tool,
    UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, mpsc};
use xagent_protocol_types::ToolProgressPush;

mod resources;

use crate::annotations;
use crate::files::FILE_URI_PREFIX;
use crate::link::{Link, Notice, ToolFailure};
use crate::projection::{mcp_schema, message_wait_schema};
pub use crate::uris::{SIGN_IN_URI, channel_uri};

pub use crate::projection::{TOOL_CHANNELS_LIST, TOOL_MESSAGE_SEND, TOOL_MESSAGE_WAIT};
/// Longest wait `connector_message_wait` accepts.
pub const MAX_WAIT_SECONDS: u64 = 300;
/// How many messages a channel resource shows.
pub const CHANNEL_RESOURCE_MESSAGES: usize = 100;

/// One MCP session's handler; clones share the session's resource subscriptions.
#[derive(Clone)]
pub struct McpBridge {
    link: Arc<Link>,
    subscriptions: Arc<Mutex<HashSet<String>>>,
}

impl std::fmt::Debug for McpBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpBridge").field("link", &self.link).finish()
    }
}

fn failure_result(failure: &ToolFailure) -> CallToolResult {
    let mut result = CallToolResult::structured_error(json!({
        "error": { "code": failure.code.as_str(), "message": failure.message }
    }));
    result.content = vec![ContentBlock::text(format!("{}: {}", failure.code, failure.message))];
    result
}

/// Turns the `count`-th `tool.progress.push` of a call into an MCP progress notification. MCP
/// wants `progress` to grow: a fraction (with `total` 1) never goes below the last value sent,
/// and a push without a fraction counts pushes.
fn progress_param(
    token: ProgressToken,
    push: &ToolProgressPush,
    count: u32,
    last: &mut f64,
) -> ProgressNotificationParam {
    let (progress, total) = match push.progress {
        Some(fraction) if fraction.is_finite() => (fraction.clamp(0.0, 1.0).max(*last), Some(1.0)),
        _ => (f64::from(count), None),
    };
    *last = progress;
    let mut param = ProgressNotificationParam::new(token, progress);
    param.total = total;
    param.message = push.message.clone().or_else(|| push.status.clone());
    param
}

fn success_result(value: Value) -> CallToolResult {
    match value {
        Value::Object(_) => CallToolResult::structured(value),
        other => CallToolResult::success(vec![ContentBlock::text(other.to_string())]),
    }
}

impl McpBridge {
    /// A handler for one MCP session over the shared link.
    pub fn new(link: Arc<Link>) -> Self {
        Self { link, subscriptions: Arc::new(Mutex::new(HashSet::new())) }
    }

    fn subscriptions(&self) -> MutexGuard<'_, HashSet<String>> {
        self.subscriptions.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn instructions(&self) -> String {
        let Some(card) = self.link.card() else {
            return "The Connector's Card is not available; its Tools cannot be listed.".into();
        };
        let mut text = format!(
            "This server puts the xAgent Connector {} ({}) in front of you. Call its Tools to act on the connected {} target. \
             Inbound messages: call {TOOL_MESSAGE_WAIT} to take the next one (each is handed to you once), or read and subscribe to the channel's messages resource. \
             {TOOL_CHANNELS_LIST} lists the channels with their state; {TOOL_MESSAGE_SEND} sends a chat message on one. \
             Files that arrive are resources ({FILE_URI_PREFIX}...); pass such a URI, or a path under an allowed directory, where a Tool takes a file.",
            card.connector.name,
            card.connector_card_id,
            card.supports.target_types.first().map(|t| t.as_str()).unwrap_or("target"),
        );
        if let Some(limit) = crate::link::unhandled_messages(&card) {
            text.push_str("\n\nNote: ");
            text.push_str(&limit);
            text.push('.');
        }
        if let Some(skill) = self.link.skill() {
            text.push_str("\n\nThe Connector's Skill:\n\n");
            text.push_str(&skill);
        }
        text
    }

    fn tools(&self) -> Vec<Tool> {
        let card = self.link.card();
        let mut tools: Vec<Tool> = self
            .link
            .model_tools()
            .into_iter()
            .map(|declaration| {
                let card_tool = card.as_ref().and_then(|c| c.tool(declaration.name.as_str()));
                let schema = match card_tool {
                    Some(tool) => mcp_schema(&declaration.parameters, &tool.input_schema),
                    None => declaration.parameters.clone(),
                };
                let mut mcp = Tool::new(
                    declaration.name.to_string(),
                    declaration.description,
                    Arc::new(schema),
                );
                if let Some(title) = card_tool.and_then(|t| t.title.clone()) {
                    mcp = mcp.with_title(title);
                }
                let derived = annotations::connector_tool(card_tool);
                mcp.with_annotations(self.link.annotations(declaration.name.as_str(), derived))
            })
            .collect();
        for builtin in self.link.builtin_tools() {
            let description = if builtin.name.as_str() == TOOL_MESSAGE_SEND {
                format!("{} Waits up to 10 s for the Connector to accept it.", builtin.description)
            } else {
                builtin.description
            };
            let name = builtin.name.as_str();
            let annotations = self.link.annotations(name, annotations::bridge_tool(name));
            tools.push(
                Tool::new(builtin.name.to_string(), description, Arc::new(builtin.parameters))
                    .with_annotations(annotations),
            );
        }
        tools.push(
            Tool::new(
                TOOL_MESSAGE_WAIT,
                "Wait for the next inbound chat message and take it; each message is returned once. Returns {\"message\": null} when the timeout passes first.",
                Arc::new(message_wait_schema(MAX_WAIT_SECONDS)),
            )
            .with_annotations(
                self.link.annotations(TOOL_MESSAGE_WAIT, annotations::bridge_tool(TOOL_MESSAGE_WAIT)),
            ),
        );
        tools
    }

    async fn wait_message(&self, arguments: &Map<String, Value>) -> Result<Value, ToolFailure> {
        let channel = arguments.get("connector_channel_id").and_then(Value::as_str);
        let seconds = match arguments.get("timeout_seconds") {
            None | Some(Value::Null) => 30,
            Some(value) => match value.as_u64() {
                Some(seconds) if seconds <= MAX_WAIT_SECONDS => seconds,
                _ => {
                    return Err(ToolFailure::new(
                        xagent_protocol_types::ErrorCode::InvalidArguments,
                        format!("timeout_seconds must be an integer from 0 to {MAX_WAIT_SECONDS}"),
                    ));
                }
            },
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
        let mut arrivals = self.link.arrivals();
        loop {
            arrivals.borrow_and_update();
            let taken = self.link.inbox().take_next(channel).await.map_err(|e| {
                ToolFailure::new(xagent_protocol_types::ErrorCode::InternalError, e.to_string())
            })?;
            if let Some(message) = taken {
                return Ok(json!({ "message": resources::message_json(&message) }));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(json!({ "message": null }));
            }
            // A shared inbox may get a message from another bridge: look again now and then.
            let until = match self.link.inbox().poll_interval() {
                Some(every) => deadline.min(now + every),
                None => deadline,
            };
            if let Ok(Err(_)) = tokio::time::timeout_at(until, arrivals.changed()).await {
                return Ok(json!({ "message": null }));
            }
        }
    }

    async fn call(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> Result<Value, ToolFailure> {
        match name {
            TOOL_CHANNELS_LIST => self.link.channels_list().await,
            TOOL_MESSAGE_SEND => self.link.send_message(&arguments, Duration::from_secs(10)).await,
            TOOL_MESSAGE_WAIT => self.wait_message(&arguments).await,
            tool_id => {
                let progress = context.meta.get_progress_token().map(|token| {
                    let (sink, mut pushes) = mpsc::unbounded_channel();
                    let peer = context.peer.clone();
                    tokio::spawn(async move {
                        let mut count = 0;
                        let mut last = 0.0;
                        while let Some(push) = pushes.recv().await {
                            count += 1;
                            let param = progress_param(token.clone(), &push, count, &mut last);
                            if peer.notify_progress(param).await.is_err() {
                                return;
                            }
                        }
                    });
                    sink
                });
                self.link.invoke(tool_id, arguments, progress).await
            }
        }
    }
}

#[allow(deprecated)]
impl ServerHandler for McpBridge {
    fn get_info(&self) -> ServerConfig {
        let card = self.link.card();
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_prompts()
            .enable_prompts_list_changed()
            .enable_resources()
            .enable_resources_list_changed()
            .enable_resources_subscribe()
            .build();
        let mut implementation = Implementation::default();
        implementation.name = "xagent-connector-mcp".into();
        implementation.version = env!("CARGO_PKG_VERSION").into();
        implementation.title =
            card.map(|card| format!("{} via xagent-connector", card.connector.name));
        ServerConfig::new(capabilities)
            .with_server_info(implementation)
            .with_instructions(self.instructions())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        tracing::info!("MCP client initialized");
        self.forward_notices(context.peer);
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let known = self.tools().iter().any(|t| t.name == name)
            || self.link.card().is_some_and(|card| card.tool(&name).is_some());
        if !known {
            return Err(McpError::invalid_params(format!("unknown tool {name}"), None));
        }
        let arguments = request.arguments.unwrap_or_default();
        let result = match self.call(&name, arguments, &context).await {
            Ok(value) => success_result(value),
            Err(failure) => {
                tracing::info!(tool = %name, code = %failure.code, "tool call failed");
                failure_result(&failure)
            }
        };
        Ok(result.into())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let prompts = match (self.link.skill(), self.link.card()) {
            (Some(_), Some(card)) => vec![Prompt::new(
                card.primary_skill_name().to_string(),
                Some("How to use this Connector's Tools (its Skill)"),
                None,
            )],
            _ => Vec::new(),
        };
        Ok(ListPromptsResult::with_all_items(prompts))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let name = self.link.card().map(|card| card.primary_skill_name().to_string());
        match self.link.skill() {
            Some(skill) if name.as_deref() == Some(request.name.as_str()) => Ok(
                GetPromptResult::new(vec![PromptMessage::new_text(Role::User, skill.to_owned())])
                    .with_description("The Connector's Skill")
                    .into(),
            ),
            _ => Err(McpError::invalid_params(format!("no prompt {}", request.name), None)),
        }
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(self.resources().await))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        Ok(ReadResourceResult::new(self.read(&request.uri).await?).into())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.subscriptions().insert(request.uri);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.subscriptions().remove(&request.uri);
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let mut notices = self.link.notices();
        loop {
            let notice = tokio::select! {
                () = context.cancelled() => return Ok(()),
                notice = notices.recv() => notice,
            };
            let notice = match notice {
                Ok(notice) => notice,
                Err(broadcast::error::RecvError::Lagged(_)) => Notice::ToolsChanged,
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            };
            let sink = context.sink();
            let accepted = context.accepted();
            let sent = match notice {
                Notice::ToolsChanged if accepted.tools_list_changed == Some(true) => {
                    sink.notify_tool_list_changed().await
                }
                Notice::ResourcesChanged if accepted.resources_list_changed == Some(true) => {
                    sink.notify_resource_list_changed().await
                }
                Notice::PromptsChanged if accepted.prompts_list_changed == Some(true) => {
                    sink.notify_prompt_list_changed().await
                }
                Notice::ResourceUpdated(uri)
                    if accepted
                        .resource_subscriptions
                        .as_ref()
                        .is_some_and(|u| u.contains(&uri)) =>
                {
                    sink.notify_resource_updated(uri).await
                }
                _ => Ok(()),
            };
            if sent.is_err() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::NumberOrString;
    use xagent_protocol_types::ErrorCode;

    #[test]
    fn tool_errors_carry_the_wire_code() {
        let failure = ToolFailure::new(ErrorCode::ConnectorChannelUnavailable, "not now");
        let result = failure_result(&failure);
        assert_eq!(result.is_error, Some(true));
        assert_eq!(
            result.structured_content,
            Some(json!({"error": {"code": "connector_channel_unavailable", "message": "not now"}}))
        );
        let text = serde_json::to_string(&result.content).unwrap_or_default();
        assert!(text.contains("connector_channel_unavailable: not now"), "{text}");
    }

    #[test]
    fn progress_pushes_become_growing_mcp_progress() {
        let token = ProgressToken(NumberOrString::Number(7));
        let mut last = 0.0;
        let half = ToolProgressPush::new("t").with_progress(0.5).with_message("half way");
        let first = progress_param(token.clone(), &half, 1, &mut last);
        assert_eq!((first.progress, first.total), (0.5, Some(1.0)));
        assert_eq!(first.message.as_deref(), Some("half way"));
        // A smaller fraction never makes progress go back.
        let back = ToolProgressPush::new("t").with_progress(0.2);
        let second = progress_param(token.clone(), &back, 2, &mut last);
        assert_eq!(second.progress, 0.5);
        // Without a fraction the pushes are counted; the status is the message.
        let plain = ToolProgressPush::new("t");
        let third = progress_param(token, &plain, 3, &mut 0.0);
        assert_eq!((third.progress, third.total), (3.0, None));
        assert_eq!(third.message.as_deref(), Some("running"));
    }
}
