//! IM v2 over a real socket: chat.message both ways with acks, idempotency, deltas, activity,
//! files up and down.

mod support;

use xagent_protocol_types::{
    AckStatus, ChatActivity, ChatFile, ChatMessage, ChatMessageAck, ChatMessageDelta, ErrorCode,
    FileType, Packet,
};
use xagent_server_runtime::{ActivityAction, FinalDelivery};
use xagent_testkit::{
    ECHO_FAIL_PERMANENT, ECHO_FAIL_TEMPORARY, WsClient, has_error, inject_message, payload_json,
};

async fn signed_in(h: &support::Harness) -> (WsClient, xagent_protocol_types::ConnectorChannelId) {
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok-im").await;
    (c, channel)
}

fn message_packet(
    c: &mut WsClient,
    channel: &xagent_protocol_types::ConnectorChannelId,
    message: ChatMessage,
) -> Packet {
    let id = c.id("pkt");
    Packet::with_payload(id, message).channel(channel.clone())
}

#[tokio::test]
async fn chat_message_from_xagent_is_delivered_once_with_acks() {
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;

    let msg = message_packet(&mut c, &channel, ChatMessage::text("a1", "hello target"));
    c.send(&msg).await;
    let (ack, _) = c.wait_for("chat.message.ack").await;
    assert_eq!(ack.reply_to.as_ref(), Some(&msg.packet_id));
    assert_eq!(ack.connector_channel_id.as_ref(), Some(&channel));
    let body: &ChatMessageAck = ack.payload().unwrap();
    assert_eq!(body.status, AckStatus::Accepted);
    assert_eq!(body.message_id.as_str(), "a1");

    // Retransmission with a new packet_id: duplicate, not delivered twice.
    let again = message_packet(&mut c, &channel, ChatMessage::text("a1", "hello target"));
    c.send(&again).await;
    let (dup, _) = c.wait_for("chat.message.ack").await;
    assert_eq!(dup.payload::<ChatMessageAck>().unwrap().status, AckStatus::Duplicate);
    assert_eq!(h.echo.log().delivered.len(), 1);

    // Same id, other content: message_conflict, not retryable.
    let conflict = message_packet(&mut c, &channel, ChatMessage::text("a1", "changed"));
    c.send(&conflict).await;
    let (rej, _) = c.wait_for("chat.message.ack").await;
    let rej: &ChatMessageAck = rej.payload().unwrap();
    assert_eq!(rej.status, AckStatus::Rejected);
    assert_eq!(rej.code, Some(ErrorCode::MessageConflict));
    assert_eq!(rej.retryable, Some(false));

    // Target failures map to rejected with retryable true/false.
    let busy = message_packet(&mut c, &channel, ChatMessage::text("a2", ECHO_FAIL_TEMPORARY));
    c.send(&busy).await;
    let (busy, _) = c.wait_for("chat.message.ack").await;
    let busy: &ChatMessageAck = busy.payload().unwrap();
    assert_eq!((busy.status.clone(), busy.retryable), (AckStatus::Rejected, Some(true)));
    let bad = message_packet(&mut c, &channel, ChatMessage::text("a3", ECHO_FAIL_PERMANENT));
    c.send(&bad).await;
    let (bad, _) = c.wait_for("chat.message.ack").await;
    let bad: &ChatMessageAck = bad.payload().unwrap();
    assert_eq!(bad.code, Some(ErrorCode::TargetDeliveryFailed));
    assert_eq!(bad.retryable, Some(false));
    h.stop().await;
}

