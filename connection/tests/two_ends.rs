//! Two in-memory ends of one data plane, the Connector's and xAgent's, each on the connection
//! core (its driver, judge and writer), wired to each other through the test: after a real
//! handshake, the same bad packets are read by both ends, which refuse them with the same
//! answers (one order, one validator, one answer per packet role).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream, sink, stream};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use xagent_connection::{
    Admission, Driver, Flow, Frame, FrameError, Outbound, PacketHandler, WriterOptions,
};
use xagent_protocol_types::{
    BuildInfo, ConnectorCard, ConnectorHelloAck, ConnectorInfo, Packet, PacketBody, Ping, Pong,
    RequestId, Side, Supports, SystemClock, TargetType, WireError,
};
use xagent_protocol_validate::{Accepted, AdmissionWindow};

const CARD: &str = "im.ends";

fn card() -> ConnectorCard {
    ConnectorCard::new(
        CARD,
        BuildInfo::new("1"),
        ConnectorInfo::new("Ends", "1.0.0"),
        Supports::new(vec![TargetType::Im], vec!["xagent.im.v2".into()]),
    )
}

/// What one end did that the test looks at.
#[derive(Default)]
struct Seen {
    /// Requests of this end that failed, with the error.
    failed: Vec<(RequestId, WireError)>,
    /// Types of the packets this end accepted.
    accepted: Vec<String>,
}

/// The side's handler: answers a hello and a ping, records the rest.
struct Handler {
    link: Outbound,
    seen: Arc<Mutex<Seen>>,
}

impl PacketHandler for Handler {
    async fn on_packet(&mut self, packet: Packet, _accepted: Accepted) -> Flow {
        self.seen.lock().expect("seen").accepted.push(packet.type_str().to_owned());
        let answer = match &packet.body {
            PacketBody::ConnectorHello(_) => {
                let ack = ConnectorHelloAck::new(CARD, "conn_1");
                Some(Packet::with_payload(format!("pkt_{}", rand_id()), ack).answering(&packet))
            }
            PacketBody::Ping(_) => Some(
                Packet::with_payload(format!("pkt_{}", rand_id()), Pong::default())
                    .answering(&packet),
            ),
            _ => None,
        };
        if let Some(answer) = answer {
            self.link.push(answer).await;
        }
        Flow::Continue
    }

    async fn send(&mut self, packet: Packet) {
        self.link.push(packet).await;
    }

    fn fail_pending(&mut self, request_id: &RequestId, error: WireError) {
        self.seen.lock().expect("seen").failed.push((request_id.clone(), error));
    }

    async fn on_binary(&mut self) -> Flow {
        Flow::Continue
    }
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One end: its inbound frames (what the peer "sent"), what its writer wrote, its link.
struct End {
    inbound: mpsc::UnboundedSender<Frame>,
    written: mpsc::UnboundedReceiver<Frame>,
    link: Outbound,
    seen: Arc<Mutex<Seen>>,
}

fn frames(rx: mpsc::UnboundedReceiver<Frame>) -> impl Stream<Item = Result<Frame, FrameError>> {
    stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (Ok(f), rx)) })
}

fn end(side: Side) -> End {
    let admission = Arc::new(match side {
        Side::Connector => Admission::for_card(card(), AdmissionWindow::default()),
        Side::Xagent => Admission::from_parts(
            CARD.into(),
            vec!["xagent.im.v2".into()],
            Some(card()),
            AdmissionWindow::default(),
        ),
    });
    let session = Arc::new(Mutex::new(admission.current().session(side)));
    let (wire, written) = mpsc::unbounded_channel();
    let out = sink::unfold(wire, |wire, frame: Frame| async move {
        wire.send(frame).map_err(|_| "the test stopped reading")?;
        Ok::<_, &'static str>(wire)
    });
    let (link, _writer) = Outbound::open(
        Arc::clone(&session),
        Box::pin(out),
        WriterOptions::new(64 * 1024),
        64,
        Arc::new(SystemClock),
    );
    let (inbound, rx) = mpsc::unbounded_channel();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut handler = Handler { link: link.clone(), seen: Arc::clone(&seen) };
    tokio::spawn(async move {
        let mut rx = Box::pin(frames(rx));
        let driver = Driver::new(&session, &admission, 64 * 1024);
        driver.run(&mut rx, &mut handler, std::future::pending()).await
    });
    End { inbound, written, link, seen }
}

/// The next packet `end` wrote, as JSON.
async fn next_written(end: &mut End) -> Value {
    let frame = tokio::time::timeout(Duration::from_secs(5), end.written.recv())
        .await
        .expect("an answer in time")
        .expect("the writer runs");
    match frame {
        Frame::Text(text) => serde_json::from_str(&text).expect("the writer writes JSON"),
        other => panic!("expected a text frame, got {other:?}"),
    }
}

/// Both ends, after a handshake carried from one to the other.
async fn connected() -> (End, End) {
    let mut connector = end(Side::Connector);
    let mut xagent = end(Side::Xagent);
    let hello = Admission::for_card(card(), AdmissionWindow::default()).current().hello(None);
    let hello = Packet::with_payload("pkt_hello", hello).request_id(RequestId::from("req_h"));
    let link = xagent.link.clone();
    tokio::spawn(async move { link.send(hello).await });
    let hello = next_written(&mut xagent).await;
    connector.inbound.send(Frame::Text(hello.to_string())).expect("connector reads");
    let ack = next_written(&mut connector).await;
    assert_eq!(ack["type"], "connector.hello.ack", "{ack}");
    xagent.inbound.send(Frame::Text(ack.to_string())).expect("xagent reads");
    // A ping each way proves both sessions are past the hello.
    for end in [&mut connector, &mut xagent] {
        assert_eq!(answers(end, None).await, Vec::<Value>::new());
    }
    assert_eq!(
        xagent.seen.lock().expect("seen").accepted.first().map(String::as_str),
        Some("connector.hello.ack")
    );
    (connector, xagent)
}

