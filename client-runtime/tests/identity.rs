//! Durable identity and reopen after a reconnect, over the in-memory transport with tokio's
//! clock paused: a channel the Connector re-keys on reopen keeps its new id, its outbox and its
//! idempotency entries across a restart; a rebuilt Connector is recognised after a restart;
//! many remembered channels are reopened concurrently, within a bound.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::{accept_hello_as, answer_open, config, descriptor, next_of, packet, start};
use xagent_client_runtime::store::{SqliteXagentStore, XagentStore, XagentWrite};
use xagent_client_runtime::{
    ClientEvent, ConnectionState, REOPEN_CONCURRENCY, next_event_matching,
};
use xagent_protocol_types::{
    ChannelOpenAck, ChatMessage, ChatMessageAck, ConnectionStatus, ConnectorChannelId, ManualClock,
    Packet,
};

fn inbound(channel: &str) -> Value {
    json!({"schema": "xagent.connector.packet/v1", "packet_id": "pkt_in",
        "type": "chat.message", "connector_channel_id": channel,
        "payload": {"message_id": "msg_in", "text": "hello"}})
}

fn ack_status(packet: &Packet) -> Option<String> {
    packet.payload::<ChatMessageAck>().map(|a| a.status.to_string())
}

fn temp_dir() -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    std::env::temp_dir().join(format!("xagent-identity-{}-{nanos}", std::process::id()))
}

