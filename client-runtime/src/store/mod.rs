//! Durable xAgent-side state behind one async trait, with an embedded SQLite default:
//! remembered channels and their owners, the `connector_id` of the last hello, the receiver
//! idempotency set of inbound messages, the outbox of assistant messages, the Card snapshot and
//! Skill cache of the last admission ([`AdmissionSnapshot`]), and the holder lease of a
//! Connector Card when several xAgent processes share one database.
//!
//! Reads are `async fn`. Every write goes through [`XagentStore::commit`]: a batch of
//! [`XagentWrite`]s applied in submission order in one transaction (all or none), whose
//! [`CommitTicket`] resolves once that transaction committed. The runtime submits while it
//! holds its IM lock (so the order of writes is the order of the state changes) and answers
//! the Connector (an `accepted` ack) or the application (an enqueue) only after the ticket
//! resolved. A batch submitted under the holder lease carries its [`Fence`]; the database
//! refuses it ([`CommitError::Fenced`]) when another process took the lease over since.

mod commit;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod sqlite;

pub use commit::{CommitError, CommitTicket};
pub(crate) use commit::{Submitted, ready};
pub use memory::MemoryXagentStore;
#[cfg(feature = "postgres")]
pub use postgres::{POSTGRES_COMPONENT, PostgresXagentStore};
pub use sqlite::SqliteXagentStore;

use async_trait::async_trait;
use xagent_profile_im::{
    CompletedRecord, IdempotencyWrite, OutboxWrite, PendingRecord, StoreError,
};
use xagent_protocol_types::{ConnectorCardId, ConnectorChannelId, ConnectorId, MessageId};

/// A channel xAgent remembers across restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RememberedChannel {
    /// The channel id.
    pub channel: ConnectorChannelId,
    /// The xAgent user who owns it.
    pub owner: Option<String>,
}

/// One durable write, for [`XagentStore::commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XagentWrite {
    /// Remembers (or updates) a channel; an owner of `None` keeps the stored one.
    SaveChannel {
        /// The channel.
        channel: ConnectorChannelId,
        /// Its owner, if known.
        owner: Option<String>,
    },
    /// Forgets a channel.
    DeleteChannel(ConnectorChannelId),
    /// Renames a remembered channel the Connector re-keyed on reopen: the channel (its owner
    /// kept), its outbox entries and its receiver idempotency entries move to `to`. Fails the
    /// whole batch when `from` is not remembered, or `to` already is or already has stored
    /// messages.
    RenameChannel {
        /// The stored id.
        from: ConnectorChannelId,
        /// The id the Connector gave.
        to: ConnectorChannelId,
    },
    /// Stores the `connector_id` of an accepted `hello.ack`.
    ConnectorId(ConnectorId),
    /// Replaces the Card snapshot and the Skill cache, both at once, with what an admission
    /// just accepted (never written for a Card or Skill that was refused).
    Admission(AdmissionSnapshot),
    /// One write to the outbox's records.
    Outbox(OutboxWrite),
    /// One write to the receiver's idempotency records.
    Idempotency(IdempotencyWrite),
}

/// The Card document and the Skill xAgent last admitted a Connector with: the Card snapshot and
/// the Skill cache it keeps across restarts. Stored as one value, so the two are replaced
/// together or not at all.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AdmissionSnapshot {
    /// The Card document as fetched (unknown fields kept), so a restart checks it again with
    /// the rules and admission window of that day.
    pub card: serde_json::Value,
    /// The primary Skill's Markdown, `None` when the Connector serves none.
    pub skill: Option<String>,
}

impl AdmissionSnapshot {
    /// The stored form (one text value in the backend's key-value table).
    pub(crate) fn encode(&self) -> Result<String, StoreError> {
        serde_json::to_string(self).map_err(|e| StoreError::from_source("save_admission", e))
    }

    /// Reads the stored form back.
    pub(crate) fn decode(text: &str) -> Result<Self, StoreError> {
        serde_json::from_str(text).map_err(|e| StoreError::from_source("load_admission", e))
    }
}

/// The key-value key (SQLite `xagent_meta`, PostgreSQL `xagent_client_meta`) of the
/// [`AdmissionSnapshot`].
pub(crate) const META_ADMISSION: &str = "admission";

/// The holder lease a batch was written under: the database applies the batch only while the
/// lease row of `card` still names `holder` with this fencing `number`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The Connector Card the lease is for.
    pub card: ConnectorCardId,
    /// The process holding it.
    pub holder: String,
    /// The fencing number: it grows on every takeover, so a writer holding an older one is
    /// refused.
    pub number: u64,
}

/// A request for the holder lease of a Card ([`XagentStore::acquire_lease`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The Connector Card.
    pub card: ConnectorCardId,
    /// This process's holder id (unique per process start).
    pub holder: String,
    /// Now, from the injected clock (Unix ms).
    pub now: u64,
    /// How long the lease lasts from now without a renewal (ms).
    pub ttl_ms: u64,
}

impl LeaseRequest {
    /// When a lease granted by this request expires.
    pub fn expires_at(&self) -> u64 {
        self.now.saturating_add(self.ttl_ms)
    }
}

