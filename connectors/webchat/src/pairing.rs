//! The QR pairing flow (`webchat_qr_login`) on the runtime's author store, so every replica
//! on one database sees every pairing: `auth.start` mints a one-time link, opening it (on any
//! replica) moves it to `scanned`, confirming it on the page (on any replica, exactly once)
//! completes it, and the link expires on the injected clock.
//!
//! The link's token is a secret: the store keeps only its SHA-256 (`hash` below), and nothing
//! logs it. The replica that minted a link keeps the token in memory to show the QR code again
//! on `auth.status`; another replica answers the status without the link text.
//!
//! Records (namespaces of the author store):
//! - `webchat.pairing_links`: `{hash}` -> the link (auth session, channel, expiry, scanned).
//! - `webchat.pairing_sessions`: `{auth_session_id}` -> the hash of the session's current link
//!   (a refresh points it at a new one; a link the pointer does not name is dead).
//! - `webchat.pairing_claims`: `{hash}/{random}`: a confirmation of the link (see
//!   [`Pairings::claim`]); the winner's stays, so the link is used once.
//! - `webchat.pairing_done`: `{hash}` -> the room the confirmation created.
//! - `webchat.pairing_expiry`: `{expires_at:020}.{hash}` -> the auth session, pruned in bounded
//!   batches a link's lifetime after it expired.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use xagent_protocol_types::{AuthSessionId, ConnectorChannelId};
use xagent_server_runtime::storage::StorageError;
use xagent_server_runtime::{AuthorScan, AuthorStore, AuthorStoreError, AuthorWrite};

use crate::error::WebchatError;
use crate::pairing_error::PairingError;
use crate::store::{SESSION_PRUNE_BATCH, hash_token, random_hex};

/// How long a pairing link can be opened and confirmed (5 minutes).
pub const PAIRING_LINK_TTL_MILLIS: u64 = 5 * 60 * 1000;

const LINKS: &str = "webchat.pairing_links";
const SESSIONS: &str = "webchat.pairing_sessions";
const CLAIMS: &str = "webchat.pairing_claims";
const DONE: &str = "webchat.pairing_done";
const EXPIRY: &str = "webchat.pairing_expiry";

/// Random bytes of a link token (128 bits, 32 hex characters).
const TOKEN_BYTES: usize = 16;

fn failed(error: AuthorStoreError) -> WebchatError {
    WebchatError::Storage(StorageError::new("the webchat pairings", error))
}

/// Whether `token` has the form of a link token (anything else is unknown without a lookup).
fn is_token(token: &str) -> bool {
    token.len() == TOKEN_BYTES * 2 && token.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn expiry_key(expires_at: u64, hash: &str) -> String {
    format!("{expires_at:020}.{hash}")
}

/// One stored link.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct LinkRecord {
    session: String,
    channel: String,
    expires_at: u64,
    #[serde(default)]
    scanned: bool,
}

/// What `auth.status` should report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PairingStatus {
    /// Still waiting for the link to be opened.
    Pending(PairingPrompt),
    /// Opened, waiting for confirmation.
    Scanned(PairingPrompt),
    /// Done: bind the channel to this room.
    Confirmed(String),
    /// The link expired before confirmation: a refresh issues a new one.
    RefreshRequired,
    /// No such session.
    Unknown,
}

/// The link and expiry to show (the caller turns the token into a link and a QR code).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairingPrompt {
    /// The link token, when this replica minted it (the store keeps only its hash).
    pub token: Option<String>,
    /// Expiry (Unix ms).
    pub expires_at: u64,
}

/// An opened link, as the page shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenedLink {
    /// When the link stops working (Unix ms).
    pub expires_at: u64,
    /// A name for the new room that says nothing of the token.
    pub suggested_room_name: String,
}

/// A confirmation that won the link: create the room, then [`Pairings::complete`] it (or
/// [`Pairings::release`] it when the room could not be made).
#[derive(Debug)]
pub struct PairingClaim {
    hash: String,
    key: String,
    /// The channel being signed in.
    pub channel: ConnectorChannelId,
    /// A name for the new room that says nothing of the token.
    pub suggested_room_name: String,
}

/// The open pairings of every replica, in the author store.
pub(crate) struct Pairings {
    store: AuthorStore,
    /// The tokens this replica minted, by auth session (to show the QR code again).
    minted: Mutex<HashMap<AuthSessionId, String>>,
}

