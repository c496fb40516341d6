//! The reconnect driver: one connection's life and hello with its checks; reopening the
//! remembered channels is `crate::reopen`'s.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::mpsc;
use xagent_protocol_types::{
    ConnectorHello, ConnectorHelloAck, ConnectorId, Packet, Payload, Side,
};
use xagent_protocol_validate::{PacketContext, Session};

use super::frames::{read_loop, write_loop};
use super::request::request_on;
use super::shared::{Link, Outgoing, fail_pending};
use super::{ClientEvent, ConnectionState, Shared, emit, lock};
use crate::ClientError;
use crate::transport::Transport;

/// The reconnect loop: never gives up; the delay grows to the cap.
pub(super) async fn supervise(shared: Arc<Shared>, transport: Box<dyn Transport>) {
    let mut failures = 0u32;
    let mut known_connector = crate::reopen::known_connector_id(&shared.config);
    loop {
        if failures == 0 {
            shared.set_state(ConnectionState::Connecting { failures });
        }
        let outcome = run_connection(&shared, transport.as_ref(), &mut known_connector).await;
        *lock(&shared.link) = None;
        fail_pending(&shared);
        shared.im.lock().await.on_disconnect(shared.now());
        match outcome {
            Ok(reason) => {
                failures = 0;
                emit(&shared, ClientEvent::Disconnected { reason }).await;
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::warn!(failures, error = %error, "data-plane connection failed");
                let reason = error.to_string();
                let state = match &error {
                    ClientError::Unauthorized { .. } => {
                        ConnectionState::AuthFailed { reason: reason.clone() }
                    }
                    _ if shared.config.backoff.exhausted(failures) => {
                        ConnectionState::Offline { failures, reason: reason.clone() }
                    }
                    _ => ConnectionState::Degraded { failures, reason: reason.clone() },
                };
                shared.set_state(state);
                emit(&shared, ClientEvent::Disconnected { reason }).await;
            }
        }
        let delay = shared.config.backoff.delay(failures.max(1));
        tokio::time::sleep(delay).await;
    }
}

/// One connection's life: connect, hello, reopen channels, read until it closes. Returns `Ok`
/// with the close reason when hello had completed, `Err` otherwise.
async fn run_connection(
    shared: &Arc<Shared>,
    transport: &dyn Transport,
    known_connector: &mut Option<ConnectorId>,
) -> Result<String, ClientError> {
    let config = &shared.config;
    let (sink, stream) = transport.connect().await?;
    let session = match &config.card {
        Some(card) => Session::new(Side::Xagent, card, config.window),
        None => Session::from_parts(
            Side::Xagent,
            config.connector_card_id.clone(),
            config.supported_profiles.clone(),
            config.window,
        ),
    };
    let session = Arc::new(StdMutex::new(session));
    let (tx, rx) = mpsc::channel(256);
    let writer = tokio::spawn(write_loop(sink, rx, session.clone(), config.tap.clone()));
    *lock(&shared.link) = Some(Link { tx, session: session.clone() });
    let mut reader = Box::pin(read_loop(shared.clone(), session.clone(), stream));

    // Hello, through the same request path as every other request.
    let mut hello =
        ConnectorHello::new(config.connector_card_id.clone(), config.supported_profiles.clone());
    if let Some(id) = known_connector.as_ref() {
        hello = hello.with_connector_id(id.clone());
    }
    let hello_answer = tokio::select! {
        biased;
        answer = request_on(shared, None, hello.into_body()) => answer,
        reason = &mut reader => {
            writer.abort();
            return Err(ClientError::Transport {
                endpoint: config.base_url.ws_url(),
                reason: format!("closed before connector.hello.ack: {reason}"),
            });
        }
    };
    let hello_ack = match hello_answer.and_then(|packet| check_hello_ack(shared, &packet)) {
        Ok(ack) => ack,
        Err(error) => {
            if let Some(link) = shared.link() {
                let _ =
                    link.tx.send(Outgoing::Close(1008, "connector.hello.ack refused".into())).await;
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
            return Err(error);
        }
    };
    let connector_id = hello_ack.connector_id.clone();
    let known = known_connector.replace(connector_id.clone());
    crate::reopen::store_connector_id(shared, known.as_ref(), &connector_id);
    let replaced = known.filter(|previous| previous != &connector_id);
    match replaced {
        Some(previous) => {
            shared.set_state(ConnectionState::Replaced {
                previous: previous.clone(),
                current: connector_id.clone(),
            });
            emit(
                shared,
                ClientEvent::ConnectorReplaced { previous, current: connector_id.clone() },
            )
            .await;
        }
        None => shared.set_state(ConnectionState::Online { connector_id: connector_id.clone() }),
    }
    emit(shared, ClientEvent::Connected { connector_id: connector_id.clone() }).await;

    // Reopen remembered channels while the reader runs.
    let reopen = tokio::spawn(crate::reopen::reopen_channels(shared.clone(), connector_id));
    let reason = reader.await;
    reopen.abort();
    writer.abort();
    Ok(reason)
}

/// The checks on `connector.hello.ack` beyond the session's (which already checked the Card
/// id, the version window and the pairing): the schema rules of the validator, and the Card.
pub(super) fn check_hello_ack(
    shared: &Shared,
    packet: &Packet,
) -> Result<ConnectorHelloAck, ClientError> {
    if let Some(error) = &packet.error {
        return Err(ClientError::Remote(error.clone()));
    }
    let value = packet.to_value().map_err(|e| ClientError::Protocol(e.to_string()))?;
    let facts = shared.card_facts();
    let context = PacketContext { card: facts.as_deref(), sender: Some(Side::Connector) };
    let report = xagent_protocol_validate::validate_packet(&value, context);
    let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
    if !errors.is_empty() {
        return Err(ClientError::NotAdmissible(format!(
            "connector.hello.ack refused: {}",
            errors.join("; ")
        )));
    }
    let Some(ack) = packet.payload::<ConnectorHelloAck>().cloned() else {
        return Err(ClientError::Protocol(format!(
            "expected connector.hello.ack, got {}",
            packet.type_str()
        )));
    };
    if ack.connector_card_id != shared.config.connector_card_id {
        return Err(ClientError::NotAdmissible(format!(
            "[hello_ack.card_id] connector.hello.ack names card {}, expected {}",
            ack.connector_card_id, shared.config.connector_card_id
        )));
    }
    shared
        .config
        .window
        .admit(ack.protocol_version.as_deref())
        .map_err(|e| ClientError::NotAdmissible(format!("[hello_ack.protocol_version] {e}")))?;
    if let Some(card) = &shared.config.card
        && ack.protocol_version.as_deref() != Some(card.protocol_version.as_str())
    {
        return Err(ClientError::NotAdmissible(format!(
            "[hello_ack.protocol_version] connector.hello.ack says protocol {:?}, the admitted Card says {}",
            ack.protocol_version, card.protocol_version
        )));
    }
    Ok(ack)
}
