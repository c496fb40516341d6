//! The store of a client without a durable one: the rules of [`super::XagentStore`] in memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use xagent_profile_im::{
    CompletedRecord, IdempotencyStore as _, MemoryStore, OutboxStore as _, PendingRecord,
    StoreError,
};
use xagent_protocol_types::{ConnectorChannelId, ConnectorId, MessageId};

use super::{
    AdmissionSnapshot, CommitError, CommitTicket, Fence, LeaseRequest, LeaseState,
    RememberedChannel, XagentStore, XagentWrite, check_rename, ready, renewed_lease, taken_lease,
};

/// The store of a client without durable state: the same rules as the SQLite store, kept in
/// memory (what a restart forgets). Clones share the state, so two runtimes in one process
/// can share one store and its holder lease (tests).
#[derive(Clone, Debug, Default)]
pub struct MemoryXagentStore {
    state: Arc<Mutex<MemoryState>>,
}

#[derive(Debug, Default)]
struct MemoryState {
    channels: Vec<RememberedChannel>,
    connector_id: Option<ConnectorId>,
    admission: Option<AdmissionSnapshot>,
    im: MemoryStore,
    /// Card -> (holder, fencing number, expires at).
    leases: HashMap<String, (String, u64, u64)>,
}

impl MemoryXagentStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, MemoryState> {
        // Every batch is applied whole under the lock (and undone whole when it fails): a
        // poisoned lock leaves the state consistent.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl MemoryState {
    fn fenced(&self, fence: &Fence) -> bool {
        self.leases
            .get(fence.card.as_str())
            .is_none_or(|(holder, number, _)| holder != &fence.holder || *number != fence.number)
    }

    fn apply(&mut self, write: &XagentWrite) -> Result<(), StoreError> {
        match write {
            XagentWrite::SaveChannel { channel, owner } => {
                match self.channels.iter_mut().find(|c| &c.channel == channel) {
                    Some(known) => {
                        if let Some(owner) = owner {
                            known.owner = Some(owner.clone());
                        }
                    }
                    None => self
                        .channels
                        .push(RememberedChannel { channel: channel.clone(), owner: owner.clone() }),
                }
            }
            XagentWrite::DeleteChannel(channel) => self.channels.retain(|c| &c.channel != channel),
            XagentWrite::RenameChannel { from, to } => {
                check_rename(
                    from,
                    to,
                    self.channels.iter().any(|c| &c.channel == from),
                    self.channels.iter().any(|c| &c.channel == to),
                )?;
                // The messages first: a refusal there leaves the channel list untouched.
                self.im.rename_channel(from, to)?;
                if let Some(known) = self.channels.iter_mut().find(|c| &c.channel == from) {
                    known.channel = to.clone();
                }
            }
            XagentWrite::ConnectorId(id) => self.connector_id = Some(id.clone()),
            XagentWrite::Admission(snapshot) => self.admission = Some(snapshot.clone()),
            XagentWrite::Outbox(write) => self.im.apply_outbox(write)?,
            XagentWrite::Idempotency(write) => self.im.apply_idempotency(write)?,
        }
        Ok(())
    }

    /// Everything a failed batch may have changed, to put back.
    fn snapshot(&mut self) -> Result<Snapshot, StoreError> {
        Ok(Snapshot {
            channels: self.channels.clone(),
            connector_id: self.connector_id.clone(),
            admission: self.admission.clone(),
            pending: self.im.load_pending()?,
            completed: self.im.load_completed()?,
        })
    }

    fn restore(&mut self, snapshot: Snapshot) -> Result<(), StoreError> {
        self.channels = snapshot.channels;
        self.connector_id = snapshot.connector_id;
        self.admission = snapshot.admission;
        let im = MemoryStore::new();
        let mut writer = im.clone();
        for record in &snapshot.pending {
            writer.save_pending(record)?;
        }
        for record in &snapshot.completed {
            writer.save_completed(record)?;
        }
        self.im = im;
        Ok(())
    }
}

