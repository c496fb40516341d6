//! `tool.invoke`: lookup, availability, argument validation, the repeated-call registry, the
//! author's handler (contained, no lock held), the stored outcome, the ack.

use serde_json::{Value, json};
use xagent_profile_im::Fingerprint;
use xagent_protocol_types::{ErrorCode, Packet, ToolInvoke, ToolInvokeAck, WireError};

use crate::author::ToolContext;
use crate::author::call::call_tool;
use crate::connection::Conn;
use crate::tool_calls::{CallKey, Plan, ToolOutcome, call_key};

impl Conn {
    pub(crate) async fn on_tool_invoke(&self, packet: Packet) {
        let Some(invoke) = packet.payload::<ToolInvoke>() else { return };
        match self.run_tool(&packet, invoke).await {
            Ok(result) => {
                self.reply(&packet, ToolInvokeAck::new(invoke.tool_id.clone(), result)).await
            }
            Err((code, message)) => self.reply_error(&packet, WireError::new(code, message)).await,
        }
    }

    async fn run_tool(&self, packet: &Packet, invoke: &ToolInvoke) -> ToolOutcome {
        let shared = &self.shared;
        let wire = |e: WireError| (e.code.clone(), e.message().to_owned());
        let Some(tool) = shared.def.tools.get(&invoke.tool_id) else {
            let message =
                format!("tool {:?} is not declared in the Connector Card", invoke.tool_id.as_str());
            return Err((ErrorCode::ToolNotFound, message));
        };
        let record = self.record(packet).map_err(wire)?;
        let Some(binding) = record.binding.clone() else {
            return Err(wire(WireError::connection_not_authenticated(
                "sign in to the target system before calling tools",
            )));
        };
        let descriptor = shared.descriptor_for(&record, &self.profiles());
        // A device Tool's availability follows its device: the device gate answers with the
        // precise code (`device_offline`, `permission_denied`) instead.
        let device_tool = shared.device.as_ref().is_some_and(|d| d.covers(&invoke.tool_id));
        if !device_tool && !descriptor.is_tool_available(invoke.tool_id.as_str()) {
            return Err(wire(WireError::connector_channel_unavailable(format!(
                "tool {:?} is not available on this channel now",
                invoke.tool_id.as_str()
            ))));
        }
        let arguments = Value::Object(invoke.arguments.clone());
        let problems: Vec<String> = tool
            .validator
            .iter_errors(&arguments)
            .take(5)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() { e.to_string() } else { format!("{path}: {e}") }
            })
            .collect();
        if !problems.is_empty() {
            let message =
                format!("the arguments do not match the input schema: {}", problems.join("; "));
            return Err((ErrorCode::InvalidArguments, message));
        }
        let key = call_key(
            invoke.tool_call_id().map(|id| id.as_str()),
            packet.request_id.as_ref().map(|id| id.as_str()),
            packet.packet_id.as_str(),
        );
        let fingerprint =
            Fingerprint::of_value(&json!({ "tool_id": invoke.tool_id, "arguments": arguments }))
                .as_str()
                .to_owned();
        let channel = record.id.clone();
        let window = u64::try_from(shared.config.tool_call_window.as_millis()).unwrap_or(u64::MAX);
        let stored = || shared.storage.load_tool_call(&channel, &key).ok().flatten();
        let call = CallKey { channel: &channel, key: &key, fingerprint: &fingerprint };
        let plan = shared.tool_calls.begin(call, tool.records_calls, stored, window, shared.now());
        match plan {
            Plan::Conflict => Err((
                ErrorCode::IdempotencyConflict,
                "this tool_call_id was already used with different arguments; use a new call id"
                    .to_owned(),
            )),
            Plan::Replay(outcome) => {
                tracing::debug!(%channel, tool_id = %invoke.tool_id, "repeated tool call answered from the stored result");
                outcome
            }
            Plan::Wait(mut rx) => match rx.wait_for(Option::is_some).await.map(|v| v.clone()) {
                Ok(Some(outcome)) => outcome,
                _ => Err((
                    ErrorCode::InternalError,
                    "the first call of this tool_call_id did not finish; call again".into(),
                )),
            },
            Plan::Run(running) => {
                let ctx = ToolContext {
                    channel: channel.clone(),
                    tool_id: invoke.tool_id.clone(),
                    request_id: packet.request_id.clone(),
                    tool_call_id: invoke.tool_call_id().cloned(),
                    binding,
                    handle: shared.handle(),
                };
                tracing::info!(%channel, tool_id = %invoke.tool_id, "tool invoked");
                let device = shared.device.as_ref().filter(|d| d.covers(&invoke.tool_id));
                let (outcome, reached) = match device {
                    // Device Profile rules around the author's code (device.rs).
                    Some(device) => {
                        let call = call_tool(tool, ctx, invoke.arguments.clone());
                        let now = shared.now();
                        device.run(&channel, &invoke.tool_id, &invoke.arguments, now, call).await
                    }
                    None => (
                        call_tool(tool, ctx, invoke.arguments.clone())
                            .await
                            .map_err(|error| (error.code, error.message)),
                        true,
                    ),
                };
                // A device call refused before it reached the device is not the call's
                // outcome: a retry once the device is back may run.
                if tool.records_calls && reached {
                    let stored = running.record(&outcome, shared.now());
                    // The ack goes out only once the record is committed (group commit:
                    // shared with other calls' records), so a repeat after a crash is
                    // answered from it.
                    let commit = shared.storage.commit_tool_call(&channel, &key, &stored);
                    if let Err(error) = commit.committed().await {
                        tracing::error!(%error, "could not store a tool result");
                    }
                }
                running.finish(&outcome);
                outcome
            }
        }
    }
}
