//! What must survive a reconnect and a restart: the remembered channels, reopened after every
//! hello (concurrently, within [`REOPEN_CONCURRENCY`]), renamed durably when the Connector
//! re-keys one; and the Connector's `connector_id`, stored so a restarted client tells a
//! rebuilt Connector (reported as `ConnectorReplaced`) from the one it knew.
//!
//! Each channel keeps its own order: nothing channel-scoped leaves before that channel's
//! `channel.open.ack` on the current connection (the session withholds it), and its outbox
//! resumes only once the channel is reopened and, if re-keyed, renamed.

use std::sync::Arc;

use futures_util::StreamExt;
use xagent_protocol_types::{ChannelOpen, ConnectorChannelId, ConnectorId};

use crate::connection::{ClientEvent, ConnectionState, Shared, emit, lock};
use crate::store::XagentWrite;

/// How many remembered channels are reopened at once after a reconnect: enough that a few
/// hundred channels are back within a few round trips, few enough not to flood the Connector.
pub const REOPEN_CONCURRENCY: usize = 64;

/// Reopens every remembered channel, at most [`REOPEN_CONCURRENCY`] at a time, then reports
/// the Connector online (after a `Replaced`) and moves what is due in the outbox.
pub(crate) async fn reopen_channels(shared: Arc<Shared>, connector_id: ConnectorId) {
    let remembered: Vec<(ConnectorChannelId, ConnectorChannelId)> =
        lock(&shared.channels).iter().map(|(a, b)| (a.clone(), b.clone())).collect();
    futures_util::stream::iter(remembered)
        .for_each_concurrent(REOPEN_CONCURRENCY, |(remembered, current)| {
            reopen_channel(&shared, remembered, current)
        })
        .await;
    if matches!(*shared.state.borrow(), ConnectionState::Replaced { .. }) {
        shared.set_state(ConnectionState::Online { connector_id });
    }
    crate::im::pump(&shared).await;
}

/// Reopens one channel (`current` is its id now; `remembered` the id the application
/// remembered it by in this process). A new id in the ack has renamed the channel in the
/// store and in memory ([`on_rekeyed`]) before its outbox moves again.
async fn reopen_channel(
    shared: &Arc<Shared>,
    remembered: ConnectorChannelId,
    current: ConnectorChannelId,
) {
    match crate::connection::request_typed(shared, Some(&current), ChannelOpen::default()).await {
        Ok(ack) => {
            // A new id was already renamed by the reader ([`on_rekeyed`]).
            let new_id = ack.connector_channel_id.clone();
            lock(&shared.channels).insert(remembered, new_id.clone());
            let ticket = shared.im.lock().await.on_channel_reopened(&new_id, shared.now());
            shared.watch_commit("a reopened channel's outbox", ticket);
            emit(
                shared,
                ClientEvent::ChannelReopened {
                    previous: current,
                    current: new_id,
                    descriptor: Box::new(ack.connection_descriptor),
                },
            )
            .await;
            // This channel's backlog moves now, not after the last channel is back.
            crate::im::pump(shared).await;
        }
        Err(error) => {
            emit(
                shared,
                ClientEvent::ChannelReopenFailed { channel: current, error: error.to_string() },
            )
            .await;
        }
    }
}

/// A `channel.open.ack` named `given` for a `channel.open` of `requested`: when `requested` is
/// a remembered channel, it is renamed everywhere (remembered ids, directory, store with its
/// outbox and idempotency entries, IM state). The reader calls this before it reads the next
/// frame, so a message the Connector sends on the new id right after the ack already finds
/// the channel's idempotency entries there.
pub(crate) async fn on_rekeyed(
    shared: &Shared,
    requested: &ConnectorChannelId,
    given: &ConnectorChannelId,
) {
    if requested == given {
        return;
    }
    let remembered = {
        let mut channels = lock(&shared.channels);
        let mut found = false;
        for current in channels.values_mut().filter(|current| *current == requested) {
            *current = given.clone();
            found = true;
        }
        found
    };
    if !remembered {
        return;
    }
    lock(&shared.directory).rename(requested, given);
    shared.im.lock().await.on_channel_rekeyed(requested, given).await;
}

/// The `connector_id` to resume with: the configured one, else the one stored by the last
/// accepted `hello.ack` (an unreadable store is logged and treated as a first hello).
pub(crate) async fn known_connector_id(shared: &Shared) -> Option<ConnectorId> {
    if shared.config.connector_id.is_some() {
        return shared.config.connector_id.clone();
    }
    shared.config.store.as_ref()?;
    shared.store.load_connector_id().await.unwrap_or_else(|error| {
        tracing::warn!(%error, "the stored connector_id could not be read");
        None
    })
}

/// Stores the `connector_id` of an accepted `hello.ack` when it is not the one already known.
/// The Connector answered hello with `current`, not the `connector_id` this client knew: the
/// old runtime instance is gone with its channels. Its state here is replaced at once, under
/// the IM lock and before any channel is reopened: the directory's Descriptors, and the
/// delivery state of every channel this client knows ([`crate::im_state::ImState`]), dropped
/// in the store in one batch with the new `connector_id`. The remembered channels and their
/// owners stay: they are reopened by their ids, as before.
pub(crate) async fn replace_instance(shared: &Arc<Shared>, current: &ConnectorId) {
    let ticket = {
        let mut im = shared.im.lock().await;
        let channels: Vec<ConnectorChannelId> = {
            let remembered = lock(&shared.channels);
            let mut directory = lock(&shared.directory);
            directory.forget_descriptors();
            let known: std::collections::BTreeSet<ConnectorChannelId> = remembered
                .iter()
                .flat_map(|(persisted, open)| [persisted.clone(), open.clone()])
                .chain(directory.entries().iter().map(|e| e.connector_channel_id.clone()))
                .collect();
            known.into_iter().collect()
        };
        im.on_instance_replaced(&channels, vec![XagentWrite::ConnectorId(current.clone())])
    };
    if let Err(error) = ticket.await {
        shared.commit_failed(
            "a replaced Connector instance's state and its new connector_id",
            &error,
        );
    }
}

pub(crate) async fn store_connector_id(
    shared: &Arc<Shared>,
    previous: Option<&ConnectorId>,
    current: &ConnectorId,
) {
    if previous == Some(current) {
        return;
    }
    let ticket = shared.im.lock().await.submit(vec![XagentWrite::ConnectorId(current.clone())]);
    if let Err(error) = ticket.await {
        shared.commit_failed(
            "the connector_id (a restart cannot tell a rebuilt Connector without it)",
            &error,
        );
    }
}
