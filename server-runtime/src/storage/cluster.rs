//! What replicas of one Connector share beyond rows: leases with fencing numbers and wake-ups
//! ([`Cluster`]), offered by a storage several processes can use at once (PostgreSQL). A
//! single-machine storage (SQLite) offers none and the runtime runs alone, as before.
//!
//! [`ClusterStorage`] is the storage the runtime uses on such a backend: it puts the fencing
//! number of the data-plane lease this replica holds in front of every submission (so a
//! replica whose lease was taken over cannot commit an acknowledgement: its transaction fails
//! in the database), and adds a wake-up to every write another replica must hear about (an
//! outbox record, a channel row), delivered only when the transaction commits.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use xagent_profile_im::{CompletedRecord, OutboxWrite, PendingRecord};
use xagent_protocol_types::{ConnectorChannelId, ConnectorId, MessageId};

use super::{
    AuthorRecord, AuthorScan, ChannelRecord, CommitTicket, Storage, StorageError, ToolCallRecord,
    WriteOp,
};

/// The name of the data-plane lease: held by the replica xAgent's socket reached.
pub const DATA_PLANE_LEASE: &str = "data_plane";

/// Longest topic of an author broadcast, in bytes.
pub const MAX_BROADCAST_TOPIC_BYTES: usize = 128;

/// Longest message of an author broadcast, in bytes.
pub const MAX_BROADCAST_MESSAGE_BYTES: usize = 1_024;

/// A lease as stored: who holds it, its fencing number (raised by every take-over) and how
/// long the holder's last renewal keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseState {
    /// The holding replica, if any.
    pub holder: Option<String>,
    /// The fencing number of the current (or last) holding.
    pub fence: u64,
    /// Until when (Unix ms) the holder's last renewal keeps it.
    pub expires_at: u64,
    /// When (Unix ms) the last holder gave it up, if it did and nobody took it since.
    pub released_at: Option<u64>,
}

impl LeaseState {
    /// Since when (Unix ms) nobody has held the lease: since its release, or since the last
    /// holder's renewal ran out; `None` while held, or when nobody ever held it (or it was
    /// cleaned up).
    pub fn vacant_since(&self, now: u64) -> Option<u64> {
        match &self.holder {
            Some(_) if self.expires_at > now => None,
            Some(_) => Some(self.expires_at),
            None => self.released_at,
        }
    }
}

/// What one replica hears from the others (through the database's notifications).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterEvent {
    /// Outbox records of the channel were written by another replica.
    Outbox(ConnectorChannelId),
    /// These outbox records of the channel were written by another replica.
    OutboxRecords {
        /// The channel.
        channel: ConnectorChannelId,
        /// The records' message ids.
        ids: Vec<MessageId>,
        /// The records themselves as committed, when they fitted in the wake-up (all of
        /// `ids`' or none): the socket holder need not read them.
        records: Vec<PendingRecord>,
    },
    /// The channel's row was written or deleted by another replica.
    Channel(ConnectorChannelId),
    /// A replica took the data-plane lease with this fencing number.
    DataPlaneTaken {
        /// The new fencing number.
        fence: u64,
        /// The replica that took it.
        replica: String,
    },
    /// An author broadcast from another replica.
    Broadcast {
        /// Its topic.
        topic: String,
        /// Its message.
        message: String,
    },
    /// The notification stream (re)started: what was sent while it was down is lost, so
    /// whoever keeps a view of shared rows reads them again.
    Resync,
}

/// The stored form of a wake-up: who sent it and what it says, as short JSON.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Notice {
    /// The sending replica.
    pub(crate) r: String,
    /// The kind: `outbox`, `channel`, `lease`, `broadcast`.
    pub(crate) k: String,
    /// A channel id, for `outbox` and `channel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) c: Option<String>,
    /// A fencing number, for `lease`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) f: Option<u64>,
    /// A topic, for `broadcast`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) t: Option<String>,
    /// A message, for `broadcast`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) m: Option<String>,
    /// The message ids of the records written, for `outbox` (absent: read them all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) i: Option<Vec<String>>,
    /// The records of `i` as written, when they fit ([`NOTICE_CARRY_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) p: Option<Vec<Carried>>,
}

/// An outbox record carried in a wake-up (its channel is the notice's, its id in `i`).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Carried {
    s: u64,
    b: String,
    a: u32,
    t0: u64,
    x: u64,
    n: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    e: Option<String>,
}

