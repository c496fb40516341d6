//! The Connector's own state in the runtime's storage, through its author store
//! ([`AuthorStore`]): rooms with their hashed codes and bound channel, visitor sessions
//! (hashed tokens), the day's upload reservations and the rooms' wrong-code budgets. Every
//! replica on one PostgreSQL database reads and writes the same records, so nothing here is
//! trusted from one process's memory. The conversations are in `messages.rs`; an older
//! version's `webchat.sqlite3` is moved here once by `legacy.rs`.
//!
//! Records (namespaces of the author store; keys compared as bytes):
//! - `webchat.rooms`: `{room_id}` -> the room (JSON: name, salted code hashes, channel,
//!   holder).
//! - `webchat.room_channels`: `{channel_id}` -> the room the channel serves.
//! - `webchat.visitors`: `{sha256(token)}` -> the session (room, created, expires); a revoked
//!   session is deleted. `webchat.room_visitors` `{room_id}/{sha256(token)}` and
//!   `webchat.visitor_expiry` `{expires_at:020}.{sha256(token)}` index it (a room's sessions
//!   end together; expired ones are pruned in bounded batches through the expiry order).
//! - `webchat.uploads`: `{created_at:020}.{id}` -> one upload's bytes in a room, `pending`
//!   while it is being written.
//! - `webchat.guesses`: `{scope}/{room_id}/{at:020}.{id}` -> one wrong code tried for a room
//!   (`scope` is `join` or `signin`), what the room's budget is computed from.
//! - `webchat.room_claims`: `{room_id}/{id}`: a replica creating the room (see
//!   [`Store::claim_room`]).
//!
//! Without a conditional write in the author store, the limits that must hold across
//! replicas (quota, wrong-code budget, one creator per room) write first and check second:
//! a request commits its own record, then reads every record of the window and counts the
//! others; of two concurrent requests the later one always sees the earlier one's record, so
//! the sum never passes the limit (when two replicas race, one may be refused that a lone
//! request would not be; the requests of one process take turns, so they never do).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use xagent_protocol_types::ConnectorChannelId;
use xagent_server_runtime::storage::StorageError;
use xagent_server_runtime::{AuthorScan, AuthorStore, AuthorStoreError, AuthorWrite};

use crate::error::WebchatError;
use crate::rate::CellRate;

/// File name of the database older versions kept inside the state directory (moved into the
/// runtime's storage at start, then renamed `webchat.sqlite3.migrated`).
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadReservation {
    /// The reservation's record key.
    pub id: String,
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
    pub(crate) fn parse(text: &str) -> Self {
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

const ROOMS: &str = "webchat.rooms";
const ROOM_CHANNELS: &str = "webchat.room_channels";
const VISITORS: &str = "webchat.visitors";
const ROOM_VISITORS: &str = "webchat.room_visitors";
const VISITOR_EXPIRY: &str = "webchat.visitor_expiry";
const UPLOADS: &str = "webchat.uploads";
const GUESSES: &str = "webchat.guesses";
const ROOM_CLAIMS: &str = "webchat.room_claims";

/// Records one scan reads per page when it walks a window.
const PAGE: usize = 500;

/// A reservation still `pending` this long after it was made belongs to an upload whose
/// process stopped (a live upload settles or releases it long before): it no longer counts.
pub(crate) const STALE_RESERVATION_MILLIS: u64 = 60 * 60 * 1_000;

/// Most expired sessions, old uploads or old wrong codes one request prunes (so a request's
/// cost stays bounded however many records aged out meanwhile).
pub(crate) const SESSION_PRUNE_BATCH: usize = 64;

fn failed(error: AuthorStoreError) -> WebchatError {
    WebchatError::Storage(StorageError::new("the webchat state", error))
}

/// The SQLite store's successor: the Connector's own records in the runtime's storage.
#[derive(Clone)]
pub struct Store {
    authors: AuthorStore,
    /// One quota reservation of this process decides at a time (so this process's requests
    /// never refuse each other; only other replicas' can race with one).
    reserving: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// One room creation of this process at a time (the same, for room claims).
    creating: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
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

/// Whether `room_id` is the form [`room_id_from_name`] gives (what a URL's room must be
/// before it is looked up).
pub(crate) fn is_room_id(room_id: &str) -> bool {
    room_id_from_name(room_id).as_deref() == Some(room_id)
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

/// A room's stored record, as both sign-in paths read it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RoomRecord {
    pub(crate) name: String,
    pub(crate) code_salt: String,
    pub(crate) code_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) channel: Option<String>,
    /// The owner code's salt and hash, when the room has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) owner: Option<(String, String)>,
    /// The channel that holds the room (F7): the one that created, paired or last moved it,
    /// kept when it signs out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) holder: Option<String>,
    pub(crate) created_at: u64,
}

impl RoomRecord {
    fn room(self, room_id: String) -> Room {
        Room { room_id, name: self.name, channel: self.channel.map(ConnectorChannelId::new) }
    }
}

/// One visitor session (the token itself is never stored, only its hash is the key).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct VisitorRecord {
    pub(crate) room_id: String,
    pub(crate) created_at: u64,
    pub(crate) expires_at: u64,
}

/// One upload's share of the day's quota.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct UploadRecord {
    pub(crate) room_id: String,
    pub(crate) bytes: u64,
    pub(crate) created_at: u64,
    #[serde(default)]
    pub(crate) pending: bool,
}

