//! The holder lease's handover over the in-memory transport with tokio's clock paused and a
//! manual clock: two runtimes share one memory store; only the holder connects, the other
//! stands by through many renewals; a holder that closes gives the lease up, and the other
//! takes over at its next attempt, reopens the remembered channel and delivers what the first
//! left pending.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::{accept_hello_as, answer_open, config, next_of, send, start};
use xagent_client_runtime::store::{
    AdmissionSnapshot, CommitTicket, Fence, LeaseRequest, LeaseState, MemoryXagentStore,
    RememberedChannel, XagentStore, XagentWrite,
};
use xagent_client_runtime::{ClientEvent, ConnectionState, HolderLease, next_event_matching};
use xagent_profile_im::{CompletedRecord, PendingRecord, StoreError};
use xagent_protocol_types::{
    ChatMessage, ChatMessageAck, ConnectionStatus, ConnectorChannelId, ConnectorId, ManualClock,
    MessageId, Packet,
};

fn lease(holder: &str) -> HolderLease {
    HolderLease {
        holder: holder.into(),
        renew_every: Duration::from_secs(1),
        ttl: Duration::from_secs(4),
    }
}

#[tokio::test(start_paused = true)]
async fn lease_rule_a_closed_holder_hands_over_at_the_next_attempt_and_the_taker_resumes_its_outbox()
 {
    let clock = ManualClock::new(1_000);
    let store = MemoryXagentStore::new();
    let shared = |holder: &str| {
        config(&clock).with_store(Arc::new(store.clone())).with_holder_lease(lease(holder))
    };
    let (a, _a_events, _a_transport, mut a_peers) = start(shared("process-a")).await;
    let (mut a_peer, _) = accept_hello_as(&mut a_peers, "conn_1").await;
    a.connected().await.expect("the holder is online");
    let (b, mut b_events, _b_transport, mut b_peers) = start(shared("process-b")).await;
    // Ten renewals later B still stands by and has not even tried to connect.
    for _ in 0..10 {
        clock.advance(1_000);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(b_peers.try_recv().is_err(), "only the holder connects");
    assert_eq!(b.state(), ConnectionState::Standby { holder: Some("process-a".into()) });

    // A remembers a channel and sends a message the Connector never acknowledges.
    let opening = tokio::spawn({
        let a = a.clone();
        async move { a.open_channel_for("alice", None).await }
    });
    let open = next_of(&mut a_peer, "channel.open").await;
    answer_open(&a_peer, &open, "cch_1", ConnectionStatus::Connected).await;
    opening.await.expect("joins").expect("opened");
    a.remember_channel("cch_1".into()).await;
    a.send_chat_message(&"cch_1".into(), ChatMessage::text("msg_out", "reply"))
        .await
        .expect("queued once stored");
    let first = next_of(&mut a_peer, "chat.message").await;
    assert_eq!(first.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_1"));

    // A closes: its lease is given up, and B takes over within one attempt.
    a.close().await;
    let (mut b_peer, _) =
        tokio::time::timeout(Duration::from_millis(1_500), accept_hello_as(&mut b_peers, "conn_1"))
            .await
            .expect("the other process connects within one attempt");
    let reopen = next_of(&mut b_peer, "channel.open").await;
    assert_eq!(
        reopen.connector_channel_id.as_ref().map(|c| c.as_str()),
        Some("cch_1"),
        "A's channel"
    );
    answer_open(&b_peer, &reopen, "cch_1", ConnectionStatus::Connected).await;
    let again = next_of(&mut b_peer, "chat.message").await;
    assert_eq!(
        again.payload::<ChatMessage>().map(|m| m.message_id.as_str().to_owned()).as_deref(),
        Some("msg_out"),
        "A's pending message, same id"
    );
    let ack = Packet::with_payload(
        "pkt_ack_out",
        ChatMessageAck::accepted(xagent_protocol_types::MessageId::new("msg_out")),
    )
    .answering(&again);
    send(&b_peer, ack).await;
    let acked = next_event_matching(&mut b_events, Duration::from_secs(5), |e| {
        matches!(e, ClientEvent::ChatMessageAcked { .. })
    })
    .await;
    assert!(acked.is_some(), "the taker settles it");
    assert!(!b.is_pending(&"cch_1".into(), &"msg_out".into()).await);
}

/// A process whose database link breaks: the shared memory store, except that the lease
/// calls fail once `cut` is set.
struct CutOff {
    inner: MemoryXagentStore,
    cut: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl XagentStore for CutOff {
    async fn load_channels(&self) -> Result<Vec<RememberedChannel>, StoreError> {
        self.inner.load_channels().await
    }
    async fn load_connector_id(&self) -> Result<Option<ConnectorId>, StoreError> {
        self.inner.load_connector_id().await
    }
    async fn load_admission(&self) -> Result<Option<AdmissionSnapshot>, StoreError> {
        self.inner.load_admission().await
    }
    async fn load_pending(&self) -> Result<Vec<PendingRecord>, StoreError> {
        self.inner.load_pending().await
    }
    async fn lookup_completed(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError> {
        self.inner.lookup_completed(channel, message_id).await
    }
    fn commit(&self, fence: Option<Fence>, writes: Vec<XagentWrite>) -> CommitTicket {
        self.inner.commit(fence, writes)
    }
    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseState, StoreError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(StoreError::new("acquire_lease", "the database is unreachable"));
        }
        self.inner.acquire_lease(request).await
    }
    async fn renew_lease(
        &self,
        fence: &Fence,
        now: u64,
        ttl_ms: u64,
    ) -> Result<LeaseState, StoreError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(StoreError::new("renew_lease", "the database is unreachable"));
        }
        self.inner.renew_lease(fence, now, ttl_ms).await
    }
    async fn release_lease(&self, fence: &Fence) -> Result<(), StoreError> {
        self.inner.release_lease(fence).await
    }
}

