//! `xagent-connector mock-xagent`: stays connected to a Connector as xAgent would and prints
//! every packet, so a Connector author can watch their server live. It admits the Connector,
//! completes hello, opens a channel (optionally signing in with a flow), accepts inbound chat
//! messages (after the xAgent-side inbound rules of `xagent-client-runtime`), runs the Card
//! Tools given with `--tool ID --args JSON` through section 10.1 resolution, and reconnects by
//! itself until Ctrl-C. Inbound files are downloaded as xAgent would (under the runtime's
//! download policy: the Connector's own origin and any `--allow-download-origin`), counted and
//! dropped. The printed packets hold no secret: form values and the query strings of signed
//! URLs (`download_url`, `url`) are redacted.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Map, Value};

use xagent_client_runtime::BaseUrl;
use xagent_client_runtime::prelude::*;
use xagent_protocol_types::{ChatFile, PROFILE_DEVICE_V1, PROFILE_IM_V1, PROFILE_IM_V2};
use xagent_storage_postgres::PoolOptions;

/// Options of `mock-xagent`.
#[derive(Debug, Args)]
pub struct MockXagentArgs {
    /// The Connector's Base URL.
    #[arg(long)]
    base_url: String,
    /// The system API key (also read from XAGENT_CONNECTOR_API_KEY).
    #[arg(long, env = "XAGENT_CONNECTOR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Profiles to announce in hello (default: every Profile the mock prints: IM v2, IM v1
    /// and device v1; hello keeps the ones the Card supports).
    #[arg(long = "profile")]
    profiles: Vec<String>,
    /// An authentication flow to run on the channel.
    #[arg(long)]
    flow: Option<String>,
    /// A form input of the flow, as name=value (repeatable).
    #[arg(long = "input", value_name = "NAME=VALUE", requires = "flow")]
    inputs: Vec<String>,
    /// Do not open a channel; only complete hello and listen.
    #[arg(long)]
    no_channel: bool,
    /// A Card Tool to invoke once the channel is signed in (repeatable; pairs with --args).
    #[arg(long = "tool", value_name = "TOOL_ID", requires = "flow")]
    tools: Vec<String>,
    /// The JSON arguments of the matching --tool (default `{}`).
    #[arg(long = "args", value_name = "JSON")]
    tool_args: Vec<String>,
    /// An origin (https://host[:port]) other than the Connector's own that inbound files may
    /// be downloaded from (repeatable); it must resolve to public addresses.
    #[arg(long = "allow-download-origin", value_name = "ORIGIN")]
    download_origins: Vec<String>,
    /// With a database: the mock's state (channels, outbox, idempotency) lives there, several
    /// mocks of one Card may share it, and only the holder of the Card's holder lease
    /// connects; the others stand by and take over, with the channels, when it stops.
    #[command(flatten)]
    database: crate::database_args::DatabaseArgs,
    /// Print one JSON line per fact a test harness counts (`{"report":"online"|"message"|
    /// "tool_start"|"tool"|"queued",...}`, times in Unix ms) instead of every packet.
    #[arg(long)]
    report_json: bool,
    /// Certificate authorities for an https Base URL.
    #[command(flatten)]
    tls: crate::tls_args::TlsArgs,
    /// Repeat the --tool calls every this many milliseconds while this mock holds the data
    /// plane, also after a takeover. `{call}` in a string argument becomes the call's own id
    /// (unique per process and call), which is also its `tool_call_id`.
    #[arg(long, value_name = "MS", requires = "tools")]
    repeat_every: Option<u64>,
    /// With --repeat-every: each round also queues one assistant chat message (message id
    /// and text name the round) on the channel.
    #[arg(long, requires = "repeat_every")]
    say: bool,
}

/// The xAgent user the mock acts for.
const MOCK_USER: &str = "mock-user";

/// Runs the mock until Ctrl-C.
pub fn run_command(args: MockXagentArgs) -> ExitCode {
    if let Err(error) = BaseUrl::parse(&args.base_url) {
        return crate::usage("mock-xagent", error);
    }
    let inputs = match crate::parse_inputs(&args.inputs) {
        Ok(inputs) => inputs,
        Err(message) => return crate::usage("mock-xagent", message),
    };
    if let Err(message) = crate::tool_calls(&args.tools, &args.tool_args) {
        return crate::usage("mock-xagent", message);
    }
    let download = match crate::download_policy(&args.download_origins) {
        Ok(policy) => policy,
        Err(error) => return crate::usage("mock-xagent", error),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            return crate::usage("mock-xagent", format!("cannot start the async runtime: {error}"));
        }
    };
    runtime.block_on(async move {
        tokio::select! {
            code = session(args, inputs, download) => code,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("interrupted");
                ExitCode::SUCCESS
            }
        }
    })
}

