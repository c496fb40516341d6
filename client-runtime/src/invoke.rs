//! Card Tools at the model boundary: the projection the model sees (upload-reference
//! arguments shown as a unified file reference), `tool.invoke` with the channel resolution of
//! protocol section 10.1, the upload that turns a model file reference into the Connector's
//! `file_ref`, the built-in model Tools `connector_channels_list` and `connector_message_send`,
//! and inbound files saved through an application-supplied sink.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use xagent_profile_im::ChatMessageBuilder;
use xagent_protocol_types::{
    ConnectorChannelId, ErrorCode, ProfileId, Side, ToolInvoke, ToolInvokeAck, ToolInvokeContext,
    ToolProgressPush, WireError,
};

use crate::connection::{Shared, lock, request_typed};
use crate::files::{FileSink, FileSource};
use crate::upload_refs::{UploadRefProperty, upload_ref_properties};
use crate::{ClientError, ControlPlane, DataPlane, FunctionDeclaration, SessionBinding};

/// The name of the built-in Tool listing the user's channels.
pub const CHANNELS_LIST_TOOL: &str = "connector_channels_list";
/// The name of the built-in Tool sending text to an explicit channel.
pub const MESSAGE_SEND_TOOL: &str = "connector_message_send";

/// The built-in model Tools, with their schemas.
pub fn builtin_tools() -> Vec<FunctionDeclaration> {
    let object = |value: Value| value.as_object().cloned().unwrap_or_default();
    vec![
        FunctionDeclaration {
            name: CHANNELS_LIST_TOOL.into(),
            description: "List the user's Connector channels: id, status, target account and the Tools available on each.".into(),
            parameters: object(json!({"type": "object", "properties": {}, "additionalProperties": false})),
        },
        FunctionDeclaration {
            name: MESSAGE_SEND_TOOL.into(),
            description: "Send text to one exact channel the user chose. Pass a connector_channel_id returned by connector_channels_list unchanged.".into(),
            parameters: object(json!({
                "type": "object",
                "required": ["connector_channel_id", "text"],
                "additionalProperties": false,
                "properties": {
                    "connector_channel_id": {"type": "string", "minLength": 1, "description": "The channel, exactly as connector_channels_list returned it."},
                    "text": {"type": "string", "minLength": 1, "description": "The text to send."}
                }
            })),
        },
    ]
}

/// How a Tool call is made beyond its arguments.
#[derive(Debug, Clone, Default)]
pub struct ToolCallOptions {
    /// The model's call id: the Connector's key for a repeated call.
    pub tool_call_id: Option<String>,
    /// The xAgent session (opaque to the Connector).
    pub session_id: Option<String>,
    /// The caller stands in for a model that may leave out the redundant
    /// `connector_channel_id` argument: the resolved channel is written there when it is
    /// missing ([`crate::fill_channel_argument`]). A value present is passed on unchanged and
    /// never selects the channel (section 10.1).
    pub fill_channel_argument: bool,
}

/// What [`DataPlane::invoke_tool`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    /// The channel the call resolved to.
    pub channel: ConnectorChannelId,
    /// The typed ack.
    pub ack: ToolInvokeAck,
}

pub(crate) fn on_progress(_shared: &Shared, progress: &ToolProgressPush) {
    tracing::debug!(tool = %progress.tool_id, "tool progress");
}

impl DataPlane {
    /// Sets where files named by the model come from (needed for Tools with upload-reference
    /// arguments).
    pub fn set_file_source(&self, source: Arc<dyn FileSource>) {
        *lock(&self.shared().files) = Some(source);
    }

    /// Sets where inbound files go: each file of an inbound message is downloaded and saved
    /// before the message reaches the application ([`crate::InboundMessage::saved_files`]).
    pub fn set_file_sink(&self, sink: Arc<dyn FileSink>) {
        *lock(&self.shared().sink) = Some(sink);
    }

    /// Replaces the admitted Card after a refetch re-admitted the Connector (Tool resolution
    /// and projection follow the new Card).
    pub fn set_card(&self, card: xagent_protocol_types::ConnectorCard) {
        self.shared().set_card(card);
    }

    /// A snapshot of the channel directory.
    pub fn directory(&self) -> crate::ChannelDirectory {
        lock(&self.shared().directory).clone()
    }

    /// The model-visible Card Tools of `owner`: every Card Tool available on at least one of
    /// the user's channels, with upload-reference arguments projected.
    pub fn model_tools(&self, owner: &str) -> Vec<FunctionDeclaration> {
        let directory = self.directory();
        let Some(card) = directory.card() else { return Vec::new() };
        card.tools
            .iter()
            .filter(|tool| {
                directory.owned_by(owner).any(|entry| entry.tool_available(tool.tool_id.as_str()))
            })
            .map(crate::tools::declaration)
            .collect()
    }

