//! The conversation of every room, kept in the runtime's storage through its author store
//! ([`AuthorStore`]), so a message the agent sends is one write in the transaction of its
//! `webchat_message_send` call (group commit), and a replica on the same PostgreSQL database
//! sees every message.
//!
//! Records (namespaces of the author store):
//! - `webchat.messages`: `{room_id}/{seq:020}.{message_id}` -> the message and, for a visitor
//!   message, the exact `chat.message` handed to the runtime (JSON). `seq` orders a room's
//!   messages: per process above every key the room holds and above the clock in µs, so
//!   messages stay in the order they were stored, also across restarts and replicas; the
//!   message id makes two replicas' keys distinct.
//! - `webchat.message_ids`: `{message_id}` -> its message key (status updates find the room).
//! - `webchat.message_clients`: `{room_id}/{sha256(client_id)}` -> its message key (a page's
//!   repeated send finds the stored message).
//! - `webchat.sending`: `{seq:020}.{message_id}` -> its message key, while a visitor message is
//!   `sending` with its `chat.message` kept (oldest first, for recovery at start).
//!
//! Older state directories kept messages in `webchat.sqlite3`; [`Messages::move_legacy`] moves
//! them here once at start (see `legacy.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use xagent_server_runtime::storage::StorageError;
use xagent_server_runtime::{AuthorScan, AuthorStore, AuthorStoreError, AuthorWrite};

use crate::error::WebchatError;
use crate::store::{ChatEntry, EntryStatus, HISTORY_LIMIT, Inserted};

const MESSAGES: &str = "webchat.messages";
const IDS: &str = "webchat.message_ids";
const CLIENTS: &str = "webchat.message_clients";
const SENDING: &str = "webchat.sending";

/// Records a scan reads per page when it walks a whole namespace.
const PAGE: usize = 500;

fn failed(error: AuthorStoreError) -> WebchatError {
    WebchatError::Storage(StorageError::new("the webchat messages", error))
}

/// What became of a visitor message handed over with [`Messages::insert_sent`].
pub(crate) enum Sent {
    /// A repeat of a stored message (same `client_id`): that one, unchanged.
    Existing(ChatEntry),
    /// Stored with its outbox record: on its way to xAgent.
    Queued(ChatEntry),
    /// The runtime did not take it: stored `rejected`, with the reason.
    Refused(ChatEntry),
}

/// Where a new message's `message_id` comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IdOrigin {
    /// Minted here just now: it cannot name a stored message.
    Minted,
    /// From elsewhere (xAgent, a Tool call, an earlier attempt): it may be a repeat.
    Given,
}

/// One stored message.
#[derive(Serialize, Deserialize)]
struct Stored {
    entry: ChatEntry,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outbound: Option<String>,
}

/// A new delivery state for the message `message_id`.
#[derive(Clone, Debug)]
pub(crate) struct StatusUpdate {
    /// The message.
    pub(crate) message_id: String,
    /// Its state.
    pub(crate) status: EntryStatus,
    /// Why, for a rejection or an expiry.
    pub(crate) error: Option<String>,
}

/// A message ready to store: the writes that store it (commit them, or stage them on a Tool
/// call), or the message stored earlier under the same id.
pub(crate) enum Prepared {
    /// New: commit `writes`, then show `entry`.
    New {
        /// The message.
        entry: ChatEntry,
        /// Its records.
        writes: Vec<AuthorWrite>,
    },
    /// A repeat (same `message_id`, or same `client_id` in the room): the stored message.
    Existing(ChatEntry),
}

/// The rooms' conversations over the author store.
pub(crate) struct Messages {
    store: AuthorStore,
    /// The last `seq` this process gave each room it stored into.
    last_seq: Mutex<HashMap<String, u64>>,
    /// One insert per room at a time in this process (a page's double send is stored once).
    room_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// This replica's name in live-event hints, when every write of a message carries its
    /// hint to the other replicas (see `live.rs`).
    origin: Option<String>,
}

impl std::fmt::Debug for Messages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Messages").finish_non_exhaustive()
    }
}

fn client_key(room_id: &str, client_id: &str) -> String {
    let digest = Sha256::digest(client_id.as_bytes());
    format!("{room_id}/{}", hex::encode(&digest[..16]))
}

