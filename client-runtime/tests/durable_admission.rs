//! The Card snapshot and the Skill cache xAgent keeps durably (architecture 5.1 and 10): what
//! an admission accepted is stored, a restart with the Connector unreachable still serves it,
//! and a changed Card or Skill replaces it only once it passed admission. Against a small
//! Connector on 127.0.0.1 whose documents a test changes, with the SQLite store in a state
//! directory (a restart opens the same file again).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use xagent_client_runtime::store::{SqliteXagentStore, XagentStore};
use xagent_client_runtime::{
    BaseUrl, ClientConfig, ClientError, ControlPlane, DataPlane, DurableAdmission, HealthStatus,
    admit_durably,
};
use xagent_protocol_types::{ConnectorCard, HealthResponse, Secret};
use xagent_protocol_validate::AdmissionWindow;
use xagent_testkit::temp_state_dir;

const CARD_ID: &str = "im.durable";
const SKILL: &str = "---\nname: connector-im-durable\n---\nUse durable_send.\n";

/// What the Connector serves: its Card document and its Skill.
type Documents = Arc<Mutex<(serde_json::Value, String)>>;

fn card(version: &str) -> serde_json::Value {
    serde_json::json!({
        "schema": "xagent.connector/v1",
        "protocol_version": "3.0",
        "build": {"build_time": "2607241200"},
        "connector_card_id": CARD_ID,
        "connector": {"name": "Durable", "version": version},
        "supports": {"target_types": ["im"], "profiles": ["xagent.im.v2"]},
        "tools": [{
            "tool_id": "durable_send",
            "profile": "xagent.im.v2",
            "related_skill_ids": ["connector-im-durable"],
            "input_schema": {
                "type": "object",
                "properties": {"connector_channel_id": {"type": "string"}},
                "required": ["connector_channel_id"]
            }
        }]
    })
}

fn documents(state: &Documents) -> std::sync::MutexGuard<'_, (serde_json::Value, String)> {
    state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Serves `/connector-card.json`, `/skill.md` and a `/health` agreeing with the Card.
async fn serve(state: Documents) -> BaseUrl {
    let router =
        axum::Router::new()
            .route(
                "/connector-card.json",
                get(|State(state): State<Documents>| async move {
                    axum::Json(documents(&state).0.clone())
                }),
            )
            .route(
                "/skill.md",
                get(|State(state): State<Documents>| async move { documents(&state).1.clone() }),
            )
            .route(
                "/health",
                get(|State(state): State<Documents>| async move {
                    let card: ConnectorCard = serde_json::from_value(documents(&state).0.clone())
                        .expect("the test's Card parses");
                    axum::Json(HealthResponse::for_card(&card))
                }),
            )
            .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, router).await });
    BaseUrl::parse(&format!("http://{addr}")).expect("base url")
}

/// A Base URL nothing listens on (the port was bound, then released).
async fn unreachable_base() -> BaseUrl {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("an address");
    drop(listener);
    BaseUrl::parse(&format!("http://{addr}")).expect("base url")
}

fn control(base: BaseUrl) -> ControlPlane {
    ControlPlane::new(base, Some(Secret::new("k")))
}

/// A process start: the store opened again from the state directory.
fn reopen(dir: &Path) -> SqliteXagentStore {
    SqliteXagentStore::open(dir).expect("the store opens")
}

async fn admit(base: BaseUrl, store: &dyn XagentStore) -> Result<DurableAdmission, ClientError> {
    admit_durably(&control(base), &AdmissionWindow::default(), Some(CARD_ID), store).await
}

async fn stored_version(store: &dyn XagentStore) -> Option<String> {
    let stored = store.load_admission().await.expect("loads");
    stored.and_then(|s| s.card["connector"]["version"].as_str().map(str::to_owned))
}

#[tokio::test]
async fn durable_state_rule_a_restart_with_the_connector_unreachable_still_has_the_card_and_skill()
{
    let dir = temp_state_dir("durable-unreachable");
    let never_admitted = admit(unreachable_base().await, &reopen(&dir)).await;
    assert!(
        matches!(never_admitted, Err(ClientError::Transport { .. })),
        "with nothing stored, an unreachable Connector is an error: {never_admitted:?}"
    );

    let base = serve(Arc::new(Mutex::new((card("1.0.0"), SKILL.to_owned())))).await;
    let first = admit(base, &reopen(&dir)).await.expect("admitted");
    assert!(matches!(first, DurableAdmission::Fresh(_)), "{first:?}");

    let restarted =
        admit(unreachable_base().await, &reopen(&dir)).await.expect("served from the store");
    let DurableAdmission::Stored { card, skill, unreachable } = &restarted else {
        panic!("the stored snapshot is served: {restarted:?}");
    };
    assert_eq!(card.connector_card_id.as_str(), CARD_ID);
    assert_eq!(card.connector.version, "1.0.0");
    assert_eq!(skill.as_deref(), Some(SKILL));
    assert!(unreachable.contains("connector-card.json"), "says what failed: {unreachable}");
}

