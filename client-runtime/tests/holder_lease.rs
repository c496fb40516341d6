//! The holder lease end to end (feature `postgres`): two xAgent-side runtimes sharing one
//! PostgreSQL database (testkit's real server) against the echo Connector on 127.0.0.1. Each
//! "process" runs on its own tokio runtime with its own pool, so killing one (shutting its
//! runtime down without a word) is a crash: its socket and its database sessions vanish, its
//! lease is not given up. Real time here; the lease's rules are tested with simulated time
//! in `src/lease.rs` and the store contract suite.
#![cfg(feature = "postgres")]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{API_KEY, echo_config, quick_backoff, signed_in_channel};
use xagent_client_runtime::store::{
    CommitError, LeaseRequest, LeaseState, PostgresXagentStore, XagentStore,
};
use xagent_client_runtime::{
    BaseUrl, ClientConfig, ClientError, ClientEvent, ConnectionState, DataPlane, Events,
    HolderLease, next_event_matching,
};
use xagent_protocol_types::{AckStatus, ChatMessage, MessageId};
use xagent_storage_postgres::DatabaseUrl;
use xagent_testkit::postgres::TestPostgres;
use xagent_testkit::{ECHO_CARD_ID, EchoServer, inject_message, temp_state_dir};

/// One xAgent process: a runtime of its own, its store and its data plane.
struct Process {
    runtime: Option<tokio::runtime::Runtime>,
    plane: DataPlane,
    events: Events,
}

impl Process {
    /// Starts a process holding (or waiting for) the Card's lease as `holder`.
    async fn start(
        server: &EchoServer,
        url: &DatabaseUrl,
        holder: &str,
        lease: HolderLease,
    ) -> Self {
        let config = config(server, HolderLease { holder: holder.into(), ..lease });
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime for the process");
            let (plane, events) = runtime.block_on(async move {
                let store =
                    PostgresXagentStore::connect(&url, ECHO_CARD_ID).await.expect("connects");
                DataPlane::connect(config.with_store(Arc::new(store))).await.expect("starts")
            });
            Self { runtime: Some(runtime), plane, events }
        })
        .await
        .expect("the process starts")
    }

    /// The process dies: every task of its runtime is dropped at once, nothing is sent.
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

fn config(server: &EchoServer, lease: HolderLease) -> ClientConfig {
    let base = BaseUrl::parse(&server.base_url()).expect("base url");
    let mut config = echo_config(base).with_holder_lease(lease);
    config.backoff = quick_backoff(Duration::from_millis(200));
    config
}

/// Renewed every 200 ms, lasting 1 s: a dead holder is replaced within about 1.2 s.
fn quick_lease() -> HolderLease {
    HolderLease {
        holder: String::new(),
        renew_every: Duration::from_millis(200),
        ttl: Duration::from_secs(1),
    }
}

