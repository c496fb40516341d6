//! The state one data plane shares between its handle, its reader, writer and driver.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::{Mutex, mpsc, oneshot, watch};
use xagent_protocol_types::{ConnectorChannelId, Packet, RequestId};
use xagent_protocol_validate::{CardFacts, Session};

use super::{ClientConfig, ClientEvent, ConnectionState};
use crate::ClientError;
use crate::directory::ChannelDirectory;
use crate::im::ImState;

/// What the writer task writes.
pub(super) enum Outgoing {
    /// A packet, judged by the session first; `done` learns whether it was written.
    Packet(Box<Packet>, Option<oneshot::Sender<Result<(), ClientError>>>),
    /// Raw text (conformance probes), written as it is.
    Raw(String),
    /// A close frame; the writer stops after it.
    Close(u16, String),
}

/// The current connection: its write queue and its sequencing session.
#[derive(Clone)]
pub(super) struct Link {
    pub(super) tx: mpsc::Sender<Outgoing>,
    pub(super) session: Arc<StdMutex<Session>>,
}

pub(super) type Waiter = oneshot::Sender<Result<Packet, ClientError>>;

pub(crate) struct Shared {
    pub(crate) config: ClientConfig,
    /// Where remembered channels and the `connector_id` live: the configured store, else one
    /// in memory.
    pub(crate) store: Arc<dyn crate::XagentStore>,
    pub(super) link: StdMutex<Option<Link>>,
    pub(super) pending: StdMutex<HashMap<RequestId, Waiter>>,
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
    pub(super) control: std::sync::OnceLock<crate::ControlPlane>,
    pub(super) validator: xagent_protocol_validate::Validator,
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
            })
            .clone()
    }

    /// The admitted Card's facts the packet rules judge by (the current Card after a refetch):
    /// the directory's copy, so the packet rules and the Descriptor rules share one.
    pub(crate) fn card_facts(&self) -> Option<Arc<CardFacts>> {
        lock(&self.directory).card_facts()
    }

    /// Replaces the admitted Card everywhere it is judged: the packet rules and the directory.
    pub(crate) fn set_card(&self, card: xagent_protocol_types::ConnectorCard) {
        lock(&self.directory).set_card(card);
    }

    pub(super) fn link(&self) -> Option<Link> {
        lock(&self.link).clone()
    }

    pub(crate) fn set_state(&self, state: ConnectionState) {
        self.state.send_replace(state.clone());
        // State changes are advisory: never block the driver on a slow reader.
        let _ = self.events.try_send(ClientEvent::State(state));
    }
}

pub(super) fn fail_pending(shared: &Shared) {
    // Dropping the senders wakes every waiter with NotConnected.
    lock(&shared.pending).clear();
}

pub(crate) async fn emit(shared: &Shared, event: ClientEvent) {
    let _ = shared.events.send(event).await;
}
