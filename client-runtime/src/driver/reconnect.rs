//! The reconnect driver: one connection's life (hello, its checks in `hello`), reopening
//! channels.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use xagent_connection::{CLOSE_POLICY, Outbound, SendRules, WriterOptions};
use xagent_protocol_types::{ConnectorId, Payload, Side};

use super::frames::read_loop;
use super::hello::hello_ack;
use crate::ClientError;
use crate::connection::{
    ClientEvent, ConnectionState, Shared, TapDirection, emit, fail_pending, lock, request_on,
};
use crate::transport::Transport;

/// The driver: with a holder lease, takes it (standing by until then), runs the reconnect loop
/// while renewing it, and stands by again when it is lost; without one, runs the reconnect
/// loop.
pub(super) async fn supervise(shared: Arc<Shared>, transport: Box<dyn Transport>) {
    let Some(lease) = shared.config.lease.clone() else {
        reconnect(&shared, transport.as_ref()).await;
        return;
    };
    loop {
        let mut keeper = super::holder::take_lease(&shared, &lease).await;
        let reason = tokio::select! {
            () = reconnect(&shared, transport.as_ref()) => String::from("the reconnect loop ended"),
            reason = super::holder::keep_lease(&shared, &lease, &mut keeper) => reason,
        };
        // The next tenure reloads the state from the store: nothing of this one is kept.
        super::holder::on_lost(&shared, reason).await;
    }
}

/// The reconnect loop: never gives up; the delay grows to the cap.
async fn reconnect(shared: &Arc<Shared>, transport: &dyn Transport) {
    let mut failures = 0u32;
    let mut known_connector = super::reopen::known_connector_id(shared).await;
    loop {
        if failures == 0 {
            shared.set_state(ConnectionState::Connecting { failures });
        }
        let outcome = run_connection(shared, transport, &mut known_connector).await;
        *lock(&shared.link) = None;
        fail_pending(shared);
        let ticket = shared.im.lock().await.on_disconnect(shared.now());
        shared.watch_commit("the outbox's disconnect", ticket);
        match outcome {
            Ok(reason) => {
                failures = 0;
                emit(shared, ClientEvent::Disconnected { reason }).await;
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
                emit(shared, ClientEvent::Disconnected { reason }).await;
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
    // What was admitted, read now: a Card re-admitted since the last connection reaches
    // this session and this hello.
    let admitted = shared.admission.current();
    let session = Arc::new(StdMutex::new(admitted.session(Side::Xagent)));
    let (link, writer) = Outbound::open(
        Arc::clone(&session),
        sink,
        writer_options(shared),
        config.write_queue.max(1),
        Arc::clone(&config.clock),
    );
    *lock(&shared.link) = Some(link);
    let mut reader = Box::pin(read_loop(shared.clone(), session.clone(), stream));

    // Hello, through the same request path as every other request.
    let hello = admitted.hello(known_connector.as_ref());
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
    let hello_ack = match hello_answer.and_then(hello_ack) {
        Ok(ack) => ack,
        Err(error) => {
            if let Some(link) = shared.link() {
                link.close(CLOSE_POLICY, "connector.hello.ack refused").await;
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
            return Err(error);
        }
    };
    let connector_id = hello_ack.connector_id.clone();
    let known = known_connector.replace(connector_id.clone());
    let replaced = known.clone().filter(|previous| previous != &connector_id);
    match &replaced {
        Some(_) => super::reopen::replace_instance(shared, &connector_id).await,
        None => super::reopen::store_connector_id(shared, known.as_ref(), &connector_id).await,
    }
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
    let reopen = tokio::spawn(super::reopen::reopen_channels(shared.clone(), connector_id));
    let reason = reader.await;
    reopen.abort();
    writer.abort();
    Ok(reason)
}

/// How this side's writer treats what it sends: the outbound size rule, the send rules (the
/// Connector's receive rules, with the admitted Card), and the tap.
fn writer_options(shared: &Shared) -> WriterOptions {
    let mut options = WriterOptions::new(shared.config.max_packet_bytes);
    options.judge = Some(Arc::new(SendRules::new(Side::Xagent, Arc::clone(&shared.admission))));
    options.tap = shared.config.tap.clone().map(|tap| {
        let see: xagent_connection::WriteTap =
            Arc::new(move |_: &xagent_protocol_types::Packet, text: &str| {
                tap.see(TapDirection::Sent, text)
            });
        see
    });
    options
}
