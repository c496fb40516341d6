//! The smallest complete Connector: a typed Tool, a form flow `minimal_token` with one secret
//! field `token`, and an IM v2 target that prints what xAgent sends.
//!
//! ```sh
//! XAGENT_CONNECTOR_API_KEY=some-long-key cargo run -p xagent-server-runtime --example minimal_connector
//! xagent-connector conformance --base-url http://127.0.0.1:8080 --api-key some-long-key \
//!   --flow minimal_token --input token=anything
//! ```
//!
//! `XAGENT_CONNECTOR_LISTEN` (default `127.0.0.1:8080`) and `XAGENT_CONNECTOR_STATE_DIR`
//! (default: in memory, no file transfer) are read from the environment too.

use xagent_server_runtime::prelude::*;

/// Some text.
#[derive(Serialize, Deserialize, JsonSchema)]
struct Text {
    text: String,
}

#[derive(Deserialize, JsonSchema)]
struct TokenForm {
    /// Access token
    token: Secret,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let connector = Connector::builder("im.minimal", "Minimal", env!("CARGO_PKG_VERSION"))
        .target(TargetDeclaration::new(TargetType::Im, "minimal", "Minimal"))
        .profile(PROFILE_IM_V2)
        .form_flow(FlowSpec::new("minimal_token", "Sign in"), |_, form: TokenForm| async move {
            let account = Binding::new(DescriptorTarget::new("minimal", "Minimal account"));
            Ok(AuthStep::Authenticated(account.with_secret("token", form.token)))
        })
        .on_message(|_, msg| async move { println!("{}", msg.text.unwrap_or_default()) })
        .tool(ToolSpec::new("minimal_echo", "Echoes its text"), |_, a: Text| async { Ok(a) })
        .build()?;
    Ok(ConnectorServer::serve_from_env(connector).await?)
}
