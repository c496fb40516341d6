//! The [`Xagent`] facade against testkit's echo Connector (server-runtime) over real sockets on
//! 127.0.0.1: the Profiles it announces, a SQLite store surviving a restart, durable admission
//! with the Connector gone or changed, and typed errors for a bad or unreachable Base URL.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{API_KEY, signed_in_channel};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use xagent_client_runtime::prelude::*;
use xagent_client_runtime::{BaseUrlError, DurableAdmission, next_event_matching};
use xagent_protocol_types::{PROFILE_IM_V2, TargetDeclaration, TargetType};
use xagent_testkit::{ECHO_CARD_ID, ECHO_SKILL, EchoServer, temp_state_dir};

const WAIT: Duration = Duration::from_secs(30);

async fn echo(dir: &std::path::Path, addr: Option<std::net::SocketAddr>) -> EchoServer {
    EchoServer::start(dir, API_KEY, addr).await.expect("the echo Connector starts")
}

/// The facade for `base` with the test API key.
fn xagent(base: &str) -> Xagent {
    Xagent::connect(base, Secret::new(API_KEY))
}

/// A tap forwarding every `connector.hello` the client sends, as JSON.
fn hello_tap() -> (PacketTap, UnboundedReceiver<Value>) {
    let (tx, rx) = unbounded_channel();
    let tap = PacketTap::new(move |direction, text| {
        if matches!(direction, TapDirection::Sent)
            && let Ok(value) = serde_json::from_str::<Value>(text)
            && value["type"] == "connector.hello"
        {
            let _ = tx.send(value);
        }
    });
    (tap, rx)
}

/// The next hello the client sent, within [`WAIT`].
async fn next_hello(hellos: &mut UnboundedReceiver<Value>) -> Value {
    tokio::time::timeout(WAIT, hellos.recv())
        .await
        .expect("a hello within 30 s")
        .expect("the tap is alive")
}

/// Waits (up to [`WAIT`]) until `plane` is online and returns the Connector's runtime id.
async fn online(plane: &DataPlane) -> String {
    let id = tokio::time::timeout(WAIT, plane.connected()).await.expect("online within 30 s");
    id.expect("hello accepted").to_string()
}

/// A Base URL nothing listens on (the port was bound, then released).
async fn unreachable_base() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("an address");
    drop(listener);
    format!("http://{addr}")
}

#[tokio::test]
async fn facade_announces_exactly_the_listed_profiles_and_the_connector_accepts_them() {
    let server = echo(&temp_state_dir("facade-profiles"), None).await;
    let (tap, mut hellos) = hello_tap();
    let running = xagent(&server.base_url())
        .profiles([PROFILE_IM_V2])
        .tap(tap)
        .start()
        .await
        .expect("starts");
    let hello = next_hello(&mut hellos).await;
    assert_eq!(hello["payload"]["supported_profiles"], serde_json::json!([PROFILE_IM_V2]));
    online(&running.plane).await;
    running.plane.close().await;
    server.stop().await;
}

#[tokio::test]
async fn facade_announces_no_profile_when_none_is_listed_and_the_connector_refuses_the_hello() {
    let server = echo(&temp_state_dir("facade-no-profiles"), None).await;
    let (tap, mut hellos) = hello_tap();
    let running = xagent(&server.base_url()).tap(tap).start().await.expect("starts");
    let hello = next_hello(&mut hellos).await;
    assert_eq!(hello["payload"]["supported_profiles"], serde_json::json!([]));
    // With nothing in common with the Card, the hello fails and the plane never goes online.
    let mut state = running.plane.watch_state();
    let failed = tokio::time::timeout(
        WAIT,
        state.wait_for(|s| {
            matches!(s, ConnectionState::Degraded { .. } | ConnectionState::Offline { .. })
        }),
    )
    .await
    .expect("the refusal within 30 s")
    .expect("the plane runs")
    .clone();
    let (ConnectionState::Degraded { reason, .. } | ConnectionState::Offline { reason, .. }) =
        failed
    else {
        unreachable!()
    };
    assert!(reason.contains("supported_profiles"), "says why: {reason}");
    running.plane.close().await;
    server.stop().await;
}

#[tokio::test]
async fn facade_sqlite_store_resumes_the_connector_id_and_remembered_channel_after_a_restart() {
    let server = echo(&temp_state_dir("facade-sqlite-server"), None).await;
    let dir = temp_state_dir("facade-sqlite-client");
    let first = xagent(&server.base_url())
        .profiles([PROFILE_IM_V2])
        .store(Store::Sqlite(dir.clone()))
        .start()
        .await
        .expect("starts");
    let first_id = online(&first.plane).await;
    let channel = signed_in_channel(&first.plane).await;
    first.plane.close().await;
    drop(first);

    let (tap, mut hellos) = hello_tap();
    let Running { plane, mut events, .. } = xagent(&server.base_url())
        .profiles([PROFILE_IM_V2])
        .store(Store::Sqlite(dir.clone()))
        .tap(tap)
        .start()
        .await
        .expect("restarts");
    let hello = next_hello(&mut hellos).await;
    assert_eq!(hello["payload"]["connector_id"], first_id.as_str(), "the stored id is resumed");
    let reopened = next_event_matching(&mut events, WAIT, |e| {
        matches!(e, ClientEvent::ChannelReopened { .. })
    })
    .await;
    let Some(ClientEvent::ChannelReopened { previous, current, .. }) = reopened else {
        panic!("the remembered channel is reopened: {reopened:?}");
    };
    assert_eq!((&previous, &current), (&channel, &channel));
    assert_eq!(online(&plane).await, first_id);
    plane.close().await;
    server.stop().await;
}

