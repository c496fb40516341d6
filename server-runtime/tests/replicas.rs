//! Replicas of one Connector on one PostgreSQL database (testkit's server), over real sockets:
//! the data-plane lease with its fencing number (a replica whose lease was taken over can no
//! longer acknowledge, and its sockets close), a message written on replica A for a channel
//! whose socket is on replica B reaching xAgent exactly once, channel rows and author
//! broadcasts reaching the other replica, and `/ready`.
#![cfg(feature = "postgres")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use xagent_protocol_types::{
    AckStatus, ChatMessage, ChatMessageAck, ConnectionStatus, ConnectorChannelId, ManualClock,
    MessageId, Packet, Secret,
};
use xagent_server_runtime::ops::DatabaseUrl;
use xagent_server_runtime::storage::{
    ClusterStorage, DATA_PLANE_LEASE, PostgresStorage, Storage, ToolCallRecord,
};
use xagent_server_runtime::{ConnectorServer, RuntimeConfig};
use xagent_testkit::postgres::TestPostgres;
use xagent_testkit::{Received, Serving, WsClient, echo_connector};

const API_KEY: &str = "sk-replicas-7d2e41c09b";
const START: u64 = 1_790_000_000_000;

/// One replica: the echo Connector serving on 127.0.0.1:0 over the shared database.
struct Replica {
    echo: xagent_testkit::EchoState,
    server: ConnectorServer,
    addr: SocketAddr,
    clock: ManualClock,
    serving: Serving,
}

impl Replica {
    async fn start(url: &DatabaseUrl) -> Self {
        let (connector, echo) = echo_connector();
        let clock = ManualClock::new(START);
        let server = ConnectorServer::builder(connector)
            .config(RuntimeConfig::default())
            .database_url(url.clone())
            .clock(clock.clone())
            .api_key(Secret::new(API_KEY))
            .build()
            .await
            .expect("a replica starts on the shared database");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let running = server.clone();
        let serving = Serving::spawn(listener, |listener, shutdown| async move {
            let _ = running.serve(listener, shutdown).await;
        });
        Self { echo, server, addr: serving.addr, clock, serving }
    }

    async fn client(&self) -> WsClient {
        WsClient::connect(&format!("ws://{}/ws", self.addr), Some(API_KEY)).await.expect("connects")
    }

    async fn stop(self) {
        self.serving.stop().await;
    }
}

/// A consumer start that counts how many run (its stop counts down).
fn counting(
    count: &Arc<std::sync::atomic::AtomicUsize>,
) -> impl Fn() -> xagent_server_runtime::StopFn + Send + Sync + 'static {
    use std::sync::atomic::Ordering;
    let count = Arc::clone(count);
    move || {
        count.fetch_add(1, Ordering::SeqCst);
        let count = Arc::clone(&count);
        Box::new(move || {
            count.fetch_sub(1, Ordering::SeqCst);
        })
    }
}

/// Waits (bounded) until `check` holds.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{what} did not happen within 5 s");
}

/// Reads until the socket closes; returns the close code.
async fn closed(client: &mut WsClient) -> Option<u16> {
    loop {
        if let Received::Closed(code) = client.recv().await {
            return code;
        }
    }
}

async fn shared_database() -> DatabaseUrl {
    TestPostgres::shared().await.fresh_database().await
}

/// Replicas A and B on a fresh database, xAgent's socket on B with one channel signed in, and
/// A aware of it.
async fn signed_in_on_b() -> (DatabaseUrl, Replica, Replica, WsClient, ConnectorChannelId) {
    let url = shared_database().await;
    let a = Replica::start(&url).await;
    let b = Replica::start(&url).await;
    let mut xagent = b.client().await;
    xagent.hello(None).await;
    let (channel, _) = xagent.open_channel(None).await;
    xagent.sign_in(&channel, "tok-replicas").await;
    let on_a = a.server.handle();
    eventually("A sees the channel signed in on B", || on_a.binding(&channel).is_some()).await;
    (url, a, b, xagent, channel)
}

