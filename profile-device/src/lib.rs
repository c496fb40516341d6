//! # xagent-profile-device
//!
//! Device Profile v1 (`xagent.device.v1`) as sans-I/O logic, one layer above
//! `xagent-protocol-types` and `xagent-protocol-validate`: the binding between a channel and a
//! device with the Descriptor corrections each state implies, Tool declarations with category,
//! risk and bounded parameters, a per-channel scheduler that serialises side effects while
//! observations run concurrently, confirmations of high-risk Tools, and media results as
//! Transfer Plane references only. No sockets, no async runtime, no sleeping: time is passed
//! in (Unix ms from an injected [`Clock`](xagent_protocol_types::Clock)).
//!
//! This crate is the one home of the device rules: a Connector runtime holds one
//! [`DeviceGate`] (declared Tools with category and risk, bindings and their Descriptor
//! projection, confirmations, the per-channel scheduler, result checks) and asks
//! [`profiles_for_target_type`] for the Profiles a channel of a target type enables.
//! Declarations that let the model supply a device fact (serial, address, platform account)
//! are refused when the Connector is built ([`DeviceTool::new`], [`DeviceTool::from_schema`],
//! [`check_input_schema`]); so are argument schemas that would let the model pass an
//! unconstrained command or file bytes ([`unsafe_arguments`], Device v1 sections 6 and 7),
//! unless the operator opts out for that Tool and property. Repeated calls are not decided
//! here: the runtime's one repeated-call registry (24 h window, `xagent-server-runtime`)
//! answers them before the gate
//! is asked, for device Tools like for every other side-effecting Tool.
//!
//! One `tool.invoke` of a control Tool, as the runtime (`xagent-server-runtime`) runs it:
//!
//! ```
//! use serde_json::json;
//! use xagent_profile_device::*;
//! use xagent_protocol_types::{ConnectionStatus, ConnectorChannelId, ErrorCode, ToolId};
//!
//! let channel = ConnectorChannelId::new("cch_1");
//! let tap = DeviceTool::new(
//!     "device_tap",
//!     ToolCategory::Control,
//!     RiskLevel::Medium,
//!     vec![
//!         ParamRule::required("x", ParamKind::Integer { min: 0, max: 1079 }),
//!         ParamRule::required("y", ParamKind::Integer { min: 0, max: 2399 }),
//!     ],
//! )?;
//! let mut gate = DeviceGate::new([tap], DeviceConfig::default())?;
//! gate.bind(&channel, "adb-serial-0042")?; // the Connector's own fact, never an argument
//! let arguments = json!({"connector_channel_id": "cch_1", "x": 10, "y": 20});
//! let arguments = arguments.as_object().cloned().unwrap_or_default();
//! let now = 1_790_000_000_000;
//!
//! let admitted = gate.admit(&channel, &ToolId::new("device_tap"), &arguments, now)?;
//! assert_eq!(admitted.device, "adb-serial-0042");
//! assert_eq!(gate.start_ready(now), vec![(channel.clone(), admitted.op)]);
//! // ... send the tap to the device, then:
//! gate.finish(&channel, admitted.op);
//! gate.check_result(&json!({"tapped": true}))?;
//!
//! // The device goes offline: the Descriptor correction, and calls refused with device_offline.
//! let (correction, _dropped) = gate.on_event(&channel, BindingEvent::WentOffline);
//! assert_eq!(correction.connection_status, ConnectionStatus::Offline);
//! let refused = gate.admit(&channel, &ToolId::new("device_tap"), &arguments, now);
//! assert_eq!(refused.unwrap_err().code(), ErrorCode::DeviceOffline);
//! # Ok::<(), DeviceError>(())
//! ```
//!
//! ## Effective defaults (all configurable)
//!
//! | setting | default | where |
//! |---|---|---|
//! | concurrency | side effects one at a time per channel; up to 4 concurrent observations | [`ExecutorConfig`] |
//! | queue | 64 waiting operations per channel; a wait over 60 s ends in `command_timeout` | [`ExecutorConfig`] |
//! | command timeout | 30 s of running, then `command_timeout` (the slot is held until the runtime reports the end) | [`ExecutorConfig`] |
//! | high-risk policy | confirmation required; grants are one-shot and last 5 min | [`HighRiskPolicy`], [`ConfirmationLedger`], [`DeviceConfig`] |
//! | device sharing | exclusive: a device is bound to one channel at a time | [`DeviceBindings`], [`DeviceConfig`] |
//! | media | results carry `file_ref` + download URL; bytes, `data:` URLs and base64 over 4 KiB are refused | [`MediaResult`], [`check_result`] |
//!
//! Device leases, grace periods and file-cache TTLs belong to the Connector and the Transfer
//! Plane (`xagent-file-transfer`), not to this crate.
//!
//! ## Stable error codes
//!
//! Offline (or not yet verified after a restart) -> `device_offline`; command or queue timeout
//! -> `command_timeout`; permission revoked or a high-risk Tool refused by policy ->
//! `permission_denied`; confirmation missing -> `confirmation_required`; no bound device ->
//! `connection_not_found`; bad arguments -> `invalid_arguments`; full queue ->
//! `capacity_exceeded` ([`DeviceError::code`]).
//!
//! ## Decisions where the Profile is silent
//!
//! - **Descriptor projection**: online -> `connected`/`available`; offline ->
//!   `offline`/`unavailable`; restored but not yet answered -> `degraded`/`unavailable`;
//!   permission lost -> `revoked`/`denied_by_target`; unbound -> `created`/`requires_reauth`.
//!   Tools declared `not_supported` keep that status.
//! - **Ordering**: operations of a channel start in arrival order; an observation queued after a
//!   side effect waits for it (a screenshot after a tap shows the tap's result).
//! - **Timeouts**: a running command reported as timed out keeps its slot until the runtime
//!   reports its end, because the device may still be acting; the runtime stores the timeout as
//!   the call's outcome, so a retry does not run the command a second time.
//! - **Never reached the device** (validation, offline, confirmation, full queue): the runtime
//!   does not store the refusal as the call's outcome, so a later retry may run.
//! - **Arguments**: undeclared arguments are refused, string parameters are always
//!   length-bounded, and parameters that would let the model address a device (`serial`,
//!   `device_id`, `ip`, `host`, ...) cannot be declared.

mod arguments;
mod binding;
mod error;
mod executor;
mod gate;
mod media;
mod target;
mod tools;

pub use arguments::*;
pub use binding::*;
pub use error::*;
pub use executor::*;
pub use gate::*;
pub use media::*;
pub use target::*;
pub use tools::*;