/// The `seq` part of a message key (`{room}/{seq}.{id}`).
fn seq_of(key: &str) -> Option<u64> {
    let (_, rest) = key.split_once('/')?;
    rest.split_once('.')?.0.parse().ok()
}

impl Messages {
    /// The conversations in `store`.
    pub(crate) fn new(store: AuthorStore) -> Self {
        Self { store, last_seq: Mutex::default(), room_locks: Mutex::default(), origin: None }
    }

    /// The conversations in `store`, every write of a message carrying the live-event hint
    /// (sent by replica `origin`) in its own transaction: the other replicas hear of a message
    /// exactly when it is durable, even when this process dies right after.
    pub(crate) fn with_hints(store: AuthorStore, origin: &str) -> Self {
        Self { origin: Some(origin.to_owned()), ..Self::new(store) }
    }

    /// The hint write for a message of `room_id`, when there are other replicas to tell.
    fn hint(&self, room_id: &str, message_id: &str) -> Result<Option<AuthorWrite>, WebchatError> {
        let Some(origin) = &self.origin else { return Ok(None) };
        let text = crate::live::hint(origin, room_id, message_id);
        self.store.broadcast_write(crate::live::TOPIC, &text).map_err(failed)
    }

    fn room_lock(&self, room_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.room_locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(locks.entry(room_id.to_owned()).or_default())
    }

    async fn load(&self, key: &str) -> Result<Option<Stored>, WebchatError> {
        self.store.get_json::<Stored>(MESSAGES, key).await.map_err(failed)
    }

    async fn key_of(&self, namespace: &str, key: &str) -> Result<Option<String>, WebchatError> {
        let value = self.store.get(namespace, key).await.map_err(failed)?;
        Ok(value.and_then(|v| String::from_utf8(v).ok()))
    }

    /// The next `seq` of a room: above what this process gave it, above the room's newest
    /// stored key (read once per room and process) and above the clock in µs.
    async fn next_seq(&self, room_id: &str, created_at: u64) -> Result<u64, WebchatError> {
        let known = self
            .last_seq
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(room_id)
            .copied();
        let last = match known {
            Some(last) => last,
            None => {
                let newest = self
                    .store
                    .scan(MESSAGES, &AuthorScan::prefix(format!("{room_id}/"), 1).reversed())
                    .await
                    .map_err(failed)?;
                newest.first().and_then(|r| seq_of(&r.key)).unwrap_or(0)
            }
        };
        let seq = (last + 1).max(created_at.saturating_mul(1_000));
        let mut seqs = self.last_seq.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let slot = seqs.entry(room_id.to_owned()).or_insert(0);
        let seq = seq.max(*slot + 1);
        *slot = seq;
        Ok(seq)
    }

    /// Finds a repeat of `entry` in the room, or the writes that store it.
    async fn prepare_locked(
        &self,
        room_id: &str,
        entry: &ChatEntry,
        outbound: Option<&str>,
        id: IdOrigin,
    ) -> Result<Prepared, WebchatError> {
        if id == IdOrigin::Given
            && let Some(key) = self.key_of(IDS, &entry.message_id).await?
            && let Some(stored) = self.load(&key).await?
        {
            if key.starts_with(&format!("{room_id}/")) {
                return Ok(Prepared::Existing(stored.entry));
            }
            return Err(WebchatError::InvalidInput("this message id is in use".into()));
        }
        if let Some(client_id) = entry.client_id.as_deref()
            && let Some(existing) = self.entry_by_client(room_id, client_id).await?
        {
            return Ok(Prepared::Existing(existing));
        }
        let seq = self.next_seq(room_id, entry.created_at).await?;
        let mut writes = Self::writes(room_id, seq, entry, outbound)?;
        writes.extend(self.hint(room_id, &entry.message_id)?);
        Ok(Prepared::New { entry: entry.clone(), writes })
    }

