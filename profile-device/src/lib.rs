//! # xagent-profile-device
//!
//! Device Profile v1 (`xagent.device.v1`) as sans-I/O logic, one layer above
//! `xagent-protocol-types`: the binding between a channel and a device with the Descriptor
//! corrections each state implies, Tool declarations with category, risk and bounded
//! parameters, a per-channel scheduler that serialises side effects while observations run
//! concurrently, a registry that makes a retried `tool.invoke` return the first outcome instead
//! of acting twice, and media results as Transfer Plane references only. No sockets, no async
//! runtime, no sleeping: time is passed in (Unix ms from an injected
//! [`Clock`](xagent_protocol_types::Clock)).
//!
//! A Connector runtime handles one `tool.invoke` like this:
//!
//! ```
//! use serde_json::json;
//! use xagent_profile_device::*;
//! use xagent_protocol_types::{ConnectorChannelId, RequestId, ToolCallId};
//!
//! let channel = ConnectorChannelId::new("cch_1");
//! let mut bindings = DeviceBindings::exclusive();
//! bindings.bind(&channel, "adb-serial-0042")?; // the Connector's own fact, never an argument
//! let tap = DeviceTool::new(
//!     "device_tap",
//!     ToolCategory::Control,
//!     RiskLevel::Medium,
//!     vec![
//!         ParamRule::required("x", ParamKind::Integer { min: 0, max: 1079 }),
//!         ParamRule::required("y", ParamKind::Integer { min: 0, max: 2399 }),
//!     ],
//! )?;
//! let mut scheduler = Scheduler::new(ExecutorConfig::default());
//! let mut calls = RepeatedCalls::new(RepeatConfig::default());
//! let arguments = json!({"connector_channel_id": "cch_1", "x": 10, "y": 20});
//! let arguments = arguments.as_object().cloned().unwrap_or_default();
//! let now = 1_790_000_000_000;
//!
//! let key = CallKey::of(Some(&ToolCallId::new("call_1")), &RequestId::new("req_1"));
//! match calls.begin(&channel, key, &RequestId::new("req_1"), &tap.tool_id, &arguments, now) {
//!     CallAdmission::Run(ticket) => {
//!         let device = bindings.device_for(&channel)?; // offline / revoked / unbound -> error
//!         check_call(&tap, &arguments, HighRiskPolicy::default(), Confirmation::None)?;
//!         let op = scheduler.submit(&channel, tap.effect, now)?;
//!         assert_eq!(scheduler.start_ready(now), vec![(channel.clone(), op)]);
//!         // ... send the tap to `device`, then:
//!         assert_eq!(device, "adb-serial-0042");
//!         scheduler.finish(&channel, op);
//!         let waiting = calls.complete(ticket, Ok(json!({"tapped": true})), now);
//!         assert!(waiting.is_empty());
//!     }
//!     other => panic!("first call runs: {other:?}"),
//! }
//! // A network retry of the same call does not tap again.
//! let key = CallKey::of(Some(&ToolCallId::new("call_1")), &RequestId::new("req_2"));
//! let again = calls.begin(&channel, key, &RequestId::new("req_2"), &tap.tool_id, &arguments, now);
//! assert_eq!(again, CallAdmission::Replay(Ok(json!({"tapped": true}))));
//! # Ok::<(), DeviceError>(())
//! ```
//!
//! ## Effective defaults (all configurable)
//!
//! | setting | default | where |
//! |---|---|---|
//! | repeated-call window | a completed call's outcome is replayed for 24 h (the shared `REPEATED_CALL_WINDOW_MS`), at most 1,024 calls per channel | [`RepeatConfig`] |
//! | concurrency | side effects one at a time per channel; up to 4 concurrent observations | [`ExecutorConfig`] |
//! | queue | 64 waiting operations per channel; a wait over 60 s ends in `command_timeout` | [`ExecutorConfig`] |
//! | command timeout | 30 s of running, then `command_timeout` (the slot is held until the runtime reports the end) | [`ExecutorConfig`] |
//! | high-risk policy | confirmation required; grants are one-shot and last 5 min | [`HighRiskPolicy`], [`ConfirmationLedger`] |
//! | device sharing | exclusive: a device is bound to one channel at a time | [`DeviceBindings`] |
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
//! `connection_not_found`; bad arguments -> `invalid_arguments`; a reused `tool_call_id` with
//! other arguments -> `idempotency_conflict`; full queue -> `capacity_exceeded`
//! ([`DeviceError::code`]).
//!
//! ## Decisions where the Profile is silent
//!
//! - **Descriptor projection**: online -> `connected`/`available`; offline and
//!   restored-but-unverified -> `offline`/`unavailable`; permission lost ->
//!   `revoked`/`denied_by_target`; unbound -> `created`/`requires_reauth`. Tools declared
//!   `not_supported` keep that status.
//! - **Ordering**: operations of a channel start in arrival order; an observation queued after a
//!   side effect waits for it (a screenshot after a tap shows the tap's result).
//! - **Timeouts**: a running command reported as timed out keeps its slot until the runtime
//!   reports its end, because the device may still be acting; the registry stores the timeout as
//!   the call's outcome, so a retry does not run the command a second time.
//! - **Never reached the device** (validation, offline, confirmation, full queue): the runtime
//!   calls [`RepeatedCalls::abandon`], so a later retry may run.
//! - **Repeats while running** are parked and answered with the first outcome when it arrives.
//! - **Arguments** are compared by content (key order and `connector_channel_id` ignored), and
//!   together with the Tool id; undeclared arguments are refused, string parameters are always
//!   length-bounded, and parameters that would let the model address a device (`serial`,
//!   `device_id`, `ip`, `host`, ...) cannot be declared.

mod binding;
mod error;
mod executor;
mod media;
mod repeat;
mod tools;

pub use binding::*;
pub use error::*;
pub use executor::*;
pub use media::*;
pub use repeat::*;
pub use tools::*;
