//! The health monitor against a server whose `/health` fails on demand.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::RwLock;
use xagent_client_runtime::{BaseUrl, ControlPlane, HealthMonitor, HealthStatus};
use xagent_protocol_types::{
    BuildInfo, ConnectorCard, ConnectorInfo, HealthResponse, Secret, Supports, TargetType,
};

fn card(version: &str) -> ConnectorCard {
    ConnectorCard::new(
        "im.flaky",
        BuildInfo::new("2611291200"),
        ConnectorInfo::new("Flaky", version),
        Supports::new(vec![TargetType::Im], vec!["xagent.im.v2".into()]),
    )
}

#[derive(Clone)]
struct Flaky {
    status: Arc<AtomicU16>,
    version: Arc<std::sync::Mutex<String>>,
}

async fn health(State(flaky): State<Flaky>) -> axum::response::Response {
    let status = flaky.status.load(Ordering::SeqCst);
    if status != 200 {
        return StatusCode::from_u16(status)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            .into_response();
    }
    let version = flaky.version.lock().map(|v| v.clone()).unwrap_or_default();
    axum::Json(HealthResponse::for_card(&card(&version))).into_response()
}

async fn card_doc(State(flaky): State<Flaky>) -> axum::Json<ConnectorCard> {
    let version = flaky.version.lock().map(|v| v.clone()).unwrap_or_default();
    axum::Json(card(&version))
}

async fn wait_for(
    receiver: &mut tokio::sync::watch::Receiver<HealthStatus>,
    want: impl Fn(&HealthStatus) -> bool,
) -> HealthStatus {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let current = receiver.borrow_and_update().clone();
            if want(&current) {
                return current;
            }
            if receiver.changed().await.is_err() {
                return current;
            }
        }
    })
    .await
    .expect("status reached in time")
}

