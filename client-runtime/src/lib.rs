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

mod acks;
mod admission;
mod backoff;
mod base_url;
mod connection;
mod directory;
mod error;
mod health;
mod http;
mod ids;
mod im;
mod invoke;
mod model_args;
mod readmit;
mod sign_in;
mod store;
mod tools;
mod transport;

pub use acks::RECENT_SETTLED_ACKS;
pub use admission::*;
pub use backoff::Backoff;
pub use base_url::{BaseUrl, BaseUrlError};
pub use connection::{
    ClientConfig, ClientEvent, ConnectionState, DataPlane, EventSource, Events, InboundMessage,
    PacketTap, TapDirection, Verdict, next_event_matching,
};
pub use directory::{ChannelDirectory, ChannelEntry, DescriptorRefused, SessionBinding};
pub use error::ClientError;
pub use health::*;
pub use http::{ControlPlane, Downloaded, SkillDocument};
pub use invoke::{
    CHANNELS_LIST_TOOL, FileContent, FileSink, FileSource, MESSAGE_SEND_TOOL, ToolCallOptions,
    ToolOutcome, UPLOAD_REF_ANNOTATION, UploadRefProperty, builtin_tools, model_input_schema,
    upload_ref_properties,
};
pub use model_args::{CHANNEL_ARGUMENT, fill_channel_argument};
pub use sign_in::{
    DEFAULT_POLL_MILLIS, MAX_POLL_FAILURES, MAX_POLL_MILLIS, MIN_POLL_MILLIS, SignIn, poll_interval,
};
pub use store::{RememberedChannel, SqliteXagentStore, XagentStore};
pub use tools::{FunctionDeclaration, declaration, project_tools};
pub use transport::{
    Frame, FrameSink, FrameStream, MemoryPeer, MemoryTransport, Transport, WsTransport,
};