#[tokio::test]
async fn deltas_are_assembled_and_the_final_is_delivered_once() {
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;
    for (seq, text) in [(1, "Hel"), (2, "lo")] {
        let id = c.id("pkt");
        c.send(
            &Packet::with_payload(id, ChatMessageDelta::new("as1", seq, text))
                .channel(channel.clone()),
        )
        .await;
    }
    // A byte-identical retransmission is a no-op; a gap is sequence_conflict.
    let id = c.id("pkt");
    c.send(
        &Packet::with_payload(id, ChatMessageDelta::new("as1", 2, "lo")).channel(channel.clone()),
    )
    .await;
    let id = c.id("pkt");
    c.send(
        &Packet::with_payload(id, ChatMessageDelta::new("as1", 5, "x")).channel(channel.clone()),
    )
    .await;
    let err = c.next_packet().await;
    assert!(has_error(&err, &ErrorCode::SequenceConflict), "{err:?}");

    let fin = message_packet(&mut c, &channel, ChatMessage::text("as1", "Hello"));
    c.send(&fin).await;
    let (ack, _) = c.wait_for("chat.message.ack").await;
    assert_eq!(ack.payload::<ChatMessageAck>().unwrap().status, AckStatus::Accepted);
    let log = h.echo.log().clone();
    assert_eq!(log.delivered.len(), 1);
    assert_eq!(log.delivered[0].1.text.as_deref(), Some("Hello"));
    assert_eq!(
        log.delivered[0].2,
        FinalDelivery::New,
        "a buffering target sends the final as a new message"
    );
    drop(log);
    h.stop().await;
}

#[tokio::test]
async fn activity_is_tracked_and_cleared_by_the_final_message() {
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;
    let id = c.id("pkt");
    c.send(&Packet::with_payload(id, ChatActivity::tool("web_search")).channel(channel.clone()))
        .await;
    // Invalid activity (tool_name with thinking) is refused.
    let mut bad = ChatActivity::thinking();
    bad.tool_name = Some("x".into());
    let id = c.id("pkt");
    c.send(&Packet::with_payload(id, bad).channel(channel.clone())).await;
    let err = c.next_packet().await;
    assert!(has_error(&err, &ErrorCode::InvalidPacket), "{err:?}");
    let fin = message_packet(&mut c, &channel, ChatMessage::text("m9", "done"));
    c.send(&fin).await;
    c.wait_for("chat.message.ack").await;
    let log = h.echo.log().clone();
    let actions: Vec<&ActivityAction> = log.activities.iter().map(|(_, a)| a).collect();
    assert!(
        matches!(actions[0], ActivityAction::Show { tool_name: Some(name), .. } if name == "web_search")
    );
    assert_eq!(actions.last(), Some(&&ActivityAction::Clear));
    drop(log);
    h.stop().await;
}

/// IM v2: a refused `chat.activity` is answered on its own and touches nothing else. Sent
/// right before and after a `chat.message` (and after its retransmission), the message is
/// accepted once, its retransmission is a duplicate, and the target gets it exactly once.
#[tokio::test]
async fn rule_a_refused_activity_beside_a_chat_message_leaves_it_accepted_once() {
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;
    let mut bad = ChatActivity::thinking();
    bad.tool_name = Some("web_search".into());
    for (activities, want) in [(2, AckStatus::Accepted), (1, AckStatus::Duplicate)] {
        if activities == 2 {
            let id = c.id("pkt");
            c.send(&Packet::with_payload(id, bad.clone()).channel(channel.clone())).await;
        }
        let msg = message_packet(&mut c, &channel, ChatMessage::text("beside_1", "hello"));
        c.send(&msg).await;
        let id = c.id("pkt");
        c.send(&Packet::with_payload(id, bad.clone()).channel(channel.clone())).await;
        let (mut refused, mut ack) = (0, None);
        while refused < activities || ack.is_none() {
            let next = c.next_packet().await;
            if has_error(&next, &ErrorCode::InvalidPacket) {
                refused += 1;
            } else if next.type_str() == "chat.message.ack" {
                ack = next.payload::<ChatMessageAck>().map(|a| a.status.clone());
            } else {
                panic!("unexpected {next:?}");
            }
        }
        assert_eq!(ack, Some(want));
    }
    assert_eq!(h.echo.log().delivered.len(), 1, "the target got the message once");
    h.stop().await;
}