/// Waits (bounded) until the database holds no outbox record of `channel`: acked and removed.
async fn no_pending_rows(url: &DatabaseUrl, channel: &ConnectorChannelId) {
    let store = PostgresStorage::connect(url, Default::default()).await.expect("connects");
    for _ in 0..200 {
        if store.load_pending_of(channel).await.unwrap().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the channel's outbox records were not removed within 5 s");
}

/// The fencing number at the database: once replica B took the data-plane lease, replica A's
/// submissions (fenced with its older number) fail as a whole and store nothing, while B's
/// commit.
#[tokio::test]
async fn a_replica_whose_lease_was_taken_over_cannot_commit() {
    let url = shared_database().await;
    let open = || async {
        let inner = PostgresStorage::connect(&url, Default::default()).await.expect("connects");
        let cluster = inner.cluster().expect("PostgreSQL offers a cluster");
        let storage = ClusterStorage::new(Arc::new(inner), cluster.replica());
        (storage, cluster)
    };
    let (a, a_cluster) = open().await;
    let (b, b_cluster) = open().await;
    let fence_a = a_cluster.acquire(DATA_PLANE_LEASE, true, START, 5_000).await.unwrap().unwrap();
    a.set_fence(fence_a);
    let channel = ConnectorChannelId::new("cch_fenced");
    let record = |result: &str| ToolCallRecord {
        fingerprint: "f".into(),
        result: Some(serde_json::json!({ "by": result })),
        error: None,
        completed_at: START,
    };
    a.commit_tool_call(&channel, "k-a1", &record("a")).committed().await.expect("A holds it");

    let fence_b = b_cluster.acquire(DATA_PLANE_LEASE, true, START, 5_000).await.unwrap().unwrap();
    assert!(fence_b > fence_a, "a take-over raises the fencing number");
    b.set_fence(fence_b);
    let refused = a.commit_tool_call(&channel, "k-a2", &record("a")).committed().await;
    let error = refused.expect_err("A's lease was taken over").to_string();
    assert!(error.contains("fenced"), "{error}");
    b.commit_tool_call(&channel, "k-b1", &record("b")).committed().await.expect("B holds it");
    assert!(b.load_tool_call(&channel, "k-a2").await.unwrap().is_none(), "nothing of A's stored");
    assert!(b.load_tool_call(&channel, "k-b1").await.unwrap().is_some());
    // A's renewal fails too: it learns it lost the lease even without the notification.
    assert!(!a_cluster.renew(DATA_PLANE_LEASE, fence_a, START, 5_000).await.unwrap());
    assert!(b_cluster.renew(DATA_PLANE_LEASE, fence_b, START, 5_000).await.unwrap());
}

/// End to end: xAgent's socket on replica A; when xAgent's next socket reaches replica B, A
/// closes its socket ("try again later") and B serves the channel A created.
#[tokio::test]
async fn the_old_holder_closes_its_socket_when_another_replica_takes_the_data_plane() {
    let url = shared_database().await;
    let a = Replica::start(&url).await;
    let b = Replica::start(&url).await;
    let mut on_a = a.client().await;
    let first = on_a.hello(None).await;
    let (channel, _) = on_a.open_channel(None).await;
    on_a.sign_in(&channel, "tok-replicas").await;

    let mut on_b = b.client().await;
    let second = on_b.hello(None).await;
    assert_eq!(
        xagent_testkit::payload_json(&first)["connector_id"],
        xagent_testkit::payload_json(&second)["connector_id"],
        "one runtime instance for the cluster"
    );
    assert_eq!(closed(&mut on_a).await, Some(1013), "A closes with try-again-later");
    // B serves the channel A created.
    let (reopened, _) = on_b.open_channel(Some(&channel)).await;
    assert_eq!(reopened, channel, "the channel is known on B");
    drop(on_b);
    a.stop().await;
    b.stop().await;
}

/// A message handed to replica A for a channel whose socket is on replica B reaches xAgent
/// exactly once, through B; acked, it is gone from the database.
#[tokio::test]
async fn a_message_written_on_one_replica_reaches_xagent_once_through_the_other() {
    let (url, a, b, mut xagent, channel) = signed_in_on_b().await;
    let on_a = a.server.handle();

    on_a.send_message(&channel, ChatMessage::text("from-a-1", "written on A"))
        .await
        .expect("A takes responsibility");
    let (packet, _) = xagent.wait_for("chat.message").await;
    let message: &ChatMessage = packet.payload().expect("a chat.message");
    assert_eq!(message.message_id, MessageId::new("from-a-1"));
    let ack = Packet::with_payload(xagent.id("pkt"), ChatMessageAck::accepted("from-a-1"))
        .channel(channel.clone())
        .reply_to(packet.packet_id.clone());
    xagent.send(&ack).await;
    no_pending_rows(&url, &channel).await;
    // Nothing more arrives: delivered once.
    let ping = xagent.request(xagent_protocol_types::Ping::default(), None);
    let pong = xagent.call(ping).await;
    assert_eq!(pong.type_str(), "pong");
    assert!(a.server.handle().pending_messages(&channel).is_empty(), "A keeps nothing of it");
    let _ = AckStatus::Accepted;
    a.stop().await;
    b.stop().await;
}

/// A Descriptor change made on a replica that does not hold xAgent's socket reaches xAgent:
/// the holder hears of the channel's new row and pushes `connection.descriptor.push` with it.
#[tokio::test]
async fn rule_a_descriptor_change_on_another_replica_is_pushed_by_the_socket_holder() {
    let (_url, a, b, mut xagent, channel) = signed_in_on_b().await;
    let on_a = a.server.handle();
    assert!(!on_a.is_routed(&channel), "xAgent's socket is on B");
    on_a.set_status(&channel, ConnectionStatus::Degraded).await.expect("A changes the channel");
    let pushed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let (push, _) = xagent.wait_for("connection.descriptor.push").await;
            assert_eq!(push.connector_channel_id.as_ref(), Some(&channel));
            let pushed = xagent_testkit::payload_json(&push)["connection_descriptor"].clone();
            if pushed["connection"]["status"] == "degraded" {
                return pushed;
            }
        }
    })
    .await
    .expect("B pushes the Descriptor A changed");
    let held = serde_json::to_value(b.server.handle().descriptor(&channel)).unwrap();
    assert_eq!(pushed, held, "the pushed Descriptor is the one B now holds");
    a.stop().await;
    b.stop().await;
}

