//! The bridge's durable inbox: every inbound chat message the bridge accepted, with the files
//! it downloaded for it, on the same backend as the bridge's runtime state.
//!
//! - **SQLite** (the default): `mcp-inbox.sqlite3` and a `files/` directory in the state
//!   directory, both readable only by the owner ([`Inbox::open`]).
//! - **PostgreSQL** (`--database-url`): tables of the runtime's database, every row under the
//!   Connector Card id, file bytes included (`bytea`), so every bridge of one Card sharing the
//!   database shares one inbox and needs no shared disk ([`Inbox::open_postgres`]).
//!
//! The same rules hold on both, checked by one contract suite (`tests/inbox_contract.rs`): a
//! message is acked `accepted` to the Connector only after [`Inbox::store`] committed, so an
//! acked message is never lost; the `(channel, message_id)` key makes a redelivered message
//! land once, also when two bridges store it at the same moment; [`Inbox::take_next`] marks a
//! message handed to the agent in the statement that selects it, so no message is handed
//! twice, across restarts and bridges; a file larger than the inbox's limit is refused.

mod postgres;
mod sqlite;

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use xagent_storage_postgres::{PgError, Pool};

pub use postgres::POSTGRES_COMPONENT;

/// The SQLite inbox's database file in the state directory.
pub const SQLITE_FILE: &str = "mcp-inbox.sqlite3";

/// The SQLite inbox's directory of file bytes in the state directory.
pub const FILES_DIR: &str = "files";

/// How often a waiting `connector_message_wait` looks at a shared (PostgreSQL) inbox again,
/// for a message another bridge stored.
pub const SHARED_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Why the inbox could not do something.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The SQLite database failed.
    #[error("the bridge's inbox database failed: {0}; check the state directory")]
    Database(#[from] rusqlite::Error),
    /// The SQLite inbox could not be opened (its files made private, its tables migrated).
    #[error("the bridge's inbox cannot be opened: {0}")]
    Open(#[from] xagent_storage_sqlite::SqliteError),
    /// The PostgreSQL database failed (the message says what to do; it never holds the
    /// password).
    #[error("the bridge's inbox in PostgreSQL failed: {0}")]
    Postgres(#[from] PgError),
    /// A file's bytes could not be written or read.
    #[error("the file {id} could not be kept: {reason}; check the state directory's disk")]
    File {
        /// The file's id.
        id: String,
        /// Why.
        reason: String,
    },
    /// A file is larger than the inbox keeps.
    #[error(
        "the file {id} has {size} bytes and the inbox keeps files of at most {max} bytes; \
         raise the download limit to keep larger ones"
    )]
    FileTooLarge {
        /// The file's id.
        id: String,
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// A stored row does not decode (written by an incompatible version).
    #[error("a stored message does not decode: {0}")]
    Corrupt(String),
    /// A copy into another inbox found its target already holding messages.
    #[error(
        "the target inbox already holds {0} messages; the inbox is moved only into an empty one"
    )]
    TargetNotEmpty(u64),
}

/// A file that came with an inbound message, kept by the inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFile {
    /// The bridge's id of the file (also in its resource URI).
    pub id: String,
    /// The name the sender gave it.
    pub filename: String,
    /// Its MIME type.
    pub mime_type: String,
    /// Its size in bytes.
    pub byte_size: u64,
}

/// One inbound message as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// Arrival order in this inbox: grows with every stored message (gaps are possible).
    pub seq: i64,
    /// The channel it arrived on (the id the bridge persisted).
    pub channel: String,
    /// The sender's `message_id`.
    pub message_id: String,
    /// Its text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Its files.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub files: Vec<StoredFile>,
    /// When the sender created it (Unix ms), if said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<u64>,
    /// When the bridge stored it (Unix ms).
    pub received_at: u64,
    /// Whether the waiting Tool already handed it to the agent.
    pub taken: bool,
}

/// What [`Inbox::store`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// A new message, with its sequence number.
    New(i64),
    /// The message was already stored (a redelivery); nothing changed.
    Known(i64),
}

/// A new inbound message, before it gets its sequence number.
#[derive(Debug, Clone)]
pub struct NewMessage<'a> {
    /// The channel (persisted id).
    pub channel: &'a str,
    /// The sender's `message_id`.
    pub message_id: &'a str,
    /// Text.
    pub text: Option<&'a str>,
    /// Files whose bytes were saved with [`Inbox::save_file`].
    pub files: &'a [StoredFile],
    /// Sender's creation time.
    pub created_at: Option<u64>,
    /// Now (Unix ms).
    pub received_at: u64,
}

