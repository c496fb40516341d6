//! # xagent-connector-matrix
//!
//! The IM Connector `im.matrix`: an xAgent agent in Matrix rooms, end-to-end encrypted ones
//! included, over protocol 3.0 and IM Profile v2. The bot is an ordinary Matrix account the
//! operator creates; it talks to the homeserver through `matrix-sdk` (with its crypto and
//! SQLite stores in the state directory) and to xAgent through `xagent-server-runtime`.
//!
//! ## Modules and which way they depend
//!
//! Rows are listed top first: a module imports only its own row and rows below it, and no two
//! files import each other in a circle (`tests/module_layers.rs` checks both).
//!
//! | module | holds |
//! |---|---|
//! | [`connector`], `testing` | the definition: options, Card, flow, IM target and Tools put together, [`Matrix`]; a person on a Matrix client of their own, for tests (cargo feature `testing`) |
//! | `sync`, `tools` | the sync loop (gaps, undecryptable events, invites, idle rooms); the two send Tools |
//! | `intake`, `delivery` | one room message to xAgent, messages held until sign-in; posting, streaming and typing in the room |
//! | `flow` | the `matrix_room` pairing flow and the codes posted in rooms |
//! | `app` | `App`, the state every part shares |
//! | [`pairing`], [`bot`], `names` | one-time pairing codes with guessing limits (sans-I/O); the bot's login, kept across restarts; the Connector's names and keys |
//! | [`error`] | [`MatrixError`] |
//!
//! ```no_run
//! use xagent_connector_matrix::{Credentials, Matrix, MatrixOptions};
//! use xagent_protocol_types::Secret;
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let options = MatrixOptions::new(
//!     "https://matrix.example.org",
//!     "@agent:example.org",
//!     Credentials::Password(Secret::new(std::env::var("XAGENT_MATRIX_PASSWORD")?)),
//!     "./matrix-state",
//! );
//! let matrix = Matrix::open(options).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! matrix.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

mod app;
pub mod bot;
pub mod connector;
mod delivery;
pub mod error;
mod flow;
mod intake;
mod names;
pub mod pairing;
mod sync;
#[cfg(feature = "testing")]
pub mod testing;
mod tools;

pub use bot::Credentials;
pub use connector::{CARD_ID, Matrix, MatrixOptions};
pub use error::MatrixError;