impl std::fmt::Debug for Pairings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pairings").finish_non_exhaustive()
    }
}

impl Pairings {
    /// The pairings in `store`.
    pub(crate) fn new(store: AuthorStore) -> Self {
        Self { store, minted: Mutex::default() }
    }

    fn minted(&self) -> std::sync::MutexGuard<'_, HashMap<AuthSessionId, String>> {
        self.minted.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The writes of a new link for `session`, with its token's hash.
    fn link_writes(
        session: &AuthSessionId,
        channel: &ConnectorChannelId,
        token: &str,
        expires_at: u64,
    ) -> Result<(String, Vec<AuthorWrite>), WebchatError> {
        let hash = hash_token(token);
        let record = LinkRecord {
            session: session.to_string(),
            channel: channel.to_string(),
            expires_at,
            scanned: false,
        };
        let writes = vec![
            AuthorWrite::put_json(LINKS, &hash, &record).map_err(failed)?,
            AuthorWrite::put(SESSIONS, session.as_str(), hash.clone()).map_err(failed)?,
            AuthorWrite::put(EXPIRY, &expiry_key(expires_at, &hash), session.to_string())
                .map_err(failed)?,
        ];
        Ok((hash, writes))
    }

    /// The deletes of every record of the link `hash` (its session pointer excluded).
    fn link_deletes(hash: &str, expires_at: u64) -> Result<Vec<AuthorWrite>, WebchatError> {
        Ok(vec![
            AuthorWrite::delete(LINKS, hash).map_err(failed)?,
            AuthorWrite::delete(DONE, hash).map_err(failed)?,
            AuthorWrite::delete_prefix(CLAIMS, &format!("{hash}/")).map_err(failed)?,
            AuthorWrite::delete(EXPIRY, &expiry_key(expires_at, hash)).map_err(failed)?,
        ])
    }

    async fn link(&self, hash: &str) -> Result<Option<LinkRecord>, WebchatError> {
        self.store.get_json(LINKS, hash).await.map_err(failed)
    }

    async fn pointer(&self, session: &str) -> Result<Option<String>, WebchatError> {
        let value = self.store.get(SESSIONS, session).await.map_err(failed)?;
        Ok(value.and_then(|v| String::from_utf8(v).ok()))
    }

    async fn done(&self, hash: &str) -> Result<Option<String>, WebchatError> {
        let value = self.store.get(DONE, hash).await.map_err(failed)?;
        Ok(value.and_then(|v| String::from_utf8(v).ok()))
    }

    /// The live link of `token`: stored, still its session's current one, not confirmed.
    async fn live_link(&self, token: &str) -> Result<(String, LinkRecord), WebchatError> {
        if !is_token(token) {
            return Err(PairingError::Unknown.into());
        }
        let hash = hash_token(token);
        let link = self.link(&hash).await?.ok_or(PairingError::Unknown)?;
        if self.pointer(&link.session).await?.as_deref() != Some(hash.as_str()) {
            // Replaced by a refresh, or its session was cancelled.
            return Err(PairingError::Unknown.into());
        }
        if self.done(&hash).await?.is_some() {
            return Err(PairingError::Used.into());
        }
        Ok((hash, link))
    }

    /// Starts a pairing for an auth session and returns its prompt.
    pub(crate) async fn start(
        &self,
        session: AuthSessionId,
        channel: ConnectorChannelId,
        now: u64,
    ) -> Result<PairingPrompt, WebchatError> {
        self.prune(now).await?;
        let token = random_hex(TOKEN_BYTES);
        let expires_at = now.saturating_add(PAIRING_LINK_TTL_MILLIS);
        let (_, writes) = Self::link_writes(&session, &channel, &token, expires_at)?;
        self.store.commit(writes).await.map_err(failed)?;
        self.minted().insert(session, token.clone());
        Ok(PairingPrompt { token: Some(token), expires_at })
    }

    /// The link was opened: `pending` -> `scanned`. Opening it again is harmless.
    pub(crate) async fn scan(&self, token: &str, now: u64) -> Result<OpenedLink, WebchatError> {
        let (hash, mut link) = self.live_link(token).await?;
        if now >= link.expires_at {
            return Err(PairingError::Expired.into());
        }
        if !link.scanned {
            link.scanned = true;
            self.store
                .commit(vec![AuthorWrite::put_json(LINKS, &hash, &link).map_err(failed)?])
                .await
                .map_err(failed)?;
        }
        Ok(OpenedLink { expires_at: link.expires_at, suggested_room_name: room_name(&hash) })
    }