#[tokio::test]
async fn inbound_messages_reach_xagent_and_leave_the_outbox_on_accept() {
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;
    let handle = h.server.handle();
    inject_message(&handle, &channel, "in_1", "from the target").await.unwrap();
    let (msg, _) = c.wait_for("chat.message").await;
    let body: &ChatMessage = msg.payload().unwrap();
    assert_eq!(body.text.as_deref(), Some("from the target"));
    assert_eq!(handle.pending_messages(&channel).len(), 1, "pending until acked");

    let ack = Packet::with_payload(c.id("pkt"), ChatMessageAck::accepted("in_1"))
        .channel(channel.clone())
        .reply_to(msg.packet_id.clone());
    c.send(&ack).await;
    // A ping round trip orders the ack before the check.
    let ping = c.request(xagent_protocol_types::Ping::default(), None);
    c.call(ping).await;
    assert!(handle.pending_messages(&channel).is_empty());

    // A retryable rejection keeps it pending with the same message_id.
    inject_message(&handle, &channel, "in_2", "second").await.unwrap();
    let (msg, _) = c.wait_for("chat.message").await;
    let reject = Packet::with_payload(
        c.id("pkt"),
        ChatMessageAck::rejected("in_2", ErrorCode::ChannelBusy, "busy", true),
    )
    .channel(channel.clone())
    .reply_to(msg.packet_id.clone());
    c.send(&reject).await;
    let ping = c.request(xagent_protocol_types::Ping::default(), None);
    c.call(ping).await;
    assert_eq!(
        handle.pending_messages(&channel),
        vec![xagent_protocol_types::MessageId::new("in_2")]
    );
    h.stop().await;
}

#[tokio::test]
async fn outbox_resends_a_retryably_rejected_message_when_its_backoff_ends_not_at_maintenance() {
    // Maintenance runs every 30 s here: a retry that waited for it would miss the deadline.
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;
    let handle = h.server.handle();
    inject_message(&handle, &channel, "in_retry", "once more").await.unwrap();
    let (first, _) = c.wait_for("chat.message").await;
    let reject = Packet::with_payload(
        c.id("pkt"),
        ChatMessageAck::rejected("in_retry", ErrorCode::ChannelBusy, "busy", true),
    )
    .channel(channel.clone())
    .reply_to(first.packet_id.clone());
    c.send(&reject).await;
    let ping = c.request(xagent_protocol_types::Ping::default(), None);
    c.call(ping).await;
    // The first backoff (1 s) passes on the injected clock.
    h.clock.advance(1_000);
    let (again, _) =
        tokio::time::timeout(std::time::Duration::from_secs(5), c.wait_for("chat.message"))
            .await
            .expect("resent once the backoff ended");
    let body: &ChatMessage = again.payload().unwrap();
    assert_eq!(body.message_id.as_str(), "in_retry", "the same message, the same id");
    assert_ne!(again.packet_id, first.packet_id, "a new packet");
    h.stop().await;
}

#[tokio::test]
async fn files_up_and_down_through_the_transfer_plane() {
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;
    let handle = h.server.handle();
    let http = reqwest::Client::new();

    // Connector -> xAgent: an inbound file with a signed download URL.
    let file: ChatFile =
        handle.register_file(&channel, "cat.png", Some("image/png"), b"\x89PNGdata").await.unwrap();
    assert_eq!(file.file_type, FileType::Image);
    let url = file.download_url.clone().unwrap();
    let message = ChatMessage::with_files("in_f", Some("a picture".into()), vec![file]);
    handle.send_message(&channel, message).await.unwrap();
    let (msg, _) = c.wait_for("chat.message").await;
    let sent: &ChatMessage = msg.payload().unwrap();
    let sent_url = sent.files[0].download_url.clone().unwrap();
    assert!(sent_url.starts_with("/files/refs/file_"));
    let got = http.get(h.http(&sent_url)).send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().as_ref(), b"\x89PNGdata");
    let tampered = url.replace("sig=", "sig=00");
    assert_eq!(http.get(h.http(&tampered)).send().await.unwrap().status(), 403);

    // xAgent -> Connector: upload, then the author opens it by file_ref.
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(b"report body".to_vec()).file_name("r.txt"));
    let up = http
        .post(h.http("/files/uploads"))
        .bearer_auth(support::API_KEY)
        .header("X-XAgent-Connector-Channel-ID", channel.as_str())
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(up.status(), 200);
    let body: serde_json::Value = up.json().await.unwrap();
    let file_ref = xagent_protocol_types::FileRef::new(body["file_ref"].as_str().unwrap());
    let (record, _) = handle.open_file(&channel, &file_ref).await.unwrap();
    assert_eq!(record.byte_size, 11);

    // Upload errors: no key 401, unknown channel 404, missing header 400.
    let form = || {
        reqwest::multipart::Form::new()
            .part("file", reqwest::multipart::Part::bytes(vec![1]).file_name("a"))
    };
    let no_key = http
        .post(h.http("/files/uploads"))
        .header("X-XAgent-Connector-Channel-ID", channel.as_str())
        .multipart(form())
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 401);
    let unknown = http
        .post(h.http("/files/uploads"))
        .bearer_auth(support::API_KEY)
        .header("X-XAgent-Connector-Channel-ID", "cch_nope")
        .multipart(form())
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let no_header = http
        .post(h.http("/files/uploads"))
        .bearer_auth(support::API_KEY)
        .multipart(form())
        .send()
        .await
        .unwrap();
    assert_eq!(no_header.status(), 400);
    let _ = payload_json(&msg);
    h.stop().await;
}

