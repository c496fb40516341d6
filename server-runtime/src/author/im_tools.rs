//! The two IM Tools every chat Connector offers, written once: `<prefix>_message_send` posts a
//! text and `<prefix>_file_send` posts a file of the conversation, each outside the agent's
//! normal reply. The runtime owns the typed arguments and results (so the Card carries both
//! schemas), the checks, opening the file and the effect id; the Connector implements only
//! [`ImSender`], the target-specific posting, and registers both Tools with
//! [`crate::ConnectorBuilder::im_send_tools`].

use std::future::Future;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use xagent_file_transfer::{FileReader, FileRecord};
use xagent_protocol_types::{ErrorCode, FileRef};

use super::context::ToolContext;
use super::im::DeliveryError;
use super::tool::{ToolError, ToolSpec};
use crate::error::HandleError;

/// The longest text `<prefix>_message_send` takes, in characters.
pub const MAX_MESSAGE_CHARS: u32 = 32_000;

/// The longest caption `<prefix>_file_send` takes, in characters.
pub const MAX_CAPTION_CHARS: u32 = 4_000;

/// Arguments of `<prefix>_message_send`.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct MessageSendArgs {
    /// The text to show, as the agent, in the conversation bound to the current channel.
    #[schemars(length(min = 1, max = 32000))]
    pub text: String,
}

/// Arguments of `<prefix>_file_send`.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct FileSendArgs {
    /// The file to show: one from this conversation.
    #[schemars(extend("x-xagent-upload-ref" = true))]
    pub file_ref: String,
    /// Optional text shown with the file.
    #[serde(default)]
    #[schemars(length(max = 4000))]
    pub text: Option<String>,
}

/// Always `sent` (the target system took the message): a Tool that did not send answers with
/// an error instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(inline)]
pub enum SendStatus {
    // Documented on the enum: a variant doc comment turns the schema's plain `enum` into a
    // `oneOf` of constants.
    #[allow(missing_docs)]
    Sent,
}

/// Result of `<prefix>_message_send`.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub struct MessageSent {
    /// Always `sent`.
    pub status: SendStatus,
    /// The target system's id of the posted message.
    pub message_id: String,
}

/// Result of `<prefix>_file_send`.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub struct FileSent {
    /// Always `sent`.
    pub status: SendStatus,
    /// The target system's id of the posted message.
    pub message_id: String,
    /// The file that was posted.
    pub file_ref: String,
}

/// A file of the channel, opened by the runtime for posting.
#[derive(Debug)]
pub struct OpenedFile {
    /// What the Transfer Plane knows of it: name, media type, size.
    pub record: FileRecord,
    /// Its bytes.
    pub reader: FileReader,
}

/// The target-specific half of the shared IM Tools: post a text or a file where the channel
/// is bound. `effect_id` is [`ToolContext::effect_id`]: the same for every repeat of one call,
/// so a target that deduplicates by an id (a transaction id, a message id) posts once. Each
/// method returns the target's id of the posted message.
pub trait ImSender<S = ()>: Send + Sync + 'static {
    /// What the agent posts into, for the Tools' texts (e.g. `web chat room`, `Matrix room`).
    const PLACE: &'static str = "conversation";

    /// Posts `text` (checked: not blank, at most [`MAX_MESSAGE_CHARS`]).
    fn send_text(
        &self,
        ctx: &ToolContext<S>,
        effect_id: &str,
        text: String,
    ) -> impl Future<Output = Result<String, ToolError>> + Send;

    /// Posts `file` with an optional caption (checked: not blank, at most
    /// [`MAX_CAPTION_CHARS`]).
    fn send_file(
        &self,
        ctx: &ToolContext<S>,
        effect_id: &str,
        file: OpenedFile,
        caption: Option<String>,
    ) -> impl Future<Output = Result<String, ToolError>> + Send;
}

/// A delivery failure reported to the agent as the Tool's error (same code and message).
impl From<DeliveryError> for ToolError {
    fn from(error: DeliveryError) -> Self {
        ToolError::new(error.code, error.message)
    }
}

/// The Tool ids of the pair for a Connector `prefix`: `<prefix>_message_send`,
/// `<prefix>_file_send`.
pub fn im_tool_ids(prefix: &str) -> (String, String) {
    (format!("{prefix}_message_send"), format!("{prefix}_file_send"))
}

/// The declarations of the pair, worded for `place` (see [`ImSender::PLACE`]).
pub(crate) fn im_tool_specs(prefix: &str, place: &str) -> (ToolSpec, ToolSpec) {
    let (message, file) = im_tool_ids(prefix);
    let message = ToolSpec::new(
        message,
        format!(
            "Send a message to the {place}\nShow an extra text message in the {place} bound to the current channel. Your normal reply is delivered without this tool: do not repeat it here."
        ),
    );
    let file = ToolSpec::new(
        file,
        format!(
            "Send a file to the {place}\nShow a file from this conversation in the {place} bound to the current channel, with optional text."
        ),
    );
    (message, file)
}

/// Counts characters against a bound the schema also states (the schema counts characters).
fn too_long(text: &str, max: u32) -> bool {
    text.chars().count() > max as usize
}

