//! A raw data-plane connection for black-box checks: send any text, read packets one by one.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use xagent_protocol_types::{Packet, Secret};

use xagent_client_runtime::BaseUrl;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// How a probe upgrade is made.
#[derive(Debug, Clone, Default)]
pub struct ProbeOptions {
    /// Offer the subprotocol.
    pub subprotocol: bool,
    /// Send this API key.
    pub api_key: Option<Secret>,
    /// The certificate authorities trusted for `wss`.
    pub tls: xagent_client_runtime::TlsTrust,
}

/// The outcome of an upgrade attempt.
#[derive(Debug)]
pub enum Upgrade {
    /// The socket is open; the echoed subprotocol, if any.
    Open(Box<Probe>, Option<String>),
    /// The server refused the upgrade with this HTTP status.
    Refused(u16),
    /// The connection failed otherwise.
    Failed(String),
}

/// One raw socket.
#[derive(Debug)]
pub struct Probe {
    socket: Socket,
    /// Every text frame received so far, for failure reports.
    pub transcript: Vec<String>,
}

/// What the next read produced.
#[derive(Debug)]
pub enum Received {
    /// A text frame that decoded as a packet.
    Packet(Box<Packet>, String),
    /// A text frame that is not a valid packet.
    Invalid(String),
    /// The server closed the socket, with a close code if one was sent.
    Closed(Option<u16>),
    /// Nothing arrived in time.
    Silent,
}

impl Probe {
    /// Attempts an upgrade to `/ws`.
    pub async fn connect(base: &BaseUrl, options: &ProbeOptions) -> Upgrade {
        let key = options.api_key.as_ref().map(Secret::expose);
        let mut request = match xagent_connection::upgrade_request(&base.ws_url(), key) {
            Ok(request) => request,
            Err(error) => return Upgrade::Failed(error.to_string()),
        };
        if !options.subprotocol {
            request.headers_mut().remove("Sec-WebSocket-Protocol");
        }
        let connect = tokio_tungstenite::connect_async_tls_with_config(
            request,
            None,
            false,
            options.tls.websocket(),
        );
        match tokio::time::timeout(Duration::from_secs(10), connect).await {
            Err(_) => Upgrade::Failed("the upgrade timed out".into()),
            Ok(Err(tokio_tungstenite::tungstenite::Error::Http(response))) => {
                Upgrade::Refused(response.status().as_u16())
            }
            Ok(Err(error)) => Upgrade::Failed(error.to_string()),
            Ok(Ok((socket, response))) => {
                let echoed = response
                    .headers()
                    .get("Sec-WebSocket-Protocol")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                Upgrade::Open(Box::new(Probe { socket, transcript: Vec::new() }), echoed)
            }
        }
    }

    /// Sends a text frame.
    pub async fn send_text(&mut self, text: impl Into<String>) -> Result<(), String> {
        self.socket.send(Message::Text(text.into().into())).await.map_err(|e| e.to_string())
    }

    /// Sends a packet.
    pub async fn send(&mut self, packet: &Packet) -> Result<(), String> {
        let text = packet.to_json().map_err(|e| e.to_string())?;
        self.send_text(text).await
    }

    /// Sends a binary frame.
    pub async fn send_binary(&mut self, bytes: Vec<u8>) -> Result<(), String> {
        self.socket.send(Message::Binary(bytes.into())).await.map_err(|e| e.to_string())
    }

    /// Reads the next packet (skipping pings/pongs of the WebSocket layer).
    pub async fn next(&mut self, wait: Duration) -> Received {
        loop {
            let frame = match tokio::time::timeout(wait, self.socket.next()).await {
                Err(_) => return Received::Silent,
                Ok(None) => return Received::Closed(None),
                Ok(Some(Err(_))) => return Received::Closed(None),
                Ok(Some(Ok(frame))) => frame,
            };
            match frame {
                Message::Text(text) => {
                    let text = text.as_str().to_owned();
                    self.transcript.push(text.clone());
                    return match Packet::decode_str(&text) {
                        Ok(packet) => Received::Packet(Box::new(packet), text),
                        Err(_) => Received::Invalid(text),
                    };
                }
                Message::Close(frame) => return Received::Closed(frame.map(|f| u16::from(f.code))),
                _ => continue,
            }
        }
    }

    /// Reads packets until one satisfies `want`, skipping others (pushes that may interleave).
    pub async fn next_matching(
        &mut self,
        wait: Duration,
        mut want: impl FnMut(&Packet) -> bool,
    ) -> Received {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Received::Silent;
            }
            match self.next(left).await {
                Received::Packet(packet, text) if want(&packet) => {
                    return Received::Packet(packet, text);
                }
                Received::Packet(..) => continue,
                other => return other,
            }
        }
    }

    /// Closes the socket.
    pub async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }
}
