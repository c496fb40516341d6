//! The visitors' side of a room: joining and posting through the page API, a page's event
//! stream, and the bookkeeping that turns what pages and mocks saw into lost, doubled and
//! missed counts.

use super::harness::{Stop, TOOL_DEADLINE_MS, access_code, now_ms};
use anyhow::{Context, Result, anyhow, bail};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ---------------------------------------------------------------------------------------
// The visitor side over HTTP

/// A visitor session in one room, on whichever replica `base` names.
#[derive(Clone)]
pub(crate) struct Visitor {
    pub(crate) http: reqwest::Client,
    pub(crate) room: String,
    pub(crate) token: String,
}

impl Visitor {
    pub(crate) async fn join(http: &reqwest::Client, base: &str, room: &str) -> Result<Visitor> {
        let response = http
            .post(format!("{base}/chat/api/rooms/{room}/join"))
            .json(&json!({"access_code": access_code(room)}))
            .timeout(Duration::from_secs(10))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let token = body["token"]
            .as_str()
            .ok_or_else(|| anyhow!("joining {room} on {base} answered {status}: {body}"))?;
        Ok(Visitor { http: http.clone(), room: room.into(), token: token.into() })
    }

    /// Posts a message; the stored entry (its `message_id` and `status`).
    pub(crate) async fn post(&self, base: &str, text: &str, client_id: &str) -> Result<Value> {
        let response = self
            .http
            .post(format!("{base}/chat/api/rooms/{}/messages", self.room))
            .bearer_auth(&self.token)
            .json(&json!({"text": text, "client_id": client_id}))
            .timeout(Duration::from_secs(10))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{status}: {body}");
        }
        Ok(body)
    }

    /// The room's event stream (a page) on `base`.
    pub(crate) async fn events(&self, base: &str) -> Result<reqwest::Response> {
        let response = self
            .http
            .get(format!("{base}/chat/api/rooms/{}/events", self.room))
            .bearer_auth(&self.token)
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("events answered {}", response.status());
        }
        Ok(response)
    }

    /// The messages of the room's snapshot on `base` (oldest first).
    pub(crate) async fn history(&self, base: &str) -> Result<Vec<Value>> {
        let response = self.events(base).await?;
        let mut events = sse_events(response);
        let first = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .context("no snapshot within 10 s")?
            .ok_or_else(|| anyhow!("the stream ended before its snapshot"))?;
        Ok(first["messages"].as_array().cloned().unwrap_or_default())
    }
}

/// The `data:` JSON of every Server-Sent Event of `response`, until it ends.
fn sse_events(response: reqwest::Response) -> impl futures_util::Stream<Item = Value> + Unpin {
    let state = (response.bytes_stream(), String::new());
    Box::pin(futures_util::stream::unfold(state, |(mut body, mut text)| async move {
        loop {
            if let Some(end) = text.find("\n\n") {
                let event: String = text.drain(..end + 2).collect();
                let data: String = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:").map(str::trim_start))
                    .collect();
                if let Ok(value) = serde_json::from_str::<Value>(&data) {
                    return Some((value, (body, text)));
                }
                continue;
            }
            match body.next().await {
                Some(Ok(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk)),
                _ => return None,
            }
        }
    }))
}

// ---------------------------------------------------------------------------------------
// 1. The xAgent side

/// A Tool call made in the run: when it started and ended (Unix ms), whether it succeeded.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub(crate) id: String,
    pub(crate) room: usize,
    pub(crate) started: u64,
    pub(crate) ended: u64,
    pub(crate) ok: bool,
}

/// What the harness sent and saw, shared by its tasks.
#[derive(Default)]
pub(crate) struct Ledger {
    /// Visitor posts the Connector took: (room, message_id, status at the answer).
    pub(crate) posts: Vec<(usize, String, String)>,
    pub(crate) post_failures: Vec<String>,
    pub(crate) calls: Vec<Call>,
    /// Assistant messages queued: (room, message_id).
    pub(crate) queued: Vec<(usize, String)>,
    pub(crate) queue_failures: Vec<String>,
    pub(crate) sent: usize,
}

/// A room's open page: every message it saw (by id: text and `created_at`), when it first
/// saw each visitor message `delivered` (Unix ms), and how often it had to reconnect.
#[derive(Default)]
pub(crate) struct Page {
    pub(crate) seen: HashMap<String, (String, u64)>,
    pub(crate) delivered_at: HashMap<String, u64>,
    pub(crate) reconnects: u64,
    pub(crate) failed_reconnects: u64,
}

impl Page {
    pub(crate) fn record(&mut self, entry: &Value) {
        let Some(id) = entry["message_id"].as_str() else { return };
        let text = entry["text"].as_str().unwrap_or_default().to_owned();
        let created = entry["created_at"].as_u64().unwrap_or(0);
        self.seen.entry(id.to_owned()).or_insert((text, created));
        if entry["status"] == "delivered" {
            self.delivered_at.entry(id.to_owned()).or_insert_with(now_ms);
        }
    }
}

