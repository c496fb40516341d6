//! # xagent-file-transfer
//!
//! The **Transfer Plane** of the xAgent Connector Protocol 3.0: where file bytes travel, since
//! packets only carry references. It sits above `xagent-protocol-types` and below the server
//! runtime, which mounts [`router`] under its Base URL prefix and answers [`ChannelDirectory`].
//!
//! - [`FileStore`]: files written chunk by chunk (never held whole in memory), a TTL, capacity
//!   limits, cleanup, an injected [`Clock`](xagent_protocol_types::Clock). Each `file_ref`
//!   belongs to one channel. Where records and bytes live is a [`FileBackend`]: a directory
//!   (one JSON sidecar of metadata per file, reloaded at start) or, with the feature
//!   `postgres`, a PostgreSQL database shared by replicas (`FileStore::open_postgres`).
//! - [`UrlSigner`]: `download_url`s of the form `/files/refs/{file_ref}?exp=..&sig=..`.
//! - [`router`]: `POST /files/uploads` (xAgent -> Connector) and `GET /files/refs/{file_ref}`
//!   (Connector -> xAgent), with the system API key, the channel header, the size limit, and
//!   `Range` support.
//!
//! ```
//! use xagent_file_transfer::{ChannelDirectory, FileStore, NewFile, StoreConfig, TransferState, UrlSigner};
//! use xagent_protocol_types::{ConnectorChannelId, Secret, SystemClock};
//!
//! /// The runtime's view of its channels (here: exactly one).
//! struct OneChannel(ConnectorChannelId);
//!
//! impl ChannelDirectory for OneChannel {
//!     async fn channel_exists(&self, channel: &ConnectorChannelId) -> bool {
//!         channel == &self.0
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let dir = std::env::temp_dir().join(format!("xagent-file-transfer-doc-{}", std::process::id()));
//! let signer = UrlSigner::new(Secret::new("a server secret of 16+ bytes"))?;
//! let store = FileStore::open(&dir, StoreConfig::default(), signer, SystemClock).await?;
//! let channel = ConnectorChannelId::new("cch_1");
//!
//! // A Connector caches an inbound image and announces it in a chat.message.
//! let stored = store.register_bytes(NewFile::new(channel.clone(), "cat.png"), b"\x89PNG").await?;
//! let item = stored.chat_file();
//! assert!(item.download_url.as_deref().is_some_and(|url| url.starts_with("/files/refs/file_")));
//!
//! // The runtime mounts the Transfer Plane next to its own routes and runs the cleanup.
//! let transfer: axum::Router = TransferState::new(store.clone(), OneChannel(channel))
//!     .with_api_key(Some(Secret::new("the system api key")))
//!     .into_router();
//! let app = axum::Router::new().nest("/connector", transfer);
//! let cleanup = store.spawn_cleanup();
//! # cleanup.abort();
//! # drop(app);
//! # store.remove(&stored.record.file_ref).await?;
//! # let _ = std::fs::remove_dir_all(&dir);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Decisions where the protocol text is silent
//!
//! - **File references** are `file_` + 32 hex digits (128 random bits). Only references of
//!   that exact shape are ever turned into paths.
//! - **TTL** 24 h by default ([`StoreConfig::ttl`]); a file is expired when `now >= expires_at`.
//!   Cleanup runs every [`FileStore::cleanup_period`]: at most 10 minutes and at most TTL/2.
//! - **Capacity**: total bytes (10 GiB) and file count (10,000), counting uploads in
//!   progress. When full, expired files are deleted first; if still full the new file is
//!   refused with 507 `capacity_exceeded`. Unexpired files are never evicted.
//! - **Upload**: 200 with the `UploadResponse` body. The body is limited to the upload limit
//!   (100 MiB) plus 1 MiB of form overhead; the `file` field alone is limited to the upload
//!   limit, checked while streaming. `recipient_ref` and `reply_token` (at most 8 KiB each) are
//!   kept on the record as opaque values and never logged. A missing `file` field, a second
//!   one, or a malformed multipart body is 400 `invalid_arguments`. The MIME type is the
//!   part's `Content-Type`, or a guess from the file name when that is absent or
//!   `application/octet-stream`; `file_type` follows from it. The file name keeps only its
//!   last path component, without control characters, at most 255 bytes.
//! - **Download authorisation**: a valid system API key (`Authorization: Bearer`), or a valid
//!   signature. Order of checks: a wrong key or no credential at all is 401 (with
//!   `WWW-Authenticate: Bearer`); an unknown or expired file is 404 `file_not_found`; a
//!   channel header naming another channel is 403 `forbidden`; a bad or malformed signature
//!   is 403; a genuine signature past its `exp` is 404 (the link is gone, like an expired
//!   file). When no API key is configured, only signatures are accepted.
//! - **Signed URLs** are relative (`/files/refs/...`) unless [`UrlSigner::with_base`] sets a
//!   prefix; they live 15 minutes but never past the file's own expiry. Call
//!   [`FileStore::chat_file`] to mint a fresh one when a message is sent later.
//! - **Ranges**: one `bytes=` range is honoured (206 + `Content-Range`); a range past the
//!   end is 416 with `Content-Range: bytes */size`; several ranges, malformed values, or an
//!   `If-Range` header get the whole file (200).
//! - **Channel removal**: [`FileStore::remove_channel`] deletes the channel's files; an upload
//!   to that channel still in progress is refused when it finishes (404
//!   `connection_not_found`), so no file outlives its channel's removal.
//! - **Limits**: [`TransferState::with_max_upload_bytes`] bounds HTTP uploads and overrides
//!   [`StoreConfig::max_file_bytes`], which bounds files a Connector registers itself.
//! - **Storage directory**: created with mode 0700 (sidecars hold target-system references);
//!   nothing but the store may write in it. Files not named like store files are left alone.
//! - Downloads carry `Content-Disposition: attachment` with an ASCII fallback name and the
//!   exact UTF-8 name in `filename*`, `Cache-Control: private, no-store`,
//!   `X-Content-Type-Options: nosniff` and the sandboxing [`media::DOWNLOAD_CSP`]. Content
//!   types are parsed ([`media::MediaType`]), never compared as whole strings.
//! - **Durability and privacy on disk**: data files and sidecars are created 0600 and every
//!   finished file `fsync`s the directory after its renames.
//! - **On PostgreSQL** (feature `postgres`): bytes in rows of at most 256 KiB, a file visible
//!   once the transaction that completes it commits, the capacity totals checked in the
//!   database (they hold across replicas), an upload idle for
//!   [`StoreConfig::upload_idle_timeout`] taken for a dead replica's and deleted.
//!
//! ## Modules and which way they depend
//!
//! Rows are listed top first: a module imports only its own row and rows below it, and no two
//! files import each other in a circle (`tests/module_layers.rs` checks both).
//!
//! **The store and its HTTP face.**
//!
//! | module | holds |
//! |---|---|
//! | `http` | [`router`], [`TransferState`]: the upload and download handlers |
//! | `store` | [`FileStore`]: the store's operations over a backend |
//! | `pending` | [`NewFile`], [`PendingFile`]: a file being written, and what it shares with its store |
//!
//! **What the store stands on.**
//!
//! | module | holds |
//! |---|---|
//! | `backend` | [`FileBackend`] and its directory and PostgreSQL implementations |
//! | `record` | [`FileRecord`], [`RegisteredFile`], [`CleanupReport`], [`StoreUsage`] |
//! | `config` | [`StoreConfig`], its defaults, the backend's [`backend::Quota`] |
//! | `signer`, `ids`, `media` | signed URLs, `file_ref` syntax, media types |
//! | `error` | [`TransferError`] |

pub mod backend;
mod config;
mod error;
mod http;
mod ids;
pub mod media;
mod pending;
mod record;
mod signer;
mod store;

pub use backend::{FileBackend, FileReader};
pub use config::{
    DEFAULT_CLEANUP_INTERVAL, DEFAULT_FILE_TTL, DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_FILES,
    DEFAULT_MAX_TOTAL_BYTES, DEFAULT_UPLOAD_IDLE_TIMEOUT, StoreConfig,
};
pub use error::TransferError;
pub use http::{ChannelDirectory, DEFAULT_MAX_UPLOAD_BYTES, TransferState, router};
pub use ids::{FILE_REF_PREFIX, is_well_formed as is_well_formed_file_ref, new_file_ref};
pub use pending::{NewFile, PendingFile};
pub use record::{CleanupReport, FileRecord, RegisteredFile, StoreUsage};
pub use signer::{DEFAULT_URL_LIFETIME, MIN_SECRET_BYTES, SignatureError, SignedUrl, UrlSigner};
pub use store::FileStore;
