//! Caps and quotas of the second attack run (issue 23): what one visitor address or one room may
//! take of what every visitor shares. Over real sockets on 127.0.0.1; an attacker's own address
//! is another loopback address (127.0.0.2), which Linux routes to the same listener.

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use xagent_connector_webchat::VisitorLimits;
use xagent_protocol_types::ManualClock;

use support::{Server, Visitor, connect, open_room, start_with_clock, start_with_limits, temp_dir};

const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// An HTTP client whose connections come from `address`.
fn client_from(address: IpAddr) -> reqwest::Client {
    reqwest::Client::builder().local_address(address).build().expect("client")
}

/// Joins `room` from `http`'s address: the status and, on success, the visitor.
async fn join_from(
    http: &reqwest::Client,
    server: &Server,
    room: &str,
    code: &str,
) -> (u16, Option<Visitor>, Value) {
    let response = http
        .post(server.url(&format!("/chat/api/rooms/{room}/join")))
        .json(&json!({ "access_code": code }))
        .send()
        .await
        .expect("join");
    let status = response.status().as_u16();
    let retry_after =
        response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let visitor = body["token"].as_str().map(|token| Visitor {
        http: http.clone(),
        base: server.url(""),
        room: room.into(),
        token: token.into(),
    });
    let mut body = body;
    if let Some(wait) = retry_after {
        body["retry_after"] = wait.into();
    }
    (status, visitor, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_a_rooms_streams() {
    let dir = temp_dir("load-streams");
    let limits = VisitorLimits::default();
    let server = start_with_limits(&dir, limits.clone()).await;
    let (plane, _events) = connect(&server).await;
    open_room(&plane, "Lobby", "code-1234").await;
    // The attacker joins 16 times from 127.0.0.2 and opens every stream it can (4 a session).
    let attacker = client_from(ATTACKER);
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..16 {
        let (status, visitor, _) = join_from(&attacker, &server, "lobby", "code-1234").await;
        assert_eq!(status, 200);
        let visitor = visitor.expect("visitor");
        for _ in 0..4 {
            let stream = visitor.request(Method::GET, "events").send().await.expect("events");
            if stream.status() == 200 {
                held.push(stream);
            } else {
                assert_eq!(stream.status(), 429);
                refused += 1;
            }
        }
    }
    assert_eq!(held.len(), limits.streams_per_address, "the address holds its cap, no more");
    assert_eq!(refused, 64 - limits.streams_per_address);
    // A visitor from 127.0.0.1 still gets a stream in the same room.
    let visitor = Visitor::join(&server, "lobby", "code-1234").await;
    let stream = visitor.request(Method::GET, "events").send().await.expect("events");
    assert_eq!(stream.status(), 200, "another address is not locked out");
    drop(held);
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_per_address_are_limited() {
    let dir = temp_dir("load-joins");
    let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    let server = start_with_clock(&dir, None, clock.clone()).await;
    let (plane, _events) = connect(&server).await;
    open_room(&plane, "Lobby", "code-1234").await;
    let burst = VisitorLimits::default().joins_per_address_burst;
    let attacker = client_from(ATTACKER);
    for n in 0..burst {
        let (status, _, _) = join_from(&attacker, &server, "lobby", "code-1234").await;
        assert_eq!(status, 200, "join {n} of the burst");
    }
    let (status, _, body) = join_from(&attacker, &server, "lobby", "code-1234").await;
    assert_eq!(status, 429, "the burst is spent: {body}");
    assert_eq!(body["error"]["code"], "capacity_exceeded");
    assert_eq!(body["retry_after"], "1", "one join a second comes back");
    // Another address is not affected.
    let (status, _, _) = join_from(&reqwest::Client::new(), &server, "lobby", "code-1234").await;
    assert_eq!(status, 200);
    // The rate refills with time: one join per second (60 a minute).
    clock.advance(1_000);
    let (status, _, _) = join_from(&attacker, &server, "lobby", "code-1234").await;
    assert_eq!(status, 200);
    let (status, _, _) = join_from(&attacker, &server, "lobby", "code-1234").await;
    assert_eq!(status, 429);
    clock.advance(60_000);
    for _ in 0..burst {
        let (status, _, _) = join_from(&attacker, &server, "lobby", "code-1234").await;
        assert_eq!(status, 200, "a quiet minute gives the whole burst back");
    }
    plane.close().await;
    server.stop().await;
}

/// A multipart body with one small file.
fn file_form(name: &str, bytes: Vec<u8>) -> reqwest::multipart::Form {
    let part = reqwest::multipart::Part::bytes(bytes)
        .file_name(name.to_owned())
        .mime_str("application/octet-stream")
        .expect("mime");
    reqwest::multipart::Form::new().part("file", part)
}

async fn upload(visitor: &Visitor, name: &str, bytes: Vec<u8>) -> u16 {
    let response = visitor
        .request(Method::POST, "uploads")
        .multipart(file_form(name, bytes))
        .send()
        .await
        .expect("upload");
    response.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_room_cannot_use_up_the_daily_file_quota() {
    let dir = temp_dir("load-share");
    // 40 visitor files a day for everybody; a room's share is 10 %: 4 files.
    let mut limits = VisitorLimits::default();
    limits.visitor_upload_files_per_day = 40;
    limits.room_upload_share_percent = 10;
    let server = start_with_limits(&dir, limits).await;
    let (plane, _events) = connect(&server).await;
    // Someone with four rooms' codes uploads until each room refuses.
    let mut accepted = 0;
    for room in ["one", "two", "three", "four"] {
        open_room(&plane, room, "code-1234").await;
        let visitor = Visitor::join(&server, room, "code-1234").await;
        for n in 0..40 {
            match upload(&visitor, &format!("{n}.bin"), vec![1; 16]).await {
                200 => accepted += 1,
                507 => break,
                other => panic!("upload answered {other}"),
            }
        }
    }
    assert_eq!(accepted, 16, "four files in each of four rooms");
    // Every other room still takes files today.
    open_room(&plane, "Victim", "code-5678").await;
    let victim = Visitor::join(&server, "victim", "code-5678").await;
    assert_eq!(upload(&victim, "mine.bin", vec![2; 16]).await, 200);
    plane.close().await;
    server.stop().await;
}

/// An upload whose file arrives in two parts: the first now, the rest when `go` fires.
async fn held_upload(
    visitor: &Visitor,
    name: &str,
    size: usize,
    go: tokio::sync::watch::Receiver<bool>,
) -> u16 {
    let first = bytes_chunk(size / 2);
    let rest = bytes_chunk(size - size / 2);
    let body = futures_util::stream::unfold((0, go), move |(step, mut go)| {
        let (first, rest) = (first.clone(), rest.clone());
        async move {
            match step {
                0 => Some((Ok::<_, std::io::Error>(first), (1, go))),
                1 => {
                    let _ = go.wait_for(|ready| *ready).await;
                    Some((Ok(rest), (2, go)))
                }
                _ => None,
            }
        }
    });
    let part = reqwest::multipart::Part::stream(reqwest::Body::wrap_stream(body))
        .file_name(name.to_owned())
        .mime_str("application/octet-stream")
        .expect("mime");
    let form = reqwest::multipart::Form::new().part("file", part);
    match visitor.request(Method::POST, "uploads").multipart(form).send().await {
        Ok(response) => response.status().as_u16(),
        Err(_) => 0,
    }
}

fn bytes_chunk(size: usize) -> Vec<u8> {
    vec![7u8; size]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_uploads_cannot_exceed_the_room_quota() {
    let dir = temp_dir("load-race");
    const KIB: u64 = 1024;
    let mut limits = VisitorLimits::default();
    limits.room_upload_bytes_per_day = 1024 * KIB;
    limits.room_upload_files_per_day = 5;
    limits.room_upload_share_percent = 100;
    limits.max_upload_bytes = 300 * KIB;
    limits.concurrent_uploads = 8;
    let server = start_with_limits(&dir, limits).await;
    let (plane, _events) = connect(&server).await;
    open_room(&plane, "Lobby", "code-1234").await;
    let visitor = Arc::new(Visitor::join(&server, "lobby", "code-1234").await);
    // Eight uploads of 200 KiB start together and all stop half-way, past the quota check.
    let (go, ready) = tokio::sync::watch::channel(false);
    let mut uploads = Vec::new();
    for n in 0..8 {
        let (visitor, ready) = (Arc::clone(&visitor), ready.clone());
        uploads.push(tokio::spawn(async move {
            held_upload(&visitor, &format!("{n}.bin"), 200 * 1024, ready).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    go.send_replace(true);
    let mut statuses = Vec::new();
    for upload in uploads {
        statuses.push(upload.await.expect("task"));
    }
    let accepted = statuses.iter().filter(|s| **s == 200).count() as u64;
    // 507, or the connection closed after an early 507 (0): refused either way.
    assert!(statuses.iter().all(|s| matches!(s, 200 | 507 | 0)), "{statuses:?}");
    assert!(accepted * 200 * KIB <= 1024 * KIB, "{accepted} files of 200 KiB: {statuses:?}");
    assert!(accepted <= 5, "{statuses:?}");
    assert!(accepted >= 1, "{statuses:?}");
    // What the refused and unfinished uploads had reserved is free again.
    let left = 1024 * KIB - accepted * 200 * KIB;
    let next = upload(&visitor, "after.bin", vec![3; 100 * 1024]).await;
    assert_eq!(next, if left >= 100 * KIB { 200 } else { 507 }, "{left} bytes left");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visitor_files_are_not_cached() {
    let dir = temp_dir("load-cache");
    let server = start_with_limits(&dir, VisitorLimits::default()).await;
    let (plane, _events) = connect(&server).await;
    open_room(&plane, "Lobby", "code-1234").await;
    let visitor = Visitor::join(&server, "lobby", "code-1234").await;
    let response = visitor
        .request(Method::POST, "uploads")
        .multipart(file_form("notes.txt", b"private".to_vec()))
        .send()
        .await
        .expect("upload");
    assert_eq!(response.status(), 200);
    let entry: Value = response.json().await.expect("entry");
    let file_ref = entry["files"][0]["file_ref"].as_str().expect("file_ref").to_owned();
    let served =
        visitor.request(Method::GET, &format!("files/{file_ref}")).send().await.expect("file");
    assert_eq!(served.status(), 200);
    let header = |name: &str| {
        served.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
    };
    assert_eq!(header("cache-control"), "no-store");
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert!(header("content-disposition").starts_with("attachment"));
    assert!(header("content-security-policy").contains("sandbox"));
    plane.close().await;
    server.stop().await;
}
