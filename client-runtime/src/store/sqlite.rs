//! The default store: SQLite, one file under the state directory.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, params};
use xagent_profile_im::{
    AttemptUpdate, CompletedRecord, IdempotencyStore, IdempotencyWrite, OutboxStore, OutboxWrite,
    PendingRecord, StoreError,
};
use xagent_protocol_types::{ConnectorChannelId, ConnectorId, MessageId};

use super::{RememberedChannel, XagentStore, check_rename};

const DATABASE_FILE: &str = "xagent.sqlite3";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS channels (
  id TEXT PRIMARY KEY, owner TEXT);
CREATE TABLE IF NOT EXISTS xagent_meta (
  key TEXT PRIMARY KEY, value TEXT NOT NULL);
";

/// The `xagent_meta` key of the last accepted `connector_id`.
const META_CONNECTOR_ID: &str = "connector_id";

/// The default store: one SQLite file (WAL, synchronous commits) under a state directory
/// readable only by its owner. Clones share one connection.
#[derive(Clone, Debug)]
pub struct SqliteXagentStore {
    conn: Arc<Mutex<Connection>>,
    path: Option<PathBuf>,
}

fn err(operation: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError::from_source(operation, e)
}

impl SqliteXagentStore {
    /// Opens (creating if needed) `<state_dir>/xagent.sqlite3`. Every commit is synced: an
    /// acknowledged message is on disk before its ack leaves.
    pub fn open(state_dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let dir = state_dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| StoreError::from_source("create state dir", e))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| StoreError::from_source("restrict state dir", e))?;
        }
        let path = dir.join(DATABASE_FILE);
        let conn = Connection::open(&path).map_err(err("open"))?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(err("enable WAL"))?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(err("set synchronous"))?;
        Self::init(conn, Some(path))
    }

    /// An in-memory database (tests).
    pub fn in_memory() -> Result<Self, StoreError> {
        Self::init(Connection::open_in_memory().map_err(err("open"))?, None)
    }

    fn init(conn: Connection, path: Option<PathBuf>) -> Result<Self, StoreError> {
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(err("set busy timeout"))?;
        conn.execute_batch(SCHEMA).map_err(err("create schema"))?;
        conn.execute_batch(xagent_im_sqlite::SCHEMA).map_err(err("create schema"))?;
        Ok(Self { conn: Arc::new(Mutex::new(conn)), path })
    }

    /// The database file, if not in memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Message ids the receiver completed on a channel (for operators and tests).
    pub fn completed_ids(&self) -> Result<Vec<(ConnectorChannelId, MessageId)>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare("SELECT channel, message_id FROM im_completed ORDER BY completed_at")
            .map_err(err("completed_ids"))?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    ConnectorChannelId::new(row.get::<_, String>(0)?),
                    MessageId::new(row.get::<_, String>(1)?),
                ))
            })
            .map_err(err("completed_ids"))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(err("completed_ids"))
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl XagentStore for SqliteXagentStore {
    fn load_channels(&self) -> Result<Vec<RememberedChannel>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare("SELECT id, owner FROM channels ORDER BY rowid")
            .map_err(err("load_channels"))?;
        let rows = stmt
            .query_map([], |row| {
                Ok(RememberedChannel {
                    channel: ConnectorChannelId::new(row.get::<_, String>(0)?),
                    owner: row.get(1)?,
                })
            })
            .map_err(err("load_channels"))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(err("load_channels"))
    }

    fn save_channel(
        &self,
        channel: &ConnectorChannelId,
        owner: Option<&str>,
    ) -> Result<(), StoreError> {
        self.lock()
            .prepare_cached(
                "INSERT INTO channels (id, owner) VALUES (?1, ?2)
                 ON CONFLICT(id) DO UPDATE SET owner = COALESCE(excluded.owner, channels.owner)",
            )
            .and_then(|mut stmt| stmt.execute(params![channel.as_str(), owner]))
            .map(|_| ())
            .map_err(err("save_channel"))
    }

    fn delete_channel(&self, channel: &ConnectorChannelId) -> Result<(), StoreError> {
        self.lock()
            .prepare_cached("DELETE FROM channels WHERE id = ?1")
            .and_then(|mut stmt| stmt.execute(params![channel.as_str()]))
            .map(|_| ())
            .map_err(err("delete_channel"))
    }

    /// One transaction over the three tables: the channel row, its pending messages and its
    /// completed ids move together or not at all.
    fn rename_channel(
        &self,
        from: &ConnectorChannelId,
        to: &ConnectorChannelId,
    ) -> Result<(), StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction().map_err(err("rename_channel"))?;
        let known = |id: &ConnectorChannelId| -> Result<bool, StoreError> {
            tx.prepare_cached("SELECT EXISTS (SELECT 1 FROM channels WHERE id = ?1)")
                .and_then(|mut stmt| stmt.query_row(params![id.as_str()], |row| row.get(0)))
                .map_err(err("rename_channel"))
        };
        check_rename(from, to, known(from)?, known(to)?)?;
        if from == to {
            return Ok(());
        }
        tx.execute(
            "UPDATE channels SET id = ?1 WHERE id = ?2",
            params![to.as_str(), from.as_str()],
        )
        .map_err(err("rename_channel"))?;
        xagent_im_sqlite::rename_channel(&tx, from, to).map_err(err("rename_channel"))?;
        tx.commit().map_err(err("rename_channel"))
    }

    fn load_connector_id(&self) -> Result<Option<ConnectorId>, StoreError> {
        use rusqlite::OptionalExtension as _;
        self.lock()
            .prepare_cached("SELECT value FROM xagent_meta WHERE key = ?1")
            .and_then(|mut stmt| {
                stmt.query_row(params![META_CONNECTOR_ID], |row| row.get::<_, String>(0)).optional()
            })
            .map(|id| id.map(ConnectorId::new))
            .map_err(err("load_connector_id"))
    }

    fn save_connector_id(&self, connector_id: &ConnectorId) -> Result<(), StoreError> {
        self.lock()
            .prepare_cached(
                "INSERT INTO xagent_meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut stmt| stmt.execute(params![META_CONNECTOR_ID, connector_id.as_str()]))
            .map(|_| ())
            .map_err(err("save_connector_id"))
    }

    fn outbox_store(&self) -> Box<dyn OutboxStore + Send> {
        Box::new(self.clone())
    }

    fn idempotency_store(&self) -> Box<dyn IdempotencyStore + Send> {
        Box::new(self.clone())
    }
}

