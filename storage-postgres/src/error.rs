//! The one error type of the PostgreSQL plumbing: each variant says what to do, none carries
//! the database URL's password (driver messages are scrubbed before they are stored).

use std::time::Duration;

/// Something the PostgreSQL plumbing could not do. Cloneable, so one failed transaction can
/// answer every caller whose writes it carried.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// The database URL could not be used.
    #[error("the database URL is not usable: {reason}")]
    InvalidUrl {
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// The pool settings are out of range.
    #[error("the PostgreSQL pool settings are not usable: {reason}")]
    InvalidOptions {
        /// Which setting and its range.
        reason: String,
    },
    /// No connection could be made.
    #[error(
        "cannot connect to PostgreSQL at {target}: {detail}; check that the server runs and \
         accepts connections there and that the URL's user, password and database are right"
    )]
    Connect {
        /// Host and port (never the URL).
        target: String,
        /// The driver's or server's reason, scrubbed of secrets.
        detail: String,
        /// The SQLSTATE when the server itself refused (`28P01` wrong password, `3D000` no
        /// such database, `53300` too many connections, ...); none for network failures.
        code: Option<String>,
    },
    /// Every pooled connection stayed busy longer than the pool's wait timeout.
    #[error(
        "no PostgreSQL connection became free within {waited:?} (pool of {max_size}): raise \
         the pool size, or look for slow statements or a server at its connection limit"
    )]
    PoolTimeout {
        /// How long the caller waited.
        waited: Duration,
        /// The pool's size.
        max_size: usize,
    },
    /// The pool was closed (the process is shutting down).
    #[error("the PostgreSQL pool is closed: the process is shutting down")]
    PoolClosed,
    /// A statement ran longer than the statement timeout and PostgreSQL cancelled it.
    #[error(
        "PostgreSQL cancelled {context} after the statement timeout: look for locks held by \
         other sessions or a slow server, or raise the statement timeout"
    )]
    StatementTimeout {
        /// What was being done.
        context: String,
    },
    /// The connection broke while a statement or transaction was under way (nothing of an
    /// uncommitted transaction is kept).
    #[error(
        "the connection to PostgreSQL broke during {context}: {detail}; the work was not \
         committed, try again once the server is reachable"
    )]
    ConnectionLost {
        /// What was being done.
        context: String,
        /// The driver's reason, scrubbed.
        detail: String,
    },
    /// The connection broke while `COMMIT` was under way: the transaction may or may not
    /// have committed.
    #[error(
        "the connection to PostgreSQL broke while committing {context}: the outcome is \
         unknown; re-read the state before repeating the writes"
    )]
    CommitOutcomeUnknown {
        /// What was being committed.
        context: String,
    },
    /// PostgreSQL refused a statement.
    #[error("PostgreSQL refused {context}: {message} (SQLSTATE {code})")]
    Sql {
        /// What was being done.
        context: String,
        /// The five-character SQLSTATE (`23505`, `40001`, ...).
        code: String,
        /// The server's message, scrubbed.
        message: String,
    },
    /// The database holds a newer schema than this binary knows.
    #[error(
        "the database holds schema version {found} of {component}, but this binary knows only \
         up to version {known}: upgrade the binary (every replica) before pointing it at this \
         database"
    )]
    SchemaTooNew {
        /// The component whose schema it is (`server-runtime`, ...).
        component: String,
        /// The version stored in the database.
        found: i32,
        /// The newest version this binary has a migration for.
        known: i32,
    },
    /// A component's migration list is malformed (a programming error of its author).
    #[error("the migrations of {component} are malformed: {reason}")]
    InvalidMigrations {
        /// The component.
        component: String,
        /// What is wrong.
        reason: String,
    },
    /// A group commit's writer stopped before this write was committed.
    #[error(
        "the PostgreSQL writer stopped before committing this write (the process is shutting \
         down or the writer failed): nothing of it was acknowledged"
    )]
    WriterStopped,
    /// Caller-side failure reported through the plumbing (an apply function's own error).
    #[error("{context}: {message}")]
    Apply {
        /// What was being done.
        context: String,
        /// Why it failed.
        message: String,
    },
}

/// SQLSTATE of a statement cancelled by `statement_timeout` (or a cancel request).
const QUERY_CANCELED: &str = "57014";

impl PgError {
    pub(crate) fn invalid_url(reason: impl Into<String>) -> Self {
        Self::InvalidUrl { reason: reason.into() }
    }

    /// An error of the caller's own making inside an apply function or a backend (a value
    /// that does not fit, a broken invariant), reported like the plumbing's errors.
    pub fn apply(context: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Apply { context: context.into(), message: message.into() }
    }

    /// Maps a driver error met while doing `context` (`"load channels"`, ...), for statements,
    /// whose errors never hold the URL ([`crate::DatabaseUrl::error`] scrubs its secrets).
    pub fn from_driver(context: impl Into<String>, err: &tokio_postgres::Error) -> Self {
        Self::from_driver_scrubbed(context, err, |text| text)
    }

    /// [`PgError::from_driver`] with every message passed through `scrub` first.
    pub(crate) fn from_driver_scrubbed(
        context: impl Into<String>,
        err: &tokio_postgres::Error,
        scrub: impl Fn(String) -> String,
    ) -> Self {
        let context = context.into();
        if let Some(db) = err.as_db_error() {
            if db.code().code() == QUERY_CANCELED {
                return Self::StatementTimeout { context };
            }
            return Self::Sql {
                context,
                code: db.code().code().to_owned(),
                message: scrub(db.message().to_owned()),
            };
        }
        Self::ConnectionLost { context, detail: scrub(chain(err)) }
    }

    /// The SQLSTATE of a statement PostgreSQL refused, if that is what this is.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Self::Sql { code, .. } => Some(code),
            Self::StatementTimeout { .. } => Some(QUERY_CANCELED),
            _ => None,
        }
    }

    /// Whether repeating the same work later may succeed (a lost or busy connection, a
    /// serialization failure or deadlock): a caller may retry, or report a retryable error.
    pub fn is_transient(&self) -> bool {
        match self {
            // A server that refuses the user, password or database will go on refusing.
            Self::Connect { code: Some(code), .. } => {
                code.starts_with("53") || code.starts_with("57P") || code.starts_with("08")
            }
            Self::Connect { code: None, .. }
            | Self::PoolTimeout { .. }
            | Self::StatementTimeout { .. }
            | Self::ConnectionLost { .. } => true,
            // 40001 serialization failure, 40P01 deadlock, 53xxx out of resources,
            // 57P0x server shutting down or restarting, 08xxx connection exceptions.
            Self::Sql { code, .. } => {
                code == "40001"
                    || code == "40P01"
                    || code.starts_with("53")
                    || code.starts_with("57P")
                    || code.starts_with("08")
            }
            _ => false,
        }
    }
}

/// A driver error and its sources, one line.
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

/// `.pg("what")` on a driver result: maps its error with [`PgError::from_driver`] (no URL to
/// scrub with: use it for statements, whose errors never hold the URL).
pub trait PgResultExt<T> {
    /// Maps the error, naming what was being done.
    fn pg(self, context: &str) -> Result<T, PgError>;
}

impl<T> PgResultExt<T> for Result<T, tokio_postgres::Error> {
    fn pg(self, context: &str) -> Result<T, PgError> {
        self.map_err(|e| PgError::from_driver(context, &e))
    }
}
