//! The byte-level edge of the data plane: one [`Frame`] stream and sink per connection attempt.
//!
//! The driver in `connection/` only sees a `Stream`/`Sink` of frames, so the same code runs
//! over a real WebSocket ([`WsTransport`], tokio-tungstenite) and over in-memory channels
//! ([`MemoryTransport`]) in tests, where a test plays the Connector frame by frame.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use xagent_protocol_types::{SUBPROTOCOL, Secret};

use crate::{BaseUrl, ClientError};

/// One data-plane frame: the connection core's, the same type the Connector side reads.
pub use xagent_connection::Frame;

/// The sending half of one connection.
pub type FrameSink = Pin<Box<dyn Sink<Frame, Error = ClientError> + Send>>;
/// The receiving half of one connection.
pub type FrameStream = Pin<Box<dyn Stream<Item = Result<Frame, ClientError>> + Send>>;

/// Opens one data-plane connection per call (the driver calls it again on every reconnect).
pub trait Transport: Send + Sync + 'static {
    /// Connects, or fails with the reason (a 401/403 as [`ClientError::Unauthorized`]).
    fn connect(&self) -> BoxFuture<'_, Result<(FrameSink, FrameStream), ClientError>>;
}

/// The production transport: a WebSocket to `<Base URL>/ws` with the protocol's subprotocol and
/// the system API key as `Authorization: Bearer`.
#[derive(Debug, Clone)]
pub struct WsTransport {
    base_url: BaseUrl,
    api_key: Option<Secret>,
    max_frame_bytes: usize,
    tls: crate::TlsTrust,
}

impl WsTransport {
    /// A transport for a Base URL, trusting the system's certificate authorities for `wss`.
    pub fn new(base_url: BaseUrl, api_key: Option<Secret>, max_frame_bytes: usize) -> Self {
        Self { base_url, api_key, max_frame_bytes, tls: crate::TlsTrust::system() }
    }

    /// Trusts these certificate authorities for `wss` instead.
    #[must_use]
    pub fn with_tls(mut self, tls: crate::TlsTrust) -> Self {
        self.tls = tls;
        self
    }

    async fn open(&self) -> Result<(FrameSink, FrameStream), ClientError> {
        let url = self.base_url.ws_url();
        let key = self.api_key.as_ref().map(Secret::expose);
        let request = xagent_connection::upgrade_request(&url, key)
            .map_err(|e| ClientError::InvalidInput(e.to_string()))?;
        let ws_config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(self.max_frame_bytes))
            .max_frame_size(Some(self.max_frame_bytes));
        let (socket, response) = tokio_tungstenite::connect_async_tls_with_config(
            request,
            Some(ws_config),
            false,
            self.tls.websocket(),
        )
        .await
        .map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(response)
                if matches!(response.status().as_u16(), 401 | 403) =>
            {
                ClientError::Unauthorized {
                    endpoint: url.clone(),
                    status: response.status().as_u16(),
                }
            }
            other => ClientError::transport(&url, &other),
        })?;
        let echoed = response.headers().get("Sec-WebSocket-Protocol").and_then(|v| v.to_str().ok());
        if echoed != Some(SUBPROTOCOL) {
            return Err(ClientError::Protocol(format!(
                "the Connector did not select subprotocol {SUBPROTOCOL} (got {echoed:?})"
            )));
        }
        let (sink, stream) = socket.split();
        let endpoint = url.clone();
        let sink = sink
            .with(|frame: Frame| async move {
                Ok::<_, tokio_tungstenite::tungstenite::Error>(match frame {
                    Frame::Text(text) => Message::Text(text.into()),
                    Frame::Binary(bytes) => Message::Binary(bytes.into()),
                    Frame::Ping(bytes) => Message::Ping(bytes.into()),
                    Frame::Pong(bytes) => Message::Pong(bytes.into()),
                    Frame::Close(close) => Message::Close(close.map(|(code, reason)| {
                        tokio_tungstenite::tungstenite::protocol::CloseFrame {
                            code: code.into(),
                            reason: reason.into(),
                        }
                    })),
                })
            })
            .sink_map_err(move |e| ClientError::Transport {
                endpoint: endpoint.clone(),
                reason: e.to_string(),
            });
        let stream = stream.filter_map(move |message| {
            let url = url.clone();
            async move {
                match message {
                    Ok(Message::Text(text)) => Some(Ok(Frame::Text(text.as_str().to_owned()))),
                    Ok(Message::Binary(bytes)) => Some(Ok(Frame::Binary(bytes.to_vec()))),
                    Ok(Message::Close(close)) => Some(Ok(Frame::Close(
                        close.map(|c| (u16::from(c.code), c.reason.as_str().to_owned())),
                    ))),
                    Ok(_) => None,
                    Err(error) => Some(Err(ClientError::Transport {
                        endpoint: url,
                        reason: error.to_string(),
                    })),
                }
            }
        });
        Ok((Box::pin(sink), Box::pin(stream)))
    }
}

