//! The whole lifecycle with a known API key and target token; every log line, the Card, the
//! Skill, every Descriptor, ack and payload the Connector produced is scanned for them.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::json;
use xagent_protocol_types::{
    AuthLogout, ChannelClose, ChatMessage, ChatMessageAck, DescriptorGet, Packet, ToolInvoke,
};
use xagent_testkit::{inject_message, payload_json};

const TARGET_TOKEN: &str = "tgt-9d2f7c41e8a35b06";

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn rule_no_secret_in_logs_card_skill_descriptors_acks_or_payloads() {
    let capture = Capture::default();
    let writer = capture.clone();
    // Both formats a Connector logs in (text and JSON lines), at every level, into one capture.
    use tracing_subscriber::layer::SubscriberExt;
    let json_writer = capture.clone();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::TRACE)
        .with(xagent_server_runtime::ops::log_layer(
            xagent_server_runtime::ops::LogFormat::Text,
            move || writer.clone(),
            false,
        ))
        .with(xagent_server_runtime::ops::log_layer(
            xagent_server_runtime::ops::LogFormat::Json,
            move || json_writer.clone(),
            false,
        ));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let h = support::start_default().await;
    let mut produced: Vec<String> = Vec::new();
    let http = reqwest::Client::new();
    for path in ["/connector-card.json", "/skill.md"] {
        produced.push(http.get(h.http(path)).send().await.unwrap().text().await.unwrap());
    }
    produced.push(
        http.get(h.http("/health"))
            .bearer_auth(support::API_KEY)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    produced.push(
        http.get(h.http("/health"))
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );

    let mut c = h.client().await;
    let mut packets: Vec<Packet> = Vec::new();
    let mut record = |p: &Packet| packets.push(p.clone());
    let ack = c.hello(None).await;
    record(&ack);
    let (channel, open) = c.open_channel(None).await;
    record(&open);
    let signed = c.sign_in(&channel, TARGET_TOKEN).await;
    assert_eq!(payload_json(&signed)["status"], "authenticated");
    record(&signed);
    let get = c.request(DescriptorGet::default(), Some(&channel));
    let got = c.call(get).await;
    record(&got);
    let args =
        json!({"connector_channel_id": channel, "text": "hello"}).as_object().cloned().unwrap();
    let invoke = c.request(ToolInvoke::new("echo_send", args), Some(&channel));
    c.send(&invoke).await;
    let (tool_ack, skipped) = c.wait_for("tool.invoke.ack").await;
    record(&tool_ack);
    skipped.iter().for_each(&mut record);
    c.send(
        &Packet::with_payload("pm1", ChatMessage::text("m1", "to target")).channel(channel.clone()),
    )
    .await;
    let (msg_ack, skipped) = c.wait_for("chat.message.ack").await;
    record(&msg_ack);
    skipped.iter().for_each(&mut record);
    inject_message(&h.server.handle(), &channel, "in1", "from target").await.unwrap();
    let (inbound, skipped) = c.wait_for("chat.message").await;
    record(&inbound);
    skipped.iter().for_each(&mut record);
    c.send(
        &Packet::with_payload("pa1", ChatMessageAck::accepted("in1"))
            .channel(channel.clone())
            .reply_to(inbound.packet_id.clone()),
    )
    .await;
    let file = h.server.handle().register_file(&channel, "f.txt", None, b"data").await.unwrap();
    let file_json = serde_json::to_string(&file).unwrap();
    let logout = c.request(AuthLogout::default(), Some(&channel));
    let out = c.call(logout).await;
    record(&out);
    let close = c.request(ChannelClose::default(), Some(&channel));
    let closed = c.call(close).await;
    record(&closed);
    produced.push(file_json);
    produced.extend(packets.iter().map(|p| p.to_json().unwrap()));
    // Debug output of what an author sees is redacted too.
    produced.push(format!("{:?}", h.server.handle().binding(&channel)));
    c.close().await;
    h.stop().await;

    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(logs.lines().count() > 10, "the lifecycle logged: {logs}");
    assert!(
        logs.lines().any(|l| l.starts_with('{') && l.contains("\"packet_type\"")),
        "the JSON lines were scanned too: {logs}"
    );
    assert!(produced.len() > 12);
    for secret in [support::API_KEY, TARGET_TOKEN] {
        let log_hits = logs.lines().filter(|line| line.contains(secret)).count();
        assert_eq!(log_hits, 0, "secret found in logs");
        let hits = produced.iter().filter(|text| text.contains(secret)).count();
        assert_eq!(hits, 0, "secret found in a Card, Skill, Descriptor, ack or payload");
    }
}