impl OutboxStore for SqliteXagentStore {
    fn save_pending(&mut self, r: &PendingRecord) -> Result<(), StoreError> {
        xagent_im_sqlite::save_pending(&self.lock(), r).map_err(err("save_pending"))
    }

    fn delete_pending(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError> {
        xagent_im_sqlite::delete_pending(&self.lock(), channel, message_id)
            .map_err(err("delete_pending"))
    }

    fn load_pending(&mut self) -> Result<Vec<PendingRecord>, StoreError> {
        xagent_im_sqlite::load_pending(&self.lock()).map_err(err("load_pending"))
    }

    /// All the writes in one transaction (all or none, one commit).
    fn apply(&mut self, writes: &[OutboxWrite]) -> Result<(), StoreError> {
        in_transaction(&mut self.lock(), writes, xagent_im_sqlite::write_outbox)
            .map_err(err("apply outbox writes"))
    }

    /// One narrow `UPDATE` (the payload is not written again).
    fn save_attempt(&mut self, update: &AttemptUpdate) -> Result<(), StoreError> {
        xagent_im_sqlite::update_attempt(&self.lock(), update).map_err(err("save_attempt"))
    }
}

impl IdempotencyStore for SqliteXagentStore {
    fn save_completed(&mut self, r: &CompletedRecord) -> Result<(), StoreError> {
        xagent_im_sqlite::save_completed(&self.lock(), r).map_err(err("save_completed"))
    }

    fn delete_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<(), StoreError> {
        xagent_im_sqlite::delete_completed(&self.lock(), channel, message_id)
            .map_err(err("delete_completed"))
    }

    fn load_completed(&mut self) -> Result<Vec<CompletedRecord>, StoreError> {
        xagent_im_sqlite::load_completed(&self.lock()).map_err(err("load_completed"))
    }