impl Carried {
    fn of(record: &PendingRecord) -> Self {
        Self {
            s: record.seq,
            b: record.payload.clone(),
            a: record.attempts,
            t0: record.first_responsibility_at,
            x: record.expires_at,
            n: record.next_attempt_at,
            e: record.last_error.clone(),
        }
    }

    fn into_record(self, channel: &ConnectorChannelId, message_id: MessageId) -> PendingRecord {
        PendingRecord {
            channel: channel.clone(),
            message_id,
            seq: self.s,
            payload: self.b,
            attempts: self.a,
            first_responsibility_at: self.t0,
            expires_at: self.x,
            next_attempt_at: self.n,
            last_error: self.e,
        }
    }
}

/// A wake-up carries its records while its text stays within this many bytes (a
/// notification holds 8,000); past it, it names them only and the holder reads them.
const NOTICE_CARRY_BYTES: usize = 7_000;

/// A wake-up names at most this many outbox records; one about more says "read them all"
/// (a notification's payload is limited to 8,000 bytes).
const NOTICE_IDS: usize = 64;

impl Notice {
    fn about(replica: &str, kind: &str) -> Self {
        Self {
            r: replica.to_owned(),
            k: kind.to_owned(),
            c: None,
            f: None,
            t: None,
            m: None,
            i: None,
            p: None,
        }
    }

    /// A wake-up about a channel's outbox records: those of `ids`, or (`None`) any.
    pub(crate) fn outbox(replica: &str, channel: &str, ids: Option<Vec<String>>) -> Self {
        Self { c: Some(channel.to_owned()), i: ids, ..Self::about(replica, "outbox") }
    }

    /// A wake-up about a channel's row.
    pub(crate) fn channel(replica: &str, channel: &str) -> Self {
        Self { c: Some(channel.to_owned()), ..Self::about(replica, "channel") }
    }

    /// An author broadcast.
    pub(crate) fn broadcast(replica: &str, topic: &str, message: &str) -> Self {
        Self {
            t: Some(topic.to_owned()),
            m: Some(message.to_owned()),
            ..Self::about(replica, "broadcast")
        }
    }

    /// The wake-up write.
    pub(crate) fn into_write(self) -> WriteOp {
        WriteOp::Notify(serde_json::to_string(&self).unwrap_or_default())
    }

    /// Reads a payload: `None` for one this version does not understand (ignored), or one
    /// `own` (this replica) sent. (Only a shared backend hears wake-ups.)
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn read(payload: &str, own: &str) -> Option<ClusterEvent> {
        // This replica's own notices (`r` comes first, `k` second) are skipped unread, as
        // they may carry records; its lease notices are heard.
        if payload
            .strip_prefix("{\"r\":")
            .and_then(|rest| rest.strip_prefix(serde_json::to_string(own).ok()?.as_str()))
            .and_then(|rest| rest.strip_prefix(",\"k\":"))
            .is_some_and(|rest| !rest.starts_with("\"lease\""))
        {
            return None;
        }
        let notice: Notice = serde_json::from_str(payload).ok()?;
        let c = notice.c.clone();
        let channel = || c.clone().map(ConnectorChannelId::new);
        let event = match notice.k.as_str() {
            "lease" => ClusterEvent::DataPlaneTaken { fence: notice.f?, replica: notice.r.clone() },
            _ if notice.r == own => return None,
            "outbox" => match notice.i {
                Some(ids) => {
                    let channel = channel()?;
                    let ids: Vec<MessageId> =
                        ids.iter().map(|id| MessageId::new(id.as_str())).collect();
                    let records = match notice.p {
                        Some(carried) if carried.len() == ids.len() => carried
                            .into_iter()
                            .zip(&ids)
                            .map(|(c, id)| c.into_record(&channel, id.clone()))
                            .collect(),
                        _ => Vec::new(),
                    };
                    ClusterEvent::OutboxRecords { channel, ids, records }
                }
                None => ClusterEvent::Outbox(channel()?),
            },
            "channel" => ClusterEvent::Channel(channel()?),
            "broadcast" => {
                ClusterEvent::Broadcast { topic: notice.t.clone()?, message: notice.m.clone()? }
            }
            _ => return None,
        };
        Some(event)
    }
}

