//! Durable xAgent-side state behind one trait, with an embedded SQLite default: remembered
//! channels and their owners, the `connector_id` of the last hello, the receiver idempotency
//! set of inbound messages and the outbox of assistant messages (the last two through
//! `profile-im`'s store traits). Killing the process loses nothing the runtime took
//! responsibility for and accepts nothing twice, also across a channel the Connector re-keyed:
//! [`XagentStore::rename_channel`] moves the channel with its outbox and idempotency entries
//! in one transaction.

mod memory;
mod sqlite;

pub use memory::MemoryXagentStore;
pub use sqlite::SqliteXagentStore;

use xagent_profile_im::{IdempotencyStore, OutboxStore, StoreError};
use xagent_protocol_types::{ConnectorChannelId, ConnectorId};

/// A channel xAgent remembers across restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RememberedChannel {
    /// The channel id.
    pub channel: ConnectorChannelId,
    /// The xAgent user who owns it.
    pub owner: Option<String>,
}

/// Where xAgent-side state lives.
pub trait XagentStore: Send + Sync + 'static {
    /// Every remembered channel.
    fn load_channels(&self) -> Result<Vec<RememberedChannel>, StoreError>;
    /// Remembers (or updates) a channel.
    fn save_channel(
        &self,
        channel: &ConnectorChannelId,
        owner: Option<&str>,
    ) -> Result<(), StoreError>;
    /// Forgets a channel.
    fn delete_channel(&self, channel: &ConnectorChannelId) -> Result<(), StoreError>;
    /// Renames a remembered channel the Connector re-keyed on reopen: the channel (its owner
    /// kept), its outbox entries and its receiver idempotency entries move to `to`, all or
    /// none. Fails, changing nothing, when `from` is not remembered, or `to` already is or
    /// already has stored messages.
    fn rename_channel(
        &self,
        from: &ConnectorChannelId,
        to: &ConnectorChannelId,
    ) -> Result<(), StoreError>;
    /// The `connector_id` of the last accepted `hello.ack`, if one was stored.
    fn load_connector_id(&self) -> Result<Option<ConnectorId>, StoreError>;
    /// Stores the `connector_id` of an accepted `hello.ack`, so a restarted client can tell a
    /// rebuilt Connector (another id) from the one it knew.
    fn save_connector_id(&self, connector_id: &ConnectorId) -> Result<(), StoreError>;
    /// The outbox's store (shares the backend).
    fn outbox_store(&self) -> Box<dyn OutboxStore + Send>;
    /// The receiver idempotency store (shares the backend).
    fn idempotency_store(&self) -> Box<dyn IdempotencyStore + Send>;
}

/// The rename rule both stores apply: `from` must be remembered and `to` must not be.
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