    /// Confirmation on the page: takes the link for this confirmation, once across every
    /// replica. The claim is written first and the claims read second, so of two concurrent
    /// confirmations the later always sees the earlier: at most one wins (when two race, both
    /// may lose and may try again). A lost claim is taken back at once.
    pub(crate) async fn claim(&self, token: &str, now: u64) -> Result<PairingClaim, WebchatError> {
        let (hash, link) = self.live_link(token).await?;
        if now >= link.expires_at {
            return Err(PairingError::Expired.into());
        }
        let key = format!("{hash}/{}", random_hex(8));
        self.store.put(CLAIMS, &key, Vec::new()).await.map_err(failed)?;
        let claims = self
            .store
            .scan(CLAIMS, &AuthorScan::prefix(format!("{hash}/"), 2))
            .await
            .map_err(failed)?;
        let alone = claims.iter().all(|c| c.key == key);
        // The link may have been refreshed or cancelled meanwhile.
        let still = alone && self.live_link(token).await.is_ok();
        if !still {
            self.store.delete(CLAIMS, &key).await.map_err(failed)?;
            return Err(PairingError::Used.into());
        }
        Ok(PairingClaim {
            channel: ConnectorChannelId::new(link.channel),
            suggested_room_name: room_name(&hash),
            hash,
            key,
        })
    }

    /// Gives a claim back (the room could not be made): the link can be confirmed again.
    pub(crate) async fn release(&self, claim: PairingClaim) -> Result<(), WebchatError> {
        self.store.delete(CLAIMS, &claim.key).await.map_err(failed)
    }

    /// Marks the claimed link confirmed for `room_id` (the next `auth.status` reports it).
    pub(crate) async fn complete(
        &self,
        claim: PairingClaim,
        room_id: &str,
    ) -> Result<(), WebchatError> {
        self.store.put(DONE, &claim.hash, room_id).await.map_err(failed)
    }

    /// `auth.status`: reports the state, or with `refresh` issues a new link (a confirmed
    /// session is reported as confirmed even with `refresh`), once.
    pub(crate) async fn status(
        &self,
        session: &AuthSessionId,
        refresh: bool,
        now: u64,
    ) -> Result<PairingStatus, WebchatError> {
        self.prune(now).await?;
        let Some(hash) = self.pointer(session.as_str()).await? else {
            return Ok(PairingStatus::Unknown);
        };
        if let Some(room_id) = self.done(&hash).await? {
            // Reported once: the session is then gone (the link stays used until pruned).
            self.store.delete(SESSIONS, session.as_str()).await.map_err(failed)?;
            self.minted().remove(session);
            return Ok(PairingStatus::Confirmed(room_id));
        }
        let Some(link) = self.link(&hash).await? else { return Ok(PairingStatus::Unknown) };
        if refresh {
            let token = random_hex(TOKEN_BYTES);
            let expires_at = now.saturating_add(PAIRING_LINK_TTL_MILLIS);
            let channel = ConnectorChannelId::new(link.channel);
            let mut writes = Self::link_deletes(&hash, link.expires_at)?;
            writes.extend(Self::link_writes(session, &channel, &token, expires_at)?.1);
            self.store.commit(writes).await.map_err(failed)?;
            self.minted().insert(session.clone(), token.clone());
            return Ok(PairingStatus::Pending(PairingPrompt { token: Some(token), expires_at }));
        }
        if now >= link.expires_at {
            return Ok(PairingStatus::RefreshRequired);
        }
        let prompt = PairingPrompt {
            token: self.minted().get(session).cloned(),
            expires_at: link.expires_at,
        };
        Ok(if link.scanned {
            PairingStatus::Scanned(prompt)
        } else {
            PairingStatus::Pending(prompt)
        })
    }

    /// Drops a session and its link (cancel).
    pub(crate) async fn cancel(&self, session: &AuthSessionId) -> Result<(), WebchatError> {
        self.minted().remove(session);
        let Some(hash) = self.pointer(session.as_str()).await? else { return Ok(()) };
        let mut writes = vec![AuthorWrite::delete(SESSIONS, session.as_str()).map_err(failed)?];
        if let Some(link) = self.link(&hash).await? {
            writes.extend(Self::link_deletes(&hash, link.expires_at)?);
        }
        self.store.commit(writes).await.map_err(failed)
    }

