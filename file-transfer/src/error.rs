//! The one error type of the Transfer Plane, with its mapping to wire codes and HTTP statuses.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use xagent_protocol_types::{ErrorCode, HttpErrorBody, WireError};

/// Everything that can go wrong in the file store, the URL signer or the HTTP handlers.
///
/// [`TransferError::code`] gives the stable wire code and [`TransferError::status`] the HTTP
/// status; nothing else in the crate invents either. Messages never contain a secret, a
/// signature, a target-system reference or a file system path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// The system API key is missing or wrong (or, on a download, no credential was given).
    #[error("{0}")]
    Unauthorized(&'static str),
    /// An upload did not name its channel in the `X-XAgent-Connector-Channel-ID` header.
    #[error("send the channel in the X-XAgent-Connector-Channel-ID header")]
    ChannelRequired,
    /// The named channel is not known to the runtime.
    #[error("the connector channel does not exist; open the channel first")]
    UnknownChannel,
    /// The file reference does not exist, has expired, or its download URL has expired.
    #[error("{0}")]
    FileNotFound(&'static str),
    /// The signature is wrong or the file belongs to another channel.
    #[error("{0}")]
    Forbidden(&'static str),
    /// A file (or a form field) is larger than the configured limit.
    #[error("the upload exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The limit that was exceeded, in bytes.
        limit: u64,
    },
    /// The store is full (total bytes or file count); unexpired files are never evicted.
    #[error("the file store is full; retry after stored files expire")]
    CapacityExceeded,
    /// The multipart body is malformed or lacks the `file` field.
    #[error("invalid upload: {0}")]
    InvalidUpload(String),
    /// A `Range` header names no byte of the file.
    #[error("the requested range lies outside the {size}-byte file")]
    RangeNotSatisfiable {
        /// Size of the file, for the `Content-Range: bytes */size` header.
        size: u64,
    },
    /// The URL signing secret is too short to be safe.
    #[error("the URL signing secret must be at least {min} bytes long")]
    WeakSecret {
        /// The minimum length, in bytes.
        min: usize,
    },
    /// Reading or writing the storage directory failed.
    #[error("file storage failed: {0}")]
    Io(#[from] std::io::Error),
    /// The PostgreSQL database holding the files failed or refused (its message says what
    /// to do and never contains the database URL's password).
    #[cfg(feature = "postgres")]
    #[error("file storage on PostgreSQL failed: {0}")]
    Database(xagent_storage_postgres::PgError),
}

impl TransferError {
    /// The stable wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Unauthorized(_) => ErrorCode::Unauthorized,
            Self::ChannelRequired => ErrorCode::ConnectorChannelIdRequired,
            Self::UnknownChannel => ErrorCode::ConnectionNotFound,
            Self::FileNotFound(_) => ErrorCode::FileNotFound,
            Self::Forbidden(_) => ErrorCode::Forbidden,
            Self::TooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::CapacityExceeded => ErrorCode::CapacityExceeded,
            Self::InvalidUpload(_) | Self::RangeNotSatisfiable { .. } => {
                ErrorCode::InvalidArguments
            }
            Self::WeakSecret { .. } | Self::Io(_) => ErrorCode::InternalError,
            #[cfg(feature = "postgres")]
            Self::Database(_) => ErrorCode::InternalError,
        }
    }

    /// The HTTP status this error is answered with: its code's status
    /// ([`ErrorCode::http_status`]), refined where the Transfer Plane knows more: a full store
    /// is 507 (Insufficient Storage, not a passing overload) and a range outside the file 416.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::CapacityExceeded => StatusCode::INSUFFICIENT_STORAGE,
            Self::RangeNotSatisfiable { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            other => StatusCode::from_u16(other.code().http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    /// The wire error object. Internal failures get a generic message so no path or OS detail
    /// reaches the peer (the details are logged instead).
    pub fn to_wire(&self) -> WireError {
        let message = match self {
            Self::Io(_) | Self::WeakSecret { .. } => {
                "internal storage error; see the connector logs".to_owned()
            }
            #[cfg(feature = "postgres")]
            Self::Database(_) => "internal storage error; see the connector logs".to_owned(),
            other => other.to_string(),
        };
        WireError::new(self.code(), message)
    }
}

impl IntoResponse for TransferError {
    fn into_response(self) -> Response {
        if self.status().is_server_error() {
            tracing::error!(error = %self, "transfer plane request failed");
        }
        let status = self.status();
        let mut response =
            (status, axum::Json(HttpErrorBody { error: self.to_wire() })).into_response();
        let headers = response.headers_mut();
        match self {
            Self::Unauthorized(_) => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::RangeNotSatisfiable { size } => {
                if let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    headers.insert(header::CONTENT_RANGE, value);
                }
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_a_known_code() {
        let errors = [
            TransferError::Unauthorized("x"),
            TransferError::ChannelRequired,
            TransferError::UnknownChannel,
            TransferError::FileNotFound("x"),
            TransferError::Forbidden("x"),
            TransferError::TooLarge { limit: 1 },
            TransferError::CapacityExceeded,
            TransferError::InvalidUpload("x".into()),
            TransferError::RangeNotSatisfiable { size: 1 },
            TransferError::WeakSecret { min: 16 },
            TransferError::Io(std::io::Error::other("disk")),
        ];
        for error in errors {
            assert!(error.code().is_known(), "{error:?}");
            assert!(error.status().is_client_error() || error.status().is_server_error());
        }
    }

    #[test]
    fn io_errors_do_not_leak_details_to_the_peer() {
        let error = TransferError::Io(std::io::Error::other("/secret/path/file_x.bin"));
        assert!(!error.to_wire().message().contains("/secret/path"));
        assert_eq!(error.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn unauthorized_response_carries_www_authenticate_bearer() {
        let response = TransferError::Unauthorized("no key").into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
}