async fn online(plane: &DataPlane, within: Duration) {
    tokio::time::timeout(within, plane.connected()).await.expect("online in time").expect("online");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_rule_one_of_two_processes_holds_the_socket_and_the_other_takes_over_the_outbox() {
    let server = EchoServer::start(&temp_state_dir("lease-takeover"), API_KEY, None)
        .await
        .expect("echo starts");
    let url = TestPostgres::shared().await.fresh_database().await;
    let mut a = Process::start(&server, &url, "process-a", quick_lease()).await;
    online(&a.plane, Duration::from_secs(10)).await;
    let mut b = Process::start(&server, &url, "process-b", quick_lease()).await;
    // B stands by for well past a lease's lifetime: A keeps renewing, so B never connects.
    let connected = next_event_matching(&mut b.events, Duration::from_millis(2_500), |e| {
        matches!(e, ClientEvent::Connected { .. })
    })
    .await;
    assert!(connected.is_none(), "only the holder connects");
    assert_eq!(b.plane.state(), ConnectionState::Standby { holder: Some("process-a".into()) });

    // A opens a channel and queues five messages the Connector is slow to take: when A dies,
    // they are stored but not all acknowledged.
    let channel = signed_in_channel(&a.plane).await;
    server.echo.set_delivery_delay(&channel, Some(Duration::from_millis(800)));
    let ids: Vec<String> = (1..=5).map(|i| format!("msg_{i}")).collect();
    for id in &ids {
        a.plane
            .send_chat_message(
                &channel,
                ChatMessage::text(MessageId::new(id.as_str()), id.as_str()),
            )
            .await
            .expect("queued once stored");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.kill();
    let killed = Instant::now();
    server.echo.set_delivery_delay(&channel, None);

    // B takes over within the lease's lifetime and a renewal interval (plus a reconnect).
    online(&b.plane, Duration::from_secs(5)).await;
    let failover = killed.elapsed();
    assert!(failover < Duration::from_secs(4), "took over after {failover:?}");
    // The taker reopens A's channel and delivers what A left, each message settled once.
    let mut settled = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while settled.len() < ids.len() && Instant::now() < deadline {
        let event = next_event_matching(&mut b.events, Duration::from_secs(15), |e| {
            matches!(e, ClientEvent::ChatMessageAcked { .. })
        })
        .await;
        if let Some(ClientEvent::ChatMessageAcked { ack, .. }) = event {
            assert!(matches!(ack.status, AckStatus::Accepted | AckStatus::Duplicate), "{ack:?}");
            settled.insert(ack.message_id.as_str().to_owned());
        }
    }
    assert_eq!(settled.into_iter().collect::<Vec<_>>(), ids, "nothing lost");
    let delivered: Vec<String> = server
        .echo
        .log()
        .delivered
        .iter()
        .map(|(_, message, _)| message.message_id.as_str().to_owned())
        .collect();
    let mut unique = delivered.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique, ids, "every message reached the target");
    assert_eq!(delivered.len(), ids.len(), "and none twice: {delivered:?}");

    // Inbound traffic reaches the new holder, which acknowledges it.
    inject_message(&server.server.handle(), &channel, "in_1", "hello").await.expect("injects");
    let Some(ClientEvent::ChatMessage(inbound)) =
        next_event_matching(&mut b.events, Duration::from_secs(10), |e| {
            matches!(e, ClientEvent::ChatMessage(_))
        })
        .await
    else {
        panic!("the inbound message reaches the new holder");
    };
    inbound.accept();
    b.plane.close().await;
    drop(b);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_rule_a_holder_whose_lease_was_taken_over_cannot_deliver_or_acknowledge() {
    let server = EchoServer::start(&temp_state_dir("lease-fenced"), API_KEY, None)
        .await
        .expect("echo starts");
    let url = TestPostgres::shared().await.fresh_database().await;
    // A renews rarely, so it does not learn of the takeover from a renewal: only the
    // database's refusal of its writes stops it.
    let slow = HolderLease {
        holder: String::new(),
        renew_every: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
    };
    let mut a = Process::start(&server, &url, "process-a", slow).await;
    online(&a.plane, Duration::from_secs(10)).await;
    let channel = signed_in_channel(&a.plane).await;

    // Another process takes the lease over (its clock says A's lease expired).
    let intruder = PostgresXagentStore::connect(&url, ECHO_CARD_ID).await.expect("connects");
    let far = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis(),
    )
    .expect("fits")
        + 3_600_000;
    let taken = intruder
        .acquire_lease(&LeaseRequest {
            card: ECHO_CARD_ID.into(),
            holder: "intruder".into(),
            now: far,
            ttl_ms: 60_000,
        })
        .await
        .expect("takes over");
    assert!(matches!(taken, LeaseState::Held { ref fence, .. } if fence.number == 2), "{taken:?}");

    // A stale holder cannot acknowledge: the inbound message reaches the application, but its
    // completion is refused by the database, so no `accepted` leaves and nothing is recorded.
    inject_message(&server.server.handle(), &channel, "in_fenced", "hello").await.expect("injects");
    let Some(ClientEvent::ChatMessage(inbound)) =
        next_event_matching(&mut a.events, Duration::from_secs(10), |e| {
            matches!(e, ClientEvent::ChatMessage(_))
        })
        .await
    else {
        panic!("the inbound message reaches the application");
    };
    inbound.accept();
    let lost = next_event_matching(&mut a.events, Duration::from_secs(5), |e| {
        matches!(e, ClientEvent::Disconnected { reason } if reason.contains("holder lease lost"))
    })
    .await;
    assert!(lost.is_some(), "the fenced write closes the data plane at once");
    let acked =
        intruder.lookup_completed(&channel, &MessageId::new("in_fenced")).await.expect("reads");
    assert_eq!(acked, None, "the stale holder recorded nothing");
    assert!(matches!(a.plane.state(), ConnectionState::Standby { .. }), "{:?}", a.plane.state());

    // Nor deliver: a message it is asked to send is refused before anything leaves.
    let refused = a
        .plane
        .send_chat_message(&channel, ChatMessage::text(MessageId::new("msg_fenced"), "late"))
        .await;
    assert!(
        matches!(&refused, Err(ClientError::Commit(error)) if error.is_fenced()),
        "{refused:?}"
    );
    assert!(matches!(
        refused,
        Err(ClientError::Commit(CommitError::NotHolder | CommitError::Fenced { .. }))
    ));
    assert!(intruder.load_pending().await.expect("reads").is_empty(), "nothing was queued");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(server.echo.log().delivered.is_empty(), "nothing reached the target");
    a.kill();
    server.stop().await;
}
