//! The application's file hooks: where files named by the model come from ([`FileSource`]) and
//! where inbound files go ([`FileSink`]). Kept by the data plane's shared state; used by the
//! Tool layer (uploads) and the IM layer (inbound files).

use futures_util::future::BoxFuture;
use xagent_protocol_types::{ChatFile, ConnectorChannelId};

/// A file opened by the application for an upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContent {
    /// File name shown to the target system.
    pub filename: String,
    /// MIME type.
    pub mime_type: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// Where files named by the model come from: the application resolves its own unified file
/// reference (a conversation file id, a path it allows) to bytes.
pub trait FileSource: Send + Sync + 'static {
    /// Opens the file the model referred to; the error is shown to the model.
    fn open(&self, reference: &str) -> BoxFuture<'_, Result<FileContent, String>>;
}

/// Where inbound files go: the application stores them and returns its own reference.
pub trait FileSink: Send + Sync + 'static {
    /// Stores one downloaded file of an inbound message.
    fn save(
        &self,
        channel: &ConnectorChannelId,
        file: &ChatFile,
        bytes: Vec<u8>,
    ) -> BoxFuture<'_, Result<String, String>>;
}