    /// Invokes a Card Tool for `owner` (section 10.1): resolves the channel, uploads files
    /// named in upload-reference arguments on that channel and puts the Connector's
    /// `file_ref` in their place, writes the channel into the envelope, passes the other
    /// arguments unchanged and returns the typed ack. Progress pushes arrive as
    /// [`crate::ClientEvent::ToolProgress`].
    pub async fn invoke_tool(
        &self,
        owner: &str,
        session_binding: Option<&SessionBinding>,
        tool_id: &str,
        arguments: Map<String, Value>,
    ) -> Result<ToolOutcome, ClientError> {
        self.invoke_tool_with(
            owner,
            session_binding,
            tool_id,
            arguments,
            ToolCallOptions::default(),
        )
        .await
    }

    /// [`DataPlane::invoke_tool`] with a call id and session id.
    pub async fn invoke_tool_with(
        &self,
        owner: &str,
        session_binding: Option<&SessionBinding>,
        tool_id: &str,
        mut arguments: Map<String, Value>,
        options: ToolCallOptions,
    ) -> Result<ToolOutcome, ClientError> {
        let shared = self.shared();
        let (channel, upload_refs) = {
            let directory = lock(&shared.directory);
            let channel =
                directory.resolve(owner, session_binding, tool_id).map_err(ClientError::Refused)?;
            let upload_refs = directory
                .card()
                .and_then(|card| card.tools.iter().find(|t| t.tool_id.as_str() == tool_id))
                .map(|tool| upload_ref_properties(&tool.input_schema))
                .unwrap_or_default();
            (channel, upload_refs)
        };
        if options.fill_channel_argument {
            crate::model_args::fill_channel_argument(&mut arguments, &channel);
        }
        if !upload_refs.is_empty() {
            self.substitute_uploads(&channel, &upload_refs, &mut arguments).await?;
        }
        let mut invoke = ToolInvoke::new(tool_id, arguments);
        if options.tool_call_id.is_some() || options.session_id.is_some() {
            let mut context = ToolInvokeContext::default();
            context.tool_call_id = options.tool_call_id.map(Into::into);
            context.session_id = options.session_id;
            invoke = invoke.with_context(context);
        }
        let ack = request_typed(shared, Some(&channel), invoke).await?;
        Ok(ToolOutcome { channel, ack })
    }

    async fn substitute_uploads(
        &self,
        channel: &ConnectorChannelId,
        properties: &[UploadRefProperty],
        arguments: &mut Map<String, Value>,
    ) -> Result<(), ClientError> {
        let source = lock(&self.shared().files).clone().ok_or_else(|| {
            ClientError::Refused(WireError::new(
                ErrorCode::InvalidArguments,
                "this Tool takes a file, but no file source is configured",
            ))
        })?;
        for property in properties {
            let Some(value) = arguments.get_mut(&property.name) else { continue };
            if property.array {
                let Some(items) = value.as_array_mut() else {
                    return Err(invalid(&property.name, "a list of file references"));
                };
                for item in items {
                    *item =
                        upload_one(self, source.as_ref(), channel, item, &property.name).await?;
                }
            } else {
                *value = upload_one(self, source.as_ref(), channel, value, &property.name).await?;
            }
        }
        Ok(())
    }

    /// The HTTP side (uploads, downloads) of this Connector: one client per data plane, shared
    /// by every call (cheap to clone).
    pub fn control(&self) -> ControlPlane {
        self.shared().control()
    }

