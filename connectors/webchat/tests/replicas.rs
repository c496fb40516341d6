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

/// The data of the next server-sent event of a page's stream (`buffer` keeps what arrived
/// after it), waiting at most 10 s.
async fn next_sse(response: &mut reqwest::Response, buffer: &mut String) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            if let Some(line) = event.lines().find(|l| l.starts_with("data: ")) {
                return serde_json::from_str(&line["data: ".len()..]).expect("JSON event");
            }
            continue;
        }
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .expect("an event within 10 s")
            .expect("the stream reads")
            .expect("the stream is open");
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_one_replica_sees_the_agents_reply_and_a_visitors_message_made_on_the_other() {
    use xagent_connector_webchat::TOOL_MESSAGE_SEND;
    use xagent_protocol_types::{ToolInvoke, ToolInvokeAck, ToolInvokeContext};

    let url = xagent_testkit::postgres::TestPostgres::shared().await.fresh_database().await;
    let (dir_a, dir_b) = (temp_dir("replica-live-a"), temp_dir("replica-live-b"));
    let a = start_on_database(&dir_a, url.clone(), VisitorLimits::default()).await;
    let b = start_on_database(&dir_b, url, VisitorLimits::default()).await;
    // xAgent's socket is on B; the page is open on A.
    let (plane, _events) = connect(&b).await;
    let channel = open_room(&plane, "Lobby", "code-1234").await;
    let page = Visitor::join(&a, "lobby", "code-1234").await;
    let mut stream =
        page.request(reqwest::Method::GET, "events").send().await.expect("events on a");
    assert_eq!(stream.status(), 200);
    let mut buffer = String::new();
    let snapshot = next_sse(&mut stream, &mut buffer).await;
    assert_eq!(snapshot["kind"], "snapshot", "{snapshot:#}");

    // The agent's reply, a Tool call served by B, reaches the page on A.
    let serde_json::Value::Object(mut arguments) =
        serde_json::json!({"text": "the agent's reply, written on b"})
    else {
        unreachable!("an object")
    };
    arguments.insert("connector_channel_id".into(), serde_json::json!(channel.as_str()));
    let call = ToolInvoke::new(TOOL_MESSAGE_SEND, arguments)
        .with_context(ToolInvokeContext::with_call_id("call-live-1"));
    let ack: ToolInvokeAck = plane.request(Some(&channel), call).await.expect("tool call on b");
    assert!(ack.result.is_some(), "{ack:?}");
    let wanted = |event: &serde_json::Value, text: &str| {
        event["kind"] == "message" && event["message"]["text"] == text
    };
    let mut seen = next_sse(&mut stream, &mut buffer).await;
    while !wanted(&seen, "the agent's reply, written on b") {
        seen = next_sse(&mut stream, &mut buffer).await;
    }

    // Another visitor's message sent through B reaches the page on A too.
    let other = Visitor::join(&b, "lobby", "code-1234").await;
    other.send("hello from a visitor on b", "c-live-1").await;
    let mut seen = next_sse(&mut stream, &mut buffer).await;
    while !wanted(&seen, "hello from a visitor on b") {
        seen = next_sse(&mut stream, &mut buffer).await;
    }

    drop(stream);
    plane.close().await;
    a.stop().await;
    b.stop().await;
    let _ = std::fs::remove_dir_all(dir_a);
    let _ = std::fs::remove_dir_all(dir_b);
}

/// How many times xAgent's application received each message (every one is accepted).
type Received = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>;

