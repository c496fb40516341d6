//! The **xagent-holder-kill** scenario (see the module above).

use super::harness::{
    Mock, Replica, Reports, Sizes, TOOL_DEADLINE_MS, TTL_MS, now_ms, percentiles, tokio_util_stop,
};
use super::page::{Visitor, by_text, doubles, room_contents, watch_page};
use crate::bench_support::temp_dir;
use crate::chaos::harness::Rng;
use anyhow::{Result, anyhow, bail};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xagent_testkit::postgres::TestPostgres;

pub(crate) async fn xagent_side(
    bin: &Path,
    pg: &TestPostgres,
    sizes: &Sizes,
    rng: &mut Rng,
) -> Result<Value> {
    let dir = temp_dir("chaos-cluster-xagent")?;
    let started = Instant::now();
    let database = pg.fresh_database().await;
    let mut connector = Replica::start(bin, dir.join("connector"), None).await?;
    let base = connector.url();
    let room = "chaosagent";
    let reports: Reports = Arc::new(Mutex::new(Vec::new()));
    let mut mocks = [
        Mock::start(bin, "a", &base, database.expose(), room, &reports)?,
        Mock::start(bin, "b", &base, database.expose(), room, &reports)?,
    ];
    let lines = |kind: &str| -> Vec<(&'static str, Value)> {
        reports
            .lock()
            .map(|r| r.iter().filter(|(_, v)| v["report"] == kind).cloned().collect())
            .unwrap_or_default()
    };
    // The holder signs the room in; then visitors can join it.
    let ready_by = Instant::now() + Duration::from_secs(60);
    while !lines("tool").iter().any(|(_, v)| v["ok"] == true) {
        if Instant::now() > ready_by {
            connector.kill().await;
            bail!("no mock-xagent made a successful Tool call within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let http = reqwest::Client::new();
    let visitor = Visitor::join(&http, &base, room).await?;
    // A page open from the start sees every message of the room (a snapshot holds only the
    // newest 200).
    let stop = tokio_util_stop();
    let (page, page_task) = watch_page(visitor.clone(), base.clone(), base.clone(), stop.clone());
    // Visitors post at an even pace over the kills.
    let posted: Arc<Mutex<Vec<Value>>> = Arc::new(Mutex::new(Vec::new()));
    let post_errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let poster = {
        let (visitor, base, posted, post_errors) =
            (visitor.clone(), base.clone(), posted.clone(), post_errors.clone());
        let total = sizes.agent_messages;
        tokio::spawn(async move {
            for n in 0..total {
                let text = format!("visitor {n}");
                match visitor.post(&base, &text, &format!("v{n}")).await {
                    Ok(entry) => posted.lock().map(|mut p| p.push(entry)).unwrap_or(()),
                    Err(e) => post_errors.lock().map(|mut p| p.push(e.to_string())).unwrap_or(()),
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };
    let mut kills = Vec::new();
    for _ in 0..sizes.agent_kills {
        tokio::time::sleep(Duration::from_millis(1_000 + rng.below(1_500))).await;
        // The holder is the mock whose last `online` line is the newest.
        let online = lines("online");
        let Some((holder, _)) = online.last().cloned() else { continue };
        let Some(index) = mocks.iter().position(|m| m.name == holder) else { continue };
        let killed_at = now_ms();
        mocks[index].kill().await;
        kills.push((holder, killed_at));
        // Wait for the other's first successful call, then bring the killed one back.
        let by = Instant::now() + Duration::from_secs(30);
        while !lines("tool")
            .iter()
            .any(|(n, v)| *n != holder && v["ok"] == true && v["at"].as_u64() > Some(killed_at))
            && Instant::now() < by
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(1_000))).await;
        mocks[index] = Mock::start(bin, holder, &base, database.expose(), room, &reports)?;
    }
    poster.await?;
    // Drain: every visitor message taken reaches xAgent, queued messages reach the room.
    let taken: Vec<String> = posted
        .lock()
        .map(|p| p.iter().filter_map(|e| e["message_id"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let drain_by = Instant::now() + Duration::from_secs(30);
    loop {
        let received: HashSet<String> = lines("message")
            .iter()
            .filter_map(|(_, v)| v["message_id"].as_str().map(str::to_owned))
            .collect();
        if taken.iter().all(|id| received.contains(id)) || Instant::now() > drain_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stop the calls, let the outbox deliver what was queued, then read the room.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for mock in &mut mocks {
        mock.kill().await;
    }
    let history = visitor.history(&base).await?;
    stop.stop();
    let _ = tokio::time::timeout(Duration::from_secs(5), page_task).await;
    connector.kill().await;
    let seconds = started.elapsed().as_secs_f64();
    let page = page.lock().map_err(|_| anyhow!("the page task panicked"))?;
    let contents = room_contents(&page, &history);

    // Visitor messages at the application.
    let received = lines("message");
    let mut got: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut late_messages = 0;
    for (_, line) in &received {
        let Some(id) = line["message_id"].as_str() else { continue };
        got.entry(id).or_default().push(line["at"].as_u64().unwrap_or(0));
        if let (Some(created), Some(at)) = (line["created_at"].as_u64(), line["at"].as_u64())
            && at > created.saturating_add(TTL_MS)
        {
            late_messages += 1;
        }
    }
    let lost_inbound = taken.iter().filter(|id| !got.contains_key(id.as_str())).count();
    let (doubled_inbound, redelivered) = doubles(&got, &page.delivered_at);
    // Tool calls and queued messages in the room.
    let shown = by_text(&contents);
    let shown_ids = &contents;
    let starts: HashMap<String, u64> = lines("tool_start")
        .iter()
        .filter_map(|(_, v)| Some((v["call"].as_str()?.to_owned(), v["at"].as_u64()?)))
        .collect();
    let tools_ok: Vec<String> = lines("tool")
        .iter()
        .filter(|(_, v)| v["ok"] == true)
        .filter_map(|(_, v)| v["call"].as_str().map(str::to_owned))
        .collect();
    let lost_tools = tools_ok.iter().filter(|c| !shown.contains_key(&format!("tool {c}"))).count();
    let mut doubled_tools = 0;
    let mut late_tools = 0;
    for (call, started_at) in &starts {
        let Some(times) = shown.get(&format!("tool {call}")) else { continue };
        if times.len() > 1 {
            doubled_tools += 1;
        }
        if times.iter().any(|t| *t > started_at + TOOL_DEADLINE_MS) {
            late_tools += 1;
        }
    }
    let queued: Vec<String> = lines("queued")
        .iter()
        .filter_map(|(_, v)| v["message_id"].as_str().map(str::to_owned))
        .collect();
    let lost_queued = queued.iter().filter(|id| !shown_ids.contains_key(*id)).count();
    let doubled_queued = queued
        .iter()
        .filter(|id| shown.get(&format!("say {id}")).is_some_and(|t| t.len() > 1))
        .count();
    let takeovers: Vec<u64> = kills
        .iter()
        .filter_map(|(holder, killed_at)| {
            lines("tool")
                .iter()
                .filter(|(n, v)| n != holder && v["ok"] == true)
                .filter_map(|(_, v)| v["at"].as_u64())
                .filter(|at| at > killed_at)
                .min()
                .map(|at| at - killed_at)
        })
        .collect();
    let lost = lost_inbound + lost_tools + lost_queued;
    let doubled = doubled_inbound + doubled_tools + doubled_queued;
    let after_expiry = late_messages + late_tools;
    let post_errors = post_errors.lock().map(|p| p.clone()).unwrap_or_default();
    let mut findings = Vec::new();
    if takeovers.len() < kills.len() {
        findings.push(format!(
            "{} of {} kills were not followed by a successful Tool call of the other mock within 30 s",
            kills.len() - takeovers.len(),
            kills.len()
        ));
    }
    if !post_errors.is_empty() {
        findings.push(format!(
            "{} visitor posts refused, e.g. {}",
            post_errors.len(),
            post_errors[0]
        ));
    }
    let pass = lost == 0
        && doubled == 0
        && after_expiry == 0
        && kills.len() == sizes.agent_kills
        && takeovers.len() == kills.len()
        && post_errors.is_empty()
        && !tools_ok.is_empty();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({
        "visitor_messages": taken.len(),
        "visitor_messages_received": got.len(),
        "tool_calls_started": starts.len(),
        "tool_calls_ok": tools_ok.len(),
        "agent_messages_queued": queued.len(),
        "room_entries": contents.len(),
        "kills": kills.len(),
        "lost": {"total": lost, "visitor_messages": lost_inbound, "tool_calls": lost_tools, "agent_messages": lost_queued},
        "doubled": {"total": doubled, "visitor_messages": doubled_inbound, "tool_calls": doubled_tools, "agent_messages": doubled_queued},
        "after_expiry": after_expiry,
        "redelivered_unacknowledged": redelivered,
        "takeover_ms": percentiles(&takeovers),
        "takeovers_ms": takeovers,
        "findings": findings,
        "seconds": seconds,
        "pass": pass,
    }))
}

// ---------------------------------------------------------------------------------------
// 2. The Connector side
