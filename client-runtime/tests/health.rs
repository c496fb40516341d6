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
