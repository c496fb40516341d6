//! # xagent-storage-sqlite
//!
//! The SQLite plumbing every SQLite store of the workspace shares (the Connector runtime's
//! storage, the xAgent side's store, the MCP bridge's inbox): each store owns its SQL and its
//! component name; this crate gives them
//!
//! - [`private_database`] and [`open`]: a database readable only by its owner (directory
//!   0700, files 0600) in WAL mode with `synchronous=FULL` by default ([`Synchronous`]), a
//!   busy timeout and a statement cache,
//! - [`migrate`]: versioned schema [`Migration`]s per component, applied in one transaction
//!   and refusing a database newer than the binary ([`SqliteError::SchemaTooNew`]),
//! - [`GroupCommit`]: one writer thread that commits whatever callers queued in one
//!   transaction, each caller's [`Batch`] in a savepoint of its own, answering each caller
//!   only after `COMMIT` returned,
//! - [`im`]: the SQLite form of `profile-im`'s outbox and receiver-idempotency tables.
//!
//! ```
//! use xagent_storage_sqlite::{Migration, Synchronous, migrate, open, private_database};
//!
//! const MIGRATIONS: &[Migration] =
//!     &[Migration::new(1, "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")];
//!
//! let dir = tempfile::tempdir()?;
//! let path = private_database(&dir.path().join("state"), "notes.sqlite3")?;
//! let mut conn = open(&path, Synchronous::Full)?;
//! migrate(&mut conn, "notes", MIGRATIONS)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod group_commit;
pub mod im;
mod migrate;
mod open;

pub use error::SqliteError;
pub use group_commit::{Batch, Committing, GroupCommit, GroupCommitConfig, GroupCommitStats};
pub use migrate::{Migration, migrate};
pub use open::{BUSY_TIMEOUT, Synchronous, open, open_in_memory, private_database, private_dir};

/// The driver crate, re-exported so every store uses the same version.
pub use rusqlite;

/// Times and counters are `u64` in the records and `INTEGER` (i64) in SQLite; a value past
/// `i64::MAX` is stored as `i64::MAX`.
pub fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A negative stored value (never written by these stores) reads as 0.
pub fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}
