//! `im.webchat` end to end over real sockets on 127.0.0.1: both auth flows (with their
//! negative cases), the visitor API, files both ways, streaming, activity, rejections, and
//! the Tools with repeated calls.

mod support;

use std::sync::Arc;

use reqwest::Method;
use serde_json::{Value, json};
use xagent_client_runtime::{ClientError, ClientEvent, ControlPlane};
use xagent_connector_webchat::{
    PAIRING_LINK_TTL_MILLIS, ROOM_FLOW, TOOL_FILE_SEND, TOOL_MESSAGE_SEND,
};
use xagent_protocol_types::{
    AuthInput, AuthStart, AuthStatus, ChatActivity, ChatMessage, ChatMessageDelta, Clock,
    ConnectorChannelId, ErrorCode, FileType, ManualClock, Secret, ToolInvoke, ToolInvokeAck,
    ToolInvokeContext,
};

use support::{
    API_KEY, Lobby, Server, Visitor, connect, next_event, open_room, open_room_as_owner, qr_start,
    qr_status, start, start_with_clock, temp_dir, token_of,
};

fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    let response =
        reqwest::Client::new().post(server.url(path)).json(&body).send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qr_pairing_goes_pending_scanned_authenticated_and_the_room_works() {
    let dir = temp_dir("qr");
    let server = start(&dir, None).await;
    let (plane, mut events) = connect(&server).await;
    let (channel, started) = qr_start(&plane).await;
    assert_eq!(started.status, AuthStatus::Pending);
    let link = started.qr_code_text.clone().expect("link");
    assert!(link.starts_with(&server.url("/chat/pair/")), "{link}");
    let image = started.qr_code_image.clone().expect("image");
    assert!(image.starts_with("data:image/png;base64,iVBORw0KGgo"), "a PNG data URL");
    assert!(started.expires_at.is_some_and(|at| at > now_millis()));
    assert_eq!(qr_status(&plane, &channel, &started, false).await.status, AuthStatus::Pending);

    let token = token_of(&link);
    let (status, scanned) = post(&server, &format!("/chat/api/pair/{token}/scan"), json!({})).await;
    assert_eq!(status, 200, "{scanned}");
    assert_eq!(qr_status(&plane, &channel, &started, false).await.status, AuthStatus::Scanned);

    let (status, confirmed) = post(
        &server,
        &format!("/chat/api/pair/{token}/confirm"),
        json!({"room_name": "Paired Room"}),
    )
    .await;
    assert_eq!(status, 200, "{confirmed}");
    assert_eq!(confirmed["room_id"], "paired-room");
    let done = qr_status(&plane, &channel, &started, false).await;
    assert_eq!(done.status, AuthStatus::Authenticated);
    let descriptor = done.connection_descriptor.expect("descriptor");
    assert_eq!(descriptor.target.provider, "webchat");
    assert_eq!(descriptor.connection.connector_channel_id, channel);

    // The confirming browser's token opens the room, and its messages reach xAgent.
    let visitor = Visitor {
        http: reqwest::Client::new(),
        base: server.url(""),
        room: "paired-room".into(),
        token: confirmed["token"].as_str().expect("token").into(),
    };
    visitor.send("hello from the paired room", "p1").await;
    match next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessage(_))).await {
        ClientEvent::ChatMessage(inbound) => {
            assert_eq!(inbound.channel, channel);
            assert_eq!(inbound.message.text.as_deref(), Some("hello from the paired room"));
            inbound.accept();
        }
        _ => unreachable!(),
    }
    // Others join with the access code shown once.
    let code = confirmed["access_code"].as_str().expect("code");
    Visitor::join(&server, "paired-room", code).await;

    // The link was one-time.
    let (status, body) = post(&server, &format!("/chat/api/pair/{token}/scan"), json!({})).await;
    assert_eq!(status, 410, "{body}");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_pairing_link_is_refused_and_refresh_issues_a_new_one() {
    let dir = temp_dir("qr-expiry");
    let clock = ManualClock::new(now_millis());
    let server = start_with_clock(&dir, None, Arc::new(clock.clone()) as Arc<dyn Clock>).await;
    let (plane, _events) = connect(&server).await;
    let (channel, started) = qr_start(&plane).await;
    let old = token_of(started.qr_code_text.as_deref().expect("link"));

    clock.advance(PAIRING_LINK_TTL_MILLIS);
    let (status, body) = post(&server, &format!("/chat/api/pair/{old}/scan"), json!({})).await;
    assert_eq!(status, 410, "{body}");
    assert_eq!(body["error"]["code"], "auth_session_not_found");
    assert_eq!(
        qr_status(&plane, &channel, &started, false).await.status,
        AuthStatus::QrRefreshRequired
    );

    let refreshed = qr_status(&plane, &channel, &started, true).await;
    assert_eq!(refreshed.status, AuthStatus::Pending);
    let new = token_of(refreshed.qr_code_text.as_deref().expect("new link"));
    assert_ne!(new, old);
    assert!(refreshed.expires_at.is_some_and(|at| at > clock.now_millis()));
    let (status, _) = post(&server, &format!("/chat/api/pair/{old}/scan"), json!({})).await;
    assert_eq!(status, 410, "the old link stays dead");
    let (status, _) = post(&server, &format!("/chat/api/pair/{new}/scan"), json!({})).await;
    assert_eq!(status, 200);
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_form_refuses_a_wrong_access_code_and_missing_fields() {
    let dir = temp_dir("form");
    let server = start(&dir, None).await;
    let (plane, _events) = connect(&server).await;
    open_room(&plane, "Lobby", "right-code").await;

    let other = plane.open_channel(None).await.expect("open").connector_channel_id;
    let wrong = AuthStart::new(ROOM_FLOW).with_input(
        AuthInput::default().with("room_name", "lobby").with("access_code", "wrong-code"),
    );
    let ack = plane.request(Some(&other), wrong).await.expect("answered");
    assert_eq!(ack.0.status, AuthStatus::Failed);
    assert!(!ack.0.message.unwrap_or_default().contains("right-code"));

    let short = AuthStart::new(ROOM_FLOW)
        .with_input(AuthInput::default().with("room_name", "new room").with("access_code", "abc"));
    let ack = plane.request(Some(&other), short).await.expect("answered");
    assert_eq!(ack.0.status, AuthStatus::Failed, "access codes need 4 characters");

    let missing =
        AuthStart::new(ROOM_FLOW).with_input(AuthInput::default().with("room_name", "lobby"));
    match plane.request(Some(&other), missing).await {
        Err(ClientError::Remote(error)) => assert_eq!(error.code, ErrorCode::InvalidArguments),
        other => panic!("a missing required field is invalid_arguments, got {other:?}"),
    }
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_is_served_by_one_channel_the_earlier_one_is_revoked() {
    let dir = temp_dir("move");
    let server = start(&dir, None).await;
    let (plane, mut events) = connect(&server).await;
    // Moving a room takes its owner code (M9).
    let first = open_room_as_owner(&plane, "Lobby", "code-1234", "owner-5678").await;
    let second = open_room_as_owner(&plane, "Lobby", "code-1234", "owner-5678").await;
    let pushed = next_event(
        &mut events,
        |e| matches!(e, ClientEvent::DescriptorPushed { channel, .. } if channel == &first),
    )
    .await;
    if let ClientEvent::DescriptorPushed { descriptor, .. } = pushed {
        assert_eq!(descriptor.connection.status.to_string(), "revoked");
    }
    let visitor = Visitor::join(&server, "lobby", "code-1234").await;
    visitor.send("who gets this?", "m1").await;
    match next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessage(_))).await {
        ClientEvent::ChatMessage(inbound) => {
            assert_eq!(inbound.channel, second);
            inbound.accept();
        }
        _ => unreachable!(),
    }
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visitors_need_the_access_code_and_a_token_of_that_room() {
    let dir = temp_dir("visitor-auth");
    let server = start(&dir, None).await;
    let (plane, _events) = connect(&server).await;
    open_room(&plane, "Lobby", "code-1234").await;
    open_room(&plane, "Other", "code-5678").await;

    let (status, body) =
        post(&server, "/chat/api/rooms/lobby/join", json!({"access_code": "nope"})).await;
    assert_eq!(status, 403);
    assert_eq!(body["error"]["code"], "forbidden");
    let (status, _) =
        post(&server, "/chat/api/rooms/nowhere/join", json!({"access_code": "code-1234"})).await;
    assert_eq!(status, 403, "an unknown room looks like a wrong code");

    let other = Visitor::join(&server, "other", "code-5678").await;
    let http = reqwest::Client::new();
    let cross = http
        .post(server.url("/chat/api/rooms/lobby/messages"))
        .bearer_auth(&other.token)
        .json(&json!({"text": "sneaky", "client_id": "x"}))
        .send()
        .await
        .expect("request");
    assert_eq!(cross.status(), 403, "a token opens its own room only");
    let anonymous =
        http.get(server.url("/chat/api/rooms/lobby/events")).send().await.expect("request");
    assert_eq!(anonymous.status(), 403);
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_send_with_the_same_client_id_reaches_xagent_once() {
    let Lobby { server, plane, mut events, visitor, .. } = Lobby::start("client-id").await;
    let first = visitor.send("only once", "same").await;
    let again = visitor.send("only once", "same").await;
    assert_eq!(first["message_id"], again["message_id"]);
    match next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessage(_))).await {
        ClientEvent::ChatMessage(inbound) => inbound.accept(),
        _ => unreachable!(),
    }
    let snapshot = visitor.eventually(|s| s["messages"][0]["status"] == "delivered").await;
    assert_eq!(snapshot["messages"].as_array().map(Vec::len), Some(1));
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_activity_final_and_rejection_show_on_the_page() {
    let Lobby { server, plane, mut events, channel, visitor, .. } = Lobby::start("stream").await;

    plane.send_activity(&channel, ChatActivity::tool("web_search")).await.expect("activity");
    visitor
        .eventually(|s| {
            s["activity"]["status"] == "tool" && s["activity"]["tool_name"] == "web_search"
        })
        .await;
    plane.send_delta(&channel, ChatMessageDelta::new("msg_a1", 1, "Hel")).await.expect("delta");
    plane.send_delta(&channel, ChatMessageDelta::new("msg_a1", 2, "lo")).await.expect("delta");
    visitor
        .eventually(|s| {
            s["drafts"][0]["text"] == "Hello" && s["drafts"][0]["message_id"] == "msg_a1"
        })
        .await;
    plane
        .send_chat_message(&channel, ChatMessage::text("msg_a1", "Hello, visitor."))
        .await
        .expect("final");
    let snapshot = visitor
        .eventually(|s| {
            s["drafts"].as_array().is_some_and(Vec::is_empty)
                && s["messages"].as_array().is_some_and(|m| !m.is_empty())
        })
        .await;
    let messages = snapshot["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 1, "the final replaced the draft: {snapshot:#}");
    assert_eq!(messages[0]["text"], "Hello, visitor.");
    assert_eq!(messages[0]["author"], "assistant");
    assert!(snapshot.get("activity").is_none(), "the final clears the activity line");

    // xAgent rejects a visitor message for good: the page shows why.
    visitor.send("please refuse", "r1").await;
    match next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessage(_))).await {
        ClientEvent::ChatMessage(inbound) => {
            inbound.reject(ErrorCode::PermissionDenied, "not allowed here", false)
        }
        _ => unreachable!(),
    }
    let snapshot = visitor
        .eventually(|s| {
            s["messages"].as_array().is_some_and(|m| m.iter().any(|e| e["status"] == "rejected"))
        })
        .await;
    let rejected = snapshot["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|e| e["status"] == "rejected").cloned())
        .expect("rejected");
    assert_eq!(rejected["error"], "not allowed here (permission_denied)");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_travel_both_ways() {
    let Lobby { server, plane, mut events, channel, visitor, .. } = Lobby::start("files").await;
    let control = ControlPlane::new(server.base(), Some(Secret::new(API_KEY)));

    // Visitor -> xAgent: the upload becomes a chat.message file with a download_url.
    let picture = b"\x89PNG\r\n\x1a\nnot really a picture".to_vec();
    let form = reqwest::multipart::Form::new().text("client_id", "f1").text("text", "look").part(
        "file",
        reqwest::multipart::Part::bytes(picture.clone())
            .file_name("cat.png")
            .mime_str("image/png")
            .expect("mime"),
    );
    let response =
        visitor.request(Method::POST, "uploads").multipart(form).send().await.expect("upload");
    assert_eq!(response.status(), 200);
    let inbound = match next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessage(_))).await
    {
        ClientEvent::ChatMessage(inbound) => inbound,
        _ => unreachable!(),
    };
    assert_eq!(inbound.message.text.as_deref(), Some("look"));
    let file = inbound.message.files.first().expect("a file").clone();
    assert_eq!(file.file_type, FileType::Image);
    assert_eq!(file.filename.as_deref(), Some("cat.png"));
    let url = file.download_url.clone().expect("download_url");
    let downloaded = control.download(&url).await.expect("download without the API key");
    assert_eq!(downloaded.bytes, picture);
    inbound.accept();

    // xAgent -> visitor: an uploaded file_ref in the final message, served on the room.
    let report = xagent_client_runtime::FileContent {
        filename: "report.txt".into(),
        mime_type: "text/plain".into(),
        bytes: b"the report".to_vec(),
    };
    let upload = plane.upload_message_file(&channel, report).await.expect("upload");
    let final_message =
        ChatMessage::with_files("msg_file_1", Some("here you go".into()), vec![upload.clone()]);
    plane.send_chat_message(&channel, final_message).await.expect("final");
    visitor
        .eventually(|s| {
            s["messages"]
                .as_array()
                .is_some_and(|m| m.iter().any(|e| e["message_id"] == "msg_file_1"))
        })
        .await;
    let served = visitor
        .request(Method::GET, &format!("files/{}", upload.file_ref))
        .send()
        .await
        .expect("file");
    assert_eq!(served.status(), 200);
    assert!(
        served.headers()["content-disposition"].to_str().unwrap_or("").starts_with("attachment"),
        "non-images are downloads"
    );
    assert_eq!(served.bytes().await.expect("bytes").as_ref(), b"the report");
    let foreign = visitor
        .request(Method::GET, "files/file_00000000000000000000000000000000")
        .send()
        .await
        .expect("file");
    assert_eq!(foreign.status(), 404);
    plane.close().await;
    server.stop().await;
}

fn invoke(channel: &ConnectorChannelId, tool: &str, arguments: Value, call_id: &str) -> ToolInvoke {
    let Value::Object(mut arguments) = arguments else { panic!("object arguments") };
    arguments.insert("connector_channel_id".into(), json!(channel.as_str()));
    ToolInvoke::new(tool, arguments).with_context(ToolInvokeContext::with_call_id(call_id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_send_once_per_call_and_refuse_unknown_files() {
    let Lobby { server, plane, events: _events, channel, visitor, .. } =
        Lobby::start("tools").await;

    let call = || invoke(&channel, TOOL_MESSAGE_SEND, json!({"text": "a follow-up"}), "call-1");
    let first: ToolInvokeAck = plane.request(Some(&channel), call()).await.expect("first call");
    let repeat: ToolInvokeAck = plane.request(Some(&channel), call()).await.expect("repeat");
    assert_eq!(first.result, repeat.result, "a repeat returns the first result");
    let snapshot =
        visitor.eventually(|s| s["messages"].as_array().is_some_and(|m| !m.is_empty())).await;
    assert_eq!(snapshot["messages"].as_array().map(Vec::len), Some(1), "shown once");

    let empty = invoke(&channel, TOOL_MESSAGE_SEND, json!({"text": "  "}), "call-2");
    match plane.request(Some(&channel), empty).await {
        Err(ClientError::Remote(error)) => assert_eq!(error.code, ErrorCode::InvalidArguments),
        other => panic!("empty text is invalid_arguments, got {other:?}"),
    }

    let unknown = invoke(
        &channel,
        TOOL_FILE_SEND,
        json!({"file_ref": "file_00000000000000000000000000000000"}),
        "call-3",
    );
    match plane.request(Some(&channel), unknown).await {
        Err(ClientError::Remote(error)) => assert_eq!(error.code, ErrorCode::FileNotFound),
        other => panic!("an unknown file_ref is file_not_found, got {other:?}"),
    }

    let control = ControlPlane::new(server.base(), Some(Secret::new(API_KEY)));
    let upload = control
        .upload(&channel, "chart.png", "image/png", b"\x89PNG chart".to_vec())
        .await
        .expect("upload");
    let send = invoke(
        &channel,
        TOOL_FILE_SEND,
        json!({"file_ref": upload.file_ref, "text": "the chart"}),
        "call-4",
    );
    let ack: ToolInvokeAck = plane.request(Some(&channel), send).await.expect("file send");
    assert_eq!(ack.result.as_ref().map(|r| r["status"].clone()), Some(json!("sent")));
    let snapshot =
        visitor.eventually(|s| s["messages"].as_array().is_some_and(|m| m.len() == 2)).await;
    assert_eq!(snapshot["messages"][1]["files"][0]["filename"], "chart.png");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_logout_the_room_has_no_agent_and_sends_are_refused() {
    let Lobby { server, plane, events: _events, channel, visitor, .. } =
        Lobby::start("logout").await;
    plane
        .request(Some(&channel), xagent_protocol_types::AuthLogout::default())
        .await
        .expect("logout");
    let response = visitor
        .request(Method::POST, "messages")
        .json(&json!({"text": "anyone?", "client_id": "l1"}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 409);
    let body: Value = response.json().await.expect("body");
    assert_eq!(body["error"]["code"], "connection_not_authenticated");
    let snapshot = visitor.snapshot().await;
    assert_eq!(snapshot["agent_online"], false);
    // The room and its access code outlive the channel: a new channel can bind it again.
    open_room(&plane, "Lobby", "code-1234").await;
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_visitor_message_left_sending_past_the_outbox_ttl_shows_expired_not_sent_late() {
    let Lobby { dir, server, plane, visitor, channel, .. } = Lobby::start("stranded-expired").await;
    // What a replica killed between storing and queueing a message leaves, found after more
    // than the outbox's hour: it is not handed to xAgent any more.
    let created = server.webchat.handle().now_millis().saturating_sub(2 * 60 * 60 * 1_000);
    let message = ChatMessage::text("msg_web_too_old", "stored two hours ago").created_at(created);
    server
        .webchat
        .store_unqueued_visitor_message("lobby", &message, "c-too-old")
        .await
        .expect("stored");
    let snapshot = visitor
        .eventually(|s| {
            s["messages"].as_array().is_some_and(|messages| {
                messages
                    .iter()
                    .any(|m| m["message_id"] == "msg_web_too_old" && m["status"] == "expired")
            })
        })
        .await;
    let entry = snapshot["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["message_id"] == "msg_web_too_old"))
        .cloned()
        .expect("the message");
    assert_eq!(entry["error"], "the agent did not take the message in time", "{entry:#}");
    assert!(server.webchat.handle().pending_messages(&channel).is_empty(), "never queued");
    plane.close().await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}