    /// Drops up to a batch of links that expired more than a link's lifetime ago (nobody
    /// refreshed or reported them), with their session pointers.
    pub(crate) async fn prune(&self, now: u64) -> Result<(), WebchatError> {
        let old = self
            .store
            .scan(EXPIRY, &AuthorScan::prefix("", SESSION_PRUNE_BATCH))
            .await
            .map_err(failed)?;
        let mut writes = Vec::new();
        let mut sessions = Vec::new();
        for record in old {
            let Some((at, hash)) = record.key.split_once('.') else { continue };
            let Ok(expires_at) = at.parse::<u64>() else { continue };
            if now < expires_at.saturating_add(PAIRING_LINK_TTL_MILLIS) {
                break;
            }
            writes.extend(Self::link_deletes(hash, expires_at)?);
            if let Ok(session) = String::from_utf8(record.value)
                && self.pointer(&session).await?.as_deref() == Some(hash)
            {
                writes.push(AuthorWrite::delete(SESSIONS, &session).map_err(failed)?);
                sessions.push(AuthSessionId::new(session));
            }
        }
        if writes.is_empty() {
            return Ok(());
        }
        self.store.commit(writes).await.map_err(failed)?;
        let mut minted = self.minted();
        for session in sessions {
            minted.remove(&session);
        }
        Ok(())
    }
}