/// A wrong-code try held for a room (see [`Store::begin_guess`]): forget it when the code
/// was right, keep it when it was wrong.
#[derive(Debug)]
pub(crate) struct GuessTry {
    key: String,
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

fn expiry_key(expires_at: u64, token_hash: &str) -> String {
    format!("{expires_at:020}.{token_hash}")
}

/// The three records of a visitor session.
pub(crate) fn visitor_writes(
    token_hash: &str,
    visitor: &VisitorRecord,
) -> Result<Vec<AuthorWrite>, WebchatError> {
    Ok(vec![
        AuthorWrite::put_json(VISITORS, token_hash, visitor).map_err(failed)?,
        AuthorWrite::put(ROOM_VISITORS, &format!("{}/{token_hash}", visitor.room_id), Vec::new())
            .map_err(failed)?,
        AuthorWrite::put(
            VISITOR_EXPIRY,
            &expiry_key(visitor.expires_at, token_hash),
            visitor.room_id.clone(),
        )
        .map_err(failed)?,
    ])
}

fn visitor_deletes(
    token_hash: &str,
    visitor: &VisitorRecord,
) -> Result<Vec<AuthorWrite>, WebchatError> {
    Ok(vec![
        AuthorWrite::delete(VISITORS, token_hash).map_err(failed)?,
        AuthorWrite::delete(ROOM_VISITORS, &format!("{}/{token_hash}", visitor.room_id))
            .map_err(failed)?,
        AuthorWrite::delete(VISITOR_EXPIRY, &expiry_key(visitor.expires_at, token_hash))
            .map_err(failed)?,
    ])
}

/// The record writes of a room (its record, and the channel's index when it has one).
pub(crate) fn room_writes(
    room_id: &str,
    room: &RoomRecord,
) -> Result<Vec<AuthorWrite>, WebchatError> {
    let mut writes = vec![AuthorWrite::put_json(ROOMS, room_id, room).map_err(failed)?];
    if let Some(channel) = &room.channel {
        writes.push(AuthorWrite::put(ROOM_CHANNELS, channel, room_id).map_err(failed)?);
    }
    Ok(writes)
}

/// The record of one upload, under a key that orders the uploads by time.
pub(crate) fn upload_write(id: &str, upload: &UploadRecord) -> Result<AuthorWrite, WebchatError> {
    AuthorWrite::put_json(UPLOADS, id, upload).map_err(failed)
}

/// The key of an upload made at `created_at`, distinct by `suffix`.
pub(crate) fn upload_key(created_at: u64, suffix: &str) -> String {
    format!("{created_at:020}.{suffix}")
}

impl Store {
    /// The Connector's records in `authors` (the runtime's author store).
    pub fn new(authors: AuthorStore) -> Self {
        Self { authors, reserving: Default::default(), creating: Default::default() }
    }

    /// The author store underneath (tests).
    #[cfg(test)]
    pub(crate) fn authors(&self) -> &AuthorStore {
        &self.authors
    }

    /// A store over a fresh in-memory SQLite storage (tests).
    #[cfg(test)]
    pub fn in_memory() -> Result<Self, WebchatError> {
        let storage = xagent_server_runtime::storage::SqliteStorage::in_memory()
            .map_err(|e| StorageError::new("an in-memory storage", e))?;
        Ok(Self::new(AuthorStore::new(std::sync::Arc::new(storage))))
    }

    /// Gives back every pending upload reservation: called at start when this process is the
    /// only one on its storage (SQLite), so none of them belongs to a live upload.
    pub(crate) async fn release_all_pending_uploads(&self) -> Result<usize, WebchatError> {
        let mut released = 0;
        let mut scan = AuthorScan::prefix("", PAGE);
        loop {
            let page = self.authors.scan(UPLOADS, &scan).await.map_err(failed)?;
            let Some(last) = page.last() else { break };
            scan = scan.clone().after(last.key.clone());
            let mut writes = Vec::new();
            for record in page {
                if record.json::<UploadRecord>().is_ok_and(|u| u.pending) {
                    writes.push(AuthorWrite::delete(UPLOADS, &record.key).map_err(failed)?);
                }
            }
            released += writes.len();
            if !writes.is_empty() {
                self.authors.commit(writes).await.map_err(failed)?;
            }
        }
        Ok(released)
    }

    async fn room_record(&self, room_id: &str) -> Result<Option<RoomRecord>, WebchatError> {
        if !is_room_id(room_id) {
            return Ok(None);
        }
        self.authors.get_json(ROOMS, room_id).await.map_err(failed)
    }

    /// Creates the room `room_id` named `name` with the access `code` (at least
    /// [`MIN_ACCESS_CODE_CHARS`] characters) and, when given, the owner code. `Ok(None)`:
    /// another request (on any replica) created it or is creating it at the same time; read
    /// it again.
    async fn create_room(
        &self,
        room_id: &str,
        name: &str,
        code: &str,
        owner: Option<&str>,
        now: u64,
    ) -> Result<Option<Room>, WebchatError> {
        if code.chars().count() < MIN_ACCESS_CODE_CHARS {
            return Err(WebchatError::InvalidInput(format!(
                "a new room's access code needs at least {MIN_ACCESS_CODE_CHARS} characters"
            )));
        }
        let _turn = self.creating.lock().await;
        // One creator per room across replicas: claim first, then look for other claims,
        // then for the room (in that order: a creator that finished deleted its claim after
        // writing the room, so whoever misses the claim sees the room).
        let claim = format!("{room_id}/{}", random_hex(8));
        self.authors.put(ROOM_CLAIMS, &claim, Vec::new()).await.map_err(failed)?;
        let claims = self
            .authors
            .scan(ROOM_CLAIMS, &AuthorScan::prefix(format!("{room_id}/"), 2))
            .await
            .map_err(failed)?;
        let contested = claims.iter().any(|c| c.key != claim);
        if contested || self.room_record(room_id).await?.is_some() {
            self.authors.delete(ROOM_CLAIMS, &claim).await.map_err(failed)?;
            return Ok(None);
        }
        let (code_salt, code_hash) = salted_hash(code);
        let record = RoomRecord {
            name: name.trim().to_owned(),
            code_salt,
            code_hash,
            channel: None,
            owner: owner.map(salted_hash),
            holder: None,
            created_at: now,
        };
        let mut writes = room_writes(room_id, &record)?;
        writes.push(AuthorWrite::delete(ROOM_CLAIMS, &claim).map_err(failed)?);
        self.authors.commit(writes).await.map_err(failed)?;
        Ok(Some(record.room(room_id.to_owned())))
    }

    /// The error of a room another request was creating at the same moment.
    fn creating_elsewhere() -> WebchatError {
        WebchatError::InvalidInput(
            "this room is being created by another request right now; try again".into(),
        )
    }

    /// Creates the room `name` with `code`, or checks `code` against the existing room.
    pub async fn claim_room(
        &self,
        name: &str,
        code: &str,
        now: u64,
    ) -> Result<RoomClaim, WebchatError> {
        let room_id = room_id_or_error(name)?;
        for _ in 0..2 {
            match self.room_record(&room_id).await? {
                Some(row) if code_matches(&row.code_salt, code, &row.code_hash) => {
                    return Ok(RoomClaim::Matched(row.room(room_id)));
                }
                Some(_) => return Ok(RoomClaim::WrongCode),
                None => {
                    if let Some(room) = self.create_room(&room_id, name, code, None, now).await? {
                        return Ok(RoomClaim::Created(room));
                    }
                }
            }
        }
        Err(Self::creating_elsewhere())
    }

