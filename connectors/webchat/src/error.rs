//! The crate's error type and its mapping to the protocol's stable codes and HTTP statuses.

use axum::http::StatusCode;
use xagent_protocol_types::ErrorCode;

/// What can go wrong in the webchat Connector. Messages say what to do and never contain an
/// access code or token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebchatError {
    /// The embedded database failed.
    #[error("the webchat database failed: {0}")]
    Storage(String),
    /// Input from the page or xAgent is unusable.
    #[error("{0}")]
    InvalidInput(String),
    /// No such room, or the access code / visitor token does not open it.
    #[error("unknown room or wrong access code; check the room name and the code")]
    Forbidden,
    /// The room has no signed-in xAgent channel right now.
    #[error("no agent is connected to this room yet; try again when it is online")]
    NoAgent,
    /// A pairing link is unknown, used, or expired.
    #[error("{0}")]
    Pairing(String),
    /// The runtime refused (file store, outbox).
    #[error("{0}")]
    Runtime(String),
    /// A body, file or text is larger than its limit (HTTP 413).
    #[error("{0}")]
    TooLarge(String),
    /// The file store or the room's upload quota is full (HTTP 507).
    #[error("{0}")]
    StoreFull(String),
    /// Too many attempts or streams right now (HTTP 429 with `Retry-After`).
    #[error("{message}")]
    TooManyRequests {
        /// What happened and what to do.
        message: String,
        /// When to try again, in seconds.
        retry_after_secs: u64,
    },
    /// Starting or serving failed.
    #[error("the server failed: {0}")]
    Server(String),
}

impl From<xagent_server_runtime::ServerError> for WebchatError {
    fn from(error: xagent_server_runtime::ServerError) -> Self {
        Self::Server(error.to_string())
    }
}

impl From<xagent_server_runtime::DefinitionError> for WebchatError {
    fn from(error: xagent_server_runtime::DefinitionError) -> Self {
        Self::Server(error.to_string())
    }
}

impl WebchatError {
    /// The stable protocol code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Storage(_) | Self::Runtime(_) | Self::Server(_) => ErrorCode::InternalError,
            Self::InvalidInput(_) => ErrorCode::InvalidArguments,
            Self::Forbidden => ErrorCode::Forbidden,
            Self::NoAgent => ErrorCode::ConnectionNotAuthenticated,
            Self::Pairing(_) => ErrorCode::AuthSessionNotFound,
            Self::TooLarge(_) => ErrorCode::PayloadTooLarge,
            Self::StoreFull(_) | Self::TooManyRequests { .. } => ErrorCode::CapacityExceeded,
        }
    }

    /// The HTTP status of the chat API for this error.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::Storage(_) | Self::Runtime(_) | Self::Server(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Self::InvalidInput(_) => StatusCode::BAD_REQUEST,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::NoAgent => StatusCode::CONFLICT,
            Self::Pairing(_) => StatusCode::GONE,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::StoreFull(_) => StatusCode::INSUFFICIENT_STORAGE,
            Self::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
        }
    }
}

impl axum::response::IntoResponse for WebchatError {
    fn into_response(self) -> axum::response::Response {
        if matches!(self, Self::Storage(_) | Self::Runtime(_) | Self::Server(_)) {
            tracing::error!(error = %self, "webchat request failed");
        }
        let mut response = xagent_server_runtime::error_response(
            self.http_status(),
            self.code(),
            &self.to_string(),
        );
        if let Self::TooManyRequests { retry_after_secs, .. } = &self {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(*retry_after_secs),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_a_stable_code_and_status() {
        let cases = [
            (WebchatError::Forbidden, "forbidden", 403),
            (WebchatError::NoAgent, "connection_not_authenticated", 409),
            (WebchatError::InvalidInput("x".into()), "invalid_arguments", 400),
            (WebchatError::Pairing("x".into()), "auth_session_not_found", 410),
            (WebchatError::Storage("x".into()), "internal_error", 500),
            (WebchatError::TooLarge("x".into()), "payload_too_large", 413),
            (WebchatError::StoreFull("x".into()), "capacity_exceeded", 507),
            (
                WebchatError::TooManyRequests { message: "x".into(), retry_after_secs: 1 },
                "capacity_exceeded",
                429,
            ),
        ];
        for (error, code, status) in cases {
            assert_eq!(error.code().to_string(), code);
            assert_eq!(error.http_status().as_u16(), status);
        }
    }
}
