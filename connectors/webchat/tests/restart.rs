//! IM v2 delivery across a Connector restart: visitor messages xAgent has not acknowledged
//! (received but unanswered, or sent while xAgent was away) arrive exactly once after the
//! restart and reconnect, and acknowledged ones are never sent again.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use xagent_client_runtime::{ClientEvent, DataPlane, Events};

use support::{
    Lobby, Server, Visitor, client_config, connect, next_event, open_room, start, temp_dir,
};

/// Accepts every message arriving within `window` (as xAgent would) and returns their ids.
async fn accept_for(events: &mut Events, window: Duration) -> Vec<String> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + window;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return got;
        }
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Some(ClientEvent::ChatMessage(inbound))) => {
                got.push(inbound.message.message_id.to_string());
                inbound.accept();
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return got,
        }
    }
}

async fn restart(server: Server, dir: &std::path::Path) -> Server {
    let addr = server.addr;
    server.stop().await;
    start(&dir.to_path_buf(), Some(addr)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_visitor_messages_arrive_exactly_once_after_a_restart() {
    let dir = temp_dir("restart");
    let server = start(&dir, None).await;

    // xAgent signs a channel in to the room.
    let (plane, mut events) = connect(&server).await;
    let channel = open_room(&plane, "Lobby", "code-1234").await;
    let visitor = Visitor::join(&server, "lobby", "code-1234").await;

    // The first message reaches xAgent, which holds it without an answer; the outbox keeps
    // the second (IM delivery is in order per channel) until the first is acknowledged...
    let first = visitor.send("first", "c1").await;
    let second = visitor.send("second", "c2").await;
    assert_eq!(first["status"], "sending", "{first}");
    let held = match next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessage(_))).await {
        ClientEvent::ChatMessage(inbound) => inbound,
        _ => unreachable!(),
    };
    assert_eq!(held.message.message_id.as_str(), first["message_id"].as_str().unwrap_or(""));
    // ...then xAgent goes away, and a third message is sent while nobody is connected.
    plane.close().await;
    drop(held); // never answered: the socket is gone, so no ack or rejection reaches the Connector
    tokio::time::sleep(Duration::from_millis(200)).await;
    let third = visitor.send("third", "c3").await;
    assert_eq!(third["status"], "sending");

    // The Connector restarts from the same state directory on the same port.
    let server = restart(server, &dir).await;

    // xAgent comes back and reopens its channel.
    let (plane, mut events) =
        DataPlane::connect(client_config(server.base())).await.expect("the data plane starts");
    plane.connected().await.expect("reconnects");
    let reopened = plane.open_channel(Some(&channel)).await.expect("reopen");
    assert_eq!(reopened.connector_channel_id, channel, "the channel survived the restart");
    plane.remember_channel(channel.clone()).await;
    let arrived = accept_for(&mut events, Duration::from_secs(3)).await;
    let mut counts: HashMap<String, usize> = HashMap::new();
    for id in &arrived {
        *counts.entry(id.clone()).or_default() += 1;
    }
    for sent in [&first, &second, &third] {
        let id = sent["message_id"].as_str().expect("id");
        assert_eq!(counts.get(id), Some(&1), "{id} arrives exactly once: {counts:?}");
    }
    assert_eq!(arrived.len(), 3, "nothing else arrived: {counts:?}");

    // The page shows all three delivered.
    let visitor = Visitor { base: server.url(""), ..visitor };
    visitor
        .eventually(|s| {
            s["messages"]
                .as_array()
                .is_some_and(|m| m.len() == 3 && m.iter().all(|e| e["status"] == "delivered"))
        })
        .await;
    plane.close().await;

    // Another restart: acknowledged messages are never sent again.
    let server = restart(server, &dir).await;
    let (plane, mut events) =
        DataPlane::connect(client_config(server.base())).await.expect("the data plane starts");
    plane.connected().await.expect("reconnects");
    plane.open_channel(Some(&channel)).await.expect("reopen");
    let again = accept_for(&mut events, Duration::from_millis(1500)).await;
    assert!(again.is_empty(), "acknowledged messages came back: {}", again.len());
    plane.close().await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A visitor message the Connector stored just before handing it to the runtime, as if the
/// process had been killed between the two steps (M4).
fn orphan_message(message_id: &str) -> xagent_protocol_types::ChatMessage {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    xagent_protocol_types::ChatMessage::text(message_id, "stored, never queued").created_at(now)
}

/// The same, in the `webchat.sqlite3` of an older version (moved at the next start).
fn legacy_orphan(dir: &std::path::Path, message_id: &str, client_id: &str) {
    let conn = rusqlite::Connection::open(dir.join("webchat.sqlite3")).expect("database");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS messages (room_id TEXT NOT NULL,
           seq INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT NOT NULL UNIQUE,
           author TEXT NOT NULL, text TEXT, files TEXT NOT NULL, status TEXT NOT NULL,
           error TEXT, client_id TEXT, created_at INTEGER NOT NULL, outbound TEXT);",
    )
    .expect("the older version's table");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let message = xagent_protocol_types::ChatMessage::text(message_id, "stored, never queued")
        .created_at(now as u64);
    let outbound = serde_json::to_string(&message).expect("json");
    conn.execute(
        "INSERT INTO messages (room_id, message_id, author, text, files, status, client_id, created_at, outbound)
         VALUES ('lobby', ?1, 'visitor', 'stored, never queued', '[]', 'sending', ?2, ?3, ?4)",
        rusqlite::params![message_id, client_id, now, outbound],
    )
    .expect("insert");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m4_a_message_stored_but_never_queued_is_delivered_on_retry_and_after_a_restart() {
    let Lobby { dir, server, plane, mut events, channel, visitor, .. } = Lobby::start("m4").await;

    // The page repeats a send whose message was stored but never queued: it is queued now.
    server
        .webchat
        .store_unqueued_visitor_message("lobby", &orphan_message("msg_web_orphan_1"), "c-orphan-1")
        .await
        .expect("stored");
    let again = visitor.send("stored, never queued", "c-orphan-1").await;
    assert_eq!(again["message_id"], "msg_web_orphan_1");
    let arrived = accept_for(&mut events, Duration::from_secs(3)).await;
    assert_eq!(arrived, vec!["msg_web_orphan_1".to_owned()]);

    // Without a retry, the next start queues it: one stored by this version, one an older
    // version left in webchat.sqlite3 (moved to the runtime's storage at the start).
    plane.close().await;
    server
        .webchat
        .store_unqueued_visitor_message("lobby", &orphan_message("msg_web_orphan_2"), "c-orphan-2")
        .await
        .expect("stored");
    legacy_orphan(&dir, "msg_web_orphan_3", "c-orphan-3");
    let server = restart(server, &dir).await;
    let (plane, mut events) =
        DataPlane::connect(client_config(server.base())).await.expect("the data plane starts");
    plane.connected().await.expect("reconnects");
    plane.open_channel(Some(&channel)).await.expect("reopen");
    plane.remember_channel(channel.clone()).await;
    let mut arrived = accept_for(&mut events, Duration::from_secs(3)).await;
    // Moved messages keep their old order numbers, before every new one.
    arrived.sort();
    assert_eq!(arrived, vec!["msg_web_orphan_2".to_owned(), "msg_web_orphan_3".to_owned()]);
    assert!(!dir.join("webchat.sqlite3").exists(), "the older file was moved");
    assert!(dir.join("webchat.sqlite3.migrated").exists());
    plane.close().await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}
