//! What the IM wiring ([`ImHost`]) and the Transfer Plane (its channel directory) ask of the
//! runtime state, answered here so neither depends on the state.

use std::sync::{Arc, Weak};

use xagent_file_transfer::{ChannelDirectory, FileStore};
use xagent_protocol_types::{ConnectorChannelId, Packet};

use super::Shared;
use crate::author::ChannelContext;
use crate::author::call::ImCode;
use crate::error::HandleError;
use crate::im::{ImHost, ImState, TryQueue};
use crate::storage::Storage;

impl ImHost for Shared {
    fn now(&self) -> u64 {
        Shared::now(self)
    }

    fn packet(&self, packet: Packet) -> Packet {
        Shared::packet(self, packet)
    }

    fn storage(&self) -> &dyn Storage {
        self.storage.as_ref()
    }

    fn files(&self) -> Option<&FileStore> {
        self.files.as_ref()
    }

    fn im(&self) -> Option<&ImState> {
        self.im.as_ref()
    }

    fn im_target(&self) -> Option<&ImCode> {
        self.def.im.as_ref()
    }

    fn max_packet_bytes(&self) -> usize {
        self.config.max_packet_bytes
    }

    fn check_signed_in(&self, channel: &ConnectorChannelId) -> Result<(), HandleError> {
        self.require_signed_in(channel)
    }

    fn is_routed(&self, channel: &ConnectorChannelId) -> bool {
        self.state().route(channel).is_some()
    }

    fn channel_context(self: &Arc<Self>, channel: &ConnectorChannelId) -> Option<ChannelContext> {
        let binding = self.state().channels.get(channel)?.binding.clone()?;
        Some(ChannelContext { channel: channel.clone(), binding, handle: self.handle(), state: () })
    }

    fn try_queue_tracked(&self, channel: &ConnectorChannelId, packet: Packet) -> TryQueue {
        Shared::try_queue_tracked(self, channel, packet)
    }

    fn room_on_route(
        &self,
        channel: &ConnectorChannelId,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let tx = self.state().route(channel).map(|route| route.link.tx.clone());
        async move {
            if let Some(tx) = tx {
                // A permit is room; it is given back at once (the pump queues for real). An
                // error is a closed queue: the socket is gone and the pump pauses the channel.
                let _ = tx.reserve().await.map(drop);
            }
        }
    }

    fn send_on_route(
        &self,
        channel: &ConnectorChannelId,
        packet: Packet,
    ) -> impl std::future::Future<Output = bool> + Send {
        Shared::send_on_route(self, channel, packet)
    }
}

/// The runtime's channel table as `file-transfer` sees it.
struct Directory(Weak<Shared>);

impl ChannelDirectory for Directory {
    async fn channel_exists(&self, channel: &ConnectorChannelId) -> bool {
        self.0.upgrade().is_some_and(|shared| shared.state().channels.contains_key(channel))
    }
}

impl Shared {
    /// The Transfer Plane's routes over this runtime's store and channels (`None` without a
    /// file store).
    pub(crate) fn files_router(self: &Arc<Self>) -> Option<axum::Router> {
        let store = self.files.as_ref()?;
        let directory = Directory(Arc::downgrade(self));
        Some(crate::files::router(store, directory, self.api_key.clone(), self.files_upload_limit))
    }
}
