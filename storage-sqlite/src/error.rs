//! The one error type of the SQLite plumbing.

use std::path::PathBuf;

/// Something the SQLite plumbing could not do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteError {
    /// The state directory or the database file could not be made private.
    #[error(
        "cannot prepare {path} readable only by its owner: {source}; check that this user may \
         create and change it"
    )]
    Files {
        /// The directory or file.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// SQLite refused an operation.
    #[error("SQLite could not {operation}: {source}")]
    Sqlite {
        /// What was being done (`"enable WAL"`, ...).
        operation: &'static str,
        /// SQLite's reason.
        #[source]
        source: rusqlite::Error,
    },
    /// The database holds a newer schema than this binary knows.
    #[error(
        "the database's {component} tables are at schema version {found}, newer than this \
         binary knows ({known}); run the newer release that wrote them, or restore a backup"
    )]
    SchemaTooNew {
        /// The component whose tables are too new.
        component: String,
        /// The version found.
        found: i64,
        /// The newest version this binary knows.
        known: i64,
    },
    /// A component's migration list is malformed (a bug of the caller).
    #[error("the migrations of {component} are not usable: {reason}")]
    InvalidMigrations {
        /// The component.
        component: String,
        /// What is wrong.
        reason: String,
    },
}

/// `.sqlite("what")` on a rusqlite result: names the operation in the error.
pub(crate) trait SqliteResultExt<T> {
    /// Maps the error, naming what was being done.
    fn sqlite(self, operation: &'static str) -> Result<T, SqliteError>;
}

impl<T> SqliteResultExt<T> for rusqlite::Result<T> {
    fn sqlite(self, operation: &'static str) -> Result<T, SqliteError> {
        self.map_err(|source| SqliteError::Sqlite { operation, source })
    }
}