/// What [`Inbox::copy_into`] copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    /// Messages (taken or not).
    pub messages: u64,
    /// Files, with their bytes.
    pub files: u64,
    /// The files' bytes in all.
    pub bytes: u64,
}

enum Backend {
    Sqlite(sqlite::SqliteInbox),
    /// Boxed: the pool is large beside the SQLite connection.
    Postgres(Box<postgres::PostgresInbox>),
}

/// The durable inbox (see the module docs).
pub struct Inbox {
    backend: Backend,
    max_file_bytes: u64,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("Inbox");
        match &self.backend {
            Backend::Sqlite(inbox) => debug.field("sqlite", &inbox.files_dir()),
            Backend::Postgres(inbox) => debug.field("postgres", &inbox.scope()),
        };
        debug.field("max_file_bytes", &self.max_file_bytes).finish()
    }
}

/// Calls the same method on whichever backend the inbox has.
macro_rules! dispatch {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match &$self.backend {
            Backend::Sqlite(inbox) => inbox.$method($($arg),*),
            Backend::Postgres(inbox) => inbox.$method($($arg),*).await,
        }
    };
}

impl Inbox {
    /// Opens (or creates) the SQLite inbox in `state_dir`: `mcp-inbox.sqlite3` and `files/`,
    /// both readable only by the owner; an inbox an older version wrote is read as it is.
    /// Files larger than `max_file_bytes` are refused.
    pub fn open(state_dir: &Path, max_file_bytes: u64) -> Result<Self, InboxError> {
        let backend = Backend::Sqlite(sqlite::SqliteInbox::open(state_dir)?);
        Ok(Self { backend, max_file_bytes })
    }

    /// Opens the PostgreSQL inbox of `scope` (the Connector Card id) over `pool`, applying
    /// its migrations first (a database whose inbox schema is newer than this binary is
    /// refused). Files larger than `max_file_bytes` are refused.
    pub async fn open_postgres(
        pool: Pool,
        scope: &str,
        max_file_bytes: u64,
    ) -> Result<Self, InboxError> {
        let backend =
            Backend::Postgres(Box::new(postgres::PostgresInbox::open(pool, scope).await?));
        Ok(Self { backend, max_file_bytes })
    }

    /// The largest file the inbox keeps, in bytes.
    pub fn max_file_bytes(&self) -> u64 {
        self.max_file_bytes
    }

