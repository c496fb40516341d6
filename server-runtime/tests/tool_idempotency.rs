//! `tool.invoke` idempotency under concurrency (SPEC-NOTES: the key is the channel plus
//! `context.tool_call_id`): a repeat that arrives while the first call still runs waits for
//! it and gets its result, the Tool runs once; the same key with other arguments is an
//! `idempotency_conflict` at once, even while the first call runs. Also: a panicking handler
//! is an `internal_error` ack, and the connection survives it.

mod support;

use std::time::Duration;

use serde_json::{Map, Value, json};
use xagent_protocol_types::{
    ConnectorChannelId, ErrorCode, Packet, Ping, ToolInvoke, ToolInvokeContext,
};
use xagent_server_runtime::{RuntimeConfig, ToolContext, ToolSpec};
use xagent_testkit::{WsClient, has_error, payload_json};

fn args(channel: &ConnectorChannelId, text: &str) -> Map<String, Value> {
    json!({ "connector_channel_id": channel, "text": text }).as_object().cloned().unwrap()
}

fn invoke(c: &mut WsClient, channel: &ConnectorChannelId, call_id: &str, text: &str) -> Packet {
    c.request(
        ToolInvoke::new("slow_work", args(channel, text))
            .with_context(ToolInvokeContext::with_call_id(call_id)),
        Some(channel),
    )
}

/// Reads until the acks answering every packet in `requests` arrived; returns them in the
/// order of `requests`. Fails if another tool ack arrives.
async fn acks_for(c: &mut WsClient, requests: &[&Packet]) -> Vec<Packet> {
    let mut found: Vec<Option<Packet>> = vec![None; requests.len()];
    while found.iter().any(Option::is_none) {
        let packet = c.next_packet().await;
        if packet.type_str() != "tool.invoke.ack" {
            continue;
        }
        let index = requests
            .iter()
            .position(|r| packet.reply_to.as_ref() == Some(&r.packet_id))
            .unwrap_or_else(|| panic!("an unexpected ack: {packet:?}"));
        assert!(found[index].is_none(), "two acks for one request");
        found[index] = Some(packet);
    }
    found.into_iter().map(Option::unwrap).collect()
}

#[tokio::test]
async fn rule_tool_idempotency_a_concurrent_repeat_waits_for_the_first_result_and_runs_once() {
    let gate = support::Gate::new();
    let h = support::serve_custom(
        support::gated_connector(&gate).build().unwrap(),
        RuntimeConfig::default(),
        None,
    )
    .await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;

    let first = invoke(&mut c, &channel, "call_same", "hello");
    c.send(&first).await;
    gate.started.notified().await;
    assert_eq!(gate.runs(), 1);

    // The same key and arguments while the first call runs: it must wait, not run again.
    let repeat = invoke(&mut c, &channel, "call_same", "hello");
    c.send(&repeat).await;
    // The same key with other arguments: refused at once, while the first call still runs.
    let conflicting = invoke(&mut c, &channel, "call_same", "other text");
    c.send(&conflicting).await;
    let conflict = acks_for(&mut c, &[&conflicting]).await.remove(0);
    assert!(has_error(&conflict, &ErrorCode::IdempotencyConflict), "{conflict:?}");
    assert_eq!(conflict.request_id, conflicting.request_id);

    // Neither the first call nor the waiting repeat has answered yet.
    let ping = c.request(Ping::default(), None);
    let pong = c.call(ping).await;
    assert_eq!(pong.type_str(), "pong", "the connection keeps serving while a tool runs");
    let early = tokio::time::timeout(Duration::from_millis(100), c.next_packet()).await;
    assert!(early.is_err(), "an ack arrived before the first call finished: {early:?}");

    gate.open(1);
    let acks = acks_for(&mut c, &[&first, &repeat]).await;
    assert_eq!(payload_json(&acks[0])["result"], json!({ "text": "hello", "run": 1 }));
    assert_eq!(payload_json(&acks[1])["result"], payload_json(&acks[0])["result"]);
    assert_eq!(acks[1].request_id, repeat.request_id, "each ack answers its own request");
    assert_eq!(gate.runs(), 1, "the tool ran once for one tool_call_id");

    // After completion: a repeat is answered from the stored result, a conflict stays one.
    let later = invoke(&mut c, &channel, "call_same", "hello");
    let later = c.call(later).await;
    assert_eq!(payload_json(&later)["result"], json!({ "text": "hello", "run": 1 }));
    let later_conflict = invoke(&mut c, &channel, "call_same", "changed");
    let later_conflict = c.call(later_conflict).await;
    assert!(has_error(&later_conflict, &ErrorCode::IdempotencyConflict));
    assert_eq!(gate.runs(), 1);

    // Another tool_call_id is another call.
    gate.open(1);
    let other = invoke(&mut c, &channel, "call_other", "hello");
    let other = c.call(other).await;
    assert_eq!(payload_json(&other)["result"]["run"], 2);
    h.stop().await;
}

#[tokio::test]
async fn rule_tool_idempotency_the_key_is_per_channel() {
    let gate = support::Gate::new();
    gate.open(10);
    let h = support::serve_custom(
        support::gated_connector(&gate).build().unwrap(),
        RuntimeConfig::default(),
        None,
    )
    .await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (a, _) = c.open_channel(None).await;
    let (b, _) = c.open_channel(None).await;
    c.sign_in(&a, "tok-a").await;
    c.sign_in(&b, "tok-b").await;
    let on_a = invoke(&mut c, &a, "call_1", "x");
    let on_a = c.call(on_a).await;
    // The same tool_call_id on another channel is not a repeat, nor a conflict.
    let on_b = invoke(&mut c, &b, "call_1", "y");
    let on_b = c.call(on_b).await;
    assert_eq!(payload_json(&on_a)["result"]["run"], 1);
    assert_eq!(payload_json(&on_b)["result"], json!({ "text": "y", "run": 2 }));
    h.stop().await;
}

