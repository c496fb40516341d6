//! Transfer Plane wiring (`file-transfer`): the file store under the state directory, the
//! upload and download routes mounted under the Base URL prefix, the channel directory the
//! upload handler asks, and the author's calls to hand files to xAgent or read uploaded ones.
//!
//! Decisions: the URL signing secret is generated once and kept in the storage, so signed
//! links and redelivered messages stay valid across restarts; a redelivered `chat.message`
//! gets freshly signed `download_url`s for files still in the store.

use std::sync::Arc;

use xagent_file_transfer::{ChannelDirectory, FileStore, StoreConfig, TransferState, UrlSigner};
use xagent_protocol_types::{ChatMessage, Secret};

use crate::error::ServerError;
use crate::storage::Storage;

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
) -> Result<FileStore, ServerError> {
    let secret = match storage.load_meta(SIGNING_SECRET_KEY).await? {
        Some(secret) => secret,
        None => {
            let secret = hex::encode(rand::random::<[u8; 32]>());
            storage.commit_meta(SIGNING_SECRET_KEY, &secret).committed().await?;
            secret
        }
    };
    let mut signer = UrlSigner::new(Secret::new(secret))?;
    let base = base_path.trim_end_matches('/');
    if !base.is_empty() {
        signer = signer.with_base(base);
    }
    Ok(FileStore::open(config.dir.clone(), config.store.clone(), signer, clock).await?)
}

/// The upload and download routes over `store`, asking `directory` (the runtime's channel
/// table) whether an upload's channel exists.
pub(crate) fn router(
    store: &FileStore,
    directory: impl ChannelDirectory,
    api_key: Option<Secret>,
    max_upload_bytes: u64,
) -> axum::Router {
    TransferState::new(store.clone(), directory)
        .with_api_key(api_key)
        .with_max_upload_bytes(max_upload_bytes)
        .into_router()
}

/// Re-signs the download URLs of files still in the store (for a redelivery).
pub(crate) fn refresh_urls(store: &FileStore, message: &mut ChatMessage) {
    for file in &mut message.files {
        if let Some(record) = store.get(&file.file_ref) {
            file.download_url = store.chat_file(&record).download_url;
        }
    }
}