#[tokio::test]
async fn durable_state_rule_a_changed_card_replaces_the_snapshot_only_after_it_passes_admission() {
    let dir = temp_state_dir("durable-changed");
    let served: Documents = Arc::new(Mutex::new((card("1.0.0"), SKILL.to_owned())));
    let base = serve(served.clone()).await;
    admit(base.clone(), &reopen(&dir)).await.expect("admitted");

    // Version 2 arrives with a Skill that leaks a secret: refused, and the stored Card and
    // Skill stay those of version 1.
    let leaky = format!("{SKILL}token ghp_abcdefghijklmnopqrstuvwxyz0123456789\n");
    *documents(&served) = (card("2.0.0"), leaky);
    let refused = admit(base.clone(), &reopen(&dir)).await;
    assert!(
        matches!(&refused, Err(ClientError::NotAdmissible(reason)) if reason.contains("skill.secret_leak")),
        "{refused:?}"
    );
    let store = reopen(&dir);
    assert_eq!(stored_version(&store).await.as_deref(), Some("1.0.0"));
    let stored = store.load_admission().await.expect("loads").expect("stored");
    assert_eq!(stored.skill.as_deref(), Some(SKILL), "the Skill cache is the admitted one");

    // Version 2 with a clean Skill passes and replaces both.
    let clean = format!("{SKILL}Version 2.\n");
    *documents(&served) = (card("2.0.0"), clean.clone());
    let fresh = admit(base, &reopen(&dir)).await.expect("admitted");
    assert_eq!(fresh.card().connector.version, "2.0.0");
    let store = reopen(&dir);
    assert_eq!(stored_version(&store).await.as_deref(), Some("2.0.0"));
    let restarted = admit(unreachable_base().await, &store).await.expect("served from the store");
    assert_eq!(
        (restarted.card().connector.version.as_str(), restarted.skill()),
        ("2.0.0", Some(clean.as_str()))
    );
}

/// Polls the store until it holds `version` (a re-admission's write lands just after the Card
/// reaches the data plane).
async fn stored_becomes(store: &dyn XagentStore, version: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stored_version(store).await.as_deref() != Some(version) {
        assert!(tokio::time::Instant::now() < deadline, "the store never held version {version}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn durable_state_rule_the_health_monitor_stores_a_readmitted_card_and_never_a_refused_one() {
    let dir = temp_state_dir("durable-monitor");
    let served: Documents = Arc::new(Mutex::new((card("1.0.0"), SKILL.to_owned())));
    let base = serve(served.clone()).await;
    let store: Arc<dyn XagentStore> = Arc::new(reopen(&dir));
    let admitted = admit(base.clone(), store.as_ref()).await.expect("admitted");
    let config = ClientConfig::for_card(base, admitted.card())
        .with_api_key(Secret::new("k"))
        .with_store(store.clone());
    let (plane, _events) = DataPlane::connect(config).await.expect("starts");
    let monitor = plane.monitor_health(Duration::from_millis(50)).expect("monitors");

    // Version 2 passes re-admission: the data plane and the store both have it.
    let clean = format!("{SKILL}Version 2.\n");
    *documents(&served) = (card("2.0.0"), clean.clone());
    let mut refreshed = monitor.refreshed();
    tokio::time::timeout(Duration::from_secs(10), refreshed.changed())
        .await
        .expect("refetched within 10 s")
        .expect("the monitor runs");
    assert_eq!(plane.card().map(|c| c.connector.version.clone()).as_deref(), Some("2.0.0"));
    stored_becomes(store.as_ref(), "2.0.0").await;

    // Version 3 with a leaking Skill is refused: the monitor reports it, the store keeps 2.
    let leaky = format!("{SKILL}token ghp_abcdefghijklmnopqrstuvwxyz0123456789\n");
    *documents(&served) = (card("3.0.0"), leaky);
    let mut status = monitor.subscribe();
    tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| {
            matches!(s, HealthStatus::Offline { reason, .. } if reason.contains("skill.secret_leak"))
        }),
    )
    .await
    .expect("refused within 10 s")
    .expect("the monitor runs");
    let stored = reopen(&dir).load_admission().await.expect("loads").expect("stored");
    assert_eq!(
        (stored.card["connector"]["version"].as_str(), stored.skill.as_deref()),
        (Some("2.0.0"), Some(clean.as_str()))
    );
}
