//! A file being written ([`PendingFile`]) and what it needs of its store: the backend, the
//! policies, the signer and the clock ([`Shared`]); the cleaning of file names and the choice
//! of MIME type.

use std::sync::Arc;

use bytes::Bytes;
use xagent_protocol_types::{Clock, ConnectorChannelId, FileRef, FileType};

use crate::TransferError;
use crate::backend::{FileBackend, UploadSink};
use crate::config::{StoreConfig, WRITE_CHUNK};
use crate::record::{FileRecord, RegisteredFile};
use crate::signer::{SignedUrl, UrlSigner};

/// Longest stored file name, in bytes.
const MAX_FILENAME_BYTES: usize = 255;

/// What every clone of a [`FileStore`](crate::FileStore) and each of its pending files share.
pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn FileBackend>,
    pub(crate) config: StoreConfig,
    pub(crate) signer: UrlSigner,
    pub(crate) clock: Arc<dyn Clock>,
}

impl Shared {
    /// Now, according to the store's clock (Unix ms).
    pub(crate) fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    /// A fresh signed download URL for a stored, unexpired file.
    pub(crate) fn download_url(&self, record: &FileRecord) -> SignedUrl {
        self.signer.signed_url(
            &record.file_ref,
            &record.connector_channel_id,
            self.now(),
            record.expires_at,
        )
    }
}

/// What a new file is: its channel, name, type and optional target-system references.
#[derive(Clone)]
pub struct NewFile {
    channel: ConnectorChannelId,
    filename: String,
    mime_type: Option<String>,
    recipient_ref: Option<String>,
    reply_token: Option<String>,
    max_bytes: Option<u64>,
}

impl std::fmt::Debug for NewFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewFile")
            .field("channel", &self.channel)
            .field("filename", &self.filename)
            .field("mime_type", &self.mime_type)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl NewFile {
    /// A file for `channel` named `filename` (path components and control characters are
    /// removed; an empty name becomes `file`).
    pub fn new(channel: ConnectorChannelId, filename: impl AsRef<str>) -> Self {
        Self {
            channel,
            filename: clean_filename(filename.as_ref()),
            mime_type: None,
            recipient_ref: None,
            reply_token: None,
            max_bytes: None,
        }
    }

    /// Declares the MIME type; without it (or with `application/octet-stream`) the type is
    /// guessed from the file name's extension.
    #[must_use]
    pub fn with_mime_type(mut self, mime: impl Into<String>) -> Self {
        self.mime_type = Some(mime.into());
        self
    }

    /// Keeps a target-system recipient reference on the record.
    #[must_use]
    pub fn with_recipient_ref(mut self, value: impl Into<String>) -> Self {
        self.recipient_ref = Some(value.into());
        self
    }

    /// Keeps a target-system reply reference on the record.
    #[must_use]
    pub fn with_reply_token(mut self, value: impl Into<String>) -> Self {
        self.reply_token = Some(value.into());
        self
    }

    /// Overrides the store's per-file size limit for this file.
    #[must_use]
    pub fn with_max_bytes(mut self, limit: u64) -> Self {
        self.max_bytes = Some(limit);
        self
    }
}

/// Gathers small streamed chunks into pieces of [`WRITE_CHUNK`] bytes, so a backend that
/// reserves capacity per write (a database round trip) sees few, bounded writes.
#[derive(Default)]
pub(crate) struct Gather {
    buffer: Vec<u8>,
}

impl Gather {
    /// Adds `chunk`, writing a full piece whenever one is ready.
    pub(crate) async fn write(
        &mut self,
        pending: &mut PendingFile,
        mut chunk: &[u8],
    ) -> Result<(), TransferError> {
        // A write past the per-file limit is refused now, not once the piece is full.
        let buffered = self.buffer.len() as u64;
        if pending.written.saturating_add(buffered).saturating_add(chunk.len() as u64)
            > pending.limit
        {
            return Err(TransferError::TooLarge { limit: pending.limit });
        }
        while !chunk.is_empty() {
            let room = WRITE_CHUNK - self.buffer.len();
            let (now, later) = chunk.split_at(room.min(chunk.len()));
            if self.buffer.is_empty() && now.len() == WRITE_CHUNK {
                pending.write(now).await?;
            } else {
                self.buffer.extend_from_slice(now);
                if self.buffer.len() == WRITE_CHUNK {
                    self.flush(pending).await?;
                }
            }
            chunk = later;
        }
        Ok(())
    }