/// The suggested name of a paired room: from the link's hash, never from the token.
fn room_name(hash: &str) -> String {
    format!("Room {}", hash.get(..4).unwrap_or("new"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use xagent_server_runtime::storage::SqliteStorage;

    use super::*;

    fn pairings() -> Pairings {
        Pairings::new(AuthorStore::new(Arc::new(SqliteStorage::in_memory().unwrap())))
    }

    async fn start(pairings: &Pairings, now: u64) -> (AuthSessionId, String) {
        let session = AuthSessionId::new("auth_1");
        let prompt =
            pairings.start(session.clone(), ConnectorChannelId::new("cch_1"), now).await.unwrap();
        (session, prompt.token.unwrap())
    }

    fn refused(result: Result<impl std::fmt::Debug, WebchatError>) -> PairingError {
        match result {
            Err(WebchatError::Pairing(error)) => error,
            other => panic!("expected a pairing refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn opening_the_link_moves_the_session_to_scanned_then_confirmed() {
        let pairings = pairings();
        let (session, token) = start(&pairings, 1_000).await;
        let status = pairings.status(&session, false, 1_001).await.unwrap();
        assert!(
            matches!(status, PairingStatus::Pending(ref p) if p.token.as_deref() == Some(token.as_str()))
        );
        let opened = pairings.scan(&token, 1_002).await.unwrap();
        assert_eq!(opened.suggested_room_name, format!("Room {}", &hash_token(&token)[..4]));
        assert!(matches!(
            pairings.status(&session, false, 1_003).await.unwrap(),
            PairingStatus::Scanned(_)
        ));
        let claim = pairings.claim(&token, 1_004).await.unwrap();
        assert_eq!(claim.channel.as_str(), "cch_1");
        pairings.complete(claim, "room-1").await.unwrap();
        assert_eq!(
            pairings.status(&session, false, 1_005).await.unwrap(),
            PairingStatus::Confirmed("room-1".into())
        );
        // Reported once; the session is then gone.
        assert_eq!(pairings.status(&session, false, 1_006).await.unwrap(), PairingStatus::Unknown);
    }

    #[tokio::test]
    async fn only_the_hash_of_a_token_is_stored() {
        let pairings = pairings();
        let (_, token) = start(&pairings, 0).await;
        for namespace in [LINKS, SESSIONS, EXPIRY] {
            let records =
                pairings.store.scan(namespace, &AuthorScan::prefix("", 10)).await.unwrap();
            assert!(!records.is_empty(), "{namespace}");
            for record in records {
                assert!(!record.key.contains(&token), "{namespace} key");
                assert!(!String::from_utf8_lossy(&record.value).contains(&token), "{namespace}");
            }
        }
    }

    #[tokio::test]
    async fn an_expired_link_cannot_be_opened_or_confirmed_and_status_asks_for_refresh() {
        let pairings = pairings();
        let (session, token) = start(&pairings, 0).await;
        let late = PAIRING_LINK_TTL_MILLIS;
        assert_eq!(refused(pairings.scan(&token, late).await), PairingError::Expired);
        assert_eq!(refused(pairings.claim(&token, late).await), PairingError::Expired);
        assert_eq!(
            pairings.status(&session, false, late).await.unwrap(),
            PairingStatus::RefreshRequired
        );
    }

    #[tokio::test]
    async fn refresh_issues_a_new_link_and_retires_the_old_one() {
        let pairings = pairings();
        let (session, old) = start(&pairings, 0).await;
        let now = PAIRING_LINK_TTL_MILLIS + 10;
        let PairingStatus::Pending(new) = pairings.status(&session, true, now).await.unwrap()
        else {
            panic!("refresh must give a pending prompt");
        };
        let new_token = new.token.unwrap();
        assert_ne!(new_token, old);
        assert_eq!(new.expires_at, now + PAIRING_LINK_TTL_MILLIS);
        assert_eq!(refused(pairings.scan(&old, now).await), PairingError::Unknown);
        assert!(pairings.scan(&new_token, now).await.is_ok());
    }

    #[tokio::test]
    async fn a_pairing_link_is_one_time_and_a_released_claim_frees_it() {
        let pairings = pairings();
        let (_, token) = start(&pairings, 0).await;
        let claim = pairings.claim(&token, 1).await.unwrap();
        // While the first confirmation holds it, a second is refused.
        assert_eq!(refused(pairings.claim(&token, 1).await), PairingError::Used);
        pairings.release(claim).await.unwrap();
        let claim = pairings.claim(&token, 2).await.unwrap();
        pairings.complete(claim, "room").await.unwrap();
        assert_eq!(refused(pairings.scan(&token, 2).await), PairingError::Used);
        assert_eq!(refused(pairings.claim(&token, 2).await), PairingError::Used);
    }

    #[tokio::test]
    async fn unknown_malformed_and_cancelled_links_are_refused() {
        let pairings = pairings();
        for bad in ["nope", "", &"0".repeat(33), &"G".repeat(32)] {
            assert_eq!(refused(pairings.scan(bad, 0).await), PairingError::Unknown, "{bad:?}");
        }
        assert_eq!(refused(pairings.scan(&"0".repeat(32), 0).await), PairingError::Unknown);
        let (session, token) = start(&pairings, 0).await;
        pairings.cancel(&session).await.unwrap();
        assert_eq!(refused(pairings.scan(&token, 1).await), PairingError::Unknown);
        assert_eq!(pairings.status(&session, false, 1).await.unwrap(), PairingStatus::Unknown);
    }

    #[tokio::test]
    async fn prune_drops_long_expired_links_and_their_sessions() {
        let pairings = pairings();
        let (session, token) = start(&pairings, 0).await;
        pairings.prune(PAIRING_LINK_TTL_MILLIS * 2).await.unwrap();
        assert_eq!(pairings.status(&session, false, 0).await.unwrap(), PairingStatus::Unknown);
        assert_eq!(refused(pairings.scan(&token, 0).await), PairingError::Unknown);
        for namespace in [LINKS, SESSIONS, EXPIRY, CLAIMS, DONE] {
            let left = pairings.store.scan(namespace, &AuthorScan::prefix("", 10)).await.unwrap();
            assert!(left.is_empty(), "{namespace}");
        }
    }

    #[tokio::test]
    async fn another_replica_answers_the_status_without_the_link_text() {
        let storage: Arc<SqliteStorage> = Arc::new(SqliteStorage::in_memory().unwrap());
        let a = Pairings::new(AuthorStore::new(storage.clone()));
        let b = Pairings::new(AuthorStore::new(storage));
        let (session, token) = start(&a, 0).await;
        b.scan(&token, 1).await.unwrap();
        match a.status(&session, false, 2).await.unwrap() {
            PairingStatus::Scanned(prompt) => assert_eq!(prompt.token, Some(token.clone())),
            other => panic!("{other:?}"),
        }
        match b.status(&session, false, 2).await.unwrap() {
            PairingStatus::Scanned(prompt) => assert_eq!(prompt.token, None),
            other => panic!("{other:?}"),
        }
    }
}
