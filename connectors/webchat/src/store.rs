//! The Connector's own state in embedded SQLite (`<state dir>/webchat.sqlite3`, WAL): rooms
//! with their hashed access code and bound channel, visitor sessions (hashed tokens) and the
//! upload quota. The conversation of every room lives in the runtime's storage
//! (`messages.rs`); the `messages` table here only holds what an older version stored, until
//! it is moved at start. The protocol runtime keeps its own database beside it
//! (`connector.sqlite3`), or PostgreSQL.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use xagent_protocol_types::ConnectorChannelId;

use crate::error::WebchatError;
use xagent_server_runtime::StorageError;

/// File name of the Connector's database inside the state directory.
pub const WEBCHAT_DATABASE_FILE: &str = "webchat.sqlite3";

/// How many messages a page gets when it (re)connects.
pub const HISTORY_LIMIT: usize = 200;

/// Shortest access code a new room accepts (existing rooms keep theirs).
pub const MIN_ACCESS_CODE_CHARS: usize = 8;

/// One day in ms: the window of the visitor upload quotas.
pub(crate) const DAY_MILLIS: u64 = 24 * 60 * 60 * 1_000;

/// What visitors uploaded within the last day: one room's share and everybody's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadUsage {
    /// Bytes uploaded to this room.
    pub room_bytes: u64,
    /// Files uploaded to this room.
    pub room_files: u64,
    /// Bytes uploaded by all visitors.
    pub all_bytes: u64,
    /// Files uploaded by all visitors.
    pub all_files: u64,
}

/// Bytes and a file of the day's visitor quota held for one upload (see
/// [`Store::reserve_upload`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UploadReservation {
    /// The reservation's row.
    pub id: i64,
    /// Bytes reserved: the most the upload may store.
    pub bytes: u64,
}

/// Whose daily upload allowance is used up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaRefusal {
    /// The room's (its own limits or its share of everybody's).
    Room,
    /// All visitors' together.
    Everybody,
}

/// Who wrote a message in a room.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Author {
    /// The person on the page.
    Visitor,
    /// The xAgent agent.
    Assistant,
}

/// Where a message stands, as the page shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryStatus {
    /// A visitor message the Connector holds until xAgent acknowledges it.
    Sending,
    /// xAgent acknowledged the visitor message (`accepted` or `duplicate`).
    Delivered,
    /// xAgent rejected it for good; `error` says why.
    Rejected,
    /// Its pending time ran out before xAgent took it.
    Expired,
    /// An agent message shown in the room.
    Shown,
}

impl EntryStatus {
    #[cfg(test)]
    fn as_str(self) -> &'static str {
        match self {
            Self::Sending => "sending",
            Self::Delivered => "delivered",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
            Self::Shown => "shown",
        }
    }

    fn parse(text: &str) -> Self {
        match text {
            "delivered" => Self::Delivered,
            "rejected" => Self::Rejected,
            "expired" => Self::Expired,
            "shown" => Self::Shown,
            _ => Self::Sending,
        }
    }
}

/// A file attached to a message, as the page links it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryFile {
    /// The Transfer Plane reference (served to the page under the room).
    pub file_ref: String,
    /// Display name.
    pub filename: String,
    /// MIME type, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Size in bytes, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub byte_size: Option<u64>,
}

/// One message of a room's conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatEntry {
    /// The IM v2 `message_id`.
    pub message_id: String,
    /// Who wrote it.
    pub author: Author,
    /// Its text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Its files.
    pub files: Vec<EntryFile>,
    /// Delivery state.
    pub status: EntryStatus,
    /// Why xAgent rejected it (visitor messages).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The page's own id for the send (repeats of a send return the same message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Unix ms.
    pub created_at: u64,
}

/// A chat room.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Room {
    /// URL-safe id (derived from the name).
    pub room_id: String,
    /// The name as typed.
    pub name: String,
    /// The channel serving the room, while one is signed in.
    pub channel: Option<ConnectorChannelId>,
}

/// Result of binding a room name with an access code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoomClaim {
    /// A new room was created with this code.
    Created(Room),
    /// The room exists and the code is right.
    Matched(Room),
    /// The room exists with another code.
    WrongCode,
}

/// Result of an xAgent channel signing in to a room with the form flow (M9: the visitors'
/// access code alone never moves a room that another channel serves).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignIn {
    /// A new room was created (with the owner code, when one was given).
    Created(Room),
    /// The channel may serve the room.
    Matched(Room),
    /// The owner changed the access code: every visitor session of the room was revoked.
    Rotated {
        /// The room.
        room: Room,
        /// Visitor sessions ended.
        revoked: usize,
    },
    /// The access code is wrong.
    WrongCode,
    /// The owner code is wrong.
    WrongOwner,
    /// Another channel serves the room, or the room has an owner code: only the owner code
    /// moves it. A room without an owner code stays with the channel holding it (F7).
    OwnerRequired,
    /// A new room needs an owner code (F7).
    OwnerCodeNeeded,
}

/// A valid visitor session: its room and when it ends (Unix ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisitorSession {
    /// The room it opens.
    pub room_id: String,
    /// When it expires, unless revoked earlier.
    pub expires_at: u64,
}

/// Whether an insert created a message or found the earlier one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// New.
    New(ChatEntry),
    /// A repeat (same `client_id` or `message_id`): the stored message.
    Existing(ChatEntry),
}

/// A message an older version kept in `webchat.sqlite3`: its room, its order number, the
/// message, and the `chat.message` kept while it was sending.
pub(crate) type LegacyMessage = (String, i64, ChatEntry, Option<String>);

/// The SQLite store.
pub struct Store {
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

fn db(error: rusqlite::Error) -> WebchatError {
    WebchatError::Storage(StorageError::new("a webchat database query", error))
}

/// Turns a room name into its id: lower-case ASCII letters and digits, other runs become `-`.
/// `None` when nothing usable is left or the name is longer than 64 characters.
pub fn room_id_from_name(name: &str) -> Option<String> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 64 {
        return None;
    }
    let mut id = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            id.push(c.to_ascii_lowercase());
        } else if !id.ends_with('-') && !id.is_empty() {
            id.push('-');
        }
    }
    let id = id.trim_end_matches('-').to_owned();
    if id.is_empty() { None } else { Some(id) }
}