impl Transport for WsTransport {
    fn connect(&self) -> BoxFuture<'_, Result<(FrameSink, FrameStream), ClientError>> {
        Box::pin(self.open())
    }
}

/// The Connector's end of one in-memory connection: what the client wrote, and a way to
/// answer. Dropping it closes the connection.
#[derive(Debug)]
pub struct MemoryPeer {
    /// Frames the client sent, in order.
    pub from_client: mpsc::Receiver<Frame>,
    /// Frames for the client.
    pub to_client: mpsc::Sender<Frame>,
}

impl MemoryPeer {
    /// The next text frame the client sent, parsed as JSON (`None` when the client closed).
    pub async fn next_json(&mut self) -> Option<serde_json::Value> {
        loop {
            match self.from_client.recv().await? {
                Frame::Text(text) => return serde_json::from_str(&text).ok(),
                Frame::Close(_) => return None,
                _ => {}
            }
        }
    }

    /// Sends a JSON packet to the client; false when the client is gone.
    pub async fn send_json(&self, value: serde_json::Value) -> bool {
        self.to_client.send(Frame::Text(value.to_string())).await.is_ok()
    }
}

#[derive(Debug, Default)]
struct MemoryState {
    refuse_status: Option<u16>,
    attempts: u32,
}

/// An in-memory transport for tests: every `connect` hands a new [`MemoryPeer`] to the test
/// through the receiver [`MemoryTransport::new`] returns; [`MemoryTransport::refuse`] makes the
/// following attempts fail as an HTTP status would (401 or 403 as an authentication failure).
#[derive(Debug, Clone)]
pub struct MemoryTransport {
    peers: mpsc::Sender<MemoryPeer>,
    state: Arc<Mutex<MemoryState>>,
}

impl MemoryTransport {
    /// A transport and the stream of Connector ends, one per connection attempt.
    pub fn new() -> (Self, mpsc::Receiver<MemoryPeer>) {
        let (peers, receiver) = mpsc::channel(16);
        (Self { peers, state: Arc::default() }, receiver)
    }

    /// Refuses the following attempts with this HTTP status (`None`: accept again).
    pub fn refuse(&self, status: Option<u16>) {
        self.lock().refuse_status = status;
    }

    /// Connection attempts so far.
    pub fn attempts(&self) -> u32 {
        self.lock().attempts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Transport for MemoryTransport {
    fn connect(&self) -> BoxFuture<'_, Result<(FrameSink, FrameStream), ClientError>> {
        Box::pin(async move {
            let refused = {
                let mut state = self.lock();
                state.attempts += 1;
                state.refuse_status
            };
            match refused {
                Some(status @ (401 | 403)) => {
                    return Err(ClientError::Unauthorized { endpoint: "memory".into(), status });
                }
                Some(status) => {
                    return Err(ClientError::Http {
                        endpoint: "memory".into(),
                        status,
                        body: String::new(),
                    });
                }
                None => {}
            }
            let (client_tx, from_client) = mpsc::channel::<Frame>(256);
            let (to_client, client_rx) = mpsc::channel::<Frame>(256);
            self.peers.send(MemoryPeer { from_client, to_client }).await.map_err(|_| {
                ClientError::Transport {
                    endpoint: "memory".into(),
                    reason: "the test stopped accepting connections".into(),
                }
            })?;
            let sink = futures_util::sink::unfold(client_tx, |tx, frame: Frame| async move {
                tx.send(frame).await.map_err(|_| ClientError::NotConnected)?;
                Ok::<_, ClientError>(tx)
            });
            let stream = futures_util::stream::unfold(client_rx, |mut rx| async move {
                rx.recv().await.map(|frame| (Ok(frame), rx))
            });
            Ok((Box::pin(sink) as FrameSink, Box::pin(stream) as FrameStream))
        })
    }
}
