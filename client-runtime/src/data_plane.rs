//! The public methods of [`DataPlane`] that the features add: IM v2 (assistant messages,
//! deltas, activity, uploads, the outbox), Tool calls and built-in Tools, the settling ack of a sent message, and the admitted
//! Card with the health monitor wired to it.
//!
//! Settling acks: the fate of an assistant message, for a caller that wants to wait for it:
//! the ack that ended its delivery (`accepted`, `duplicate`, or a rejection that is not
//! retryable), kept for the last [`crate::RECENT_SETTLED_ACKS`] messages so a caller who
//! starts waiting after the ack arrived still learns it. A retryable rejection does not end
//! anything (the outbox delivers the message again), so it is not reported here. The runtime
//! records every settling ack itself as the outbox applies it; an application asks with
//! [`DataPlane::settled_ack`] instead of keeping its own buffer of
//! [`crate::ClientEvent::ChatMessageAcked`] events.
//!
//! The admitted Card: a Card the health monitor refetches and re-admits goes straight into the
//! data plane's one home of the admission (what the packet rules, the next hello, the
//! Descriptor rules, Tool resolution and projection read), so an application keeps no Card of
//! its own.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use xagent_profile_im::{ChatMessageBuilder, EnqueueOutcome, OutboxStats};
use xagent_protocol_types::{
    ChatActivity, ChatFile, ChatMessage, ChatMessageAck, ChatMessageDelta, ConnectorCard,
    ConnectorChannelId, ErrorCode, MessageId, Packet, Payload, ProfileId, Side, ToolInvoke,
    ToolInvokeContext, UploadResponse, WireError,
};

use crate::admission::check_card;
use crate::connection::{lock, request_typed};
use crate::files::{FileSink, FileSource};
use crate::health::HealthMonitor;
use crate::im::{judge_delta, pump};
use crate::invoke::{
    CHANNELS_LIST_TOOL, MESSAGE_SEND_TOOL, ToolCallOptions, ToolOutcome, invalid, upload_one,
};
use crate::store::{AdmissionSnapshot, CommitError, XagentWrite};
use crate::stream::MessageStream;
use crate::upload_refs::{UploadRefProperty, upload_ref_properties};
use crate::uploads::message_file;
use crate::{
    ClientError, ControlPlane, DataPlane, FileContent, FunctionDeclaration, SessionBinding, ids,
};

impl DataPlane {
    /// Queues a complete assistant message for a channel. It stays pending until the Connector
    /// acks `accepted` or `duplicate`, and is redelivered with the same `message_id` after
    /// timeouts, disconnects and retryable rejections, until it expires. Every file must be
    /// one [`DataPlane::upload_message_file`] uploaded on this channel and not yet expired
    /// ([`crate::OutboundFileError`] otherwise, nothing queued). The message closes its delta
    /// stream: later deltas of the same `message_id` are refused.
    pub async fn send_chat_message(
        &self,
        channel: &ConnectorChannelId,
        message: ChatMessage,
    ) -> Result<EnqueueOutcome, ClientError> {
        let (outcome, ticket) = {
            let now = self.shared().now();
            let mut im = self.shared().im.lock().await;
            if !im.may_act() {
                return Err(CommitError::NotHolder.into());
            }
            im.uploads.check(channel, &message.files, now)?;
            let persisted = im.persisted(channel);
            let message_id = message.message_id.clone();
            let outcome = im.outbox.enqueue(&persisted, message, now)?;
            im.deltas.on_final(&persisted, &message_id);
            (outcome, im.flush(Vec::new()))
        };
        // Reported done only once its record is stored.
        if let Err(error) = ticket.await {
            self.shared().commit_failed("an enqueued message", &error);
            return Err(error.into());
        }
        pump(self.shared()).await;
        Ok(outcome)
    }

