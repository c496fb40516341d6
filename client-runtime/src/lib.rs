//! # xagent-client-runtime
//!
//! The xAgent side of the **xAgent Connector Protocol 3.0**, the counterpart of
//! `xagent-server-runtime`: Base URL rules, admission (Card, Skill, health, version window),
//! the health monitor, a data-plane client with request/ack correlation, reconnect with
//! jittered backoff and channel reopening, Tool projection, and IM v2 delivery in both
//! directions through `xagent-profile-im`.
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
//! **Driver**: runs connections on the connection core.
//!
//! | Modules | What |
//! |---|---|
//! | `driver` | starting a data plane, the reconnect loop, the reader and the dispatch |
//!
//! **Features**: what the data plane does for the application.
//!
//! | Modules | What |
//! |---|---|
//! | `im`, `invoke` | IM v2 in both directions; Tool calls, uploads and built-in Tools |
//! | `tools` | the Tool projection the model sees |
//!
//! **Data plane state**: below the features that use it.
//!
//! | Modules | What |
//! |---|---|
//! | `connection` | config, events, the shared state, the `DataPlane` handle, requests, packet rules |
//! | `im_state`, `files`, `upload_refs` | the IM state, the file hooks, upload-reference schemas |
//!
//! **Foundations**: the control plane and the building blocks.
//!
//! | Modules | What |
//! |---|---|
//! | `health`, `admission` | the health monitor; Card, Skill and version admission |
//! | `http`, `transport` | the control and transfer planes; the frame transports |
//! | `store`, `directory`, `backoff` | durable state; the channel directory; reconnect delays |
//! | `error` | `ClientError` |
//! | `base_url`, `ids` | Base URL rules; identifiers |

mod admission;
mod backoff;
mod base_url;
mod connection;
mod directory;
mod driver;
mod error;
mod files;
mod health;
mod http;
mod ids;
mod im;
mod im_state;
mod invoke;
mod store;
mod tools;
mod transport;
mod upload_refs;

pub use admission::*;
pub use backoff::Backoff;
pub use base_url::{BaseUrl, BaseUrlError};
pub use connection::{
    ClientConfig, ClientEvent, ConnectionState, DataPlane, EventSource, Events, InboundMessage,
    PacketTap, TapDirection, Verdict, next_event_matching,
};
pub use directory::{ChannelDirectory, ChannelEntry, DescriptorRefused, SessionBinding};
pub use error::ClientError;
pub use files::{FileContent, FileSink, FileSource};
pub use health::*;
pub use http::{ControlPlane, Downloaded, SkillDocument};
pub use invoke::{
    CHANNELS_LIST_TOOL, MESSAGE_SEND_TOOL, ToolCallOptions, ToolOutcome, builtin_tools,
};
pub use store::{RememberedChannel, SqliteXagentStore, XagentStore};
pub use tools::{FunctionDeclaration, declaration, project_tools};
pub use transport::{
    Frame, FrameSink, FrameStream, MemoryPeer, MemoryTransport, Transport, WsTransport,
};
pub use upload_refs::{
    UPLOAD_REF_ANNOTATION, UploadRefProperty, model_input_schema, upload_ref_properties,
};
