//! Transfer Plane wiring (`file-transfer`): the file store under the state directory, the
//! upload and download routes mounted under the Base URL prefix, the channel directory the
//! upload handler asks, and the author's calls to hand files to xAgent or read uploaded ones.
//!
//! Decisions: the URL signing secret is generated once and kept in the storage, so signed
//! links and redelivered messages stay valid across restarts; a redelivered `chat.message`
//! gets freshly signed `download_url`s for files still in the store.

use std::sync::{Arc, Weak};

use xagent_file_transfer::{
    ChannelDirectory, FileStore, NewFile, StoreConfig, TransferState, UrlSigner,
};
use xagent_protocol_types::{ChatFile, ChatMessage, ConnectorChannelId, FileRef, Secret};

use crate::runtime::{ConnectorHandle, HandleError, Shared};
use crate::storage::{Storage, StorageError};

/// Configuration of the Transfer Plane.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FilesConfig {
    /// Where files live (default: `<state dir>/files`).
    pub dir: std::path::PathBuf,
    /// TTL, capacity and cleanup policy (`file-transfer` defaults: 24 h, 10 GiB, 10,000 files).
    pub store: StoreConfig,
    /// Largest accepted upload (default 100 MiB).
    pub max_upload_bytes: u64,
}

impl FilesConfig {
    /// Files in `dir` with the default policy.
    pub fn new(dir: impl Into<std::path::PathBuf>) -> Self {
        Self { dir: dir.into(), store: StoreConfig::default(), max_upload_bytes: 100 * 1024 * 1024 }
    }

    /// Sets the upload limit.
    #[must_use]
    pub fn with_max_upload_bytes(mut self, limit: u64) -> Self {
        self.max_upload_bytes = limit;
        self
    }

    /// Sets the store policy.
    #[must_use]
    pub fn with_store(mut self, store: StoreConfig) -> Self {
        self.store = store;
        self
    }
}

const SIGNING_SECRET_KEY: &str = "url_signing_secret";

pub(crate) async fn open_store(
    config: &FilesConfig,
    base_path: &str,
    storage: &dyn Storage,
    clock: Arc<dyn xagent_protocol_types::Clock>,
) -> Result<FileStore, StorageError> {
    let secret = match storage.load_meta(SIGNING_SECRET_KEY)? {
        Some(secret) => secret,
        None => {
            let secret = hex::encode(rand::random::<[u8; 32]>());
            storage.save_meta(SIGNING_SECRET_KEY, &secret)?;
            secret
        }
    };
    let fail = |e: &dyn std::fmt::Display| StorageError {
        operation: "open file store",
        reason: e.to_string(),
    };
    let mut signer = UrlSigner::new(Secret::new(secret)).map_err(|e| fail(&e))?;
    let base = base_path.trim_end_matches('/');
    if !base.is_empty() {
        signer = signer.with_base(base);
    }
    FileStore::open(config.dir.clone(), config.store.clone(), signer, clock)
        .await
        .map_err(|e| fail(&e))
}

/// The runtime's channel table as `file-transfer` sees it.
struct Directory(Weak<Shared>);

impl ChannelDirectory for Directory {
    async fn channel_exists(&self, channel: &ConnectorChannelId) -> bool {
        self.0.upgrade().is_some_and(|shared| shared.state().channels.contains_key(channel))
    }
}

pub(crate) fn router(shared: &Arc<Shared>) -> Option<axum::Router> {
    let store = shared.files.as_ref()?;
    let state = TransferState::new(store.clone(), Directory(Arc::downgrade(shared)))
        .with_api_key(shared.api_key.clone())
        .with_max_upload_bytes(shared.files_upload_limit);
    Some(state.into_router())
}

/// Re-signs the download URLs of files still in the store (for a redelivery).
pub(crate) fn refresh_urls(store: &FileStore, message: &mut ChatMessage) {
    for file in &mut message.files {
        if let Some(record) = store.get(&file.file_ref) {
            file.download_url = store.chat_file(&record).download_url;
        }
    }
}

impl crate::ConnectorServer {
    /// Starts the Transfer Plane's periodic cleanup (expired files), for authors who serve
    /// [`crate::ConnectorServer::router`] with routes of their own instead of calling
    /// [`crate::ConnectorServer::serve`] (which starts it itself). `None` without a file store.
    pub fn spawn_file_cleanup(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.shared.files.as_ref().map(|files| files.spawn_cleanup())
    }
}

impl ConnectorHandle {
    fn store(&self) -> Result<&FileStore, HandleError> {
        self.0
            .files
            .as_ref()
            .ok_or_else(|| HandleError::File("the Transfer Plane is not enabled".into()))
    }

    /// Caches an inbound file from the target system for `channel` and returns the
    /// `chat.message.files[]` item with a signed `download_url` (put it in a message sent with
    /// [`ConnectorHandle::send_message`]).
    pub async fn register_file(
        &self,
        channel: &ConnectorChannelId,
        filename: &str,
        mime_type: Option<&str>,
        bytes: impl AsRef<[u8]>,
    ) -> Result<ChatFile, HandleError> {
        if !self.0.state().channels.contains_key(channel) {
            return Err(HandleError::UnknownChannel(channel.clone()));
        }
        let mut new_file = NewFile::new(channel.clone(), filename);
        if let Some(mime) = mime_type {
            new_file = new_file.with_mime_type(mime);
        }
        let stored = self
            .store()?
            .register_bytes(new_file, bytes)
            .await
            .map_err(|e| HandleError::File(e.to_string()))?;
        Ok(stored.chat_file())
    }

    /// Opens a file xAgent uploaded for `channel` (a `file_ref` from an outbound
    /// `chat.message`); a reference of another channel is refused.
    pub async fn open_file(
        &self,
        channel: &ConnectorChannelId,
        file_ref: &FileRef,
    ) -> Result<(xagent_file_transfer::FileRecord, tokio::fs::File), HandleError> {
        let (record, file) = self
            .store()?
            .open_file(file_ref)
            .await
            .map_err(|e| HandleError::File(e.to_string()))?;
        if &record.connector_channel_id != channel {
            return Err(HandleError::File("the file belongs to another channel".into()));
        }
        Ok((record, file))
    }
}
