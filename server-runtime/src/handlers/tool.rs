//! `tool.invoke`: lookup, availability, argument validation, the repeated-call registry, the
//! author's handler (contained, no lock held), the stored outcome, the ack.
//!
//! Per call the work that needs no waiting (the checks, the schema, the call key and
//! fingerprint, the registry's decision, starting the Tool) runs synchronously
//! ([`Conn::admit_tool`], [`Conn::start_tool`]), so the spawned task keeps only what it needs
//! across its awaits: a small future is cheap to spawn and move, and stays under the
//! allocator's large-chunk size. The arguments are moved out of the packet, never copied.

use serde_json::{Map, Value};
use xagent_profile_im::Fingerprint;
use xagent_protocol_types::{
    ConnectorChannelId, ErrorCode, Packet, PacketBody, ToolId, ToolInvoke, ToolInvokeAck, WireError,
};

use tokio::sync::watch;

use crate::author::call::{BoxFut, call_tool};
use crate::author::tool::RegisteredTool;
use crate::author::{Binding, ToolContext};
use crate::connection::Conn;
use crate::ids;
use crate::storage::WriteOp;
use crate::storage::author::Staged;
use crate::tool_calls::{CallKey, Plan, Running, ToolOutcome, call_key};
use xagent_connection::error_ack;

/// A call that passed every check, ready to run.
struct Admitted<'a> {
    tool: &'a RegisteredTool,
    channel: ConnectorChannelId,
    binding: Binding,
    /// The repeated-call key (`call:`, `req:` or `pkt:`).
    key: String,
    fingerprint: String,
    arguments: Map<String, Value>,
    /// A device Tool: it runs behind the device gate.
    device_tool: bool,
}

impl Conn {
    pub(crate) async fn on_tool_invoke(&self, mut packet: Box<Packet>) {
        let PacketBody::ToolInvoke(invoke) = &mut packet.body else { return };
        let arguments = std::mem::take(&mut invoke.arguments);
        let tool_id = invoke.tool_id.clone();
        let begun = std::time::Instant::now();
        let started = match self.admit_tool(&packet, &tool_id, arguments) {
            Ok(admitted) => self.start_tool(&packet, &tool_id, admitted),
            Err(refused) => Started::Answer(Err(refused)),
        };
        let outcome = match started {
            Started::Answer(outcome) => outcome,
            Started::Wait(rx) => wait_for_first(rx).await,
            Started::Run(run) => self.finish_tool(run).await,
        };
        // The Tool label is one of the Card's ids, so a caller cannot mint series.
        let tool_label = if self.shared.def.card.tools.iter().any(|t| t.tool_id == tool_id) {
            tool_id.as_str()
        } else {
            "unknown"
        };
        let counted = outcome.as_ref().map(|_| ()).map_err(|error| &error.code);
        crate::metrics::metrics().tool_call(tool_label, counted, begun.elapsed());
        let ack = match outcome {
            Ok(result) => {
                Packet::with_payload(ids::packet_id(), ToolInvokeAck::new(tool_id, result))
                    .answering(&packet)
            }
            Err(error) => error_ack(&packet, error),
        };
        self.send(ack).await;
    }