/// A wake-up as another replica's commit sends it, carrying the record of `message_id`
/// (which need not be in the database: the holder does not read a carried record).
fn carried_wakeup(channel: &ConnectorChannelId, message_id: &str) -> String {
    let message = ChatMessage::text(message_id, "carried in the wake-up");
    let payload = xagent_profile_im::OutboundPayload::ChatMessage(message).to_json().unwrap();
    serde_json::json!({
        "r": "replica-elsewhere", "k": "outbox", "c": channel.as_str(), "i": [message_id],
        "p": [{ "s": 1, "b": payload, "a": 0, "t0": START, "x": START + 3_600_000, "n": 0 }],
    })
    .to_string()
}

/// The socket holder takes a record carried in a wake-up as it is (one that was never
/// written reaches xAgent), and a wake-up that comes late, about a message it already
/// delivered, does not bring that message back.
#[tokio::test]
async fn a_carried_record_is_delivered_unread_and_a_late_wakeup_cannot_bring_a_delivered_one_back()
{
    let (url, a, b, mut xagent, channel) = signed_in_on_b().await;
    let on_a = a.server.handle();
    let pool = xagent_storage_postgres::connect(&url, Default::default()).await.unwrap();
    let notify = |payload: String| {
        let pool = pool.clone();
        async move {
            let client = pool.get().await.unwrap();
            client.execute("SELECT pg_notify('xagent_server', $1)", &[&payload]).await.unwrap();
        }
    };
    let deliver = async |xagent: &mut WsClient, expected: &str| {
        let (packet, _) = xagent.wait_for("chat.message").await;
        let message: &ChatMessage = packet.payload().expect("a chat.message");
        assert_eq!(message.message_id, MessageId::new(expected));
        let ack = Packet::with_payload(xagent.id("pkt"), ChatMessageAck::accepted(expected))
            .channel(channel.clone())
            .reply_to(packet.packet_id.clone());
        xagent.send(&ack).await;
    };
    // Through the database as usual, then a record nobody wrote, carried in a wake-up.
    on_a.send_message(&channel, ChatMessage::text("from-a-1", "written on A")).await.unwrap();
    deliver(&mut xagent, "from-a-1").await;
    notify(carried_wakeup(&channel, "carried-1")).await;
    deliver(&mut xagent, "carried-1").await;
    let on_b = b.server.handle();
    eventually("B's outbox is empty", || on_b.pending_messages(&channel).is_empty()).await;
    no_pending_rows(&url, &channel).await;

    // Late wake-ups about both delivered messages, then a new one: only the new one comes.
    notify(carried_wakeup(&channel, "from-a-1")).await;
    notify(carried_wakeup(&channel, "carried-1")).await;
    notify(carried_wakeup(&channel, "carried-2")).await;
    deliver(&mut xagent, "carried-2").await;
    a.stop().await;
    b.stop().await;
}

