//! # xagent-protocol-validate
//!
//! Every hard rule of the xAgent Connector Protocol 3.0 that a JSON Schema cannot say, in one
//! place, so a Connector can check itself before it ships and the xAgent backend can embed the
//! same checks: version admission ([`version`]), the Profile catalog and negotiation
//! ([`catalog`]), data-plane sequencing as a sans-I/O state machine ([`session`]) and the Tool
//! input schema helper ([`with_connector_channel_id`]).
//!
//! ```
//! use xagent_protocol_validate::{AdmissionWindow, Negotiated, ProtocolVersion};
//! use xagent_protocol_types::{ProfileId, Side};
//!
//! assert!(AdmissionWindow::default().admit(Some("3.0")).is_ok());
//! assert!(AdmissionWindow::default().admit(None).is_err()); // omitted = 1.0
//! assert_eq!(ProtocolVersion::parse("3.0")?, ProtocolVersion::CURRENT);
//!
//! let card = [ProfileId::from("xagent.im.v2")];
//! let hello = [ProfileId::from("xagent.im.v1"), ProfileId::from("xagent.im.v2")];
//! let negotiated = Negotiated::negotiate(&card, &hello);
//! assert!(negotiated.allows("chat.message.delta", Side::Xagent, None));
//! assert!(!negotiated.allows("chat.message.delta", Side::Connector, None));
//! assert!(!negotiated.allows("message.push", Side::Connector, None));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod catalog;
pub mod session;
mod tool_schema;
pub mod version;

pub use catalog::{ChannelProfiles, Negotiated, Permission, ProfileSpec};
pub use session::{
    Accepted, ChannelOwner, ChannelOwnership, Established, OpenChannel, PendingMessage,
    PendingRequest, RejectAction, Rejection, Session,
};
pub use tool_schema::{CHANNEL_ARGUMENT_DESCRIPTION, ToolSchemaError, with_connector_channel_id};
pub use version::{AdmissionWindow, ProtocolVersion, VersionError};