/// A message redelivered after its first `download_url`s expired carries freshly signed ones:
/// the Connector signs a message's file links on every transmission, not once when the author
/// registered the file (the file itself lives far longer than one link).
#[tokio::test]
async fn rule_redelivered_messages_carry_freshly_signed_download_urls() {
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;
    let handle = h.server.handle();
    let http = reqwest::Client::new();
    let file =
        handle.register_file(&channel, "cat.png", Some("image/png"), b"\x89PNGdata").await.unwrap();
    let message = ChatMessage::with_files("in_resign", Some("a picture".into()), vec![file]);
    handle.send_message(&channel, message).await.unwrap();
    let (first, _) = c.wait_for("chat.message").await;
    let first_url = first.payload::<ChatMessage>().unwrap().files[0].download_url.clone().unwrap();
    assert_eq!(http.get(h.http(&first_url)).send().await.unwrap().status(), 200);

    // Unacknowledged, past the link's lifetime: the first link no longer works.
    let lifetime = xagent_file_transfer::DEFAULT_URL_LIFETIME.as_millis() as u64;
    h.clock.advance(lifetime + 60_000);
    let stale = http.get(h.http(&first_url)).send().await.unwrap().status();
    assert!(!stale.is_success(), "the first link expired: {stale}");
    // The channel reopens: the unfinished message comes again, with a link that works.
    let close = c.request(xagent_protocol_types::ChannelClose::default(), Some(&channel));
    c.call(close).await;
    c.open_channel(Some(&channel)).await;
    let (again, _) = c.wait_for("chat.message").await;
    let body: &ChatMessage = again.payload().unwrap();
    assert_eq!(body.message_id.as_str(), "in_resign");
    let fresh_url = body.files[0].download_url.clone().unwrap();
    assert_ne!(fresh_url, first_url, "signed again for this transmission");
    let got = http.get(h.http(&fresh_url)).send().await.unwrap();
    assert_eq!(got.status(), 200, "the redelivered link works");
    assert_eq!(got.bytes().await.unwrap().as_ref(), b"\x89PNGdata");
    h.stop().await;
}

