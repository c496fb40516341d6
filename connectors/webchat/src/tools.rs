//! The web chat half of the runtime's shared IM send Tools (`webchat_message_send`,
//! `webchat_file_send`): how a text or a file is shown in the channel's room. The arguments,
//! their checks, opening the file and the call's effect id are the runtime's
//! ([`xagent_server_runtime::im_tools::ImSender`]).

use crate::app::{App, stage_agent_message};
use crate::store::{Author, ChatEntry, EntryFile, EntryStatus, Room};
use std::sync::Arc;
use xagent_server_runtime::im_tools::{ImSender, OpenedFile};
use xagent_server_runtime::{ToolContext, ToolError};

/// Shows the agent's Tool sends in the room bound to the channel (the rooms are in the
/// Connector's state).
pub(crate) struct WebchatSender;

/// The room message id of a Tool send: the call's effect id, so a repeat of the same call
/// (even after the runtime's idempotency window) shows one message.
fn tool_message_id(effect_id: &str) -> String {
    format!("msg_tool_{effect_id}")
}

impl WebchatSender {
    async fn room(&self, ctx: &ToolContext<Arc<App>>) -> Result<Room, ToolError> {
        ctx.state().room_of(&ctx.channel).await.ok_or_else(|| {
            ToolError::permission_denied("this channel serves no chat room; sign in again")
        })
    }

    /// Stages the entry on the call (shown once the call's record committed).
    async fn show(
        &self,
        ctx: &ToolContext<Arc<App>>,
        room: &Room,
        entry: ChatEntry,
    ) -> Result<String, ToolError> {
        let shown =
            stage_agent_message(ctx, &room.room_id, entry).await.map_err(ToolError::internal)?;
        Ok(shown.message_id)
    }
}

impl ImSender<Arc<App>> for WebchatSender {
    const PLACE: &'static str = "web chat room";

    async fn send_text(
        &self,
        ctx: &ToolContext<Arc<App>>,
        effect_id: &str,
        text: String,
    ) -> Result<String, ToolError> {
        let room = self.room(ctx).await?;
        let entry = ChatEntry {
            message_id: tool_message_id(effect_id),
            author: Author::Assistant,
            text: Some(text),
            files: vec![],
            status: EntryStatus::Shown,
            error: None,
            client_id: None,
            created_at: ctx.handle.now_millis(),
        };
        self.show(ctx, &room, entry).await
    }

    async fn send_file(
        &self,
        ctx: &ToolContext<Arc<App>>,
        effect_id: &str,
        file: OpenedFile,
        caption: Option<String>,
    ) -> Result<String, ToolError> {
        let room = self.room(ctx).await?;
        // The page reads the file from the runtime's store by its ref; the bytes stay there.
        let record = file.record;
        let entry = ChatEntry {
            message_id: tool_message_id(effect_id),
            author: Author::Assistant,
            text: caption,
            files: vec![EntryFile {
                file_ref: record.file_ref.to_string(),
                filename: record.filename,
                mime_type: Some(record.mime_type),
                byte_size: Some(record.byte_size),
            }],
            status: EntryStatus::Shown,
            error: None,
            client_id: None,
            created_at: ctx.handle.now_millis(),
        };
        self.show(ctx, &room, entry).await
    }
}

#[cfg(test)]
mod tests {
    use crate::names::{PROVIDER, TOOL_FILE_SEND, TOOL_MESSAGE_SEND};

    #[test]
    fn the_shared_tools_keep_the_published_tool_ids() {
        let (message, file) = xagent_server_runtime::im_tools::im_tool_ids(PROVIDER);
        assert_eq!((message.as_str(), file.as_str()), (TOOL_MESSAGE_SEND, TOOL_FILE_SEND));
    }
}