    /// A point read on the primary key (the receiver asks on a cache miss).
    fn lookup_completed(
        &mut self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError> {
        xagent_im_sqlite::lookup_completed(&self.lock(), channel, message_id)
            .map_err(err("lookup_completed"))
    }

    fn trim_completed(
        &mut self,
        channel: &ConnectorChannelId,
        keep: usize,
    ) -> Result<(), StoreError> {
        xagent_im_sqlite::trim_completed(&self.lock(), channel, keep).map_err(err("trim_completed"))
    }

    fn expire_completed(&mut self, before: u64) -> Result<(), StoreError> {
        xagent_im_sqlite::expire_completed(&self.lock(), before).map_err(err("expire_completed"))
    }

    /// All the writes in one transaction (all or none, one commit).
    fn apply(&mut self, writes: &[IdempotencyWrite]) -> Result<(), StoreError> {
        in_transaction(&mut self.lock(), writes, xagent_im_sqlite::write_idempotency)
            .map_err(err("apply idempotency writes"))
    }
}

/// Runs `write` for every item in one transaction: one commit (one `fsync` under
/// `synchronous=FULL`) for a batch instead of one per row, and a failure leaves none of them.
/// A single write needs no explicit transaction (SQLite commits a statement atomically).
fn in_transaction<W>(
    conn: &mut Connection,
    writes: &[W],
    write: impl Fn(&Connection, &W) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    match writes {
        [] => Ok(()),
        [one] => write(conn, one),
        many => {
            let tx = conn.transaction()?;
            for item in many {
                write(&tx, item)?;
            }
            tx.commit()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryXagentStore;

    fn pending(id: &str) -> PendingRecord {
        PendingRecord {
            channel: ConnectorChannelId::new("cch_1"),
            message_id: MessageId::new(id),
            seq: 1,
            payload: format!(
                r#"{{"type":"chat.message","payload":{{"message_id":"{id}","text":"hi"}}}}"#
            ),
            attempts: 0,
            first_responsibility_at: 1,
            expires_at: 2,
            next_attempt_at: 1,
            last_error: None,
        }
    }

    fn pending_ids(store: &mut SqliteXagentStore) -> Vec<String> {
        let records = store.load_pending().expect("loads");
        records.into_iter().map(|r| r.message_id.as_str().to_owned()).collect()
    }

    #[test]
    fn durable_state_rule_a_batch_of_outbox_writes_is_all_or_none() {
        let dir = std::env::temp_dir().join(format!("xagent-store-{}", rand::random::<u64>()));
        let mut store = SqliteXagentStore::open(&dir).expect("opens");
        let batch = [
            OutboxWrite::Save(pending("m1")),
            OutboxWrite::Save(pending("m2")),
            OutboxWrite::Delete(ConnectorChannelId::new("cch_1"), MessageId::new("m1")),
        ];
        OutboxStore::apply(&mut store, &batch).expect("applies");
        assert_eq!(pending_ids(&mut store), ["m2"], "applied in order");
        // A batch whose last write fails leaves none of its writes behind.
        store
            .lock()
            .execute_batch(
                "CREATE TRIGGER refuse_bad BEFORE INSERT ON im_pending
                 WHEN NEW.message_id = 'bad' BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            )
            .expect("trigger");
        let failing = [
            OutboxWrite::Save(pending("m3")),
            OutboxWrite::Delete(ConnectorChannelId::new("cch_1"), MessageId::new("m2")),
            OutboxWrite::Save(pending("bad")),
        ];
        assert!(OutboxStore::apply(&mut store, &failing).is_err());
        assert_eq!(pending_ids(&mut store), ["m2"], "the failed batch changed nothing");
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn durable_state_rule_channels_and_owners_survive_a_reopen() {
        let dir = std::env::temp_dir().join(format!("xagent-store-{}", rand::random::<u64>()));
        {
            let store = SqliteXagentStore::open(&dir).expect("opens");
            store.save_channel(&ConnectorChannelId::new("cch_1"), Some("alice")).expect("saves");
            store.save_channel(&ConnectorChannelId::new("cch_2"), None).expect("saves");
            store.save_channel(&ConnectorChannelId::new("cch_1"), None).expect("keeps the owner");
        }
        let store = SqliteXagentStore::open(&dir).expect("reopens");
        let channels = store.load_channels().expect("loads");
        assert_eq!(
            channels,
            vec![
                RememberedChannel {
                    channel: ConnectorChannelId::new("cch_1"),
                    owner: Some("alice".into())
                },
                RememberedChannel { channel: ConnectorChannelId::new("cch_2"), owner: None },
            ]
        );
        store.delete_channel(&ConnectorChannelId::new("cch_2")).expect("deletes");
        assert_eq!(store.load_channels().expect("loads").len(), 1);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "state readable only by its owner");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A fresh state directory, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            Self(std::env::temp_dir().join(format!("xagent-store-{}", rand::random::<u64>())))
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn completed(channel: &str, id: &str) -> CompletedRecord {
        CompletedRecord {
            channel: ConnectorChannelId::new(channel),
            message_id: MessageId::new(id),
            fingerprint: xagent_profile_im::Fingerprint::from_hex("ab"),
            completed_at: 1,
        }
    }

    /// The channel, its pending messages and its completed ids, as the store holds them.
    fn snapshot(
        store: &mut SqliteXagentStore,
    ) -> (Vec<RememberedChannel>, Vec<String>, Vec<String>) {
        let channels = store.load_channels().expect("loads");
        let mut pending: Vec<String> = store
            .load_pending()
            .expect("loads")
            .into_iter()
            .map(|r| format!("{}/{}", r.channel, r.message_id))
            .collect();
        pending.sort();
        let mut done: Vec<String> = store
            .load_completed()
            .expect("loads")
            .into_iter()
            .map(|r| format!("{}/{}", r.channel, r.message_id))
            .collect();
        done.sort();
        (channels, pending, done)
    }

    #[test]
    fn rekey_rule_a_rename_moves_the_channel_its_outbox_and_idempotency_entries_durably() {
        let dir = TempDir::new();
        {
            let mut store = SqliteXagentStore::open(dir.path()).expect("opens");
            store.save_channel(&ConnectorChannelId::new("cch_1"), Some("alice")).expect("saves");
            store.save_pending(&pending("m1")).expect("saves");
            store.save_completed(&completed("cch_1", "in_1")).expect("saves");
            store
                .rename_channel(
                    &ConnectorChannelId::new("cch_1"),
                    &ConnectorChannelId::new("cch_9"),
                )
                .expect("renames");
        }
        let mut store = SqliteXagentStore::open(dir.path()).expect("reopens");
        let (channels, pending, done) = snapshot(&mut store);
        assert_eq!(
            channels,
            vec![RememberedChannel {
                channel: ConnectorChannelId::new("cch_9"),
                owner: Some("alice".into())
            }],
            "the owner moves with the channel"
        );
        assert_eq!(pending, ["cch_9/m1"]);
        assert_eq!(done, ["cch_9/in_1"]);
    }

    #[test]
    fn rekey_rule_renaming_onto_a_remembered_id_or_an_unknown_id_is_refused_and_changes_nothing() {
        let mut store = SqliteXagentStore::in_memory().expect("opens");
        store.save_channel(&ConnectorChannelId::new("cch_1"), Some("alice")).expect("saves");
        store.save_channel(&ConnectorChannelId::new("cch_2"), Some("bob")).expect("saves");
        store.save_pending(&pending("m1")).expect("saves");
        store.save_completed(&completed("cch_1", "in_1")).expect("saves");
        // Messages stored under an id nobody remembers (a channel forgotten mid-flight).
        store.save_completed(&completed("cch_3", "in_3")).expect("saves");
        let before = snapshot(&mut store);
        let onto_remembered = store
            .rename_channel(&ConnectorChannelId::new("cch_1"), &ConnectorChannelId::new("cch_2"));
        assert!(onto_remembered.is_err_and(|e| e.reason().contains("already remembered")));
        let unknown = store
            .rename_channel(&ConnectorChannelId::new("cch_404"), &ConnectorChannelId::new("cch_5"));
        assert!(unknown.is_err_and(|e| e.reason().contains("not remembered")));
        let onto_messages = store
            .rename_channel(&ConnectorChannelId::new("cch_1"), &ConnectorChannelId::new("cch_3"));
        assert!(onto_messages.is_err(), "the transaction is rolled back as a whole");
        assert_eq!(snapshot(&mut store), before, "nothing changed");
        // The memory store applies the same rule.
        let memory = MemoryXagentStore::new();
        memory.save_channel(&ConnectorChannelId::new("cch_1"), None).expect("saves");
        memory.save_channel(&ConnectorChannelId::new("cch_2"), None).expect("saves");
        assert!(
            memory
                .rename_channel(
                    &ConnectorChannelId::new("cch_1"),
                    &ConnectorChannelId::new("cch_2")
                )
                .is_err()
        );
        assert!(
            memory
                .rename_channel(
                    &ConnectorChannelId::new("cch_7"),
                    &ConnectorChannelId::new("cch_8")
                )
                .is_err()
        );
        memory
            .rename_channel(&ConnectorChannelId::new("cch_1"), &ConnectorChannelId::new("cch_3"))
            .expect("renames");
        let ids: Vec<String> = memory
            .load_channels()
            .expect("loads")
            .into_iter()
            .map(|c| c.channel.as_str().to_owned())
            .collect();
        assert_eq!(ids, ["cch_3", "cch_2"]);
    }

    #[test]
    fn identity_rule_the_connector_id_survives_a_reopen() {
        let dir = TempDir::new();
        {
            let store = SqliteXagentStore::open(dir.path()).expect("opens");
            assert_eq!(store.load_connector_id().expect("loads"), None);
            store.save_connector_id(&ConnectorId::new("conn_1")).expect("saves");
            store.save_connector_id(&ConnectorId::new("conn_2")).expect("replaces");
        }
        let store = SqliteXagentStore::open(dir.path()).expect("reopens");
        assert_eq!(store.load_connector_id().expect("loads"), Some(ConnectorId::new("conn_2")));
    }
}
