//! The xAgent-side driver over the in-memory transport with a `ManualClock`: each test plays
//! the Connector frame by frame and proves one rule (tokio's clock is paused, so timeouts and
//! backoff run in simulated time).

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::{CARD, MEM, accept_hello, card, config, descriptor, packet, send, start};
use xagent_client_runtime::store::SqliteXagentStore;
use xagent_client_runtime::{
    ClientError, ClientEvent, ConnectionState, SessionBinding, next_event_matching,
};
use xagent_protocol_types::{
    CardTool, ChannelOpenAck, ChatMessage, ChatMessageAck, ConnectionStatus, ConnectorHelloAck,
    DescriptorTool, ManualClock, Packet, Ping, ToolInvokeAck,
};

#[tokio::test(start_paused = true)]
async fn hello_rule_nothing_but_hello_leaves_before_hello_ack() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = peers.recv().await.expect("a connection attempt");
    let hello = packet(&peer.next_json().await.expect("hello"));
    assert_eq!(hello.type_str(), "connector.hello");
    assert_eq!(hello.time, Some(1_000), "timestamps come from the injected clock");
    // Before the ack, a request is withheld by the session, never written.
    let early = plane.open_channel(None).await;
    match early {
        Err(ClientError::Withheld(error)) => assert_eq!(error.code.to_string(), "hello_required"),
        other => panic!("expected the request to be withheld, got {other:?}"),
    }
    let nothing = tokio::time::timeout(Duration::from_secs(2), peer.from_client.recv()).await;
    assert!(nothing.is_err(), "nothing but hello may leave before hello.ack: {nothing:?}");
}

#[tokio::test(start_paused = true)]
async fn channel_rule_nothing_channel_scoped_before_the_channel_is_open() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    let delta = xagent_protocol_types::ChatMessageDelta::new("msg_1", 1, "hi");
    match plane.send_delta(&"cch_closed".into(), delta).await {
        Err(ClientError::Withheld(error)) => assert_eq!(error.code.to_string(), "channel_not_open"),
        other => panic!("expected channel_not_open, got {other:?}"),
    }
    let nothing = tokio::time::timeout(Duration::from_secs(2), peer.from_client.recv()).await;
    assert!(nothing.is_err(), "the delta must not be written: {nothing:?}");
}

#[tokio::test(start_paused = true)]
async fn reconnect_rule_never_gives_up_and_reports_each_state() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, transport, mut peers) = start(config(&clock)).await;
    let mut state = plane.watch_state();
    transport.refuse(Some(503));
    let mut seen = Vec::new();
    while !seen.contains(&"offline") {
        state.changed().await.expect("state");
        seen.push(state.borrow().as_str());
    }
    assert!(seen.contains(&"degraded"), "{seen:?}");
    transport.refuse(Some(401));
    loop {
        state.changed().await.expect("state");
        if state.borrow().as_str() == "auth_failed" {
            break;
        }
    }
    // Far beyond the old limit of 20 attempts, it still tries.
    while transport.attempts() < 40 {
        state.changed().await.expect("state");
    }
    transport.refuse(None);
    // Skip a connection the first attempt may have opened before the refusals began.
    let _peer = loop {
        let mut peer = peers.recv().await.expect("a connection attempt");
        let Some(hello) = peer.next_json().await else { continue };
        let hello = packet(&hello);
        send(
            &peer,
            Packet::with_payload("pkt_ack", ConnectorHelloAck::new(CARD, "conn_1"))
                .answering(&hello),
        )
        .await;
        break peer;
    };
    loop {
        if let ConnectionState::Online { connector_id } = &*state.borrow_and_update() {
            assert_eq!(connector_id.as_str(), "conn_1");
            break;
        }
        state.changed().await.expect("state");
    }
}