    /// Writes what is gathered.
    pub(crate) async fn flush(&mut self, pending: &mut PendingFile) -> Result<(), TransferError> {
        if !self.buffer.is_empty() {
            pending.write(&self.buffer).await?;
            self.buffer.clear();
        }
        Ok(())
    }
}

/// A file being written. Dropping it before [`PendingFile::finish`] deletes what was written
/// and releases its share of the store's capacity.
pub struct PendingFile {
    shared: Arc<Shared>,
    file_ref: FileRef,
    new_file: NewFile,
    sink: Option<Box<dyn UploadSink>>,
    limit: u64,
    written: u64,
    /// The record of a file copied from another store, kept as it was.
    imported: Option<FileRecord>,
}

impl std::fmt::Debug for PendingFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFile")
            .field("file_ref", &self.file_ref)
            .field("new_file", &self.new_file)
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

impl PendingFile {
    /// Starts `file_ref` on the backend, limited by the file's own or the store's size limit.
    pub(crate) async fn begin(
        shared: Arc<Shared>,
        file_ref: FileRef,
        new_file: NewFile,
        imported: Option<FileRecord>,
    ) -> Result<Self, TransferError> {
        let sink = shared.backend.begin(&file_ref, &new_file.channel, shared.now()).await?;
        Ok(Self {
            limit: new_file.max_bytes.unwrap_or(shared.config.max_file_bytes),
            shared,
            file_ref,
            new_file,
            sink: Some(sink),
            written: 0,
            imported,
        })
    }

