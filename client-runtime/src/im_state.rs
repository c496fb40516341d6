//! The IM state of one client, kept by the data plane's shared state (`crate::connection`):
//! the outbox of assistant messages and the receiver idempotency set, loaded from the store and
//! written back through it ([`ImState::flush`], one batch per state change, submitted under
//! the IM lock so batches reach the store in the order of the changes), renamed with a channel
//! the Connector re-keys; the holder lease it writes under; the delta sequence of messages
//! being streamed and the uploads of this client. What is done with it (delivery, inbound
//! messages) is `crate::im`, above.

use std::collections::HashMap;
use std::sync::Arc;

use xagent_profile_im::{
    DeferredStore, DeltaAssembler, DeltaConfig, IdempotencyConfig, IdempotencyWrite, Outbox,
    OutboxConfig, ReceiverIdempotency, WriteMode,
};
use xagent_protocol_types::{ConnectorChannelId, Side};

use crate::ClientError;
use crate::store::{CommitError, CommitTicket, Fence, XagentStore, XagentWrite, ready};
use crate::uploads::UploadLedger;

/// Under which lease this process writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holding {
    /// No holder lease is configured: this process is the only writer.
    Unfenced,
    /// This process holds the lease: every batch carries its fence.
    Held(Fence),
    /// This process waits for the lease (or lost it): it writes, delivers and acknowledges
    /// nothing.
    Standby,
}

impl Holding {
    /// The fence to write under, `Err` when this process may not write.
    fn fence(&self) -> Result<Option<Fence>, CommitError> {
        match self {
            Self::Unfenced => Ok(None),
            Self::Held(fence) => Ok(Some(fence.clone())),
            Self::Standby => Err(CommitError::NotHolder),
        }
    }
}

/// IM state of one client. Outbox and idempotency entries are keyed by the channel's id; a
/// channel the Connector re-keys on reopen is renamed with them, in the store and here, so it
/// keeps its pending messages across a restart too.
pub(crate) struct ImState {
    /// The outbox, in [`WriteMode::Deferred`]: its writes are taken by [`ImState::flush`].
    pub(crate) outbox: Outbox<DeferredStore>,
    /// The receiver set, driven without a store: misses are looked up by the caller and
    /// completions come back as writes.
    pub(crate) receiver: ReceiverIdempotency<DeferredStore>,
    store: Arc<dyn XagentStore>,
    /// The lease this process writes under.
    pub(crate) holding: Holding,
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
    /// Loads the outbox from the store (what a previous process, or the previous holder of
    /// the lease, left) and opens an empty idempotency set over it (the store answers misses).
    pub(crate) async fn load(
        store: Arc<dyn XagentStore>,
        holding: Holding,
        now: u64,
    ) -> Result<Self, ClientError> {
        let records = store.load_pending().await.map_err(ClientError::Store)?;
        let mut state = Self::with_records(store, holding, records, now)?;
        // What opening found unreadable or expired is deleted in the store too (by the
        // holder: a process standing by loads again when it takes the lease).
        if state.outbox.has_writes() && state.may_act() {
            let ticket = state.flush(Vec::new());
            if let Err(error) = ticket.await {
                tracing::warn!(%error, "the outbox's cleanup at open could not be stored");
            }
        }
        Ok(state)
    }

    fn with_records(
        store: Arc<dyn XagentStore>,
        holding: Holding,
        records: Vec<xagent_profile_im::PendingRecord>,
        now: u64,
    ) -> Result<Self, ClientError> {
        let mut config = OutboxConfig::new(Side::Xagent);
        config.write_mode = WriteMode::Deferred;
        let outbox = Outbox::open(config, DeferredStore::with_pending(records), now)?;
        let receiver = ReceiverIdempotency::deferred(IdempotencyConfig::default());
        Ok(Self {
            outbox,
            receiver,
            store,
            holding,
            aliases: HashMap::new(),
            deltas: DeltaAssembler::new(DeltaConfig::default()),
            uploads: UploadLedger::default(),
        })
    }

    /// True when this process may deliver and acknowledge (it holds the lease, or none is
    /// configured).
    pub(crate) fn may_act(&self) -> bool {
        self.holding != Holding::Standby
    }

    /// Submits `writes` under this process's lease (refused at once while standing by).
    pub(crate) fn submit(&self, writes: Vec<XagentWrite>) -> CommitTicket {
        match self.holding.fence() {
            Ok(fence) => self.store.commit(fence, writes),
            Err(error) => ready(Err(error)),
        }
    }