#[tokio::test]
async fn rule_outbox_refuses_a_pending_message_id_reused_with_other_content() {
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;
    let handle = h.server.handle();
    inject_message(&handle, &channel, "in_c", "first text").await.unwrap();
    c.wait_for("chat.message").await;
    // The same content again is an idempotent re-enqueue, other content is a conflict.
    let conflict = inject_message(&handle, &channel, "in_c", "other text").await;
    match conflict {
        Err(
            error @ xagent_server_runtime::HandleError::Outbox(
                xagent_profile_im::OutboxError::MessageConflict { .. },
            ),
        ) => {
            assert_eq!(error.code(), ErrorCode::MessageConflict, "{error}")
        }
        other => panic!("expected a message_conflict, got {other:?}"),
    }
    assert_eq!(handle.pending_messages(&channel).len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn rule_outbox_redelivers_only_unfinished_messages_when_a_channel_reopens() {
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;
    let handle = h.server.handle();
    inject_message(&handle, &channel, "in_done", "acknowledged").await.unwrap();
    let (done, _) = c.wait_for("chat.message").await;
    let ack = Packet::with_payload(c.id("pkt"), ChatMessageAck::accepted("in_done"))
        .channel(channel.clone())
        .reply_to(done.packet_id.clone());
    c.send(&ack).await;
    inject_message(&handle, &channel, "in_open", "never acknowledged").await.unwrap();
    let (first, _) = c.wait_for("chat.message").await;
    assert_eq!(first.payload::<ChatMessage>().unwrap().message_id.as_str(), "in_open");

    let close = c.request(xagent_protocol_types::ChannelClose::default(), Some(&channel));
    c.call(close).await;
    assert!(!handle.is_routed(&channel));
    let (reopened, _) = c.open_channel(Some(&channel)).await;
    assert_eq!(reopened, channel);
    let (again, _) = c.wait_for("chat.message").await;
    let body: &ChatMessage = again.payload().unwrap();
    assert_eq!(body.message_id.as_str(), "in_open", "only the unfinished message comes again");
    assert_ne!(again.packet_id, first.packet_id);
    // Nothing else follows: the completed message is history.
    let ping = c.request(xagent_protocol_types::Ping::default(), None);
    c.send(&ping).await;
    let next = c.next_packet().await;
    assert_eq!(next.type_str(), "pong", "completed history was resent: {next:?}");
    h.stop().await;
}

/// Acks `message` as accepted.
fn accept(
    c: &mut WsClient,
    channel: &xagent_protocol_types::ConnectorChannelId,
    message: &Packet,
) -> Packet {
    let id = message.payload::<ChatMessage>().unwrap().message_id.clone();
    Packet::with_payload(c.id("pkt"), ChatMessageAck::accepted(id))
        .channel(channel.clone())
        .reply_to(message.packet_id.clone())
}

/// The outbox window: several messages of one channel are on the socket at once, in the order
/// they were queued, before any ack; acks are matched by `reply_to` (IM v2 section 7), so
/// they may come back in any order, and each ends its own message only.
#[tokio::test]
async fn outbox_window_sends_several_messages_of_a_channel_in_order_before_any_ack() {
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;
    let handle = h.server.handle();
    for i in 0..5 {
        inject_message(&handle, &channel, &format!("w_{i}"), "in the window").await.unwrap();
    }
    let mut sent = Vec::new();
    for _ in 0..5 {
        sent.push(c.wait_for("chat.message").await.0);
    }
    let ids: Vec<String> = sent
        .iter()
        .map(|p| p.payload::<ChatMessage>().unwrap().message_id.as_str().to_owned())
        .collect();
    assert_eq!(ids, ["w_0", "w_1", "w_2", "w_3", "w_4"], "first transmissions keep queue order");
    assert_eq!(handle.pending_messages(&channel).len(), 5, "nothing is delivered before its ack");
    // Ack the middle one, then the rest backwards.
    let middle = accept(&mut c, &channel, &sent[2]);
    c.send(&middle).await;
    let ping = c.request(xagent_protocol_types::Ping::default(), None);
    c.call(ping).await;
    let left: Vec<String> =
        handle.pending_messages(&channel).iter().map(|m| m.as_str().to_owned()).collect();
    assert_eq!(left, ["w_0", "w_1", "w_3", "w_4"]);
    for message in sent.iter().rev() {
        let ack = accept(&mut c, &channel, message);
        c.send(&ack).await;
    }
    let ping = c.request(xagent_protocol_types::Ping::default(), None);
    c.call(ping).await;
    assert!(handle.pending_messages(&channel).is_empty());
    h.stop().await;
}

/// With `outbox_window` 1 the outbox waits for each ack before it sends the next message.
#[tokio::test]
async fn outbox_window_of_one_waits_for_each_ack() {
    let config = xagent_server_runtime::RuntimeConfig::default().with_outbox_window(1);
    let h = support::start(
        support::temp_dir("window1"),
        xagent_protocol_types::ManualClock::new(support::START),
        config,
    )
    .await;
    let (mut c, channel) = signed_in(&h).await;
    let handle = h.server.handle();
    inject_message(&handle, &channel, "s_1", "first").await.unwrap();
    inject_message(&handle, &channel, "s_2", "second").await.unwrap();
    let (first, _) = c.wait_for("chat.message").await;
    assert_eq!(first.payload::<ChatMessage>().unwrap().message_id.as_str(), "s_1");
    // Both were queued before this ping: the answer comes next, not the second message.
    let ping = c.request(xagent_protocol_types::Ping::default(), None);
    c.send(&ping).await;
    let next = c.next_packet().await;
    assert_eq!(next.type_str(), "pong", "a second message went out before the first ack");
    let ack = accept(&mut c, &channel, &first);
    c.send(&ack).await;
    let (second, _) = c.wait_for("chat.message").await;
    assert_eq!(second.payload::<ChatMessage>().unwrap().message_id.as_str(), "s_2");
    h.stop().await;
}

/// Concurrent `send_message` calls go to the group commit together (one IM submission in
/// flight at a time, the others collected for the next), and none of them hears "queued"
/// before its record is committed: once every call has returned, every record is in the
/// database, read on a connection of its own.
#[tokio::test]
async fn concurrent_sends_each_return_only_once_their_record_is_durable() {
    let h = support::start_default().await;
    let (_c, channel) = signed_in(&h).await;
    let handle = h.server.handle();
    let sends = (0..64).map(|i| {
        let handle = handle.clone();
        let channel = channel.clone();
        tokio::spawn(async move {
            let message = ChatMessage::text(format!("out_{i}"), format!("message {i}"));
            handle.send_message(&channel, message).await
        })
    });
    for send in futures_util::future::join_all(sends).await {
        send.expect("joins").expect("queued");
    }
    let db = rusqlite::Connection::open(h.dir.join(xagent_server_runtime::storage::DATABASE_FILE))
        .unwrap();
    let mut ids: Vec<String> = db
        .prepare("SELECT message_id FROM im_pending")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    ids.sort();
    let mut expected: Vec<String> = (0..64).map(|i| format!("out_{i}")).collect();
    expected.sort();
    assert_eq!(ids, expected, "every message that was answered \"queued\" is committed");
    h.stop().await;
}

#[tokio::test]
async fn a_message_sent_with_author_writes_commits_them_with_its_outbox_record_or_not_at_all() {
    let h = support::start_default().await;
    let (mut c, channel) = signed_in(&h).await;
    let handle = h.server.handle();
    let store = handle.author_store();
    let note = |key: &str| xagent_server_runtime::AuthorWrite::put("app.sent", key, b"v".to_vec());
    let message = ChatMessage::text("with_1", "stored with its record");
    handle.send_message_with(&channel, message, vec![note("with_1").unwrap()]).await.unwrap();
    // Answered: the note and the outbox record are both in the file.
    let db = rusqlite::Connection::open(h.dir.join(xagent_server_runtime::storage::DATABASE_FILE))
        .unwrap();
    let pending: i64 = db
        .query_row("SELECT COUNT(*) FROM im_pending WHERE message_id = 'with_1'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(pending, 1);
    assert_eq!(store.get("app.sent", "with_1").await.unwrap(), Some(b"v".to_vec()));
    let (msg, _) = c.wait_for("chat.message").await;
    assert_eq!(msg.payload::<ChatMessage>().unwrap().message_id.as_str(), "with_1");

    // A message the runtime refuses (no such channel) stores none of its writes.
    let unknown = xagent_protocol_types::ConnectorChannelId::new("cch_unknown");
    let refused = ChatMessage::text("with_2", "never taken");
    let error = handle
        .send_message_with(&unknown, refused, vec![note("with_2").unwrap()])
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::ConnectionNotFound, "{error}");
    assert_eq!(store.get("app.sent", "with_2").await.unwrap(), None);
    h.stop().await;
}