    /// The form flow's sign-in of `channel` to the room `name` (M9, F7). The access code is
    /// the visitors' secret; the owner code is xAgent's. A new room needs both and stores them
    /// hashed. An existing room is served by `channel` when: the owner code is right (a
    /// different access code then replaces the old one and ends every visitor session), or the
    /// access code is right and `channel` holds the room (serves it, or created, paired or
    /// last moved it). A room without an owner code (paired, or from an older release) never
    /// changes hands: it gets the owner code its holder brings, and one that no channel ever
    /// held is claimed only together with an owner code.
    pub async fn sign_in_room(
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
        let mut found = self.room_record(&room_id).await?;
        if found.is_none() {
            // F7: a room without an owner code could change hands; new ones need one.
            let Some(owner) = owner_code else { return Ok(SignIn::OwnerCodeNeeded) };
            match self.create_room(&room_id, name, access_code, Some(owner), now).await? {
                Some(room) => return Ok(SignIn::Created(room)),
                None => found = self.room_record(&room_id).await?,
            }
        }
        let Some(row) = found else { return Err(Self::creating_elsewhere()) };
        let code_right = code_matches(&row.code_salt, access_code, &row.code_hash);
        let owner_right = match (owner_code, &row.owner) {
            (Some(owner), Some((salt, hash))) => Some(code_matches(salt, owner, hash)),
            _ => None,
        };
        let serves = row.channel.as_deref() == Some(channel.as_str());
        let holds = serves || row.holder.as_deref() == Some(channel.as_str());
        let (has_owner, unclaimed) =
            (row.owner.is_some(), row.channel.is_none() && row.holder.is_none());
        let room = row.clone().room(room_id.clone());
        match owner_right {
            Some(false) => Ok(SignIn::WrongOwner),
            Some(true) if code_right => Ok(SignIn::Matched(room)),
            Some(true) => {
                if access_code.chars().count() < MIN_ACCESS_CODE_CHARS {
                    return Err(WebchatError::InvalidInput(format!(
                        "the access code needs at least {MIN_ACCESS_CODE_CHARS} characters"
                    )));
                }
                let (code_salt, code_hash) = salted_hash(access_code);
                self.update_room(&room_id, |r| {
                    r.code_salt = code_salt;
                    r.code_hash = code_hash;
                })
                .await?;
                let revoked = self.revoke_room_visitors(&room_id).await?;
                Ok(SignIn::Rotated { room, revoked })
            }
            None if !code_right => Ok(SignIn::WrongCode),
            // The channel holding the room comes back; a room without an owner code gets
            // the one it brings.
            None if holds => {
                if let (false, Some(owner)) = (has_owner, owner_code) {
                    self.set_owner(&room_id, owner).await?;
                }
                Ok(SignIn::Matched(room))
            }
            // F7: a room without an owner code never changes hands. Only one no channel
            // ever held (an older database) is claimed, and only with an owner code.
            None if !has_owner && unclaimed && owner_code.is_some() => {
                if let Some(owner) = owner_code {
                    self.set_owner(&room_id, owner).await?;
                }
                Ok(SignIn::Matched(room))
            }
            None => Ok(SignIn::OwnerRequired),
        }
    }

    /// Reads, changes and writes back one room's record (a change of an existing room is
    /// its last writer's).
    async fn update_room(
        &self,
        room_id: &str,
        change: impl FnOnce(&mut RoomRecord),
    ) -> Result<Option<RoomRecord>, WebchatError> {
        let Some(mut record) = self.room_record(room_id).await? else { return Ok(None) };
        change(&mut record);
        self.authors
            .commit(vec![AuthorWrite::put_json(ROOMS, room_id, &record).map_err(failed)?])
            .await
            .map_err(failed)?;
        Ok(Some(record))
    }

    async fn set_owner(&self, room_id: &str, owner: &str) -> Result<(), WebchatError> {
        let hashed = salted_hash(owner);
        self.update_room(room_id, |r| r.owner = Some(hashed)).await?;
        Ok(())
    }

    /// Ends every visitor session of a room (its owner changed the access code); returns how
    /// many were open.
    pub async fn revoke_room_visitors(&self, room_id: &str) -> Result<usize, WebchatError> {
        let prefix = format!("{room_id}/");
        let mut revoked = 0;
        loop {
            // Each page's sessions are deleted before the next read, so the first page is
            // always the rest.
            let page = self
                .authors
                .scan(ROOM_VISITORS, &AuthorScan::prefix(prefix.clone(), PAGE))
                .await
                .map_err(failed)?;
            if page.is_empty() {
                break;
            }
            let mut writes = Vec::new();
            for record in page {
                let token_hash = &record.key[prefix.len()..];
                match self.authors.get_json::<VisitorRecord>(VISITORS, token_hash).await {
                    Ok(Some(visitor)) if visitor.room_id == room_id => {
                        writes.extend(visitor_deletes(token_hash, &visitor)?);
                        revoked += 1;
                    }
                    // The index outlived its session: drop the index alone.
                    _ => writes
                        .push(AuthorWrite::delete(ROOM_VISITORS, &record.key).map_err(failed)?),
                }
            }
            self.authors.commit(writes).await.map_err(failed)?;
        }
        Ok(revoked)
    }

    /// Checks a visitor's access code for a room (constant-time comparison of the hashes).
    pub async fn check_code(&self, room_id: &str, code: &str) -> Result<bool, WebchatError> {
        let row = self.room_record(room_id).await?;
        Ok(row.is_some_and(|row| code_matches(&row.code_salt, code, &row.code_hash)))
    }

    /// Binds the room to a channel (or unbinds it) and returns the channel it had before. A
    /// channel serves one room: any other room it served loses it.
    pub async fn set_room_channel(
        &self,
        room_id: &str,
        channel: Option<&ConnectorChannelId>,
    ) -> Result<Option<ConnectorChannelId>, WebchatError> {
        let Some(mut record) = self.room_record(room_id).await? else { return Ok(None) };
        let previous = record.channel.take();
        let mut writes = Vec::new();
        if let Some(previous) = previous.as_deref()
            && Some(previous) != channel.map(ConnectorChannelId::as_str)
        {
            writes.push(AuthorWrite::delete(ROOM_CHANNELS, previous).map_err(failed)?);
        }
        if let Some(channel) = channel {
            // One binding per channel: signing it in to this room moves it out of any other.
            if let Some(other) = self.channel_room(channel).await?
                && other != room_id
                && let Some(mut other_record) = self.room_record(&other).await?
                && other_record.channel.as_deref() == Some(channel.as_str())
            {
                other_record.channel = None;
                writes.push(AuthorWrite::put_json(ROOMS, &other, &other_record).map_err(failed)?);
            }
            record.channel = Some(channel.as_str().to_owned());
            // F7: the channel a room is bound to holds it, also after it signs out.
            record.holder = Some(channel.as_str().to_owned());
        }
        writes.extend(room_writes(room_id, &record)?);
        self.authors.commit(writes).await.map_err(failed)?;
        Ok(previous.map(ConnectorChannelId::new))
    }

