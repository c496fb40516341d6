//! # xagent-connector-matrix
//!
//! The IM Connector `im.matrix`: an xAgent agent in Matrix rooms, end-to-end encrypted ones
//! included, over protocol 3.0 and IM Profile v2. The bot is an ordinary Matrix account the
//! operator creates; it talks to the homeserver through `matrix-sdk` (with its crypto and
//! SQLite stores in the state directory) and to xAgent through `xagent-server-runtime`.
//!
//! | module | what it holds |
//! |---|---|
//! | [`pairing`] | one-time pairing codes that bind a room to a channel, with guessing limits (sans-I/O) |
//! | [`bot`] | the bot's login, kept and reused across restarts |
//! | [`connector`] | the Connector: Card, `matrix_room` flow, sync loop, IM target, Tools |
//! | `testing` | a person on a Matrix client of their own, for tests (cargo feature `testing`) |
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

pub mod bot;
pub mod connector;
pub mod error;
pub mod pairing;
#[cfg(feature = "testing")]
pub mod testing;

pub use bot::Credentials;
pub use connector::{CARD_ID, Matrix, MatrixOptions};
pub use error::MatrixError;