    /// The records of a new message.
    fn writes(
        room_id: &str,
        seq: u64,
        entry: &ChatEntry,
        outbound: Option<&str>,
    ) -> Result<Vec<AuthorWrite>, WebchatError> {
        let key = format!("{room_id}/{seq:020}.{}", entry.message_id);
        let stored = Stored { entry: entry.clone(), outbound: outbound.map(str::to_owned) };
        let mut writes = vec![
            AuthorWrite::put_json(MESSAGES, &key, &stored).map_err(failed)?,
            AuthorWrite::put(IDS, &entry.message_id, key.clone()).map_err(failed)?,
        ];
        if let Some(client_id) = entry.client_id.as_deref() {
            writes.push(
                AuthorWrite::put(CLIENTS, &client_key(room_id, client_id), key.clone())
                    .map_err(failed)?,
            );
        }
        if entry.status == EntryStatus::Sending && outbound.is_some() {
            let sending = format!("{seq:020}.{}", entry.message_id);
            writes.push(AuthorWrite::put(SENDING, &sending, key).map_err(failed)?);
        }
        Ok(writes)
    }

    /// The writes that store a message, for staging on a Tool call (a repeat of the call after
    /// its record expired finds the message by id).
    pub(crate) async fn prepare(
        &self,
        room_id: &str,
        entry: &ChatEntry,
    ) -> Result<Prepared, WebchatError> {
        let lock = self.room_lock(room_id);
        let _held = lock.lock().await;
        self.prepare_locked(room_id, entry, None, IdOrigin::Given).await
    }

    /// Stores a message now (committed when this returns); a repeat (same `message_id`, or
    /// same `client_id` in the room) returns the stored one unchanged. `outbound` keeps the
    /// exact `chat.message` of a visitor message, so it can be handed over again if the
    /// process stopped in between.
    pub(crate) async fn insert(
        &self,
        room_id: &str,
        entry: &ChatEntry,
        outbound: Option<&str>,
    ) -> Result<Inserted, WebchatError> {
        let lock = self.room_lock(room_id);
        let _held = lock.lock().await;
        match self.prepare_locked(room_id, entry, outbound, IdOrigin::Given).await? {
            Prepared::Existing(existing) => Ok(Inserted::Existing(existing)),
            Prepared::New { entry, writes } => {
                self.store.commit(writes).await.map_err(failed)?;
                Ok(Inserted::New(entry))
            }
        }
    }

    /// Stores a visitor message (its id minted here just now) and hands it to xAgent in one
    /// transaction: `send` gets the message's writes and commits them with its outbox record.
    /// When `send` fails nothing of it was stored, and the message is stored `rejected`
    /// with `reason` of the failure instead. A repeat (same `client_id` in the room) returns
    /// the stored message and sends nothing.
    pub(crate) async fn insert_sent<E, F>(
        &self,
        room_id: &str,
        entry: &ChatEntry,
        outbound: &str,
        send: impl FnOnce(Vec<AuthorWrite>) -> F,
        reason: impl FnOnce(&E) -> String,
    ) -> Result<Sent, WebchatError>
    where
        F: std::future::Future<Output = Result<(), E>>,
    {
        let lock = self.room_lock(room_id);
        let _held = lock.lock().await;
        let (entry, writes) =
            match self.prepare_locked(room_id, entry, Some(outbound), IdOrigin::Minted).await? {
                Prepared::Existing(existing) => return Ok(Sent::Existing(existing)),
                Prepared::New { entry, writes } => (entry, writes),
            };
        let Err(error) = send(writes).await else { return Ok(Sent::Queued(entry)) };
        let rejected =
            ChatEntry { status: EntryStatus::Rejected, error: Some(reason(&error)), ..entry };
        let seq = self.next_seq(room_id, rejected.created_at).await?;
        let mut writes = Self::writes(room_id, seq, &rejected, Some(outbound))?;
        writes.extend(self.hint(room_id, &rejected.message_id)?);
        self.store.commit(writes).await.map_err(failed)?;
        Ok(Sent::Refused(rejected))
    }

    /// The message a page sent with `client_id` in a room, if any.
    pub(crate) async fn entry_by_client(
        &self,
        room_id: &str,
        client_id: &str,
    ) -> Result<Option<ChatEntry>, WebchatError> {
        let Some(key) = self.key_of(CLIENTS, &client_key(room_id, client_id)).await? else {
            return Ok(None);
        };
        Ok(self.load(&key).await?.map(|stored| stored.entry))
    }

