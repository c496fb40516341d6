//! The findings of the attack run on `im.webchat` (issue 14), each reproduced over real
//! sockets on 127.0.0.1 and shown to fail now. Test names carry the finding's id.

mod support;

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use xagent_client_runtime::ClientEvent;
use xagent_protocol_types::{AuthInput, AuthStart, AuthStatus, Clock, ManualClock};

use support::{
    API_KEY, Lobby, Server, Visitor, connect, next_event, open_room, open_room_as_owner, start,
    start_with_clock, start_with_limits, temp_dir,
};

async fn post_json(server: &Server, path: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new().post(server.url(path)).json(&body).send().await.expect("request")
}

fn upload_form(
    name: &str,
    mime: &str,
    bytes: Vec<u8>,
    text: Option<String>,
) -> reqwest::multipart::Form {
    let part = reqwest::multipart::Part::bytes(bytes)
        .file_name(name.to_owned())
        .mime_str(mime)
        .expect("mime");
    let mut form = reqwest::multipart::Form::new().part("file", part);
    if let Some(text) = text {
        form = form.text("text", text);
    }
    form
}

async fn upload(visitor: &Visitor, form: reqwest::multipart::Form) -> reqwest::Response {
    visitor.request(Method::POST, "uploads").multipart(form).send().await.expect("upload")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_an_svg_with_parameters_is_a_sandboxed_download_never_inline() {
    let Lobby { server, plane, events: _events, visitor, .. } = Lobby::start("h1").await;
    let svg = br#"<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>"#;
    for declared in ["image/svg+xml;charset=utf-8", "IMAGE/SVG+XML", "text/html"] {
        let response = upload(&visitor, upload_form("x.svg", declared, svg.to_vec(), None)).await;
        assert_eq!(response.status(), 200, "{declared}");
        let entry: Value = response.json().await.expect("entry");
        let file_ref = entry["files"][0]["file_ref"].as_str().expect("file_ref").to_owned();
        let served =
            visitor.request(Method::GET, &format!("files/{file_ref}")).send().await.expect("file");
        assert_eq!(served.status(), 200);
        let header = |name: &str| {
            served.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
        };
        assert_eq!(header("content-type"), "application/octet-stream", "{declared}");
        assert!(header("content-disposition").starts_with("attachment"), "{declared}");
        assert_eq!(header("x-content-type-options"), "nosniff");
        assert!(header("content-security-policy").contains("sandbox"), "{declared}");
    }
    // A real raster image stays inline, with its bare type.
    let png =
        upload(&visitor, upload_form("p.png", "Image/PNG; x=y", b"\x89PNG\r\n".to_vec(), None))
            .await;
    let entry: Value = png.json().await.expect("entry");
    let file_ref = entry["files"][0]["file_ref"].as_str().expect("file_ref").to_owned();
    let served =
        visitor.request(Method::GET, &format!("files/{file_ref}")).send().await.expect("file");
    assert_eq!(served.headers()["content-type"], "image/png");
    assert!(served.headers()["content-disposition"].to_str().unwrap_or("").starts_with("inline"));
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_wrong_access_codes_are_throttled_per_address_with_backoff() {
    let dir = temp_dir("h2");
    let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    let server = start_with_clock(&dir, None, clock.clone()).await;
    let (plane, _events) = connect(&server).await;
    open_room(&plane, "Lobby", "code-1234").await;
    let mut statuses = Vec::new();
    for guess in 0..8 {
        let response = post_json(
            &server,
            "/chat/api/rooms/lobby/join",
            json!({"access_code": format!("guess-{guess}")}),
        )
        .await;
        statuses.push(response.status().as_u16());
    }
    assert_eq!(&statuses[..5], &[403; 5], "five free failures: {statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 403 || *s == 429), "{statuses:?}");
    let locked =
        post_json(&server, "/chat/api/rooms/lobby/join", json!({"access_code": "code-1234"})).await;
    assert_eq!(locked.status(), 429, "even the right code waits while the address is locked");
    let retry: u64 = locked.headers()["retry-after"].to_str().unwrap_or("0").parse().unwrap_or(0);
    assert!(retry >= 1);
    // The lock ends after its backoff (simulated time).
    clock.advance((retry + 1) * 1_000);
    let open =
        post_json(&server, "/chat/api/rooms/lobby/join", json!({"access_code": "code-1234"})).await;
    assert_eq!(open.status(), 200);
    // New rooms need a code that is not trivially guessed.
    let opened = plane.open_channel(None).await.expect("channel.open");
    let ack = plane
        .request(
            Some(&opened.connector_channel_id),
            AuthStart::new(xagent_connector_webchat::ROOM_FLOW).with_input(
                AuthInput::default().with("room_name", "weak").with("access_code", "1234"),
            ),
        )
        .await
        .expect("auth.start");
    assert_eq!(ack.0.status, AuthStatus::Failed);
    let _ = clock.now_millis();
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h3_the_text_of_an_upload_has_the_same_limit_as_a_message() {
    let Lobby { server, plane, events: _events, visitor, .. } = Lobby::start("h3").await;
    let long = "x".repeat(xagent_connector_webchat::MAX_TEXT_CHARS + 1);
    let response =
        upload(&visitor, upload_form("a.txt", "text/plain", b"a".to_vec(), Some(long.clone())))
            .await;
    assert_eq!(response.status(), 400);
    let message = visitor
        .request(Method::POST, "messages")
        .json(&json!({"text": long, "client_id": "c"}))
        .send()
        .await
        .expect("send");
    assert_eq!(message.status(), 400);
    let snapshot = visitor.snapshot().await;
    assert_eq!(snapshot["messages"].as_array().map(Vec::len), Some(0), "nothing was stored");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h4_signing_a_channel_in_to_a_second_room_leaves_the_first_without_it() {
    let dir = temp_dir("h4");
    let server = start(&dir, None).await;
    let (plane, mut events) = connect(&server).await;
    let channel = open_room(&plane, "One", "code-1111").await;
    let one = Visitor::join(&server, "one", "code-1111").await;
    // The same channel signs in to a second room.
    let ack = plane
        .request(
            Some(&channel),
            AuthStart::new(xagent_connector_webchat::ROOM_FLOW).with_input(
                AuthInput::default()
                    .with("room_name", "Two")
                    .with("access_code", "code-2222")
                    .with("owner_code", "owner-2222"),
            ),
        )
        .await
        .expect("auth.start");
    assert_eq!(ack.0.status, AuthStatus::Authenticated);
    let two = Visitor::join(&server, "two", "code-2222").await;
    // A reply on the channel shows in the second room only.
    plane
        .send_chat_message(&channel, xagent_protocol_types::ChatMessage::text("msg_r1", "for two"))
        .await
        .expect("reply");
    two.eventually(|s| s["messages"][0]["message_id"] == "msg_r1").await;
    let first = one.snapshot().await;
    assert_eq!(first["messages"].as_array().map(Vec::len), Some(0), "{first:#}");
    // The first room has no agent any more: its visitor is told so.
    let sent = one
        .request(Method::POST, "messages")
        .json(&json!({"text": "hello?", "client_id": "c1"}))
        .send()
        .await
        .expect("send");
    assert_eq!(sent.status(), 409);
    let none = tokio::time::timeout(Duration::from_millis(300), async {
        next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessage(_))).await
    })
    .await;
    assert!(none.is_err(), "nothing from room one reached the channel");
    plane.close().await;
    server.stop().await;
}

/// Opens an event stream and keeps it (without reading past the headers).
async fn open_stream(visitor: &Visitor) -> reqwest::Response {
    visitor.request(Method::GET, "events").send().await.expect("events")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h5_event_streams_are_capped_per_token_and_snapshots_are_bounded() {
    let Lobby { server, plane, events: _events, visitor, .. } = Lobby::start("h5").await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let stream = open_stream(&visitor).await;
        assert_eq!(stream.status(), 200);
        held.push(stream);
    }
    let refused = open_stream(&visitor).await;
    assert_eq!(refused.status(), 429, "a fifth stream of one token is refused");
    held.pop();
    // The place is freed once the server notices the closed stream.
    let mut reopened = 0;
    for _ in 0..50 {
        let stream = open_stream(&visitor).await;
        if stream.status() == 200 {
            reopened = 1;
            held.push(stream);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(reopened, 1, "a closed stream frees its place");
    drop(held);

    // 40 messages of 16,000 characters: the snapshot keeps the newest that fit 256 KiB.
    let text = "y".repeat(xagent_connector_webchat::MAX_TEXT_CHARS - 8);
    for n in 0..40 {
        visitor.send(&format!("{n} {text}"), &format!("c{n}")).await;
    }
    let snapshot = visitor.snapshot().await;
    let bytes = serde_json::to_vec(&snapshot["messages"]).expect("json").len();
    assert!(bytes <= 256 * 1024 + 1024, "snapshot of {bytes} bytes");
    let messages = snapshot["messages"].as_array().expect("messages");
    assert!(messages.len() >= 10 && messages.len() < 40, "{} messages", messages.len());
    assert!(messages.last().and_then(|m| m["text"].as_str()).is_some_and(|t| t.starts_with("39 ")));
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m8_visitor_tokens_expire_and_a_visitor_can_end_the_session() {
    let dir = temp_dir("m8");
    let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    let server = start_with_clock(&dir, None, clock.clone()).await;
    let (plane, _events) = connect(&server).await;
    open_room(&plane, "Lobby", "code-1234").await;
    let session = |visitor: &Visitor| visitor.request(Method::GET, "session").send();
    let visitor = Visitor::join(&server, "lobby", "code-1234").await;
    assert_eq!(session(&visitor).await.expect("session").status(), 200);
    clock.advance(7 * 24 * 60 * 60 * 1_000);
    assert_eq!(session(&visitor).await.expect("session").status(), 403, "expired after 7 days");

    let visitor = Visitor::join(&server, "lobby", "code-1234").await;
    let left = visitor.request(Method::DELETE, "session").send().await.expect("leave");
    assert_eq!(left.status(), 204);
    assert_eq!(session(&visitor).await.expect("session").status(), 403, "revoked");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l5_an_oversized_upload_gets_413_saying_the_file_is_too_large() {
    let Lobby { server, plane, events: _events, visitor, .. } = Lobby::start("l5").await;
    let big = vec![0u8; xagent_connector_webchat::MAX_PAGE_UPLOAD_BYTES + 1];
    let response =
        upload(&visitor, upload_form("big.bin", "application/octet-stream", big, None)).await;
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await.expect("error body");
    assert_eq!(body["error"]["code"], "payload_too_large");
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("too large"), "{body}");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l6_tokens_travel_in_a_cookie_or_header_never_in_the_url() {
    let dir = temp_dir("l6");
    let server = start(&dir, None).await;
    let (plane, _events) = connect(&server).await;
    open_room(&plane, "Lobby", "code-1234").await;
    let joined =
        post_json(&server, "/chat/api/rooms/lobby/join", json!({"access_code": "code-1234"})).await;
    assert_eq!(joined.status(), 200);
    let cookie = joined.headers()["set-cookie"].to_str().expect("cookie").to_owned();
    for part in ["wcv=", "HttpOnly", "SameSite=Strict", "Path=/chat/api/rooms/lobby/"] {
        assert!(cookie.contains(part), "{cookie} lacks {part}");
    }
    let body: Value = joined.json().await.expect("body");
    let token = body["token"].as_str().expect("token");
    let http = reqwest::Client::new();
    let in_url = http
        .get(server.url(&format!("/chat/api/rooms/lobby/events?token={token}")))
        .send()
        .await
        .expect("events");
    assert_eq!(in_url.status(), 403, "a token in the URL opens nothing");
    let pair = cookie.split(';').next().expect("name=value").to_owned();
    let by_cookie = http
        .get(server.url("/chat/api/rooms/lobby/session"))
        .header("cookie", pair.clone())
        .send()
        .await
        .expect("session");
    assert_eq!(by_cookie.status(), 200);
    // A cross-site write is refused even with the cookie.
    let cross = http
        .post(server.url("/chat/api/rooms/lobby/messages"))
        .header("cookie", pair)
        .header("origin", "https://evil.example")
        .json(&json!({"text": "hi", "client_id": "x"}))
        .send()
        .await
        .expect("send");
    assert_eq!(cross.status(), 403);
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m9_the_visitors_access_code_does_not_let_another_channel_take_the_room() {
    let dir = temp_dir("m9");
    let server = start(&dir, None).await;
    let (plane, _events) = connect(&server).await;
    let owner = open_room_as_owner(&plane, "Lobby", "code-1234", "owner-5678").await;
    let visitor = Visitor::join(&server, "lobby", "code-1234").await;
    // Another channel knowing only the visitors' code is refused.
    let intruder = plane.open_channel(None).await.expect("open").connector_channel_id;
    let ack = plane
        .request(
            Some(&intruder),
            AuthStart::new(xagent_connector_webchat::ROOM_FLOW).with_input(
                AuthInput::default().with("room_name", "Lobby").with("access_code", "code-1234"),
            ),
        )
        .await
        .expect("auth.start");
    assert_eq!(ack.0.status, AuthStatus::Failed);
    assert!(ack.0.message.unwrap_or_default().contains("owner code"));
    // The room still answers on the owner's channel.
    plane
        .send_chat_message(&owner, xagent_protocol_types::ChatMessage::text("msg_o1", "still mine"))
        .await
        .expect("reply");
    visitor.eventually(|s| s["messages"][0]["message_id"] == "msg_o1").await;
    // The owner changes the access code: existing visitor sessions end.
    let rotate = plane.open_channel(None).await.expect("open").connector_channel_id;
    let ack = plane
        .request(
            Some(&rotate),
            AuthStart::new(xagent_connector_webchat::ROOM_FLOW).with_input(
                AuthInput::default()
                    .with("room_name", "Lobby")
                    .with("access_code", "code-9999")
                    .with("owner_code", "owner-5678"),
            ),
        )
        .await
        .expect("auth.start");
    assert_eq!(ack.0.status, AuthStatus::Authenticated);
    let session = visitor.request(Method::GET, "session").send().await.expect("session");
    assert_eq!(session.status(), 403, "the old session ended with the old code");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m2_a_page_upload_is_written_to_the_file_store_while_it_arrives() {
    let Lobby { dir, server, plane, events: _events, visitor, .. } = Lobby::start("m2").await;
    let boundary = "m2-boundary-7f3a";
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    let request = visitor
        .request(Method::POST, "uploads")
        .header("content-type", format!("multipart/form-data; boundary={boundary}"))
        .body(reqwest::Body::wrap_stream(body))
        .send();
    let response = tokio::spawn(request);
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    );
    tx.send(Ok(head.into_bytes())).await.expect("head");
    for _ in 0..4 {
        tx.send(Ok(vec![7u8; 1024 * 1024])).await.expect("chunk");
    }
    // Half the file is sent and the request is still open: its bytes are already on disk.
    let files = dir.join("files");
    let mut on_disk = 0;
    for _ in 0..100 {
        on_disk = std::fs::read_dir(&files)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".part"))
                    .filter_map(|e| e.metadata().ok().map(|m| m.len()))
                    .sum::<u64>()
            })
            .unwrap_or(0);
        if on_disk >= 3 * 1024 * 1024 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(on_disk >= 3 * 1024 * 1024, "only {on_disk} bytes on disk while the upload runs");
    for _ in 0..4 {
        tx.send(Ok(vec![7u8; 1024 * 1024])).await.expect("chunk");
    }
    tx.send(Ok(format!("\r\n--{boundary}--\r\n").into_bytes())).await.expect("tail");
    drop(tx);
    let response = response.await.expect("task").expect("response");
    assert_eq!(response.status(), 200);
    let entry: Value = response.json().await.expect("entry");
    assert_eq!(entry["files"][0]["byte_size"], 8 * 1024 * 1024);
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m3_a_rooms_daily_upload_quota_gives_507_and_leaves_the_store_to_xagent() {
    let dir = temp_dir("m3");
    let mut limits = xagent_connector_webchat::VisitorLimits::default();
    limits.room_upload_bytes_per_day = 1_000;
    let server = start_with_limits(&dir, limits).await;
    let (plane, _events) = connect(&server).await;
    let channel = open_room(&plane, "Lobby", "code-1234").await;
    let visitor = Visitor::join(&server, "lobby", "code-1234").await;
    let first =
        upload(&visitor, upload_form("a.bin", "application/octet-stream", vec![1; 600], None))
            .await;
    assert_eq!(first.status(), 200);
    let second =
        upload(&visitor, upload_form("b.bin", "application/octet-stream", vec![2; 600], None))
            .await;
    assert_eq!(second.status(), 507, "the room's allowance for the day is used up");
    let body: Value = second.json().await.expect("error body");
    assert_eq!(body["error"]["code"], "capacity_exceeded");
    // xAgent's uploads are not affected by the visitors' quota.
    let control = xagent_client_runtime::ControlPlane::new(
        server.base(),
        Some(xagent_protocol_types::Secret::new(API_KEY)),
    );
    let uploaded =
        control.upload(&channel, "agent.bin", "application/octet-stream", vec![3u8; 4_000]).await;
    assert!(uploaded.is_ok(), "{uploaded:?}");
    plane.close().await;
    server.stop().await;
}

/// Served under a path prefix by a proxy that strips it (docs/DEPLOY.md): the page's assets,
/// its API base and the redirects carry the prefix of the public URL, nothing escapes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_path_prefix_the_page_links_and_redirects_carry_it() {
    let dir = support::temp_dir("prefix");
    let server = support::start_under(&dir, "/connectors/webchat").await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let page =
        http.get(server.url("/chat/")).send().await.expect("page").text().await.expect("html");
    assert!(page.contains(r#"data-root="/connectors/webchat""#), "{page}");
    assert!(page.contains(r#"src="/connectors/webchat/chat/assets/app.js""#), "{page}");
    assert!(!page.contains(r#""/chat/"#), "an absolute path without the prefix: {page}");
    let home = http.get(server.url("/")).send().await.expect("redirect");
    assert_eq!(home.headers()["location"], "/connectors/webchat/chat/");
    let script = http.get(server.url("/chat/assets/app.js")).send().await.expect("js");
    let script = script.text().await.expect("text");
    let paths = script.matches("'/chat/").count();
    assert!(paths > 5, "the script's paths");
    assert_eq!(paths, script.matches("ROOT + '/chat/").count(), "every path starts with ROOT");
    server.stop().await;
}