#[tokio::test]
async fn rule_a_panicking_tool_handler_is_an_internal_error_ack_and_the_connection_lives() {
    let gate = support::Gate::new();
    let connector = support::gated_connector(&gate)
        .tool::<support::GateArgs, _, _, _>(
            ToolSpec::new("boom", concat!("Boom", "\n", "Panics.")),
            |_ctx: ToolContext, args: support::GateArgs| async move {
                if !args.text.is_empty() {
                    panic!("the handler failed badly");
                }
                Ok(json!({}))
            },
        )
        .build()
        .unwrap();
    let h = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    let boom = c.request(ToolInvoke::new("boom", args(&channel, "now")), Some(&channel));
    let ack = c.call(boom).await;
    assert_eq!(ack.type_str(), "tool.invoke.ack");
    assert!(has_error(&ack, &ErrorCode::InternalError), "{ack:?}");
    let ping = c.request(Ping::default(), None);
    assert_eq!(c.call(ping).await.type_str(), "pong");
    h.stop().await;
}

#[tokio::test]
async fn rule_tool_idempotency_without_a_tool_call_id_the_key_is_the_request_id() {
    let gate = support::Gate::new();
    gate.open(10);
    let h = support::serve_custom(
        support::gated_connector(&gate).build().unwrap(),
        RuntimeConfig::default(),
        None,
    )
    .await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    let by_request = |packet_id: &str, text: &str| {
        Packet::with_payload(packet_id, ToolInvoke::new("slow_work", args(&channel, text)))
            .request_id("req_fixed")
            .channel(channel.clone())
    };
    let first = c.call(by_request("pkt_a", "hello")).await;
    assert_eq!(payload_json(&first)["result"]["run"], 1);
    // A retransmission (new packet id, same request id and arguments) is answered again.
    let again = c.call(by_request("pkt_b", "hello")).await;
    assert_eq!(payload_json(&again)["result"], payload_json(&first)["result"]);
    assert_eq!(gate.runs(), 1);
    let conflict = c.call(by_request("pkt_c", "different")).await;
    assert!(has_error(&conflict, &ErrorCode::IdempotencyConflict), "{conflict:?}");
    // Another request id is another call.
    let other = c.request(ToolInvoke::new("slow_work", args(&channel, "hello")), Some(&channel));
    assert_eq!(payload_json(&c.call(other).await)["result"]["run"], 2);
    h.stop().await;
}

#[tokio::test]
async fn rule_tool_idempotency_window_is_24_hours_on_the_injected_clock() {
    const DAY: u64 = 24 * 3_600_000;
    let gate = support::Gate::new();
    gate.open(10);
    let h = support::serve_custom(
        support::gated_connector(&gate).build().unwrap(),
        RuntimeConfig::default(),
        None,
    )
    .await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    let first = invoke(&mut c, &channel, "call_day", "hello");
    assert_eq!(payload_json(&c.call(first).await)["result"]["run"], 1);

    // Just inside the window: still the stored result.
    h.clock.advance(DAY - 1);
    h.server.tick().await;
    let inside = invoke(&mut c, &channel, "call_day", "hello");
    assert_eq!(payload_json(&c.call(inside).await)["result"]["run"], 1);
    assert_eq!(gate.runs(), 1);

    // Past the window the key is forgotten, even before maintenance pruned it: the same key
    // runs again (and is then stored).
    h.clock.advance(2);
    let outside = invoke(&mut c, &channel, "call_day", "other arguments are fine now");
    assert_eq!(payload_json(&c.call(outside).await)["result"]["run"], 2);
    assert_eq!(gate.runs(), 2);
    h.server.tick().await;
    let repeat = invoke(&mut c, &channel, "call_day", "other arguments are fine now");
    assert_eq!(payload_json(&c.call(repeat).await)["result"]["run"], 2, "the new result is kept");
    h.stop().await;
}

#[tokio::test]
async fn rule_tool_idempotency_a_read_only_tool_shares_concurrent_runs_but_keeps_no_record() {
    let gate = support::Gate::new();
    let counter = gate.clone();
    let connector = support::gated_connector(&gate)
        .tool::<support::GateArgs, _, _, _>(
            ToolSpec::new("peek", concat!("Peek", "\n", "Counts its runs; changes nothing."))
                .read_only(),
            move |_ctx: ToolContext, args: support::GateArgs| {
                let counter = counter.clone();
                async move {
                    let run = counter.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    Ok(json!({ "text": args.text, "run": run }))
                }
            },
        )
        .build()
        .unwrap();
    assert!(connector.card().tool("peek").is_some(), "declared like any Tool");
    let h = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    let peek = |c: &mut WsClient| {
        c.request(
            ToolInvoke::new("peek", args(&channel, "look"))
                .with_context(ToolInvokeContext::with_call_id("call_peek")),
            Some(&channel),
        )
    };
    let first = peek(&mut c);
    let first = c.call(first).await;
    assert_eq!(payload_json(&first)["result"]["run"], 1);
    // A later repeat runs again (harmless for a read-only Tool): nothing was stored.
    let again = peek(&mut c);
    let again = c.call(again).await;
    assert_eq!(payload_json(&again)["result"]["run"], 2);
    assert_eq!(gate.runs(), 2);
}
