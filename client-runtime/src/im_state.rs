//! The IM state of one client, kept by the data plane's shared state (`crate::connection`):
//! the outbox of assistant messages and the receiver idempotency set, over the store (durable,
//! or in memory), renamed with a channel the Connector re-keys; the delta sequence of messages
//! being streamed and the uploads of this client. What is done with it (delivery, inbound
//! messages) is `crate::im`, above.

use std::collections::HashMap;
use std::sync::Arc;

use xagent_profile_im::{
    DeltaAssembler, DeltaConfig, IdempotencyConfig, IdempotencyStore, Outbox, OutboxConfig,
    OutboxStore, ReceiverIdempotency,
};
use xagent_protocol_types::{ConnectorChannelId, Side};

use crate::ClientError;
use crate::store::XagentStore;
use crate::uploads::UploadLedger;

/// IM state of one client. Outbox and idempotency entries are keyed by the channel's id; a
/// channel the Connector re-keys on reopen is renamed with them, in the store and here, so it
/// keeps its pending messages across a restart too.
pub(crate) struct ImState {
    pub(crate) outbox: Outbox<Box<dyn OutboxStore + Send>>,
    pub(crate) receiver: ReceiverIdempotency<Box<dyn IdempotencyStore + Send>>,
    store: Arc<dyn XagentStore>,
    /// current channel id -> stored channel id, only for a re-keyed channel whose rename the
    /// store refused (it keeps working in this process under its stored id).
    pub(crate) aliases: HashMap<ConnectorChannelId, ConnectorChannelId>,
    /// The delta sequence of every assistant message being streamed (by persisted channel),
    /// judged by the assembler the Connector runs: 1, 2, 3, ... until the final.
    pub(crate) deltas: DeltaAssembler,
    /// The `file_ref`s this client uploaded, per channel, until they expire.
    pub(crate) uploads: UploadLedger,
}

impl ImState {
    /// Opens the outbox and the idempotency set over the store (loading what a previous
    /// process left).
    pub(crate) fn open(store: Arc<dyn XagentStore>, now: u64) -> Result<Self, ClientError> {
        let (outbox_store, idempotency_store) = (store.outbox_store(), store.idempotency_store());
        let outbox = Outbox::open(OutboxConfig::new(Side::Xagent), outbox_store, now)
            .map_err(|e| ClientError::Protocol(format!("the outbox could not be loaded: {e}")))?;
        let receiver =
            ReceiverIdempotency::open(IdempotencyConfig::default(), idempotency_store, now)
                .map_err(|e| {
                    ClientError::Protocol(format!("the idempotency set could not be loaded: {e}"))
                })?;
        Ok(Self {
            outbox,
            receiver,
            store,
            aliases: HashMap::new(),
            deltas: DeltaAssembler::new(DeltaConfig::default()),
            uploads: UploadLedger::default(),
        })
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

    /// A remembered channel open as `previous` came back as `current` (the Connector re-keyed
    /// it): renamed durably ([`ImState::rename_channel`]); when the store refuses, it keeps
    /// working in this process under its stored id (an alias).
    pub(crate) fn on_channel_rekeyed(
        &mut self,
        previous: &ConnectorChannelId,
        current: &ConnectorChannelId,
    ) {
        let stored = self.aliases.remove(previous).unwrap_or_else(|| previous.clone());
        if let Err(error) = self.rename_channel(&stored, current) {
            tracing::warn!(from = %stored, to = %current, %error, "a re-keyed channel could not be renamed in the store; it keeps its old id there, so a restart reopens the old id");
            self.aliases.insert(current.clone(), stored);
        }
    }

    /// A remembered channel is open again (as `channel`, already renamed if it was re-keyed):
    /// its outbox resumes.
    pub(crate) fn on_channel_reopened(&mut self, channel: &ConnectorChannelId, now: u64) {
        let key = self.persisted(channel);
        if let Err(error) = self.outbox.on_channel_reopened(&key, now) {
            tracing::warn!(error = %error, "outbox could not reopen a channel");
        }
    }

    /// Renames a re-keyed channel everywhere it is kept: the store (channel, outbox and
    /// idempotency entries in one transaction), then the outbox and the idempotency set in
    /// memory. The caller holds the IM lock, so no outbox write falls between the two.
    fn rename_channel(
        &mut self,
        from: &ConnectorChannelId,
        to: &ConnectorChannelId,
    ) -> Result<(), ClientError> {
        if from == to {
            return Ok(());
        }
        self.store.rename_channel(from, to).map_err(ClientError::Store)?;
        self.receiver.on_channel_renamed(from, to);
        // The store took the rename, which it refuses when `to` has messages: the in-memory
        // queue cannot be taken either.
        self.outbox
            .on_channel_renamed(from, to)
            .map_err(|e| ClientError::Protocol(format!("the outbox could not rename: {e}")))
    }
}