#[tokio::test(start_paused = true)]
async fn replaced_rule_new_connector_id_is_reported_then_online() {
    let clock = ManualClock::new(1_000);
    let mut config = config(&clock);
    config.connector_id = Some("conn_old".into());
    let (plane, mut events, _transport, mut peers) = start(config).await;
    let _peer = accept_hello(&mut peers).await;
    let replaced = next_event_matching(&mut events, Duration::from_secs(5), |e| {
        matches!(e, ClientEvent::ConnectorReplaced { .. })
    })
    .await;
    assert!(matches!(replaced, Some(ClientEvent::ConnectorReplaced { .. })), "{replaced:?}");
    plane.connected().await.expect("online after the reopen");
}

#[tokio::test(start_paused = true)]
async fn hello_ack_rule_another_card_is_refused_naming_the_rule() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, _transport, mut peers) = start(config(&clock)).await;
    let mut state = plane.watch_state();
    let mut peer = peers.recv().await.expect("a connection attempt");
    let hello = packet(&peer.next_json().await.expect("hello"));
    send(
        &peer,
        Packet::with_payload("pkt_ack", ConnectorHelloAck::new("im.other", "conn_1"))
            .answering(&hello),
    )
    .await;
    let reason = loop {
        state.changed().await.expect("state");
        if let ConnectionState::Degraded { reason, .. } = &*state.borrow() {
            break reason.clone();
        }
    };
    assert!(reason.contains("hello_ack.card_id"), "{reason}");
}

#[tokio::test(start_paused = true)]
async fn hello_ack_rule_version_outside_the_window_is_refused_naming_the_rule() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, _transport, mut peers) = start(config(&clock)).await;
    let mut state = plane.watch_state();
    let mut peer = peers.recv().await.expect("a connection attempt");
    let hello = packet(&peer.next_json().await.expect("hello"));
    let mut ack = ConnectorHelloAck::new(CARD, "conn_1");
    ack.protocol_version = Some("2.0".into());
    send(&peer, Packet::with_payload("pkt_ack", ack).answering(&hello)).await;
    let reason = loop {
        state.changed().await.expect("state");
        if let ConnectionState::Degraded { reason, .. } = &*state.borrow() {
            break reason.clone();
        }
    };
    assert!(reason.contains("hello_ack.protocol_version"), "{reason}");
}

