//! [`ConnectorBuilder::im_send_tools`]: the shared IM send Tools in one builder line.

use std::sync::Arc;

use super::ConnectorBuilder;
use crate::author::ImSender;
use crate::author::im_tools::{file_send, im_tool_specs, message_send};

impl<St: Clone + Send + Sync + 'static> ConnectorBuilder<St> {
    /// Registers the two IM send Tools over `sender`: `<prefix>_message_send` (`text`) and
    /// `<prefix>_file_send` (`file_ref` of a file from the conversation, optional `text`),
    /// worded for [`ImSender::PLACE`]. The runtime checks the arguments, opens the file (an
    /// unknown, expired or foreign `file_ref` is `file_not_found`), derives the call's
    /// [`crate::ToolContext::effect_id`] and returns a typed result (`status`, `message_id`,
    /// and `file_ref` for a file), so the Card carries both Tools' `output_schema`. The sender
    /// gets the Connector's state through its contexts ([`ImSender`]`<St>`).
    #[must_use]
    pub fn im_send_tools<S: ImSender<St>>(self, prefix: &str, sender: S) -> Self {
        let (message_spec, file_spec) = im_tool_specs(prefix, S::PLACE);
        let sender = Arc::new(sender);
        let file_sender = Arc::clone(&sender);
        self.tool(message_spec, move |ctx, args| {
            let sender = Arc::clone(&sender);
            async move { message_send(&*sender, ctx, args).await }
        })
        .tool(file_spec, move |ctx, args| {
            let sender = Arc::clone(&file_sender);
            async move { file_send(&*sender, ctx, args).await }
        })
    }
}