/// The durable facade for `base` over the SQLite store in `dir`, expecting the echo Card.
fn durable(base: &str, dir: &std::path::Path) -> Xagent {
    xagent(base)
        .profiles([PROFILE_IM_V2])
        .expect_card(ECHO_CARD_ID)
        .store(Store::Sqlite(dir.to_path_buf()))
        .durable_admission()
}

#[tokio::test]
async fn durable_admission_serves_the_stored_card_while_the_connector_is_down_and_connects_when_it_returns()
 {
    let server_dir = temp_state_dir("facade-durable-server");
    let dir = temp_state_dir("facade-durable-client");
    let server = echo(&server_dir, None).await;
    let addr = server.addr;
    let first = durable(&server.base_url(), &dir).start().await.expect("starts");
    assert!(matches!(first.admission, DurableAdmission::Fresh(_)), "{:?}", first.admission);
    let first_id = online(&first.plane).await;
    first.plane.close().await;
    drop(first);
    server.stop().await;

    let restarted = durable(&format!("http://{addr}"), &dir).start().await.expect("starts offline");
    let DurableAdmission::Stored { card, skill, unreachable } = &restarted.admission else {
        panic!("the stored snapshot is served: {:?}", restarted.admission);
    };
    assert_eq!(card.connector_card_id.as_str(), ECHO_CARD_ID);
    assert_eq!(skill.as_deref(), Some(ECHO_SKILL));
    assert!(unreachable.contains("connector-card.json"), "says what failed: {unreachable}");
    assert!(!matches!(*restarted.plane.watch_state().borrow(), ConnectionState::Online { .. }));

    // The Connector comes back at the same address: the plane started on the snapshot connects.
    let server = echo(&server_dir, Some(addr)).await;
    assert_eq!(online(&restarted.plane).await, first_id);
    restarted.plane.close().await;
    server.stop().await;
}

#[tokio::test]
async fn durable_admission_refuses_a_changed_card_and_keeps_the_stored_snapshot() {
    let dir = temp_state_dir("facade-durable-changed");
    let server = echo(&temp_state_dir("facade-durable-changed-server"), None).await;
    let first = durable(&server.base_url(), &dir).start().await.expect("starts");
    first.plane.close().await;
    drop(first);
    server.stop().await;

    // Another Connector answers at the Base URL: an answer is not "unreachable", so the
    // refusal stands and the snapshot is not served in its place.
    let other = xagent_server_runtime::Connector::builder("im.other", "Other", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "other", "Other"))
        .profile(PROFILE_IM_V2)
        .on_message(|_, _| async {})
        .build()
        .expect("a valid Connector");
    let other = xagent_server_runtime::ConnectorServer::builder(other)
        .api_key(Secret::new(API_KEY))
        .build()
        .await
        .expect("builds");
    let other = xagent_testkit::serve_on_loopback(&other).await;
    let refused = durable(&format!("http://{other}"), &dir).start().await;
    assert!(
        matches!(&refused, Err(ClientError::NotAdmissible(reason)) if reason.contains("im.other")),
        "{:?}",
        refused.as_ref().err()
    );

    // The snapshot is still the echo Card's: with nothing answering, it is served.
    let offline = durable(&unreachable_base().await, &dir).start().await.expect("starts offline");
    assert_eq!(offline.admission.card().connector_card_id.as_str(), ECHO_CARD_ID);
    assert!(matches!(offline.admission, DurableAdmission::Stored { .. }));
    offline.plane.close().await;
}

#[tokio::test]
async fn facade_bad_base_url_is_a_typed_error() {
    for (base, expected) in [
        ("not a url", "unparsable"),
        ("ftp://connector.example/im", "scheme"),
        ("http://user:pw@connector.example/im", "userinfo"),
    ] {
        let error = xagent(base).profiles([PROFILE_IM_V2]).start().await.err();
        let kind = match &error {
            Some(ClientError::BaseUrl(BaseUrlError::Unparsable(_))) => "unparsable",
            Some(ClientError::BaseUrl(BaseUrlError::Scheme(_))) => "scheme",
            Some(ClientError::BaseUrl(BaseUrlError::Userinfo)) => "userinfo",
            _ => "other",
        };
        assert_eq!(kind, expected, "{base}: {error:?}");
    }
}

#[tokio::test]
async fn facade_unreachable_connector_is_a_transport_error_with_or_without_durable_admission() {
    let base = unreachable_base().await;
    let plain = xagent(&base).profiles([PROFILE_IM_V2]).start().await.err();
    assert!(matches!(plain, Some(ClientError::Transport { .. })), "{plain:?}");
    // Durable admission with nothing stored yet has no snapshot to serve.
    let dir = temp_state_dir("facade-unreachable");
    let durable = durable(&base, &dir).start().await.err();
    assert!(matches!(durable, Some(ClientError::Transport { .. })), "{durable:?}");
}