    /// Sets a message's delivery state (found by its `message_id`) and returns its room and
    /// the updated message.
    pub(crate) async fn set_status(
        &self,
        message_id: &str,
        status: EntryStatus,
        error: Option<&str>,
    ) -> Result<Option<(String, ChatEntry)>, WebchatError> {
        let update = StatusUpdate {
            message_id: message_id.to_owned(),
            status,
            error: error.map(str::to_owned),
        };
        Ok(self.set_statuses(vec![update]).await?.pop())
    }

    /// Sets the delivery states of several messages in one transaction (the records are read
    /// at once) and returns each found message's room and updated form; unknown ids are
    /// skipped.
    pub(crate) async fn set_statuses(
        &self,
        updates: Vec<StatusUpdate>,
    ) -> Result<Vec<(String, ChatEntry)>, WebchatError> {
        // Two reads for the whole batch: the messages' keys, then the messages.
        let ids: Vec<String> = updates.iter().map(|u| u.message_id.clone()).collect();
        let keys = self.store.get_many(IDS, &ids).await.map_err(failed)?;
        let (keys, updates): (Vec<String>, Vec<StatusUpdate>) = keys
            .into_iter()
            .zip(updates)
            .filter_map(|(key, update)| Some((String::from_utf8(key?).ok()?, update)))
            .unzip();
        let stored = self.store.get_many(MESSAGES, &keys).await.map_err(failed)?;
        let mut writes = Vec::new();
        let mut updated = Vec::new();
        for ((key, stored), update) in keys.into_iter().zip(stored).zip(updates) {
            let Some(value) = stored else { continue };
            let mut stored: Stored =
                serde_json::from_slice(&value).map_err(|e| failed(e.into()))?;
            let Some((room_id, rest)) = key.split_once('/') else { continue };
            stored.entry.status = update.status;
            stored.entry.error = update.error;
            writes.push(AuthorWrite::put_json(MESSAGES, &key, &stored).map_err(failed)?);
            if update.status != EntryStatus::Sending {
                writes.push(AuthorWrite::delete(SENDING, rest).map_err(failed)?);
            }
            writes.extend(self.hint(room_id, &update.message_id)?);
            updated.push((room_id.to_owned(), stored.entry));
        }
        if !writes.is_empty() {
            self.store.commit(writes).await.map_err(failed)?;
        }
        Ok(updated)
    }

    /// Visitor messages `sending` since before `before_seq` (the oldest first, looking at
    /// most at `limit` of them): `(room_id, message_id, seq)`, read from the index alone (a
    /// message's `seq` is at least its `created_at` in µs).
    pub(crate) async fn sending_before(
        &self,
        before_seq: u64,
        limit: usize,
    ) -> Result<Vec<(String, String, u64)>, WebchatError> {
        let mut out = Vec::new();
        let mut scan = AuthorScan::prefix("", PAGE.min(limit.max(1)));
        let mut looked = 0;
        while looked < limit {
            let page = self.store.scan(SENDING, &scan).await.map_err(failed)?;
            let Some(last) = page.last() else { break };
            scan = scan.clone().after(last.key.clone());
            for record in page {
                looked += 1;
                let Some((seq, message_id)) = record.key.split_once('.') else { continue };
                let Some(seq) = seq.parse::<u64>().ok().filter(|seq| *seq < before_seq) else {
                    return Ok(out);
                };
                let Ok(key) = String::from_utf8(record.value) else { continue };
                let Some((room_id, _)) = key.split_once('/') else { continue };
                out.push((room_id.to_owned(), message_id.to_owned(), seq));
            }
        }
        Ok(out)
    }

    /// A message by its `message_id`, with its room.
    pub(crate) async fn entry_by_id(
        &self,
        message_id: &str,
    ) -> Result<Option<(String, ChatEntry)>, WebchatError> {
        let Some(key) = self.key_of(IDS, message_id).await? else { return Ok(None) };
        let Some(stored) = self.load(&key).await? else { return Ok(None) };
        let Some((room_id, _)) = key.split_once('/') else { return Ok(None) };
        Ok(Some((room_id.to_owned(), stored.entry)))
    }

