//! `tool.invoke`: lookup, availability, argument validation, the repeated-call registry, the
//! author's handler (contained, no lock held), the stored outcome, the ack.
//!
//! Per call the work that needs no waiting (the checks, the schema, the call key and
//! fingerprint) runs in one synchronous step, [`Conn::admit_tool`], so the spawned task that
//! runs the Tool keeps only what it needs across its awaits (a small future is cheap to spawn
//! and move). The arguments are moved out of the packet, never copied.

use serde_json::{Map, Value};
use xagent_profile_im::Fingerprint;
use xagent_protocol_types::{
    ConnectorChannelId, ErrorCode, Packet, PacketBody, ToolId, ToolInvoke, ToolInvokeAck, WireError,
};

use crate::author::call::call_tool;
use crate::author::tool::RegisteredTool;
use crate::author::{Binding, ToolContext};
use crate::connection::{Conn, error_ack};
use crate::ids;
use crate::tool_calls::{CallKey, Plan, ToolOutcome, call_key};

/// A call that passed every check, ready to run.
struct Admitted<'a> {
    tool: &'a RegisteredTool,
    channel: ConnectorChannelId,
    binding: Binding,
    /// The repeated-call key (`call:`, `req:` or `pkt:`).
    key: String,
    fingerprint: String,
    arguments: Map<String, Value>,
}

impl Conn {
    pub(crate) async fn on_tool_invoke(&self, mut packet: Box<Packet>) {
        let PacketBody::ToolInvoke(invoke) = &mut packet.body else { return };
        let arguments = std::mem::take(&mut invoke.arguments);
        let tool_id = invoke.tool_id.clone();
        let outcome = match self.admit_tool(&packet, &tool_id, arguments) {
            Ok(admitted) => self.run_tool(&packet, &tool_id, admitted).await,
            Err(refused) => Err(refused),
        };
        let ack = match outcome {
            Ok(result) => {
                Packet::with_payload(ids::packet_id(), ToolInvokeAck::new(tool_id, result))
                    .answering(&packet)
            }
            Err((code, message)) => error_ack(&packet, WireError::new(code, message)),
        };
        self.send(ack).await;
    }

