//! # xagent-conformance
//!
//! A black-box conformance suite for any Connector Server, whatever its language: the control
//! plane, the data plane, and (given an authentication flow and its inputs) authentication,
//! Descriptors, Tools, IM v2 message exchange, the Transfer Plane and, for a Card declaring
//! `xagent.device.v1`, the Device Profile's declarations and result rules. Each check names the
//! rule it checks and, on failure, shows what was sent and what came back. Where
//! `protocol-validate` has a rule for what a check observes, the check carries that rule's id
//! (`hello.card_id`, `packet.type_unknown`, `descriptor.tool_not_in_card`,
//! `card.profile_target_type`, ...); the others are named by the plane they probe (`control.*`,
//! `ws.*`, `im.*`, `transfer.*`, `device.*`, `tool.<id>.*`).
//!
//! It talks to the Connector as xAgent would, over one raw [`probe::Probe`] socket that can send
//! anything (malformed JSON, binary frames, hellos with wrong fields), and over
//! `xagent-client-runtime`'s control-plane client. `xagent-connector conformance` is its
//! command line.
//!
//! ```no_run
//! use xagent_conformance::{ConformanceOptions, run};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let base = xagent_client_runtime::BaseUrl::parse("http://127.0.0.1:8080")?;
//! let report = run(ConformanceOptions::new(base)).await;
//! print!("{}", report.to_text(false));
//! assert!(report.passed());
//! # Ok(()) }
//! ```

mod device;
mod ids;
pub mod probe;
mod suite;

pub use suite::{Check, ConformanceOptions, ConformanceReport, Status, run};