    /// Submits the outbox's collected writes, then `extra`, as one batch. Call it under the IM
    /// lock, right after the change that produced the writes, and await the ticket after
    /// releasing the lock.
    pub(crate) fn flush(&mut self, extra: Vec<XagentWrite>) -> CommitTicket {
        let mut writes: Vec<XagentWrite> =
            self.outbox.take_writes().into_iter().map(XagentWrite::Outbox).collect();
        writes.extend(extra);
        if writes.is_empty() {
            return ready(Ok(()));
        }
        self.submit(writes)
    }

    /// The receiver's writes as store writes.
    pub(crate) fn idempotency(writes: Vec<IdempotencyWrite>) -> Vec<XagentWrite> {
        writes.into_iter().map(XagentWrite::Idempotency).collect()
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

    pub(crate) fn on_disconnect(&mut self, now: u64) -> CommitTicket {
        if let Err(error) = self.outbox.on_disconnect(now) {
            tracing::warn!(error = %error, "outbox could not record the disconnect");
        }
        self.flush(Vec::new())
    }

    /// The Connector answered hello with a new `connector_id`: its runtime instance was rebuilt
    /// and every channel of the old one unregistered with it (architecture 3.4), so what this
    /// client kept for `channels` as delivery state ends here: the outbox's pending messages
    /// (discarded, never sent to the new instance), the receiver's completed ids (a message
    /// id the new instance uses again is a new message), the streams in progress, and the
    /// record of this client's uploads (the new instance knows none of those `file_ref`s; kept
    /// in memory only, it goes at once). Submitted as one batch with `extra` (the new
    /// `connector_id`): a restart finds either the old state and the old id or neither. Call
    /// it under the IM lock.
    pub(crate) fn on_instance_replaced(
        &mut self,
        channels: &[ConnectorChannelId],
        extra: Vec<XagentWrite>,
    ) -> CommitTicket {
        self.uploads.clear();
        let mut writes = Vec::with_capacity(channels.len() + extra.len());
        for channel in channels {
            let stored = self.persisted(channel);
            if let Err(error) = self.outbox.remove_channel(&stored) {
                tracing::warn!(channel = %stored, %error, "outbox could not drop a replaced instance's messages");
            }
            self.receiver.forget_channel(&stored);
            self.deltas.remove_channel(&stored);
            writes.push(XagentWrite::Idempotency(IdempotencyWrite::Trim {
                channel: stored,
                keep: 0,
            }));
        }
        writes.extend(extra);
        self.flush(writes)
    }

    /// A remembered channel open as `previous` came back as `current` (the Connector re-keyed
    /// it): renamed durably ([`ImState::rename_channel`]); when the store refuses, it keeps
    /// working in this process under its stored id (an alias). The caller holds the IM lock
    /// across this call, so no other write falls between the rename and the change in memory.
    pub(crate) async fn on_channel_rekeyed(
        &mut self,
        previous: &ConnectorChannelId,
        current: &ConnectorChannelId,
    ) {
        let stored = self.aliases.remove(previous).unwrap_or_else(|| previous.clone());
        if let Err(error) = self.rename_channel(&stored, current).await {
            tracing::warn!(from = %stored, to = %current, %error, "a re-keyed channel could not be renamed in the store; it keeps its old id there, so a restart reopens the old id");
            self.aliases.insert(current.clone(), stored);
        }
    }

    /// A remembered channel is open again (as `channel`, already renamed if it was re-keyed):
    /// its outbox resumes.
    pub(crate) fn on_channel_reopened(
        &mut self,
        channel: &ConnectorChannelId,
        now: u64,
    ) -> CommitTicket {
        let key = self.persisted(channel);
        if let Err(error) = self.outbox.on_channel_reopened(&key, now) {
            tracing::warn!(error = %error, "outbox could not reopen a channel");
        }
        self.flush(Vec::new())
    }

    /// Renames a re-keyed channel everywhere it is kept: the store (channel, outbox and
    /// idempotency entries in one transaction, after every write submitted before), then the
    /// outbox and the idempotency set in memory.
    async fn rename_channel(
        &mut self,
        from: &ConnectorChannelId,
        to: &ConnectorChannelId,
    ) -> Result<(), ClientError> {
        if from == to {
            return Ok(());
        }
        // The outbox's own writes go first, in their own batch: a refused rename must not
        // take them down with it.
        let earlier = self.flush(Vec::new());
        let rename =
            self.submit(vec![XagentWrite::RenameChannel { from: from.clone(), to: to.clone() }]);
        if let Err(error) = earlier.await {
            tracing::warn!(%error, "outbox writes before a rename were not stored");
        }
        rename.await?;
        self.receiver.on_channel_renamed(from, to);
        // The store took the rename, which it refuses when `to` has messages: the in-memory
        // queue cannot be taken either.
        self.outbox.on_channel_renamed(from, to).map_err(ClientError::from)
    }
}