/// Leases and wake-ups shared by the replicas of one Connector (implemented by a storage
/// several processes use at once).
#[async_trait::async_trait]
pub trait Cluster: Send + Sync + 'static {
    /// This process's replica name (random per start, shown in logs and in lease rows).
    fn replica(&self) -> &str;
    /// Hears what the other replicas do, from now on. A [`ClusterEvent::Resync`] comes first
    /// once the stream is listening, and again after every reconnection.
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<ClusterEvent>;
    /// Takes lease `name` for `valid_for_ms`: from whoever holds it when `force` (the
    /// data-plane lease follows xAgent's newest socket), else only when it is free or its
    /// holder's renewal ran out (or this replica holds it). Returns the new fencing number, or
    /// `None` when another replica holds it.
    async fn acquire(
        &self,
        name: &str,
        force: bool,
        now: u64,
        valid_for_ms: u64,
    ) -> Result<Option<u64>, StorageError>;
    /// Extends lease `name` held with `fence`; false when it is no longer this replica's.
    async fn renew(
        &self,
        name: &str,
        fence: u64,
        now: u64,
        valid_for_ms: u64,
    ) -> Result<bool, StorageError>;
    /// Gives lease `name` up (when still held with `fence`).
    async fn release(&self, name: &str, fence: u64, now: u64) -> Result<(), StorageError>;
    /// Lease `name` as stored (a never-taken lease reads as free, fence 0).
    async fn lease(&self, name: &str) -> Result<LeaseState, StorageError>;
    /// Claims the cleanup of lease `name` after it stayed vacant: succeeds for exactly one
    /// caller that saw `fence`, raising the fence and marking the lease as never held.
    async fn claim_vacant(&self, name: &str, fence: u64, now: u64) -> Result<bool, StorageError>;
    /// Checks that the database answers (the replica's health).
    async fn ping(&self) -> Result<(), StorageError>;
}

/// The runtime's storage on a shared database: the backend, plus the fencing number of the
/// data-plane lease while this replica holds it (0 when it does not) and the wake-ups other
/// replicas need. Reads pass through.
pub struct ClusterStorage {
    inner: Arc<dyn Storage>,
    replica: String,
    fence: AtomicU64,
}

impl ClusterStorage {
    /// Wraps `inner` for the replica named `replica`.
    pub fn new(inner: Arc<dyn Storage>, replica: impl Into<String>) -> Self {
        Self { inner, replica: replica.into(), fence: AtomicU64::new(0) }
    }

    /// From now on every submission is fenced with `fence` (0: not fenced).
    pub fn set_fence(&self, fence: u64) {
        self.fence.store(fence, Ordering::SeqCst);
    }

    /// The fencing number submissions carry now (0: none).
    pub fn fence(&self) -> u64 {
        self.fence.load(Ordering::SeqCst)
    }

    /// What `writes` become: the fence first, then the writes, then one wake-up per channel
    /// whose outbox or row they change.
    fn augment(&self, writes: Vec<WriteOp>) -> Vec<WriteOp> {
        let fence = self.fence();
        // (outbox?, channel, the outbox records while they fit in a notice)
        let mut notices: Vec<(bool, String, Option<Vec<&PendingRecord>>)> = Vec::new();
        for write in &writes {
            let (outbox, channel, record) = match write {
                // The socket holder's own records need no wake-up: only a holder adopts
                // records, and one taking over reads the channels it opens (while this one's
                // fenced writes fail from then on).
                WriteOp::Outbox(OutboxWrite::Save(_)) if fence != 0 => continue,
                WriteOp::Outbox(OutboxWrite::Save(record)) => {
                    (true, record.channel.as_str(), Some(record))
                }
                WriteOp::Channel { id, .. } | WriteOp::DeleteChannel(id) => {
                    (false, id.as_str(), None)
                }
                _ => continue,
            };
            let at = notices.iter().position(|(o, c, _)| *o == outbox && c == channel);
            let notice = match at {
                Some(at) => &mut notices[at],
                None => {
                    notices.push((outbox, channel.to_owned(), outbox.then(Vec::new)));
                    let last = notices.len() - 1;
                    &mut notices[last]
                }
            };
            if let (Some(records), Some(record)) = (&mut notice.2, record) {
                if records.len() < NOTICE_IDS {
                    records.push(record);
                } else {
                    notice.2 = None;
                }
            }
        }
        let notices: Vec<WriteOp> = notices
            .into_iter()
            .map(|(outbox, channel, records)| {
                if !outbox {
                    return Notice::channel(&self.replica, &channel).into_write();
                }
                let Some(records) = records else {
                    return Notice::outbox(&self.replica, &channel, None).into_write();
                };
                let ids: Vec<String> =
                    records.iter().map(|r| r.message_id.as_str().to_owned()).collect();
                let carried = Notice {
                    p: Some(records.into_iter().map(Carried::of).collect()),
                    ..Notice::outbox(&self.replica, &channel, Some(ids.clone()))
                };
                match carried.into_write() {
                    // Too long with the records: the ids alone.
                    WriteOp::Notify(text) if text.len() > NOTICE_CARRY_BYTES => {
                        Notice::outbox(&self.replica, &channel, Some(ids)).into_write()
                    }
                    write => write,
                }
            })
            .collect();
        let mut all = Vec::with_capacity(writes.len() + notices.len() + 1);
        // A broadcast alone acknowledges nothing: it needs no fence.
        let only_notices = writes.iter().all(|w| matches!(w, WriteOp::Notify(_)));
        if fence != 0 && !only_notices {
            all.push(WriteOp::Fence(fence));
        }
        all.extend(writes);
        all.extend(notices);
        all
    }
}

