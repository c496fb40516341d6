//! The Matrix half of the runtime's shared IM send Tools (`matrix_message_send`,
//! `matrix_file_send`): how a text or a file is posted in the channel's room. The arguments,
//! their checks, opening the file and the call's effect id are the runtime's
//! ([`xagent_server_runtime::im_tools::ImSender`]).

use std::sync::Arc;

use xagent_protocol_types::ErrorCode;
use xagent_server_runtime::im_tools::{ImSender, OpenedFile};
use xagent_server_runtime::{ToolContext, ToolError};

use crate::app::App;
use crate::delivery::txn_id;

/// Posts the agent's Tool sends in the room bound to the channel.
pub(crate) struct MatrixSender(pub(crate) Arc<App>);

/// The message id of a Tool call's post: the call's effect id, so a repeat posts once.
fn tool_message_id(effect_id: &str) -> String {
    format!("tool:{effect_id}")
}

impl ImSender for MatrixSender {
    const PLACE: &'static str = "Matrix room";

    async fn send_text(
        &self,
        ctx: &ToolContext,
        effect_id: &str,
        text: String,
    ) -> Result<String, ToolError> {
        let app = &self.0;
        let room = app.room(&ctx.binding)?;
        let id = tool_message_id(effect_id);
        let event_id = app.post_text(&room, &ctx.channel, &id, &text, None).await?;
        // `None` only for an empty text, which the runtime refused before.
        event_id
            .map(|e| e.to_string())
            .ok_or_else(|| ToolError::new(ErrorCode::InvalidArguments, "there was no text to post"))
    }

    async fn send_file(
        &self,
        ctx: &ToolContext,
        effect_id: &str,
        file: OpenedFile,
        caption: Option<String>,
    ) -> Result<String, ToolError> {
        let app = &self.0;
        let room = app.room(&ctx.binding)?;
        app.check_postable(&file.record)?;
        let txn = txn_id(&ctx.channel, &tool_message_id(effect_id), "file");
        let event_id = app.post_file(&room, (file.record, file.reader), caption, txn).await?;
        Ok(event_id.to_string())
    }
}
