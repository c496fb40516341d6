//! What the store and every backend say about stored files: the [`FileRecord`] of a file,
//! the [`RegisteredFile`] just stored, cleanup counts and occupancy.

use serde::{Deserialize, Serialize};
use xagent_protocol_types::{ChatFile, ConnectorChannelId, FileRef, FileType, UploadResponse};

use crate::TransferError;
use crate::signer::SignedUrl;

/// Metadata of one stored file. Bound to exactly one channel for its whole life.
///
/// `recipient_ref` and `reply_token` are target-system references given with an upload; they
/// are kept opaque and never printed (`Debug` redacts them).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FileRecord {
    /// The reference handed out (`file_` + 32 hex digits).
    pub file_ref: FileRef,
    /// The channel the file belongs to.
    pub connector_channel_id: ConnectorChannelId,
    /// File name (metadata only, never used as a path).
    pub filename: String,
    /// MIME type, from the uploader or guessed from the file name.
    pub mime_type: String,
    /// Kind of file derived from the MIME type.
    pub file_type: FileType,
    /// Size in bytes.
    pub byte_size: u64,
    /// When it was stored (Unix ms).
    pub created_at: u64,
    /// When it stops being available (Unix ms); expired when `now >= expires_at`.
    pub expires_at: u64,
    /// Target-system recipient reference from an upload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient_ref: Option<String>,
    /// Target-system reply reference from an upload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_token: Option<String>,
}

impl std::fmt::Debug for FileRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redact = |value: &Option<String>| value.as_ref().map(|_| "<redacted>");
        f.debug_struct("FileRecord")
            .field("file_ref", &self.file_ref)
            .field("connector_channel_id", &self.connector_channel_id)
            .field("filename", &self.filename)
            .field("mime_type", &self.mime_type)
            .field("file_type", &self.file_type)
            .field("byte_size", &self.byte_size)
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .field("recipient_ref", &redact(&self.recipient_ref))
            .field("reply_token", &redact(&self.reply_token))
            .finish()
    }
}

impl FileRecord {
    /// True when the file is no longer available at `now` (Unix ms).
    pub fn is_expired(&self, now: u64) -> bool {
        now >= self.expires_at
    }

    /// The `POST /files/uploads` answer for this file.
    pub fn upload_response(&self) -> UploadResponse {
        UploadResponse::new(
            self.file_ref.clone(),
            self.file_type.clone(),
            self.filename.clone(),
            self.byte_size,
            self.expires_at,
        )
    }

    /// A `chat.message.files[]` item for this file with the given download URL.
    pub fn to_chat_file(&self, download_url: impl Into<String>) -> ChatFile {
        ChatFile::new(self.file_type.clone(), self.file_ref.clone())
            .with_filename(self.filename.clone())
            .with_mime_type(self.mime_type.clone())
            .with_byte_size(self.byte_size)
            .with_expires_at(self.expires_at)
            .with_download_url(download_url)
    }
}

/// A file that was just stored, with a signed download URL ready to put in a message.
#[derive(Clone, Debug)]
pub struct RegisteredFile {
    /// The stored metadata.
    pub record: FileRecord,
    /// A signed URL for it, valid for the signer's lifetime (never past the file's expiry).
    pub download: SignedUrl,
}

impl RegisteredFile {
    /// The `chat.message.files[]` item, carrying the signed download URL.
    pub fn chat_file(&self) -> ChatFile {
        self.record.to_chat_file(self.download.url.clone())
    }
}

/// Counts returned by [`FileStore::cleanup`](crate::FileStore::cleanup).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Files deleted.
    pub files: usize,
    /// Bytes freed.
    pub bytes: u64,
}

/// Current occupancy of a [`FileStore`](crate::FileStore) (on a shared database: of every replica's
/// files).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreUsage {
    /// Finished files (including expired ones not yet cleaned up).
    pub files: usize,
    /// Bytes of finished files.
    pub bytes: u64,
    /// Uploads in progress.
    pub pending_files: usize,
    /// Bytes written by uploads in progress.
    pub pending_bytes: u64,
}

pub(crate) const NOT_FOUND: TransferError =
    TransferError::FileNotFound("the file does not exist or has expired");