    /// The checks of a call, in the order their errors take precedence: the Tool exists, the
    /// channel is this runtime's and signed in, the Tool is available on it, the arguments
    /// (without the model's redundant `connector_channel_id`) match the argument schema. Then
    /// the repeated-call key and the fingerprint (of the admitted arguments).
    fn admit_tool(
        &self,
        packet: &Packet,
        tool_id: &ToolId,
        arguments: Map<String, Value>,
    ) -> Result<Admitted<'_>, WireError> {
        let shared = &*self.shared;
        let Some(tool) = shared.def.tools.get(tool_id) else {
            let message =
                format!("tool {:?} is not declared in the Connector Card", tool_id.as_str());
            return Err(WireError::new(ErrorCode::ToolNotFound, message));
        };
        // Asked once per call (the device Tool set is fixed; no lock).
        let device_tool = shared.device.as_ref().is_some_and(|d| d.covers(tool_id));
        // One look at the channel under the state lock; only the binding is copied out.
        let (channel, binding) = self.with_record(packet, |record| {
            let Some(binding) = record.binding.clone() else {
                return Err(WireError::connection_not_authenticated(
                    "sign in to the target system before calling tools",
                ));
            };
            // A device Tool's availability follows its device: the device gate answers with
            // the precise code (`device_offline`, `permission_denied`) instead.
            // Not even a device Tool is offered on a channel of another target type.
            let offered = !device_tool || shared.tool_fits_channel(record, tool_id);
            if !offered || (!device_tool && !shared.is_tool_available(record, tool_id)) {
                return Err(WireError::connector_channel_unavailable(format!(
                    "tool {:?} is not available on this channel now",
                    tool_id.as_str()
                )));
            }
            Ok((record.id.clone(), binding))
        })?;
        let arguments = tool.admit_arguments(arguments)?;
        let invoke = packet.payload::<ToolInvoke>();
        let key = call_key(
            invoke.and_then(|i| i.tool_call_id()).map(|id| id.as_str()),
            packet.request_id.as_ref().map(|id| id.as_str()),
            packet.packet_id.as_str(),
        );
        let (fingerprint, arguments) =
            fingerprint(tool_id, Value::Object(arguments), tool.records_calls);
        Ok(Admitted { tool, channel, binding, key, fingerprint, arguments, device_tool })
    }

    /// Decides the call (registry, stored record) and, when it runs, starts the Tool: all
    /// without waiting, so what the task awaits afterwards is small.
    fn start_tool<'a>(
        &'a self,
        packet: &Packet,
        tool_id: &ToolId,
        admitted: Admitted<'a>,
    ) -> Started<'a> {
        let shared = &*self.shared;
        let Admitted { tool, channel, binding, key, fingerprint, arguments, device_tool } =
            admitted;
        let call = CallKey { channel: &channel, key: &key, fingerprint: &fingerprint };
        let running = match shared.tool_calls.begin(call) {
            Plan::Conflict => return Started::Answer(Err(crate::tool_calls::conflict())),
            Plan::Wait(rx) => return Started::Wait(rx),
            Plan::Run(running) => running,
        };
        let ctx = ToolContext {
            channel: channel.clone(),
            tool_id: tool_id.clone(),
            request_id: packet.request_id.clone(),
            tool_call_id: packet.payload::<ToolInvoke>().and_then(|i| i.tool_call_id()).cloned(),
            binding,
            handle: self.shared.handle(),
            staged: Staged::default(),
            state: (),
        };
        let staged = ctx.staged.clone();
        // One line a call only at debug: the metrics count calls by Tool and outcome, and a
        // line a call at info cost a busy Connector about 12 % of its Tool throughput.
        tracing::debug!(%channel, %tool_id, "tool invoked");
        let call: BoxFut<'a, (ToolOutcome, bool)> =
            match shared.device.as_ref().filter(|_| device_tool) {
                // Device Profile rules around the author's code (device.rs).
                Some(device) => {
                    let now = shared.now();
                    // Its place in the channel's order is taken now, as it arrives.
                    let turn = device.turn(&channel);
                    let (channel, tool_id) = (channel.clone(), tool_id.clone());
                    Box::pin(async move {
                        let call = call_tool(tool, ctx, arguments.clone());
                        device.run(&channel, &tool_id, &arguments, now, turn, call).await
                    })
                }
                // Any other Tool; on a device Connector its result still passes the media check.
                None => {
                    let call = call_tool(tool, ctx, arguments);
                    // Copied only on a device Connector (for the refusal's log line).
                    let media_checked =
                        shared.device.is_some().then(|| (channel.clone(), tool_id.clone()));
                    Box::pin(async move {
                        let outcome = call.await;
                        let outcome = match (outcome, media_checked) {
                            (Ok(value), Some((channel, tool_id))) => {
                                crate::device::checked_result(&channel, &tool_id, value)
                            }
                            (outcome, _) => outcome,
                        };
                        (outcome, true)
                    })
                }
            };
        let record = tool.records_calls.then_some((channel, key));
        Started::Run(Run { running, call, record, staged })
    }

    /// Runs a started call to its outcome: the Tool, then (for a side-effecting Tool that
    /// reached its target) the committed record, then the waiting repeats.
    async fn finish_tool(&self, run: Run<'_>) -> ToolOutcome {
        let Run { running, call, record, staged } = run;
        // A side-effecting Tool first asks the stored record of its key (the key is claimed,
        // so an identical call waits meanwhile): a repeat of a completed call is answered
        // from it, a reuse with other arguments refused.
        if let Some((channel, key)) = &record {
            let shared = &*self.shared;
            let stored = match shared.storage.load_tool_call(channel, key).await {
                Ok(stored) => stored,
                Err(error) => {
                    tracing::error!(%error, "could not read a stored tool call");
                    let outcome = Err(WireError::new(
                        ErrorCode::InternalError,
                        "could not check this tool_call_id; call again",
                    ));
                    running.finish(&outcome);
                    return outcome;
                }
            };
            let window =
                u64::try_from(shared.config.tool_call_window.as_millis()).unwrap_or(u64::MAX);
            if let Some(answer) = running.judge_stored(stored, window, shared.now()) {
                tracing::debug!(%channel, "repeated tool call answered from the stored record");
                running.finish(&answer);
                return answer;
            }
        }
        let (mut outcome, reached) = call.await;
        // The author's staged writes ride the same transaction as the record; a Tool that
        // records no calls commits them alone. Either way the answer waits for the commit. A
        // call that failed keeps none of them.
        let (mut writes, mut after) = staged.take();
        if outcome.is_err() {
            writes.clear();
            after.clear();
        }
        let staged_any = !writes.is_empty();
        // A device call refused before it reached the device is not the call's outcome: a
        // retry once the device is back may run.
        if let Some((channel, key)) = record.as_ref().filter(|_| reached) {
            let stored = running.record(&outcome, self.shared.now());
            match WriteOp::tool_call(channel, key, &stored) {
                Ok(op) => writes.push(op),
                Err(error) => tracing::error!(%error, "could not encode a tool result"),
            }
        }
        if !writes.is_empty() {
            // The ack goes out only once the record is committed (group commit: shared with
            // other calls' records), so a repeat after a crash is answered from it.
            match self.shared.storage.commit(writes).committed().await {
                Ok(()) => after.into_iter().for_each(|run| run()),
                Err(error) if staged_any => {
                    // Nothing staged happened: the call must not be answered as done.
                    tracing::error!(%error, "could not store a tool call's writes");
                    outcome = Err(WireError::new(
                        ErrorCode::InternalError,
                        "could not store this call's result; call again",
                    ));
                }
                Err(error) => tracing::error!(%error, "could not store a tool result"),
            }
        }
        running.finish(&outcome);
        outcome
    }
}

