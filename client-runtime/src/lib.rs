//! # xagent-client-runtime
//!
//! The xAgent side of the **xAgent Connector Protocol 3.0**, the counterpart of
//! `xagent-server-runtime`: Base URL rules, admission (Card, Skill, health, version window),
//! the health monitor (an incompatible Connector stays offline until `/health` agrees with the
//! Card), a data-plane client with request/ack correlation, reconnect with jittered backoff
//! and concurrent channel reopening, Tool projection, and IM v2 delivery in both directions
//! through `xagent-profile-im` (assistant deltas numbered by the runtime, outbound files
//! uploaded on and bound to their message's channel, `user_channel_mode` applied before
//! `channel.open`). Durable state ([`store::SqliteXagentStore`], or [`store::MemoryXagentStore`] and, with
//! the `postgres` feature, `PostgresXagentStore`, all behind the async [`store::XagentStore`]) keeps a
//! channel the Connector re-keyed under its new id, with its outbox and idempotency entries, and
//! the `connector_id`, so a restart loses nothing and recognises a rebuilt Connector; nothing is
//! acknowledged before its write committed. Several xAgent processes sharing a store keep one
//! data plane per Card through a holder lease ([`HolderLease`]) whose fencing number the
//! database checks on every write.
//!
//! ```
//! use xagent_client_runtime::{BaseUrl, ClientConfig};
//!
//! let base = BaseUrl::parse("https://connector.example/im")?;
//! assert_eq!(base.ws_url(), "wss://connector.example/im/ws");
//! // A signed download path is root-relative: the Connector already put its prefix in it.
//! assert_eq!(
//!     base.resolve("/im/files/refs/file_1")?,
//!     "https://connector.example/im/files/refs/file_1"
//! );
//! let config = ClientConfig::new(base, "im.example", vec!["xagent.im.v2".into()]);
//! assert_eq!(config.request_timeout.as_secs(), 10);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Modules and which way they depend
//!
//! Each module imports only modules of its own row or of rows below it, and no two files import
//! each other in a circle (`tests/module_layers.rs` checks both, with the workspace's one
//! checker in `xagent-testkit`).
//!
//! **Front door**: what an embedder starts.
//!
//! | Modules | What |
//! |---|---|
//! | `xagent` | [`Xagent`]: admission, the store for the admitted Card, the data plane, health |
//!
//! **Driver**: runs connections on the connection core.
//!
//! | Modules | What |
//! |---|---|
//! | `driver` | starting a data plane, the holder lease, the reconnect loop, the reader and the dispatch |
//!
//! **Features**: what the data plane does for the application.
//!
//! | Modules | What |
//! |---|---|
//! | `data_plane` | the public methods of `DataPlane` that the features add (IM, settling acks, the admitted Card) |
//! | `im`, `invoke` | IM v2 in both directions; Tool calls, uploads and built-in Tools |
//! | `stream` | an assistant message streamed as deltas numbered by the runtime |
//! | `sign_in` | the sign-in driver (`auth.start`, then `auth.status` until the flow ends) |
//! | `tools` | the Tool projection the model sees |
//!
//! **Data plane state**: below the features that use it.
//!
//! | Modules | What |
//! |---|---|
//! | `connection` | config, events, the shared state, the `DataPlane` handle, requests, packet rules |
//! | `im_state`, `files`, `upload_refs`, `settled` | the IM state, the file hooks, upload-reference schemas, the book of settled acks |
//! | `uploads` | which channel each uploaded `file_ref` belongs to, and until when |
//!
//! **Foundations**: the control plane and the building blocks.
//!
//! | Modules | What |
//! |---|---|
//! | `health`, `admission` | the health monitor; Card, Skill and version admission, and `admit_durably` (the stored Card snapshot and Skill cache served while the Connector is unreachable) |
//! | `http`, `transport` | the control and transfer planes; the frame transports |
//! | `directory`, `channel_mode`, `backoff` | the channel directory and its `user_channel_mode` hold; reconnect delays |
//! | `error` | `ClientError` |
//! | `store`, `lease` | durable state (async, one commit path, group commit); the holder lease's timing and verdicts |
//! | `download` | inbound downloads under the download policy (origins, addresses, redirects, size) |
//! | `base_url`, `ids`, `model_args` | Base URL rules; identifiers; the model's redundant `connector_channel_id` |
//! | `secret_file` | a secret (API key, password, bearer token) read from an operator's file: the checks every such file gets |
//! | `tls` | which certificate authorities the xAgent side trusts over TLS: the system's roots and an operator's added CAs, one config for every plane |

pub mod admission;
mod backoff;
mod base_url;
mod channel_mode;
mod connection;
mod data_plane;
mod directory;
pub mod download;
mod driver;
mod error;
mod files;
pub mod health;
mod http;
mod ids;
mod im;
mod im_state;
mod invoke;
pub mod lease;
mod model_args;
pub mod secret_file;
mod settled;
pub mod sign_in;
pub mod store;
mod stream;
pub mod tls;
mod tools;
pub mod transport;
pub mod upload_refs;
mod uploads;
mod xagent;

/// The everyday names of an xAgent embedder, in one import:
/// `use xagent_client_runtime::prelude::*;`.
pub mod prelude {
    pub use crate::xagent::{Running, Store, Xagent};
    pub use crate::{
        ClientError, ClientEvent, ConnectionState, DataPlane, DownloadPolicy, Events, FileContent,
        FileSink, FileSource, HolderLease, InboundMessage, PacketTap, TapDirection, TlsTrust,
        ToolCallOptions, ToolOutcome,
    };
    pub use xagent_protocol_types::{AuthInput, ConnectorChannelId, ErrorCode, ProfileId, Secret};
}

pub use admission::{Admitted, DurableAdmission, admit, admit_durably};
pub use backoff::Backoff;
pub use base_url::{BaseUrl, BaseUrlError};
pub use connection::{
    ClientConfig, ClientEvent, ConnectionState, DEFAULT_WRITE_QUEUE, DataPlane, Events,
    InboundMessage, PacketTap, TapDirection, Verdict, next_event_matching,
};
pub use directory::{ChannelDirectory, ChannelEntry, DescriptorRefused, SessionBinding};
pub use download::DownloadPolicy;
pub use driver::REOPEN_CONCURRENCY;
pub use error::{ClientError, OutboundFileError, UserChannelLimit};
pub use files::{FileContent, FileSink, FileSource};
pub use health::{HealthMonitor, HealthStatus, Readmit};
pub use http::{ControlPlane, SkillDocument};
pub use invoke::{
    CHANNELS_LIST_TOOL, MESSAGE_SEND_TOOL, ToolCallOptions, ToolOutcome, builtin_tools,
};
pub use lease::HolderLease;
pub use model_args::{CHANNEL_ARGUMENT, fill_channel_argument};
pub use settled::RECENT_SETTLED_ACKS;
pub use sign_in::SignIn;
pub use stream::MessageStream;
pub use tls::TlsTrust;
pub use tools::{FunctionDeclaration, declaration, project_tools};
pub use xagent::{Running, Store, Xagent};
