//! # xagent-storage-postgres
//!
//! The PostgreSQL plumbing every PostgreSQL backend of the workspace shares (server-runtime,
//! client-runtime, file-transfer): each backend owns its SQL and its component name; this
//! crate gives them
//!
//! - [`DatabaseUrl`]: the connection URL as a secret (printed with its password as `***`),
//! - [`connect`]: a bounded [`Pool`] (deadpool-postgres over tokio-postgres) with connect,
//!   wait and statement timeouts ([`PoolOptions`]), and [`connect_unpooled`] for `LISTEN`,
//! - [`Listener`]: a `LISTEN` loop that reconnects with backoff and announces each
//!   resubscription ([`ListenEvent::Resync`]),
//! - [`migrate`]: versioned schema [`Migration`]s applied in one transaction under an
//!   advisory lock, refusing a database newer than the binary ([`PgError::SchemaTooNew`]),
//! - [`PgError`]: typed errors whose messages say what to do and never hold the password,
//! - [`GroupCommit`]: one writer task that commits whatever callers queued in one
//!   transaction, resolving each [`PgCommitTicket`] only after `COMMIT` returned.
//!
//! Connections are plain TCP unless the URL asks for TLS (`sslmode=require` or
//! `verify-full`, optionally `sslrootcert=FILE`): then rustls verifies the server's
//! certificate and name, always.
//!
//! ```no_run
//! use xagent_storage_postgres::{DatabaseUrl, Migration, PoolOptions, connect, migrate};
//!
//! const MIGRATIONS: &[Migration] = &[Migration::new(
//!     1,
//!     "CREATE TABLE notes (id BIGINT PRIMARY KEY, body TEXT NOT NULL)",
//! )];
//!
//! # async fn run() -> Result<(), xagent_storage_postgres::PgError> {
//! let url = DatabaseUrl::parse("postgres://app:secret@127.0.0.1:5432/app")?;
//! let pool = connect(&url, PoolOptions::default()).await?;
//! migrate(&pool, "notes", MIGRATIONS).await?;
//! println!("connected to {url}"); // prints postgres://app:***@127.0.0.1:5432/app
//! # Ok(())
//! # }
//! ```

mod error;
mod group_commit;
mod listen;
mod migrate;
mod pool;
mod url;

pub use error::{PgError, PgResultExt};
pub use group_commit::{
    ApplyWrites, GroupCommit, GroupCommitConfig, GroupCommitStats, PgCommitTicket, execute_in_order,
};
pub use listen::{ListenEvent, Listener};
pub use migrate::{MIGRATION_LOCK, Migration, MigrationOutcome, migrate};
pub use pool::{Connection, Pool, PoolOptions, connect, connect_unpooled};
pub use url::{DatabaseUrl, Tls};

/// The driver and pool crates, re-exported so every backend uses the same versions.
pub use {async_trait, deadpool_postgres, tokio_postgres};