    /// The `chat.message` kept for a visitor message still `sending`, with its room.
    pub(crate) async fn outbound_of(
        &self,
        message_id: &str,
    ) -> Result<Option<(String, String)>, WebchatError> {
        let Some(key) = self.key_of(IDS, message_id).await? else { return Ok(None) };
        let Some(stored) = self.load(&key).await? else { return Ok(None) };
        let room_id = key.split_once('/').map(|(room, _)| room.to_owned()).unwrap_or_default();
        Ok(match stored.outbound {
            Some(outbound) if stored.entry.status == EntryStatus::Sending => {
                Some((room_id, outbound))
            }
            _ => None,
        })
    }

    /// Every visitor message still `sending`, oldest first: `(room_id, message_id, outbound)`.
    pub(crate) async fn sending(&self) -> Result<Vec<(String, String, String)>, WebchatError> {
        let mut out = Vec::new();
        let mut scan = AuthorScan::prefix("", PAGE);
        loop {
            let page = self.store.scan(SENDING, &scan).await.map_err(failed)?;
            let Some(last) = page.last() else { break };
            scan = scan.clone().after(last.key.clone());
            for record in page {
                let Ok(key) = String::from_utf8(record.value) else { continue };
                let Some(stored) = self.load(&key).await? else { continue };
                if let (EntryStatus::Sending, Some(outbound)) =
                    (stored.entry.status, stored.outbound)
                {
                    let room_id =
                        key.split_once('/').map(|(r, _)| r.to_owned()).unwrap_or_default();
                    out.push((room_id, stored.entry.message_id, outbound));
                }
            }
        }
        Ok(out)
    }

    /// The last [`HISTORY_LIMIT`] messages of a room, oldest first.
    pub(crate) async fn history(&self, room_id: &str) -> Result<Vec<ChatEntry>, WebchatError> {
        let scan = AuthorScan::prefix(format!("{room_id}/"), HISTORY_LIMIT).reversed();
        let records = self.store.scan(MESSAGES, &scan).await.map_err(failed)?;
        let mut entries = Vec::with_capacity(records.len());
        for record in records.into_iter().rev() {
            match record.json::<Stored>() {
                Ok(stored) => entries.push(stored.entry),
                Err(error) => tracing::warn!(%error, "a stored message does not decode; skipped"),
            }
        }
        Ok(entries)
    }

