//! Starting a data plane: the shared state, the IM pump and the reconnect driver.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::{Mutex, mpsc, watch};
use xagent_connection::{Admission, Requests};

use super::reconnect::supervise;
use crate::connection::{ClientConfig, ConnectionState, Events, Shared};
use crate::directory::ChannelDirectory;
use crate::im_state::{Holding, ImState};
use crate::store::{MemoryXagentStore, RememberedChannel, XagentStore};
use crate::transport::{Transport, WsTransport};
use crate::{ClientError, DataPlane};

impl DataPlane {
    /// Starts connecting over WebSocket in the background and returns the handle and the
    /// bounded event stream. Wait for `online` with [`DataPlane::connected`]. Fails only when
    /// the durable store cannot be read.
    pub async fn connect(config: ClientConfig) -> Result<(Self, Events), ClientError> {
        let transport = WsTransport::new(
            config.base_url.clone(),
            config.api_key.clone(),
            config.max_frame_bytes,
        )
        .with_tls(config.tls.clone());
        Self::connect_with(config, transport).await
    }

    /// Like [`DataPlane::connect`] over any transport (in-memory in tests). Fails only when the
    /// durable store cannot be read. With a holder lease ([`ClientConfig::with_holder_lease`])
    /// the state is loaded again whenever this process takes the lease.
    pub async fn connect_with(
        config: ClientConfig,
        transport: impl Transport,
    ) -> Result<(Self, Events), ClientError> {
        let now = config.clock.now_millis();
        let store: Arc<dyn XagentStore> = match &config.store {
            Some(store) => store.clone(),
            None => Arc::new(MemoryXagentStore::new()),
        };
        let holding = if config.lease.is_some() { Holding::Standby } else { Holding::Unfenced };
        let im = ImState::load(store.clone(), holding, now).await?;
        let remembered = store.load_channels().await.map_err(ClientError::Store)?;
        Ok(Self::assemble(config, store, im, remembered, transport))
    }

    /// The shared state over loaded parts, the IM pump and the driver.
    fn assemble(
        config: ClientConfig,
        store: Arc<dyn XagentStore>,
        im: ImState,
        remembered: Vec<RememberedChannel>,
        transport: impl Transport,
    ) -> (Self, Events) {
        let (events, receiver) = mpsc::channel(config.event_capacity.max(1));
        let (state_sender, state) = watch::channel(ConnectionState::Connecting { failures: 0 });
        let admission = Arc::new(Admission::from_parts(
            config.connector_card_id.clone(),
            config.supported_profiles.clone(),
            config.card.clone(),
            config.window,
        ));
        let mut channels = BTreeMap::new();
        let mut directory = ChannelDirectory::new(None);
        if let (Some(card), Some(facts)) = (config.card.clone(), admission.facts()) {
            directory.set_admitted(card, facts);
        }
        for remembered in remembered {
            channels.insert(remembered.channel.clone(), remembered.channel.clone());
            directory.remember(remembered.channel, remembered.owner);
        }
        let download_slots = config.download.max_concurrent.max(1);
        let shared = Arc::new(Shared {
            im: Mutex::new(im),
            config,
            store,
            link: StdMutex::new(None),
            pending: Requests::new(),
            admission,
            channels: StdMutex::new(channels),
            directory: StdMutex::new(directory),
            state: state_sender,
            events,
            files: StdMutex::new(None),
            sink: StdMutex::new(None),
            control: std::sync::OnceLock::new(),
            downloading: Arc::new(tokio::sync::Semaphore::new(download_slots)),
            waiting: Arc::new(tokio::sync::Semaphore::new(
                download_slots + crate::download::MAX_WAITING_DOWNLOADS,
            )),
            settled: crate::settled::SettledAcks::default(),
            fenced: tokio::sync::Notify::new(),
        });
        let pump = tokio::spawn(crate::im::run_pump(shared.clone()));
        let supervisor = shared.clone();
        let task = tokio::spawn(async move {
            supervise(supervisor, Box::new(transport)).await;
            pump.abort();
        });
        (Self { shared, state, task: Arc::new(task) }, receiver)
    }
}
