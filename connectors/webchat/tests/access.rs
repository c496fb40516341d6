//! Who may get in, and revocation (issue 23: F4, F5, F7, F21), over real sockets on
//! 127.0.0.1: an ended session's open stream, wrong codes from one address against the right
//! code from another, rooms without an owner code, and owner-code guessing through
//! `auth.start`.

mod support;

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use xagent_protocol_types::{AuthInput, AuthStart, AuthStatus};

use support::{Visitor, connect, open_room_as_owner, start, temp_dir};

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
        .request(
            Some(&channel),
            AuthStart::new(xagent_connector_webchat::ROOM_FLOW).with_input(input),
        )
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