fn hash_code(salt: &str, code: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(salt.as_bytes());
    hasher.update([0u8]);
    hasher.update(code.as_bytes());
    hex::encode(hasher.finalize())
}

/// Whether `code` hashed with `salt` is the stored `hash`, compared in constant time.
fn code_matches(salt: &str, code: &str, hash: &str) -> bool {
    bool::from(hash_code(salt, code).as_bytes().ct_eq(hash.as_bytes()))
}

/// A fresh salt and the hash of `code` with it: how every code is stored.
fn salted_hash(code: &str) -> (String, String) {
    let salt = random_hex(16);
    let hash = hash_code(&salt, code);
    (salt, hash)
}

/// The id of the room `name`, or the error that tells the user what a room name needs.
fn room_id_or_error(name: &str) -> Result<String, WebchatError> {
    room_id_from_name(name).ok_or_else(|| {
        WebchatError::InvalidInput(
            "the room name needs 1-64 characters with at least one letter or digit".into(),
        )
    })
}

/// A room's stored row, as both sign-in paths read it.
struct RoomRow {
    name: String,
    code_salt: String,
    code_hash: String,
    channel: Option<String>,
    /// The owner code's salt and hash, when the room has one.
    owner: Option<(String, String)>,
    /// The channel that holds the room (F7): the one that created, paired or last moved it,
    /// kept when it signs out.
    holder: Option<String>,
}

impl RoomRow {
    fn room(self, room_id: String) -> Room {
        Room { room_id, name: self.name, channel: self.channel.map(ConnectorChannelId::new) }
    }
}

/// Deletes at most `batch` expired and at most `batch` revoked visitor sessions, both found
/// through their index (F12: never a scan of the whole table). Returns how many went.
fn prune_sessions(conn: &Connection, now: u64, batch: usize) -> Result<usize, WebchatError> {
    let batch = i64::try_from(batch).unwrap_or(i64::MAX);
    let expired = conn
        .execute(PRUNE_EXPIRED_SQL, params![i64::try_from(now).unwrap_or(i64::MAX), batch])
        .map_err(db)?;
    let revoked = conn.execute(PRUNE_REVOKED_SQL, params![batch]).map_err(db)?;
    Ok(expired + revoked)
}

fn room_row(conn: &Connection, room_id: &str) -> Result<Option<RoomRow>, WebchatError> {
    conn.query_row(
        "SELECT name, code_salt, code_hash, channel, owner_salt, owner_hash, holder FROM rooms WHERE room_id = ?1",
        params![room_id],
        |r| {
            let owner: (Option<String>, Option<String>) = (r.get(4)?, r.get(5)?);
            Ok(RoomRow {
                name: r.get(0)?,
                code_salt: r.get(1)?,
                code_hash: r.get(2)?,
                channel: r.get(3)?,
                owner: owner.0.zip(owner.1),
                holder: r.get(6)?,
            })
        },
    )
    .optional()
    .map_err(db)
}

/// Creates the room `room_id` named `name` with the access `code` (at least
/// [`MIN_ACCESS_CODE_CHARS`] characters) and, when given, the owner code.
fn insert_room(
    conn: &Connection,
    room_id: String,
    name: &str,
    code: &str,
    owner: Option<&str>,
    now: u64,
) -> Result<Room, WebchatError> {
    if code.chars().count() < MIN_ACCESS_CODE_CHARS {
        return Err(WebchatError::InvalidInput(format!(
            "a new room's access code needs at least {MIN_ACCESS_CODE_CHARS} characters"
        )));
    }
    let (salt, hash) = salted_hash(code);
    let (owner_salt, owner_hash) = owner.map(salted_hash).unzip();
    conn.execute(
        "INSERT INTO rooms (room_id, name, code_salt, code_hash, channel, created_at, owner_salt, owner_hash)
         VALUES (?1, ?2, ?3, ?4, NULL, ?5, ?6, ?7)",
        params![room_id, name.trim(), salt, hash, now as i64, owner_salt, owner_hash],
    )
    .map_err(db)?;
    Ok(Room { room_id, name: name.trim().to_owned(), channel: None })
}

