//! # xagent-protocol-validate
//!
//! Every hard rule of the xAgent Connector Protocol 3.0, in one place, so a Connector can check
//! itself before it ships and the xAgent backend can embed the same checks. It sits on
//! `xagent-protocol-types` and does no I/O.
//!
//! - Validators for the Card, the Descriptor (alone or against a Card), `SKILL.md`, `/health`,
//!   the Base URL, hello / hello.ack and single packets. They work on `serde_json::Value`, so
//!   one bad field never hides another, and return a [`Report`] with **every** [`Violation`]:
//!   a stable rule id, a [`Severity`], a JSON pointer and a message. [`Report`] serialises to
//!   the `{"valid", "violations"}` shape of `xagent-connector check --format json`, and
//!   [`check_text`] is the library form of that command.
//! - The hot-path form for packets, [`Validator::check_packet`]: one typed decode, the rules
//!   on the typed packet and an allocation-free scan of the text for secrets, returning the
//!   typed [`Packet`](xagent_protocol_types::Packet) or, for a packet it refuses, the full
//!   report. Same verdict as the report form (tested on every fixture and on mutations).
//! - Version admission ([`version`]), the Profile catalog and negotiation ([`catalog`]: the
//!   only allowlist in the project), the sans-I/O data-plane sequencing machine ([`session`]),
//!   the Tool input schema helper ([`with_connector_channel_id`]) and the secret-leak scanner
//!   ([`secrets`]).
//!
//! ```
//! use serde_json::json;
//! use xagent_protocol_types::{ProfileId, Side};
//! use xagent_protocol_validate::{AdmissionWindow, Negotiated, ProtocolVersion, validate_card};
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
//!
//! let report = validate_card(&json!({"schema": "xagent.connector/v1", "protocol_version": "2.0"}));
//! assert!(!report.valid);
//! assert!(report.has("card.protocol_version") && report.has("card.connector_card_id"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Modules and which way they depend
//!
//! Three layers, rows listed top first. A module imports only modules of its own row, of rows
//! below it in its layer, and of the layers below; no two files import each other in a circle.
//! `tests/module_layers.rs` reads the sources and this table and fails on an upward import or a
//! cycle.
//!
//! **Top: the hot path** (nothing imports it).
//!
//! | module | holds |
//! |---|---|
//! | `fast` | [`Validator::check_packet`]: one typed decode, the rules on the typed packet, a scan for secrets |
//!
//! **Middle: the judges.**
//!
//! | module | holds |
//! |---|---|
//! | `validate` | the report form: Card, Descriptor, `SKILL.md`, `/health`, Base URL, hello and packets |
//! | `im` | the one home of the IM payload rules, over small views of the typed and `Value` forms |
//! | `session`, `secrets` | the data-plane sequencing machine; the secret-leak scanner |
//!
//! **Bottom: the facts and tables.**
//!
//! | module | holds |
//! |---|---|
//! | `rules` | every rule's id, severity, section and summary; the refusal code of a report |
//! | `facts`, `catalog`, `version`, `tool_schema`, `model_text` | Card facts and check contexts; the Profile catalog; version admission; the Tool schema helper; wire mentions in model text |
//! | `report` | violations and reports |
//!
//! ## Decisions where the texts are silent
//!
//! - The Connector side admits a hello whose version is at least the window minimum and has
//!   the window's major ([`AdmissionWindow::admit_hello`]); the xAgent side admits a hello.ack in
//!   the closed window ([`AdmissionWindow::admit`]). Omitted versions read as 1.0.
//! - A version refusal is answered with `protocol_version_unsupported` and a close
//!   ([`RejectAction::ReplyAndClose`]); other hello failures are answered and the connection
//!   waits for a correct hello.
//! - An ack whose `request_id` (or a `chat.message.ack` whose `reply_to`) matches nothing
//!   pending is dropped without an answer ([`RejectAction::Ignore`]); so is a pushed Descriptor
//!   whose identity does not match (the protocol says xAgent ignores it).
//! - A Descriptor naming another Card is `connector_channel_connector_mismatch`; another
//!   runtime id is `connector_id_mismatch`; another channel is `invalid_packet`.
//! - A channel closes when `channel.close` is seen; its ack (and any ack of a request made
//!   while it was open) still pairs.
//! - Packets of a Profile that was not negotiated, or in the wrong direction, are
//!   `unsupported_packet`. Received packets go through the [`Session`]; signals xAgent wants to
//!   send are filtered with [`ChannelProfiles::outbound_packet`] and dropped silently.
//! - The catalog's outbound payload kinds for IM v2 are named in [`catalog::outbound`].
//! - The secret scanner ignores known secrets shorter than 6 characters and leaves out
//!   `auth.start` form input, which carries the user's secrets by design.
//! - `SKILL.md` paths are `/front_matter/name` and `/line/<n>`.
//! - `message.push`: `text`, `content` or `message` satisfies the content requirement.
//! - A `SKILL.md` that starts with a UTF-8 byte-order mark is read as if it had none (the
//!   texts say only "Markdown text"; tolerant on read) and `check` warns
//!   (`skill.byte_order_mark`). Admission reads the name with [`skill_front_matter_name`] too.
//! - IM payloads: the one home of the IM v1 file rules and the IM v2 `chat.*` payload rules is
//!   [`im`]; the report form, the single-pass form and the typed IM checks of
//!   `xagent-profile-im` all call its rule functions. xAgent-internal identities are refused in
//!   file items too (a file item is part of the payload), and a file item's `url` obeys the
//!   `download_url` rule wherever it appears.
//! - IM Tools (`card.im_tool_target_argument`) are the Tools whose `profile` is an IM Profile,
//!   and Tools without a `profile` in a Card whose only target type is `im`. Their argument
//!   names are compared with [`im::FORBIDDEN_TOOL_ARGUMENTS`] ignoring case, `_` and `-`, at
//!   every depth of the schema (the walk [`find_properties`] the device rule uses too).
//! - `card.im_profiles_exclusive` holds for every Card, not only built-in ones: a Connector is
//!   legacy (IM v1) or current (IM v2); xAgent's hello may still list both.
//! - What a `message.push` cites (`message_push.card_reference`) is judged only with a Card:
//!   `reply.tool_id` and `skill.tool_ids` must be Card Tools, `skill.name` the primary Skill or
//!   a `related_skill_ids` entry. In text, only `activation_message` is read (`text` quotes the
//!   user): a word starting with `connector-` is a Skill name, and a word in a Card Tool's
//!   namespace (the part of its id before the first `_`, plus `_`) is a Tool id.
//! - `related_skill_ids` name the Skill served at `/skill.md` exactly
//!   (`skill.related_skill_ids`): the protocol gives a `-<purpose>` Skill no endpoint, so a Tool
//!   cannot point xAgent at one. The check runs when the Skill checked carries the primary name
//!   (the served one), and [`Validator::absent_skill`] when none is served.
//! - `chat_activity.content`: the activity fields refused are [`im::FORBIDDEN_ACTIVITY_FIELDS`];
//!   a `tool_name` with a slash or backslash, a drive letter or a URL scheme is a path or URL
//!   (a `server:tool` name passes).
//! - Direction: a packet judged without a sender ([`PacketContext::sender`] `None`) is judged as
//!   sent by the one side that sends its type; a type both sides send is judged for both, and a
//!   violation that holds for one sender only names it ([`Violation::sender`]).
//!
#![doc = include_str!("../RULES.md")]

pub mod catalog;
mod facts;
mod fast;
pub mod im;
pub mod model_text;
mod report;
pub mod rules;
pub mod secrets;
pub mod session;
mod tool_schema;
mod validate;
pub mod version;

pub use facts::{CardFacts, DescriptorContext, PacketContext};
pub use fast::Checked;
pub use report::{Report, Rule, Severity, Violation, side_name};
pub use secrets::{Leak, LeakKind, SecretScanner};
pub use validate::{
    DocumentKind, Validator, check_text, check_text_from, is_valid_tool_id, parse_document,
    skill_front_matter_name, skill_name_matches_card, validate_base_url, validate_card,
    validate_descriptor, validate_health, validate_packet, validate_skill,
};

pub use catalog::{ChannelProfiles, Negotiated, Permission, ProfileSpec};
pub use session::{
    Accepted, ChannelOwner, ChannelOwnership, Established, OpenChannel, PendingMessage,
    PendingRequest, RejectAction, Rejection, Session,
};
pub use tool_schema::{
    CHANNEL_ARGUMENT_DESCRIPTION, ToolSchemaError, argument_name_in, find_properties,
    squash_argument_name, with_connector_channel_id,
};
pub use version::{AdmissionWindow, ProtocolVersion, VersionError};