    async fn channel_room(
        &self,
        channel: &ConnectorChannelId,
    ) -> Result<Option<String>, WebchatError> {
        let value = self.authors.get(ROOM_CHANNELS, channel.as_str()).await.map_err(failed)?;
        Ok(value.and_then(|v| String::from_utf8(v).ok()))
    }

    /// Unbinds every room served by `channel`.
    pub async fn release_channel(&self, channel: &ConnectorChannelId) -> Result<(), WebchatError> {
        let Some(room_id) = self.channel_room(channel).await? else { return Ok(()) };
        let mut writes =
            vec![AuthorWrite::delete(ROOM_CHANNELS, channel.as_str()).map_err(failed)?];
        if let Some(mut record) = self.room_record(&room_id).await?
            && record.channel.as_deref() == Some(channel.as_str())
        {
            record.channel = None;
            writes.push(AuthorWrite::put_json(ROOMS, &room_id, &record).map_err(failed)?);
        }
        self.authors.commit(writes).await.map_err(failed)
    }

    /// A room by id.
    pub async fn room(&self, room_id: &str) -> Result<Option<Room>, WebchatError> {
        Ok(self.room_record(room_id).await?.map(|r| r.room(room_id.to_owned())))
    }

    /// The room a channel serves.
    pub async fn room_by_channel(
        &self,
        channel: &ConnectorChannelId,
    ) -> Result<Option<Room>, WebchatError> {
        let Some(room_id) = self.channel_room(channel).await? else { return Ok(None) };
        let room = self.room(&room_id).await?;
        Ok(room.filter(|r| r.channel.as_ref() == Some(channel)))
    }

    /// Starts a visitor session in a room and returns its bearer token (stored hashed),
    /// valid until `expires_at` (Unix ms) unless revoked earlier.
    pub async fn add_visitor(
        &self,
        room_id: &str,
        now: u64,
        expires_at: u64,
    ) -> Result<String, WebchatError> {
        let token = format!("wcv_{}", random_hex(24));
        let visitor = VisitorRecord { room_id: room_id.to_owned(), created_at: now, expires_at };
        let mut writes = visitor_writes(&hash_token(&token), &visitor)?;
        // Expired sessions are of no use to anybody: one bounded batch per join, found in
        // expiry order (F12: never a walk over every session).
        let expired = self
            .authors
            .scan(VISITOR_EXPIRY, &AuthorScan::prefix("", SESSION_PRUNE_BATCH))
            .await
            .map_err(failed)?;
        for record in expired {
            let Some((at, token_hash)) = record.key.split_once('.') else { continue };
            if at.parse::<u64>().map_or(true, |at| at > now) {
                break;
            }
            let room = String::from_utf8(record.value).unwrap_or_default();
            writes.push(AuthorWrite::delete(VISITORS, token_hash).map_err(failed)?);
            writes.push(
                AuthorWrite::delete(ROOM_VISITORS, &format!("{room}/{token_hash}"))
                    .map_err(failed)?,
            );
            writes.push(AuthorWrite::delete(VISITOR_EXPIRY, &record.key).map_err(failed)?);
        }
        self.authors.commit(writes).await.map_err(failed)?;
        Ok(token)
    }

    /// The room a visitor token opens at `now`: `None` for unknown, expired or revoked
    /// tokens.
    pub async fn visitor_room(
        &self,
        token: &str,
        now: u64,
    ) -> Result<Option<String>, WebchatError> {
        Ok(self.visitor_session(token, now).await?.map(|session| session.room_id))
    }

    /// [`Store::visitor_room`] with the session's end: what a live stream needs to end with
    /// its session (F4).
    pub async fn visitor_session(
        &self,
        token: &str,
        now: u64,
    ) -> Result<Option<VisitorSession>, WebchatError> {
        let visitor: Option<VisitorRecord> =
            self.authors.get_json(VISITORS, &hash_token(token)).await.map_err(failed)?;
        Ok(visitor
            .filter(|v| now < v.expires_at)
            .map(|v| VisitorSession { room_id: v.room_id, expires_at: v.expires_at }))
    }

    /// Ends one visitor session (the page's "leave"). True when it existed.
    pub async fn revoke_visitor(&self, token: &str) -> Result<bool, WebchatError> {
        let token_hash = hash_token(token);
        let visitor: Option<VisitorRecord> =
            self.authors.get_json(VISITORS, &token_hash).await.map_err(failed)?;
        let Some(visitor) = visitor else { return Ok(false) };
        self.authors.commit(visitor_deletes(&token_hash, &visitor)?).await.map_err(failed)?;
        Ok(true)
    }

    /// The uploads of the day before `now` (`(key, record)`, oldest first), pruning one
    /// bounded batch of older ones on the way.
    async fn uploads_of_the_day(
        &self,
        now: u64,
    ) -> Result<Vec<(String, UploadRecord)>, WebchatError> {
        let since = now.saturating_sub(DAY_MILLIS);
        let oldest = self
            .authors
            .scan(UPLOADS, &AuthorScan::prefix("", SESSION_PRUNE_BATCH))
            .await
            .map_err(failed)?;
        let mut prune = Vec::new();
        for record in &oldest {
            if record.key.as_str() >= upload_key(since, "").as_str() {
                break;
            }
            prune.push(AuthorWrite::delete(UPLOADS, &record.key).map_err(failed)?);
        }
        if !prune.is_empty() {
            self.authors.commit(prune).await.map_err(failed)?;
        }
        let mut out = Vec::new();
        // Keys of `since` or later: after the key just below it.
        let mut scan = AuthorScan::prefix("", PAGE).after(upload_key(since.saturating_sub(1), "~"));
        loop {
            let page = self.authors.scan(UPLOADS, &scan).await.map_err(failed)?;
            let Some(last) = page.last() else { break };
            scan = scan.clone().after(last.key.clone());
            for record in page {
                match record.json::<UploadRecord>() {
                    Ok(upload) => out.push((record.key, upload)),
                    Err(error) => tracing::warn!(%error, "an upload record does not decode"),
                }
            }
        }
        Ok(out)
    }

