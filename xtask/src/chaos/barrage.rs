//! The `barrage` scenario: random and mutated packets over one live socket to an in-process
//! echo Connector, each followed by a `ping`; every answer must be a well-formed packet with a
//! known code, and the socket must stay up.

use super::harness::Rng;
use crate::bench_support::{API_KEY, EchoConnector, PacketSocket, temp_dir};
use anyhow::Result;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use xagent_protocol_types::{ErrorCode, Packet, PacketBody, Role};

/// A valid packet the barrage mutates, for a signed-in channel.
pub(crate) fn templates(channel: &str) -> Vec<Value> {
    let s = "xagent.connector.packet/v1";
    vec![
        json!({"schema": s, "packet_id": "p1", "request_id": "r1", "connector_channel_id": channel, "type": "tool.invoke",
               "payload": {"tool_id": "echo_noop", "arguments": {"connector_channel_id": channel}}}),
        json!({"schema": s, "packet_id": "p2", "request_id": "r2", "connector_channel_id": channel, "type": "tool.invoke",
               "payload": {"tool_id": "echo_send", "arguments": {"connector_channel_id": channel, "text": "hi"}}}),
        json!({"schema": s, "packet_id": "p3", "connector_channel_id": channel, "type": "chat.message",
               "payload": {"message_id": "mut_1", "text": "hello", "created_at": 1_790_000_000_000u64}}),
        json!({"schema": s, "packet_id": "p4", "connector_channel_id": channel, "type": "chat.message.delta",
               "payload": {"message_id": "mut_d", "delta": "he", "seq": 1}}),
        json!({"schema": s, "packet_id": "p5", "connector_channel_id": channel, "type": "chat.activity",
               "payload": {"state": "typing"}}),
        json!({"schema": s, "packet_id": "p6", "request_id": "r6", "connector_channel_id": channel, "type": "connection.descriptor.get"}),
        json!({"schema": s, "packet_id": "p7", "reply_to": "nothing", "connector_channel_id": channel, "type": "chat.message.ack",
               "payload": {"message_id": "m_x", "status": "accepted"}}),
        json!({"schema": s, "packet_id": "p8", "request_id": "r8", "type": "ping"}),
        json!({"schema": s, "packet_id": "p9", "request_id": "r9", "connector_channel_id": channel, "type": "auth.status",
               "payload": {"auth_session_id": "as_x"}}),
    ]
}

fn random_value(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0 => Value::Null,
        1 => json!(rng.next() as i64),
        2 => json!(-1.5e300),
        3 => json!(""),
        4 => json!("x".repeat(rng.below(5000) as usize)),
        5 => json!([1, "two", null]),
        6 => json!({"nested": {"deeper": [{}]}}),
        _ => json!(true),
    }
}

/// One malformed or mutated packet text.
pub(crate) fn mutate(rng: &mut Rng, templates: &[Value], n: usize) -> String {
    let mut base = templates[rng.below(templates.len() as u64) as usize].clone();
    // Fresh ids so that repeats are not answered from the idempotency caches only.
    if base.get("request_id").is_some() {
        base["request_id"] = json!(format!("rq_{n}"));
    }
    base["packet_id"] = json!(format!("pk_{n}"));
    if base["type"] == "chat.message" {
        base["payload"]["message_id"] = json!(format!("mut_{n}"));
    }
    match rng.below(6) {
        0 => {
            // Random printable bytes.
            let len = rng.below(300) as usize;
            (0..len).map(|_| (32 + rng.below(95) as u8) as char).collect()
        }
        1 => {
            // Flipped characters in a valid packet.
            let mut bytes = base.to_string().into_bytes();
            for _ in 0..1 + rng.below(6) {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] = 32 + rng.below(95) as u8;
            }
            String::from_utf8_lossy(&bytes).into_owned()
        }
        2 => {
            // Truncated.
            let text = base.to_string();
            let cut = rng.below(text.len() as u64) as usize;
            text[..cut].to_string()
        }
        3 => {
            // A field removed or replaced with a value of another type.
            let fields = [
                "schema",
                "packet_id",
                "request_id",
                "type",
                "connector_channel_id",
                "payload",
                "reply_to",
                "time",
            ];
            let field = fields[rng.below(fields.len() as u64) as usize];
            if rng.below(2) == 0 {
                if let Some(object) = base.as_object_mut() {
                    object.remove(field);
                }
            } else {
                base[field] = random_value(rng);
            }
            base.to_string()
        }
        4 => {
            // A payload field replaced, removed or added.
            if let Some(payload) = base.get_mut("payload").and_then(Value::as_object_mut) {
                let keys: Vec<String> = payload.keys().cloned().collect();
                match rng.below(3) {
                    0 if !keys.is_empty() => {
                        payload.remove(&keys[rng.below(keys.len() as u64) as usize]);
                    }
                    1 if !keys.is_empty() => {
                        let key = keys[rng.below(keys.len() as u64) as usize].clone();
                        payload.insert(key, random_value(rng));
                    }
                    _ => {
                        payload.insert(format!("x_{}", rng.below(100)), random_value(rng));
                    }
                }
            } else {
                base["payload"] = random_value(rng);
            }
            base.to_string()
        }
        _ => {
            // An unknown or misplaced type.
            let types = [
                "x.unknown",
                "",
                "tool.invoke.ack",
                "connector.hello.ack",
                "channel.open.ack",
                "pong",
                "message.push",
                "tool.progress.push",
                "error",
            ];
            base["type"] = json!(types[rng.below(types.len() as u64) as usize]);
            base.to_string()
        }
    }
}

