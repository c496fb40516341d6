//! The store of a client without a durable one: the rules of [`super::XagentStore`] in memory.

use std::sync::{Arc, Mutex, MutexGuard};

use xagent_profile_im::{IdempotencyStore, MemoryStore, OutboxStore, StoreError};
use xagent_protocol_types::{ConnectorChannelId, ConnectorId};

use super::{RememberedChannel, XagentStore, check_rename};

/// The store of a client without durable state: the same rules as the SQLite store, kept in
/// memory (what a restart forgets). Clones share the state.
#[derive(Clone, Debug, Default)]
pub struct MemoryXagentStore {
    im: MemoryStore,
    state: Arc<Mutex<MemoryState>>,
}

#[derive(Debug, Default)]
struct MemoryState {
    channels: Vec<RememberedChannel>,
    connector_id: Option<ConnectorId>,
}

impl MemoryXagentStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, MemoryState> {
        // Every operation is one change to the lists: a poisoned lock leaves them consistent.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl XagentStore for MemoryXagentStore {
    fn load_channels(&self) -> Result<Vec<RememberedChannel>, StoreError> {
        Ok(self.state().channels.clone())
    }

    fn save_channel(
        &self,
        channel: &ConnectorChannelId,
        owner: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut state = self.state();
        match state.channels.iter_mut().find(|c| &c.channel == channel) {
            Some(known) => {
                if let Some(owner) = owner {
                    known.owner = Some(owner.to_owned());
                }
            }
            None => state.channels.push(RememberedChannel {
                channel: channel.clone(),
                owner: owner.map(str::to_owned),
            }),
        }
        Ok(())
    }

    fn delete_channel(&self, channel: &ConnectorChannelId) -> Result<(), StoreError> {
        self.state().channels.retain(|c| &c.channel != channel);
        Ok(())
    }

    fn rename_channel(
        &self,
        from: &ConnectorChannelId,
        to: &ConnectorChannelId,
    ) -> Result<(), StoreError> {
        let mut state = self.state();
        check_rename(
            from,
            to,
            state.channels.iter().any(|c| &c.channel == from),
            state.channels.iter().any(|c| &c.channel == to),
        )?;
        // The messages first: a refusal there leaves the channel list untouched.
        self.im.rename_channel(from, to)?;
        if let Some(known) = state.channels.iter_mut().find(|c| &c.channel == from) {
            known.channel = to.clone();
        }
        Ok(())
    }

    fn load_connector_id(&self) -> Result<Option<ConnectorId>, StoreError> {
        Ok(self.state().connector_id.clone())
    }

    fn save_connector_id(&self, connector_id: &ConnectorId) -> Result<(), StoreError> {
        self.state().connector_id = Some(connector_id.clone());
        Ok(())
    }

    fn outbox_store(&self) -> Box<dyn OutboxStore + Send> {
        Box::new(self.im.clone())
    }

    fn idempotency_store(&self) -> Box<dyn IdempotencyStore + Send> {
        Box::new(self.im.clone())
    }
}
