//! # xagent-mcp
//!
//! The MCP bridge behind `xagent-connector mcp`: it connects to one protocol 3.0 Connector as
//! xAgent does (admission, hello, a channel, sign-in, on `xagent-client-runtime`) and serves
//! what it finds to any Model Context Protocol client with the official Rust SDK (`rmcp`),
//! over stdio or streamable HTTP (on loopback only, behind a bearer token: [`http`]). A layer above the runtimes, beside `cli` and `connectors/*`.
//!
//! What an MCP client gets:
//! - **Tools**: the Card's Tools that the channel's Descriptor lists as available (the list
//!   changes, with `notifications/tools/list_changed`, when a Descriptor push changes it),
//!   plus `connector_channels_list`, `connector_message_send` and `connector_message_wait`.
//!   Tool errors are MCP tool errors carrying the protocol's stable code; progress pushes are
//!   MCP progress notifications.
//! - **Prompt and instructions**: the Connector's Skill.
//! - **Resources**: each channel's inbound messages (subscribe for
//!   `notifications/resources/updated`), each inbound file, and a pending QR sign-in.
//!
//! Inbound messages are acked `accepted` only after [`inbox::Inbox`] stored them and are
//! handed to the agent once, across restarts too. The inbox is on the runtime's backend:
//! SQLite and a files directory in the state directory by default; with `--database-url`,
//! tables of that PostgreSQL database (file bytes included) under the Connector Card id, so
//! the bridges of one Card that share the database share one inbox: the one holding the data
//! plane stores, and the one that takes over after it stops hands out what it had accepted.
//!
//! ## Which channel a Tool call runs on
//!
//! The bridge is one xAgent user of `xagent-client-runtime` and calls Card Tools the way every
//! other caller does, through the runtime's section 10.1 resolution: without a session binding,
//! the first of the user's channels that is signed in, connected (or degraded), lists the Tool
//! `available` and whose target permission does not deny it. The runtime writes that channel
//! into the `tool.invoke` envelope, which is all the Connector routes by. The model's
//! `connector_channel_id` argument is not a choice: the MCP schema leaves it out, a value an
//! MCP client sends anyway is passed on unchanged and selects nothing, and a missing one is
//! filled in with the resolved channel (as a model following the Card's schema would), so a
//! Connector that checks its schema accepts the call. To send on a channel the agent picked,
//! it calls `connector_message_send`, which checks that explicit channel (owned, signed in).
//!
//! ## Modules and which way they depend
//!
//! A module imports only modules of its own row or of rows below it, and no two files import
//! each other in a circle (`tests/module_layers.rs` checks both, with the workspace's one
//! checker in `xagent-testkit`).
//!
//! | module | holds |
//! |---|---|
//! | `server` | the MCP face: rmcp's `ServerHandler`, Tools, prompt, resources, notifications |
//! | `http` | the HTTP transport's access control: the bearer token, its file, the loopback rule |
//! | `link` | the one module that talks to the runtime: admission, the channel, sign-in, calls, events |
//! | `bridge_files` | the runtime's file source and sink for the bridge |
//! | `inbox`, `files`, `projection`, `annotations`, `uris` | the inbox, file references, the MCP view of a Card Tool's schema and its annotations, resource URIs |
//!
//! ```
//! use xagent_client_runtime::upload_refs::model_input_schema;
//! use xagent_mcp::projection::mcp_schema;
//!
//! let card_schema = serde_json::json!({
//!     "type": "object",
//!     "required": ["connector_channel_id", "file_ref"],
//!     "properties": {
//!         "connector_channel_id": {"type": "string"},
//!         "file_ref": {"type": "string", "x-xagent-upload-ref": true}
//!     }
//! });
//! let card_schema = card_schema.as_object().cloned().unwrap_or_default();
//! let shown = mcp_schema(&model_input_schema(&card_schema), &card_schema);
//! // The runtime resolves the channel (section 10.1), so the agent is not asked for one; and it
//! // passes a file, not a Connector file_ref.
//! assert_eq!(shown["required"], serde_json::json!(["file_ref"]));
//! assert!(shown["properties"].get("connector_channel_id").is_none());
//! assert!(shown["properties"]["file_ref"].get("x-xagent-upload-ref").is_none());
//! ```

pub mod annotations;
mod bridge_files;
pub mod files;
pub mod http;
pub mod inbox;
pub mod link;
pub mod projection;
pub mod server;
pub mod uris;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

pub use http::{HttpAuth, HttpSetupError, TokenSource};
pub use link::{Link, LinkConfig, LinkError, Notice, ToolFailure};
pub use server::McpBridge;

/// Everything `xagent-connector mcp` needs.
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    /// How to reach and sign in to the Connector.
    pub link: LinkConfig,
    /// Where the runtime's state, the inbox and downloaded files live (without a database),
    /// and the HTTP transport's token file.
    pub state_dir: PathBuf,
}

/// Opens the state (the state directory, or the database of `--database-url`) and connects
/// to the Connector.
pub async fn connect(config: BridgeConfig) -> Result<Arc<Link>, LinkError> {
    Link::start(config.link, &config.state_dir).await
}

/// Serves MCP over stdin/stdout until the client closes the stream.
pub async fn serve_stdio(link: Arc<Link>) -> Result<(), LinkError> {
    let service = McpBridge::new(link)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| LinkError::Config(format!("the MCP session did not start: {e}")))?;
    let reason = service.waiting().await;
    tracing::info!(?reason, "the MCP client closed the session");
    Ok(())
}

/// Serves MCP over streamable HTTP at `/mcp` on `addr` (a loopback address) until `shutdown`
/// fires; every request must carry `auth`'s bearer token. Calls `bound` with the address
/// actually bound (for `:0`).
pub async fn serve_http(
    link: Arc<Link>,
    addr: SocketAddr,
    auth: HttpAuth,
    shutdown: CancellationToken,
    bound: impl FnOnce(SocketAddr),
) -> Result<(), LinkError> {
    http::check_loopback(addr).map_err(|e| LinkError::Config(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| LinkError::Config(format!("cannot listen on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| LinkError::Config(format!("cannot read the bound address: {e}")))?;
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = shutdown.child_token();
    let service = StreamableHttpService::new(
        move || Ok(McpBridge::new(Arc::clone(&link))),
        LocalSessionManager::default().into(),
        config,
    );
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(http::Gate::new(&auth), http::require_bearer));
    bound(local);
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
        .await
        .map_err(|e| LinkError::Config(format!("the HTTP server failed: {e}")))
}