fn paint(color: bool, code: &str, text: &str) -> String {
    if color { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
}

/// Admits the Connector and starts the data plane (on the database when one is given), the
/// tap printing every packet; the exit code once a failure is printed.
async fn start(
    args: &MockXagentArgs,
    download: DownloadPolicy,
    color: bool,
) -> Result<(DataPlane, Events), ExitCode> {
    let tls = args.tls.trust().map_err(|message| {
        eprintln!("xagent-connector mock-xagent: {message}");
        ExitCode::from(crate::EXIT_USAGE)
    })?;
    let api_key = args.api_key.clone().filter(|k| !k.is_empty()).map(Secret::new);
    let profiles = if args.profiles.is_empty() {
        vec![PROFILE_IM_V2.to_owned(), PROFILE_IM_V1.to_owned(), PROFILE_DEVICE_V1.to_owned()]
    } else {
        args.profiles.clone()
    };
    let report = args.report_json;
    let tap = PacketTap::new(move |direction, text| {
        if report {
            return;
        }
        let arrow = match direction {
            TapDirection::Sent => paint(color, "36", "xagent -> connector"),
            TapDirection::Received => paint(color, "35", "connector -> xagent"),
        };
        println!("{arrow} {}", redact(text));
    });
    let mut xagent = Xagent::connect(args.base_url.clone(), api_key)
        .profiles(profiles)
        .tls(tls)
        .download(download)
        .tap(tap);
    if let Some(url) = &args.database.database_url {
        let options = PoolOptions::default().with_application_name("xagent-mock-xagent");
        match xagent_storage_postgres::connect(url, options).await {
            Ok(pool) => {
                println!("{} state in {url}", paint(color, "1", "database"));
                xagent = xagent.store(Store::Postgres(pool)).holder_lease(HolderLease::random());
            }
            Err(error) => {
                eprintln!("the database could not be opened: {error}");
                return Err(ExitCode::FAILURE);
            }
        }
    }
    let Running { plane, events, admission, .. } = match xagent.start().await {
        Ok(running) => running,
        Err(error) => {
            eprintln!("not admitted or not started: {error}");
            return Err(ExitCode::FAILURE);
        }
    };
    plane.set_file_sink(std::sync::Arc::new(CountFiles { color }));
    let card = admission.card();
    println!(
        "{} {} {} (protocol {}), {} tool(s), profiles {:?}",
        paint(color, "1", "admitted"),
        card.connector_card_id,
        card.connector.version,
        card.protocol_version,
        card.tools.len(),
        card.supports.profiles.iter().map(|p| p.as_str()).collect::<Vec<_>>()
    );
    Ok((plane, events))
}

/// Waits for hello, saying so while another mock holds the data plane; false when the data
/// plane stopped first.
async fn wait_for_hello(plane: &DataPlane, color: bool) -> bool {
    let mut states = plane.watch_state();
    let waiting = tokio::spawn(async move {
        let mut last = None;
        loop {
            let holder = match &*states.borrow_and_update() {
                ConnectionState::Standby { holder } => Some(holder.clone()),
                _ => None,
            };
            if let Some(holder) = holder
                && last.as_ref() != Some(&holder)
            {
                let name = holder.clone().unwrap_or_else(|| "another process".into());
                println!("{} {name} holds the data plane; waiting", paint(color, "33", "standby"));
                last = Some(holder);
            }
            if states.changed().await.is_err() {
                break;
            }
        }
    });
    let connected = plane.connected().await;
    waiting.abort();
    if connected.is_err() {
        eprintln!("the data plane stopped before hello completed");
    }
    connected.is_ok()
}

async fn session(args: MockXagentArgs, inputs: AuthInput, download: DownloadPolicy) -> ExitCode {
    let color = std::io::stdout().is_terminal();
    let (plane, mut events) = match start(&args, download, color).await {
        Ok(started) => started,
        Err(code) => return code,
    };
    if !wait_for_hello(&plane, color).await {
        return ExitCode::FAILURE;
    }
    // A mock that took over from another one finds its channels in the database, reopened.
    let taken_over = !plane.channels().await.is_empty();
    if taken_over {
        println!("{} the remembered channels are reopened", paint(color, "1", "resumed"));
    }
    let report = args.report_json;
    if report {
        print_report(serde_json::json!({"report": "online", "taken_over": taken_over}));
    }
    let calls = crate::tool_calls(&args.tools, &args.tool_args).unwrap_or_default();
    if !args.no_channel && !taken_over {
        match plane.open_channel_for(MOCK_USER, None).await {
            Ok(opened) => {
                let channel = opened.connector_channel_id.clone();
                if let Some(flow) = &args.flow {
                    match plane.sign_in(&channel, flow, inputs.clone()).await {
                        Ok(signed) => {
                            println!("{} {}", paint(color, "1", "auth"), signed.progress().status);
                        }
                        Err(error) => eprintln!("auth.start failed: {error}"),
                    }
                }
                plane.remember_channel(channel).await;
                for (tool, arguments) in calls.iter().filter(|_| !report).cloned() {
                    let options = as_a_model_would(None);
                    match plane.invoke_tool_with(MOCK_USER, None, &tool, arguments, options).await {
                        Ok(outcome) => println!(
                            "{} {tool} on {}: {}",
                            paint(color, "1", "tool"),
                            outcome.channel,
                            outcome.ack.result.map(|r| r.to_string()).unwrap_or_default()
                        ),
                        Err(error) => eprintln!("{tool} failed ({}): {error}", error.code()),
                    }
                }
            }
            Err(error) => eprintln!("channel.open failed: {error}"),
        }
    }
    let repeating = args.repeat_every.map(|every| {
        let plane = plane.clone();
        let every = std::time::Duration::from_millis(every.max(1));
        tokio::spawn(repeat(plane, calls, every, args.say))
    });
    let _stop_repeating = AbortOnDrop(repeating);
    while let Some(event) = events.recv().await {
        match event {
            ClientEvent::ChatMessage(inbound) => {
                if report {
                    // Printed before the accept: a kill between the two shows as a message
                    // the application saw twice, never as one it missed.
                    let message = &inbound.message;
                    print_report(serde_json::json!({
                        "report": "message",
                        "channel": inbound.channel.as_str(),
                        "message_id": message.message_id.as_str(),
                        "text": message.text,
                        "created_at": message.created_at,
                    }));
                }
                inbound.accept()
            }
            ClientEvent::Stopped { reason } => {
                eprintln!("stopped: {reason}");
                return ExitCode::FAILURE;
            }
            ClientEvent::Disconnected { reason } => {
                println!("{} {reason}", paint(color, "33", "disconnected"));
            }
            ClientEvent::State(state) => {
                println!("{} {}", paint(color, "33", "state"), state.as_str());
            }
            _ => {}
        }
    }
    ExitCode::SUCCESS
}

/// Prints one `--report-json` line, with the time it was printed.
fn print_report(mut line: Value) {
    line["at"] = Value::from(unix_millis());
    println!("{line}");
}

fn unix_millis() -> u64 {
    use xagent_protocol_types::Clock as _;
    xagent_protocol_types::SystemClock.now_millis()
}

/// Aborts the `--repeat-every` task when the session ends.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// `--repeat-every`: runs `calls` each round (and with `say` queues one chat message), one
/// report line per call before it starts and one with its outcome.
async fn repeat(
    plane: DataPlane,
    calls: Vec<(String, Map<String, Value>)>,
    every: std::time::Duration,
    say: bool,
) {
    let prefix = format!("c{}x{:x}", std::process::id(), unix_millis());
    let mut round = 0u64;
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        round += 1;
        for (index, (tool, arguments)) in calls.iter().enumerate() {
            let call = format!("{prefix}r{round}t{index}");
            let arguments = with_call_id(arguments, &call);
            print_report(serde_json::json!({"report": "tool_start", "tool": tool, "call": call}));
            let options = as_a_model_would(Some(call.clone()));
            let outcome = plane.invoke_tool_with(MOCK_USER, None, tool, arguments, options).await;
            let (ok, error) = match &outcome {
                Ok(_) => (true, None),
                Err(error) => (false, Some(format!("{error} ({})", error.code()))),
            };
            print_report(serde_json::json!({
                "report": "tool", "tool": tool, "call": call, "ok": ok, "error": error,
            }));
        }
        if say {
            let Some((_, channel)) = plane.channels().await.into_iter().next() else { continue };
            let id = format!("{prefix}r{round}say");
            let message =
                xagent_protocol_types::ChatMessage::text(id.as_str(), format!("say {id}"))
                    .created_at(unix_millis());
            if plane.send_chat_message(&channel, message).await.is_ok() {
                print_report(serde_json::json!({"report": "queued", "message_id": id}));
            }
        }
    }
}

