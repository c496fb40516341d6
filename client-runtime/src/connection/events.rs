//! What the application observes: the connection state and the event stream.

use std::time::Duration;

use tokio::sync::mpsc;
use xagent_protocol_types::{
    ChatMessageAck, ConnectionDescriptor, ConnectorChannelId, ConnectorId, MessagePush,
    ToolProgressPush, WireError,
};

use super::InboundMessage;

/// The connection's state, observable through [`crate::DataPlane::state`]. Every state but
/// `Stopped` is followed by another attempt: the client never gives up by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionState {
    /// Connecting (first attempt, or again after a connection that had been online ended).
    Connecting {
        /// Failed attempts in a row so far.
        failures: u32,
    },
    /// Hello completed; remembered channels are open or reopening.
    Online {
        /// The runtime id the Connector issued.
        connector_id: ConnectorId,
    },
    /// One or a few attempts in a row failed; retrying.
    Degraded {
        /// Failed attempts in a row.
        failures: u32,
        /// The last failure.
        reason: String,
    },
    /// Many attempts in a row failed (at least [`crate::Backoff::max_failures`]); still retrying at
    /// the capped delay.
    Offline {
        /// Failed attempts in a row.
        failures: u32,
        /// The last failure.
        reason: String,
    },
    /// The Connector refused the system API key (401/403); still retrying at the capped
    /// delay, since the key may be fixed on the Connector's side.
    AuthFailed {
        /// The refusal.
        reason: String,
    },
    /// The Connector answered hello with another `connector_id`: its runtime state was
    /// rebuilt; the remembered channels are being reopened, then the state becomes `Online`.
    Replaced {
        /// The earlier id.
        previous: ConnectorId,
        /// The new id.
        current: ConnectorId,
    },
    /// This process does not hold the Card's holder lease: another process (`holder`, when
    /// known) has the data plane; this one waits to take over.
    Standby {
        /// The holder named in the lease row.
        holder: Option<String>,
    },
    /// Closed by the application.
    Stopped {
        /// Why.
        reason: String,
    },
}

impl ConnectionState {
    /// The state's name: `connecting`, `online`, `degraded`, `offline`, `auth_failed`,
    /// `replaced`, `standby` or `stopped`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Connecting { .. } => "connecting",
            Self::Online { .. } => "online",
            Self::Degraded { .. } => "degraded",
            Self::Offline { .. } => "offline",
            Self::AuthFailed { .. } => "auth_failed",
            Self::Replaced { .. } => "replaced",
            Self::Standby { .. } => "standby",
            Self::Stopped { .. } => "stopped",
        }
    }
}

/// What the Connector did, in order.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientEvent {
    /// Hello completed on a new socket.
    Connected {
        /// The runtime id.
        connector_id: ConnectorId,
    },
    /// The connection state changed.
    State(ConnectionState),
    /// The Connector returned a different `connector_id` than before: its runtime state was
    /// rebuilt, and this client replaced its view of it (pending requests failed; the old
    /// instance's Descriptors, pending assistant messages, completed message ids and streams
    /// dropped, in memory and in the store; the remembered channels reopened).
    ConnectorReplaced {
        /// The earlier id.
        previous: ConnectorId,
        /// The new id.
        current: ConnectorId,
    },
    /// The socket closed; a reconnect follows.
    Disconnected {
        /// Why.
        reason: String,
    },
    /// A remembered channel was reopened after a reconnect, possibly under a new id.
    ChannelReopened {
        /// The id that was remembered.
        previous: ConnectorChannelId,
        /// The id the Connector returned.
        current: ConnectorChannelId,
        /// Its Descriptor.
        descriptor: Box<ConnectionDescriptor>,
    },
    /// A remembered channel could not be reopened.
    ChannelReopenFailed {
        /// The channel.
        channel: ConnectorChannelId,
        /// Why.
        error: String,
    },
    /// `connection.descriptor.push` that passed the Descriptor rules (it is already applied
    /// to the channel directory).
    DescriptorPushed {
        /// The channel.
        channel: ConnectorChannelId,
        /// The new Descriptor.
        descriptor: Box<ConnectionDescriptor>,
    },
    /// An IM v2 user message that passed the inbound rules and was not seen before on this
    /// channel. Answer it with [`InboundMessage::accept`] once its effect is done, or reject it.
    ChatMessage(InboundMessage),
    /// An ack for an assistant message this client sent (already applied to the outbox).
    ChatMessageAcked {
        /// The channel.
        channel: ConnectorChannelId,
        /// The ack.
        ack: ChatMessageAck,
    },
    /// `message.push` (IM v1).
    MessagePush {
        /// The channel.
        channel: Option<ConnectorChannelId>,
        /// The payload.
        message: Box<MessagePush>,
    },
    /// `tool.progress.push`.
    ToolProgress {
        /// The channel.
        channel: Option<ConnectorChannelId>,
        /// The payload.
        progress: ToolProgressPush,
    },
    /// An `error` packet not tied to a pending request.
    Error(WireError),
    /// The client was closed.
    Stopped {
        /// Why.
        reason: String,
    },
}

/// The application's end of the bounded event channel.
pub type Events = mpsc::Receiver<ClientEvent>;

/// Reads events until one satisfies `want`, skipping the others; `None` when `within` passes
/// first or the client stopped. For callers that wait for one kind of event (a reconnect, an
/// ack) on the stream [`crate::DataPlane::connect`] returns.
pub async fn next_event_matching(
    events: &mut Events,
    within: Duration,
    mut want: impl FnMut(&ClientEvent) -> bool,
) -> Option<ClientEvent> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Some(event)) if want(&event) => return Some(event),
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => return None,
        }
    }
}