#[tokio::test(start_paused = true)]
async fn lease_rule_a_holder_that_cannot_renew_closes_at_once_and_the_other_takes_over_only_after_the_expiry()
 {
    let clock = ManualClock::new(1_000);
    let store = MemoryXagentStore::new();
    let cut = Arc::new(AtomicBool::new(false));
    let a_store = CutOff { inner: store.clone(), cut: Arc::clone(&cut) };
    let a_config =
        config(&clock).with_store(Arc::new(a_store)).with_holder_lease(lease("process-a"));
    let (a, mut a_events, _a_transport, mut a_peers) = start(a_config).await;
    let (_a_peer, _) = accept_hello_as(&mut a_peers, "conn_1").await;
    a.connected().await.expect("the holder is online");
    let b_config =
        config(&clock).with_store(Arc::new(store.clone())).with_holder_lease(lease("process-b"));
    let (b, _b_events, _b_transport, mut b_peers) = start(b_config).await;
    clock.advance(1_000);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // A's last renewal was at 2,000 at the latest: the lease lasts until 6,000 at most.
    cut.store(true, Ordering::SeqCst);
    let lost = next_event_matching(&mut a_events, Duration::from_millis(1_500), |e| {
        matches!(e, ClientEvent::Disconnected { reason } if reason.contains("could not be renewed"))
    })
    .await;
    assert!(lost.is_some(), "the first failed renewal closes the data plane");
    assert!(matches!(a.state(), ConnectionState::Standby { .. }), "{:?}", a.state());
    // B does not take over while the lease row is still valid by the clock...
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(b_peers.try_recv().is_err(), "no takeover before the expiry");
    // ...and does at its first attempt after it.
    clock.advance(5_000);
    let (_b_peer, _) =
        tokio::time::timeout(Duration::from_millis(1_500), accept_hello_as(&mut b_peers, "conn_1"))
            .await
            .expect("the other process takes over after the expiry");
    b.connected().await.expect("online");
    assert!(a_peers.try_recv().is_err(), "the old holder does not come back while B renews");
}
