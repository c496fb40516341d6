//! The state one data plane shares between its handle, its reader, writer and driver.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::{Mutex, mpsc, watch};
use xagent_connection::{Admission, Outbound, Requests};
use xagent_protocol_types::{ConnectorChannelId, Packet};

use super::{ClientConfig, ClientEvent, ConnectionState};
use crate::ClientError;
use crate::directory::ChannelDirectory;
use crate::im_state::ImState;

/// What an answer hands to the request's waiter.
pub(crate) type Answer = Result<Packet, ClientError>;

pub(crate) struct Shared {
    pub(crate) config: ClientConfig,
    /// The current connection's outbound handle (write queue, session, clock).
    pub(crate) link: StdMutex<Option<Outbound>>,
    /// The one request/ack correlation.
    pub(crate) pending: Requests<Answer>,
    /// The one home of the admitted Card, the announced Profiles and the window, read at
    /// every connect and by the packet rules in both directions.
    pub(crate) admission: Arc<Admission>,
    /// Where remembered channels and the `connector_id` live: the configured store, else one
    /// in memory.
    pub(crate) store: Arc<dyn crate::store::XagentStore>,
    /// Remembered channels: the id the application remembered it by -> the id currently open.
    pub(crate) channels: StdMutex<BTreeMap<ConnectorChannelId, ConnectorChannelId>>,
    pub(crate) directory: StdMutex<ChannelDirectory>,
    pub(crate) state: watch::Sender<ConnectionState>,
    pub(crate) events: mpsc::Sender<ClientEvent>,
    pub(crate) im: Mutex<ImState>,
    pub(crate) files: StdMutex<Option<Arc<dyn crate::FileSource>>>,
    pub(crate) sink: StdMutex<Option<Arc<dyn crate::FileSink>>>,
    /// The HTTP client of the control and transfer planes, made once per data plane (on first
    /// use) and shared by every download and upload: a `reqwest::Client` holds a connection
    /// pool, so one per file would open a new connection each time.
    pub(crate) control: std::sync::OnceLock<crate::ControlPlane>,
    /// Inbound messages downloading their files now (the policy's `max_concurrent`): memory
    /// for downloads stays within that many files of the size limit.
    pub(crate) downloading: Arc<tokio::sync::Semaphore>,
    /// Inbound messages with files downloading or waiting to (past that: `channel_busy`).
    pub(crate) waiting: Arc<tokio::sync::Semaphore>,
    /// Acks that ended an assistant message's delivery, for [`crate::DataPlane::settled_ack`].
    pub(crate) settled: crate::settled::SettledAcks,
    /// Woken when the store refused a batch for a stale fence: the lease keeper closes the data
    /// plane at once instead of waiting for its next renewal.
    pub(crate) fenced: tokio::sync::Notify,
}

pub(crate) fn lock<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn now(&self) -> u64 {
        self.config.clock.now_millis()
    }

    /// The control and transfer planes of this Connector (one client per data plane).
    pub(crate) fn control(&self) -> crate::ControlPlane {
        self.control
            .get_or_init(|| {
                crate::ControlPlane::new(self.config.base_url.clone(), self.config.api_key.clone())
                    .with_tls(&self.config.tls)
                    .with_download_policy(&self.config.download)
            })
            .clone()
    }

    /// Replaces the admitted Card everywhere it is judged: the admission (packet rules, the
    /// next hello and its ack's checks) and the directory (Descriptor rules).
    pub(crate) fn set_card(&self, card: xagent_protocol_types::ConnectorCard) {
        self.admission.set_card(card.clone());
        match self.admission.facts() {
            Some(facts) => lock(&self.directory).set_admitted(card, facts),
            None => lock(&self.directory).set_card(card),
        }
    }

    /// Logs a batch that was not committed (`what` it recorded); a fenced one tells the lease
    /// keeper this process lost the lease.
    pub(crate) fn commit_failed(&self, what: &str, error: &crate::store::CommitError) {
        if error.is_fenced() {
            tracing::warn!(%error, "{what} was refused: this process no longer holds the lease");
            self.fenced.notify_one();
        } else {
            tracing::warn!(%error, "{what} could not be stored");
        }
    }

    /// Waits for a batch in the background, logging it if it fails (for writes nothing
    /// waits on: a delivered message's deletion, a disconnect's bookkeeping).
    pub(crate) fn watch_commit(
        self: &Arc<Self>,
        what: &'static str,
        ticket: crate::store::CommitTicket,
    ) {
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(error) = ticket.await {
                shared.commit_failed(what, &error);
            }
        });
    }

    pub(crate) fn link(&self) -> Option<Outbound> {
        lock(&self.link).clone()
    }

    pub(crate) fn set_state(&self, state: ConnectionState) {
        self.state.send_replace(state.clone());
        // State changes are advisory: never block the driver on a slow reader.
        let _ = self.events.try_send(ClientEvent::State(state));
    }
}

pub(crate) fn fail_pending(shared: &Shared) {
    // Dropping the senders wakes every waiter with NotConnected.
    shared.pending.fail_all();
}

pub(crate) async fn emit(shared: &Shared, event: ClientEvent) {
    let _ = shared.events.send(event).await;
}
