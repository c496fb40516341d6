//! Who may get in, and revocation (issue 23: F4, F5, F7, F21), over real sockets on
//! 127.0.0.1: an ended session's open stream, wrong codes from one address against the right
//! code from another, rooms without an owner code, and owner-code guessing through
//! `auth.start`.

mod support;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use xagent_client_runtime::DataPlane;
use xagent_connector_webchat::{GuessPolicy, QR_FLOW, ROOM_FLOW};
use xagent_protocol_types::{
    AuthInput, AuthLogout, AuthStart, AuthStatus, AuthStatusRequest, ConnectorChannelId,
    ManualClock,
};

use support::{
    Server, Visitor, connect, open_room, open_room_as_owner, start, start_with_clock, temp_dir,
};

/// Reads an event stream for up to `within`: whether it ended, and whether a `message` event
/// with `text` arrived on it.
async fn read_until_end(
    mut response: reqwest::Response,
    text: &str,
    within: Duration,
) -> (bool, bool) {
    let deadline = tokio::time::Instant::now() + within;
    let (mut buffer, mut saw) = (String::new(), false);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                buffer.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buffer.find("\n\n") {
                    let event: String = buffer.drain(..end + 2).collect();
                    for data in event.lines().filter_map(|l| l.strip_prefix("data:")) {
                        let value: Value = serde_json::from_str(data.trim()).unwrap_or(Value::Null);
                        if value["kind"] == "message" && value["message"]["text"] == text {
                            saw = true;
                        }
                    }
                }
            }
            Ok(Ok(None) | Err(_)) => return (true, saw),
            Err(_) => return (false, saw),
        }
    }
}

