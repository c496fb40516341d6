//! The file source and sink the runtime calls for the bridge: a file the agent names (an inbox
//! resource or a path under an allowed directory) read for an upload, and each inbound file
//! the runtime downloaded kept durably by the inbox (its files directory, or its database).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use xagent_client_runtime::{FileContent, FileSink, FileSource};
use xagent_protocol_types::{ChatFile, ConnectorChannelId};

use crate::files::{AllowedDirs, FileSource as Reference, MAX_UPLOAD_BYTES};
use crate::inbox::Inbox;

/// Largest inbound file the bridge keeps by default (32 MiB, the runtime's default download
/// limit): the runtime stops reading a larger one and refuses it for good
/// ([`xagent_client_runtime::DownloadPolicy`]; `LinkConfig::download` sets another).
pub const MAX_DOWNLOAD_BYTES: u64 = xagent_client_runtime::download::DEFAULT_MAX_DOWNLOAD_BYTES;

/// What the runtime calls to read a file the agent named: an inbox resource or a path under an
/// allowed directory ([`AllowedDirs`]).
pub(crate) struct BridgeFiles {
    pub(crate) allowed: AllowedDirs,
    pub(crate) inbox: Arc<Inbox>,
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl FileSource for BridgeFiles {
    fn open(&self, reference: &str) -> BoxFuture<'_, Result<FileContent, String>> {
        let reference = reference.to_owned();
        Box::pin(async move {
            // Opening, checking and reading a disk file is one blocking step on one handle:
            // the bytes come from the file that was checked, never from a second open by name.
            let allowed = self.allowed.clone();
            let resolved =
                tokio::task::spawn_blocking(move || match allowed.resolve(&reference)? {
                    Reference::Inbox(id) => Ok(Err(id)),
                    Reference::Disk(file) => {
                        let name = file.name.clone();
                        let mime = mime_guess::from_path(&name).first_or_octet_stream().to_string();
                        Ok(Ok(FileContent {
                            filename: name,
                            mime_type: mime,
                            bytes: file.read_all()?,
                        }))
                    }
                })
                .await
                .map_err(|_| "the file could not be read".to_owned())?
                .map_err(|e: crate::files::FileRefError| e.to_string())?;
            let id = match resolved {
                Ok(content) => return Ok(content),
                Err(id) => id,
            };
            let missing = || "no such file resource; see resources/list".to_owned();
            let file = self.inbox.file(&id).await.ok().flatten().ok_or_else(missing)?;
            let too_large = || format!("the file is larger than {MAX_UPLOAD_BYTES} bytes");
            if file.byte_size > MAX_UPLOAD_BYTES {
                return Err(too_large());
            }
            let bytes = self
                .inbox
                .read_file(&file.id)
                .await
                .map_err(|_| "the file cannot be read".to_owned())?
                .ok_or_else(missing)?;
            if bytes.len() as u64 > MAX_UPLOAD_BYTES {
                return Err(too_large());
            }
            Ok(FileContent { filename: file.filename, mime_type: file.mime_type, bytes })
        })
    }
}

/// What the runtime calls with each inbound file it downloaded (under the link's download
/// policy, which also bounds its size): kept by the inbox, durably, before the message reaches
/// the bridge.
impl FileSink for BridgeFiles {
    fn save(
        &self,
        channel: &ConnectorChannelId,
        file: &ChatFile,
        bytes: Vec<u8>,
    ) -> BoxFuture<'_, Result<String, String>> {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(format!("{channel}\n{}", file.file_ref));
        let id = format!("f_{}", hex::encode(&digest[..12]));
        Box::pin(async move {
            let now = xagent_protocol_types::Clock::now_millis(&xagent_protocol_types::SystemClock);
            self.inbox
                .save_file(&id, bytes, now)
                .await
                .map_err(|e| format!("could not keep the file: {e}"))?;
            Ok(id)
        })
    }
}