/// What `end` answers to `bad` (when given): every packet it writes before the pong of a ping
/// read after it, reduced to what must agree (ids that each end mints are left out).
async fn answers(end: &mut End, bad: Option<&str>) -> Vec<Value> {
    if let Some(bad) = bad {
        end.inbound.send(Frame::Text(bad.to_owned())).expect("the end reads");
    }
    let marker = format!("req_mark_{}", rand_id());
    let ping = Packet::with_payload(format!("pkt_{}", rand_id()), Ping::default())
        .request_id(RequestId::from(marker.as_str()));
    let ping = ping.to_json().expect("a ping encodes");
    end.inbound.send(Frame::Text(ping)).expect("the end reads");
    let mut out = Vec::new();
    loop {
        let packet = next_written(end).await;
        if packet["type"] == "pong" && packet["request_id"] == marker.as_str() {
            return out;
        }
        out.push(json!({
            "type": packet["type"],
            "request_id": packet["request_id"],
            "reply_to": packet["reply_to"],
            "code": packet["error"]["code"],
        }));
    }
}

/// Sends `bad` to both ends; asserts they answer alike and returns the answer.
async fn both_answer(connector: &mut End, xagent: &mut End, bad: &Value) -> Vec<Value> {
    let from_connector = answers(connector, Some(&bad.to_string())).await;
    let from_xagent = answers(xagent, Some(&bad.to_string())).await;
    assert_eq!(from_connector, from_xagent, "both ends answer {bad} alike");
    from_connector
}

fn envelope(kind: &str, extra: Value) -> Value {
    let mut packet = json!({
        "schema": "xagent.connector.packet/v1",
        "packet_id": format!("pkt_bad_{}", rand_id()),
        "type": kind,
        "time": 1_790_000_000_000_u64,
    });
    if let (Some(packet), Some(extra)) = (packet.as_object_mut(), extra.as_object()) {
        packet.extend(extra.clone());
    }
    packet
}

#[tokio::test]
async fn refusal_rule_a_text_that_is_not_a_packet_gets_the_same_error_on_both_ends() {
    let (mut connector, mut xagent) = connected().await;
    let bad = json!({ "schema": "xagent.connector.packet/v1", "packet_id": "pkt_x" });
    let answer = both_answer(&mut connector, &mut xagent, &bad).await;
    assert_eq!(answer.len(), 1, "{answer:?}");
    assert_eq!(answer[0]["type"], "error");
    assert_eq!(answer[0]["code"], "invalid_packet");
}

#[tokio::test]
async fn refusal_rule_a_request_that_breaks_the_rules_gets_its_error_ack_on_both_ends() {
    let (mut connector, mut xagent) = connected().await;
    let bad = envelope("ping", json!({ "request_id": "req_bad", "error": { "code": "" } }));
    let answer = both_answer(&mut connector, &mut xagent, &bad).await;
    assert_eq!(answer.len(), 1, "{answer:?}");
    assert_eq!(answer[0]["type"], "pong", "the request's own ack: {answer:?}");
    assert_eq!(answer[0]["request_id"], "req_bad");
    assert_eq!(answer[0]["reply_to"], bad["packet_id"]);
    assert_eq!(answer[0]["code"], "invalid_packet");
}

#[tokio::test]
async fn refusal_rule_an_error_packet_that_breaks_the_rules_is_not_answered_on_either_end() {
    let (mut connector, mut xagent) = connected().await;
    let bad = envelope("error", json!({ "error": { "code": "", "message": "x" } }));
    assert_eq!(both_answer(&mut connector, &mut xagent, &bad).await, Vec::<Value>::new());
}

#[tokio::test]
async fn refusal_rule_an_ack_to_nothing_pending_is_refused_alike_by_the_sessions() {
    let (mut connector, mut xagent) = connected().await;
    let bad = envelope("pong", json!({ "request_id": "req_never", "reply_to": "pkt_never" }));
    let answer = both_answer(&mut connector, &mut xagent, &bad).await;
    assert!(answer.iter().all(|a| a["type"] == "error"), "{answer:?}");
}

#[tokio::test]
async fn refusal_rule_a_pending_request_whose_answer_breaks_the_rules_fails_on_both_ends() {
    let (mut connector, mut xagent) = connected().await;
    for end in [&mut connector, &mut xagent] {
        let ping = Packet::with_payload("pkt_mine", Ping::default())
            .request_id(RequestId::from("req_mine"));
        let link = end.link.clone();
        tokio::spawn(async move { link.send(ping).await });
        let sent = next_written(end).await;
        assert_eq!(sent["type"], "ping");
        let bad = envelope(
            "pong",
            json!({ "request_id": "req_mine", "reply_to": "pkt_mine", "error": { "code": "" } }),
        );
        assert_eq!(
            answers(end, Some(&bad.to_string())).await,
            Vec::<Value>::new(),
            "an answer is not answered"
        );
        let seen = end.seen.lock().expect("seen");
        assert_eq!(seen.failed.len(), 1, "the request failed");
        assert_eq!(seen.failed[0].0, RequestId::from("req_mine"));
        assert_eq!(seen.failed[0].1.code.to_string(), "invalid_packet");
    }
}
