//! `connector.hello`: register (or reuse) the runtime instance and start serving.

use xagent_protocol_types::{ConnectorHelloAck, Packet, ProfileId, WireError};
use xagent_protocol_validate::Negotiated;

use crate::connection::Conn;
use crate::ids;

impl Conn {
    pub(crate) async fn on_hello(
        &mut self,
        packet: &Packet,
        negotiated: Negotiated,
        requested: Option<xagent_protocol_types::ConnectorId>,
    ) {
        if negotiated.profile_ids().is_empty() {
            let error = WireError::invalid_packet(format!(
                "supported_profiles has no Profile in common with the Card ({}); list at least one",
                self.shared
                    .def
                    .card
                    .supports
                    .profiles
                    .iter()
                    .map(ProfileId::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            self.send(Packet::error(ids::packet_id(), error).answering(packet)).await;
            return;
        }
        // A replica takes the data plane (and reads the shared rows as they are now) before it
        // answers; one that cannot reach its database refuses the hello.
        if let Err(error) = self.shared.take_data_plane().await {
            tracing::warn!(%error, "could not take the data plane; refusing the hello");
            let reason =
                "this replica cannot reach its database; connect again (to another replica)";
            let error = WireError::new(xagent_protocol_types::ErrorCode::InternalError, reason);
            self.send(Packet::error(ids::packet_id(), error).answering(packet)).await;
            let close = crate::state::Outgoing::Close(
                crate::state::CLOSE_TRY_AGAIN_LATER,
                reason.to_owned(),
            );
            let _ = self.tx.send(close).await;
            return;
        }
        let card_id = self.shared.def.card.connector_card_id.clone();
        let result = {
            let mut state = self.shared.state();
            let (id, minted) = match &state.connector_id {
                Some(id) => (id.clone(), false),
                None => (ids::connector_id(card_id.as_str()), true),
            };
            // Submitted under the lock, so a concurrent expiry's clear commits after it.
            let commit = minted.then(|| {
                state.connector_id = Some(id.clone());
                self.shared.storage.commit_connector_id(Some(&id))
            });
            state.live_sockets.insert(self.socket);
            state.offline_since = None;
            (id, commit)
        };
        let (connector_id, commit) = result;
        if let Some(commit) = commit
            && let Err(error) = commit.committed().await
        {
            tracing::error!(%error, "could not persist the connector_id");
        }
        if requested.as_ref().is_some_and(|r| r != &connector_id) {
            tracing::info!(%connector_id, "hello asked for an unknown or expired connector_id; issued the current one");
        }
        tracing::info!(%connector_id, profiles = ?negotiated.profile_ids(), "hello accepted");
        self.negotiated = Some(std::sync::Arc::new(negotiated));
        self.reply(packet, ConnectorHelloAck::new(card_id, connector_id)).await;
    }
}