#[tokio::test(start_paused = true)]
async fn inbound_rule_invalid_chat_message_is_rejected_before_the_application_sees_it() {
    let clock = ManualClock::new(1_000);
    let (plane, mut events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    let opening = tokio::spawn({
        let plane = plane.clone();
        async move { plane.open_channel_for("alice", None).await }
    });
    MEM.answer_next_open(&mut peer, "cch_1", ConnectionStatus::Connected).await;
    opening.await.expect("joins").expect("opened");
    // A chat.message with neither text nor files breaks the IM v2 payload rules.
    let empty = json!({"schema": "xagent.connector.packet/v1", "packet_id": "pkt_m1",
        "type": "chat.message", "connector_channel_id": "cch_1",
        "payload": {"message_id": "msg_1"}});
    assert!(peer.send_json(empty).await);
    let answer = packet(&peer.next_json().await.expect("an answer"));
    let ack = answer.payload::<ChatMessageAck>().expect("a chat.message.ack");
    assert_eq!(ack.status.to_string(), "rejected");
    assert_eq!(answer.reply_to.as_ref().map(|r| r.as_str()), Some("pkt_m1"));
    let seen = next_event_matching(&mut events, Duration::from_secs(2), |e| {
        matches!(e, ClientEvent::ChatMessage(_))
    })
    .await;
    assert!(seen.is_none(), "the application must not see it");
}

#[tokio::test(start_paused = true)]
async fn inbound_rule_chat_message_on_a_channel_not_open_is_refused() {
    let clock = ManualClock::new(1_000);
    let (plane, mut events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    let stray = json!({"schema": "xagent.connector.packet/v1", "packet_id": "pkt_m1",
        "type": "chat.message", "connector_channel_id": "cch_never_opened",
        "payload": {"message_id": "msg_1", "text": "hi"}});
    assert!(peer.send_json(stray).await);
    let answer = packet(&peer.next_json().await.expect("an answer"));
    assert_eq!(answer.type_str(), "error");
    assert_eq!(
        answer.error.as_ref().map(|e| e.code.to_string()).as_deref(),
        Some("channel_not_open")
    );
    let seen = next_event_matching(&mut events, Duration::from_secs(2), |e| {
        matches!(e, ClientEvent::ChatMessage(_))
    })
    .await;
    assert!(seen.is_none());
}

#[tokio::test(start_paused = true)]
async fn request_rule_tool_invoke_resolves_the_channel_and_returns_the_typed_ack() {
    let clock = ManualClock::new(1_000);
    let (plane, mut events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    let opening = tokio::spawn({
        let plane = plane.clone();
        async move { plane.open_channel_for("alice", None).await }
    });
    MEM.answer_next_open(&mut peer, "cch_1", ConnectionStatus::Connected).await;
    opening.await.expect("joins").expect("opened");
    let arguments = json!({"connector_channel_id": "model-made-up", "text": "hello"});
    let call = tokio::spawn({
        let plane = plane.clone();
        let arguments = arguments.as_object().cloned().unwrap_or_default();
        async move { plane.invoke_tool("alice", None, "mem_send", arguments).await }
    });
    let invoke = packet(&peer.next_json().await.expect("tool.invoke"));
    assert_eq!(invoke.type_str(), "tool.invoke");
    assert_eq!(invoke.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_1"));
    let sent = invoke.to_value().expect("encodes");
    assert_eq!(sent["payload"]["arguments"], arguments, "arguments pass unchanged");
    let progress = json!({"schema": "xagent.connector.packet/v1", "packet_id": "pkt_p",
        "type": "tool.progress.push", "connector_channel_id": "cch_1",
        "payload": {"tool_id": "mem_send", "status": "running"}});
    assert!(peer.send_json(progress).await);
    send(
        &peer,
        Packet::with_payload("pkt_t", ToolInvokeAck::new("mem_send", json!({"status": "sent"})))
            .answering(&invoke),
    )
    .await;
    let outcome = call.await.expect("joins").expect("succeeds");
    assert_eq!(outcome.channel.as_str(), "cch_1");
    assert_eq!(outcome.ack.result, Some(json!({"status": "sent"})));
    let progress = next_event_matching(&mut events, Duration::from_secs(2), |e| {
        matches!(e, ClientEvent::ToolProgress { .. })
    })
    .await;
    assert!(progress.is_some(), "progress pushes are surfaced");
    // A session bound to another Card is refused before anything is sent.
    let binding = SessionBinding::new("im.other", "cch_1");
    match plane.invoke_tool("alice", Some(&binding), "mem_send", Default::default()).await {
        Err(ClientError::Refused(error)) => {
            assert_eq!(error.code.to_string(), "connector_channel_connector_mismatch")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn durable_state_rule_a_restart_reopens_channels_and_accepts_nothing_twice() {
    let dir = std::env::temp_dir().join(format!("xagent-durable-{}", rand_suffix()));
    let clock = ManualClock::new(1_000);
    let message = json!({"schema": "xagent.connector.packet/v1", "packet_id": "pkt_m1",
        "type": "chat.message", "connector_channel_id": "cch_1",
        "payload": {"message_id": "msg_1", "text": "hi"}});
    {
        let store = SqliteXagentStore::open(&dir).expect("opens");
        let (plane, mut events, _transport, mut peers) =
            start(config(&clock).with_store(Arc::new(store))).await;
        let mut peer = accept_hello(&mut peers).await;
        plane.connected().await.expect("online");
        let opening = tokio::spawn({
            let plane = plane.clone();
            async move { plane.open_channel_for("alice", None).await }
        });
        MEM.answer_next_open(&mut peer, "cch_1", ConnectionStatus::Connected).await;
        opening.await.expect("joins").expect("opened");
        plane.remember_channel("cch_1".into()).await;
        assert!(peer.send_json(message.clone()).await);
        let Some(ClientEvent::ChatMessage(inbound)) =
            next_event_matching(&mut events, Duration::from_secs(5), |e| {
                matches!(e, ClientEvent::ChatMessage(_))
            })
            .await
        else {
            panic!("the message reaches the application");
        };
        inbound.accept();
        let ack = packet(&peer.next_json().await.expect("ack"));
        assert_eq!(
            ack.payload::<ChatMessageAck>().map(|a| a.status.to_string()).as_deref(),
            Some("accepted")
        );
        plane.close().await;
    }
    // A new process on the same state: it reopens the channel by itself, and the redelivered
    // message is answered `duplicate` without reaching the application.
    let store = SqliteXagentStore::open(&dir).expect("reopens");
    let (plane, mut events, _transport, mut peers) =
        start(config(&clock).with_store(Arc::new(store))).await;
    let mut peer = accept_hello(&mut peers).await;
    let reopen = MEM.answer_next_open(&mut peer, "cch_1", ConnectionStatus::Connected).await;
    assert_eq!(reopen.connector_channel_id.as_ref().map(|c| c.as_str()), Some("cch_1"));
    plane.connected().await.expect("online");
    assert_eq!(plane.directory().owner(&"cch_1".into()).as_deref(), Some("alice"));
    assert!(peer.send_json(message).await);
    let ack = packet(&peer.next_json().await.expect("ack"));
    assert_eq!(
        ack.payload::<ChatMessageAck>().map(|a| a.status.to_string()).as_deref(),
        Some("duplicate")
    );
    let seen = next_event_matching(&mut events, Duration::from_secs(2), |e| {
        matches!(e, ClientEvent::ChatMessage(_))
    })
    .await;
    assert!(seen.is_none(), "accepted once only");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(start_paused = true)]
async fn descriptor_rule_a_push_for_another_channel_is_not_applied() {
    let clock = ManualClock::new(1_000);
    let (plane, mut events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    let opening = tokio::spawn({
        let plane = plane.clone();
        async move { plane.open_channel_for("alice", None).await }
    });
    MEM.answer_next_open(&mut peer, "cch_1", ConnectionStatus::Created).await;
    opening.await.expect("joins").expect("opened");
    let wrong = descriptor("cch_2", ConnectionStatus::Connected);
    let push = json!({"schema": "xagent.connector.packet/v1", "packet_id": "pkt_d",
        "type": "connection.descriptor.push", "connector_channel_id": "cch_1",
        "payload": {"connection_descriptor": serde_json::to_value(&wrong).expect("encodes")}});
    assert!(peer.send_json(push).await);
    let seen = next_event_matching(&mut events, Duration::from_secs(2), |e| {
        matches!(e, ClientEvent::DescriptorPushed { .. })
    })
    .await;
    assert!(seen.is_none());
    let entry = plane.directory().get(&"cch_1".into()).cloned().expect("known");
    assert_eq!(entry.status(), Some(&ConnectionStatus::Created), "the bad push changed nothing");
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id())
}

#[tokio::test(start_paused = true)]
async fn inbound_rule_deltas_and_activity_from_the_connector_are_refused_not_delivered() {
    let clock = ManualClock::new(1_000);
    let (plane, mut events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    let opening = tokio::spawn({
        let plane = plane.clone();
        async move { plane.open_channel_for("alice", None).await }
    });
    MEM.answer_next_open(&mut peer, "cch_1", ConnectionStatus::Connected).await;
    opening.await.expect("joins").expect("opened");
    // IM v2 deltas and activity flow from xAgent to the Connector only.
    for (id, packet_type, payload) in [
        (
            "pkt_d",
            "chat.message.delta",
            json!({"message_id": "msg_1", "sequence": 1, "text": "hi"}),
        ),
        ("pkt_a", "chat.activity", json!({"status": "thinking"})),
    ] {
        let wrong_way = json!({"schema": "xagent.connector.packet/v1", "packet_id": id,
            "type": packet_type, "connector_channel_id": "cch_1", "payload": payload});
        assert!(peer.send_json(wrong_way).await);
        let answer = packet(&peer.next_json().await.expect("an answer"));
        assert_eq!(answer.type_str(), "error", "{packet_type}");
        assert_eq!(
            answer.error.as_ref().map(|e| e.code.to_string()).as_deref(),
            Some("unsupported_packet"),
            "{packet_type}"
        );
    }
    let seen = next_event_matching(&mut events, Duration::from_secs(2), |e| {
        !matches!(e, ClientEvent::State(_) | ClientEvent::Connected { .. })
    })
    .await;
    assert!(seen.is_none(), "the application sees none of them: {seen:?}");
}

#[tokio::test(start_paused = true)]
async fn validator_rule_an_ack_that_breaks_the_rules_fails_its_request_naming_the_rule() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    let opening = tokio::spawn({
        let plane = plane.clone();
        async move { plane.open_channel_for("alice", None).await }
    });
    let open = packet(&peer.next_json().await.expect("channel.open"));
    // A Descriptor whose Profiles list is empty.
    let mut descriptor =
        serde_json::to_value(descriptor("cch_1", ConnectionStatus::Created)).expect("encodes");
    descriptor["connection"]["profiles"] = json!([]);
    let ack = json!({"schema": "xagent.connector.packet/v1", "packet_id": "pkt_oa",
        "type": "channel.open.ack", "request_id": open.request_id.as_ref().map(|r| r.as_str()),
        "reply_to": open.packet_id.as_str(), "connector_channel_id": "cch_1",
        "payload": {"connector_channel_id": "cch_1", "connection_descriptor": descriptor}});
    assert!(peer.send_json(ack).await);
    match opening.await.expect("joins") {
        Err(ClientError::Refused(error)) => {
            assert_eq!(error.code.to_string(), "invalid_packet");
            assert!(error.message().contains("descriptor.profiles"), "{}", error.message());
        }
        other => panic!("the ack must be refused, got {other:?}"),
    }
    assert!(plane.directory().get(&"cch_1".into()).is_none_or(|e| e.descriptor.is_none()));
}

#[tokio::test(start_paused = true)]
async fn validator_rule_a_push_that_breaks_the_rules_gets_invalid_packet_and_is_not_delivered() {
    let clock = ManualClock::new(1_000);
    let (plane, mut events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    let opening = tokio::spawn({
        let plane = plane.clone();
        async move { plane.open_channel_for("alice", None).await }
    });
    MEM.answer_next_open(&mut peer, "cch_1", ConnectionStatus::Connected).await;
    opening.await.expect("joins").expect("opened");
    let progress = json!({"schema": "xagent.connector.packet/v1", "packet_id": "pkt_p",
        "type": "tool.progress.push", "connector_channel_id": "cch_1",
        "payload": {"tool_id": "mem_send", "progress": 5.0}});
    assert!(peer.send_json(progress).await);
    let answer = packet(&peer.next_json().await.expect("an answer"));
    assert_eq!(
        answer.error.as_ref().map(|e| e.code.to_string()).as_deref(),
        Some("invalid_packet")
    );
    assert!(answer.error.as_ref().is_some_and(|e| e.message().contains("tool_progress.progress")));
    let seen = next_event_matching(&mut events, Duration::from_secs(2), |e| {
        matches!(e, ClientEvent::ToolProgress { .. })
    })
    .await;
    assert!(seen.is_none());
}

#[tokio::test(start_paused = true)]
async fn readmission_rule_a_new_card_tool_is_accepted_in_descriptors_after_set_card() {
    let clock = ManualClock::new(1_000);
    let (plane, mut events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    let opening = tokio::spawn({
        let plane = plane.clone();
        async move { plane.open_channel_for("alice", None).await }
    });
    MEM.answer_next_open(&mut peer, "cch_1", ConnectionStatus::Connected).await;
    opening.await.expect("joins").expect("opened");
    // The Connector was upgraded: a refetch re-admitted a Card with a second Tool.
    let schema = json!({"type": "object", "required": ["connector_channel_id"],
        "properties": {"connector_channel_id": {"type": "string"}}});
    let upgraded = card()
        .with_tool(CardTool::new("mem_history", schema.as_object().cloned().unwrap_or_default()));
    plane.set_card(upgraded);
    let pushed = descriptor("cch_1", ConnectionStatus::Connected)
        .with_tool(DescriptorTool::available("mem_history"));
    let push = json!({"schema": "xagent.connector.packet/v1", "packet_id": "pkt_d2",
        "type": "connection.descriptor.push", "connector_channel_id": "cch_1",
        "payload": {"connection_descriptor": serde_json::to_value(&pushed).expect("encodes")}});
    assert!(peer.send_json(push).await);
    let seen = next_event_matching(&mut events, Duration::from_secs(2), |e| {
        matches!(e, ClientEvent::DescriptorPushed { .. })
    })
    .await;
    assert!(seen.is_some(), "the packet rules judge by the re-admitted Card, not the first one");
    let entry = plane.directory().get(&"cch_1".into()).cloned().expect("known");
    assert!(format!("{entry:?}").contains("mem_history"), "the new Tool is in the directory");
}

/// Section 8.22: a `ping` from the Connector is answered with a `pong` carrying its
/// `request_id` (and answering its packet).
#[tokio::test(start_paused = true)]
async fn ping_rule_a_connectors_ping_gets_a_pong_with_its_request_id() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    let ping = Packet::with_payload("pkt_ping", Ping::default()).request_id("req_ping");
    send(&peer, ping).await;
    let pong = tokio::time::timeout(Duration::from_secs(5), support::next(&mut peer, "pong"))
        .await
        .expect("the ping is answered");
    assert_eq!(pong.request_id.as_ref().map(|r| r.as_str()), Some("req_ping"));
    assert_eq!(pong.reply_to.as_ref().map(|r| r.as_str()), Some("pkt_ping"));
}

/// Section 8.3: a channel opened but never signed in is not persisted, so a reconnect reopens
/// only the remembered (signed-in) channels, never the unauthenticated one.
#[tokio::test(start_paused = true)]
async fn reconnect_rule_a_channel_opened_but_not_signed_in_is_not_reopened() {
    let clock = ManualClock::new(1_000);
    let (plane, _events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer = accept_hello(&mut peers).await;
    plane.connected().await.expect("online");
    // Two users (the Card's user_channel_mode is single): alice signs in, bob only opens.
    for (owner, channel, status) in [
        ("alice", "cch_signed", ConnectionStatus::Connected),
        ("bob", "cch_created", ConnectionStatus::Created),
    ] {
        let opening = tokio::spawn({
            let plane = plane.clone();
            async move { plane.open_channel_for(owner, None).await }
        });
        MEM.answer_next_open(&mut peer, channel, status).await;
        opening.await.expect("joins").expect("opened");
    }
    plane.remember_channel("cch_signed".into()).await;
    // The connection drops; the client reconnects.
    drop(peer);
    let mut peer = accept_hello(&mut peers).await;
    let mut reopened = Vec::new();
    let quiet_until = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(Some(value)) = tokio::time::timeout_at(quiet_until, peer.next_json()).await {
        let sent = packet(&value);
        if sent.type_str() == "channel.open" {
            let channel = sent.connector_channel_id.clone().expect("a reopen names its channel");
            MEM.answer_open(&peer, &sent, channel.as_str(), ConnectionStatus::Connected).await;
            reopened.push(channel.to_string());
        }
    }
    assert_eq!(reopened, ["cch_signed"], "only the remembered channel is reopened");
}

/// Accepts the next inbound chat message the application sees.
async fn accept_next(events: &mut xagent_client_runtime::Events) {
    let seen = next_event_matching(events, Duration::from_secs(5), |e| {
        matches!(e, ClientEvent::ChatMessage(_))
    })
    .await;
    let Some(ClientEvent::ChatMessage(message)) = seen else {
        panic!("the message reaches the application: {seen:?}");
    };
    message.accept();
}

/// Architecture 3.4: a new `connector_id` is a rebuilt Connector runtime instance, whose old
/// channels went with it. The client's state for them is replaced at once instead of carrying
/// on: no Tool resolves on the old Descriptor, the old instance's pending assistant message is
/// not sent to the new one, and a message id the old instance delivered is a new message.
#[tokio::test(start_paused = true)]
async fn replaced_rule_a_new_connector_id_replaces_outbox_idempotency_and_directory() {
    let clock = ManualClock::new(1_000);
    let (plane, mut events, _transport, mut peers) = start(config(&clock)).await;
    let mut peer =
        MEM.online_with_channel(&plane, &mut peers, "cch_1", ConnectionStatus::Connected).await;
    plane.remember_channel("cch_1".into()).await;
    let inbound = |channel: &str| {
        json!({"schema": "xagent.connector.packet/v1", "packet_id": format!("pkt_in_{channel}"),
            "type": "chat.message", "connector_channel_id": channel,
            "payload": {"message_id": "msg_in", "text": "hi"}})
    };
    assert!(peer.send_json(inbound("cch_1")).await);
    accept_next(&mut events).await;
    let ack = support::next(&mut peer, "chat.message.ack").await;
    assert_eq!(
        ack.payload::<ChatMessageAck>().map(|a| a.status.to_string()).as_deref(),
        Some("accepted")
    );
    plane
        .send_chat_message(&"cch_1".into(), ChatMessage::text("msg_out", "reply"))
        .await
        .expect("queued");
    support::next(&mut peer, "chat.message").await;
    assert!(plane.directory().resolve("alice", None, MEM.tool).is_ok());

    // The connection drops; the Connector comes back as another runtime instance.
    drop(peer);
    let (mut peer, _) = support::accept_hello_as(&mut peers, "conn_2").await;
    let reopen = support::next(&mut peer, "channel.open").await;
    let stale = plane.directory().resolve("alice", None, MEM.tool);
    assert_eq!(stale.map_err(|e| e.code.to_string()), Err("connection_not_found".into()));
    // It does not know cch_1: a new id, and the new instance's Descriptor.
    let mut fresh = MEM.descriptor("cch_9", ConnectionStatus::Connected);
    fresh.connection.connector_id = "conn_2".into();
    let ack = ChannelOpenAck::new("cch_9".into(), fresh);
    send(&peer, Packet::with_payload("pkt_reopen", ack).answering(&reopen).channel("cch_9")).await;
    let quiet_until = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(Some(value)) = tokio::time::timeout_at(quiet_until, peer.next_json()).await {
        let sent = packet(&value);
        assert_ne!(
            sent.type_str(),
            "chat.message",
            "the old instance's message was sent: {sent:?}"
        );
    }
    assert_eq!(
        plane.directory().resolve("alice", None, MEM.tool).map(|c| c.to_string()),
        Ok("cch_9".to_owned())
    );
    // The new instance's first message reuses an id the old one delivered: accepted.
    assert!(peer.send_json(inbound("cch_9")).await);
    accept_next(&mut events).await;
    let ack = support::next(&mut peer, "chat.message.ack").await;
    assert_eq!(
        ack.payload::<ChatMessageAck>().map(|a| a.status.to_string()).as_deref(),
        Some("accepted")
    );
}