/// `arguments` with `{call}` in every string value replaced by `call`.
fn with_call_id(arguments: &Map<String, Value>, call: &str) -> Map<String, Value> {
    arguments
        .iter()
        .map(|(key, value)| match value {
            Value::String(text) => (key.clone(), Value::String(text.replace("{call}", call))),
            other => (key.clone(), other.clone()),
        })
        .collect()
}

/// Calls a Tool as a model following the Card's `input_schema` would: with the redundant
/// `connector_channel_id` filled in (the channel section 10.1 resolves the call to) when
/// `--args` left it out, so the mock also works against a Connector that requires it. Routing
/// stays the runtime's: the envelope carries the resolved channel either way.
fn as_a_model_would(tool_call_id: Option<String>) -> ToolCallOptions {
    ToolCallOptions { tool_call_id, fill_channel_argument: true, ..ToolCallOptions::default() }
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Where the mock's inbound files go: counted, printed (name and size) and dropped.
struct CountFiles {
    color: bool,
}

impl FileSink for CountFiles {
    fn save(
        &self,
        _channel: &ConnectorChannelId,
        file: &ChatFile,
        bytes: Vec<u8>,
    ) -> BoxFuture<'_, Result<String, String>> {
        println!(
            "{} {} ({}): {} bytes downloaded",
            paint(self.color, "1", "file"),
            file.file_ref,
            file.filename.as_deref().unwrap_or("no name"),
            bytes.len()
        );
        let reference = file.file_ref.to_string();
        Box::pin(async move { Ok(reference) })
    }
}

