//! `xagent-connector mock-xagent`: stays connected to a Connector as xAgent would and prints
//! every packet, so a Connector author can watch their server live. It admits the Connector,
//! completes hello, opens a channel (optionally signing in with a flow), accepts inbound chat
//! messages (after the xAgent-side inbound rules of `xagent-client-runtime`), runs the Card
//! Tools given with `--tool ID --args JSON` through section 10.1 resolution, and reconnects by
//! itself until Ctrl-C.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Map, Value};
use xagent_client_runtime::{
    BaseUrl, ClientConfig, ClientEvent, ControlPlane, DataPlane, PacketTap, TapDirection, admit,
};
use xagent_client_runtime::{CHANNEL_ARGUMENT, fill_channel_argument};
use xagent_protocol_types::{AuthInput, AuthStart, AuthStartAck, ProfileId, Secret};
use xagent_protocol_validate::AdmissionWindow;

/// Options of `mock-xagent`.
#[derive(Debug, Args)]
pub struct MockXagentArgs {
    /// The Connector's Base URL.
    #[arg(long)]
    base_url: String,
    /// The system API key (also read from XAGENT_CONNECTOR_API_KEY).
    #[arg(long, env = "XAGENT_CONNECTOR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Profiles to announce in hello (default: the Card's).
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
}

/// The xAgent user the mock acts for.
const MOCK_USER: &str = "mock-user";

/// Runs the mock until Ctrl-C.
pub fn run_command(args: MockXagentArgs) -> ExitCode {
    let base = match BaseUrl::parse(&args.base_url) {
        Ok(base) => base,
        Err(error) => return crate::usage("mock-xagent", error),
    };
    let inputs = match crate::parse_inputs(&args.inputs) {
        Ok(inputs) => inputs,
        Err(message) => return crate::usage("mock-xagent", message),
    };
    if let Err(message) = crate::tool_calls(&args.tools, &args.tool_args) {
        return crate::usage("mock-xagent", message);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            return crate::usage("mock-xagent", format!("cannot start the async runtime: {error}"));
        }
    };
    runtime.block_on(async move {
        tokio::select! {
            code = session(base, args, inputs) => code,
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

async fn session(base: BaseUrl, args: MockXagentArgs, inputs: AuthInput) -> ExitCode {
    let color = std::io::stdout().is_terminal();
    let api_key = args.api_key.filter(|k| !k.is_empty()).map(Secret::new);
    let control = ControlPlane::new(base.clone(), api_key.clone());
    let admitted = match admit(&control, &AdmissionWindow::default(), None).await {
        Ok(admitted) => admitted,
        Err(error) => {
            eprintln!("not admitted: {error}");
            return ExitCode::FAILURE;
        }
    };
    let card = admitted.card;
    println!(
        "{} {} {} (protocol {}), {} tool(s), profiles {:?}",
        paint(color, "1", "admitted"),
        card.connector_card_id,
        card.connector.version,
        card.protocol_version,
        card.tools.len(),
        card.supports.profiles.iter().map(|p| p.as_str()).collect::<Vec<_>>()
    );
    let profiles: Vec<ProfileId> = if args.profiles.is_empty() {
        card.supports.profiles.clone()
    } else {
        args.profiles.iter().map(|p| ProfileId::from(p.as_str())).collect()
    };
    let mut config = ClientConfig::for_card(base, &card);
    config.supported_profiles = profiles;
    config.api_key = api_key;
    config.tap = Some(PacketTap::new(move |direction, text| {
        let arrow = match direction {
            TapDirection::Sent => paint(color, "36", "xagent -> connector"),
            TapDirection::Received => paint(color, "35", "connector -> xagent"),
        };
        println!("{arrow} {}", redact_inputs(text));
    }));
    let (plane, mut events) = match DataPlane::connect(config) {
        Ok(started) => started,
        Err(error) => {
            eprintln!("the data plane could not start: {error}");
            return ExitCode::FAILURE;
        }
    };
    if plane.connected().await.is_err() {
        eprintln!("the data plane stopped before hello completed");
        return ExitCode::FAILURE;
    }
    if !args.no_channel {
        match plane.open_channel_for(MOCK_USER, None).await {
            Ok(opened) => {
                let channel = opened.connector_channel_id.clone();
                if let Some(flow) = &args.flow {
                    let mut start = AuthStart::new(flow.as_str());
                    if !inputs.0.is_empty() {
                        start = start.with_input(inputs.clone());
                    }
                    match plane.request::<AuthStart>(Some(&channel), start).await {
                        Ok(AuthStartAck(progress)) => {
                            println!("{} {}", paint(color, "1", "auth"), progress.status);
                        }
                        Err(error) => eprintln!("auth.start failed: {error}"),
                    }
                }
                plane.remember_channel(channel).await;
                let calls = crate::tool_calls(&args.tools, &args.tool_args).unwrap_or_default();
                for (tool, arguments) in calls {
                    let arguments = as_a_model_would(&plane, &tool, arguments);
                    match plane.invoke_tool(MOCK_USER, None, &tool, arguments).await {
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
    while let Some(event) = events.recv().await {
        match event {
            ClientEvent::ChatMessage(inbound) => inbound.accept(),
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

/// The arguments as a model following the Card's `input_schema` would send them: with the
/// redundant `connector_channel_id` filled in (the channel section 10.1 resolves the call to)
/// when `--args` left it out, so the mock also works against a Connector that requires it.
/// Routing stays the runtime's: the envelope carries the resolved channel either way.
fn as_a_model_would(
    plane: &DataPlane,
    tool: &str,
    mut arguments: Map<String, Value>,
) -> Map<String, Value> {
    if !arguments.contains_key(CHANNEL_ARGUMENT)
        && let Ok(channel) = plane.directory().resolve(MOCK_USER, None, tool)
    {
        fill_channel_argument(&mut arguments, &channel);
    }
    arguments
}

/// Form values sent with `auth.start` may be secrets (tokens, passwords): print their names only.
fn redact_inputs(text: &str) -> String {
    let Ok(mut packet) = serde_json::from_str::<serde_json::Value>(text) else {
        return text.to_owned();
    };
    let Some(input) = packet.pointer_mut("/payload/input").and_then(|v| v.as_object_mut()) else {
        return text.to_owned();
    };
    for value in input.values_mut() {
        *value = serde_json::Value::String("<redacted>".into());
    }
    packet.to_string()
}

#[cfg(test)]
mod tests {
    use super::redact_inputs;
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
        let printed = redact_inputs(text);
        assert!(!printed.contains("s3cret"));
        assert!(printed.contains("token"));
        assert_eq!(redact_inputs("{not json"), "{not json");
    }
}