/// An author broadcast on one replica reaches the other's subscribers (and its own).
#[tokio::test]
async fn an_author_broadcast_reaches_every_replica() {
    let url = shared_database().await;
    let a = Replica::start(&url).await;
    let b = Replica::start(&url).await;
    let mut on_b = b.server.handle().subscribe_broadcast();
    let mut on_a = a.server.handle().subscribe_broadcast();
    // The listener needs a moment to be subscribed after start.
    let mut heard = None;
    for round in 0..40 {
        a.server.handle().broadcast("room", &format!("news {round}")).await.expect("sent");
        if let Ok(Ok(event)) = tokio::time::timeout(Duration::from_millis(250), on_b.recv()).await {
            heard = Some(event);
            break;
        }
    }
    let heard = heard.expect("B hears A's broadcast");
    assert_eq!(heard.topic, "room");
    assert!(heard.message.starts_with("news "));
    let own = on_a.recv().await.expect("A hears its own");
    assert_eq!(own.topic, "room");
    let too_long = "x".repeat(xagent_server_runtime::storage::MAX_BROADCAST_MESSAGE_BYTES + 1);
    let refused = a.server.handle().broadcast("room", &too_long).await;
    assert_eq!(
        refused.expect_err("too long").code(),
        xagent_protocol_types::ErrorCode::PayloadTooLarge
    );
    a.stop().await;
    b.stop().await;
}