    /// The checks of a call, in the order their errors take precedence: the Tool exists, the
    /// channel is this runtime's and signed in, the Tool is available on it, the arguments
    /// match the input schema. Then the repeated-call key and the fingerprint.
    fn admit_tool(
        &self,
        packet: &Packet,
        tool_id: &ToolId,
        arguments: Map<String, Value>,
    ) -> Result<Admitted<'_>, (ErrorCode, String)> {
        let shared = &*self.shared;
        let wire = |e: WireError| (e.code.clone(), e.message().to_owned());
        let Some(tool) = shared.def.tools.get(tool_id) else {
            let message =
                format!("tool {:?} is not declared in the Connector Card", tool_id.as_str());
            return Err((ErrorCode::ToolNotFound, message));
        };
        // One look at the channel under the state lock; only the binding is copied out.
        let (channel, binding) = self
            .with_record(packet, |record| {
                let Some(binding) = record.binding.clone() else {
                    return Err(WireError::connection_not_authenticated(
                        "sign in to the target system before calling tools",
                    ));
                };
                // A device Tool's availability follows its device: the device gate answers with
                // the precise code (`device_offline`, `permission_denied`) instead.
                let device_tool = shared.device.as_ref().is_some_and(|d| d.covers(tool_id));
                if !device_tool && !shared.is_tool_available(record, tool_id) {
                    return Err(WireError::connector_channel_unavailable(format!(
                        "tool {:?} is not available on this channel now",
                        tool_id.as_str()
                    )));
                }
                Ok((record.id.clone(), binding))
            })
            .map_err(wire)?;
        let arguments = Value::Object(arguments);
        if !tool.validator.is_valid(&arguments) {
            let problems: Vec<String> = tool
                .validator
                .iter_errors(&arguments)
                .take(5)
                .map(|e| {
                    let path = e.instance_path().to_string();
                    if path.is_empty() { e.to_string() } else { format!("{path}: {e}") }
                })
                .collect();
            let message =
                format!("the arguments do not match the input schema: {}", problems.join("; "));
            return Err((ErrorCode::InvalidArguments, message));
        }
        let invoke = packet.payload::<ToolInvoke>();
        let key = call_key(
            invoke.and_then(|i| i.tool_call_id()).map(|id| id.as_str()),
            packet.request_id.as_ref().map(|id| id.as_str()),
            packet.packet_id.as_str(),
        );
        let (fingerprint, arguments) = fingerprint(tool_id, arguments);
        Ok(Admitted { tool, channel, binding, key, fingerprint, arguments })
    }

    async fn run_tool(
        &self,
        packet: &Packet,
        tool_id: &ToolId,
        admitted: Admitted<'_>,
    ) -> ToolOutcome {
        let shared = &self.shared;
        let Admitted { tool, channel, binding, key, fingerprint, arguments } = admitted;
        let window = u64::try_from(shared.config.tool_call_window.as_millis()).unwrap_or(u64::MAX);
        let stored = || shared.storage.load_tool_call(&channel, &key).ok().flatten();
        let call = CallKey { channel: &channel, key: &key, fingerprint: &fingerprint };
        let plan = shared.tool_calls.begin(call, tool.records_calls, stored, window, shared.now());
        drop(fingerprint);
        match plan {
            Plan::Conflict => Err((
                ErrorCode::IdempotencyConflict,
                "this tool_call_id was already used with different arguments; use a new call id"
                    .to_owned(),
            )),
            Plan::Replay(outcome) => {
                tracing::debug!(%channel, %tool_id, "repeated tool call answered from the stored result");
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
                    tool_id: tool_id.clone(),
                    request_id: packet.request_id.clone(),
                    tool_call_id: packet
                        .payload::<ToolInvoke>()
                        .and_then(|i| i.tool_call_id())
                        .cloned(),
                    binding,
                    handle: shared.handle(),
                };
                tracing::info!(%channel, %tool_id, "tool invoked");
                let device = shared.device.as_ref().filter(|d| d.covers(tool_id));
                let (outcome, reached) = match device {
                    // Device Profile rules around the author's code (device.rs); boxed, so the
                    // common path's future does not carry the gate's state.
                    Some(device) => {
                        let now = shared.now();
                        let channel = &channel;
                        let gated = async move {
                            let call = call_tool(tool, ctx, arguments.clone());
                            device.run(channel, tool_id, &arguments, now, call).await
                        };
                        Box::pin(gated).await
                    }
                    None => (
                        call_tool(tool, ctx, arguments)
                            .await
                            .map_err(|error| (error.code, error.message)),
                        true,
                    ),
                };
                // A device call refused before it reached the device is not the call's
                // outcome: a retry once the device is back may run.
                if tool.records_calls && reached {
                    // The ack goes out only once the record is committed (group commit:
                    // shared with other calls' records), so a repeat after a crash is
                    // answered from it.
                    let commit = {
                        let stored = running.record(&outcome, shared.now());
                        shared.storage.commit_tool_call(&channel, &key, &stored)
                    };
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

/// The fingerprint of a call (the Tool id and the arguments, canonical JSON hashed, as
/// stored with its record), computed without copying the arguments: they move into the
/// hashed object and back out.
fn fingerprint(tool_id: &ToolId, arguments: Value) -> (String, Map<String, Value>) {
    let mut call = Map::new();
    call.insert("tool_id".to_owned(), Value::String(tool_id.as_str().to_owned()));
    call.insert("arguments".to_owned(), arguments);
    let call = Value::Object(call);
    let fingerprint = Fingerprint::of_value(&call).as_str().to_owned();
    let arguments = match call {
        Value::Object(mut call) => match call.remove("arguments") {
            Some(Value::Object(arguments)) => arguments,
            _ => Map::new(),
        },
        _ => Map::new(),
    };
    (fingerprint, arguments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_is_the_one_stored_records_were_made_with() {
        // Records stored by earlier versions hashed `{"tool_id", "arguments"}` built with
        // `json!`: a repeat after an upgrade must still match them.
        let mut arguments = Map::new();
        arguments.insert("text".into(), Value::from("hi"));
        arguments.insert("n".into(), Value::from(3));
        let tool_id = ToolId::from("echo_send");
        let before = Fingerprint::of_value(
            &serde_json::json!({ "tool_id": tool_id, "arguments": Value::Object(arguments.clone()) }),
        );
        let (after, back) = fingerprint(&tool_id, Value::Object(arguments.clone()));
        assert_eq!(after, before.as_str());
        assert_eq!(back, arguments, "the arguments come back unchanged");
    }

    fn size_of_task<F>(_task: impl Fn(&'static Conn, Box<Packet>) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn the_future_of_a_tool_call_task_stays_small() {
        // Every `tool.invoke` spawns this future; tokio moves it several times on spawn and
        // completion, so its size is paid per call (it was 5,176 bytes when it carried the
        // packet, a Descriptor and the channel record by value).
        let size = size_of_task(|conn, packet| conn.on_tool_invoke(packet));
        assert!(size <= 2048, "the tool.invoke task future grew to {size} bytes");
    }
}