    /// Moves messages an older version kept in `webchat.sqlite3` (`(room_id, seq, message,
    /// outbound)` in `seq` order) here, in batches; keys come from the old `seq` (below every
    /// new one), so a move repeated after a crash rewrites the same records.
    pub(crate) async fn move_legacy(
        &self,
        rows: Vec<crate::store::LegacyMessage>,
    ) -> Result<usize, WebchatError> {
        let moved = rows.len();
        let mut batch = Vec::new();
        for (room_id, seq, entry, outbound) in rows {
            let seq = u64::try_from(seq).unwrap_or(0);
            batch.extend(Self::writes(&room_id, seq, &entry, outbound.as_deref())?);
            if batch.len() >= 400 {
                self.store.commit(std::mem::take(&mut batch)).await.map_err(failed)?;
            }
        }
        if !batch.is_empty() {
            self.store.commit(batch).await.map_err(failed)?;
        }
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use xagent_server_runtime::storage::SqliteStorage;

    use super::*;
    use crate::store::Author;

    fn messages() -> Messages {
        Messages::new(AuthorStore::new(Arc::new(SqliteStorage::in_memory().unwrap())))
    }

    fn visitor_entry(id: &str, client: Option<&str>) -> ChatEntry {
        ChatEntry {
            message_id: id.into(),
            author: Author::Visitor,
            text: Some("hi".into()),
            files: vec![],
            status: EntryStatus::Sending,
            error: None,
            client_id: client.map(str::to_owned),
            created_at: 1,
        }
    }

    #[tokio::test]
    async fn repeated_send_with_the_same_client_id_is_stored_once() {
        let messages = messages();
        let first = messages.insert("lobby", &visitor_entry("msg_1", Some("c1")), None).await;
        assert!(matches!(first.unwrap(), Inserted::New(_)));
        let again = messages.insert("lobby", &visitor_entry("msg_2", Some("c1")), None).await;
        match again.unwrap() {
            Inserted::Existing(entry) => assert_eq!(entry.message_id, "msg_1"),
            Inserted::New(entry) => panic!("expected the stored entry, got {entry:?}"),
        }
        let same_id = messages.insert("lobby", &visitor_entry("msg_1", None), None).await;
        assert!(matches!(same_id.unwrap(), Inserted::Existing(_)));
        // The same client id in another room is another message.
        let other = messages.insert("hall", &visitor_entry("msg_3", Some("c1")), None).await;
        assert!(matches!(other.unwrap(), Inserted::New(_)));
        assert_eq!(messages.history("lobby").await.unwrap().len(), 1);
        assert_eq!(
            messages.entry_by_client("lobby", "c1").await.unwrap().unwrap().message_id,
            "msg_1"
        );
    }

    #[tokio::test]
    async fn status_updates_find_the_room_by_message_id_and_end_sending() {
        let messages = messages();
        messages.insert("lobby", &visitor_entry("msg_1", None), Some("{\"out\":1}")).await.unwrap();
        assert_eq!(
            messages.sending().await.unwrap(),
            vec![("lobby".to_owned(), "msg_1".to_owned(), "{\"out\":1}".to_owned())]
        );
        assert_eq!(
            messages.outbound_of("msg_1").await.unwrap(),
            Some(("lobby".to_owned(), "{\"out\":1}".to_owned()))
        );
        let (room, entry) =
            messages.set_status("msg_1", EntryStatus::Rejected, Some("no")).await.unwrap().unwrap();
        assert_eq!(room, "lobby");
        assert_eq!(entry.status, EntryStatus::Rejected);
        assert_eq!(entry.error.as_deref(), Some("no"));
        assert!(messages.sending().await.unwrap().is_empty());
        assert_eq!(messages.outbound_of("msg_1").await.unwrap(), None);
        assert_eq!(messages.history("lobby").await.unwrap()[0].status, EntryStatus::Rejected);
        assert!(
            messages
                .set_status("msg_unknown", EntryStatus::Delivered, None)
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn sending_before_lists_the_old_sending_messages_and_batched_states_end_them() {
        let messages = messages();
        let mut old = visitor_entry("msg_old", None);
        old.created_at = 1_000;
        let mut new = visitor_entry("msg_new", None);
        new.created_at = 9_000;
        for entry in [&old, &new] {
            messages.insert("lobby", entry, Some("{}")).await.unwrap();
        }
        // Keys order by the clock in µs: only the message from before 5 s is listed.
        let listed = messages.sending_before(5_000 * 1_000, 100).await.unwrap();
        assert_eq!(listed, vec![("lobby".to_owned(), "msg_old".to_owned(), 1_000_000)]);
        assert_eq!(messages.sending_before(u64::MAX, 100).await.unwrap().len(), 2);
        assert!(messages.outbound_of("msg_old").await.unwrap().is_some());
        let updates = ["msg_old", "msg_new", "msg_unknown"].map(|id| StatusUpdate {
            message_id: id.to_owned(),
            status: EntryStatus::Delivered,
            error: None,
        });
        let updated = messages.set_statuses(updates.into()).await.unwrap();
        assert_eq!(updated.len(), 2, "the unknown id is skipped");
        assert!(messages.sending_before(u64::MAX, 100).await.unwrap().is_empty());
        assert!(messages.outbound_of("msg_old").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn history_is_the_newest_messages_in_the_order_they_were_stored() {
        let messages = messages();
        // The same clock time for every message: the order is the order of storing.
        for i in 0..(HISTORY_LIMIT + 5) {
            let entry = visitor_entry(&format!("msg_{i:04}"), None);
            messages.insert("lobby", &entry, None).await.unwrap();
        }
        let history = messages.history("lobby").await.unwrap();
        assert_eq!(history.len(), HISTORY_LIMIT);
        assert_eq!(history[0].message_id, "msg_0005");
        assert_eq!(history[HISTORY_LIMIT - 1].message_id, format!("msg_{:04}", HISTORY_LIMIT + 4));
    }
}