/// `<prefix>_message_send`: checks the text, then hands it to the sender with the call's
/// effect id.
pub(crate) async fn message_send<St, S: ImSender<St>>(
    sender: &S,
    ctx: ToolContext<St>,
    args: MessageSendArgs,
) -> Result<MessageSent, ToolError> {
    if args.text.trim().is_empty() {
        return Err(ToolError::new(ErrorCode::InvalidArguments, "text must not be empty"));
    }
    if too_long(&args.text, MAX_MESSAGE_CHARS) {
        let message = format!("text is longer than {MAX_MESSAGE_CHARS} characters; split it");
        return Err(ToolError::new(ErrorCode::InvalidArguments, message));
    }
    let effect_id = ctx.effect_id();
    let message_id = sender.send_text(&ctx, &effect_id, args.text).await?;
    Ok(MessageSent { status: SendStatus::Sent, message_id })
}

/// `<prefix>_file_send`: checks the caption, opens the file through the runtime (only a file
/// of this channel), then hands it to the sender with the call's effect id.
pub(crate) async fn file_send<St, S: ImSender<St>>(
    sender: &S,
    ctx: ToolContext<St>,
    args: FileSendArgs,
) -> Result<FileSent, ToolError> {
    let caption = args.text.filter(|text| !text.trim().is_empty());
    if caption.as_deref().is_some_and(|text| too_long(text, MAX_CAPTION_CHARS)) {
        let message = format!("text is longer than {MAX_CAPTION_CHARS} characters; shorten it");
        return Err(ToolError::new(ErrorCode::InvalidArguments, message));
    }
    let file_ref = FileRef::new(args.file_ref.as_str());
    let (record, reader) =
        ctx.handle.open_file(&ctx.channel, &file_ref).await.map_err(open_error)?;
    let effect_id = ctx.effect_id();
    let file = OpenedFile { record, reader };
    let message_id = sender.send_file(&ctx, &effect_id, file, caption).await?;
    Ok(FileSent { status: SendStatus::Sent, message_id, file_ref: args.file_ref })
}

/// The error of a file that could not be opened. Unknown, expired and another channel's file
/// all read as "not here" (another channel's file is not named as existing).
fn open_error(error: HandleError) -> ToolError {
    match error.code() {
        ErrorCode::FileNotFound | ErrorCode::Forbidden => ToolError::new(
            ErrorCode::FileNotFound,
            "no such file on this channel (unknown or expired): pass a file_ref of a file from this conversation, or ask the user to send the file again",
        ),
        ErrorCode::InternalError => ToolError::internal(error),
        code => ToolError::new(code, error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::ConnectorChannelId;

    #[test]
    fn the_pair_is_named_after_the_prefix_and_worded_for_the_place() {
        let (message, file) = im_tool_specs("webchat", "web chat room");
        assert_eq!(im_tool_ids("webchat").0, "webchat_message_send");
        assert_eq!(message.title(), "Send a message to the web chat room");
        assert!(message.description().contains("web chat room bound to the current channel"));
        assert_eq!(file.title(), "Send a file to the web chat room");
        assert!(xagent_protocol_validate::model_text::wire_mentions(file.description()).is_empty());
    }

    #[test]
    fn an_unknown_or_foreign_file_is_file_not_found_and_says_what_to_do() {
        for error in [
            HandleError::FileOwnership,
            HandleError::File(xagent_file_transfer::TransferError::FileNotFound("gone")),
        ] {
            let tool = open_error(error);
            assert_eq!(tool.code, ErrorCode::FileNotFound);
            assert!(tool.message.contains("from this conversation"), "{}", tool.message);
        }
        let unknown = open_error(HandleError::UnknownChannel(ConnectorChannelId::new("cch_x")));
        assert_eq!(unknown.code, ErrorCode::ConnectionNotFound);
        let internal = open_error(HandleError::FilesDisabled);
        assert_eq!(internal.code, ErrorCode::InternalError);
        assert!(!internal.message.contains("Transfer Plane"), "no internal detail");
    }

    #[test]
    fn the_schemas_bound_the_text_and_mark_the_file_as_an_upload_reference() {
        let message = schemars::schema_for!(MessageSendArgs).to_value();
        assert_eq!(message["properties"]["text"]["minLength"], 1);
        assert_eq!(message["properties"]["text"]["maxLength"], MAX_MESSAGE_CHARS);
        let file = schemars::schema_for!(FileSendArgs).to_value();
        assert_eq!(file["properties"]["file_ref"]["x-xagent-upload-ref"], true);
        assert_eq!(file["properties"]["text"]["maxLength"], MAX_CAPTION_CHARS);
        assert_eq!(file["required"], serde_json::json!(["file_ref"]));
        let sent = schemars::schema_for!(FileSent).to_value();
        assert_eq!(sent["properties"]["status"]["enum"], serde_json::json!(["sent"]), "{sent:#}");
        assert_eq!(sent["required"], serde_json::json!(["status", "message_id", "file_ref"]));
    }

    #[test]
    fn a_delivery_error_keeps_its_code_and_message() {
        let error = ToolError::from(DeliveryError::permanent(ErrorCode::PermissionDenied, "no"));
        assert_eq!((error.code, error.message.as_str()), (ErrorCode::PermissionDenied, "no"));
    }
}