/// A packet as it may be printed: form values sent with `auth.start` (tokens, passwords) by
/// name only, and signed URLs (`download_url` and `url` anywhere in the packet; a Connector's
/// signature stays valid for minutes) without their query string.
fn redact(text: &str) -> String {
    let Ok(mut packet) = serde_json::from_str::<Value>(text) else {
        return text.to_owned();
    };
    if let Some(input) = packet.pointer_mut("/payload/input").and_then(|v| v.as_object_mut()) {
        for value in input.values_mut() {
            *value = Value::String("<redacted>".into());
        }
    }
    redact_urls(&mut packet);
    packet.to_string()
}

/// Cuts the query (and fragment) off every `download_url` and `url` string in `value`.
fn redact_urls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                match item {
                    Value::String(url) if matches!(key.as_str(), "download_url" | "url") => {
                        if let Some(cut) = url.find(['?', '#']) {
                            url.truncate(cut);
                            url.push_str("?<redacted>");
                        }
                    }
                    other => redact_urls(other),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_urls),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::redact;
    use crate::tool_calls;

    #[test]
    fn each_tool_takes_its_own_args_and_bad_json_is_a_usage_error() {
        let tools = vec!["a".to_owned(), "b".to_owned()];
        let calls = tool_calls(&tools, &[r#"{"text":"hi"}"#.to_owned()]).expect("pairs");
        assert_eq!(calls[0].1["text"], "hi");
        assert!(calls[1].1.is_empty(), "a missing --args is {{}}");
        assert!(tool_calls(&tools, &["[1]".to_owned()]).is_err());
        assert!(tool_calls(&tools, &["{".to_owned()]).is_err());
        assert!(tool_calls(&[], &["{}".to_owned()]).is_err());
    }

    #[test]
    fn auth_inputs_are_redacted_in_printed_packets() {
        let text = r#"{"type":"auth.start","payload":{"flow_id":"f","input":{"token":"s3cret"}}}"#;
        let printed = redact(text);
        assert!(!printed.contains("s3cret"));
        assert!(printed.contains("token"));
        assert_eq!(redact("{not json"), "{not json");
    }

    #[test]
    fn signed_urls_lose_their_query_in_printed_packets() {
        let text = r#"{"type":"chat.message","payload":{"files":[{"file_ref":"f1","download_url":"/files/refs/f1?exp=9&sig=abcdef"}],"result":{"snapshot":{"url":"http://c.example/s?sig=99"}}}}"#;
        let printed = redact(text);
        assert!(!printed.contains("abcdef") && !printed.contains("sig=99"), "{printed}");
        assert!(printed.contains("/files/refs/f1?<redacted>"), "{printed}");
    }
}
