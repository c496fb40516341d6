//! The crate's error type and its mapping to the protocol's stable codes and HTTP statuses.

use axum::http::StatusCode;
use xagent_protocol_types::ErrorCode;
use xagent_server_runtime::storage::StorageError;
use xagent_server_runtime::{DefinitionError, HandleError, ServerError};

use crate::pairing_error::PairingError;

/// What can go wrong in the webchat Connector. Messages say what to do and never contain an
/// access code or token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebchatError {
    /// The embedded database failed (the source names the operation and the cause).
    #[error("{0}; check the state directory's disk and permissions")]
    Storage(#[from] StorageError),
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
    #[error(transparent)]
    Pairing(#[from] PairingError),
    /// The runtime refused (file store, outbox).
    #[error(transparent)]
    Runtime(#[from] HandleError),
    /// The pairing QR code could not be drawn.
    #[error("the QR code could not be drawn: {0}")]
    Qr(#[from] png::EncodingError),
    /// The pairing link does not fit in a QR code (HTTP 400).
    #[error("the link cannot be encoded as a QR code: {0}; use a shorter public URL")]
    QrData(#[source] qrcode::types::QrError),
    /// An upload is not a valid `multipart/form-data` body (HTTP 400).
    #[error("the upload is not a valid form: {0}; send the file as multipart/form-data")]
    Form(#[source] axum::extract::multipart::MultipartError),
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
    Server(#[from] ServerError),
    /// The Connector's definition is unusable.
    #[error("the webchat Connector's definition is unusable: {0}")]
    Definition(#[from] DefinitionError),
    /// The server is shutting down and takes no new work (HTTP 503): try again once it is
    /// back.
    #[error("the chat is shutting down; try again in a moment")]
    ShuttingDown,
}

impl WebchatError {
    /// The stable protocol code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Storage(_)
            | Self::Runtime(_)
            | Self::Qr(_)
            | Self::Server(_)
            | Self::Definition(_) => ErrorCode::InternalError,
            Self::ShuttingDown => ErrorCode::ShuttingDown,
            Self::InvalidInput(_) | Self::QrData(_) | Self::Form(_) => ErrorCode::InvalidArguments,
            Self::Forbidden => ErrorCode::Forbidden,
            Self::NoAgent => ErrorCode::ConnectionNotAuthenticated,
            Self::Pairing(_) => ErrorCode::AuthSessionNotFound,
            Self::TooLarge(_) => ErrorCode::PayloadTooLarge,
            Self::StoreFull(_) | Self::TooManyRequests { .. } => ErrorCode::CapacityExceeded,
        }
    }

    /// The HTTP status of the chat API for this error: its code's status
    /// ([`ErrorCode::http_status`]), refined where the chat knows more: a used or expired
    /// pairing link is 410 (Gone), a full store 507 and a rate limit 429 (with `Retry-After`).
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::Pairing(_) => StatusCode::GONE,
            Self::StoreFull(_) => StatusCode::INSUFFICIENT_STORAGE,
            Self::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            other => StatusCode::from_u16(other.code().http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }
}

impl axum::response::IntoResponse for WebchatError {
    fn into_response(self) -> axum::response::Response {
        if matches!(
            self,
            Self::Storage(_)
                | Self::Runtime(_)
                | Self::Qr(_)
                | Self::Server(_)
                | Self::Definition(_)
        ) {
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
            (WebchatError::Pairing(PairingError::Expired), "auth_session_not_found", 410),
            (WebchatError::Storage(StorageError::new("read", "x")), "internal_error", 500),
            (WebchatError::ShuttingDown, "shutting_down", 503),
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

    #[test]
    fn wrapped_errors_keep_their_source_and_say_what_to_do() {
        use std::error::Error as _;
        let cause = std::io::Error::other("disk full");
        let error = WebchatError::from(StorageError::new("a webchat database query", cause));
        let storage = error.source().expect("the StorageError is the source");
        assert_eq!(storage.source().map(ToString::to_string).as_deref(), Some("disk full"));
        assert!(error.to_string().contains("check the state directory"), "{error}");
        let pairing = WebchatError::from(PairingError::Expired);
        assert_eq!(pairing.code(), ErrorCode::AuthSessionNotFound);
        assert!(pairing.to_string().contains("ask for a new QR code"), "{pairing}");
    }
}
