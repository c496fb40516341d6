//! `im.matrix` against a real Synapse (installed from PyPI and started by the testkit on a
//! free port): pairing, text both ways, streaming edits, typing, files both ways, an
//! end-to-end encrypted room across a restart, two rooms on two channels, and what a
//! non-member or a guesser cannot do.

#![recursion_limit = "256"]

mod support;

use std::time::Duration;

use matrix_sdk::attachment::AttachmentConfig;
use matrix_sdk::ruma::events::room::message::MessageType;
use xagent_client_runtime::{ClientEvent, ControlPlane, FileContent};
use xagent_protocol_types::{
    AuthStatus, ChatActivity, ChatMessage, ChatMessageDelta, FileType, Secret,
};
use xagent_testkit::synapse::TestSynapse;

use support::{
    API_KEY, Server, WAIT, body_of, code_of, connect, is_edit, next_chat, next_event, pair_room,
    pairing_result, pairing_start, temp_dir,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paired_room_talks_both_ways_streams_types_and_moves_files() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("bot").await;
    let alice = support::human(synapse, "alice").await;
    let dir = temp_dir("talk");
    let server = Server::start(synapse, &bot, &dir).await;
    let (plane, mut events) = connect(&server).await;

    let (channel, room) = pair_room(&plane, &alice, &bot, "Plain room", false).await;
    let descriptor = server.matrix.server().handle().descriptor(&channel).expect("descriptor");
    let target = serde_json::to_value(&descriptor.target).expect("json");
    assert_eq!(target["display_name"], "Plain room", "{target}");
    let hint = target["account_hint"].as_str().expect("a hint");
    assert!(hint.contains('…') && !hint.contains(room.room_id().as_str()), "{hint}");

    // Human -> agent, with the sender's name.
    alice.say(&room, "hello agent").await;
    let inbound = next_chat(&mut events).await;
    let text = inbound.text.clone().expect("text");
    assert!(text.ends_with(": hello agent") && text.contains(&alice.user.localpart), "{text}");
    assert!(inbound.message_id.as_str().starts_with("mx_"));

    // Agent -> human: the ack comes once the homeserver took the event.
    plane
        .send_chat_message(&channel, ChatMessage::text("msg_hi", "hello human"))
        .await
        .expect("sent");
    next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessageAcked { .. })).await;
    alice.wait_message(&room, &bot.user_id, |e| body_of(e) == "hello human").await;

    // Typing while the agent thinks.
    plane.send_activity(&channel, ChatActivity::thinking()).await.expect("activity");
    let deadline = tokio::time::Instant::now() + WAIT;
    while !alice
        .seen
        .lock()
        .unwrap()
        .typing
        .iter()
        .any(|(r, users)| r == room.room_id() && users.iter().any(|u| u.as_str() == bot.user_id))
    {
        assert!(tokio::time::Instant::now() < deadline, "no typing notification");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A streamed reply is one Matrix message edited in place; the final is its last edit.
    for (i, part) in ["Once ", "upon ", "a ", "time"].iter().enumerate() {
        plane
            .send_delta(&channel, ChatMessageDelta::new("msg_story", i as u64 + 1, *part))
            .await
            .expect("delta");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    plane
        .send_chat_message(&channel, ChatMessage::text("msg_story", "Once upon a time, the end."))
        .await
        .expect("final");
    alice
        .wait_message(&room, &bot.user_id, |e| {
            is_edit(e) && body_of(e) == "Once upon a time, the end."
        })
        .await;
    let from_bot = alice.messages_from(&room, &bot.user_id);
    let drafts: Vec<_> =
        from_bot.iter().filter(|e| !is_edit(e) && body_of(e).starts_with("Once")).collect();
    assert_eq!(drafts.len(), 1, "one message for the stream, edited in place");
    let edits = from_bot.iter().filter(|e| is_edit(e)).count();
    assert!(edits >= 1, "the final went out as an edit");
    assert!(
        !from_bot.iter().any(|e| !is_edit(e) && body_of(e) == "Once upon a time, the end."),
        "the final is not posted a second time"
    );

    // A file from the human reaches xAgent with a download URL.
    let picture = b"\x89PNG\r\n\x1a\nnot really a picture".to_vec();
    let mime: mime_guess::mime::Mime = "image/png".parse().unwrap();
    room.send_attachment("cat.png", &mime, picture.clone(), AttachmentConfig::new())
        .await
        .expect("the human posts a file");
    let inbound = next_chat(&mut events).await;
    let file = inbound.files.first().expect("a file").clone();
    assert_eq!(file.file_type, FileType::Image);
    assert_eq!(file.filename.as_deref(), Some("cat.png"));
    let control = ControlPlane::new(server.base(), Some(Secret::new(API_KEY)));
    let downloaded = control.download(&file.download_url.expect("url")).await.expect("download");
    assert_eq!(downloaded.bytes, picture);

    // A file from the agent is uploaded to the media repository and posted.
    let report = FileContent {
        filename: "report.txt".into(),
        mime_type: "text/plain".into(),
        bytes: b"the report".to_vec(),
    };
    let upload = plane.upload_message_file(&channel, report).await.expect("upload");
    plane
        .send_chat_message(&channel, ChatMessage::with_files("msg_file", None, vec![upload]))
        .await
        .expect("final with a file");
    let posted = alice
        .wait_message(&room, &bot.user_id, |e| matches!(&e.content.msgtype, MessageType::File(_)))
        .await;
    let MessageType::File(content) = posted.content.msgtype else { unreachable!() };
    let bytes = alice
        .client
        .media()
        .get_media_content(
            &matrix_sdk::media::MediaRequestParameters {
                source: content.source.clone(),
                format: matrix_sdk::media::MediaFormat::File,
            },
            false,
        )
        .await
        .expect("the human fetches the file");
    assert_eq!(bytes, b"the report");

    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_encrypted_room_works_both_ways_and_keeps_working_after_a_restart() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("bot").await;
    let bob = support::human(synapse, "bob").await;
    let dir = temp_dir("e2ee");
    let server = Server::start(synapse, &bot, &dir).await;
    let (plane, mut events) = connect(&server).await;
    let (channel, room) = pair_room(&plane, &bob, &bot, "Secret room", true).await;
    assert!(room.latest_encryption_state().await.expect("state").is_encrypted());

    bob.say(&room, "a secret question").await;
    let inbound = next_chat(&mut events).await;
    assert!(
        inbound.text.as_deref().is_some_and(|t| t.ends_with(": a secret question")),
        "{inbound:?}"
    );
    plane
        .send_chat_message(&channel, ChatMessage::text("msg_secret", "a secret answer"))
        .await
        .expect("sent");
    let answer = bob.wait_message(&room, &bot.user_id, |e| body_of(e) == "a secret answer").await;
    // What the homeserver holds is ciphertext: the raw event is m.room.encrypted.
    let raw = room.event(&answer.event_id, None).await.expect("the event");
    assert!(
        matches!(raw.kind, matrix_sdk::deserialized_responses::TimelineEventKind::Decrypted(_)),
        "the bot's answer was encrypted"
    );

    // Restart: the bot keeps its device and keys, and the conversation goes on.
    plane.close().await;
    server.stop().await;
    let server = Server::start(synapse, &bot, &dir).await;
    let (plane, mut events) = connect(&server).await;
    plane.open_channel(Some(&channel)).await.expect("the channel reopens");
    bob.say(&room, "still there?").await;
    let inbound = next_chat(&mut events).await;
    assert!(inbound.text.as_deref().is_some_and(|t| t.ends_with(": still there?")), "{inbound:?}");
    plane
        .send_chat_message(&channel, ChatMessage::text("msg_secret_2", "yes, still here"))
        .await
        .expect("sent");
    bob.wait_message(&room, &bot.user_id, |e| body_of(e) == "yes, still here").await;
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_rooms_on_two_channels_stay_apart_and_outsiders_cannot_bind_or_read() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("bot").await;
    let carol = support::human(synapse, "carol").await;
    let dave = support::human(synapse, "dave").await;
    let mallory = support::human(synapse, "mallory").await;
    let dir = temp_dir("apart");
    let server = Server::start(synapse, &bot, &dir).await;
    let (plane, mut events) = connect(&server).await;
    let (first, carol_room) = pair_room(&plane, &carol, &bot, "Carol's room", false).await;
    let (second, dave_room) = pair_room(&plane, &dave, &bot, "Dave's room", false).await;
    assert_ne!(first, second);

    carol.say(&carol_room, "for the first channel").await;
    let (from_carol, on) =
        match next_event(&mut events, |e| matches!(e, ClientEvent::ChatMessage(_))).await {
            ClientEvent::ChatMessage(inbound) => {
                let pair = (inbound.message.clone(), inbound.channel.clone());
                inbound.accept();
                pair
            }
            _ => unreachable!(),
        };
    assert_eq!(on, first);
    assert!(from_carol.text.as_deref().is_some_and(|t| t.ends_with("for the first channel")));
    plane
        .send_chat_message(&second, ChatMessage::text("msg_dave", "only for dave"))
        .await
        .expect("sent");
    dave.wait_message(&dave_room, &bot.user_id, |e| body_of(e) == "only for dave").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !carol
            .messages_from(&carol_room, &bot.user_id)
            .iter()
            .any(|e| body_of(e) == "only for dave"),
        "nothing crosses between rooms"
    );

    // Mallory is not in Carol's room: she cannot join it (invite-only), so she can neither
    // post a code there nor read it.
    assert!(mallory.client.join_room_by_id(carol_room.room_id()).await.is_err());
    // A code posted in a room of her own cannot take over a room that is bound already,
    // and a wrong guess there binds nothing.
    let (third, started) = pairing_start(&plane).await;
    let mallory_room = mallory.create_room("Mallory's", false, &[&bot.user_id]).await;
    mallory.wait_joined(&mallory_room, &bot.user_id).await;
    mallory.say(&mallory_room, "ZZZZ-ZZZZ").await;
    mallory.wait_message(&mallory_room, &bot.user_id, |e| body_of(e).contains("not valid")).await;
    // Five wrong codes lock her out: the right one is ignored afterwards.
    for _ in 0..5 {
        mallory.say(&mallory_room, "YYYY-YYYY").await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    mallory.say(&mallory_room, &code_of(&started)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = support::pairing_status(&plane, &third, &started).await;
    assert_eq!(status.status, AuthStatus::Pending, "a locked-out guesser binds nothing");
    // Carol still can, in a fresh room.
    let fresh = carol.create_room("Carol's second", false, &[&bot.user_id]).await;
    carol.wait_joined(&fresh, &bot.user_id).await;
    carol.say(&fresh, &code_of(&started)).await;
    let done = pairing_result(&plane, &third, &started).await;
    assert_eq!(done.status, AuthStatus::Authenticated, "{:?}", done.message);
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_posted_while_the_connector_was_down_arrive_once_after_the_restart() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("bot").await;
    let erin = support::human(synapse, "erin").await;
    let dir = temp_dir("restart");
    let server = Server::start(synapse, &bot, &dir).await;
    let (plane, mut events) = connect(&server).await;
    let (channel, room) = pair_room(&plane, &erin, &bot, "Restart room", false).await;
    erin.say(&room, "before").await;
    let before = next_chat(&mut events).await;
    // Once the ack is in, the outbox holds nothing: a redelivery after this would come from
    // the sync position, which is what this test is about.
    let handle = server.matrix.server().handle();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !handle.pending_messages(&channel).is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the ack did not land");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    plane.close().await;
    server.stop().await;

    for n in 1..=3 {
        erin.say(&room, &format!("while down {n}")).await;
    }
    let server = Server::start(synapse, &bot, &dir).await;
    let (plane, mut events) = connect(&server).await;
    plane.open_channel(Some(&channel)).await.expect("the channel reopens");
    let mut got = Vec::new();
    for _ in 1..=3 {
        got.push(next_chat(&mut events).await);
    }
    let texts: Vec<String> = got.iter().filter_map(|m| m.text.clone()).collect();
    for n in 1..=3 {
        assert!(texts.iter().any(|t| t.ends_with(&format!("while down {n}"))), "{texts:?}");
    }
    assert!(got.iter().all(|m| m.message_id != before.message_id), "nothing twice");
    // Nothing else comes: the message from before the restart is not delivered again.
    let again =
        xagent_client_runtime::next_event_matching(&mut events, Duration::from_secs(3), |e| {
            matches!(e, ClientEvent::ChatMessage(_))
        })
        .await;
    assert!(again.is_none(), "a second delivery: {again:?}");
    plane.close().await;
    server.stop().await;
}

/// The kill the chaos run found: the SDK took a batch (and stored its own sync position) but
/// the process died before the Connector handed the batch over and stored its position. The
/// homeserver answers the Connector's older position with that same batch; an SDK still
/// holding the newer position would drop it as a repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_the_sdk_took_before_a_kill_is_handed_over_after_the_restart() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("bot").await;
    let fay = support::human(synapse, "fay").await;
    let dir = temp_dir("sdk-ahead");
    let server = Server::start(synapse, &bot, &dir).await;
    let (plane, mut events) = connect(&server).await;
    let (channel, room) = pair_room(&plane, &fay, &bot, "Kill room", false).await;
    fay.say(&room, "before").await;
    next_chat(&mut events).await;
    let store = server.matrix.server().handle().author_store();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let position = store.get("matrix.sync", "next_batch").await.expect("read").expect("stored");
    let position = String::from_utf8(position).expect("utf-8");
    plane.close().await;
    server.stop().await;

    fay.say(&room, "taken by the SDK only").await;
    // The dead run's last moments: its SDK synced the message from the Connector's position
    // and kept the newer one; the Connector never saw the batch.
    let credentials =
        xagent_connector_matrix::Credentials::Password(Secret::new(bot.password.clone()));
    let sdk = xagent_connector_matrix::bot::open(&synapse.url(), &bot.user_id, &credentials, &dir)
        .await
        .expect("the bot's store opens");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let settings = matrix_sdk::config::SyncSettings::default()
            .token(position.clone())
            .timeout(Duration::from_secs(5));
        let response = sdk.sync_once(settings).await.expect("sync");
        let events =
            response.rooms.joined.get(room.room_id()).map_or(0, |r| r.timeline.events.len());
        if events > 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the SDK never saw the message");
    }
    drop(sdk);

    let server = Server::start(synapse, &bot, &dir).await;
    let (plane, mut events) = connect(&server).await;
    plane.open_channel(Some(&channel)).await.expect("the channel reopens");
    let inbound = next_chat(&mut events).await;
    assert!(inbound.text.expect("text").ends_with(": taken by the SDK only"));
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_homeserver_that_goes_away_shows_degraded_then_offline_and_recovers_by_itself() {
    let synapse = TestSynapse::dedicated().await.expect("a homeserver of its own");
    let bot = synapse.register("bot").await;
    let frank = support::human(&synapse, "frank").await;
    let dir = temp_dir("down");
    let server = Server::start_with(&synapse, &bot, &dir, |o| {
        o.offline_after = Duration::from_secs(2);
    })
    .await;
    let (plane, mut events) = connect(&server).await;
    let (channel, room) = pair_room(&plane, &frank, &bot, "Fragile room", false).await;
    let status_is = |want: xagent_protocol_types::ConnectionStatus| move |e: &ClientEvent| matches!(e, ClientEvent::DescriptorPushed { descriptor, .. } if descriptor.connection.status == want);
    synapse.stop().await;
    next_event(&mut events, status_is(xagent_protocol_types::ConnectionStatus::Degraded)).await;
    next_event(&mut events, status_is(xagent_protocol_types::ConnectionStatus::Offline)).await;
    synapse.start().await.expect("the homeserver comes back");
    next_event(&mut events, status_is(xagent_protocol_types::ConnectionStatus::Connected)).await;
    // And messages flow again.
    let _ = channel;
    frank.say(&room, "back again").await;
    let inbound = next_chat(&mut events).await;
    assert!(inbound.text.as_deref().is_some_and(|t| t.ends_with(": back again")), "{inbound:?}");
    plane.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flooding_room_is_cut_off_per_minute_and_invites_beyond_the_quota_are_declined() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("bot").await;
    let gina = support::human(synapse, "gina").await;
    let dir = temp_dir("limits");
    let server = Server::start_with(synapse, &bot, &dir, |o| {
        o.room_messages_per_minute = 3;
        o.max_unbound_rooms = 1;
    })
    .await;
    let (plane, mut events) = connect(&server).await;
    let (_channel, room) = pair_room(&plane, &gina, &bot, "Busy room", false).await;
    for n in 1..=5 {
        gina.say(&room, &format!("flood {n}")).await;
    }
    for _ in 1..=3 {
        next_chat(&mut events).await;
    }
    gina.wait_message(&room, &bot.user_id, |e| body_of(e).contains("Too many messages")).await;
    let more =
        xagent_client_runtime::next_event_matching(&mut events, Duration::from_secs(3), |e| {
            matches!(e, ClientEvent::ChatMessage(_))
        })
        .await;
    assert!(more.is_none(), "only 3 per minute reach the agent: {more:?}");

    // One room without a channel is allowed; the bot declines the second invite.
    let spare = gina.create_room("Spare", false, &[&bot.user_id]).await;
    gina.wait_joined(&spare, &bot.user_id).await;
    let extra = gina.create_room("One too many", false, &[&bot.user_id]).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let _ = extra.sync_members().await;
    let joined = extra.members(matrix_sdk::RoomMemberships::JOIN).await.expect("members");
    assert!(
        !joined.iter().any(|m| m.user_id().as_str() == bot.user_id),
        "the bot joined a room beyond its quota"
    );
    plane.close().await;
    server.stop().await;
}

fn invoke(
    channel: &xagent_protocol_types::ConnectorChannelId,
    tool: &str,
    arguments: serde_json::Value,
    call_id: &str,
) -> xagent_protocol_types::ToolInvoke {
    let serde_json::Value::Object(mut arguments) = arguments else { panic!("object arguments") };
    arguments.insert("connector_channel_id".into(), serde_json::json!(channel.as_str()));
    xagent_protocol_types::ToolInvoke::new(tool, arguments)
        .with_context(xagent_protocol_types::ToolInvokeContext::with_call_id(call_id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tools_post_once_per_call_edits_arrive_marked_and_logout_lets_the_room_go() {
    use matrix_sdk::ruma::events::room::message::{ReplacementMetadata, RoomMessageEventContent};
    use xagent_connector_matrix::connector::{TOOL_FILE_SEND, TOOL_MESSAGE_SEND};
    use xagent_protocol_types::{ErrorCode, ToolInvokeAck};

    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("bot").await;
    let hana = support::human(synapse, "hana").await;
    let dir = temp_dir("tools");
    let server = Server::start(synapse, &bot, &dir).await;
    let (plane, mut events) = connect(&server).await;
    let (channel, room) = pair_room(&plane, &hana, &bot, "Tool room", true).await;

    // matrix_message_send: a repeated call posts once.
    let call = || {
        invoke(&channel, TOOL_MESSAGE_SEND, serde_json::json!({"text": "a follow-up"}), "call-1")
    };
    let first: ToolInvokeAck = plane.request(Some(&channel), call()).await.expect("first call");
    let repeat: ToolInvokeAck = plane.request(Some(&channel), call()).await.expect("repeat");
    assert_eq!(first.result, repeat.result, "a repeat returns the first result");
    hana.wait_message(&room, &bot.user_id, |e| body_of(e) == "a follow-up").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let posted = hana
        .messages_from(&room, &bot.user_id)
        .iter()
        .filter(|e| body_of(e) == "a follow-up")
        .count();
    assert_eq!(posted, 1, "posted once");

    // matrix_file_send: an unknown reference is refused; an upload is posted (encrypted in
    // this room) and the person decrypts the same bytes.
    let unknown = invoke(
        &channel,
        TOOL_FILE_SEND,
        serde_json::json!({"file_ref": "file_00000000000000000000000000000000"}),
        "call-2",
    );
    match plane.request(Some(&channel), unknown).await {
        Err(xagent_client_runtime::ClientError::Remote(error)) => {
            assert_eq!(error.code, ErrorCode::FileNotFound)
        }
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
        serde_json::json!({"file_ref": upload.file_ref, "text": "the chart"}),
        "call-3",
    );
    let ack: ToolInvokeAck = plane.request(Some(&channel), send).await.expect("file send");
    assert_eq!(ack.result.as_ref().map(|r| r["status"].clone()), Some(serde_json::json!("sent")));
    let posted = hana
        .wait_message(&room, &bot.user_id, |e| matches!(&e.content.msgtype, MessageType::Image(_)))
        .await;
    let MessageType::Image(image) = posted.content.msgtype else { unreachable!() };
    assert!(
        matches!(image.source, matrix_sdk::ruma::events::room::MediaSource::Encrypted(_)),
        "a file in an encrypted room is uploaded encrypted"
    );
    let bytes = hana
        .client
        .media()
        .get_media_content(
            &matrix_sdk::media::MediaRequestParameters {
                source: image.source.clone(),
                format: matrix_sdk::media::MediaFormat::File,
            },
            false,
        )
        .await
        .expect("the person fetches and decrypts the file");
    assert_eq!(bytes, b"\x89PNG chart");

    // An edit of an earlier message reaches the agent again, marked.
    let original =
        room.send(RoomMessageEventContent::text_plain("meet at 5")).await.expect("posts");
    next_chat(&mut events).await;
    let edit = RoomMessageEventContent::text_plain("meet at 6")
        .make_replacement(ReplacementMetadata::new(original.response.event_id, None));
    room.send(edit).await.expect("edits");
    let edited = next_chat(&mut events).await;
    let text = edited.text.expect("text");
    assert!(text.contains("(edited)") && text.ends_with("meet at 6"), "{text}");

    // auth.logout: the binding goes, the bot leaves the room, nothing more is delivered.
    plane
        .request(Some(&channel), xagent_protocol_types::AuthLogout::default())
        .await
        .expect("logout");
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        let _ = room.sync_members().await;
        let joined = room.members(matrix_sdk::RoomMemberships::JOIN).await.expect("members");
        if !joined.iter().any(|m| m.user_id().as_str() == bot.user_id) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the bot did not leave the room");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    hana.say(&room, "anyone there?").await;
    let more =
        xagent_client_runtime::next_event_matching(&mut events, Duration::from_secs(3), |e| {
            matches!(e, ClientEvent::ChatMessage(_))
        })
        .await;
    assert!(more.is_none(), "nothing is delivered after logout: {more:?}");
    plane.close().await;
    server.stop().await;
}
