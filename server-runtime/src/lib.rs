//! # xagent-server-runtime
//!
//! A complete Connector Server for the xAgent Connector Protocol 3.0 on axum and tokio. A
//! Connector author writes only the target-system parts (how to sign in, how to send, what
//! arrives) and gets the protocol duties: the control plane (`/connector-card.json`,
//! `/skill.md`, `/health`), the `/ws` data plane with hello, channels, auth, Descriptors,
//! Tools, IM delivery, ordering and error codes, the system API key (constant-time), the
//! offline lease, persistence (SQLite, WAL) and restart.
//!
//! ```no_run
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//! use xagent_server_runtime::{Connector, ConnectorServer, ToolContext, ToolError};
//! use xagent_protocol_types::{TargetDeclaration, TargetType, PROFILE_IM_V1};
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct Shout { text: String }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let connector = Connector::builder("im.example", "Example", "0.1.0")
//!     .target(TargetDeclaration::new(TargetType::Im, "example", "Example"))
//!     .profile(PROFILE_IM_V1)
//!     .tool::<Shout, _, _>("example_shout", "Shout", "Upper-cases text.", |_ctx: ToolContext, args: Shout| async move {
//!         Ok::<_, ToolError>(serde_json::json!({ "text": args.text.to_uppercase() }))
//!     })
//!     .build()?;
//! assert!(connector.card().tools[0].input_schema["properties"]["connector_channel_id"].is_object());
//! let server = ConnectorServer::builder(connector).state_dir("/var/lib/example")?.build().await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! server.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```
//!
//! Decisions where the protocol texts are silent (also in the item docs):
//! - One runtime instance (`connector_id`) at a time. A hello with an unknown or expired
//!   `connector_id` gets the current one (or a new one when none is registered); it is never
//!   refused for that. A hello whose `supported_profiles` shares nothing with the Card gets
//!   `invalid_packet` (the connection stays open for another hello).
//! - `channel.open` with an unknown channel id (or one owned by an expired instance) gets a new
//!   channel. `channel.close` only removes the route; bindings stay.
//! - `Connector::builder(..).build()` runs the protocol's Card validator on the generated
//!   Card; every `error` violation refuses the definition (`DefinitionError::CardViolations`),
//!   warnings are logged. A Connector never serves a Card that breaks a hard rule.
//! - Auth sessions live in memory (an interrupted sign-in is started again); bindings, channel
//!   status and Tool overrides are persisted. A form flow's required fields are checked before
//!   the author's code runs (`invalid_arguments`); an unknown `flow_id` is `invalid_packet`.
//!   Pending sign-in attempts are canceled through the author's `cancel` on `auth.cancel`,
//!   `auth.logout`, lease expiry and after the session time-to-live (30 min); an unbound
//!   channel with no attempt left returns to `created`.
//! - Tools are callable only on a signed-in channel whose status is `connected` or `degraded`
//!   and whose Descriptor lists the Tool `available`. Tool results are kept 24 hours for
//!   repeated calls (SPEC-NOTES idempotency); a repeat while the first call runs waits for it.
//! - Lease expiry and maintenance run in [`ConnectorServer::tick`], called by a background
//!   task every 30 s and by tests directly with a `ManualClock`.
//! - `chat.message`s from xAgent are delivered to the target one at a time per connection.
//! - IM v1 `message.push` goes through the same outbox; its successful socket write is the
//!   delivery boundary (v1 has no business ack). The handle refuses a `chat.message` when the
//!   Card does not declare IM v2, and a `message.push` when it does not declare IM v1.
//! - Backpressure: each socket has a bounded write queue ([`RuntimeConfig::write_queue`]).
//!   When the peer stops reading, producers wait (author calls, replies; the reader stops
//!   reading the peer); nothing is dropped and the socket stays open.
//! - The Transfer Plane is enabled under `<state dir>/files` when a state directory is used;
//!   the URL signing secret is generated once and kept in the storage, and redelivered
//!   messages get freshly signed `download_url`s.
//! - Measured: a 1 GiB upload grew the test process's resident memory by about 4 MiB
//!   (`tests/upload_memory.rs`, ignored by default).

mod author;
mod build_info;
mod connector;
mod consumers;
mod files;
mod http;
mod ids;
mod im;
mod lanes;
mod runtime;
mod session;
mod storage;

pub use author::{
    AuthContext, AuthError, AuthPrompt, AuthProvider, AuthStep, AuthValues, Binding,
    ChannelContext, DeliveryError, DeltaUpdate, FinalDelivery, ImTarget, NoAuth, ToolContext,
    ToolError,
};
pub use build_info::runtime_build_info;
pub use connector::{Connector, ConnectorBuilder, DefinitionError};
pub use consumers::StopFn;
pub use files::FilesConfig;
pub use http::error_response;
pub use runtime::{
    ConnectorHandle, ConnectorServer, HandleError, RuntimeConfig, ServerBuilder, ServerError,
};
pub use session::{CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TOO_BIG, Frame, FrameError};
pub use storage::{
    ChannelRecord, CommitTicket, DATABASE_FILE, GroupCommit, GroupCommitConfig, GroupCommitStats,
    SqliteOptions, SqliteStorage, Storage, StorageError, Synchronous, ToolCallRecord, WriteOp,
};
pub use xagent_profile_im::{ActivityAction, ActivityCapability};
pub use xagent_protocol_types::BuildInfo;

#[cfg(feature = "testing")]
pub mod testing;