    /// Starts streaming an assistant message on `channel`: the runtime numbers its deltas from
    /// 1 ([`MessageStream::delta`]) and its final message closes it
    /// ([`MessageStream::finish`]).
    pub fn stream_message(
        &self,
        channel: &ConnectorChannelId,
        message_id: impl Into<MessageId>,
    ) -> MessageStream {
        MessageStream::new(self.clone(), channel.clone(), message_id.into())
    }

    /// Sends a text delta of an assistant message (no ack; the final message completes it).
    /// Its `sequence` must be the message's next one (1 for the first) or an identical repeat
    /// of one already sent: anything else is refused here with the Connector's own verdict and
    /// not sent (0: [`ClientError::Invalid`] from the payload rules; a gap or a changed
    /// repeat: [`ClientError::Delta`]; after the final: [`ClientError::StreamClosed`]).
    /// [`DataPlane::stream_message`] numbers the deltas itself.
    pub async fn send_delta(
        &self,
        channel: &ConnectorChannelId,
        delta: ChatMessageDelta,
    ) -> Result<(), ClientError> {
        let recorded = {
            let now = self.shared().now();
            let mut im = self.shared().im.lock().await;
            judge_delta(&mut im, channel, &delta, now)?
        };
        self.write_delta(channel, delta, recorded).await
    }

    /// Numbers and records the next delta of a streamed message.
    pub(crate) async fn next_delta(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        text: String,
    ) -> Result<ChatMessageDelta, ClientError> {
        let now = self.shared().now();
        let mut im = self.shared().im.lock().await;
        let persisted = im.persisted(channel);
        let Some(sequence) = im.deltas.next_sequence(&persisted, message_id) else {
            return Err(ClientError::StreamClosed {
                channel: channel.clone(),
                message_id: message_id.clone(),
            });
        };
        let delta = ChatMessageDelta::new(message_id.clone(), sequence, text);
        judge_delta(&mut im, channel, &delta, now)?;
        Ok(delta)
    }

    /// Writes a judged delta. When the write fails (refused by the writer's rules, withheld,
    /// not connected) the Connector never saw it: a delta `recorded` as new is withdrawn, so
    /// its number is used again rather than leaving a gap.
    pub(crate) async fn write_delta(
        &self,
        channel: &ConnectorChannelId,
        delta: ChatMessageDelta,
        recorded: bool,
    ) -> Result<(), ClientError> {
        let (message_id, sequence) = (delta.message_id.clone(), delta.sequence);
        let written = self.send_push(channel, delta).await;
        if written.is_err() && recorded {
            let mut im = self.shared().im.lock().await;
            let persisted = im.persisted(channel);
            im.deltas.withdraw(&persisted, &message_id, sequence);
        }
        written
    }

    /// Uploads a file for an assistant message on `channel` (`POST /files/uploads` with that
    /// channel) and returns the file item to put in the message's `files`. The client
    /// remembers the `file_ref` for this channel until the Connector's `expires_at`, which
    /// [`DataPlane::send_chat_message`] checks.
    pub async fn upload_message_file(
        &self,
        channel: &ConnectorChannelId,
        file: FileContent,
    ) -> Result<ChatFile, ClientError> {
        let mime_type = file.mime_type.clone();
        let answer = self.upload_on(channel, file).await?;
        Ok(message_file(&answer, &mime_type))
    }

    /// The one upload path (message files and Tool upload references): uploads on `channel`
    /// and records the answer.
    pub(crate) async fn upload_on(
        &self,
        channel: &ConnectorChannelId,
        file: FileContent,
    ) -> Result<UploadResponse, ClientError> {
        let answer =
            self.control().upload(channel, &file.filename, &file.mime_type, file.bytes).await?;
        let now = self.shared().now();
        self.shared().im.lock().await.uploads.record(channel, &answer, now);
        Ok(answer)
    }

    /// Sends an activity snapshot (no ack, not persisted).
    pub async fn send_activity(
        &self,
        channel: &ConnectorChannelId,
        activity: ChatActivity,
    ) -> Result<(), ClientError> {
        self.send_push(channel, activity).await
    }

