//! The smallest xAgent side: admit a Connector, connect, open and sign in a channel (a flow
//! with any number of form fields), invoke a Card Tool (section 10.1 picks the channel), then
//! receive messages.
//!
//! ```text
//! cargo run -p xagent-client-runtime --example minimal_xagent -- \
//!     http://127.0.0.1:8080 KEY webchat_room room_name=Lobby access_code=code-1234 \
//!     owner_code=owner-5678 \
//!     webchat_message_send '{"text":"hi"}'
//! ```

use serde_json::{Map, Value};
use xagent_client_runtime::prelude::*;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// What the command line asks for: `URL KEY FLOW [NAME=VALUE ...] TOOL ARGS_JSON`.
pub struct Args {
    url: String,
    key: String,
    flow: String,
    input: AuthInput,
    tool: String,
    arguments: Map<String, Value>,
}

/// Reads the command line (without the program name).
pub fn parse(args: &[String]) -> Result<Args, Error> {
    let usage = "usage: minimal_xagent URL KEY FLOW [NAME=VALUE ...] TOOL ARGS_JSON";
    let [url, key, flow, rest @ ..] = args else { return Err(usage.into()) };
    let [fields @ .., tool, arguments] = rest else { return Err(usage.into()) };
    let mut input = AuthInput::default();
    for field in fields {
        let (name, value) = field.split_once('=').ok_or("form inputs are NAME=VALUE")?;
        input = input.with(name, value);
    }
    let arguments: Value = serde_json::from_str(arguments)?;
    let Value::Object(arguments) = arguments else { return Err("ARGS_JSON is an object".into()) };
    Ok(Args {
        url: url.clone(),
        key: key.clone(),
        flow: flow.clone(),
        input,
        tool: tool.clone(),
        arguments,
    })
}

/// Admits, connects, signs a channel in and calls the Tool once; returns the data plane, its
/// events and the call's outcome.
pub async fn sign_in_and_call(args: Args) -> Result<(DataPlane, Events, ToolOutcome), Error> {
    // Admission (Card, Skill and /health checked against each other and the version window),
    // then the data plane: hello, reconnect forever, every packet judged by the session.
    let Running { plane, events, .. } =
        Xagent::connect(args.url, Secret::new(args.key)).profiles(["xagent.im.v2"]).start().await?;
    plane.connected().await?;

    // A channel for the user "alice", signed in with the flow's form fields.
    let channel = plane.open_channel_for("alice", None).await?.connector_channel_id;
    let signed = plane.sign_in(&channel, &args.flow, args.input).await?;
    println!("auth: {}", signed.progress().status);

    // A Card Tool as a model following its input_schema would call it: the schema asks for
    // the channel the call runs on, so the runtime fills it in (it routes by the envelope).
    let options = ToolCallOptions { fill_channel_argument: true, ..ToolCallOptions::default() };
    let outcome =
        plane.invoke_tool_with("alice", None, &args.tool, args.arguments, options).await?;
    println!("{} on {}: {:?}", args.tool, outcome.channel, outcome.ack.result);
    Ok((plane, events, outcome))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (_plane, mut events, _outcome) = sign_in_and_call(parse(&args)?).await?;

    // Inbound messages, already checked against the Profile rules.
    while let Some(event) = events.recv().await {
        if let ClientEvent::ChatMessage(inbound) = event {
            println!("{}: {:?}", inbound.channel, inbound.message.text);
            inbound.accept();
        }
    }
    Ok(())
}
