//! The Tools `matrix_message_send` and `matrix_file_send`.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use xagent_protocol_types::{ErrorCode, FileRef};
use xagent_server_runtime::{DeliveryError, ToolContext, ToolError};

use crate::app::App;
use crate::delivery::txn_id;

/// Arguments of `matrix_message_send`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct MessageSendArgs {
    /// The text to post in the Matrix room bound to the current channel.
    #[schemars(length(min = 1, max = 32000))]
    pub text: String,
}

/// Arguments of `matrix_file_send`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct FileSendArgs {
    /// The file to post: one from this conversation (xAgent hands it to the Connector).
    #[schemars(extend("x-xagent-upload-ref" = true))]
    pub file_ref: String,
    /// Optional caption posted with the file.
    #[serde(default)]
    #[schemars(length(max = 4000))]
    pub text: Option<String>,
}

/// The message id of a Tool call's post: derived from the call, so a repeat posts once.
pub(crate) fn tool_message_id(ctx: &ToolContext) -> String {
    let key = ctx
        .tool_call_id
        .as_ref()
        .map(|id| id.to_string())
        .or_else(|| ctx.request_id.as_ref().map(|id| id.to_string()))
        .unwrap_or_else(|| format!("{:x}", rand::random::<u64>()));
    format!("tool:{}:{key}", ctx.tool_id)
}

pub(crate) fn tool_error(e: DeliveryError) -> ToolError {
    ToolError::new(e.code, e.message)
}

pub(crate) async fn message_send(
    app: Arc<App>,
    ctx: ToolContext,
    args: MessageSendArgs,
) -> Result<Value, ToolError> {
    if args.text.trim().is_empty() {
        return Err(ToolError::new(ErrorCode::InvalidArguments, "text must not be empty"));
    }
    let room = app.room(&ctx.binding).map_err(tool_error)?;
    let id = tool_message_id(&ctx);
    let event_id =
        app.post_text(&room, &ctx.channel, &id, &args.text, None).await.map_err(tool_error)?;
    Ok(json!({ "status": "sent", "event_id": event_id.map(|e| e.to_string()) }))
}

pub(crate) async fn file_send(
    app: Arc<App>,
    ctx: ToolContext,
    args: FileSendArgs,
) -> Result<Value, ToolError> {
    let room = app.room(&ctx.binding).map_err(tool_error)?;
    let file_ref = FileRef::new(args.file_ref.as_str());
    let txn = txn_id(&ctx.channel, &tool_message_id(&ctx), "file");
    let posted = match app.open_for_posting(&ctx.handle, &ctx.channel, &file_ref).await {
        Ok(opened) => app.post_file(&room, opened, args.text, txn).await,
        Err(e) => Err(e),
    };
    let event_id = posted.map_err(|e| {
        if e.code == ErrorCode::FileNotFound {
            ToolError::new(
                ErrorCode::FileNotFound,
                "no such file on this channel (unknown or expired); post a file from this conversation",
            )
        } else {
            tool_error(e)
        }
    })?;
    Ok(json!({ "status": "sent", "event_id": event_id.to_string(), "file_ref": args.file_ref }))
}