#[tokio::test(start_paused = true)]
async fn rekey_rule_a_channel_rekeyed_on_reopen_keeps_its_new_id_outbox_and_idempotency_after_a_restart()
 {
    let dir = temp_dir();
    let clock = ManualClock::new(1_000);
    {
        let store = SqliteXagentStore::open(&dir).expect("opens");
        let (plane, mut events, _transport, mut peers) =
            start(config(&clock).with_store(Arc::new(store))).await;
        let (mut peer, _) = accept_hello_as(&mut peers, "conn_1").await;
        plane.connected().await.expect("online");
        let opening = tokio::spawn({
            let plane = plane.clone();
            async move { plane.open_channel_for("alice", None).await }
        });
        let open = next_of(&mut peer, "channel.open").await;
        answer_open(&peer, &open, "cch_1", ConnectionStatus::Connected).await;
        opening.await.expect("joins").expect("opened");
        plane.remember_channel("cch_1".into()).await;
        // One inbound message accepted, one assistant message left unacknowledged.
        assert!(peer.send_json(inbound("cch_1")).await);
        let Some(ClientEvent::ChatMessage(message)) =
            next_event_matching(&mut events, Duration::from_secs(5), |e| {
                matches!(e, ClientEvent::ChatMessage(_))
            })
            .await
        else {
            panic!("the message reaches the application");
        };
        message.accept();
        let ack = next_of(&mut peer, "chat.message.ack").await;
        assert_eq!(ack_status(&ack).as_deref(), Some("accepted"));
        plane
            .send_chat_message(&"cch_1".into(), ChatMessage::text("msg_out", "reply"))
            .await
            .expect("queued");
        let first = next_of(&mut peer, "chat.message").await;
        assert_eq!(first.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_1"));
        // The connection drops; on reopen the Connector answers with a new id.
        drop(peer);
        let (mut peer, _) = accept_hello_as(&mut peers, "conn_1").await;
        let reopen = next_of(&mut peer, "channel.open").await;
        assert_eq!(reopen.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_1"));
        answer_open(&peer, &reopen, "cch_2", ConnectionStatus::Connected).await;
        // Right behind the ack, the Connector redelivers the inbound message on the new id: it
        // is already known there (the rename happened before the next frame was read).
        assert!(peer.send_json(inbound("cch_2")).await);
        let (mut again, mut ack) = (None, None);
        let both = tokio::time::timeout(Duration::from_secs(10), async {
            while again.is_none() || ack.is_none() {
                let next = packet(&peer.next_json().await.expect("the client is connected"));
                match next.type_str() {
                    "chat.message" => again = Some(next),
                    "chat.message.ack" => ack = Some(next),
                    _ => {}
                }
            }
        })
        .await;
        assert!(
            both.is_ok(),
            "the redelivered message is answered at once, not handed to the application again"
        );
        let again = again.expect("redelivered");
        assert_eq!(again.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_2"));
        assert_eq!(ack.as_ref().and_then(ack_status).as_deref(), Some("duplicate"));
        plane.close().await;
    }
    // A new process on the same state.
    let store = Arc::new(SqliteXagentStore::open(&dir).expect("reopens"));
    let remembered: Vec<ConnectorChannelId> =
        store.load_channels().await.expect("loads").into_iter().map(|c| c.channel).collect();
    assert_eq!(remembered, vec![ConnectorChannelId::new("cch_2")], "the rename is on disk");
    let (plane, mut events, _transport, mut peers) = start(config(&clock).with_store(store)).await;
    let (mut peer, _) = accept_hello_as(&mut peers, "conn_1").await;
    let reopen = next_of(&mut peer, "channel.open").await;
    assert_eq!(
        reopen.connector_channel_id.as_ref().map(|c| c.as_str()),
        Some("cch_2"),
        "the next channel.open asks for the id the Connector gave, not the orphaned one"
    );
    answer_open(&peer, &reopen, "cch_2", ConnectionStatus::Connected).await;
    // Nothing in the outbox was lost: the unacknowledged message goes out on the new id.
    let redelivered = next_of(&mut peer, "chat.message").await;
    assert_eq!(redelivered.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_2"));
    let sent = redelivered.payload::<ChatMessage>().map(|m| m.message_id.to_string());
    assert_eq!(sent.as_deref(), Some("msg_out"));
    assert_eq!(plane.directory().owner(&"cch_2".into()).as_deref(), Some("alice"));
    // The idempotency entry moved too: the redelivered inbound message is a duplicate.
    assert!(peer.send_json(inbound("cch_2")).await);
    let ack = next_of(&mut peer, "chat.message.ack").await;
    assert_eq!(ack_status(&ack).as_deref(), Some("duplicate"));
    let seen = next_event_matching(&mut events, Duration::from_secs(2), |e| {
        matches!(e, ClientEvent::ChatMessage(_))
    })
    .await;
    assert!(seen.is_none(), "accepted once only");
    plane.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(start_paused = true)]
async fn identity_rule_a_rebuilt_connector_is_reported_as_replaced_after_a_restart() {
    let dir = temp_dir();
    let clock = ManualClock::new(1_000);
    {
        let store = SqliteXagentStore::open(&dir).expect("opens");
        let (plane, _events, _transport, mut peers) =
            start(config(&clock).with_store(Arc::new(store))).await;
        let (_peer, hello) = accept_hello_as(&mut peers, "conn_1").await;
        assert!(hello.to_value().expect("encodes")["payload"].get("connector_id").is_none());
        plane.connected().await.expect("online");
        plane.close().await;
    }
    let store = SqliteXagentStore::open(&dir).expect("reopens");
    let (plane, mut events, _transport, mut peers) =
        start(config(&clock).with_store(Arc::new(store))).await;
    let (_peer, hello) = accept_hello_as(&mut peers, "conn_2").await;
    assert_eq!(
        hello.to_value().expect("encodes")["payload"]["connector_id"],
        "conn_1",
        "the restarted client resumes the stored runtime id"
    );
    let state = next_event_matching(&mut events, Duration::from_secs(5), |e| {
        matches!(e, ClientEvent::State(ConnectionState::Replaced { .. }))
    })
    .await;
    assert!(state.is_some(), "the state says replaced");
    let replaced = next_event_matching(&mut events, Duration::from_secs(5), |e| {
        matches!(e, ClientEvent::ConnectorReplaced { .. })
    })
    .await;
    match replaced {
        Some(ClientEvent::ConnectorReplaced { previous, current }) => {
            assert_eq!((previous.as_str(), current.as_str()), ("conn_1", "conn_2"));
        }
        other => panic!("a rebuilt Connector is reported after a restart: {other:?}"),
    }
    plane.connected().await.expect("online after the reopen");
    plane.close().await;
    // The new id is stored in turn.
    let store = SqliteXagentStore::open(&dir).expect("reopens");
    assert_eq!(
        store.load_connector_id().await.expect("loads").map(|c| c.to_string()).as_deref(),
        Some("conn_2")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(start_paused = true)]
async fn reopen_rule_500_remembered_channels_are_reopened_concurrently_within_the_bound() {
    const CHANNELS: usize = 500;
    const ACK_DELAY: Duration = Duration::from_millis(50);
    let clock = ManualClock::new(1_000);
    let store = SqliteXagentStore::in_memory().expect("opens");
    let writes = (0..CHANNELS)
        .map(|i| XagentWrite::SaveChannel {
            channel: format!("cch_{i}").into(),
            owner: Some("alice".into()),
        })
        .collect();
    store.commit(None, writes).await.expect("saves");
    let mut config = config(&clock).with_store(Arc::new(store));
    config.event_capacity = 4 * CHANNELS;
    let (_plane, mut events, _transport, mut peers) = start(config).await;
    let (mut peer, _) = accept_hello_as(&mut peers, "conn_1").await;
    let started = tokio::time::Instant::now();
    // The Connector answers every channel.open after 50 ms, and counts how many wait at once.
    let waiting = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let to_client = peer.to_client.clone();
    let connector = tokio::spawn({
        let (waiting, most) = (waiting.clone(), most.clone());
        async move {
            for _ in 0..CHANNELS {
                let open = next_of(&mut peer, "channel.open").await;
                let now_waiting = waiting.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now_waiting, Ordering::SeqCst);
                let (to_client, waiting) = (to_client.clone(), waiting.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(ACK_DELAY).await;
                    let channel = open.connector_channel_id.clone().expect("a channel");
                    let ack = ChannelOpenAck::new(
                        channel.clone(),
                        descriptor(channel.as_str(), ConnectionStatus::Connected),
                    );
                    let answer =
                        Packet::with_payload("pkt_open_ack", ack).answering(&open).channel(channel);
                    waiting.fetch_sub(1, Ordering::SeqCst);
                    let text = answer.to_value().expect("encodes").to_string();
                    let _ =
                        to_client.send(xagent_client_runtime::transport::Frame::Text(text)).await;
                });
            }
            peer
        }
    });
    let mut reopened = 0;
    while reopened < CHANNELS {
        let event = next_event_matching(&mut events, Duration::from_secs(30), |e| {
            matches!(
                e,
                ClientEvent::ChannelReopened { .. } | ClientEvent::ChannelReopenFailed { .. }
            )
        })
        .await;
        match event {
            Some(ClientEvent::ChannelReopened { .. }) => reopened += 1,
            other => panic!("every channel reopens: {other:?}"),
        }
    }
    let elapsed = started.elapsed();
    let _peer = connector.await.expect("joins");
    let most = most.load(Ordering::SeqCst);
    println!(
        "{CHANNELS} channels reopened in {elapsed:?} of simulated time, {most} in flight at most"
    );
    assert!(elapsed < Duration::from_millis(500), "one after another would take 25 s: {elapsed:?}");
    assert!(most <= REOPEN_CONCURRENCY, "at most {REOPEN_CONCURRENCY} in flight, saw {most}");
    assert!(most > 1, "reopened concurrently");
}

#[tokio::test(start_paused = true)]
async fn rekey_rule_a_refused_rename_changes_nothing_stored_and_the_channel_keeps_working() {
    let clock = ManualClock::new(1_000);
    let store = SqliteXagentStore::in_memory().expect("opens");
    // The id the Connector will hand out already has messages of a forgotten channel.
    let writes = vec![
        XagentWrite::SaveChannel { channel: "cch_1".into(), owner: Some("alice".into()) },
        XagentWrite::Idempotency(xagent_profile_im::IdempotencyWrite::Save(
            xagent_profile_im::CompletedRecord {
                channel: "cch_9".into(),
                message_id: "msg_old".into(),
                fingerprint: xagent_profile_im::Fingerprint::from_hex("ab"),
                completed_at: 1_000,
            },
        )),
    ];
    store.commit(None, writes).await.expect("saves");
    let (plane, mut events, _transport, mut peers) =
        start(config(&clock).with_store(Arc::new(store.clone()))).await;
    let (mut peer, _) = accept_hello_as(&mut peers, "conn_1").await;
    let reopen = next_of(&mut peer, "channel.open").await;
    answer_open(&peer, &reopen, "cch_9", ConnectionStatus::Connected).await;
    let reopened = next_event_matching(&mut events, Duration::from_secs(5), |e| {
        matches!(e, ClientEvent::ChannelReopened { .. })
    })
    .await;
    assert!(reopened.is_some(), "the channel is open again");
    // The store refused the merge: the channel is still remembered by its old id...
    let remembered: Vec<ConnectorChannelId> =
        store.load_channels().await.expect("loads").into_iter().map(|c| c.channel).collect();
    assert_eq!(remembered, vec![ConnectorChannelId::new("cch_1")]);
    // ...and in this process it works under the new one.
    assert_eq!(plane.current_channel(&"cch_1".into()).await, Some("cch_9".into()));
    plane
        .send_chat_message(&"cch_9".into(), ChatMessage::text("msg_out", "reply"))
        .await
        .expect("queued");
    let sent = next_of(&mut peer, "chat.message").await;
    assert_eq!(sent.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_9"));
    plane.close().await;
}
