//! The smallest xAgent side: admit a Connector, connect, open and sign in a channel, invoke a
//! Card Tool (section 10.1 picks the channel), then receive messages.
//!
//! ```text
//! cargo run -p xagent-client-runtime --example minimal_xagent -- \
//!     http://127.0.0.1:8080 KEY FLOW_ID field=value TOOL_ID '{"text":"hi"}'
//! ```

use xagent_client_runtime::{BaseUrl, ClientConfig, ClientEvent, ControlPlane, DataPlane, admit};
use xagent_protocol_types::{AuthInput, AuthStart, AuthStartAck, Secret};
use xagent_protocol_validate::AdmissionWindow;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, flow, field, tool, arguments] = args.as_slice() else {
        return Err("usage: minimal_xagent URL KEY FLOW NAME=VALUE TOOL ARGS_JSON".into());
    };
    let (base, key) = (BaseUrl::parse(url)?, Secret::new(key.as_str()));

    // Admission: Card, Skill and /health checked against each other and the version window.
    let control = ControlPlane::new(base.clone(), Some(key.clone()));
    let admitted = admit(&control, &AdmissionWindow::default(), None).await?;

    // The data plane: hello, reconnect forever, every packet judged by the session.
    let config = ClientConfig::for_card(base, &admitted.card).with_api_key(key);
    let (plane, mut events) = DataPlane::connect(config)?;
    plane.connected().await?;

    // A channel for the user "alice", signed in with a form flow.
    let channel = plane.open_channel_for("alice", None).await?.connector_channel_id;
    let (name, value) = field.split_once('=').ok_or("NAME=VALUE")?;
    let input = AuthInput::default().with(name, value);
    let signed: AuthStartAck =
        plane.request(Some(&channel), AuthStart::new(flow.as_str()).with_input(input)).await?;
    println!("auth: {}", signed.0.status);
    plane.remember_channel(channel).await;

    // A Card Tool as the model would call it.
    let arguments: serde_json::Value = serde_json::from_str(arguments)?;
    let arguments = arguments.as_object().cloned().unwrap_or_default();
    let outcome = plane.invoke_tool("alice", None, tool, arguments).await?;
    println!("{tool} on {}: {:?}", outcome.channel, outcome.ack.result);

    // Inbound messages, already checked against the Profile rules.
    while let Some(event) = events.recv().await {
        if let ClientEvent::ChatMessage(inbound) = event {
            println!("{}: {:?}", inbound.channel, inbound.message.text);
            inbound.accept();
        }
    }
    Ok(())
}