    async fn send_push<P: Payload>(
        &self,
        channel: &ConnectorChannelId,
        payload: P,
    ) -> Result<(), ClientError> {
        let packet = Packet::with_payload(ids::mint("pkt_"), payload).channel(channel.clone());
        self.send(&packet).await
    }

    /// Whether an assistant message is still pending.
    pub async fn is_pending(&self, channel: &ConnectorChannelId, message_id: &MessageId) -> bool {
        let im = self.shared().im.lock().await;
        let persisted = im.persisted(channel);
        im.outbox.is_pending(&persisted, message_id)
    }

    /// Outbox counters (attempts, expirations, evictions, last error).
    pub async fn outbox_stats(&self) -> OutboxStats {
        self.shared().im.lock().await.outbox.stats()
    }
}

impl DataPlane {
    /// Waits up to `within` for the Connector's final answer on an assistant message queued
    /// with [`DataPlane::send_chat_message`] (or `connector_message_send`): the ack that ended
    /// its delivery. A retryable rejection keeps waiting, since the outbox delivers the message
    /// again. `None` when the time passes first (the message may still be delivered later).
    pub async fn settled_ack(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
        within: Duration,
    ) -> Option<ChatMessageAck> {
        let persisted = self.shared().im.lock().await.persisted(channel);
        self.shared().settled.wait(&persisted, message_id, within).await
    }
}

impl DataPlane {
    /// The admitted Card this data plane judges by: the one it started with, or the latest
    /// one re-admitted since ([`DataPlane::set_card`], [`DataPlane::monitor_health`]). `None`
    /// for a data plane started without a Card.
    pub fn card(&self) -> Option<Arc<ConnectorCard>> {
        self.shared().admission.card()
    }

    /// Starts the health monitor for this data plane's Connector: `/health` every
    /// `interval`; a changed Card and Skill are refetched and re-admitted (the same
    /// `connector_card_id`, a protocol version within the configured admission window) and
    /// the Card handed to this data plane before [`HealthMonitor::refreshed`] changes, so a
    /// listener reads the new Card from [`DataPlane::card`]. A re-admitted Card document and
    /// Skill also replace the store's Card snapshot and Skill cache ([`crate::admit_durably`]
    /// serves them on a start with the Connector unreachable); a refused one changes nothing.
    /// Fails without an admitted Card.
    pub fn monitor_health(&self, interval: Duration) -> Result<HealthMonitor, ClientError> {
        let card = self.card().map(|card| (*card).clone()).ok_or_else(|| {
            ClientError::NotAdmissible(
                "the data plane has no admitted Card to monitor; start it with ClientConfig::for_card".into(),
            )
        })?;
        let expected = card.connector_card_id.to_string();
        let window = self.shared().admission.window();
        let plane = self.clone();
        let store = self.shared().store.clone();
        let readmit = move |json: &serde_json::Value, skill: &crate::SkillDocument| {
            let card = check_card(json, skill, &window, Some(expected.as_str()))?;
            // Admitted: the Card document and Skill replace the stored snapshot, in one write.
            let snapshot = AdmissionSnapshot {
                card: json.clone(),
                skill: skill.markdown().map(str::to_owned),
            };
            let ticket = store.commit(None, vec![XagentWrite::Admission(snapshot)]);
            let card_id = card.connector_card_id.clone();
            tokio::spawn(async move {
                if let Err(error) = ticket.await {
                    tracing::warn!(card = %card_id, %error, "the re-admitted Card and Skill were not stored; a restart while the Connector is unreachable serves the previous ones");
                }
            });
            plane.set_card(card.clone());
            Ok(card)
        };
        Ok(HealthMonitor::spawn(
            self.control(),
            Arc::new(tokio::sync::RwLock::new(card)),
            interval,
            readmit,
        ))
    }
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