    /// Visitor uploads of the last day (for the room and for everybody), reservations of
    /// uploads still being written included, the one under `except` not.
    async fn usage(
        &self,
        room_id: &str,
        now: u64,
        except: Option<&str>,
    ) -> Result<UploadUsage, WebchatError> {
        let mut usage = UploadUsage::default();
        for (key, upload) in self.uploads_of_the_day(now).await? {
            let stale =
                upload.pending && upload.created_at.saturating_add(STALE_RESERVATION_MILLIS) <= now;
            if stale || Some(key.as_str()) == except {
                continue;
            }
            if upload.room_id == room_id {
                usage.room_bytes = usage.room_bytes.saturating_add(upload.bytes);
                usage.room_files += 1;
            }
            usage.all_bytes = usage.all_bytes.saturating_add(upload.bytes);
            usage.all_files += 1;
        }
        Ok(usage)
    }

    /// Visitor uploads of the last day (for the room and for everybody), reservations of
    /// uploads still being written included.
    #[cfg(test)]
    pub async fn upload_usage(&self, room_id: &str, now: u64) -> Result<UploadUsage, WebchatError> {
        self.usage(room_id, now, None).await
    }

    /// Reserves one file and up to `want` bytes of the day's visitor quota for an upload to
    /// `room_id`, before any byte is stored (F14). The reservation is written first and the
    /// quota checked against every other record after it (see the module docs), so
    /// concurrent uploads on any replica can never pass the quota together. It holds the
    /// smaller of `want` and what the room and everybody have left;
    /// [`Store::settle_upload`] turns it into the real size, [`Store::release_upload`] gives
    /// it back.
    pub async fn reserve_upload(
        &self,
        room_id: &str,
        want: u64,
        quota: &crate::quota::UploadQuota,
        now: u64,
    ) -> Result<Result<UploadReservation, QuotaRefusal>, WebchatError> {
        let _turn = self.reserving.lock().await;
        let id = upload_key(now, &random_hex(8));
        let mut upload = UploadRecord {
            room_id: room_id.to_owned(),
            bytes: want,
            created_at: now,
            pending: true,
        };
        self.authors.commit(vec![upload_write(&id, &upload)?]).await.map_err(failed)?;
        let usage = self.usage(room_id, now, Some(&id)).await?;
        let room_left = quota.room_bytes.saturating_sub(usage.room_bytes);
        let all_left = quota.all_bytes.saturating_sub(usage.all_bytes);
        let refusal = if room_left == 0 || usage.room_files >= quota.room_files {
            Some(QuotaRefusal::Room)
        } else if all_left == 0 || usage.all_files >= quota.all_files {
            Some(QuotaRefusal::Everybody)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            self.authors.delete(UPLOADS, &id).await.map_err(failed)?;
            return Ok(Err(refusal));
        }
        let bytes = want.min(room_left).min(all_left);
        if bytes < want {
            upload.bytes = bytes;
            self.authors.commit(vec![upload_write(&id, &upload)?]).await.map_err(failed)?;
        }
        Ok(Ok(UploadReservation { id, bytes }))
    }

    /// Turns a reservation into the upload's real size (at most the reserved bytes).
    pub async fn settle_upload(&self, id: &str, bytes: u64) -> Result<(), WebchatError> {
        let upload: Option<UploadRecord> =
            self.authors.get_json(UPLOADS, id).await.map_err(failed)?;
        let Some(mut upload) = upload else { return Ok(()) };
        upload.bytes = upload.bytes.min(bytes);
        upload.pending = false;
        self.authors.commit(vec![upload_write(id, &upload)?]).await.map_err(failed)
    }

    /// Gives a reservation back (the upload failed or was abandoned).
    pub async fn release_upload(&self, id: &str) -> Result<(), WebchatError> {
        let upload: Option<UploadRecord> =
            self.authors.get_json(UPLOADS, id).await.map_err(failed)?;
        if upload.is_some_and(|u| u.pending) {
            self.authors.delete(UPLOADS, id).await.map_err(failed)?;
        }
        Ok(())
    }

    /// Takes one wrong-code try from the budget of `room` in `scope` (`join`, `signin`) at
    /// `now`, before the code is checked: `Ok(Err(wait))` when the budget is spent (nothing
    /// is kept; `wait` ms until it refills). The try is written first and the budget computed
    /// from every other try of the window after it (see the module docs), so replicas share
    /// one budget. [`Store::forget_guess`] gives a right code's try back.
    pub(crate) async fn begin_guess(
        &self,
        scope: &str,
        room_id: &str,
        rate: CellRate,
        now: u64,
    ) -> Result<Result<GuessTry, u64>, WebchatError> {
        let prefix = format!("{scope}/{room_id}/");
        let key = format!("{prefix}{now:020}.{}", random_hex(8));
        // Older tries than twice the burst's span no longer matter: one bounded batch goes.
        let window = rate.interval_millis.saturating_mul(u64::from(rate.burst).max(1)) * 2;
        let since = format!("{prefix}{:020}", now.saturating_sub(window));
        let mut writes = vec![AuthorWrite::put(GUESSES, &key, Vec::new()).map_err(failed)?];
        let oldest = self
            .authors
            .scan(GUESSES, &AuthorScan::prefix(prefix.clone(), SESSION_PRUNE_BATCH))
            .await
            .map_err(failed)?;
        for record in oldest.iter().take_while(|r| r.key < since) {
            writes.push(AuthorWrite::delete(GUESSES, &record.key).map_err(failed)?);
        }
        self.authors.commit(writes).await.map_err(failed)?;
        let mut tries = Vec::new();
        let mut scan = AuthorScan::prefix(prefix.clone(), PAGE).after(since);
        loop {
            let page = self.authors.scan(GUESSES, &scan).await.map_err(failed)?;
            let Some(last) = page.last() else { break };
            scan = scan.clone().after(last.key.clone());
            for record in page {
                if record.key == key {
                    continue;
                }
                let at = record.key[prefix.len()..]
                    .split_once('.')
                    .and_then(|(at, _)| at.parse::<u64>().ok());
                tries.extend(at);
            }
        }
        let wait = crate::guess::room_wait(rate, &tries, now);
        if wait > 0 {
            self.authors.delete(GUESSES, &key).await.map_err(failed)?;
            return Ok(Err(wait));
        }
        Ok(Ok(GuessTry { key }))
    }