#[async_trait::async_trait]
impl Storage for ClusterStorage {
    async fn load_connector_id(&self) -> Result<Option<ConnectorId>, StorageError> {
        self.inner.load_connector_id().await
    }
    async fn load_channels(&self) -> Result<Vec<ChannelRecord>, StorageError> {
        self.inner.load_channels().await
    }
    async fn load_channel(
        &self,
        id: &ConnectorChannelId,
    ) -> Result<Option<ChannelRecord>, StorageError> {
        self.inner.load_channel(id).await
    }
    async fn load_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
    ) -> Result<Option<ToolCallRecord>, StorageError> {
        self.inner.load_tool_call(channel, key).await
    }
    async fn load_meta(&self, key: &str) -> Result<Option<String>, StorageError> {
        self.inner.load_meta(key).await
    }
    async fn load_pending(&self) -> Result<Vec<PendingRecord>, StorageError> {
        self.inner.load_pending().await
    }
    async fn load_pending_of(
        &self,
        channel: &ConnectorChannelId,
    ) -> Result<Vec<PendingRecord>, StorageError> {
        self.inner.load_pending_of(channel).await
    }
    async fn load_pending_ids(
        &self,
        channel: &ConnectorChannelId,
        ids: &[MessageId],
    ) -> Result<Vec<PendingRecord>, StorageError> {
        self.inner.load_pending_ids(channel, ids).await
    }
    async fn lookup_completed(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StorageError> {
        self.inner.lookup_completed(channel, message_id).await
    }
    async fn prune_tool_calls(&self, before: u64) -> Result<usize, StorageError> {
        self.inner.prune_tool_calls(before).await
    }
    async fn author_get(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.author_get(namespace, key).await
    }
    async fn author_get_many(
        &self,
        namespace: &str,
        keys: &[String],
    ) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        self.inner.author_get_many(namespace, keys).await
    }
    async fn author_scan(
        &self,
        namespace: &str,
        scan: &AuthorScan,
    ) -> Result<Vec<AuthorRecord>, StorageError> {
        self.inner.author_scan(namespace, scan).await
    }
    async fn author_count(&self, namespace: &str, prefix: &str) -> Result<u64, StorageError> {
        self.inner.author_count(namespace, prefix).await
    }
    fn commit(&self, writes: Vec<WriteOp>) -> CommitTicket {
        self.inner.commit(self.augment(writes))
    }
    fn cluster(&self) -> Option<Arc<dyn Cluster>> {
        self.inner.cluster()
    }
    async fn ping(&self) -> Result<(), StorageError> {
        self.inner.ping().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vacant_lease_counts_from_its_release_or_its_last_renewal() {
        let held =
            LeaseState { holder: Some("a".into()), fence: 3, expires_at: 5_000, released_at: None };
        assert_eq!(held.vacant_since(4_999), None);
        assert_eq!(held.vacant_since(5_000), Some(5_000), "the holder stopped renewing");
        let released = LeaseState { holder: None, released_at: Some(4_000), ..held.clone() };
        assert_eq!(released.vacant_since(9_000), Some(4_000));
        let cleaned = LeaseState { holder: None, released_at: None, ..held };
        assert_eq!(cleaned.vacant_since(9_000), None);
    }

    #[test]
    fn notices_name_their_replica_and_are_not_heard_by_it() {
        let payload = |n: Notice| match n.into_write() {
            WriteOp::Notify(text) => text,
            other => panic!("{other:?}"),
        };
        let outbox = payload(Notice::outbox("r1", "cch_1", None));
        assert_eq!(
            Notice::read(&outbox, "r2"),
            Some(ClusterEvent::Outbox(ConnectorChannelId::new("cch_1")))
        );
        let named = payload(Notice::outbox("r1", "cch_1", Some(vec!["m1".into()])));
        assert_eq!(
            Notice::read(&named, "r2"),
            Some(ClusterEvent::OutboxRecords {
                channel: ConnectorChannelId::new("cch_1"),
                ids: vec![MessageId::new("m1")],
                records: vec![],
            })
        );
        assert_eq!(Notice::read(&outbox, "r1"), None, "own wake-ups are not heard");
        let lease = r#"{"r":"r1","k":"lease","f":7}"#;
        assert_eq!(
            Notice::read(lease, "r1"),
            Some(ClusterEvent::DataPlaneTaken { fence: 7, replica: "r1".into() }),
            "a lease change is heard by everyone"
        );
        assert_eq!(Notice::read("not json", "r2"), None);
        assert_eq!(Notice::read(r#"{"r":"r1","k":"future"}"#, "r2"), None);
    }

    #[test]
    fn an_outbox_wakeup_names_its_records_until_there_are_too_many() {
        let storage = ClusterStorage::new(
            Arc::new(
                crate::storage::SqliteStorage::in_memory()
                    .unwrap_or_else(|e| panic!("an in-memory database: {e}")),
            ),
            "r1",
        );
        let record = |channel: &str, id: &str, payload: &str| PendingRecord {
            channel: ConnectorChannelId::new(channel),
            message_id: MessageId::new(id),
            seq: 1,
            payload: payload.into(),
            attempts: 2,
            first_responsibility_at: 3,
            expires_at: 4,
            next_attempt_at: 5,
            last_error: Some("busy".into()),
        };
        let save =
            |channel: &str, id: &str| WriteOp::Outbox(OutboxWrite::Save(record(channel, id, "{}")));
        let notices = |writes: Vec<WriteOp>| -> Vec<Option<ClusterEvent>> {
            storage
                .augment(writes)
                .into_iter()
                .filter_map(|w| match w {
                    WriteOp::Notify(text) => Some(Notice::read(&text, "r2")),
                    _ => None,
                })
                .collect()
        };
        let few = notices(vec![save("cch_a", "m1"), save("cch_a", "m2"), save("cch_b", "m3")]);
        assert_eq!(
            few,
            vec![
                Some(ClusterEvent::OutboxRecords {
                    channel: ConnectorChannelId::new("cch_a"),
                    ids: vec![MessageId::new("m1"), MessageId::new("m2")],
                    records: vec![record("cch_a", "m1", "{}"), record("cch_a", "m2", "{}")],
                }),
                Some(ClusterEvent::OutboxRecords {
                    channel: ConnectorChannelId::new("cch_b"),
                    ids: vec![MessageId::new("m3")],
                    records: vec![record("cch_b", "m3", "{}")],
                }),
            ],
            "each record carried as written"
        );
        // Records too long for a notification: named only (the holder reads them).
        let long = "x".repeat(4_000);
        let big = |id: &str| WriteOp::Outbox(OutboxWrite::Save(record("cch_a", id, &long)));
        assert_eq!(
            notices(vec![big("m1"), big("m2")]),
            vec![Some(ClusterEvent::OutboxRecords {
                channel: ConnectorChannelId::new("cch_a"),
                ids: vec![MessageId::new("m1"), MessageId::new("m2")],
                records: vec![],
            })]
        );
        // The socket holder's own records wake nobody (a channel row still does).
        storage.set_fence(4);
        let channel_row = WriteOp::DeleteChannel("cch_c".into());
        assert_eq!(
            notices(vec![save("cch_a", "m1"), channel_row]),
            vec![Some(ClusterEvent::Channel(ConnectorChannelId::new("cch_c")))]
        );
        storage.set_fence(0);
        let many = notices((0..=NOTICE_IDS).map(|n| save("cch_a", &format!("m{n}"))).collect());
        assert_eq!(many, vec![Some(ClusterEvent::Outbox(ConnectorChannelId::new("cch_a")))]);
    }
}