    /// Runs a built-in model Tool for `owner`: `connector_channels_list` returns the user's
    /// channels; `connector_message_send` sends text to the explicit channel after checking
    /// that it belongs to the user.
    pub async fn call_builtin(
        &self,
        owner: &str,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<Value, ClientError> {
        match tool {
            CHANNELS_LIST_TOOL => {
                let directory = self.directory();
                let channels: Vec<Value> = directory
                    .owned_by(owner)
                    .map(|entry| {
                        let descriptor = entry.descriptor.as_ref();
                        json!({
                            "connector_channel_id": entry.connector_channel_id,
                            "status": entry.status().map(ToString::to_string),
                            "target": descriptor.map(|d| json!({
                                "provider": d.target.provider,
                                "display_name": d.target.display_name,
                            })),
                            "tools": descriptor.map(|d| d.tools.iter()
                                .filter(|t| entry.tool_available(t.tool_id.as_str()))
                                .map(|t| t.tool_id.to_string()).collect::<Vec<_>>()),
                        })
                    })
                    .collect();
                Ok(json!({ "channels": channels }))
            }
            MESSAGE_SEND_TOOL => {
                let channel = arguments
                    .get("connector_channel_id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| invalid("connector_channel_id", "a channel id"))?;
                let text = arguments
                    .get("text")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| invalid("text", "non-empty text"))?;
                let channel = ConnectorChannelId::new(channel);
                {
                    let directory = self.directory();
                    let entry =
                        directory.check_explicit(owner, &channel).map_err(ClientError::Refused)?;
                    let im = ProfileId::from("xagent.im.v2");
                    if !entry
                        .descriptor
                        .as_ref()
                        .is_some_and(|d| d.connection.profiles.contains(&im))
                    {
                        return Err(ClientError::Refused(WireError::new(
                            ErrorCode::ConnectorChannelUnavailable,
                            "the channel does not carry IM messages",
                        )));
                    }
                }
                let message_id = crate::ids::mint("msg_");
                let message = ChatMessageBuilder::new(message_id.as_str())
                    .text(text)
                    .created_at(self.shared().now())
                    .build(Side::Xagent)
                    .map_err(|e| ClientError::Refused(WireError::new(e.code(), e.to_string())))?;
                self.send_chat_message(&channel, message).await?;
                Ok(json!({ "status": "queued", "message_id": message_id }))
            }
            other => Err(ClientError::Refused(WireError::new(
                ErrorCode::ToolNotFound,
                format!("{other} is not a built-in Tool"),
            ))),
        }
    }
}

fn invalid(property: &str, expected: &str) -> ClientError {
    ClientError::Refused(WireError::new(
        ErrorCode::InvalidArguments,
        format!("{property} must be {expected}"),
    ))
}

async fn upload_one(
    plane: &DataPlane,
    source: &dyn FileSource,
    channel: &ConnectorChannelId,
    reference: &Value,
    property: &str,
) -> Result<Value, ClientError> {
    let reference = reference
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid(property, "a file reference from the conversation"))?;
    let file = source.open(reference).await.map_err(|reason| {
        ClientError::Refused(WireError::new(
            ErrorCode::InvalidArguments,
            format!("{property}: the file could not be opened: {reason}"),
        ))
    })?;
    let uploaded = plane.upload_on(channel, file).await?;
    Ok(Value::String(uploaded.file_ref.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upload_refs::{UPLOAD_REF_ANNOTATION, model_input_schema};

    fn send_file_schema() -> Map<String, Value> {
        json!({
            "type": "object",
            "required": ["connector_channel_id", "file_ref"],
            "properties": {
                "connector_channel_id": {"type": "string"},
                "file_ref": {"type": "string", "description": "A file_ref from POST /files/uploads.", UPLOAD_REF_ANNOTATION: true},
                "more": {"type": "array", "items": {"type": "string", UPLOAD_REF_ANNOTATION: true}},
                "caption": {"type": "string"}
            }
        })
        .as_object()
        .cloned()
        .unwrap_or_default()
    }

    #[test]
    fn upload_ref_rule_annotated_properties_are_found() {
        let found = upload_ref_properties(&send_file_schema());
        assert_eq!(
            found,
            vec![
                UploadRefProperty { name: "file_ref".into(), array: false },
                UploadRefProperty { name: "more".into(), array: true },
            ]
        );
    }

    #[test]
    fn upload_ref_rule_model_schema_shows_no_connector_file_ref() {
        let projected = model_input_schema(&send_file_schema());
        let text = serde_json::to_string(&projected).unwrap_or_default();
        assert!(!text.contains(UPLOAD_REF_ANNOTATION), "{text}");
        assert!(!text.to_lowercase().contains("upload"), "{text}");
        let file = &projected["properties"]["file_ref"];
        assert_eq!(file["type"], "string");
        assert!(
            file["description"].as_str().unwrap_or("").contains("A file from the conversation")
        );
        assert_eq!(projected["properties"]["more"]["items"]["type"], "string");
        assert_eq!(projected["properties"]["caption"], json!({"type": "string"}));
        assert_eq!(projected["required"], send_file_schema()["required"]);
    }

    #[test]
    fn builtin_tools_have_object_schemas_with_required_channel() {
        let tools = builtin_tools();
        assert_eq!(tools[0].name.as_str(), CHANNELS_LIST_TOOL);
        assert_eq!(tools[1].name.as_str(), MESSAGE_SEND_TOOL);
        assert_eq!(tools[1].parameters["required"], json!(["connector_channel_id", "text"]));
        for tool in tools {
            assert_eq!(tool.parameters["type"], "object");
        }
    }
}
