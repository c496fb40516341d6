//! Two `im.webchat` replicas on one PostgreSQL database (feature `postgres`, testkit's
//! server), each with its own empty state directory: a room created through one is joined
//! through the other, a visitor session made on one opens the room on the other, the room's
//! budget of wrong access codes is one budget, and neither keeps a database on disk.
#![cfg(feature = "postgres")]

mod support;

use support::{Visitor, connect, open_room, start_on_database, temp_dir};
use xagent_connector_webchat::{VisitorLimits, WEBCHAT_DATABASE_FILE};

/// A wrong join through `server`: its status and answer.
async fn wrong_join(server: &support::Server, attempt: u32) -> (u16, String) {
    let response = reqwest::Client::new()
        .post(server.url("/chat/api/rooms/lobby/join"))
        .json(&serde_json::json!({ "access_code": format!("wrong-code-{attempt}") }))
        .send()
        .await
        .expect("join");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_rooms_sessions_and_the_wrong_code_budget() {
    let url = xagent_testkit::postgres::TestPostgres::shared().await.fresh_database().await;
    let (dir_a, dir_b) = (temp_dir("replica-state-a"), temp_dir("replica-state-b"));
    // Addresses never back off here (all tries come from 127.0.0.1): only the room's budget
    // of 4 wrong codes, refilling one an hour, limits.
    let mut limits = VisitorLimits::default();
    limits.join_free_failures = 1_000;
    limits.join_room_burst = 4;
    limits.join_room_interval_millis = 60 * 60 * 1_000;
    let a = start_on_database(&dir_a, url.clone(), limits.clone()).await;
    let b = start_on_database(&dir_b, url, limits).await;

    // xAgent signs a channel in through A: the room is created there.
    let (plane, _events) = connect(&a).await;
    let _channel = open_room(&plane, "Lobby", "code-1234").await;

    // A visitor joins through B with the room's code, and the session opens the room on A.
    let visitor = Visitor::join(&b, "lobby", "code-1234").await;
    let on_a = Visitor { base: a.url(""), ..visitor };
    let snapshot = on_a.snapshot().await;
    assert_eq!(snapshot["room_name"], "Lobby", "{snapshot:#}");
    // A message sent through A is in the history B shows.
    let sent = on_a.send("hello through a", "c-replica-1").await;
    let on_b = Visitor { base: b.url(""), ..on_a };
    let history = on_b.snapshot().await;
    let ids: Vec<&str> = history["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["message_id"].as_str())
        .collect();
    assert!(ids.contains(&sent["message_id"].as_str().expect("id")), "{history:#}");

    // Four wrong codes, alternating replicas, spend the room's one budget: the fifth is
    // refused on either, and so is the right code now (a refusal says nothing of the code).
    for attempt in 0..4 {
        let server = if attempt % 2 == 0 { &a } else { &b };
        assert_eq!(wrong_join(server, attempt).await.0, 403, "attempt {attempt}");
    }
    for server in [&a, &b] {
        let (status, body) = wrong_join(server, 9).await;
        assert_eq!(status, 429, "{body}");
        assert!(body.contains("this room had too many wrong access codes"), "{body}");
    }
    let right = reqwest::Client::new()
        .post(b.url("/chat/api/rooms/lobby/join"))
        .json(&serde_json::json!({ "access_code": "code-1234" }))
        .send()
        .await
        .expect("join");
    assert_eq!(right.status(), 429);

    // Neither replica keeps a database of its own on disk.
    for dir in [&dir_a, &dir_b] {
        for name in [WEBCHAT_DATABASE_FILE, "connector.sqlite3"] {
            assert!(!dir.join(name).exists(), "{} in {}", name, dir.display());
        }
    }
    plane.close().await;
    a.stop().await;
    b.stop().await;
    let _ = std::fs::remove_dir_all(dir_a);
    let _ = std::fs::remove_dir_all(dir_b);
}