/// What [`Conn::start_tool`] decided.
enum Started<'a> {
    /// Answered without running (a conflict or a stored outcome).
    Answer(ToolOutcome),
    /// The identical call is running: its outcome is the answer.
    Wait(watch::Receiver<Option<ToolOutcome>>),
    /// Running.
    Run(Run<'a>),
}

/// A running call.
struct Run<'a> {
    running: Running<'a>,
    /// The Tool (behind the device gate for a device Tool); the flag says whether the call
    /// reached the target.
    call: BoxFut<'a, (ToolOutcome, bool)>,
    /// Channel and key of the record to commit (side-effecting Tools only).
    record: Option<(ConnectorChannelId, String)>,
    /// The author's writes staged on the call.
    staged: Staged,
}

/// The outcome of the identical call this one waited for.
async fn wait_for_first(mut rx: watch::Receiver<Option<ToolOutcome>>) -> ToolOutcome {
    match rx.wait_for(Option::is_some).await.map(|v| v.clone()) {
        Ok(Some(outcome)) => outcome,
        _ => Err(crate::tool_calls::unfinished()),
    }
}

/// The fingerprint of a call (the Tool id and the arguments as canonical JSON), computed
/// without copying the arguments: they move into the fingerprinted object and back out.
///
/// `durable` (a side-effecting Tool): the SHA-256 hex of that text, as stored with its record
/// and compared with records of earlier runs and versions. A read-only Tool's fingerprint is
/// only ever compared with the identical call still in flight, in memory, so the canonical
/// text itself serves (exact, and no hash or hex per call on the read path).
fn fingerprint(tool_id: &ToolId, arguments: Value, durable: bool) -> (String, Map<String, Value>) {
    let mut call = Map::new();
    call.insert("tool_id".to_owned(), Value::String(tool_id.as_str().to_owned()));
    call.insert("arguments".to_owned(), arguments);
    let call = Value::Object(call);
    let fingerprint = if durable {
        Fingerprint::of_value(&call).as_str().to_owned()
    } else {
        xagent_profile_im::canonical_json(&call)
    };
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
        let (after, back) = fingerprint(&tool_id, Value::Object(arguments.clone()), true);
        assert_eq!(after, before.as_str());
        assert_eq!(back, arguments, "the arguments come back unchanged");
    }

    #[test]
    fn a_read_only_fingerprint_is_exact_and_ignores_key_order() {
        let tool_id = ToolId::from("echo_noop");
        let mut one = Map::new();
        one.insert("a".into(), Value::from(1));
        one.insert("b".into(), Value::from("x"));
        let mut reordered = Map::new();
        reordered.insert("b".into(), Value::from("x"));
        reordered.insert("a".into(), Value::from(1));
        let (first, back) = fingerprint(&tool_id, Value::Object(one.clone()), false);
        let (second, _) = fingerprint(&tool_id, Value::Object(reordered), false);
        assert_eq!(first, second, "the same call whatever the key order");
        assert_eq!(back, one, "the arguments come back unchanged");
        let (other, _) = fingerprint(&tool_id, serde_json::json!({ "a": 2, "b": "x" }), false);
        assert_ne!(first, other, "other arguments are another call");
    }

    fn size_of_task<F>(_task: impl Fn(&'static Conn, Box<Packet>) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn the_future_of_a_tool_call_task_stays_small() {
        // Every `tool.invoke` spawns this future; tokio copies it on spawn and on completion,
        // so its size is paid per call, and a task over 1 KiB is a large chunk for glibc's
        // malloc, which then consolidates its free lists on every spawn. It was 5,176 bytes
        // when it carried the packet, a Descriptor and the channel record by value; 768 now.
        let size = size_of_task(|conn, packet| conn.on_tool_invoke(packet));
        assert!(size <= 1024, "the tool.invoke task future grew to {size} bytes");
    }
}