/// Opens the visitor's event stream and reads past its snapshot.
async fn open_stream(visitor: &Visitor) -> reqwest::Response {
    let mut response = visitor.request(Method::GET, "events").send().await.expect("events");
    assert_eq!(response.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(5), response.chunk())
        .await
        .expect("the snapshot arrives")
        .expect("reads")
        .expect("a first chunk");
    assert!(String::from_utf8_lossy(&first).contains("snapshot"));
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_session_loses_its_open_stream() {
    let dir = temp_dir("f4-stream");
    let server = start(&dir, None).await;
    let (plane, _events) = connect(&server).await;
    let channel = open_room_as_owner(&plane, "Desk", "desk-code-1234", "desk-owner-5678").await;

    // Leaving ends the stream the session has open, before the next message reaches it.
    let leaver = Visitor::join(&server, "desk", "desk-code-1234").await;
    let sender = Visitor::join(&server, "desk", "desk-code-1234").await;
    let stream = open_stream(&leaver).await;
    let left = leaver.request(Method::DELETE, "session").send().await.expect("leave");
    assert_eq!(left.status(), 204);
    sender.send("after the leave", "c-leave").await;
    let (ended, saw) = read_until_end(stream, "after the leave", Duration::from_secs(3)).await;
    assert!(!saw, "a message reached the stream of a session that had left");
    assert!(ended, "the stream of a session that left must end");

    // Changing the access code ends every session of the room, and their open streams.
    let old = Visitor::join(&server, "desk", "desk-code-1234").await;
    let stream = open_stream(&old).await;
    let input = AuthInput::default()
        .with("room_name", "Desk")
        .with("access_code", "desk-code-rotated")
        .with("owner_code", "desk-owner-5678");
    let ack = plane
        .request(Some(&channel), AuthStart::new(ROOM_FLOW).with_input(input))
        .await
        .expect("auth.start");
    assert_eq!(ack.0.status, AuthStatus::Authenticated, "{:?}", ack.0.message);
    let fresh = Visitor::join(&server, "desk", "desk-code-rotated").await;
    fresh.send("after the code change", "c-rotate").await;
    let (ended, saw) =
        read_until_end(stream, "after the code change", Duration::from_secs(3)).await;
    assert!(!saw, "a message reached the stream of a session the code change ended");
    assert!(ended, "the stream of a session the code change ended must end");
    // The others' streams go on.
    let stream = open_stream(&fresh).await;
    fresh.send("still here", "c-still").await;
    let (ended, saw) = read_until_end(stream, "still here", Duration::from_millis(800)).await;
    assert!(saw && !ended, "a valid session keeps its stream");
    plane.close().await;
    server.stop().await;
}

/// One join from the address `from` with `code`: its status.
async fn join_from(server: &Server, from: IpAddr, room: &str, code: &str) -> u16 {
    let http = reqwest::Client::builder().local_address(from).build().expect("client");
    http.post(server.url(&format!("/chat/api/rooms/{room}/join")))
        .json(&json!({ "access_code": code }))
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn right_code_from_another_address_gets_in_during_a_guessing_flood() {
    let dir = temp_dir("f5-flood");
    let server = start(&dir, None).await;
    let (plane, _events) = connect(&server).await;
    open_room(&plane, "Lobby", "code-1234").await;
    let attacker: IpAddr = "127.0.0.2".parse().expect("addr");
    let visitor: IpAddr = "127.0.0.1".parse().expect("addr");
    // A wrong code every 20 ms from 127.0.0.2 for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let (stop, url) = (Arc::clone(&stop), server.url("/chat/api/rooms/lobby/join"));
        tokio::spawn(async move {
            let http = reqwest::Client::builder().local_address(attacker).build().expect("client");
            let mut statuses = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            for n in 0.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                tick.tick().await;
                let status = http
                    .post(&url)
                    .json(&json!({ "access_code": format!("guess-{n}") }))
                    .send()
                    .await
                    .map_or(0, |r| r.status().as_u16());
                statuses.push(status);
            }
            statuses
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The right code from 127.0.0.1 gets in every time while the flood goes on.
    for _ in 0..15 {
        assert_eq!(join_from(&server, visitor, "lobby", "code-1234").await, 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let statuses = flood.await.expect("flood");
    let checked = statuses.iter().filter(|s| **s == 403).count();
    assert!(statuses.len() > 50, "the flood ran: {} tries", statuses.len());
    assert_eq!(checked, 6, "the attacker's five free tries and the one that locked it");
    assert!(statuses.iter().all(|s| *s == 403 || *s == 429), "{statuses:?}");
    // Its refused tries counted: the attacker is still locked out, even with the right code.
    assert_eq!(join_from(&server, attacker, "lobby", "code-1234").await, 429);
    plane.close().await;
    server.stop().await;
}

/// One `auth.start` of the room form on a new channel: its status and message.
async fn sign_in_once(
    plane: &DataPlane,
    room: &str,
    code: &str,
    owner: &str,
) -> (AuthStatus, String) {
    let channel = plane.open_channel(None).await.expect("channel.open").connector_channel_id;
    sign_in_on(plane, &channel, room, code, owner).await
}

async fn sign_in_on(
    plane: &DataPlane,
    channel: &ConnectorChannelId,
    room: &str,
    code: &str,
    owner: &str,
) -> (AuthStatus, String) {
    let mut input = AuthInput::default().with("room_name", room).with("access_code", code);
    if !owner.is_empty() {
        input = input.with("owner_code", owner);
    }
    let ack = plane
        .request(Some(channel), AuthStart::new(ROOM_FLOW).with_input(input))
        .await
        .expect("auth.start answered");
    (ack.0.status, ack.0.message.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_code_guessing_through_auth_start_is_rate_limited() {
    let dir = temp_dir("f21-sign-in");
    let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    let server = start_with_clock(&dir, None, clock.clone()).await;
    let (plane, _events) = connect(&server).await;
    open_room_as_owner(&plane, "Vault", "vault-code-1", "vault-owner-1").await;
    let policy = GuessPolicy::sign_in();
    // A fresh channel for every guess: the room's budget is what stops it.
    let mut checked = 0;
    let mut refused = Vec::new();
    for n in 0..30 {
        let (status, message) =
            sign_in_once(&plane, "Vault", "vault-code-1", &format!("guess-owner-{n}")).await;
        assert_eq!(status, AuthStatus::Failed);
        if message.contains("owner code of this room is another") {
            checked += 1;
        } else {
            refused.push(message);
        }
    }
    assert_eq!(checked, policy.room_burst, "the room's burst, then refusals: {refused:?}");
    assert!(refused.iter().all(|m| m.contains("try again in") && m.contains("for this room")));
    // A refusal is not an oracle: the right owner code is refused the same way now.
    let (status, message) = sign_in_once(&plane, "Vault", "vault-code-1", "vault-owner-1").await;
    assert_eq!(status, AuthStatus::Failed, "{message}");
    assert!(message.contains("try again in"), "{message}");
    // The budget refills: one more check per interval.
    clock.advance(policy.room_interval_millis);
    let (_, message) = sign_in_once(&plane, "Vault", "vault-code-1", "guess-owner-x").await;
    assert!(message.contains("owner code of this room is another"), "{message}");
    let (_, message) = sign_in_once(&plane, "Vault", "vault-code-1", "guess-owner-y").await;
    assert!(message.contains("try again in"), "{message}");
    // One channel guessing in another room is held back by its own backoff first.
    clock.advance(60 * 60 * 1_000);
    open_room_as_owner(&plane, "Other", "other-code-1", "other-owner-1").await;
    let guesser = plane.open_channel(None).await.expect("channel.open").connector_channel_id;
    let mut messages = Vec::new();
    for n in 0..6 {
        messages.push(
            sign_in_on(&plane, &guesser, "Other", "other-code-1", &format!("guess-other-{n}"))
                .await
                .1,
        );
    }
    let checked = messages.iter().filter(|m| m.contains("another one")).count();
    assert_eq!(checked as u32, policy.free_failures + 1, "{messages:?}");
    assert!(messages.last().is_some_and(|m| m.contains("from this channel")), "{messages:?}");
    // The right owner code after the lock: in, and the channel starts over.
    clock.advance(policy.backoff_max_millis);
    let (status, message) =
        sign_in_on(&plane, &guesser, "Other", "other-code-1", "other-owner-1").await;
    assert_eq!(status, AuthStatus::Authenticated, "{message}");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_room_requires_an_owner_code() {
    let dir = temp_dir("f7-new");
    let server = start(&dir, None).await;
    let (plane, _events) = connect(&server).await;
    let (status, message) = sign_in_once(&plane, "Desk", "desk-code-1234", "").await;
    assert_eq!(status, AuthStatus::Failed);
    assert!(message.contains("needs an owner code"), "{message}");
    let (status, _) = sign_in_once(&plane, "Desk", "desk-code-1234", "desk-owner-1234").await;
    assert_eq!(status, AuthStatus::Authenticated);
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_without_owner_code_cannot_change_hands() {
    let dir = temp_dir("f7-paired");
    let server = start(&dir, None).await;
    let (plane, _events) = connect(&server).await;
    // A room made by QR pairing has no owner code.
    let creator = plane.open_channel(None).await.expect("open").connector_channel_id;
    let started = plane.request(Some(&creator), AuthStart::new(QR_FLOW)).await.expect("start").0;
    let link = started.qr_code_text.clone().expect("link");
    let token = link.rsplit('/').next().expect("token").to_owned();
    let http = reqwest::Client::new();
    let scanned = http
        .post(server.url(&format!("/chat/api/pair/{token}/scan")))
        .json(&json!({}))
        .send()
        .await
        .expect("scan");
    assert_eq!(scanned.status(), 200);
    let confirmed: Value = http
        .post(server.url(&format!("/chat/api/pair/{token}/confirm")))
        .json(&json!({"room_name": "Paired"}))
        .send()
        .await
        .expect("confirm")
        .json()
        .await
        .expect("body");
    let code = confirmed["access_code"].as_str().expect("code").to_owned();
    let session = started.auth_session_id.clone().expect("session");
    let done = plane
        .request(Some(&creator), AuthStatusRequest::new(session).with_flow_id(QR_FLOW))
        .await
        .expect("status")
        .0;
    assert_eq!(done.status, AuthStatus::Authenticated);
    plane.remember_channel(creator.clone()).await;
    // The creator signs out; another channel that knows the visitors' code (and brings an
    // owner code of its own) does not get the room.
    plane.request(Some(&creator), AuthLogout::default()).await.expect("logout");
    let (status, message) = sign_in_once(&plane, "Paired", &code, "intruder-owner-1").await;
    assert_eq!(status, AuthStatus::Failed, "{message}");
    let (status, _) = sign_in_once(&plane, "Paired", &code, "").await;
    assert_eq!(status, AuthStatus::Failed);
    // The creator's channel comes back with the visitors' code, and sets an owner code.
    let (status, message) = sign_in_on(&plane, &creator, "Paired", &code, "creator-owner-1").await;
    assert_eq!(status, AuthStatus::Authenticated, "{message}");
    // From then on, that owner code (and only it) moves the room.
    let (status, _) = sign_in_once(&plane, "Paired", &code, "intruder-owner-1").await;
    assert_eq!(status, AuthStatus::Failed);
    let (status, _) = sign_in_once(&plane, "Paired", &code, "creator-owner-1").await;
    assert_eq!(status, AuthStatus::Authenticated);
    plane.close().await;
    server.stop().await;
}