    /// The reference the file will have.
    pub fn file_ref(&self) -> &FileRef {
        &self.file_ref
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Sets the target-system recipient reference (an upload form field may come after the
    /// file itself).
    pub fn set_recipient_ref(&mut self, value: Option<String>) {
        self.new_file.recipient_ref = value;
    }

    /// Sets the target-system reply reference.
    pub fn set_reply_token(&mut self, value: Option<String>) {
        self.new_file.reply_token = value;
    }

    /// Appends a chunk. Fails with [`TransferError::TooLarge`] past the per-file limit and with
    /// [`TransferError::CapacityExceeded`] when the store is full; neither keeps any of the
    /// chunk, so a smaller one may follow. After any other error the file is unusable.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), TransferError> {
        if chunk.is_empty() {
            return Ok(());
        }
        let len = chunk.len() as u64;
        if self.written.saturating_add(len) > self.limit {
            return Err(TransferError::TooLarge { limit: self.limit });
        }
        let now = self.shared.now();
        let sink =
            self.sink.as_mut().ok_or_else(|| std::io::Error::other("pending file closed"))?;
        match sink.write(chunk, now).await {
            Ok(()) => {
                self.written += len;
                Ok(())
            }
            Err(TransferError::CapacityExceeded) => Err(TransferError::CapacityExceeded),
            Err(error) => {
                // The backend may have kept part of the chunk: the file is unusable.
                self.sink = None;
                Err(error)
            }
        }
    }

    /// Appends an owned chunk; see [`PendingFile::write`].
    pub async fn write_bytes(&mut self, chunk: Bytes) -> Result<(), TransferError> {
        self.write(&chunk).await
    }

    /// Makes the file durable and visible, and returns it with a signed download URL.
    pub async fn finish(mut self) -> Result<RegisteredFile, TransferError> {
        let sink = self.sink.take().ok_or_else(|| std::io::Error::other("pending file closed"))?;
        let shared = self.shared.clone();
        let now = shared.now();
        let ttl = u64::try_from(shared.config.ttl.as_millis()).unwrap_or(u64::MAX);
        if let Some(record) = self.imported.take() {
            if record.byte_size != self.written {
                return Err(TransferError::Io(std::io::Error::other(
                    "a copied file's size does not match its record",
                )));
            }
            sink.finish(&record).await?;
            let download = shared.download_url(&record);
            return Ok(RegisteredFile { record, download });
        }
        let mime_type = resolve_mime(self.new_file.mime_type.as_deref(), &self.new_file.filename);
        let record = FileRecord {
            file_ref: self.file_ref.clone(),
            connector_channel_id: self.new_file.channel.clone(),
            filename: self.new_file.filename.clone(),
            file_type: FileType::from_mime(&mime_type),
            mime_type,
            byte_size: self.written,
            created_at: now,
            expires_at: now.saturating_add(ttl),
            recipient_ref: self.new_file.recipient_ref.take(),
            reply_token: self.new_file.reply_token.take(),
        };
        sink.finish(&record).await?;
        let download = shared.download_url(&record);
        Ok(RegisteredFile { record, download })
    }
}

/// Keeps only the last path component, drops control characters, bounds the length.
fn clean_filename(raw: &str) -> String {
    let last = raw.rsplit(['/', '\\']).next().unwrap_or_default();
    let cleaned: String = last.chars().filter(|c| !c.is_control()).collect();
    let trimmed = cleaned.trim();
    if trimmed.is_empty() || trimmed == "." || trimmed == ".." {
        return "file".to_owned();
    }
    let mut end = trimmed.len().min(MAX_FILENAME_BYTES);
    while !trimmed.is_char_boundary(end) {
        end -= 1;
    }
    trimmed[..end].to_owned()
}

/// The declared MIME type when it is usable and specific, else a guess from the extension.
pub(crate) fn resolve_mime(declared: Option<&str>, filename: &str) -> String {
    let declared = declared.map(str::trim).filter(|mime| {
        !mime.is_empty()
            && mime.len() <= 255
            && mime.contains('/')
            && mime.bytes().all(|b| (0x20..0x7f).contains(&b))
            && !mime.eq_ignore_ascii_case("application/octet-stream")
    });
    match declared {
        Some(mime) => mime.to_owned(),
        None => mime_guess::from_path(filename)
            .first()
            .map(|mime| mime.essence_str().to_owned())
            .unwrap_or_else(|| "application/octet-stream".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::FileRecord;
    use xagent_protocol_types::FileType;

    fn channel(name: &str) -> ConnectorChannelId {
        ConnectorChannelId::new(name)
    }

    #[test]
    fn debug_of_a_record_redacts_target_system_references() {
        let record = FileRecord {
            file_ref: FileRef::new("file_x"),
            connector_channel_id: channel("c"),
            filename: "f".into(),
            mime_type: "text/plain".into(),
            file_type: FileType::File,
            byte_size: 1,
            created_at: 0,
            expires_at: 1,
            recipient_ref: Some("wxid_secretish".into()),
            reply_token: Some("ctx-token".into()),
        };
        let text = format!("{record:?}");
        assert!(!text.contains("wxid_secretish") && !text.contains("ctx-token"), "{text}");
        let new_file = NewFile::new(channel("c"), "f").with_reply_token("ctx-token");
        assert!(!format!("{new_file:?}").contains("ctx-token"));
    }

    #[test]
    fn filenames_are_reduced_to_a_safe_last_component() {
        assert_eq!(clean_filename("../../etc/passwd"), "passwd");
        assert_eq!(clean_filename("C:\\Users\\me\\report.pdf"), "report.pdf");
        assert_eq!(clean_filename("a\u{0}b\nc.txt"), "abc.txt");
        assert_eq!(clean_filename(""), "file");
        assert_eq!(clean_filename(".."), "file");
        assert_eq!(clean_filename("dir/"), "file");
        let long = "é".repeat(200);
        let cleaned = clean_filename(&long);
        assert!(cleaned.len() <= MAX_FILENAME_BYTES && cleaned.chars().all(|c| c == 'é'));
    }

    #[test]
    fn mime_type_comes_from_the_declaration_or_the_extension() {
        assert_eq!(resolve_mime(Some("image/webp"), "x.bin"), "image/webp");
        assert_eq!(resolve_mime(Some("application/octet-stream"), "clip.mp4"), "video/mp4");
        assert_eq!(resolve_mime(None, "song.mp3"), "audio/mpeg");
        assert_eq!(resolve_mime(Some("garbage"), "noext"), "application/octet-stream");
        assert_eq!(resolve_mime(Some("text/plain\r\nX: y"), "a.txt"), "text/plain");
    }
}