/// `/ready` says whether the replica reaches its database; without it, no data plane is taken.
#[tokio::test]
async fn ready_follows_the_database_and_an_unready_replica_refuses_the_data_plane() {
    let dedicated = TestPostgres::dedicated().await.expect("a PostgreSQL of its own");
    let url = dedicated.fresh_database().await;
    let a = Replica::start(&url).await;
    let ready = format!("http://{}/ready", a.addr);
    let answer = reqwest::get(&ready).await.expect("answers");
    assert_eq!(answer.status(), 200);
    dedicated.stop().await.expect("stops");
    let answer = reqwest::get(&ready).await.expect("answers");
    assert_eq!(answer.status(), 503);
    let body: serde_json::Value = answer.json().await.expect("JSON");
    assert_eq!(body["ready"], false);
    let reason = body["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("database"), "{reason}");
    assert!(!reason.contains("127.0.0.1"), "the public answer names no server: {reason}");
    let mut client = a.client().await;
    assert_eq!(closed(&mut client).await, Some(1013), "no data plane without the database");
    a.stop().await;
}

/// A replicated consumer wanted on two replicas runs on exactly one; when that replica dies
/// (its lease is no longer renewed) the other starts it, once its lease ran out (simulated
/// time: the surviving replica's clock moves past the lease's validity).
#[tokio::test]
async fn a_replicated_consumer_runs_on_one_replica_and_moves_when_it_dies() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let url = shared_database().await;
    let a = Replica::start(&url).await;
    let b = Replica::start(&url).await;
    let channel = ConnectorChannelId::new("cch_consumer");
    let (on_a, on_b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    assert!(a.server.handle().attach_replicated_consumer("poller", &channel, counting(&on_a)));
    eventually("A runs it", || on_a.load(Ordering::SeqCst) == 1).await;
    assert!(b.server.handle().attach_replicated_consumer("poller", &channel, counting(&on_b)));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(on_b.load(Ordering::SeqCst), 0, "one replica runs it");
    assert_eq!(b.server.handle().consumer_users("poller"), 1, "wanted on B all the same");

    a.stop().await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(on_b.load(Ordering::SeqCst), 0, "not before A's lease ran out");
    b.clock.set(START + 6_000);
    eventually("B takes it over", || on_b.load(Ordering::SeqCst) == 1).await;
    b.server.handle().detach_consumer("poller", &channel);
    assert_eq!(on_b.load(Ordering::SeqCst), 0, "stopped with its last user");
    b.stop().await;
}

/// The offline lease is one fact for the cluster: after xAgent's last socket closed and the
/// lease ran out, maintenance on both replicas unregisters the runtime instance exactly once
/// (the author's sign-out runs once, the rows are gone, the `connector_id` is cleared).
#[tokio::test]
async fn the_offline_lease_is_claimed_by_exactly_one_replica() {
    let url = shared_database().await;
    let a = Replica::start(&url).await;
    let b = Replica::start(&url).await;
    let mut xagent = a.client().await;
    xagent.hello(None).await;
    let (channel, _) = xagent.open_channel(None).await;
    xagent.sign_in(&channel, "tok-replicas").await;
    xagent.close().await;
    let store = PostgresStorage::connect(&url, Default::default()).await.expect("connects");
    let cluster = store.cluster().expect("a cluster");
    for _ in 0..200 {
        if cluster.lease(DATA_PLANE_LEASE).await.unwrap().holder.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(cluster.lease(DATA_PLANE_LEASE).await.unwrap().holder.is_none(), "released");
    // Not yet: the lease runs an hour.
    tokio::join!(a.server.tick(), b.server.tick());
    assert!(store.load_channel(&channel).await.unwrap().is_some());
    let later = START + RuntimeConfig::default().lease.as_millis() as u64 + 1;
    a.clock.set(later);
    b.clock.set(later);
    tokio::join!(a.server.tick(), b.server.tick());
    assert!(store.load_channel(&channel).await.unwrap().is_none(), "the channel is gone");
    assert!(store.load_connector_id().await.unwrap().is_none(), "the instance is gone");
    let signed_out = a.echo.log().signed_out.len() + b.echo.log().signed_out.len();
    assert_eq!(signed_out, 1, "unregistered once, by one replica");
    a.stop().await;
    b.stop().await;
}

/// A consumer that follows the data plane runs where xAgent's socket is, and moves with it:
/// stopped on the replica the data plane left, started on the one it reached.
#[tokio::test]
async fn a_data_plane_consumer_moves_with_xagents_socket() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let url = shared_database().await;
    let a = Replica::start(&url).await;
    let b = Replica::start(&url).await;
    let channel = ConnectorChannelId::new("cch_device");
    let (on_a, on_b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    a.server.handle().attach_data_plane_consumer("device:d1", &channel, counting(&on_a));
    b.server.handle().attach_data_plane_consumer("device:d1", &channel, counting(&on_b));
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(on_a.load(Ordering::SeqCst) + on_b.load(Ordering::SeqCst), 0, "no data plane yet");

    let mut on_a_socket = a.client().await;
    on_a_socket.hello(None).await;
    eventually("A runs it beside the data plane", || on_a.load(Ordering::SeqCst) == 1).await;
    assert_eq!(on_b.load(Ordering::SeqCst), 0);

    let mut on_b_socket = b.client().await;
    on_b_socket.hello(None).await;
    eventually("it left A", || on_a.load(Ordering::SeqCst) == 0).await;
    eventually("it moved to B", || on_b.load(Ordering::SeqCst) == 1).await;
    assert_eq!(closed(&mut on_a_socket).await, Some(1013));
    drop(on_b_socket);
    a.stop().await;
    b.stop().await;
}
