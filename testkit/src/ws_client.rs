//! A small WebSocket client speaking the packet envelope, and assertions on what it reads.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use xagent_protocol_types::{
    ConnectorChannelId, ErrorCode, PROFILE_IM_V2, Packet, PacketBody, Payload,
};

use crate::{ECHO_CARD_ID, ECHO_FLOW};

/// A WebSocket client speaking packets, for tests.
pub struct WsClient {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next: u64,
    timeout: Duration,
}

/// What a client read.
#[derive(Debug)]
pub enum Received {
    /// A decoded packet.
    Packet(Box<Packet>),
    /// The socket closed with this code.
    Closed(Option<u16>),
}

impl WsClient {
    /// Connects to `ws_url` offering the protocol subprotocol and, if given, the API key.
    pub async fn connect(ws_url: &str, api_key: Option<&str>) -> Result<Self, String> {
        let request =
            xagent_connection::upgrade_request(ws_url, api_key).map_err(|e| e.to_string())?;
        let (socket, _) =
            tokio_tungstenite::connect_async(request).await.map_err(|e| e.to_string())?;
        Ok(Self { socket, next: 0, timeout: Duration::from_secs(10) })
    }

    /// A fresh id with a prefix.
    pub fn id(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}_{}", self.next)
    }

    /// Sends raw text.
    pub async fn send_text(&mut self, text: impl Into<String>) {
        let _ = self.socket.send(Message::Text(text.into().into())).await;
    }

    /// Sends a raw frame.
    pub async fn send_message(&mut self, message: Message) {
        let _ = self.socket.send(message).await;
    }

    /// Sends a packet.
    pub async fn send(&mut self, packet: &Packet) {
        let text = packet.to_json().unwrap_or_default();
        self.send_text(text).await;
    }

    /// A request packet with fresh packet and request ids.
    pub fn request<P: Payload>(
        &mut self,
        payload: P,
        channel: Option<&ConnectorChannelId>,
    ) -> Packet {
        let packet_id = self.id("pkt");
        let request_id = self.id("req");
        Packet::with_payload(packet_id, payload)
            .request_id(request_id)
            .maybe_channel(channel.cloned())
    }

    /// Reads the next packet or close (panics on a timeout: tests only).
    pub async fn recv(&mut self) -> Received {
        loop {
            let next = tokio::time::timeout(self.timeout, self.socket.next()).await;
            match next {
                Err(_) => panic!("no packet within {:?}", self.timeout),
                Ok(None) => return Received::Closed(None),
                Ok(Some(Err(_))) => return Received::Closed(None),
                Ok(Some(Ok(Message::Text(text)))) => match Packet::decode_str(text.as_str()) {
                    Ok(packet) => return Received::Packet(Box::new(packet)),
                    Err(error) => panic!("the server sent an invalid packet: {error}: {text}"),
                },
                Ok(Some(Ok(Message::Close(frame)))) => {
                    return Received::Closed(frame.map(|f| u16::from(f.code)));
                }
                Ok(Some(Ok(_))) => continue,
            }
        }
    }

    /// Reads the next packet (panics on close).
    pub async fn next_packet(&mut self) -> Packet {
        match self.recv().await {
            Received::Packet(packet) => *packet,
            Received::Closed(code) => {
                panic!("socket closed ({code:?}) while a packet was expected")
            }
        }
    }

    /// Reads packets until one of type `packet_type` arrives; the skipped ones are returned too.
    pub async fn wait_for(&mut self, packet_type: &str) -> (Packet, Vec<Packet>) {
        let mut skipped = Vec::new();
        loop {
            let packet = self.next_packet().await;
            if packet.type_str() == packet_type {
                return (packet, skipped);
            }
            skipped.push(packet);
        }
    }

    /// Sends a request and waits for the packet answering it (by `request_id`).
    pub async fn call(&mut self, packet: Packet) -> Packet {
        let request_id = packet.request_id.clone();
        self.send(&packet).await;
        loop {
            let reply = self.next_packet().await;
            if reply.request_id == request_id && reply.reply_to.as_ref() == Some(&packet.packet_id)
            {
                return reply;
            }
        }
    }

    /// Sends `connector.hello` for the echo card and returns the ack.
    pub async fn hello(&mut self, connector_id: Option<&str>) -> Packet {
        let mut hello =
            xagent_protocol_types::ConnectorHello::new(ECHO_CARD_ID, vec![PROFILE_IM_V2.into()]);
        if let Some(id) = connector_id {
            hello = hello.with_connector_id(id);
        }
        let packet = self.request(hello, None);
        self.call(packet).await
    }

    /// Opens a channel (new, or restoring `channel`) and returns its id and the ack.
    pub async fn open_channel(
        &mut self,
        channel: Option<&ConnectorChannelId>,
    ) -> (ConnectorChannelId, Packet) {
        let packet = self.request(xagent_protocol_types::ChannelOpen::default(), channel);
        let ack = self.call(packet).await;
        let id = ack.connector_channel_id.clone().unwrap_or_else(|| ConnectorChannelId::new(""));
        (id, ack)
    }

    /// Signs the channel in with the echo form flow.
    pub async fn sign_in(&mut self, channel: &ConnectorChannelId, token: &str) -> Packet {
        let start = xagent_protocol_types::AuthStart::new(ECHO_FLOW)
            .with_input(xagent_protocol_types::AuthInput::default().with("token", token));
        let packet = self.request(start, Some(channel));
        self.call(packet).await
    }

    /// Closes the socket.
    pub async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }
}

/// The payload of a packet as JSON (for assertions on acks).
pub fn payload_json(packet: &Packet) -> Value {
    packet.body.payload_value().ok().flatten().unwrap_or(Value::Null)
}

/// True when the body is an `error` packet or carries an envelope error with this code.
pub fn has_error(packet: &Packet, code: &ErrorCode) -> bool {
    packet.error.as_ref().is_some_and(|e| &e.code == code)
}

/// True when the packet is a `type = "error"` packet.
pub fn is_error_packet(packet: &Packet) -> bool {
    matches!(packet.body, PacketBody::Error(_))
}