/// Accepts every visitor message xAgent receives, counting them by id.
fn accept_all(mut events: xagent_client_runtime::Events) -> Received {
    let received = Received::default();
    let counts = received.clone();
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let xagent_client_runtime::ClientEvent::ChatMessage(inbound) = event {
                let id = inbound.message.message_id.to_string();
                *counts.lock().expect("counts").entry(id).or_default() += 1;
                inbound.accept();
            }
        }
    });
    received
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visitor_messages_the_killed_socket_holder_delivered_end_delivered_on_the_next_holder() {
    use std::time::Duration;
    use xagent_testkit::haproxy::{HaproxyOptions, TestHaproxy};

    let url = xagent_testkit::postgres::TestPostgres::shared().await.fresh_database().await;
    let (dir_a, dir_b) = (temp_dir("failover-tick-a"), temp_dir("failover-tick-b"));
    let a = start_on_database(&dir_a, url.clone(), VisitorLimits::default()).await;
    let b = support::Crashable::start(&dir_b, url).await;
    let options = HaproxyOptions::default().with_health_path("/ready").with_checks(
        Duration::from_millis(200),
        1,
        1,
    );
    let lb = TestHaproxy::start(&[a.addr, b.addr], options).await.expect("haproxy starts");
    for addr in [a.addr, b.addr] {
        lb.wait_backend_state(addr, true, Duration::from_secs(10)).await.expect("both up");
    }
    // xAgent's socket goes to B: A is out of the rotation until B is killed.
    lb.admin_command("disable server replicas/b0").await.expect("admin");
    let base = xagent_client_runtime::BaseUrl::parse(&lb.url()).expect("base");
    let (plane, events) = xagent_client_runtime::DataPlane::connect(support::client_config(base))
        .await
        .expect("the data plane starts");
    tokio::time::timeout(Duration::from_secs(10), plane.connected())
        .await
        .expect("connects in time")
        .expect("connects");
    let channel = open_room(&plane, "Lobby", "code-1234").await;
    assert!(!a.webchat.handle().is_routed(&channel), "the socket is on b");
    let received = accept_all(events);

    // A visitor on A sends a burst; B delivers it to xAgent, which accepts every message.
    let visitor = Visitor::join(&a, "lobby", "code-1234").await;
    const BURST: usize = 80;
    let sends = (0..BURST).map(|i| {
        let visitor = &visitor;
        async move { visitor.send(&format!("burst {i}"), &format!("c-burst-{i}")).await }
    });
    let sent: Vec<String> = futures_util::future::join_all(sends)
        .await
        .iter()
        .map(|m| m["message_id"].as_str().expect("id").to_owned())
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while received.lock().expect("counts").len() < BURST / 2 {
        assert!(tokio::time::Instant::now() < deadline, "xAgent got half the burst in 15 s");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // B dies halfway through the burst (acks on their way, just applied, states unwritten).
    b.crash();
    lb.admin_command("enable server replicas/b0").await.expect("admin");

    // xAgent reconnects through HAProxy to A, which takes over the channel; every message
    // xAgent has ends `delivered` on the page, none is left `sending`.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let snapshot = visitor.snapshot().await;
        let statuses: Vec<(String, String)> = snapshot["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| (m["message_id"].as_str().unwrap_or("").to_owned(), m["status"].to_string()))
            .collect();
        let sending: Vec<&(String, String)> = statuses
            .iter()
            .filter(|(id, status)| sent.contains(id) && status != "\"delivered\"")
            .collect();
        if sending.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            let counts = received.lock().expect("counts").clone();
            let unseen = sending.iter().filter(|(id, _)| !counts.contains_key(id)).count();
            panic!(
                "{} of {BURST} visitor messages are not delivered on the page ({unseen} of them \
                 never reached xAgent): {sending:?}",
                sending.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And xAgent's application had each exactly once.
    let counts = received.lock().expect("counts").clone();
    for id in &sent {
        assert_eq!(counts.get(id), Some(&1), "{id}: {counts:?}");
    }
    plane.close().await;
    a.stop().await;
    let _ = std::fs::remove_dir_all(dir_a);
    let _ = std::fs::remove_dir_all(dir_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_visitor_message_its_replica_stored_but_never_queued_reaches_xagent_through_the_holder() {
    use xagent_protocol_types::ChatMessage;

    let url = xagent_testkit::postgres::TestPostgres::shared().await.fresh_database().await;
    let (dir_a, dir_b) = (temp_dir("stranded-a"), temp_dir("stranded-b"));
    let a = start_on_database(&dir_a, url.clone(), VisitorLimits::default()).await;
    let b = start_on_database(&dir_b, url, VisitorLimits::default()).await;
    let (plane, events) = connect(&b).await;
    let _channel = open_room(&plane, "Lobby", "code-1234").await;
    let received = accept_all(events);
    let visitor = Visitor::join(&a, "lobby", "code-1234").await;

    // What A leaves when it is killed between storing a visitor's message and queueing it
    // (and is never started again): the message shows `sending`, no outbox holds it.
    let created = a.webchat.handle().now_millis().saturating_sub(60_000);
    let message =
        ChatMessage::text("msg_web_stranded_1", "stored, never queued").created_at(created);
    a.webchat
        .store_unqueued_visitor_message("lobby", &message, "c-stranded")
        .await
        .expect("stored");

    // B, holding the socket, hands it to xAgent; the page shows it delivered.
    let snapshot = visitor
        .eventually(|s| {
            s["messages"].as_array().is_some_and(|messages| {
                messages
                    .iter()
                    .any(|m| m["message_id"] == "msg_web_stranded_1" && m["status"] == "delivered")
            })
        })
        .await;
    assert!(snapshot["messages"].as_array().is_some_and(|m| m.len() == 1), "{snapshot:#}");
    assert_eq!(received.lock().expect("counts").get("msg_web_stranded_1"), Some(&1));
    plane.close().await;
    a.stop().await;
    b.stop().await;
    let _ = std::fs::remove_dir_all(dir_a);
    let _ = std::fs::remove_dir_all(dir_b);
}

/// A POST of the pairing API through `server`: its status and answer.
async fn pair(server: &support::Server, token: &str, step: &str) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(server.url(&format!("/chat/api/pair/{token}/{step}")))
        .json(&serde_json::json!({}))
        .send()
        .await
        .expect("pairing request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pairing_link_made_on_one_replica_is_used_once_on_any_and_expires_on_the_clock() {
    use std::sync::Arc;
    use xagent_protocol_types::{AuthStatus, Clock, ManualClock};

    let url = xagent_testkit::postgres::TestPostgres::shared().await.fresh_database().await;
    let (dir_a, dir_b) = (temp_dir("pairing-a"), temp_dir("pairing-b"));
    let clock = ManualClock::new(a_time());
    let shared = Arc::new(clock.clone()) as Arc<dyn Clock>;
    let a = support::start_on_database_with_clock(
        &dir_a,
        url.clone(),
        VisitorLimits::default(),
        shared.clone(),
    )
    .await;
    let b =
        support::start_on_database_with_clock(&dir_b, url, VisitorLimits::default(), shared).await;
    // xAgent's socket (and the auth session) is on A.
    let (plane, _events) = connect(&a).await;
    let (channel, started) = support::qr_start(&plane).await;
    assert_eq!(started.status, AuthStatus::Pending);
    let token = support::token_of(started.qr_code_text.as_deref().expect("link"));

    // Opened through B (the load balancer sent the browser there): A's poll sees it.
    let (status, opened) = pair(&b, &token, "scan").await;
    assert_eq!(status, 200, "{opened}");
    assert_eq!(
        support::qr_status(&plane, &channel, &started, false).await.status,
        AuthStatus::Scanned
    );
    // Confirmed through B: the room is made once, and A's poll reports the sign-in.
    let (status, confirmed) = pair(&b, &token, "confirm").await;
    assert_eq!(status, 200, "{confirmed}");
    let room_id = confirmed["room_id"].as_str().expect("room").to_owned();
    // The second use is refused on A (and on B), after a confirmation on B.
    for server in [&a, &b] {
        let (status, body) = pair(server, &token, "confirm").await;
        assert_eq!(status, 410, "{body}");
        assert!(body.to_string().contains("already used"), "{body}");
    }
    let done = support::qr_status(&plane, &channel, &started, false).await;
    assert_eq!(done.status, AuthStatus::Authenticated, "{:?}", done.message);
    let descriptor = done.connection_descriptor.expect("descriptor");
    assert_eq!(descriptor.target.account_hint.as_deref(), Some(room_id.as_str()));

    // Another link expires on the shared clock: refused on B, A's poll asks for a refresh.
    let (channel, started) = support::qr_start(&plane).await;
    let token = support::token_of(started.qr_code_text.as_deref().expect("link"));
    clock.advance(xagent_connector_webchat::PAIRING_LINK_TTL_MILLIS);
    let (status, body) = pair(&b, &token, "scan").await;
    assert_eq!(status, 410, "{body}");
    assert!(body.to_string().contains("expired"), "{body}");
    assert_eq!(
        support::qr_status(&plane, &channel, &started, false).await.status,
        AuthStatus::QrRefreshRequired
    );
    plane.close().await;
    a.stop().await;
    b.stop().await;
    let _ = std::fs::remove_dir_all(dir_a);
    let _ = std::fs::remove_dir_all(dir_b);
}

/// A start time for a manual clock (now, so the records' times look ordinary).
fn a_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
