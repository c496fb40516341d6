//! The inbox as MCP resources (each channel's messages, each inbound file, a pending QR
//! sign-in) and the link's notices forwarded to a session.

use std::sync::Arc;

use base64::Engine;
use rmcp::model::{Resource, ResourceContents, ResourceUpdatedNotificationParam};
use rmcp::service::Peer;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::{CHANNEL_RESOURCE_MESSAGES, McpBridge};
use crate::files::FILE_URI_PREFIX;
use crate::link::Notice;
use crate::uris::{SIGN_IN_URI, channel_uri};

impl McpBridge {
    pub(super) async fn resources(&self) -> Vec<Resource> {
        let mut resources = Vec::new();
        if let Some(channel) = self.link.channel_id() {
            resources.push(
                Resource::new(channel_uri(channel.as_str()), format!("messages-{channel}"))
                    .with_title("Inbound messages of the channel")
                    .with_description("The latest inbound chat messages of this channel (JSON); subscribe to hear of new ones.")
                    .with_mime_type("application/json"),
            );
        }
        if self.link.sign_in().qr_code_text.is_some() {
            resources.push(
                Resource::new(SIGN_IN_URI, "sign-in")
                    .with_title("Sign in to the target system")
                    .with_description(
                        "Show this link (or the QR image) to the user to finish signing in.",
                    )
                    .with_mime_type("text/markdown"),
            );
        }
        if let Ok(files) = self.link.inbox().files(200).await {
            for file in files {
                resources.push(
                    Resource::new(format!("{FILE_URI_PREFIX}{}", file.id), file.filename.clone())
                        .with_description("A file that arrived in a chat message")
                        .with_mime_type(file.mime_type.clone())
                        .with_size(file.byte_size),
                );
            }
        }
        resources
    }

    pub(super) async fn read(&self, uri: &str) -> Result<Vec<ResourceContents>, McpError> {
        let not_found = || McpError::resource_not_found(format!("no resource {uri}"), None);
        if uri.starts_with(crate::uris::CHANNEL_URI_PREFIX) {
            let channel = crate::uris::channel_of(uri).ok_or_else(not_found)?;
            if self.link.channel_id().is_none_or(|c| c.as_str() != channel) {
                return Err(not_found());
            }
            let messages = self
                .link
                .inbox()
                .recent(channel, CHANNEL_RESOURCE_MESSAGES)
                .await
                .map_err(|e| McpError::internal_error(e.to_string(), None))?;
            let body = json!({
                "connector_channel_id": channel,
                "messages": messages.iter().map(message_json).collect::<Vec<_>>(),
            });
            return Ok(vec![
                ResourceContents::text(body.to_string(), uri).with_mime_type("application/json"),
            ]);
        }
        if let Some(id) = uri.strip_prefix(FILE_URI_PREFIX) {
            let inbox = self.link.inbox();
            let file = inbox.file(id).await.ok().flatten().ok_or_else(not_found)?;
            let bytes = inbox.read_file(&file.id).await.ok().flatten().ok_or_else(not_found)?;
            let blob = base64::engine::general_purpose::STANDARD.encode(bytes);
            return Ok(vec![ResourceContents::blob(blob, uri).with_mime_type(file.mime_type)]);
        }
        if uri == SIGN_IN_URI {
            let sign_in = self.link.sign_in();
            let Some(link) = sign_in.qr_code_text else { return Err(not_found()) };
            let mut contents = vec![
                ResourceContents::text(
                    format!(
                        "Open this link (or scan the QR code) to sign in: {link}\n\nStatus: {}\n{}",
                        sign_in.status.map(|s| s.to_string()).unwrap_or_default(),
                        sign_in.message.unwrap_or_default()
                    ),
                    uri,
                )
                .with_mime_type("text/markdown"),
            ];
            if let Some(png) = sign_in
                .qr_code_image
                .as_deref()
                .and_then(|i| i.strip_prefix("data:image/png;base64,"))
            {
                contents
                    .push(ResourceContents::blob(png.to_owned(), uri).with_mime_type("image/png"));
            }
            return Ok(contents);
        }
        Err(not_found())
    }

    /// Forwards the link's notices to a peer (sessions that use `initialize`).
    pub(super) fn forward_notices(&self, peer: Peer<RoleServer>) {
        let mut notices = self.link.notices();
        let subscriptions = Arc::clone(&self.subscriptions);
        tokio::spawn(async move {
            loop {
                let notice = match notices.recv().await {
                    Ok(notice) => notice,
                    Err(broadcast::error::RecvError::Lagged(_)) => Notice::ToolsChanged,
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let sent = match notice {
                    Notice::ToolsChanged => peer.notify_tool_list_changed().await,
                    Notice::ResourcesChanged => peer.notify_resource_list_changed().await,
                    Notice::PromptsChanged => peer.notify_prompt_list_changed().await,
                    Notice::ResourceUpdated(uri) => {
                        let subscribed = subscriptions
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .contains(&uri);
                        if !subscribed {
                            continue;
                        }
                        peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                            .await
                    }
                };
                if sent.is_err() {
                    tracing::debug!("the MCP client is gone; stop forwarding notifications");
                    return;
                }
            }
        });
    }
}

/// A stored message as the agent reads it.
pub(super) fn message_json(message: &crate::inbox::StoredMessage) -> Value {
    let files: Vec<Value> = message
        .files
        .iter()
        .map(|f| {
            json!({
                "uri": format!("{FILE_URI_PREFIX}{}", f.id),
                "filename": f.filename,
                "mime_type": f.mime_type,
                "byte_size": f.byte_size,
            })
        })
        .collect();
    json!({
        "seq": message.seq,
        "connector_channel_id": message.channel,
        "message_id": message.message_id,
        "text": message.text,
        "files": files,
        "created_at": message.created_at,
        "received_at": message.received_at,
    })
}
