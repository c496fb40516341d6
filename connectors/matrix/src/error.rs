//! Errors of `im.matrix`, each with the wire code it is answered with and words that say what
//! to do. None carries a token or password.

use xagent_protocol_types::ErrorCode;
use xagent_server_runtime::ServerError;

/// What went wrong starting or running the Matrix Connector.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MatrixError {
    /// The operator's settings are not usable.
    #[error("im.matrix settings: {0}")]
    Config(String),
    /// The homeserver could not be used (unreachable, not a homeserver).
    #[error("homeserver: {0}")]
    Homeserver(String),
    /// The bot could not log in.
    #[error("login: {0}")]
    Login(String),
    /// The state directory could not be used.
    #[error("state directory: {0}")]
    State(String),
    /// matrix-sdk failed at a step.
    #[error("{step}: {message}")]
    Sdk {
        /// What was being done.
        step: &'static str,
        /// The library's message (no secrets: matrix-sdk never prints tokens).
        message: String,
    },
    /// The runtime refused to start.
    #[error(transparent)]
    Server(#[from] ServerError),
}

impl MatrixError {
    /// A mapper for `map_err` naming the step.
    pub(crate) fn sdk<E: std::fmt::Display>(step: &'static str) -> impl Fn(E) -> MatrixError {
        move |e| MatrixError::Sdk { step, message: e.to_string() }
    }

    /// The stable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            MatrixError::Config(_) => ErrorCode::InvalidArguments,
            MatrixError::Login(_) => ErrorCode::Unauthorized,
            MatrixError::Homeserver(_) | MatrixError::Sdk { .. } => ErrorCode::TargetDeliveryFailed,
            MatrixError::State(_) | MatrixError::Server(_) => ErrorCode::InternalError,
        }
    }
}
