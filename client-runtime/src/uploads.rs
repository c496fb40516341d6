//! Outbound files: what this client uploaded on which channel, and until when.
//!
//! A Connector binds every `file_ref` to the channel it was uploaded on and owns its expiry
//! (protocol 5.1); an assistant message may carry only `file_ref`s uploaded on its own channel
//! (IM v2, section 5). [`crate::DataPlane::upload_message_file`] uploads on the message's
//! channel and records the answer here; [`crate::DataPlane::send_chat_message`] refuses a
//! message whose files are not recorded for its channel or have expired, before anything is
//! queued. Tool upload-reference arguments are uploaded through the same path and recorded
//! too.

use std::collections::HashMap;

use xagent_protocol_types::{ChatFile, ConnectorChannelId, FileRef, UploadResponse};

use crate::error::OutboundFileError;

/// Most uploads remembered at once; expired ones go first, then the one expiring soonest.
pub(crate) const MAX_RECORDED_UPLOADS: usize = 100_000;

#[derive(Debug, Clone)]
struct Upload {
    channel: ConnectorChannelId,
    expires_at: u64,
}

/// The `file_ref`s this client uploaded: channel and expiry of each, bounded.
#[derive(Debug)]
pub(crate) struct UploadLedger {
    uploads: HashMap<FileRef, Upload>,
    capacity: usize,
}

impl Default for UploadLedger {
    fn default() -> Self {
        Self::with_capacity(MAX_RECORDED_UPLOADS)
    }
}

impl UploadLedger {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self { uploads: HashMap::new(), capacity: capacity.max(1) }
    }

    /// Records an upload answer for `channel`, forgetting expired uploads first and, when
    /// still full, the one that expires soonest.
    pub(crate) fn record(
        &mut self,
        channel: &ConnectorChannelId,
        answer: &UploadResponse,
        now: u64,
    ) {
        if self.uploads.len() >= self.capacity {
            self.uploads.retain(|_, upload| upload.expires_at > now);
        }
        if self.uploads.len() >= self.capacity
            && let Some(soonest) = self
                .uploads
                .iter()
                .min_by_key(|(_, upload)| upload.expires_at)
                .map(|(file_ref, _)| file_ref.clone())
        {
            self.uploads.remove(&soonest);
        }
        self.uploads.insert(
            answer.file_ref.clone(),
            Upload { channel: channel.clone(), expires_at: answer.expires_at },
        );
    }

    /// Every file of a message on `channel` must be an upload of this client on that channel
    /// that has not expired at `now`.
    pub(crate) fn check(
        &self,
        channel: &ConnectorChannelId,
        files: &[ChatFile],
        now: u64,
    ) -> Result<(), OutboundFileError> {
        for file in files {
            let Some(upload) = self.uploads.get(&file.file_ref) else {
                return Err(OutboundFileError::NotUploaded {
                    file_ref: file.file_ref.clone(),
                    channel: channel.clone(),
                });
            };
            if &upload.channel != channel {
                return Err(OutboundFileError::OtherChannel {
                    file_ref: file.file_ref.clone(),
                    channel: channel.clone(),
                });
            }
            if upload.expires_at <= now {
                return Err(OutboundFileError::Expired {
                    file_ref: file.file_ref.clone(),
                    expired_at: upload.expires_at,
                });
            }
        }
        Ok(())
    }

    /// Forgets every upload: the Connector instance they were made on is gone.
    pub(crate) fn clear(&mut self) {
        self.uploads.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.uploads.len()
    }
}

/// The file item of an assistant message for an upload answer: its type and `file_ref`, with
/// the metadata the Connector returned (no `download_url`: not used in this direction).
pub(crate) fn message_file(answer: &UploadResponse, mime_type: &str) -> ChatFile {
    ChatFile::new(answer.file_type.clone(), answer.file_ref.clone())
        .with_filename(answer.filename.clone())
        .with_mime_type(mime_type)
        .with_byte_size(answer.byte_size)
        .with_expires_at(answer.expires_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::{ErrorCode, FileType};

    fn answer(file_ref: &str, expires_at: u64) -> UploadResponse {
        UploadResponse::new(file_ref.into(), FileType::File, "a.txt".into(), 2, expires_at)
    }

    fn file(file_ref: &str) -> ChatFile {
        ChatFile::new(FileType::File, file_ref)
    }

    #[test]
    fn outbound_file_rule_only_this_channels_unexpired_uploads_pass() {
        let (a, b) = (ConnectorChannelId::new("cch_a"), ConnectorChannelId::new("cch_b"));
        let mut ledger = UploadLedger::default();
        ledger.record(&a, &answer("file_1", 2_000), 1_000);
        assert_eq!(ledger.check(&a, &[file("file_1")], 1_500), Ok(()));
        let other = ledger.check(&b, &[file("file_1")], 1_500).expect_err("other channel");
        assert_eq!(other.code(), ErrorCode::Forbidden);
        assert!(!other.to_string().contains("cch_a"), "the other channel is not named: {other}");
        let unknown = ledger.check(&a, &[file("file_x")], 1_500).expect_err("never uploaded");
        assert_eq!(unknown.code(), ErrorCode::FileNotFound);
        let expired = ledger.check(&a, &[file("file_1")], 2_000).expect_err("expired");
        assert_eq!(
            expired,
            OutboundFileError::Expired { file_ref: "file_1".into(), expired_at: 2_000 }
        );
    }

    #[test]
    fn outbound_file_rule_the_ledger_is_bounded_and_drops_expired_uploads_first() {
        let a = ConnectorChannelId::new("cch_a");
        let mut ledger = UploadLedger::with_capacity(2);
        ledger.record(&a, &answer("file_old", 1_100), 1_000);
        ledger.record(&a, &answer("file_keep", 9_000), 1_000);
        ledger.record(&a, &answer("file_new", 9_500), 1_200);
        assert_eq!(ledger.len(), 2);
        assert!(ledger.check(&a, &[file("file_keep"), file("file_new")], 1_300).is_ok());
        ledger.record(&a, &answer("file_newer", 9_900), 1_300);
        assert_eq!(ledger.len(), 2, "full of live uploads: the one expiring soonest leaves");
        assert!(ledger.check(&a, &[file("file_keep")], 1_300).is_err());
    }
}
