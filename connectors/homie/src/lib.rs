//! # xagent-connector-homie
//!
//! The reference Device Connector `device.homie`: devices that follow the
//! [Homie convention v4](https://homieiot.github.io/) on an MQTT broker, bound to xAgent
//! channels under Device Profile v1 (`xagent.device.v1`). It sits at the top of the workspace
//! (beside `connectors/webchat`) and talks to a real broker through `rumqttc`.
//!
//! What a device publishes about itself is the source of truth: its `$state`, its `$nodes`,
//! each node's `$properties`, and each property's `$datatype`, `$format`, `$settable`,
//! `$retained` and `$unit`. Nothing is specific to one device model.
//!
//! Modules, from the bottom up:
//!
//! | module | what it holds |
//! |---|---|
//! | [`model`] | ids, `$state`, datatypes and formats; checking a value before it is set |
//! | [`tree`] | one device's topics rebuilt into a description (sans-I/O, bounded) |
//! | [`pending`] | sets waiting for the device to publish the new value (sans-I/O) |
//! | [`pin`] | the description a channel bound, pinned: what every call is judged by (sans-I/O) |
//! | [`presence`] | availability: `$state lost` confirmed by silence, reports debounced (sans-I/O) |
//! | [`pairing`] | the operator's pairing codes, hashed, with a guessing limit |
//! | [`link`] | the broker connection: watching devices, availability, read / set / snapshot |
//! | [`connector`] | the Connector on `xagent-server-runtime`: Card, `homie_bind`, device Tools |
//! | [`sim`] | a simulated Homie device (thermostat, sensor, camera) over real MQTT |
//! | `testing` | a throw-away Mosquitto broker for tests (cargo feature `testing`) |
//!
//! ## The snapshot extension
//!
//! Homie v4 has no way to fetch a picture, so this crate defines a small extension (declared by
//! a device as `org.xagent.snapshot:1.0.0:[4.x]` in `$extensions`):
//!
//! - a node that takes pictures publishes the node attribute `$snapshot` (retained) with the
//!   MIME type of its pictures, e.g. `homie/cam-1/camera/$snapshot` = `image/png`;
//! - to ask for one, the Connector publishes a token (1 to 64 characters `a-z`, `0-9`, `-`) to
//!   `homie/<device>/<node>/$snapshot/request` (QoS 1, not retained);
//! - the device answers with the picture's bytes as the payload of
//!   `homie/<device>/<node>/$snapshot/image/<token>` (QoS 1, not retained).
//!
//! The Connector never passes the bytes to the agent: it stores them in its Transfer Plane and
//! returns a `file_ref`.
//!
//! ```no_run
//! use xagent_connector_homie::link::{HomieLink, LinkConfig, MqttUrl};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let url = MqttUrl::parse("mqtt://127.0.0.1:1883")?;
//! let (link, _task) = HomieLink::start(&url, LinkConfig::default());
//! link.watch("thermostat-1")?;
//! link.wait_online("thermostat-1", std::time::Duration::from_secs(5)).await?;
//! // What the device describes now: every call is judged against it.
//! let pinned = link.pin("thermostat-1")?;
//! let set = link
//!     .set("thermostat-1", &pinned, "thermostat", "target-temperature", &serde_json::json!(22.5))
//!     .await?;
//! assert_eq!(set["confirmed"], true);
//! # Ok(()) }
//! ```
//!
//! ## Modules and which way they depend
//!
//! Rows are listed top first: a module imports only its own row and rows below it, and no two
//! files import each other in a circle (`tests/module_layers.rs` checks both).
//!
//! **The Connector and its users.**
//!
//! | module | holds |
//! |---|---|
//! | `connector`, `sim`, `testing` | the Connector definition; simulated devices; the test broker |
//! | `handover` | watches handed over between replicas |
//!
//! **The broker link and the device model.**
//!
//! | module | holds |
//! |---|---|
//! | `link` | the MQTT link to the broker: watches, sets and their confirmations |
//! | `pin` | a device's pinned description and the snapshot extension |
//! | `pairing`, `pending`, `tree` | pairing codes; sets awaiting confirmation; a device's tree |
//! | `model`, `presence`, `error` | Homie's ids, datatypes and states; presence; [`HomieError`] |

pub mod connector;
pub mod error;
mod handover;
pub mod link;
pub mod model;
pub mod pairing;
pub mod pending;
pub mod pin;
pub mod presence;
pub mod sim;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tree;

pub use connector::{CARD_ID, Homie, HomieOptions};
pub use error::HomieError;
