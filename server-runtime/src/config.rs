//! [`RuntimeConfig`]: every tunable of the runtime with its documented default.

use std::time::Duration;

use xagent_protocol_validate::AdmissionWindow;

/// Tunables of the runtime. Every default is documented and can be changed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RuntimeConfig {
    /// Offline lease of a `connector_id` after its last authenticated socket closed
    /// (default one hour).
    pub lease: Duration,
    /// Largest accepted data-plane text frame (default 1 MiB); larger closes with 1009.
    pub max_packet_bytes: usize,
    /// Outgoing packets buffered per socket before producers wait (default 256). When a peer
    /// stops reading, the socket buffers fill, then this queue; from then on every producer
    /// waits for space: author calls such as [`crate::ConnectorHandle::push_descriptor`] do not
    /// return, and the connection's reader stops reading the peer as soon as it needs to
    /// answer. Nothing is dropped and the socket is not closed; all of it resumes when the peer
    /// reads again (`tests/backpressure.rs`). The IM outbox never waits on a socket: a
    /// message for a peer whose queue is full stays pending (no attempt counted, no backoff)
    /// and goes out as soon as the queue has room, while other sockets' channels keep flowing.
    pub write_queue: usize,
    /// IM messages per channel the outbox keeps in flight to xAgent at once, sent in order on
    /// the channel's socket without waiting for each one's `chat.message.ack` (default 16;
    /// 1 waits for every ack before the next message). Above 1, a message whose transmission
    /// fails is redelivered after later ones already in flight (see `docs/DECISIONS.md`).
    pub outbox_window: usize,
    /// How long a `tool.invoke` result is kept for repeated calls (default: the protocol-wide
    /// repeated-call window, `REPEATED_CALL_WINDOW_MS`, 24 hours).
    pub tool_call_window: Duration,
    /// How long an auth session is kept (default 30 minutes).
    pub auth_session_ttl: Duration,
    /// How often the background maintenance runs [`crate::ConnectorServer::tick`] (default 30 s).
    pub maintenance_interval: Duration,
    /// Path prefix of the Base URL (e.g. `/connectors/echo`; default none): the routes are
    /// served under it and the download URLs carry it.
    pub base_path: String,
    /// The path prefix clients see in front of the runtime's URLs when a reverse proxy strips
    /// it before forwarding (`https://host/connectors/webchat/` served at the Connector's root):
    /// download URLs carry it, the routes do not. Default none (then [`Self::base_path`]).
    pub public_path: Option<String>,
    /// Versions admitted in `connector.hello` (default `[3.0, 3.0]`, same-major rule).
    pub admission: AdmissionWindow,
    /// How long in-flight work may take to finish on shutdown (default 10 s). A connection
    /// whose peer stopped reading cannot write its last acks; [`crate::ConnectorServer::serve`]
    /// returns after this grace period anyway.
    pub shutdown_grace: Duration,
    /// Limits of the HTTP listener [`crate::ConnectorServer::serve`] runs: header-read and idle
    /// timeouts, the connection cap (defaults 10 s, 60 s, 1,024), the per-address caps and
    /// rates, the data plane's reserved slots and the trusted proxies ([`crate::ops::ServeLimits`]).
    pub listener: crate::listen::ServeLimits,
    /// Channels one data-plane socket may have open (default 4,096); `channel.open` beyond it
    /// is refused with `capacity_exceeded`.
    pub max_channels_per_socket: usize,
    /// Channels the Connector keeps registered in total (default 16,384); a `channel.open`
    /// creating one more is refused with `capacity_exceeded`.
    pub max_channels: usize,
    /// Requests of one socket whose work runs at once (`tool.invoke`, `auth.*`; default 64).
    /// At the limit the connection stops reading the peer until one finishes, so a peer that
    /// floods requests without reading answers cannot grow the Connector's memory.
    pub max_in_flight_requests: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(3600),
            max_packet_bytes: 1024 * 1024,
            write_queue: 256,
            tool_call_window: Duration::from_millis(xagent_protocol_types::REPEATED_CALL_WINDOW_MS),
            auth_session_ttl: Duration::from_secs(30 * 60),
            maintenance_interval: Duration::from_secs(30),
            base_path: String::new(),
            public_path: None,
            admission: AdmissionWindow::default(),
            shutdown_grace: Duration::from_secs(10),
            listener: crate::listen::ServeLimits::default(),
            max_channels_per_socket: 4_096,
            max_channels: 16_384,
            max_in_flight_requests: 64,
            outbox_window: 16,
        }
    }
}

impl RuntimeConfig {
    /// Sets the Base URL path prefix (e.g. `/connectors/echo`).
    #[must_use]
    pub fn with_base_path(mut self, base_path: impl Into<String>) -> Self {
        self.base_path = base_path.into();
        self
    }

    /// Sets the path prefix a path-stripping reverse proxy puts in front of every URL
    /// ([`Self::public_path`]).
    #[must_use]
    pub fn with_public_path(mut self, public_path: impl Into<String>) -> Self {
        self.public_path = Some(public_path.into());
        self
    }

    /// The path in front of the URLs the runtime hands out (download URLs): the public path a
    /// proxy adds, followed by the Base URL path the runtime serves under.
    pub fn url_path(&self) -> String {
        let public = self.public_path.as_deref().unwrap_or_default().trim_end_matches('/');
        format!("{public}{}", self.base_path.trim_end_matches('/'))
    }

    /// Sets the offline lease.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets how many IM messages per channel may be in flight to xAgent at once (0 is read
    /// as 1).
    #[must_use]
    pub fn with_outbox_window(mut self, messages: usize) -> Self {
        self.outbox_window = messages;
        self
    }

    /// Sets how many outgoing packets a socket buffers before producers wait.
    #[must_use]
    pub fn with_write_queue(mut self, packets: usize) -> Self {
        self.write_queue = packets;
        self
    }

    /// Sets the HTTP listener's limits.
    #[must_use]
    pub fn with_listener(mut self, limits: crate::listen::ServeLimits) -> Self {
        self.listener = limits;
        self
    }

    /// Sets the channel limits (per socket, in total).
    #[must_use]
    pub fn with_channel_limits(mut self, per_socket: usize, total: usize) -> Self {
        self.max_channels_per_socket = per_socket;
        self.max_channels = total;
        self
    }

    /// Sets how many requests of one socket run at once.
    #[must_use]
    pub fn with_max_in_flight_requests(mut self, limit: usize) -> Self {
        self.max_in_flight_requests = limit;
        self
    }

    /// Sets the data-plane packet size limit.
    #[must_use]
    pub fn with_max_packet_bytes(mut self, limit: usize) -> Self {
        self.max_packet_bytes = limit;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::RuntimeConfig;

    #[test]
    fn the_url_path_is_the_proxys_public_path_then_the_base_path() {
        assert_eq!(RuntimeConfig::default().url_path(), "");
        assert_eq!(RuntimeConfig::default().with_base_path("/im/").url_path(), "/im");
        let behind = RuntimeConfig::default().with_public_path("/connectors/webchat/");
        assert_eq!(behind.url_path(), "/connectors/webchat");
        assert_eq!(behind.with_base_path("/im").url_path(), "/connectors/webchat/im");
    }
}