pub(crate) async fn barrage(count: usize, rng: &mut Rng) -> Result<Value> {
    let dir = temp_dir("chaos-barrage")?;
    let connector = EchoConnector::start(&dir).await?;
    let mut socket = PacketSocket::connect(&connector.ws_url(), Some(API_KEY)).await?;
    let channel = socket.echo_session(true, None).await?;
    let templates = templates(&channel);
    let started = Instant::now();
    let (mut wrong, mut pongs_missed, mut answers, mut silent) = (0u64, 0u64, 0u64, 0u64);
    let mut acked_accepted: HashSet<String> = HashSet::new();
    let mut valid_sent = 0u64;
    let mut codes: HashMap<String, u64> = HashMap::new();
    let mut examples: Vec<String> = Vec::new();
    for n in 0..count {
        let (text, valid_message) = if n % 50 == 49 {
            valid_sent += 1;
            let packet = json!({"schema": "xagent.connector.packet/v1", "packet_id": format!("pv_{n}"), "connector_channel_id": channel,
                "type": "chat.message", "payload": {"message_id": format!("ok_{n}"), "text": format!("valid {n}")}});
            (packet.to_string(), true)
        } else {
            (mutate(rng, &templates, n), false)
        };
        let expected_decode = Packet::decode_str(&text);
        socket.send_text(text.clone()).await?;
        let ping_id = format!("ping_{n}");
        socket
            .send_text(json!({"schema": "xagent.connector.packet/v1", "packet_id": format!("pp_{n}"), "request_id": ping_id, "type": "ping"}).to_string())
            .await?;
        let mut replies = Vec::new();
        let mut got_pong = false;
        while !got_pong {
            let Some(frame) = socket.recv_text(Duration::from_secs(10)).await.ok().flatten() else {
                break;
            };
            let Ok(packet) = Packet::decode_str(&frame) else {
                wrong += 1;
                examples.push(format!("undecodable answer {frame}"));
                continue;
            };
            if packet.type_str() == "pong"
                && packet.request_id.as_ref().is_some_and(|r| r.as_str() == ping_id)
            {
                got_pong = true;
            } else {
                replies.push(packet);
            }
        }
        if !got_pong {
            pongs_missed += 1;
            break;
        }
        // `chat.message`, deltas and activity are handled in the channel's lane, and a
        // `tool.invoke` in a task of its own, concurrently with connection-level packets:
        // their answer may come after the pong. Wait for it (a `chat.message` and a
        // `tool.invoke` always have one; deltas and activity only on error), and count only
        // answers to this packet (a late answer to an earlier one is not this one's).
        let sent_id = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["packet_id"].as_str().map(str::to_owned));
        if let (Ok(packet), Some(sent_id)) = (&expected_decode, &sent_id) {
            let lane = match packet.type_str() {
                "chat.message" | "tool.invoke" => Some(Duration::from_secs(10)),
                "chat.message.delta" | "chat.activity" => Some(Duration::from_millis(200)),
                _ => None,
            };
            if let Some(wait) = lane {
                let answered =
                    |r: &Packet| r.reply_to.as_ref().is_some_and(|p| p.as_str() == sent_id);
                let deadline = Instant::now() + wait;
                while !replies.iter().any(answered) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match socket.recv_text(left).await {
                        Ok(Some(frame)) => {
                            if let Ok(packet) = Packet::decode_str(&frame) {
                                replies.push(packet);
                            }
                        }
                        _ => break,
                    }
                }
            }
        }
        for reply in &replies {
            if let PacketBody::ChatMessageAck(ack) = &reply.body
                && ack.status.as_str() == "accepted"
            {
                acked_accepted.insert(ack.message_id.as_str().to_string());
            }
        }
        if let Some(sent_id) = &sent_id {
            replies.retain(|r| r.reply_to.as_ref().is_none_or(|p| p.as_str() == sent_id.as_str()));
        }
        if replies.is_empty() {
            silent += 1;
        } else {
            answers += 1;
        }
        let mut bad = |why: String| {
            wrong += 1;
            if examples.len() < 10 {
                examples
                    .push(format!("{why}: sent {}", text.chars().take(200).collect::<String>()));
            }
        };
        for reply in &replies {
            let code = reply.error.as_ref().map(|e| e.code.clone());
            if let Some(code) = &code {
                *codes.entry(code.to_string()).or_default() += 1;
                if matches!(code, ErrorCode::Other(_)) || *code == ErrorCode::InternalError {
                    bad(format!("error code {code}"));
                }
            }
        }
        match &expected_decode {
            Err(error) => {
                // Our decoder refuses it: the spec wants one `error` packet with that code.
                let errors: Vec<&Packet> =
                    replies.iter().filter(|p| p.type_str() == "error").collect();
                if errors.len() != 1
                    || errors[0].error.as_ref().map(|e| &e.code) != Some(&error.code())
                {
                    bad(format!(
                        "decode error {} answered with {:?}",
                        error.code(),
                        replies
                            .iter()
                            .map(|p| (
                                p.type_str().to_string(),
                                p.error.as_ref().map(|e| e.code.to_string())
                            ))
                            .collect::<Vec<_>>()
                    ));
                }
            }
            Ok(packet) if valid_message => {
                let acked = replies.iter().any(|p| matches!(&p.body, PacketBody::ChatMessageAck(a) if a.status.as_str() == "accepted"));
                if !acked {
                    bad(format!("valid chat.message {} not accepted", packet.packet_id));
                }
            }
            Ok(packet) => {
                // Silence is an answer only for packets that need none (pushes, stray acks).
                let needs_answer = packet.type_str() == "chat.message"
                    || matches!(
                        packet.packet_type().spec().map(|s| s.role),
                        Some(Role::Request { .. })
                    );
                if replies.is_empty() && needs_answer {
                    bad(format!("{} got no answer", packet.type_str()));
                }
                if packet.type_str() == "x.unknown"
                    && !replies.iter().any(|p| {
                        p.error.as_ref().is_some_and(|e| e.code == ErrorCode::UnsupportedPacket)
                    })
                {
                    bad("unknown type not answered unsupported_packet".into());
                }
            }
        }
    }
    let delivered: HashSet<String> = connector
        .echo
        .log()
        .delivered
        .iter()
        .map(|(_, m, _)| m.message_id.as_str().to_string())
        .collect();
    let accepted_lost = acked_accepted.iter().filter(|id| !delivered.contains(*id)).count();
    let valid_acked = acked_accepted.iter().filter(|id| id.starts_with("ok_")).count() as u64;
    let seconds = started.elapsed().as_secs_f64();
    connector.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    let pass = wrong == 0 && pongs_missed == 0 && accepted_lost == 0 && valid_acked == valid_sent;
    Ok(json!({
        "packets": count,
        "valid_interleaved": valid_sent,
        "valid_accepted": valid_acked,
        "answered": answers,
        "silent_by_spec": silent,
        "error_codes": codes,
        "wrong_answers": wrong,
        "pongs_missed": pongs_missed,
        "accepted_total": acked_accepted.len(),
        "accepted_lost": accepted_lost,
        "examples": examples,
        "seconds": seconds,
        "pass": pass,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_never_panic_and_mostly_break_the_packet() {
        let templates = templates("cch_test");
        let mut rng = Rng::new(7);
        let mut undecodable = 0;
        for n in 0..2_000 {
            let text = mutate(&mut rng, &templates, n);
            if Packet::decode_str(&text).is_err() {
                undecodable += 1;
            }
        }
        assert!(undecodable > 500, "only {undecodable} of 2000 mutations were refused");
    }
}
