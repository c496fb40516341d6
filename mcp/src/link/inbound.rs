//! The runtime's events turned into notices, and inbound messages stored in the inbox before
//! they are accepted.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use xagent_client_runtime::prelude::*;

use super::{KEEP_HANDED_MILLIS, Link, MAX_PENDING_MESSAGES, Notice, OWNER, lock};
use crate::files::safe_filename;
use crate::inbox::{NewMessage, StoredFile};
use crate::uris::channel_uri;

impl Link {
    pub(super) async fn run_events(
        self: Arc<Self>,
        mut events: Events,
        inbound: mpsc::Sender<InboundMessage>,
    ) {
        while let Some(event) = events.recv().await {
            match event {
                ClientEvent::DescriptorPushed { channel, descriptor } => {
                    tracing::info!(%channel, status = %descriptor.connection.status, "Descriptor updated");
                    self.tools_maybe_changed();
                }
                ClientEvent::ChannelReopened { previous, current, .. } => {
                    tracing::info!(%previous, %current, "channel reopened");
                    self.tools_maybe_changed();
                }
                ClientEvent::ChatMessage(message) => {
                    // The inbound task is gone only when the link is shutting down.
                    let Ok(()) = inbound.send(message).await else { return };
                }
                ClientEvent::ToolProgress { channel, progress } => {
                    let owned = channel.as_ref().is_some_and(|channel| {
                        self.plane.directory().owner(channel).as_deref() == Some(OWNER)
                    });
                    if !owned {
                        continue;
                    }
                    if let Some(sink) = lock(&self.progress).get(progress.tool_id.as_str()) {
                        let _ = sink.send(progress);
                    }
                }
                ClientEvent::Connected { connector_id } => {
                    tracing::info!(%connector_id, "connected to the Connector");
                }
                ClientEvent::State(state) => {
                    tracing::info!(state = state.as_str(), "connection state");
                    self.tools_maybe_changed();
                }
                ClientEvent::Disconnected { reason } => {
                    tracing::warn!(%reason, "disconnected from the Connector; reconnecting");
                }
                ClientEvent::ChannelReopenFailed { channel, error } => {
                    tracing::warn!(%channel, %error, "the channel did not reopen");
                }
                ClientEvent::Error(error) => {
                    tracing::warn!(code = %error.code, message = ?error.message, "error from the Connector");
                }
                _ => {}
            }
        }
    }

    pub(super) async fn run_inbound(self: Arc<Self>, mut inbound: mpsc::Receiver<InboundMessage>) {
        let mut prune = tokio::time::interval(Duration::from_secs(3600));
        loop {
            tokio::select! {
                message = inbound.recv() => match message {
                    Some(message) => self.on_inbound(message).await,
                    None => return,
                },
                _ = prune.tick() => {
                    let cutoff = now_millis().saturating_sub(KEEP_HANDED_MILLIS);
                    match self.inbox.prune_taken(cutoff).await {
                        Ok(0) => {}
                        Ok(pruned) => tracing::info!(pruned, "forgot messages handed more than 7 days ago"),
                        Err(error) => tracing::warn!(%error, "inbox pruning failed"),
                    }
                }
            }
        }
    }

    /// Stores an inbound message (its files are already saved) and only then accepts it.
    async fn on_inbound(&self, inbound: InboundMessage) {
        // Keyed by the id the runtime persisted (a reopened channel may carry a new one).
        let channel = self.persisted_of(&inbound.channel).await.to_string();
        let message_id = inbound.message.message_id.to_string();
        if self.inbox.pending(None).await.unwrap_or(0) >= MAX_PENDING_MESSAGES {
            inbound.reject(
                ErrorCode::CapacityExceeded,
                "the agent has not taken the messages waiting for it yet",
                true,
            );
            return;
        }
        match self.inbox.contains(&channel, &message_id).await {
            Ok(true) => {
                tracing::debug!(%message_id, "redelivered message already stored");
                inbound.accept();
                return;
            }
            Ok(false) => {}
            Err(error) => {
                tracing::error!(%error, "inbox lookup failed");
                inbound.reject(
                    ErrorCode::ChannelBusy,
                    "the bridge cannot store messages now",
                    true,
                );
                return;
            }
        }
        if inbound.saved_files.len() != inbound.message.files.len() {
            inbound.reject(ErrorCode::ChannelBusy, "the message's files were not saved", true);
            return;
        }
        let mut files: Vec<StoredFile> = Vec::with_capacity(inbound.saved_files.len());
        for (file, id) in inbound.message.files.iter().zip(&inbound.saved_files) {
            let Ok(Some(byte_size)) = self.inbox.saved_size(id).await else {
                inbound.reject(ErrorCode::ChannelBusy, "the message's files were not kept", true);
                return;
            };
            files.push(StoredFile {
                id: id.clone(),
                filename: safe_filename(
                    file.filename.as_deref().unwrap_or_else(|| file.file_ref.as_str()),
                ),
                mime_type: file
                    .mime_type
                    .clone()
                    .unwrap_or_else(|| "application/octet-stream".into()),
                byte_size,
            });
        }
        let stored = self
            .inbox
            .store(&NewMessage {
                channel: &channel,
                message_id: &message_id,
                text: inbound.message.text.as_deref(),
                files: &files,
                created_at: inbound.message.created_at,
                received_at: now_millis(),
            })
            .await;
        match stored {
            Ok(_) => {
                inbound.accept();
                tracing::info!(%message_id, files = files.len(), "inbound message stored");
                self.arrivals.send_modify(|n| *n += 1);
                self.notify(Notice::ResourceUpdated(channel_uri(&channel)));
                if !files.is_empty() {
                    self.notify(Notice::ResourcesChanged);
                }
            }
            Err(error) => {
                tracing::error!(%error, "could not store an inbound message");
                inbound.reject(ErrorCode::ChannelBusy, "the bridge could not store it", true);
            }
        }
    }
}

fn now_millis() -> u64 {
    use xagent_protocol_types::Clock;
    xagent_protocol_types::SystemClock.now_millis()
}