    /// The code of `guess` was right: it does not count against the room.
    pub(crate) async fn forget_guess(&self, guess: GuessTry) -> Result<(), WebchatError> {
        self.authors.delete(GUESSES, &guess.key).await.map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::UploadQuota;

    #[test]
    fn room_ids_are_url_safe_slugs() {
        assert_eq!(room_id_from_name("  Support Desk #1 ").as_deref(), Some("support-desk-1"));
        assert_eq!(room_id_from_name("déjà vu").as_deref(), Some("d-j-vu"));
        assert_eq!(room_id_from_name("***"), None);
        assert_eq!(room_id_from_name(""), None);
        assert_eq!(room_id_from_name(&"a".repeat(65)), None);
        assert!(is_room_id("support-desk-1"));
        assert!(!is_room_id("Lobby") && !is_room_id("a/b") && !is_room_id(""));
    }

    #[tokio::test]
    async fn claiming_a_room_with_another_code_is_refused() {
        let store = Store::in_memory().unwrap();
        assert!(matches!(
            store.claim_room("Lobby", "s3cret-1", 1).await.unwrap(),
            RoomClaim::Created(_)
        ));
        assert!(matches!(
            store.claim_room("lobby", "s3cret-1", 2).await.unwrap(),
            RoomClaim::Matched(_)
        ));
        assert_eq!(store.claim_room("LOBBY", "guess", 3).await.unwrap(), RoomClaim::WrongCode);
        assert!(store.check_code("lobby", "s3cret-1").await.unwrap());
        assert!(!store.check_code("lobby", "s3cret-").await.unwrap());
        assert!(!store.check_code("nowhere", "s3cret-1").await.unwrap());
        assert!(!store.check_code("no/where", "s3cret-1").await.unwrap(), "not a room id");
        // Nothing of the creation's claim is left behind.
        assert_eq!(store.authors().count(ROOM_CLAIMS, "").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_room_another_request_is_creating_is_not_created_twice() {
        let store = Store::in_memory().unwrap();
        // Another replica's claim is in flight: this request backs off instead of writing a
        // second room over the first.
        store.authors().put(ROOM_CLAIMS, "lobby/other", Vec::new()).await.unwrap();
        assert!(matches!(
            store.claim_room("Lobby", "code-1234", 1).await,
            Err(WebchatError::InvalidInput(_))
        ));
        assert!(store.room("lobby").await.unwrap().is_none());
        assert_eq!(store.authors().count(ROOM_CLAIMS, "").await.unwrap(), 1, "only theirs");
        store.authors().delete(ROOM_CLAIMS, "lobby/other").await.unwrap();
        assert!(matches!(
            store.claim_room("Lobby", "code-1234", 1).await.unwrap(),
            RoomClaim::Created(_)
        ));
    }

    #[tokio::test]
    async fn access_codes_are_stored_hashed_never_in_clear() {
        let store = Store::in_memory().unwrap();
        store.claim_room("Lobby", "plain-code-123", 1).await.unwrap();
        let raw = store.authors().get(ROOMS, "lobby").await.unwrap().unwrap();
        let raw = String::from_utf8(raw).unwrap();
        assert!(!raw.contains("plain-code-123"));
        let record: RoomRecord = serde_json::from_str(&raw).unwrap();
        assert_eq!(record.code_hash.len(), 64);
    }

    #[tokio::test]
    async fn channel_binding_moves_and_releases() {
        let store = Store::in_memory().unwrap();
        store.claim_room("Lobby", "code-1234", 1).await.unwrap();
        let a = ConnectorChannelId::new("cch_a");
        let b = ConnectorChannelId::new("cch_b");
        assert_eq!(store.set_room_channel("lobby", Some(&a)).await.unwrap(), None);
        assert_eq!(store.set_room_channel("lobby", Some(&b)).await.unwrap(), Some(a.clone()));
        assert_eq!(store.room_by_channel(&b).await.unwrap().unwrap().room_id, "lobby");
        assert!(store.room_by_channel(&a).await.unwrap().is_none());
        store.release_channel(&b).await.unwrap();
        assert_eq!(store.room("lobby").await.unwrap().unwrap().channel, None);
        assert!(store.room_by_channel(&b).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn m9_the_access_code_alone_never_moves_a_room_the_owner_code_does() {
        let store = Store::in_memory().unwrap();
        let (a, b) = (ConnectorChannelId::new("cch_a"), ConnectorChannelId::new("cch_b"));
        let created =
            store.sign_in_room("Lobby", "visit-1234", Some("owner-5678"), &a, 1).await.unwrap();
        let SignIn::Created(room) = created else { panic!("created: {created:?}") };
        store.set_room_channel(&room.room_id, Some(&a)).await.unwrap();
        let token = store.add_visitor("lobby", 1, 1_000).await.unwrap();
        // A channel that knows only the visitors' code cannot take the room over.
        assert_eq!(
            store.sign_in_room("Lobby", "visit-1234", None, &b, 2).await.unwrap(),
            SignIn::OwnerRequired
        );
        assert_eq!(
            store.sign_in_room("Lobby", "visit-1234", Some("guess-guess"), &b, 2).await.unwrap(),
            SignIn::WrongOwner
        );
        // The serving channel signs in again with the access code alone.
        assert!(matches!(
            store.sign_in_room("Lobby", "visit-1234", None, &a, 2).await.unwrap(),
            SignIn::Matched(_)
        ));
        // The owner moves it, and may rotate the visitors' code: every session ends.
        assert!(matches!(
            store.sign_in_room("Lobby", "visit-1234", Some("owner-5678"), &b, 3).await.unwrap(),
            SignIn::Matched(_)
        ));
        let rotated =
            store.sign_in_room("Lobby", "visit-9999", Some("owner-5678"), &b, 4).await.unwrap();
        assert!(matches!(rotated, SignIn::Rotated { revoked: 1, .. }), "{rotated:?}");
        assert_eq!(store.visitor_room(&token, 5).await.unwrap(), None);
        assert!(store.check_code("lobby", "visit-9999").await.unwrap());
        assert!(!store.check_code("lobby", "visit-1234").await.unwrap());
    }

    #[tokio::test]
    async fn new_room_requires_an_owner_code() {
        let store = Store::in_memory().unwrap();
        let a = ConnectorChannelId::new("cch_a");
        assert_eq!(
            store.sign_in_room("Desk", "desk-code-1", None, &a, 1).await.unwrap(),
            SignIn::OwnerCodeNeeded
        );
        assert!(store.room("desk").await.unwrap().is_none(), "nothing was created");
        assert!(matches!(
            store.sign_in_room("Desk", "desk-code-1", Some("desk-owner-1"), &a, 1).await.unwrap(),
            SignIn::Created(_)
        ));
    }

    #[tokio::test]
    async fn room_without_owner_code_cannot_change_hands() {
        let store = Store::in_memory().unwrap();
        let (a, b) = (ConnectorChannelId::new("cch_a"), ConnectorChannelId::new("cch_b"));
        // A paired room: no owner code, bound to the pairing channel.
        store.claim_room("Paired", "paired-code-1", 1).await.unwrap();
        store.set_room_channel("paired", Some(&a)).await.unwrap();
        store.release_channel(&a).await.unwrap();
        // Its creator signed out; another channel with the visitors' code (and an owner code
        // of its own) does not get it, however often it asks.
        for at in [2, 3] {
            assert_eq!(
                store
                    .sign_in_room("Paired", "paired-code-1", Some("b-owner-code"), &b, at)
                    .await
                    .unwrap(),
                SignIn::OwnerRequired
            );
        }
        // The channel that holds it comes back, and the owner code it brings is the room's.
        assert!(matches!(
            store
                .sign_in_room("Paired", "paired-code-1", Some("a-owner-code"), &a, 4)
                .await
                .unwrap(),
            SignIn::Matched(_)
        ));
        assert_eq!(
            store
                .sign_in_room("Paired", "paired-code-1", Some("b-owner-code"), &b, 5)
                .await
                .unwrap(),
            SignIn::WrongOwner
        );
        // A room from an older database that no channel ever held: claimed only with an owner
        // code, after which it is held.
        store.claim_room("Old", "old-code-1234", 1).await.unwrap();
        assert_eq!(
            store.sign_in_room("Old", "old-code-1234", None, &b, 6).await.unwrap(),
            SignIn::OwnerRequired
        );
        assert!(matches!(
            store.sign_in_room("Old", "old-code-1234", Some("b-owner-code"), &b, 7).await.unwrap(),
            SignIn::Matched(_)
        ));
        store.set_room_channel("old", Some(&b)).await.unwrap();
        store.release_channel(&b).await.unwrap();
        assert_eq!(
            store.sign_in_room("Old", "old-code-1234", None, &a, 8).await.unwrap(),
            SignIn::OwnerRequired
        );
    }

    #[tokio::test]
    async fn h4_binding_a_channel_to_a_second_room_unbinds_the_first() {
        let store = Store::in_memory().unwrap();
        store.claim_room("One", "code-1234", 1).await.unwrap();
        store.claim_room("Two", "code-5678", 1).await.unwrap();
        let a = ConnectorChannelId::new("cch_a");
        store.set_room_channel("one", Some(&a)).await.unwrap();
        store.set_room_channel("two", Some(&a)).await.unwrap();
        assert_eq!(store.room("one").await.unwrap().unwrap().channel, None);
        assert_eq!(store.room_by_channel(&a).await.unwrap().unwrap().room_id, "two");
    }

    #[tokio::test]
    async fn visitor_tokens_resolve_to_their_room_only() {
        let store = Store::in_memory().unwrap();
        store.claim_room("Lobby", "code-1234", 1).await.unwrap();
        let token = store.add_visitor("lobby", 1, 100).await.unwrap();
        assert_eq!(store.visitor_room(&token, 2).await.unwrap().as_deref(), Some("lobby"));
        assert_eq!(store.visitor_room("wcv_forged", 2).await.unwrap(), None);
        // Only the token's hash is stored.
        let raw = store.authors().scan(VISITORS, &AuthorScan::prefix("", 10)).await.unwrap();
        assert_eq!(raw.len(), 1);
        assert_eq!(raw[0].key, hash_token(&token));
        assert!(!String::from_utf8_lossy(&raw[0].value).contains(&token));
    }

    #[tokio::test]
    async fn m8_visitor_tokens_expire_and_can_be_revoked() {
        let store = Store::in_memory().unwrap();
        store.claim_room("Lobby", "code-1234", 1).await.unwrap();
        let a = store.add_visitor("lobby", 1, 100).await.unwrap();
        let b = store.add_visitor("lobby", 1, 1_000).await.unwrap();
        let c = store.add_visitor("lobby", 1, 1_000).await.unwrap();
        assert_eq!(store.visitor_room(&a, 99).await.unwrap().as_deref(), Some("lobby"));
        assert_eq!(store.visitor_room(&a, 100).await.unwrap(), None, "expired at its lifetime");
        assert!(store.revoke_visitor(&b).await.unwrap());
        assert!(!store.revoke_visitor(&b).await.unwrap(), "gone already");
        assert_eq!(store.visitor_room(&b, 2).await.unwrap(), None, "revoked");
        assert_eq!(store.visitor_room(&c, 2).await.unwrap().as_deref(), Some("lobby"));
    }

    #[tokio::test]
    async fn h2_new_rooms_need_a_long_access_code() {
        let store = Store::in_memory().unwrap();
        assert!(matches!(
            store.claim_room("Lobby", "1234567", 1).await,
            Err(WebchatError::InvalidInput(_))
        ));
        assert!(matches!(
            store.claim_room("Lobby", "12345678", 1).await.unwrap(),
            RoomClaim::Created(_)
        ));
    }

    /// A quota as big as the tests need.
    fn quota(room_bytes: u64, room_files: u64, all_bytes: u64, all_files: u64) -> UploadQuota {
        UploadQuota { room_bytes, room_files, all_bytes, all_files }
    }

    /// Reserves and settles an upload of `bytes` (what a finished upload does).
    async fn uploaded(store: &Store, room: &str, bytes: u64, now: u64) {
        let big = quota(u64::MAX, u64::MAX, u64::MAX, u64::MAX);
        let held = store.reserve_upload(room, bytes, &big, now).await.unwrap().unwrap();
        store.settle_upload(&held.id, bytes).await.unwrap();
    }

    #[tokio::test]
    async fn m3_upload_usage_counts_the_room_and_everybody_within_a_day() {
        let store = Store::in_memory().unwrap();
        uploaded(&store, "a", 10, 1_000).await;
        uploaded(&store, "a", 5, 2_000).await;
        uploaded(&store, "b", 7, 2_000).await;
        let usage = store.upload_usage("a", 3_000).await.unwrap();
        assert_eq!(
            usage,
            UploadUsage { room_bytes: 15, room_files: 2, all_bytes: 22, all_files: 3 }
        );
        let later = store.upload_usage("a", 1_500 + DAY_MILLIS).await.unwrap();
        assert_eq!(
            later,
            UploadUsage { room_bytes: 5, room_files: 1, all_bytes: 12, all_files: 2 }
        );
        assert_eq!(store.authors().count(UPLOADS, "").await.unwrap(), 2, "the old one is gone");
    }

    #[tokio::test]
    async fn an_upload_reserves_its_quota_before_storing_and_gives_back_what_it_did_not_use() {
        let store = Store::in_memory().unwrap();
        let quota = quota(100, 3, 1_000, 10);
        // Reserved up to what the room has left; a second upload sees the reservation.
        let first = store.reserve_upload("a", 80, &quota, 1).await.unwrap().unwrap();
        assert_eq!(first.bytes, 80);
        let second = store.reserve_upload("a", 80, &quota, 1).await.unwrap().unwrap();
        assert_eq!(second.bytes, 20, "only what is left of the room's bytes");
        assert_eq!(
            store.reserve_upload("a", 80, &quota, 1).await.unwrap(),
            Err(QuotaRefusal::Room)
        );
        // Settling keeps the real size; releasing gives all of it back.
        store.settle_upload(&first.id, 30).await.unwrap();
        store.release_upload(&second.id).await.unwrap();
        assert_eq!(store.upload_usage("a", 2).await.unwrap().room_bytes, 30);
        // A settled upload is never released by mistake.
        store.release_upload(&first.id).await.unwrap();
        assert_eq!(store.upload_usage("a", 2).await.unwrap().room_files, 1);
        // Files: the room's count is reached with reservations still pending.
        let _b = store.reserve_upload("a", 1, &quota, 3).await.unwrap().unwrap();
        let _c = store.reserve_upload("a", 1, &quota, 3).await.unwrap().unwrap();
        assert_eq!(store.reserve_upload("a", 1, &quota, 3).await.unwrap(), Err(QuotaRefusal::Room));
        // Everybody's quota.
        let everybody = self::quota(100, 3, 32, 10);
        assert_eq!(
            store.reserve_upload("b", 1, &everybody, 3).await.unwrap(),
            Err(QuotaRefusal::Everybody)
        );
    }

    #[tokio::test]
    async fn reservations_of_uploads_that_never_finished_stop_counting() {
        let store = Store::in_memory().unwrap();
        let quota = quota(200, 10, 1_000, 10);
        let done = store.reserve_upload("a", 40, &quota, 1).await.unwrap().unwrap();
        store.settle_upload(&done.id, 40).await.unwrap();
        store.reserve_upload("a", 60, &quota, 1).await.unwrap().unwrap();
        // Another replica's upload may still be running: it counts until it is stale.
        assert_eq!(store.upload_usage("a", 2).await.unwrap().room_bytes, 100);
        let stale = 1 + STALE_RESERVATION_MILLIS;
        let usage = store.upload_usage("a", stale).await.unwrap();
        assert_eq!((usage.room_bytes, usage.room_files), (40, 1));
        // A sole process gives every pending one back at its start.
        store.reserve_upload("a", 10, &quota, 5).await.unwrap().unwrap();
        assert_eq!(store.release_all_pending_uploads().await.unwrap(), 2);
        let usage = store.upload_usage("a", 6).await.unwrap();
        assert_eq!((usage.room_bytes, usage.room_files), (40, 1));
    }

    #[tokio::test]
    async fn session_pruning_goes_in_bounded_batches_in_expiry_order() {
        let store = Store::in_memory().unwrap();
        store.claim_room("Lobby", "code-1234", 1).await.unwrap();
        // 200 sessions end at 100; each join deletes one batch of them, never all at once.
        for _ in 0..200 {
            store.add_visitor("lobby", 1, 100).await.unwrap();
        }
        let count = async |store: &Store| store.authors().count(VISITORS, "").await.unwrap();
        store.add_visitor("lobby", 150, 10_000).await.unwrap();
        assert_eq!(count(&store).await, 201 - SESSION_PRUNE_BATCH as u64);
        for _ in 0..3 {
            store.add_visitor("lobby", 150, 10_000).await.unwrap();
        }
        assert_eq!(count(&store).await, 4, "the expired ones are gone after a few joins");
        assert_eq!(store.authors().count(ROOM_VISITORS, "").await.unwrap(), 4);
        assert_eq!(store.authors().count(VISITOR_EXPIRY, "").await.unwrap(), 4);
        // A revoked session goes with its indexes at once.
        let live = store.add_visitor("lobby", 150, 10_000).await.unwrap();
        store.revoke_visitor(&live).await.unwrap();
        assert_eq!(count(&store).await, 4);
        assert_eq!(store.authors().count(VISITOR_EXPIRY, "").await.unwrap(), 4);
    }

    #[tokio::test]
    async fn a_rooms_wrong_code_budget_is_shared_by_every_store_on_one_storage() {
        let one = Store::in_memory().unwrap();
        // A second store on the same storage: what another replica sees.
        let two = Store::new(one.authors().clone());
        let rate = CellRate { burst: 3, interval_millis: 10 };
        for store in [&one, &two, &one] {
            assert!(store.begin_guess("join", "lobby", rate, 100).await.unwrap().is_ok());
        }
        assert_eq!(two.begin_guess("join", "lobby", rate, 100).await.unwrap().unwrap_err(), 10);
        assert!(one.begin_guess("signin", "lobby", rate, 100).await.unwrap().is_ok(), "scoped");
        assert!(one.begin_guess("join", "hall", rate, 100).await.unwrap().is_ok(), "per room");
        // A right code's try is given back; the budget refills one per interval.
        let right = two.begin_guess("join", "lobby", rate, 110).await.unwrap().unwrap();
        one.forget_guess(right).await.unwrap();
        assert!(one.begin_guess("join", "lobby", rate, 110).await.unwrap().is_ok());
        assert!(two.begin_guess("join", "lobby", rate, 111).await.unwrap().is_err());
        // Long quiet: the whole burst is back and the old tries are pruned.
        for _ in 0..3 {
            assert!(two.begin_guess("join", "lobby", rate, 10_000).await.unwrap().is_ok());
        }
        assert_eq!(one.authors().count(GUESSES, "join/lobby/").await.unwrap(), 3);
    }
}