/// What the lease row says after [`XagentStore::acquire_lease`] or [`XagentStore::renew_lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// This process holds the lease until `expires_at`.
    Held {
        /// The fence to write under.
        fence: Fence,
        /// When it expires without a renewal (Unix ms, the requester's clock).
        expires_at: u64,
    },
    /// Another process holds it (or held it last: a renewal that found another holder or a
    /// higher fencing number).
    Other {
        /// The holder named in the row.
        holder: String,
        /// Its fencing number.
        number: u64,
        /// When its lease expires (Unix ms).
        expires_at: u64,
    },
}

/// Where xAgent-side state lives. Clones of a backend share it; several processes may share a
/// database (PostgreSQL, or one SQLite file on one machine), coordinated by the holder lease.
#[async_trait]
pub trait XagentStore: Send + Sync + 'static {
    /// Every remembered channel, in the order they were first remembered.
    async fn load_channels(&self) -> Result<Vec<RememberedChannel>, StoreError>;
    /// The `connector_id` of the last accepted `hello.ack`, if one was stored.
    async fn load_connector_id(&self) -> Result<Option<ConnectorId>, StoreError>;
    /// The Card snapshot and Skill cache of the last admission, if one was stored.
    async fn load_admission(&self) -> Result<Option<AdmissionSnapshot>, StoreError>;
    /// Every pending outbox record, in any order (the outbox sorts them by `seq`).
    async fn load_pending(&self) -> Result<Vec<PendingRecord>, StoreError>;
    /// The receiver's record of one `(channel, message_id)`, if stored (a point read).
    async fn lookup_completed(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError>;
    /// Submits `writes`, applied after every batch submitted before, in one transaction (all
    /// or none); under `fence`, only while the lease row still carries it. The ticket resolves
    /// once the transaction committed (or failed, having changed nothing).
    fn commit(&self, fence: Option<Fence>, writes: Vec<XagentWrite>) -> CommitTicket;
    /// Takes the Card's holder lease when it is free, expired, or already named this holder:
    /// the fencing number grows by one and the lease lasts until `now + ttl_ms`. Otherwise
    /// reports who holds it.
    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseState, StoreError>;
    /// Extends the lease to `now + ttl_ms` if the row still carries `fence`; otherwise reports
    /// what the row says now (another holder, or a higher fencing number).
    async fn renew_lease(
        &self,
        fence: &Fence,
        now: u64,
        ttl_ms: u64,
    ) -> Result<LeaseState, StoreError>;
    /// Gives the lease up (it expires at once) if the row still carries `fence`, so another
    /// process takes over without waiting for the expiry.
    async fn release_lease(&self, fence: &Fence) -> Result<(), StoreError>;
}

/// The rename rule every store applies: `from` must be remembered and `to` must not be.
pub(crate) fn check_rename(
    from: &ConnectorChannelId,
    to: &ConnectorChannelId,
    from_known: bool,
    to_known: bool,
) -> Result<(), StoreError> {
    if !from_known {
        return Err(StoreError::new(
            "rename_channel",
            format!("channel {from} is not remembered; remember it before renaming it"),
        ));
    }
    if from != to && to_known {
        return Err(StoreError::new(
            "rename_channel",
            format!("channel {to} is already remembered; forget it before {from} can take its id"),
        ));
    }
    Ok(())
}

/// The refusal of a rename onto an id that already has stored messages.
pub(crate) fn rename_onto_messages(to: &ConnectorChannelId) -> StoreError {
    StoreError::new(
        "rename_channel",
        format!("channel {to} already has stored messages; the rename would mix two channels"),
    )
}

/// What the lease row says, seen by `request` or a renewal of `fence`: held by this process
/// when it names the same holder and fencing number.
pub(crate) fn lease_state(
    card: &ConnectorCardId,
    me: &str,
    row: (String, u64, u64),
    mine: Option<u64>,
) -> LeaseState {
    let (holder, number, expires_at) = row;
    if holder == me && mine.is_none_or(|n| n == number) {
        LeaseState::Held { fence: Fence { card: card.clone(), holder, number }, expires_at }
    } else {
        LeaseState::Other { holder, number, expires_at }
    }
}

/// What `acquire_lease` reports from the row it read back after taking the lease (the row is
/// there: it was just written).
pub(crate) fn taken_lease(
    request: &LeaseRequest,
    row: Option<(String, u64, u64)>,
) -> Result<LeaseState, StoreError> {
    row.map(|row| lease_state(&request.card, &request.holder, row, None))
        .ok_or_else(|| StoreError::new("acquire_lease", "the lease row vanished while taken"))
}

/// What `renew_lease` reports from the row as it is after the renewal (no row: nobody holds
/// the lease).
pub(crate) fn renewed_lease(fence: &Fence, row: Option<(String, u64, u64)>) -> LeaseState {
    match row {
        Some(row) => lease_state(&fence.card, &fence.holder, row, Some(fence.number)),
        None => LeaseState::Other { holder: String::new(), number: 0, expires_at: 0 },
    }
}

pub(crate) use xagent_storage_sqlite::{to_i64, to_u64};
