//! # xagent-server-runtime
//!
//! A complete Connector Server for the xAgent Connector Protocol 3.0 on axum and tokio. A
//! Connector author writes only the target-system parts (how to sign in, how to send, what
//! arrives) and gets the protocol duties: the control plane (`/connector-card.json`,
//! `/skill.md`, `/health`), the `/ws` data plane with hello, channels, auth, Descriptors,
//! Tools, IM delivery, ordering and error codes, the system API key (constant-time), the
//! offline lease, persistence (SQLite, WAL) and restart.
//!
//! An author imports the [`prelude`]:
//!
//! ```no_run
//! use xagent_server_runtime::prelude::*;
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct Shout { text: String }
//!
//! #[derive(Serialize, JsonSchema)]
//! struct Shouted { text: String }
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct TokenForm {
//!     /// Access token
//!     token: Secret,
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let connector = Connector::builder("im.example", "Example", "0.1.0")
//!     .target(TargetDeclaration::new(TargetType::Im, "example", "Example"))
//!     .profile(PROFILE_IM_V1)
//!     .form_flow(FlowSpec::new("example_token", "Sign in"), |_ctx, form: TokenForm| async move {
//!         let target = DescriptorTarget::new("example", "Example account");
//!         Ok(AuthStep::Authenticated(Binding::new(target).with_secret("token", form.token)))
//!     })
//!     .tool(ToolSpec::new("example_shout", "Shout\n\nUpper-cases text."), |_ctx, args: Shout| async move {
//!         Ok(Shouted { text: args.text.to_uppercase() })
//!     })
//!     .build()?;
//! assert!(connector.card().tools[0].output_schema.is_some());
//! ConnectorServer::serve_from_env(connector).await?;
//! # Ok(()) }
//! ```
//!
//! The crate root holds the author's API; what an operator or an embedding binary uses
//! (logging, listener limits, environment names, the state lock) is under [`ops`], the
//! storage backends and cluster types under [`storage`].
//!
//! ## Modules and which way they depend
//!
//! Three layers, and inside each layer rows listed top first. A module imports only modules
//! of its own row, of rows below it in its layer, and of the layers below; nothing imports
//! upwards and no two files import each other in a circle. `tests/module_layers.rs` reads the
//! sources and this table and fails on an upward import or a cycle. (A parent's `mod x;` and
//! re-exports of its own children are its facade, not imports.)
//!
//! **Top: the server and the connection loop** (nothing below imports these).
//!
//! | module | holds |
//! |---|---|
//! | `http` | the control plane, the `/ws` upgrade, the system API key layer, the author's routes ([`ConnectorServer::router`]) |
//! | `server` | [`ServerBuilder`], [`ConnectorServer`]: loading state, `serve` with the author's routes and tasks, `serve_from_env` |
//! | `handlers` | `hello`, `channel`, `auth`, `tool`: short request handlers (methods of the connection) over the state and the author's code |
//! | `connection` | one connection on the core's driver (which decodes, judges and refuses packets) over any frame stream/sink: bounded writes, dispatch of judged packets, the detach guard |
//!
//! **Middle: the shared state, the Profile wiring and the author's code.** `state::Shared`
//! holds the definition (`connector`, with the author's code from `author`), the IM state
//! (`im`) and the file store (`files`). The author's code receives the [`ConnectorHandle`]
//! (`handle`), which holds the runtime type-erased: an `Arc<dyn HandleOps>`, a trait defined
//! in `handle` and implemented in `state::ops`. The IM wiring reaches the state through its
//! own `ImHost` trait (implemented in `state::hosts`), the Transfer Plane through parameters.
//! So the state sits on top of this layer and the handle at its bottom. No lock is held while
//! author code runs.
//!
//! | module | holds |
//! |---|---|
//! | `state` | `Shared` and the one lock over channels, routes, the lease, auth sessions and consumers; `lifecycle` (`tick`, unregistering); `ops` (the handle's operations); `hosts` (what `im` and `files` ask of it) |
//! | `im` | IM Profile wiring: outbox, receiver idempotency, deltas, activity; the `ImHost` trait it runs on |
//! | `files` | Transfer Plane wiring: the file store, its routes, re-signed download URLs |
//! | `connector` | [`Connector`], [`ConnectorBuilder`]: the definition and its generated Card |
//! | `device` | Device Profile wiring: one `profile-device` gate per Connector around device Tools (admission, per-channel serialisation, timeouts, result checks) and the binding states behind every device Tool's availability |
//! | `author` | what an author writes (`tool`, `auth`, `im`, `im_tools`: the shared IM send Tools over an [`im_tools::ImSender`], `device`, `context`) and `call`, the one place author code is called (panic-contained) |
//! | `handle` | [`ConnectorHandle`] over the `HandleOps` trait, [`StopFn`], [`DeviceStatus`]; `consumers`, the shared-consumer registry the state keeps; `detached`, [`ConnectorHandle::detached`] for unit tests (an in-memory author store, no runtime) |
//!
//! **Bottom: plain parts** (import only each other, never a module above).
//!
//! | module | holds |
//! |---|---|
//! | `tool_calls` | the repeated-call registry of `tool.invoke` (sans-I/O) |
//! | `error` | errors with the one map to wire codes and HTTP statuses |
//! | `storage` | the [`storage::Storage`] trait, SQLite and its group commit, PostgreSQL (feature `postgres`), `author` (the [`AuthorStore`] of a Connector's own records) |
//! | `binding` | [`Binding`], what is kept for a signed-in channel |
//! | `config` | [`RuntimeConfig`], the tunables |
//! | `listen` | the accept loop with its connection limits ([`ops::ServeLimits`]; `admission`: per-address caps and rates, the data plane's reserved slots, eviction), the stop signal |
//! | `lanes`, `ids`, `build_info` | per-key ordered task lanes; id minting (through `protocol-types`); build stamps |
//! | `receiver`, `throttle` | for an author's receiver of target events: [`Backoff`], [`LinkHealth`] (failures to `degraded`/`offline`); [`EditThrottle`] (paced in-place edits of a streamed message) |
//! | `logging` | [`ops::LogFormat`], [`ops::init_logging`], [`ops::log_filter`]: text or JSON lines, the packet span each inbound packet is handled in |
//! | `metrics` | the Prometheus series (process-wide counters and histograms, bounded labels only), [`AuthorGauge`] |
//! | `state_lock` | [`ops::StateDirLock`]: one process per state directory (an advisory lock naming the holder's pid) |
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
//!   warnings are logged. A Connector never serves a Card that breaks a hard rule. A Card
//!   saying `security.api_key_required` is refused by `ServerBuilder::build` when no API key
//!   is configured.
//! - Author code is contained: a panic in an auth step, a delivery, a delta or activity call,
//!   a Tool, a hook or a consumer start is logged and answered with a generic
//!   `internal_error` (or ignored where nothing waits for an answer); the connection stays
//!   usable and always detaches (routes removed, lease started) however its loop ends.
//! - Auth sessions live in memory (an interrupted sign-in is started again); bindings, channel
//!   status and Tool overrides are persisted. A form flow's required fields are checked before
//!   the author's code runs (`invalid_arguments`); an unknown `flow_id` is `invalid_packet`.
//!   Pending sign-in attempts are canceled through the author's `cancel` on `auth.cancel`,
//!   `auth.logout`, lease expiry and after the session time-to-live (30 min); an unbound
//!   channel with no attempt left returns to `created`.
//! - A Connector without auth flows binds every channel when it is opened (status
//!   `connected`, the first target's facts as Descriptor target, `on_bound` runs).
//! - Tools are callable only on a signed-in channel whose status is `connected` or `degraded`
//!   and whose Descriptor lists the Tool `available`. Tool results are kept 24 hours for
//!   repeated calls (SPEC-NOTES idempotency); a repeat while the first call runs waits for it.
//! - Lease expiry and maintenance run in [`ConnectorServer::tick`], called by a background
//!   task every 30 s and by tests directly with a `ManualClock`.
//! - `chat.message`s from xAgent (and deltas and activity) are handled in order per channel
//!   and concurrently across channels: a slow target on one channel never delays another.
//! - Durable writes go through the storage's group commit (`synchronous=FULL` by default);
//!   nothing is acknowledged before the transaction holding it committed.
//! - Storage: SQLite in the state directory by default ([`ServerBuilder::state_dir`]), or
//!   PostgreSQL with the cargo feature `postgres`: `ServerBuilder::database_url(url)` connects
//!   in `build()`, applies the schema migrations (refusing a database migrated by a newer
//!   binary) and keeps every durable fact there, with the same group-commit promise and the
//!   same size limits (`WriteOp::check`). The Transfer Plane's files and their bytes go to
//!   the same database (`file-transfer`'s PostgreSQL backend), so replicas need no shared disk.
//! - IM v1 `message.push` goes through the same outbox; its successful socket write is the
//!   delivery boundary (v1 has no business ack). The handle refuses a `chat.message` when the
//!   Card does not declare IM v2, and a `message.push` when it does not declare IM v1.
//! - Backpressure: each socket has a bounded write queue ([`RuntimeConfig::write_queue`]).
//!   When the peer stops reading, producers wait (author calls, replies; the reader stops
//!   reading the peer); nothing is dropped and the socket stays open.
//! - The Transfer Plane is enabled under `<state dir>/files` when a state directory is used,
//!   and in the database when the state is in PostgreSQL; the URL signing secret is generated
//!   once and kept in the storage (on PostgreSQL the one every replica agreed on), and
//!   redelivered messages get freshly signed `download_url`s.
//! - Measured: a 1 GiB upload grew the test process's resident memory by about 4 MiB
//!   (`tests/upload_memory.rs`, ignored by default).

mod author;
mod binding;
mod build_info;
mod config;
mod connection;
mod connector;
mod device;
mod error;
mod files;
mod handle;
mod handlers;
mod http;
mod ids;
mod im;
mod lanes;
mod listen;
mod logging;
mod metrics;
mod receiver;
mod server;
mod state;
mod state_lock;
pub mod storage;
mod throttle;
mod tool_calls;

pub use author::{
    AuthContext, AuthError, AuthPrompt, AuthStep, AuthValues, Binding, BoundReason, ChannelContext,
    DeliveryError, DeliveryOutcome, DeltaUpdate, FinalDelivery, FlowHandler, FlowSpec, ImTarget,
    ToolContext, ToolError, ToolSpec,
};
pub use author::{
    DeviceConfig, DeviceStatus, DeviceTarget, HighRiskPolicy, RiskLevel, ToolCategory,
};
/// The shared IM send Tools of [`ConnectorBuilder::im_send_tools`]: the [`im_tools::ImSender`]
/// a Connector implements, and the Tools' typed arguments and results.
pub mod im_tools {
    pub use crate::author::{
        FileSendArgs, FileSent, ImSender, MAX_CAPTION_CHARS, MAX_MESSAGE_CHARS, MessageSendArgs,
        MessageSent, OpenedFile, SendStatus, im_tool_ids,
    };
}
pub use config::RuntimeConfig;
pub use connector::{Connector, ConnectorBuilder};
pub use error::{DefinitionError, HandleError, ServerError};
pub use files::FilesConfig;
pub use handle::{Broadcast, ConnectorHandle, StartFn, StopFn};
pub use http::error_response;
pub use metrics::AuthorGauge;
pub use receiver::{Backoff, LinkHealth, MAX_RETRY_AFTER};
pub use server::{ConnectorServer, ServerBuilder};
pub use storage::author::{
    AuthorStore, AuthorStoreError, AuthorWrite, MAX_AUTHOR_KEY_BYTES, MAX_AUTHOR_NAMESPACE_BYTES,
    MAX_AUTHOR_SCAN_LIMIT, MAX_AUTHOR_VALUE_BYTES,
};
pub use storage::{AuthorRecord, AuthorScan};
pub use throttle::{EditThrottle, Offer};
pub use tokio_util::sync::CancellationToken;
pub use xagent_profile_im::{ActivityAction, ActivityCapability};

/// What an operator (or a binary embedding the runtime) uses around a Connector: logging,
/// the listener and its limits, the metrics and readiness paths, the environment variables
/// `serve_from_env` reads, the state directory's lock, build stamps, the frame-level
/// connection surface, and the PostgreSQL URL (feature `postgres`). Storage and cluster
/// types are under [`storage`].
pub mod ops {
    pub use crate::build_info::{executable_build_time, runtime_build_info};
    pub use crate::connection::{
        CLOSE_GOING_AWAY, CLOSE_INVALID_DATA, CLOSE_POLICY, CLOSE_TOO_BIG, Frame, FrameError,
    };
    pub use crate::http::{METRICS_PATH, READY, READYZ_PATH};
    pub use crate::listen::{IpNet, ServeLimits, parse_trusted_proxy, peer_ip, stop_signal};
    pub use crate::logging::{
        DEFAULT_LOG_FILTER, ENV_LOG_FORMAT, LogFormat, init_logging, log_filter, log_layer, logger,
    };
    pub use crate::metrics::METRICS_CONTENT_TYPE;
    pub use crate::server::{
        DEFAULT_LISTEN, ENV_API_KEY, ENV_LISTEN, ENV_METRICS_LISTEN, ENV_STATE_DIR,
    };
    pub use crate::state_lock::{LOCK_FILE, StateDirLock, StateLockError};
    pub use xagent_protocol_types::BuildInfo;
    /// The PostgreSQL plumbing's URL (a secret: Display and Debug redact the password), pool
    /// options and error, for [`crate::ServerBuilder::database_url`] (feature `postgres`).
    #[cfg(feature = "postgres")]
    pub use xagent_storage_postgres::{DatabaseUrl, PgError, PoolOptions};
}

/// Everything a Connector author needs, in one import: the builder and server, the author
/// traits and contexts, the common protocol types, and the derive macros for typed
/// arguments, results and forms.
pub mod prelude {
    pub use crate::{
        AuthContext, AuthError, AuthPrompt, AuthStep, AuthorStore, AuthorWrite, Binding,
        BoundReason, ChannelContext, Connector, ConnectorHandle, ConnectorServer, DeliveryError,
        FinalDelivery, FlowHandler, FlowSpec, ImTarget, ToolContext, ToolError, ToolSpec,
    };
    pub use crate::{DeviceConfig, DeviceStatus, DeviceTarget, RiskLevel, ToolCategory};
    pub use schemars::JsonSchema;
    pub use serde::{Deserialize, Serialize};
    pub use xagent_protocol_types::{
        ChatMessage, ConnectionStatus, ConnectorChannelId, DescriptorTarget, ErrorCode,
        PROFILE_DEVICE_V1, PROFILE_IM_V1, PROFILE_IM_V2, Secret, Security, TargetDeclaration,
        TargetType, TrustLevel, bearer_token, constant_time_eq,
    };
}