/// The stored form of a visitor token (also the key its live streams are counted under).
pub(crate) fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh random hex string of `bytes` random bytes.
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    for b in &mut buf {
        *b = rand::random();
    }
    hex::encode(buf)
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS rooms (
  room_id TEXT PRIMARY KEY, name TEXT NOT NULL, code_salt TEXT NOT NULL,
  code_hash TEXT NOT NULL, channel TEXT, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS visitors (
  token_hash TEXT PRIMARY KEY, room_id TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS visitor_uploads (
  room_id TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS visitor_uploads_time ON visitor_uploads(created_at);
CREATE TABLE IF NOT EXISTS messages (
  room_id TEXT NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT NOT NULL UNIQUE,
  author TEXT NOT NULL, text TEXT, files TEXT NOT NULL, status TEXT NOT NULL, error TEXT,
  client_id TEXT, created_at INTEGER NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS messages_client ON messages(room_id, client_id)
  WHERE client_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS messages_room ON messages(room_id, seq);
";

/// The indexes of the visitor sessions (F12): expiry and revocation for the pruning below,
/// the room for revoking a room's sessions. Created after the migrations add their columns.
const SESSION_INDEXES: &str = "
CREATE INDEX IF NOT EXISTS visitors_expiry ON visitors(expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS visitors_revoked ON visitors(revoked) WHERE revoked = 1;
CREATE INDEX IF NOT EXISTS visitors_room ON visitors(room_id);
";

/// Most expired or revoked sessions one prune deletes (each join runs one, so a join's cost
/// stays bounded however many sessions ended meanwhile).
pub(crate) const SESSION_PRUNE_BATCH: usize = 64;

/// Deletes up to `?2` sessions that expired by `?1` (through `visitors_expiry`).
const PRUNE_EXPIRED_SQL: &str = "DELETE FROM visitors WHERE rowid IN (
  SELECT rowid FROM visitors WHERE expires_at IS NOT NULL AND expires_at <= ?1 LIMIT ?2)";

/// Deletes up to `?1` revoked sessions (through `visitors_revoked`).
const PRUNE_REVOKED_SQL: &str = "DELETE FROM visitors WHERE rowid IN (
  SELECT rowid FROM visitors WHERE revoked = 1 LIMIT ?1)";

impl Store {
    /// Opens (or creates) `<dir>/webchat.sqlite3`. The directory is made 0700 and the
    /// database 0600 (SQLite gives its `-wal` and `-shm` files the database's mode).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, WebchatError> {
        let path = dir.as_ref().join(WEBCHAT_DATABASE_FILE);
        xagent_server_runtime::private_database_files(dir.as_ref(), &path)
            .map_err(|e| StorageError::new("preparing the state directory", e))?;
        let conn = Connection::open(&path).map_err(db)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(db)?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(db)?;
        Self::init(conn)
    }

    /// A store in memory (tests).
    #[cfg(test)]
    pub fn in_memory() -> Result<Self, WebchatError> {
        Self::init(Connection::open_in_memory().map_err(db)?)
    }

    fn init(conn: Connection) -> Result<Self, WebchatError> {
        conn.execute_batch(SCHEMA).map_err(db)?;
        // Columns added after the first release: older databases get them here.
        add_column(&conn, "visitors", "expires_at", "INTEGER")?;
        add_column(&conn, "visitors", "revoked", "INTEGER NOT NULL DEFAULT 0")?;
        add_column(&conn, "messages", "outbound", "TEXT")?;
        add_column(&conn, "rooms", "owner_salt", "TEXT")?;
        add_column(&conn, "rooms", "owner_hash", "TEXT")?;
        add_column(&conn, "rooms", "holder", "TEXT")?;
        // F7: rooms from before holders existed are held by the channel serving them now.
        conn.execute(
            "UPDATE rooms SET holder = channel WHERE holder IS NULL AND channel IS NOT NULL",
            [],
        )
        .map_err(db)?;
        add_column(&conn, "visitor_uploads", "pending", "INTEGER NOT NULL DEFAULT 0")?;
        // After the columns they cover (older databases get them here too).
        conn.execute_batch(SESSION_INDEXES).map_err(db)?;
        // Reservations of uploads that never finished (the process stopped meanwhile).
        conn.execute("DELETE FROM visitor_uploads WHERE pending = 1", []).map_err(db)?;
        Ok(Self { conn: Mutex::new(conn) })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates the room `name` with `code`, or checks `code` against the existing room.
    pub fn claim_room(&self, name: &str, code: &str, now: u64) -> Result<RoomClaim, WebchatError> {
        let room_id = room_id_or_error(name)?;
        let conn = self.conn();
        match room_row(&conn, &room_id)? {
            Some(row) if code_matches(&row.code_salt, code, &row.code_hash) => {
                Ok(RoomClaim::Matched(row.room(room_id)))
            }
            Some(_) => Ok(RoomClaim::WrongCode),
            None => Ok(RoomClaim::Created(insert_room(&conn, room_id, name, code, None, now)?)),
        }
    }

    /// The form flow's sign-in of `channel` to the room `name` (M9, F7). The access code is
    /// the visitors' secret; the owner code is xAgent's. A new room needs both and stores them
    /// hashed. An existing room is served by `channel` when: the owner code is right (a
    /// different access code then replaces the old one and ends every visitor session), or the
    /// access code is right and `channel` holds the room (serves it, or created, paired or
    /// last moved it). A room without an owner code (paired, or from an older release) never
    /// changes hands: it gets the owner code its holder brings, and one that no channel ever
    /// held is claimed only together with an owner code.
    pub fn sign_in_room(
        &self,
        name: &str,
        access_code: &str,
        owner_code: Option<&str>,
        channel: &ConnectorChannelId,
        now: u64,
    ) -> Result<SignIn, WebchatError> {
        let room_id = room_id_or_error(name)?;
        if let Some(owner) = owner_code
            && (owner.chars().count() < MIN_ACCESS_CODE_CHARS || owner == access_code)
        {
            return Err(WebchatError::InvalidInput(format!(
                "the owner code needs at least {MIN_ACCESS_CODE_CHARS} characters and must differ from the access code"
            )));
        }
        let conn = self.conn();
        let Some(row) = room_row(&conn, &room_id)? else {
            // F7: a room without an owner code could change hands; new ones need one.
            let Some(owner) = owner_code else { return Ok(SignIn::OwnerCodeNeeded) };
            let room = insert_room(&conn, room_id, name, access_code, Some(owner), now)?;
            return Ok(SignIn::Created(room));
        };
        drop(conn);
        let code_right = code_matches(&row.code_salt, access_code, &row.code_hash);
        let owner_right = match (owner_code, &row.owner) {
            (Some(owner), Some((salt, hash))) => Some(code_matches(salt, owner, hash)),
            _ => None,
        };
        let serves = row.channel.as_deref() == Some(channel.as_str());
        let holds = serves || row.holder.as_deref() == Some(channel.as_str());
        let (has_owner, unclaimed) =
            (row.owner.is_some(), row.channel.is_none() && row.holder.is_none());
        let room = row.room(room_id.clone());
        match owner_right {
            Some(false) => Ok(SignIn::WrongOwner),
            Some(true) if code_right => Ok(SignIn::Matched(room)),
            Some(true) => {
                if access_code.chars().count() < MIN_ACCESS_CODE_CHARS {
                    return Err(WebchatError::InvalidInput(format!(
                        "the access code needs at least {MIN_ACCESS_CODE_CHARS} characters"
                    )));
                }
                let (salt, hash) = salted_hash(access_code);
                self.conn()
                    .execute(
                        "UPDATE rooms SET code_salt = ?2, code_hash = ?3 WHERE room_id = ?1",
                        params![room_id, salt, hash],
                    )
                    .map_err(db)?;
                let revoked = self.revoke_room_visitors(&room_id)?;
                Ok(SignIn::Rotated { room, revoked })
            }
            None if !code_right => Ok(SignIn::WrongCode),
            // The channel holding the room comes back; a room without an owner code gets
            // the one it brings.
            None if holds => {
                if let (false, Some(owner)) = (has_owner, owner_code) {
                    self.set_owner(&room_id, owner)?;
                }
                Ok(SignIn::Matched(room))
            }
            // F7: a room without an owner code never changes hands. Only one no channel
            // ever held (an older database) is claimed, and only with an owner code.
            None if !has_owner && unclaimed && owner_code.is_some() => {
                if let Some(owner) = owner_code {
                    self.set_owner(&room_id, owner)?;
                }
                Ok(SignIn::Matched(room))
            }
            None => Ok(SignIn::OwnerRequired),
        }
    }

    fn set_owner(&self, room_id: &str, owner: &str) -> Result<(), WebchatError> {
        let (salt, hash) = salted_hash(owner);
        self.conn()
            .execute(
                "UPDATE rooms SET owner_salt = ?2, owner_hash = ?3 WHERE room_id = ?1",
                params![room_id, salt, hash],
            )
            .map_err(db)?;
        Ok(())
    }

    /// Ends every visitor session of a room (its owner changed the access code); returns how
    /// many were open.
    pub fn revoke_room_visitors(&self, room_id: &str) -> Result<usize, WebchatError> {
        self.conn()
            .execute(
                "UPDATE visitors SET revoked = 1 WHERE room_id = ?1 AND revoked = 0",
                params![room_id],
            )
            .map_err(db)
    }

    /// Checks a visitor's access code for a room (constant-time comparison of the hashes).
    pub fn check_code(&self, room_id: &str, code: &str) -> Result<bool, WebchatError> {
        let row: Option<(String, String)> = self
            .conn()
            .query_row(
                "SELECT code_salt, code_hash FROM rooms WHERE room_id = ?1",
                params![room_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(db)?;
        Ok(row.is_some_and(|(salt, hash)| code_matches(&salt, code, &hash)))
    }

    /// Binds the room to a channel (or unbinds it) and returns the channel it had before. A
    /// channel serves one room: any other room it served loses it.
    pub fn set_room_channel(
        &self,
        room_id: &str,
        channel: Option<&ConnectorChannelId>,
    ) -> Result<Option<ConnectorChannelId>, WebchatError> {
        let conn = self.conn();
        let previous: Option<Option<String>> = conn
            .query_row("SELECT channel FROM rooms WHERE room_id = ?1", params![room_id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(db)?;
        if let Some(channel) = channel {
            // One binding per channel: signing it in to this room moves it out of any other.
            conn.execute(
                "UPDATE rooms SET channel = NULL WHERE channel = ?1 AND room_id != ?2",
                params![channel.as_str(), room_id],
            )
            .map_err(db)?;
        }
        conn.execute(
            "UPDATE rooms SET channel = ?2 WHERE room_id = ?1",
            params![room_id, channel.map(|c| c.as_str().to_owned())],
        )
        .map_err(db)?;
        if let Some(channel) = channel {
            // F7: the channel a room is bound to holds it, also after it signs out.
            conn.execute(
                "UPDATE rooms SET holder = ?2 WHERE room_id = ?1",
                params![room_id, channel.as_str()],
            )
            .map_err(db)?;
        }
        Ok(previous.flatten().map(ConnectorChannelId::new))
    }

    /// Unbinds every room served by `channel`.
    pub fn release_channel(&self, channel: &ConnectorChannelId) -> Result<(), WebchatError> {
        self.conn()
            .execute(
                "UPDATE rooms SET channel = NULL WHERE channel = ?1",
                params![channel.as_str()],
            )
            .map_err(db)?;
        Ok(())
    }

    fn room_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Room> {
        Ok(Room {
            room_id: r.get(0)?,
            name: r.get(1)?,
            channel: r.get::<_, Option<String>>(2)?.map(ConnectorChannelId::new),
        })
    }

    /// A room by id.
    pub fn room(&self, room_id: &str) -> Result<Option<Room>, WebchatError> {
        self.conn()
            .query_row(
                "SELECT room_id, name, channel FROM rooms WHERE room_id = ?1",
                params![room_id],
                Self::room_row,
            )
            .optional()
            .map_err(db)
    }

    /// The room a channel serves.
    pub fn room_by_channel(
        &self,
        channel: &ConnectorChannelId,
    ) -> Result<Option<Room>, WebchatError> {
        self.conn()
            .query_row(
                "SELECT room_id, name, channel FROM rooms WHERE channel = ?1",
                params![channel.as_str()],
                Self::room_row,
            )
            .optional()
            .map_err(db)
    }

    /// Starts a visitor session in a room and returns its bearer token (stored hashed),
    /// valid until `expires_at` (Unix ms) unless revoked earlier.
    pub fn add_visitor(
        &self,
        room_id: &str,
        now: u64,
        expires_at: u64,
    ) -> Result<String, WebchatError> {
        let token = format!("wcv_{}", random_hex(24));
        let conn = self.conn();
        conn.execute(
            "INSERT INTO visitors (token_hash, room_id, created_at, expires_at) VALUES (?1, ?2, ?3, ?4)",
            params![hash_token(&token), room_id, now as i64, expires_at as i64],
        )
        .map_err(db)?;
        // Expired and revoked sessions are of no use to anybody: one bounded batch per join.
        prune_sessions(&conn, now, SESSION_PRUNE_BATCH)?;
        Ok(token)
    }

    /// The room a visitor token opens at `now`: `None` for unknown, expired or revoked
    /// tokens. Sessions from before token lifetimes existed expire `legacy_lifetime` after
    /// their creation.
    pub fn visitor_room(
        &self,
        token: &str,
        now: u64,
        legacy_lifetime: u64,
    ) -> Result<Option<String>, WebchatError> {
        Ok(self.visitor_session(token, now, legacy_lifetime)?.map(|session| session.room_id))
    }

    /// [`Store::visitor_room`] with the session's end: what a live stream needs to end with
    /// its session (F4).
    pub fn visitor_session(
        &self,
        token: &str,
        now: u64,
        legacy_lifetime: u64,
    ) -> Result<Option<VisitorSession>, WebchatError> {
        let row: Option<(String, i64, Option<i64>, i64)> = self
            .conn()
            .query_row(
                "SELECT room_id, created_at, expires_at, revoked FROM visitors WHERE token_hash = ?1",
                params![hash_token(token)],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(db)?;
        Ok(row.and_then(|(room, created_at, expires_at, revoked)| {
            let expires_at = expires_at.map_or_else(
                || u64::try_from(created_at).unwrap_or(0).saturating_add(legacy_lifetime),
                |at| u64::try_from(at).unwrap_or(0),
            );
            (revoked == 0 && now < expires_at)
                .then_some(VisitorSession { room_id: room, expires_at })
        }))
    }

    /// Ends one visitor session (the page's "leave"). True when it existed.
    pub fn revoke_visitor(&self, token: &str) -> Result<bool, WebchatError> {
        let changed = self
            .conn()
            .execute(
                "UPDATE visitors SET revoked = 1 WHERE token_hash = ?1",
                params![hash_token(token)],
            )
            .map_err(db)?;
        Ok(changed > 0)
    }

    /// Visitor uploads of the last day (for the room and for everybody), reservations of
    /// uploads still being written included.
    #[cfg(test)]
    pub fn upload_usage(&self, room_id: &str, now: u64) -> Result<UploadUsage, WebchatError> {
        upload_usage(&self.conn(), room_id, now)
    }

    /// Reserves one file and up to `want` bytes of the day's visitor quota for an upload to
    /// `room_id`, before any byte is stored (F14): the check and the reservation are one
    /// SQLite transaction under the store's lock, so concurrent uploads can never pass the
    /// quota together. The reservation holds the smaller of `want` and what the room and
    /// everybody have left; [`Store::settle_upload`] turns it into the real size,
    /// [`Store::release_upload`] gives it back.
    pub fn reserve_upload(
        &self,
        room_id: &str,
        want: u64,
        quota: &crate::web::UploadQuota,
        now: u64,
    ) -> Result<Result<UploadReservation, QuotaRefusal>, WebchatError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db)?;
        let usage = upload_usage(&tx, room_id, now)?;
        let room_left = quota.room_bytes.saturating_sub(usage.room_bytes);
        if room_left == 0 || usage.room_files >= quota.room_files {
            return Ok(Err(QuotaRefusal::Room));
        }
        let all_left = quota.all_bytes.saturating_sub(usage.all_bytes);
        if all_left == 0 || usage.all_files >= quota.all_files {
            return Ok(Err(QuotaRefusal::Everybody));
        }
        let bytes = want.min(room_left).min(all_left);
        tx.execute(
            "INSERT INTO visitor_uploads (room_id, bytes, created_at, pending) VALUES (?1, ?2, ?3, 1)",
            params![room_id, i64::try_from(bytes).unwrap_or(i64::MAX), now as i64],
        )
        .map_err(db)?;
        let id = tx.last_insert_rowid();
        tx.commit().map_err(db)?;
        Ok(Ok(UploadReservation { id, bytes }))
    }

    /// Turns a reservation into the upload's real size (at most the reserved bytes).
    pub fn settle_upload(&self, id: i64, bytes: u64) -> Result<(), WebchatError> {
        self.conn()
            .execute(
                "UPDATE visitor_uploads SET bytes = MIN(bytes, ?2), pending = 0 WHERE rowid = ?1",
                params![id, i64::try_from(bytes).unwrap_or(i64::MAX)],
            )
            .map_err(db)?;
        Ok(())
    }

    /// Gives a reservation back (the upload failed or was abandoned).
    pub fn release_upload(&self, id: i64) -> Result<(), WebchatError> {
        self.conn()
            .execute("DELETE FROM visitor_uploads WHERE rowid = ?1 AND pending = 1", params![id])
            .map_err(db)?;
        Ok(())
    }
}

/// [`Store::upload_usage`] on an open connection or transaction (forgets rows older than a
/// day on the way).
fn upload_usage(conn: &Connection, room_id: &str, now: u64) -> Result<UploadUsage, WebchatError> {
    let since = now.saturating_sub(DAY_MILLIS) as i64;
    conn.execute("DELETE FROM visitor_uploads WHERE created_at < ?1", params![since])
        .map_err(db)?;
    let (room_bytes, room_files, all_bytes, all_files): (i64, i64, i64, i64) = conn
        .query_row(
            "SELECT COALESCE(SUM(CASE WHEN room_id = ?1 THEN bytes END), 0),
                    COALESCE(SUM(CASE WHEN room_id = ?1 THEN 1 END), 0),
                    COALESCE(SUM(bytes), 0), COUNT(*)
             FROM visitor_uploads",
            params![room_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .map_err(db)?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(UploadUsage {
        room_bytes: n(room_bytes),
        room_files: n(room_files),
        all_bytes: n(all_bytes),
        all_files: n(all_files),
    })
}

impl Store {
    fn entry_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ChatEntry> {
        let author: String = r.get(1)?;
        let files: String = r.get(3)?;
        let status: String = r.get(4)?;
        let created_at: i64 = r.get(7)?;
        Ok(ChatEntry {
            message_id: r.get(0)?,
            author: if author == "assistant" { Author::Assistant } else { Author::Visitor },
            text: r.get(2)?,
            files: serde_json::from_str(&files).unwrap_or_default(),
            status: EntryStatus::parse(&status),
            error: r.get(5)?,
            client_id: r.get(6)?,
            created_at: u64::try_from(created_at).unwrap_or(0),
        })
    }

    const ENTRY_COLUMNS: &'static str =
        "message_id, author, text, files, status, error, client_id, created_at";

    /// Every message an older version kept here (`room_id, seq, message, outbound`), in
    /// `seq` order, to move to the runtime's storage (`messages.rs`); empty once moved.
    pub(crate) fn take_legacy_messages(&self) -> Result<Vec<LegacyMessage>, WebchatError> {
        let conn = self.conn();
        let sql = format!(
            "SELECT {}, room_id, seq, outbound FROM messages ORDER BY seq ASC",
            Self::ENTRY_COLUMNS
        );
        let mut stmt = conn.prepare(&sql).map_err(db)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(8)?, r.get(9)?, Self::entry_row(r)?, r.get(10)?)))
            .map_err(db)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(db)
    }

    /// Deletes the moved messages (after the runtime's storage committed them).
    pub(crate) fn forget_legacy_messages(&self) -> Result<(), WebchatError> {
        self.conn().execute("DELETE FROM messages", []).map_err(db).map(|_| ())
    }

    /// Stores a message the way an older version did (tests of the move).
    #[cfg(test)]
    pub(crate) fn insert_legacy(
        &self,
        room_id: &str,
        entry: &ChatEntry,
        outbound: Option<&str>,
    ) -> Result<(), WebchatError> {
        let author = match entry.author {
            Author::Visitor => "visitor",
            Author::Assistant => "assistant",
        };
        let files = serde_json::to_string(&entry.files)
            .map_err(|e| StorageError::new("encoding a message's files", e))?;
        self.conn()
            .execute(
                "INSERT INTO messages (room_id, message_id, author, text, files, status, error,
                   client_id, created_at, outbound)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    room_id,
                    entry.message_id,
                    author,
                    entry.text,
                    files,
                    entry.status.as_str(),
                    entry.error,
                    entry.client_id,
                    i64::try_from(entry.created_at).unwrap_or(i64::MAX),
                    outbound
                ],
            )
            .map_err(db)
            .map(|_| ())
    }
}

/// Adds a column to a table unless it is there already.
fn add_column(
    conn: &Connection,
    table: &str,
    column: &str,
    decl: &str,
) -> Result<(), WebchatError> {
    let exists: bool = conn
        .query_row(
            &format!("SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = ?1"),
            params![column],
            |r| r.get::<_, i64>(0),
        )
        .map_err(db)?
        > 0;
    if !exists {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))
            .map_err(db)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::UploadQuota;

    #[test]
    fn room_ids_are_url_safe_slugs() {
        assert_eq!(room_id_from_name("  Support Desk #1 ").as_deref(), Some("support-desk-1"));
        assert_eq!(room_id_from_name("déjà vu").as_deref(), Some("d-j-vu"));
        assert_eq!(room_id_from_name("***"), None);
        assert_eq!(room_id_from_name(""), None);
        assert_eq!(room_id_from_name(&"a".repeat(65)), None);
    }

    #[test]
    fn claiming_a_room_with_another_code_is_refused() {
        let store = Store::in_memory().unwrap();
        assert!(matches!(store.claim_room("Lobby", "s3cret-1", 1).unwrap(), RoomClaim::Created(_)));
        assert!(matches!(store.claim_room("lobby", "s3cret-1", 2).unwrap(), RoomClaim::Matched(_)));
        assert_eq!(store.claim_room("LOBBY", "guess", 3).unwrap(), RoomClaim::WrongCode);
        assert!(store.check_code("lobby", "s3cret-1").unwrap());
        assert!(!store.check_code("lobby", "s3cret-").unwrap());
        assert!(!store.check_code("nowhere", "s3cret-1").unwrap());
    }

    #[test]
    fn access_codes_are_stored_hashed_never_in_clear() {
        let store = Store::in_memory().unwrap();
        store.claim_room("Lobby", "plain-code-123", 1).unwrap();
        let hash: String =
            store.conn().query_row("SELECT code_hash FROM rooms", [], |r| r.get(0)).unwrap();
        assert!(!hash.contains("plain-code-123"));
        assert_eq!(hash.len(), 64);
    }

    #[test]
    fn channel_binding_moves_and_releases() {
        let store = Store::in_memory().unwrap();
        store.claim_room("Lobby", "code-1234", 1).unwrap();
        let a = ConnectorChannelId::new("cch_a");
        let b = ConnectorChannelId::new("cch_b");
        assert_eq!(store.set_room_channel("lobby", Some(&a)).unwrap(), None);
        assert_eq!(store.set_room_channel("lobby", Some(&b)).unwrap(), Some(a.clone()));
        assert_eq!(store.room_by_channel(&b).unwrap().unwrap().room_id, "lobby");
        assert!(store.room_by_channel(&a).unwrap().is_none());
        store.release_channel(&b).unwrap();
        assert_eq!(store.room("lobby").unwrap().unwrap().channel, None);
    }

    #[test]
    fn m9_the_access_code_alone_never_moves_a_room_the_owner_code_does() {
        let store = Store::in_memory().unwrap();
        let (a, b) = (ConnectorChannelId::new("cch_a"), ConnectorChannelId::new("cch_b"));
        let created = store.sign_in_room("Lobby", "visit-1234", Some("owner-5678"), &a, 1).unwrap();
        let SignIn::Created(room) = created else { panic!("created: {created:?}") };
        store.set_room_channel(&room.room_id, Some(&a)).unwrap();
        let token = store.add_visitor("lobby", 1, 1_000).unwrap();
        // A channel that knows only the visitors' code cannot take the room over.
        assert_eq!(
            store.sign_in_room("Lobby", "visit-1234", None, &b, 2).unwrap(),
            SignIn::OwnerRequired
        );
        assert_eq!(
            store.sign_in_room("Lobby", "visit-1234", Some("guess-guess"), &b, 2).unwrap(),
            SignIn::WrongOwner
        );
        // The serving channel signs in again with the access code alone.
        assert!(matches!(
            store.sign_in_room("Lobby", "visit-1234", None, &a, 2).unwrap(),
            SignIn::Matched(_)
        ));
        // The owner moves it, and may rotate the visitors' code: every session ends.
        assert!(matches!(
            store.sign_in_room("Lobby", "visit-1234", Some("owner-5678"), &b, 3).unwrap(),
            SignIn::Matched(_)
        ));
        let rotated = store.sign_in_room("Lobby", "visit-9999", Some("owner-5678"), &b, 4).unwrap();
        assert!(matches!(rotated, SignIn::Rotated { revoked: 1, .. }), "{rotated:?}");
        assert_eq!(store.visitor_room(&token, 5, 0).unwrap(), None);
        assert!(store.check_code("lobby", "visit-9999").unwrap());
        assert!(!store.check_code("lobby", "visit-1234").unwrap());
    }

    #[test]
    fn new_room_requires_an_owner_code() {
        let store = Store::in_memory().unwrap();
        let a = ConnectorChannelId::new("cch_a");
        assert_eq!(
            store.sign_in_room("Desk", "desk-code-1", None, &a, 1).unwrap(),
            SignIn::OwnerCodeNeeded
        );
        assert!(store.room("desk").unwrap().is_none(), "nothing was created");
        assert!(matches!(
            store.sign_in_room("Desk", "desk-code-1", Some("desk-owner-1"), &a, 1).unwrap(),
            SignIn::Created(_)
        ));
    }

    #[test]
    fn room_without_owner_code_cannot_change_hands() {
        let store = Store::in_memory().unwrap();
        let (a, b) = (ConnectorChannelId::new("cch_a"), ConnectorChannelId::new("cch_b"));
        // A paired room: no owner code, bound to the pairing channel.
        store.claim_room("Paired", "paired-code-1", 1).unwrap();
        store.set_room_channel("paired", Some(&a)).unwrap();
        store.release_channel(&a).unwrap();
        // Its creator signed out; another channel with the visitors' code (and an owner code
        // of its own) does not get it, however often it asks.
        for at in [2, 3] {
            assert_eq!(
                store
                    .sign_in_room("Paired", "paired-code-1", Some("b-owner-code"), &b, at)
                    .unwrap(),
                SignIn::OwnerRequired
            );
        }
        // The channel that holds it comes back, and the owner code it brings is the room's.
        assert!(matches!(
            store.sign_in_room("Paired", "paired-code-1", Some("a-owner-code"), &a, 4).unwrap(),
            SignIn::Matched(_)
        ));
        assert_eq!(
            store.sign_in_room("Paired", "paired-code-1", Some("b-owner-code"), &b, 5).unwrap(),
            SignIn::WrongOwner
        );
        // A room from an older database that no channel ever held: claimed only with an owner
        // code, after which it is held.
        store.claim_room("Old", "old-code-1234", 1).unwrap();
        assert_eq!(
            store.sign_in_room("Old", "old-code-1234", None, &b, 6).unwrap(),
            SignIn::OwnerRequired
        );
        assert!(matches!(
            store.sign_in_room("Old", "old-code-1234", Some("b-owner-code"), &b, 7).unwrap(),
            SignIn::Matched(_)
        ));
        store.set_room_channel("old", Some(&b)).unwrap();
        store.release_channel(&b).unwrap();
        assert_eq!(
            store.sign_in_room("Old", "old-code-1234", None, &a, 8).unwrap(),
            SignIn::OwnerRequired
        );
    }

    #[test]
    fn h4_binding_a_channel_to_a_second_room_unbinds_the_first() {
        let store = Store::in_memory().unwrap();
        store.claim_room("One", "code-1234", 1).unwrap();
        store.claim_room("Two", "code-5678", 1).unwrap();
        let a = ConnectorChannelId::new("cch_a");
        store.set_room_channel("one", Some(&a)).unwrap();
        store.set_room_channel("two", Some(&a)).unwrap();
        assert_eq!(store.room("one").unwrap().unwrap().channel, None);
        assert_eq!(store.room_by_channel(&a).unwrap().unwrap().room_id, "two");
    }

    #[test]
    fn visitor_tokens_resolve_to_their_room_only() {
        let store = Store::in_memory().unwrap();
        store.claim_room("Lobby", "code-1234", 1).unwrap();
        let token = store.add_visitor("lobby", 1, 100).unwrap();
        assert_eq!(store.visitor_room(&token, 2, 0).unwrap().as_deref(), Some("lobby"));
        assert_eq!(store.visitor_room("wcv_forged", 2, 0).unwrap(), None);
    }

    #[test]
    fn m8_visitor_tokens_expire_and_can_be_revoked() {
        let store = Store::in_memory().unwrap();
        store.claim_room("Lobby", "code-1234", 1).unwrap();
        let a = store.add_visitor("lobby", 1, 100).unwrap();
        let b = store.add_visitor("lobby", 1, 1_000).unwrap();
        let c = store.add_visitor("lobby", 1, 1_000).unwrap();
        assert_eq!(store.visitor_room(&a, 99, 0).unwrap().as_deref(), Some("lobby"));
        assert_eq!(store.visitor_room(&a, 100, 0).unwrap(), None, "expired at its lifetime");
        assert!(store.revoke_visitor(&b).unwrap());
        assert_eq!(store.visitor_room(&b, 2, 0).unwrap(), None, "revoked");
        assert_eq!(store.visitor_room(&c, 2, 0).unwrap().as_deref(), Some("lobby"));
    }

    #[test]
    fn h2_new_rooms_need_a_long_access_code() {
        let store = Store::in_memory().unwrap();
        assert!(matches!(
            store.claim_room("Lobby", "1234567", 1),
            Err(WebchatError::InvalidInput(_))
        ));
        assert!(matches!(store.claim_room("Lobby", "12345678", 1).unwrap(), RoomClaim::Created(_)));
    }

    /// A quota as big as the tests need.
    fn quota(room_bytes: u64, room_files: u64, all_bytes: u64, all_files: u64) -> UploadQuota {
        UploadQuota { room_bytes, room_files, all_bytes, all_files }
    }

    /// Reserves and settles an upload of `bytes` (what a finished upload does).
    fn uploaded(store: &Store, room: &str, bytes: u64, now: u64) {
        let big = quota(u64::MAX, u64::MAX, u64::MAX, u64::MAX);
        let held = store.reserve_upload(room, bytes, &big, now).unwrap().unwrap();
        store.settle_upload(held.id, bytes).unwrap();
    }

    #[test]
    fn m3_upload_usage_counts_the_room_and_everybody_within_a_day() {
        let store = Store::in_memory().unwrap();
        uploaded(&store, "a", 10, 1_000);
        uploaded(&store, "a", 5, 2_000);
        uploaded(&store, "b", 7, 2_000);
        let usage = store.upload_usage("a", 3_000).unwrap();
        assert_eq!(
            usage,
            UploadUsage { room_bytes: 15, room_files: 2, all_bytes: 22, all_files: 3 }
        );
        let later = store.upload_usage("a", 1_500 + DAY_MILLIS).unwrap();
        assert_eq!(
            later,
            UploadUsage { room_bytes: 5, room_files: 1, all_bytes: 12, all_files: 2 }
        );
    }

    #[test]
    fn an_upload_reserves_its_quota_before_storing_and_gives_back_what_it_did_not_use() {
        let store = Store::in_memory().unwrap();
        let quota = quota(100, 3, 1_000, 10);
        // Reserved up to what the room has left; a second upload sees the reservation.
        let first = store.reserve_upload("a", 80, &quota, 1).unwrap().unwrap();
        assert_eq!(first.bytes, 80);
        let second = store.reserve_upload("a", 80, &quota, 1).unwrap().unwrap();
        assert_eq!(second.bytes, 20, "only what is left of the room's bytes");
        assert_eq!(store.reserve_upload("a", 80, &quota, 1).unwrap(), Err(QuotaRefusal::Room));
        // Settling keeps the real size; releasing gives all of it back.
        store.settle_upload(first.id, 30).unwrap();
        store.release_upload(second.id).unwrap();
        assert_eq!(store.upload_usage("a", 2).unwrap().room_bytes, 30);
        // A settled upload is never released by mistake.
        store.release_upload(first.id).unwrap();
        assert_eq!(store.upload_usage("a", 2).unwrap().room_files, 1);
        // Files: the room's count is reached with reservations still pending.
        let _b = store.reserve_upload("a", 1, &quota, 3).unwrap().unwrap();
        let _c = store.reserve_upload("a", 1, &quota, 3).unwrap().unwrap();
        assert_eq!(store.reserve_upload("a", 1, &quota, 3).unwrap(), Err(QuotaRefusal::Room));
        // Everybody's quota.
        let everybody = self::quota(100, 3, 32, 10);
        assert_eq!(
            store.reserve_upload("b", 1, &everybody, 3).unwrap(),
            Err(QuotaRefusal::Everybody)
        );
    }

    #[test]
    fn reservations_of_uploads_that_never_finished_are_given_back_at_the_next_start() {
        let dir = std::env::temp_dir().join(format!("webchat-reserve-{}", random_hex(6)));
        let store = Store::open(&dir).unwrap();
        let quota = quota(100, 10, 1_000, 10);
        let done = store.reserve_upload("a", 40, &quota, 1).unwrap().unwrap();
        store.settle_upload(done.id, 40).unwrap();
        store.reserve_upload("a", 60, &quota, 1).unwrap().unwrap();
        drop(store);
        let store = Store::open(&dir).unwrap();
        let usage = store.upload_usage("a", 2).unwrap();
        assert_eq!((usage.room_bytes, usage.room_files), (40, 1));
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The plan SQLite chooses for `sql` (the detail column of `EXPLAIN QUERY PLAN`).
    fn query_plan(store: &Store, sql: &str, params: &[&dyn rusqlite::ToSql]) -> String {
        let conn = store.conn();
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = stmt.query_map(params, |r| r.get::<_, String>(3)).unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
    }

    #[test]
    fn session_pruning_goes_through_an_index_in_bounded_batches() {
        let store = Store::in_memory().unwrap();
        store.claim_room("Lobby", "code-1234", 1).unwrap();
        for sql in [PRUNE_EXPIRED_SQL, PRUNE_REVOKED_SQL] {
            let params: &[&dyn rusqlite::ToSql] =
                if sql == PRUNE_EXPIRED_SQL { &[&1_i64, &64_i64] } else { &[&64_i64] };
            let plan = query_plan(&store, sql, params);
            assert!(!plan.contains("SCAN visitors"), "a scan of every session: {plan}");
            assert!(
                plan.contains("visitors_expiry") || plan.contains("visitors_revoked"),
                "{plan}"
            );
        }
        // 200 sessions end at 100; each join deletes one batch of them, never all at once.
        for _ in 0..200 {
            store.add_visitor("lobby", 1, 100).unwrap();
        }
        let count = |store: &Store| -> i64 {
            store.conn().query_row("SELECT COUNT(*) FROM visitors", [], |r| r.get(0)).unwrap()
        };
        store.add_visitor("lobby", 150, 10_000).unwrap();
        assert_eq!(count(&store), 201 - SESSION_PRUNE_BATCH as i64);
        for _ in 0..3 {
            store.add_visitor("lobby", 150, 10_000).unwrap();
        }
        assert_eq!(count(&store), 4, "the expired ones are gone after a few joins");
        let live = store.add_visitor("lobby", 150, 10_000).unwrap();
        store.revoke_visitor(&live).unwrap();
        store.add_visitor("lobby", 150, 10_000).unwrap();
        assert_eq!(count(&store), 5, "revoked sessions are pruned too");
    }

    #[test]
    fn an_existing_database_gets_the_session_indexes() {
        let dir = std::env::temp_dir().join(format!("webchat-migrate-{}", random_hex(6)));
        std::fs::create_dir_all(&dir).unwrap();
        {
            // The first release's tables, without the later columns and indexes.
            let conn = Connection::open(dir.join(WEBCHAT_DATABASE_FILE)).unwrap();
            conn.execute_batch(
                "CREATE TABLE rooms (room_id TEXT PRIMARY KEY, name TEXT NOT NULL,
                   code_salt TEXT NOT NULL, code_hash TEXT NOT NULL, channel TEXT,
                   created_at INTEGER NOT NULL);
                 CREATE TABLE visitors (token_hash TEXT PRIMARY KEY, room_id TEXT NOT NULL,
                   created_at INTEGER NOT NULL);
                 CREATE TABLE visitor_uploads (room_id TEXT NOT NULL, bytes INTEGER NOT NULL,
                   created_at INTEGER NOT NULL);
                 INSERT INTO visitors VALUES ('old', 'lobby', 1);
                 INSERT INTO visitor_uploads VALUES ('lobby', 5, 1);",
            )
            .unwrap();
        }
        let store = Store::open(&dir).unwrap();
        let indexes: Vec<String> = {
            let conn = store.conn();
            let mut stmt = conn
                .prepare(
                    "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'visitors'",
                )
                .unwrap();
            stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
        };
        for name in ["visitors_expiry", "visitors_revoked", "visitors_room"] {
            assert!(indexes.iter().any(|i| i == name), "{name} missing: {indexes:?}");
        }
        let plan = query_plan(&store, PRUNE_EXPIRED_SQL, &[&1_i64, &64_i64]);
        assert!(plan.contains("visitors_expiry"), "{plan}");
        assert_eq!(
            store.upload_usage("lobby", 2).unwrap().room_bytes,
            5,
            "old uploads still count"
        );
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(unix)]
    #[test]
    fn m6_the_state_directory_and_the_database_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("webchat-m6-{}", random_hex(6)));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let store = Store::open(&dir).unwrap();
        store.claim_room("Lobby", "code-1234", 1).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