    /// How often a waiter should look again for a message another process stored: `Some`
    /// for a shared (PostgreSQL) inbox, `None` when only this process stores messages.
    pub fn poll_interval(&self) -> Option<Duration> {
        match self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(_) => Some(SHARED_POLL_INTERVAL),
        }
    }

    /// Keeps a downloaded file's bytes under `id` (replacing bytes kept under it before),
    /// durably before it returns; `now` is Unix ms. A file larger than
    /// [`Inbox::max_file_bytes`] is refused ([`InboxError::FileTooLarge`]).
    pub async fn save_file(&self, id: &str, bytes: Vec<u8>, now: u64) -> Result<(), InboxError> {
        let size = bytes.len() as u64;
        if size > self.max_file_bytes {
            return Err(InboxError::FileTooLarge {
                id: id.to_owned(),
                size,
                max: self.max_file_bytes,
            });
        }
        match &self.backend {
            Backend::Sqlite(inbox) => inbox.save_file(id, bytes).await,
            Backend::Postgres(inbox) => inbox.save_file(id, bytes, now).await,
        }
    }

    /// The size of the bytes kept under `id`, if any.
    pub async fn saved_size(&self, id: &str) -> Result<Option<u64>, InboxError> {
        dispatch!(self.saved_size(id))
    }

    /// The bytes of a file of a stored message, if it (and they) are kept.
    pub async fn read_file(&self, id: &str) -> Result<Option<Vec<u8>>, InboxError> {
        if self.file(id).await?.is_none() {
            return Ok(None);
        }
        match &self.backend {
            Backend::Sqlite(inbox) => inbox.read_file(id).await,
            Backend::Postgres(inbox) => inbox.read_file(id).await,
        }
    }

    /// Stores a message (and its file records) in one transaction, unless a message with the
    /// same `(channel, message_id)` is already stored.
    pub async fn store(&self, message: &NewMessage<'_>) -> Result<Stored, InboxError> {
        dispatch!(self.store(message))
    }

    /// Whether `(channel, message_id)` is stored.
    pub async fn contains(&self, channel: &str, message_id: &str) -> Result<bool, InboxError> {
        dispatch!(self.contains(channel, message_id))
    }

    /// Hands the oldest message not yet handed (on `channel`, or on any channel) to the agent:
    /// selects and marks it in one statement, so it is handed once.
    pub async fn take_next(
        &self,
        channel: Option<&str>,
    ) -> Result<Option<StoredMessage>, InboxError> {
        dispatch!(self.take_next(channel))
    }

    /// The latest `limit` messages of a channel, oldest first (the channel's resource).
    pub async fn recent(
        &self,
        channel: &str,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, InboxError> {
        dispatch!(self.recent(channel, limit))
    }

    /// Forgets messages handed to the agent before `cutoff` (Unix ms), with their files, and
    /// returns how many went. Messages not yet handed are never pruned.
    pub async fn prune_taken(&self, cutoff: u64) -> Result<usize, InboxError> {
        dispatch!(self.prune_taken(cutoff))
    }

    /// Number of messages not yet handed to the agent.
    pub async fn pending(&self, channel: Option<&str>) -> Result<u64, InboxError> {
        dispatch!(self.pending(channel))
    }

    /// Number of stored messages, handed or not.
    pub async fn count(&self) -> Result<u64, InboxError> {
        dispatch!(self.count())
    }

    /// A stored file's record.
    pub async fn file(&self, id: &str) -> Result<Option<StoredFile>, InboxError> {
        dispatch!(self.file(id))
    }

    /// Every stored file, newest first, at most `limit`.
    pub async fn files(&self, limit: usize) -> Result<Vec<StoredFile>, InboxError> {
        dispatch!(self.files(limit))
    }

    /// Every stored message in arrival order (for a copy).
    async fn all(&self) -> Result<Vec<StoredMessage>, InboxError> {
        dispatch!(self.all())
    }

    /// Marks a stored message handed (for a copy of a handed message).
    async fn mark_taken(&self, channel: &str, message_id: &str) -> Result<(), InboxError> {
        dispatch!(self.mark_taken(channel, message_id))
    }

    /// Copies every message of this inbox, in arrival order and with its handed state, and
    /// every file's bytes into `target`, which must hold no message yet. `now` is Unix ms.
    /// Each message commits on its own: a failure leaves the ones before it copied.
    pub async fn copy_into(&self, target: &Inbox, now: u64) -> Result<Copied, InboxError> {
        let held = target.count().await?;
        if held > 0 {
            return Err(InboxError::TargetNotEmpty(held));
        }
        let mut copied = Copied::default();
        for message in self.all().await? {
            for file in &message.files {
                let bytes = match &self.backend {
                    Backend::Sqlite(inbox) => inbox.read_file(&file.id).await?,
                    Backend::Postgres(inbox) => inbox.read_file(&file.id).await?,
                };
                let bytes = bytes.ok_or_else(|| InboxError::File {
                    id: file.id.clone(),
                    reason: format!("its bytes are missing (message {})", message.message_id),
                })?;
                copied.bytes += bytes.len() as u64;
                target.save_file(&file.id, bytes, now).await?;
                copied.files += 1;
            }
            target
                .store(&NewMessage {
                    channel: &message.channel,
                    message_id: &message.message_id,
                    text: message.text.as_deref(),
                    files: &message.files,
                    created_at: message.created_at,
                    received_at: message.received_at,
                })
                .await?;
            if message.taken {
                target.mark_taken(&message.channel, &message.message_id).await?;
            }
            copied.messages += 1;
        }
        Ok(copied)
    }
}

use xagent_storage_sqlite::{to_i64, to_u64};

/// A limit as a SQL `LIMIT`.
fn limit_i64(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn encode_files(files: &[StoredFile]) -> Result<String, InboxError> {
    serde_json::to_string(files).map_err(|e| InboxError::Corrupt(e.to_string()))
}

fn decode_files(files: &str) -> Result<Vec<StoredFile>, InboxError> {
    serde_json::from_str(files).map_err(|e| InboxError::Corrupt(e.to_string()))
}
