//! Transfer Plane wiring (`file-transfer`): the file store under the state directory, the
//! upload and download routes mounted under the Base URL prefix, the channel directory the
//! upload handler asks, and the author's calls to hand files to xAgent or read uploaded ones.
//!
//! Decisions: the URL signing secret is generated once and kept in the storage, so signed
//! links and redelivered messages stay valid across restarts; a redelivered `chat.message`
//! gets freshly signed `download_url`s for files still in the store. When the runtime's state
//! is in PostgreSQL ([`ServerBuilder::database_url`](crate::ServerBuilder)), the files and
//! their bytes are too (`file-transfer`'s PostgreSQL backend, its own pool), and so is the
//! signing secret, so every replica serves every file and accepts every replica's links.

use std::sync::Arc;

use xagent_file_transfer::{ChannelDirectory, FileStore, StoreConfig, TransferState, UrlSigner};
use xagent_protocol_types::{ChatMessage, Secret};

use crate::error::ServerError;
use crate::storage::Storage;

/// Configuration of the Transfer Plane.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FilesConfig {
    /// Where files live (default: `<state dir>/files`); unused when the runtime's state is in
    /// PostgreSQL, where the files are too.
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

/// The signer of this runtime's download URLs (under the Base URL path) with `secret`.
fn signer(secret: String, base_path: &str) -> Result<UrlSigner, ServerError> {
    let mut signer = UrlSigner::new(Secret::new(secret))?;
    let base = base_path.trim_end_matches('/');
    if !base.is_empty() {
        signer = signer.with_base(base);
    }
    Ok(signer)
}

/// A fresh URL signing secret (kept only if none is stored yet).
fn new_secret() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// The store in the directory [`FilesConfig::dir`], its signing secret in the runtime's storage.
pub(crate) async fn open_store(
    config: &FilesConfig,
    base_path: &str,
    storage: &dyn Storage,
    clock: Arc<dyn xagent_protocol_types::Clock>,
) -> Result<FileStore, ServerError> {
    let secret = match storage.load_meta(SIGNING_SECRET_KEY).await? {
        Some(secret) => secret,
        None => {
            let secret = new_secret();
            storage.commit_meta(SIGNING_SECRET_KEY, &secret).committed().await?;
            secret
        }
    };
    let signer = signer(secret, base_path)?;
    Ok(FileStore::open(config.dir.clone(), config.store.clone(), signer, clock).await?)
}

/// The store in the PostgreSQL database at `url` (the runtime's), on a pool of its own, with
/// the signing secret every replica shares.
#[cfg(feature = "postgres")]
pub(crate) async fn open_database_store(
    config: &FilesConfig,
    url: &crate::DatabaseUrl,
    base_path: &str,
    clock: Arc<dyn xagent_protocol_types::Clock>,
) -> Result<FileStore, ServerError> {
    use xagent_file_transfer::TransferError;
    use xagent_file_transfer::backend::PostgresBackend;
    let options = xagent_storage_postgres::PoolOptions::default()
        .with_max_size(FILES_POOL_SIZE)
        .with_application_name("xagent-connector files");
    let pool = xagent_storage_postgres::connect(url, options).await.map_err(TransferError::from)?;
    let backend = PostgresBackend::open(pool, &config.store, clock.now_millis()).await?;
    // Replicas starting at once agree on the first secret stored.
    let signer = signer(backend.signing_secret(&new_secret()).await?, base_path)?;
    tracing::info!(database = %url, "Transfer Plane files in PostgreSQL");
    Ok(FileStore::with_backend(Arc::new(backend), config.store.clone(), signer, clock))
}

/// Connections of the Transfer Plane's own pool (uploads and downloads, apart from the
/// runtime's group-commit writer).
#[cfg(feature = "postgres")]
const FILES_POOL_SIZE: usize = 8;

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

/// Re-signs the download URLs of files still in the store (for a redelivery). A file the
/// store cannot look up keeps the URL it had (logged).
pub(crate) async fn refresh_urls(store: &FileStore, message: &mut ChatMessage) {
    for file in &mut message.files {
        match store.get(&file.file_ref).await {
            Ok(Some(record)) => file.download_url = store.chat_file(&record).download_url,
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "could not re-sign a file's download URL"),
        }
    }
}