#[tokio::test]
async fn health_transitions_follow_failures_auth_and_card_changes() {
    let flaky = Flaky {
        status: Arc::new(AtomicU16::new(200)),
        version: Arc::new(std::sync::Mutex::new("1.0.0".into())),
    };
    let app = axum::Router::new()
        .route("/health", get(health))
        .route("/connector-card.json", get(card_doc))
        .with_state(flaky.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let control = ControlPlane::new(
        BaseUrl::parse(&format!("http://{addr}")).expect("base"),
        Some(Secret::new("k")),
    );
    let cached = Arc::new(RwLock::new(card("1.0.0")));
    let monitor =
        HealthMonitor::spawn(control, cached.clone(), Duration::from_millis(20), |json, _skill| {
            serde_json::from_value::<ConnectorCard>(json.clone()).map_err(|e| e.to_string())
        });
    let mut status = monitor.subscribe();
    wait_for(&mut status, |s| *s == HealthStatus::Online).await;

    flaky.status.store(503, Ordering::SeqCst);
    let degraded = wait_for(&mut status, |s| matches!(s, HealthStatus::Degraded { .. })).await;
    assert!(matches!(degraded, HealthStatus::Degraded { failures: 1, .. }));
    let offline = wait_for(&mut status, |s| matches!(s, HealthStatus::Offline { .. })).await;
    assert!(matches!(offline, HealthStatus::Offline { failures: 3.., .. }));

    flaky.status.store(200, Ordering::SeqCst);
    wait_for(&mut status, |s| *s == HealthStatus::Online).await;

    flaky.status.store(401, Ordering::SeqCst);
    wait_for(&mut status, |s| *s == HealthStatus::AuthenticationFailed).await;
    flaky.status.store(200, Ordering::SeqCst);
    wait_for(&mut status, |s| *s == HealthStatus::Online).await;

    // A new connector version in /health makes the monitor refetch the Card.
    if let Ok(mut version) = flaky.version.lock() {
        *version = "1.1.0".into();
    }
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if cached.read().await.connector.version == "1.1.0" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the Card was refetched");
    monitor.stop();
}

/// A Connector's control plane whose Card and `/health` document the test sets apart, as in
/// the middle of a rolling upgrade.
#[derive(Clone)]
struct Rolling {
    card: Arc<std::sync::Mutex<ConnectorCard>>,
    health: Arc<std::sync::Mutex<HealthResponse>>,
}

impl Rolling {
    fn new(card: &ConnectorCard) -> Self {
        Self {
            card: Arc::new(std::sync::Mutex::new(card.clone())),
            health: Arc::new(std::sync::Mutex::new(HealthResponse::for_card(card))),
        }
    }

    fn serve_card(&self, card: &ConnectorCard) {
        *self.card.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = card.clone();
    }

    fn serve_health(&self, health: HealthResponse) {
        *self.health.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = health;
    }

    /// Serves `/health` and the Card on an ephemeral port; returns the control plane.
    async fn start(&self) -> ControlPlane {
        async fn health(State(r): State<Rolling>) -> axum::Json<HealthResponse> {
            axum::Json(r.health.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
        }
        async fn card(State(r): State<Rolling>) -> axum::Json<ConnectorCard> {
            axum::Json(r.card.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
        }
        let app = axum::Router::new()
            .route("/health", get(health))
            .route("/connector-card.json", get(card))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ControlPlane::new(
            BaseUrl::parse(&format!("http://{addr}")).expect("base"),
            Some(Secret::new("k")),
        )
    }
}

fn parse_card(json: &serde_json::Value) -> Result<ConnectorCard, String> {
    serde_json::from_value::<ConnectorCard>(json.clone()).map_err(|e| e.to_string())
}

#[tokio::test]
async fn health_rule_a_build_that_still_differs_after_the_refetch_keeps_the_connector_offline() {
    let admitted = card("1.0.0");
    let rolling = Rolling::new(&admitted);
    // The new build answers /health, but the Card endpoint still serves the old Card.
    let mut rebuilt = HealthResponse::for_card(&admitted);
    rebuilt.build = BuildInfo::new("2612010000");
    rolling.serve_health(rebuilt);
    let control = rolling.start().await;
    let cached = Arc::new(RwLock::new(admitted.clone()));
    let monitor = HealthMonitor::spawn(control, cached, Duration::from_millis(10), |json, _| {
        parse_card(json)
    });
    let mut status = monitor.subscribe();
    // Every status published over many probes (and refetches) is offline, never online.
    let mut seen = Vec::new();
    while seen.len() < 8 {
        tokio::time::timeout(Duration::from_secs(10), status.changed())
            .await
            .expect("a probe in time")
            .expect("the monitor runs");
        seen.push(status.borrow_and_update().clone());
    }
    let online = seen.iter().filter(|s| **s == HealthStatus::Online).count();
    assert_eq!(online, 0, "an incompatible Connector cannot remain online: {seen:?}");
    match seen.last() {
        Some(HealthStatus::Offline { reason, .. }) => {
            assert!(reason.contains("build 2612010000"), "the reason names the build: {reason}");
        }
        other => panic!("expected offline, got {other:?}"),
    }
    // The Card endpoint catches up: the two agree, and the Connector is online again.
    let mut upgraded = admitted.clone();
    upgraded.build = BuildInfo::new("2612010000");
    rolling.serve_card(&upgraded);
    wait_for(&mut status, |s| *s == HealthStatus::Online).await;
    monitor.stop();
}

mod readmission {
    use super::*;
    use serde_json::{Value, json};
    use xagent_client_runtime::transport::{MemoryPeer, MemoryTransport};
    use xagent_client_runtime::{ClientConfig, ClientEvent, DataPlane, next_event_matching};
    use xagent_protocol_types::{
        CardTool, ChannelOpenAck, Connection, ConnectionDescriptor, ConnectionStatus,
        ConnectorHelloAck, DescriptorTarget, DescriptorTool, Packet,
    };

    const CARD: &str = "im.flaky";

    fn tool(id: &str) -> CardTool {
        let schema = json!({"type": "object", "required": ["connector_channel_id"],
            "properties": {"connector_channel_id": {"type": "string"}}});
        CardTool::new(id, schema.as_object().cloned().unwrap_or_default())
    }

    fn descriptor(tools: &[&str]) -> ConnectionDescriptor {
        let mut descriptor = ConnectionDescriptor::new(
            Connection::new(
                CARD,
                "conn_1",
                "cch_1",
                TargetType::Im,
                vec!["xagent.im.v2".into()],
                ConnectionStatus::Connected,
            ),
            DescriptorTarget::new("flaky", "Flaky"),
        );
        for id in tools {
            descriptor = descriptor.with_tool(DescriptorTool::available(*id));
        }
        descriptor
    }

    async fn next_packet(peer: &mut MemoryPeer, kind: &str) -> Packet {
        let value: Value = peer.next_json().await.expect("a packet from the client");
        let packet = Packet::from_value(value).expect("a packet");
        assert_eq!(packet.type_str(), kind);
        packet
    }

    async fn send(peer: &MemoryPeer, packet: Packet) {
        assert!(peer.send_json(packet.to_value().expect("encodes")).await);
    }

    #[tokio::test]
    async fn readmission_rule_a_refetched_card_reaches_the_data_plane_and_the_tool_projection() {
        let first = card("1.0.0").with_tool(tool("flaky_send"));
        let rolling = Rolling::new(&first);
        let control = rolling.start().await;
        let (transport, mut peers) = MemoryTransport::new();
        let base = BaseUrl::parse("http://memory.invalid").expect("valid");
        let (plane, mut events) =
            DataPlane::connect_with(ClientConfig::for_card(base, &first), transport)
                .await
                .expect("starts");
        let mut peer = peers.recv().await.expect("a connection");
        let hello = next_packet(&mut peer, "connector.hello").await;
        send(
            &peer,
            Packet::with_payload("pkt_h", ConnectorHelloAck::new(CARD, "conn_1")).answering(&hello),
        )
        .await;
        plane.connected().await.expect("online");
        let opening = tokio::spawn({
            let plane = plane.clone();
            async move { plane.open_channel_for("alice", None).await }
        });
        let open = next_packet(&mut peer, "channel.open").await;
        let ack = ChannelOpenAck::new("cch_1".into(), descriptor(&["flaky_send"]));
        send(&peer, Packet::with_payload("pkt_o", ack).answering(&open).channel("cch_1")).await;
        opening.await.expect("joins").expect("opened");
        let names = |plane: &DataPlane| -> Vec<String> {
            plane.model_tools("alice").into_iter().map(|d| d.name.to_string()).collect()
        };
        assert_eq!(names(&plane), ["flaky_send"]);

        let cached = Arc::new(RwLock::new(first.clone()));
        let feeding = plane.clone();
        let monitor = HealthMonitor::spawn_feeding(
            control,
            cached,
            Duration::from_millis(10),
            |json, _| parse_card(json),
            move |card| feeding.set_card(card),
        );
        let mut refreshed = monitor.refreshed();
        // The Connector is upgraded: a new build with a second Tool.
        let mut upgraded =
            card("1.1.0").with_tool(tool("flaky_send")).with_tool(tool("flaky_history"));
        upgraded.build = BuildInfo::new("2612010000");
        upgraded.supports.profiles.push("xagent.im.v1".into());
        rolling.serve_card(&upgraded);
        rolling.serve_health(HealthResponse::for_card(&upgraded));
        tokio::time::timeout(Duration::from_secs(10), refreshed.changed())
            .await
            .expect("refetched in time")
            .expect("the monitor runs");
        let mut status = monitor.subscribe();
        wait_for(&mut status, |s| *s == HealthStatus::Online).await;
        // The data plane judges by the re-admitted Card: a Descriptor naming the new Tool is
        // taken, and the projection offers it.
        let push = json!({"schema": "xagent.connector.packet/v1", "packet_id": "pkt_d2",
            "type": "connection.descriptor.push", "connector_channel_id": "cch_1",
            "payload": {"connection_descriptor":
                serde_json::to_value(descriptor(&["flaky_send", "flaky_history"])).expect("encodes")}});
        assert!(peer.send_json(push).await);
        let pushed = next_event_matching(&mut events, Duration::from_secs(5), |e| {
            matches!(e, ClientEvent::DescriptorPushed { .. })
        })
        .await;
        assert!(pushed.is_some(), "the Descriptor was judged by the new Card");
        assert_eq!(names(&plane), ["flaky_send", "flaky_history"]);
        // The next hello announces the re-admitted Card's Profiles.
        drop(peer);
        let mut peer = peers.recv().await.expect("a reconnect");
        let hello = next_packet(&mut peer, "connector.hello").await;
        let announced = hello.to_value().expect("encodes")["payload"]["supported_profiles"].clone();
        assert_eq!(announced, json!(["xagent.im.v2", "xagent.im.v1"]), "{announced}");
        monitor.stop();
        plane.close().await;
    }
}
