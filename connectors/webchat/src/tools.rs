//! The Tools: `webchat_message_send` and `webchat_file_send`, each shown once per call.

use crate::app::{App, stage_agent_message};
use crate::store::{Author, ChatEntry, EntryFile, EntryStatus, Room};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use xagent_protocol_types::{ErrorCode, FileRef};
use xagent_server_runtime::{ToolContext, ToolError};

/// Arguments of `webchat_message_send`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct MessageSendArgs {
    /// The text to show in the chat room, as the agent.
    pub text: String,
}

/// Arguments of `webchat_file_send`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct FileSendArgs {
    /// The file to show in the chat room.
    #[schemars(extend("x-xagent-upload-ref" = true))]
    pub file_ref: String,
    /// Optional text shown with the file.
    #[serde(default)]
    pub text: Option<String>,
}

/// The message id of a Tool send: derived from the call, so a repeat of the same call (even
/// after the runtime's idempotency window) shows one message.
fn tool_message_id(ctx: &ToolContext) -> String {
    use sha2::{Digest, Sha256};
    let key = ctx
        .tool_call_id
        .as_ref()
        .map(|id| id.to_string())
        .or_else(|| ctx.request_id.as_ref().map(|id| id.to_string()));
    match key {
        Some(key) => {
            let digest = Sha256::digest(format!("{}\n{}\n{key}", ctx.channel, ctx.tool_id));
            format!("msg_tool_{}", hex::encode(&digest[..12]))
        }
        None => format!("msg_tool_{}", crate::store::random_hex(12)),
    }
}

async fn tool_room(app: &App, ctx: &ToolContext) -> Result<Room, ToolError> {
    app.room_of(&ctx.channel).await.ok_or_else(|| {
        ToolError::permission_denied("this channel serves no chat room; sign in again")
    })
}

pub(crate) async fn message_send(
    app: Arc<App>,
    ctx: ToolContext,
    args: MessageSendArgs,
) -> Result<Value, ToolError> {
    if args.text.trim().is_empty() {
        return Err(ToolError::new(ErrorCode::InvalidArguments, "text must not be empty"));
    }
    let room = tool_room(&app, &ctx).await?;
    let entry = ChatEntry {
        message_id: tool_message_id(&ctx),
        author: Author::Assistant,
        text: Some(args.text),
        files: vec![],
        status: EntryStatus::Shown,
        error: None,
        client_id: None,
        created_at: ctx.handle.now_millis(),
    };
    let shown =
        stage_agent_message(&app, &ctx, &room.room_id, entry).await.map_err(ToolError::internal)?;
    Ok(json!({ "status": "sent", "message_id": shown.message_id, "room_id": room.room_id }))
}

pub(crate) async fn file_send(
    app: Arc<App>,
    ctx: ToolContext,
    args: FileSendArgs,
) -> Result<Value, ToolError> {
    let room = tool_room(&app, &ctx).await?;
    let file_ref = FileRef::new(args.file_ref.as_str());
    let (record, _file) = ctx.handle.open_file(&ctx.channel, &file_ref).await.map_err(|_| {
        ToolError::new(
            ErrorCode::FileNotFound,
            "no such file on this channel (unknown or expired); send a file from this conversation",
        )
    })?;
    let entry = ChatEntry {
        message_id: tool_message_id(&ctx),
        author: Author::Assistant,
        text: args.text.filter(|t| !t.trim().is_empty()),
        files: vec![EntryFile {
            file_ref: record.file_ref.to_string(),
            filename: record.filename.clone(),
            mime_type: Some(record.mime_type.clone()),
            byte_size: Some(record.byte_size),
        }],
        status: EntryStatus::Shown,
        error: None,
        client_id: None,
        created_at: ctx.handle.now_millis(),
    };
    let shown =
        stage_agent_message(&app, &ctx, &room.room_id, entry).await.map_err(ToolError::internal)?;
    Ok(json!({ "status": "sent", "message_id": shown.message_id, "file_ref": record.file_ref }))
}
