//! The IM state of one client, kept by the data plane's shared state (`crate::connection`):
//! the outbox of assistant messages and the receiver idempotency set, over the durable store or
//! memory. What is done with it (delivery, inbound messages) is `crate::im`, above.

use std::collections::HashMap;
use std::sync::Arc;

use xagent_profile_im::{
    IdempotencyConfig, IdempotencyStore, Outbox, OutboxConfig, OutboxStore, ReceiverIdempotency,
};
use xagent_protocol_types::{ConnectorChannelId, Side};

use crate::ClientError;
use crate::store::{XagentStore, memory_stores};

/// IM state of one client. Outbox entries are keyed by the channel id xAgent persisted, so a
/// channel that comes back under a new id keeps its pending messages.
pub(crate) struct ImState {
    pub(crate) outbox: Outbox<Box<dyn OutboxStore + Send>>,
    pub(crate) receiver: ReceiverIdempotency<Box<dyn IdempotencyStore + Send>>,
    /// current channel id -> persisted channel id
    pub(crate) aliases: HashMap<ConnectorChannelId, ConnectorChannelId>,
}

impl ImState {
    /// Opens the outbox and the idempotency set over the durable store (loading what a
    /// previous process left), or over memory.
    pub(crate) fn open(store: Option<Arc<dyn XagentStore>>, now: u64) -> Result<Self, ClientError> {
        let (outbox_store, idempotency_store) = match &store {
            Some(store) => (store.outbox_store(), store.idempotency_store()),
            None => memory_stores(),
        };
        let outbox = Outbox::open(OutboxConfig::new(Side::Xagent), outbox_store, now)
            .map_err(|e| ClientError::Protocol(format!("the outbox could not be loaded: {e}")))?;
        let receiver =
            ReceiverIdempotency::open(IdempotencyConfig::default(), idempotency_store, now)
                .map_err(|e| {
                    ClientError::Protocol(format!("the idempotency set could not be loaded: {e}"))
                })?;
        Ok(Self { outbox, receiver, aliases: HashMap::new() })
    }

    pub(crate) fn persisted(&self, current: &ConnectorChannelId) -> ConnectorChannelId {
        self.aliases.get(current).cloned().unwrap_or_else(|| current.clone())
    }

    pub(crate) fn current(&self, persisted: &ConnectorChannelId) -> ConnectorChannelId {
        self.aliases
            .iter()
            .find(|(_, p)| *p == persisted)
            .map(|(current, _)| current.clone())
            .unwrap_or_else(|| persisted.clone())
    }

    pub(crate) fn on_disconnect(&mut self, now: u64) {
        if let Err(error) = self.outbox.on_disconnect(now) {
            tracing::warn!(error = %error, "outbox could not record the disconnect");
        }
    }

    pub(crate) fn on_channel_reopened(
        &mut self,
        previous: &ConnectorChannelId,
        current: &ConnectorChannelId,
        now: u64,
    ) {
        let persisted = self.aliases.remove(previous).unwrap_or_else(|| previous.clone());
        if current != &persisted {
            self.aliases.insert(current.clone(), persisted.clone());
        }
        if let Err(error) = self.outbox.on_channel_reopened(&persisted, now) {
            tracing::warn!(error = %error, "outbox could not reopen a channel");
        }
    }
}