struct Snapshot {
    channels: Vec<RememberedChannel>,
    connector_id: Option<ConnectorId>,
    admission: Option<AdmissionSnapshot>,
    pending: Vec<PendingRecord>,
    completed: Vec<CompletedRecord>,
}

/// The two `profile-im` writes on its memory store (one call each).
trait ApplyOne {
    fn apply_outbox(&mut self, write: &xagent_profile_im::OutboxWrite) -> Result<(), StoreError>;
    fn apply_idempotency(
        &mut self,
        write: &xagent_profile_im::IdempotencyWrite,
    ) -> Result<(), StoreError>;
}

impl ApplyOne for MemoryStore {
    fn apply_outbox(&mut self, write: &xagent_profile_im::OutboxWrite) -> Result<(), StoreError> {
        xagent_profile_im::OutboxStore::apply(self, std::slice::from_ref(write))
    }

    fn apply_idempotency(
        &mut self,
        write: &xagent_profile_im::IdempotencyWrite,
    ) -> Result<(), StoreError> {
        xagent_profile_im::IdempotencyStore::apply(self, std::slice::from_ref(write))
    }
}

#[async_trait]
impl XagentStore for MemoryXagentStore {
    async fn load_channels(&self) -> Result<Vec<RememberedChannel>, StoreError> {
        Ok(self.state().channels.clone())
    }

    async fn load_connector_id(&self) -> Result<Option<ConnectorId>, StoreError> {
        Ok(self.state().connector_id.clone())
    }

    async fn load_admission(&self) -> Result<Option<AdmissionSnapshot>, StoreError> {
        Ok(self.state().admission.clone())
    }

    async fn load_pending(&self) -> Result<Vec<PendingRecord>, StoreError> {
        self.state().im.load_pending()
    }

    async fn lookup_completed(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError> {
        self.state().im.lookup_completed(channel, message_id)
    }

    /// Applied at once under the lock; a batch with a rename (the only write that can be
    /// refused) is undone whole when any of its writes fails.
    fn commit(&self, fence: Option<Fence>, writes: Vec<XagentWrite>) -> CommitTicket {
        let mut state = self.state();
        if let Some(fence) = &fence
            && state.fenced(fence)
        {
            return ready(Err(CommitError::fenced(fence)));
        }
        let undo = if writes.iter().any(|w| matches!(w, XagentWrite::RenameChannel { .. })) {
            match state.snapshot() {
                Ok(snapshot) => Some(snapshot),
                Err(error) => return ready(Err(error.into())),
            }
        } else {
            None
        };
        for write in &writes {
            if let Err(error) = state.apply(write) {
                if let Some(snapshot) = undo
                    && let Err(undo_error) = state.restore(snapshot)
                {
                    return ready(Err(undo_error.into()));
                }
                return ready(Err(error.into()));
            }
        }
        ready(Ok(()))
    }

    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseState, StoreError> {
        let mut state = self.state();
        let row = state
            .leases
            .entry(request.card.as_str().to_owned())
            .or_insert_with(|| (String::new(), 0, 0));
        let free = row.0.is_empty() || row.2 <= request.now || row.0 == request.holder;
        if free {
            *row = (request.holder.clone(), row.1.saturating_add(1), request.expires_at());
        }
        taken_lease(request, Some(row.clone()))
    }

    async fn renew_lease(
        &self,
        fence: &Fence,
        now: u64,
        ttl_ms: u64,
    ) -> Result<LeaseState, StoreError> {
        let mut state = self.state();
        let row = state.leases.get_mut(fence.card.as_str()).map(|row| {
            if row.0 == fence.holder && row.1 == fence.number {
                row.2 = now.saturating_add(ttl_ms);
            }
            row.clone()
        });
        Ok(renewed_lease(fence, row))
    }

    async fn release_lease(&self, fence: &Fence) -> Result<(), StoreError> {
        if let Some(row) = self.state().leases.get_mut(fence.card.as_str())
            && row.0 == fence.holder
            && row.1 == fence.number
        {
            row.2 = 0;
        }
        Ok(())
    }
}