/// Keeps `visitor`'s page open: its event stream on `first`, and after the stream ends (its
/// replica died) again through `proxy`, until `stop`.
pub(crate) fn watch_page(
    visitor: Visitor,
    first: String,
    proxy: String,
    stop: Stop,
) -> (Arc<Mutex<Page>>, tokio::task::JoinHandle<()>) {
    let page = Arc::new(Mutex::new(Page::default()));
    let watched = page.clone();
    let task = tokio::spawn(async move {
        let mut base = first;
        let mut connected_once = false;
        while !stop.stopped() {
            let response = match visitor.events(&base).await {
                Ok(response) => response,
                Err(_) => {
                    if let Ok(mut page) = watched.lock() {
                        page.failed_reconnects += 1;
                    }
                    base = proxy.clone();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            if connected_once && let Ok(mut page) = watched.lock() {
                page.reconnects += 1;
            }
            connected_once = true;
            let mut events = sse_events(response);
            loop {
                let next = tokio::select! {
                    next = events.next() => next,
                    () = stop.wait() => None,
                };
                let Some(event) = next else { break };
                let Ok(mut page) = watched.lock() else { break };
                for entry in event["messages"].as_array().into_iter().flatten() {
                    page.record(entry);
                }
                if event["message"].is_object() {
                    page.record(&event["message"]);
                }
            }
            base = proxy.clone();
        }
    });
    (page, task)
}

/// What a room holds: its pages' view joined with its final history, by message id.
pub(crate) fn room_contents(page: &Page, history: &[Value]) -> HashMap<String, (String, u64)> {
    let mut contents = page.seen.clone();
    for entry in history {
        if let Some(id) = entry["message_id"].as_str() {
            let text = entry["text"].as_str().unwrap_or_default().to_owned();
            contents
                .entry(id.to_owned())
                .or_insert((text, entry["created_at"].as_u64().unwrap_or(0)));
        }
    }
    contents
}

/// Message ids of `contents` by text (a side effect applied twice is one text, two ids).
pub(crate) fn by_text(contents: &HashMap<String, (String, u64)>) -> HashMap<String, Vec<u64>> {
    let mut texts: HashMap<String, Vec<u64>> = HashMap::new();
    for (text, created) in contents.values() {
        texts.entry(text.clone()).or_default().push(*created);
    }
    texts
}

/// Of the messages received more than once (`received`: id -> times, Unix ms): those received
/// again after their page showed them `delivered` (doubled: the ack was in, the runtime's
/// receiver idempotency should have held it), and the others (redelivered: the process that
/// took it first died before its accept was acknowledged, so the Connector sent it again).
pub(crate) fn doubles(
    received: &HashMap<&str, Vec<u64>>,
    delivered_at: &HashMap<String, u64>,
) -> (usize, usize) {
    let (mut doubled, mut redelivered) = (0, 0);
    for (id, times) in received {
        if times.len() < 2 {
            continue;
        }
        let mut times = times.clone();
        times.sort_unstable();
        match delivered_at.get(*id) {
            Some(at) if times[1] > *at => doubled += 1,
            _ => redelivered += 1,
        }
    }
    (doubled, redelivered)
}

/// Of Tool calls, each with the creation times of its entries in the room (if any) and its
/// start: how many the room shows twice, and how many it shows after the call's deadline.
pub(crate) fn doubled_and_late<'a>(
    calls: impl Iterator<Item = (Option<&'a Vec<u64>>, u64)>,
) -> (usize, usize) {
    let shown: Vec<_> = calls.filter_map(|(times, started)| Some((times?, started))).collect();
    let doubled = shown.iter().filter(|(times, _)| times.len() > 1).count();
    let late = (shown.iter())
        .filter(|(times, started)| times.iter().any(|t| *t > started + TOOL_DEADLINE_MS))
        .count();
    (doubled, late)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_after_the_page_showed_it_delivered_is_doubled_one_before_is_a_redelivery() {
        let received: HashMap<&str, Vec<u64>> =
            HashMap::from([("once", vec![10]), ("late", vec![50, 10]), ("early", vec![10, 20])]);
        let delivered_at =
            HashMap::from([("late".to_owned(), 30), ("early".to_owned(), 30), ("once".into(), 1)]);
        assert_eq!(doubles(&received, &delivered_at), (1, 1));
        assert_eq!(doubles(&received, &HashMap::new()), (0, 2), "never delivered: redelivered");
    }

    #[test]
    fn a_page_keeps_the_first_view_of_a_message_and_when_it_was_delivered() {
        let mut page = Page::default();
        page.record(
            &json!({"message_id": "m1", "text": "hi", "created_at": 5, "status": "sending"}),
        );
        page.record(
            &json!({"message_id": "m1", "text": "hi", "created_at": 5, "status": "delivered"}),
        );
        page.record(&json!({"text": "no id"}));
        assert_eq!(page.seen.len(), 1);
        assert!(page.delivered_at.contains_key("m1"));
        let history = vec![json!({"message_id": "m2", "text": "hi", "created_at": 6})];
        let contents = room_contents(&page, &history);
        assert_eq!(contents.len(), 2);
        assert_eq!(by_text(&contents)["hi"].len(), 2, "one text under two ids is a double");
    }
}
