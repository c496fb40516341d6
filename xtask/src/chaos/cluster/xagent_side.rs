//! The **xagent-holder-kill** scenario (see the module above).

use super::harness::{Mock, Replica, Reports, Sizes, TTL_MS, now_ms, percentiles, tokio_util_stop};
use super::page::{Page, Visitor, by_text, doubled_and_late, doubles, room_contents, watch_page};
use crate::bench_support::temp_dir;
use crate::chaos::harness::Rng;
use anyhow::{Result, anyhow, bail};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::path::Path;

use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use xagent_testkit::postgres::TestPostgres;

/// The room both mocks serve.
const ROOM: &str = "chaosagent";

/// One kill: the mock that held the room, and when (ms).
type Kill = (&'static str, u64);

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
    let side =
        Side { bin, base: connector.url(), database: database.expose(), reports: <_>::default() };
    let mut mocks = [side.mock("a")?, side.mock("b")?];
    if let Err(e) = side.signed_in().await {
        connector.kill().await;
        return Err(e);
    }
    let visitor = Visitor::join(&reqwest::Client::new(), &side.base, ROOM).await?;
    // A page open from the start sees every message of the room (a snapshot holds only the
    // newest 200).
    let stop = tokio_util_stop();
    let (page, page_task) =
        watch_page(visitor.clone(), side.base.clone(), side.base.clone(), stop.clone());
    let poster = post_evenly(visitor.clone(), side.base.clone(), sizes.agent_messages);
    let kills = side.kill_holders(&mut mocks, sizes, rng).await?;
    let (posted, post_errors) = poster.await?;
    let taken: Vec<String> =
        posted.iter().filter_map(|e| e["message_id"].as_str().map(str::to_owned)).collect();
    side.drain(&taken).await;
    // Stop the calls, let the outbox deliver what was queued, then read the room.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for mock in &mut mocks {
        mock.kill().await;
    }
    let history = visitor.history(&side.base).await?;
    stop.stop();
    let _ = tokio::time::timeout(Duration::from_secs(5), page_task).await;
    connector.kill().await;
    let seconds = started.elapsed().as_secs_f64();
    let page = page.lock().map_err(|_| anyhow!("the page task panicked"))?;
    let outcome = Outcome { taken, kills, post_errors, seconds };
    let report = side.report(&page, &history, &outcome, sizes);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}

/// The Connector, the mocks' database, and what the mocks report.
struct Side<'a> {
    bin: &'a Path,
    base: String,
    database: &'a str,
    reports: Reports,
}

/// What the run left to count.
struct Outcome {
    /// The visitor messages the Connector took.
    taken: Vec<String>,
    kills: Vec<Kill>,
    post_errors: Vec<String>,
    seconds: f64,
}

/// Visitors post at an even pace over the kills: the entries posted, and the errors.
fn post_evenly(
    visitor: Visitor,
    base: String,
    total: usize,
) -> JoinHandle<(Vec<Value>, Vec<String>)> {
    tokio::spawn(async move {
        let (mut posted, mut errors) = (Vec::new(), Vec::new());
        for n in 0..total {
            let text = format!("visitor {n}");
            match visitor.post(&base, &text, &format!("v{n}")).await {
                Ok(entry) => posted.push(entry),
                Err(e) => errors.push(e.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        (posted, errors)
    })
}

impl Side<'_> {
    /// The mocks' report lines of one kind.
    fn lines(&self, kind: &str) -> Vec<(&'static str, Value)> {
        (self.reports.lock())
            .map(|r| r.iter().filter(|(_, v)| v["report"] == kind).cloned().collect())
            .unwrap_or_default()
    }

    fn mock(&self, name: &'static str) -> Result<Mock> {
        Mock::start(self.bin, name, &self.base, self.database, ROOM, &self.reports)
    }

    /// The holder signs the room in (a first successful Tool call); then visitors can join it.
    async fn signed_in(&self) -> Result<()> {
        let ready_by = Instant::now() + Duration::from_secs(60);
        while !self.lines("tool").iter().any(|(_, v)| v["ok"] == true) {
            if Instant::now() > ready_by {
                bail!("no mock-xagent made a successful Tool call within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Kills the holder (the mock whose last `online` line is the newest) at random points,
    /// waits for the other's first successful call, then brings the killed one back.
    async fn kill_holders(
        &self,
        mocks: &mut [Mock; 2],
        sizes: &Sizes,
        rng: &mut Rng,
    ) -> Result<Vec<Kill>> {
        let mut kills = Vec::new();
        for _ in 0..sizes.agent_kills {
            tokio::time::sleep(Duration::from_millis(1_000 + rng.below(1_500))).await;
            let online = self.lines("online");
            let Some((holder, _)) = online.last().cloned() else { continue };
            let Some(index) = mocks.iter().position(|m| m.name == holder) else { continue };
            let killed_at = now_ms();
            mocks[index].kill().await;
            kills.push((holder, killed_at));
            let by = Instant::now() + Duration::from_secs(30);
            while self.takeover(holder, killed_at).is_none() && Instant::now() < by {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(rng.below(1_000))).await;
            mocks[index] = self.mock(holder)?;
        }
        Ok(kills)
    }

    /// From the kill of `holder` to the other mock's first successful Tool call after it.
    fn takeover(&self, holder: &str, killed_at: u64) -> Option<u64> {
        (self.lines("tool").iter())
            .filter(|(n, v)| *n != holder && v["ok"] == true)
            .filter_map(|(_, v)| v["at"].as_u64())
            .filter(|at| *at > killed_at)
            .min()
            .map(|at| at - killed_at)
    }

    /// Until every visitor message taken reached xAgent, or 30 s.
    async fn drain(&self, taken: &[String]) {
        let drain_by = Instant::now() + Duration::from_secs(30);
        loop {
            let received: HashSet<String> = (self.lines("message").iter())
                .filter_map(|(_, v)| v["message_id"].as_str().map(str::to_owned))
                .collect();
            if taken.iter().all(|id| received.contains(id)) || Instant::now() > drain_by {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Side<'_> {
    /// The scenario's report, with its verdict.
    fn report(&self, page: &Page, history: &[Value], run: &Outcome, sizes: &Sizes) -> Value {
        let contents = room_contents(page, history);
        let [lost_inbound, doubled_inbound, late_messages, redelivered, received] =
            self.visitor_counts(page, &run.taken);
        let [
            started,
            ok,
            lost_tools,
            doubled_tools,
            late_tools,
            queued,
            lost_queued,
            doubled_queued,
        ] = self.tool_counts(&contents);
        let takeovers: Vec<u64> =
            run.kills.iter().filter_map(|(holder, at)| self.takeover(holder, *at)).collect();
        let lost = lost_inbound + lost_tools + lost_queued;
        let doubled = doubled_inbound + doubled_tools + doubled_queued;
        let after_expiry = late_messages + late_tools;
        let kills = run.kills.len();
        let mut findings = Vec::new();
        if takeovers.len() < kills {
            findings.push(format!(
                "{} of {kills} kills were not followed by a successful Tool call of the other mock within 30 s",
                kills - takeovers.len(),
            ));
        }
        if let Some(first) = run.post_errors.first() {
            findings.push(format!("{} visitor posts refused, e.g. {first}", run.post_errors.len()));
        }
        let pass = lost == 0
            && doubled == 0
            && after_expiry == 0
            && kills == sizes.agent_kills
            && takeovers.len() == kills
            && run.post_errors.is_empty()
            && ok > 0;
        json!({
            "visitor_messages": run.taken.len(),
            "visitor_messages_received": received,
            "tool_calls_started": started,
            "tool_calls_ok": ok,
            "agent_messages_queued": queued,
            "room_entries": contents.len(),
            "kills": kills,
            "lost": {"total": lost, "visitor_messages": lost_inbound, "tool_calls": lost_tools, "agent_messages": lost_queued},
            "doubled": {"total": doubled, "visitor_messages": doubled_inbound, "tool_calls": doubled_tools, "agent_messages": doubled_queued},
            "after_expiry": after_expiry,
            "redelivered_unacknowledged": redelivered,
            "takeover_ms": percentiles(&takeovers),
            "takeovers_ms": takeovers,
            "findings": findings,
            "seconds": run.seconds,
            "pass": pass,
        })
    }

    /// Visitor messages at the application: lost, doubled, late, redelivered, and how many
    /// distinct ones arrived.
    fn visitor_counts(&self, page: &Page, taken: &[String]) -> [usize; 5] {
        let received = self.lines("message");
        let mut got: HashMap<&str, Vec<u64>> = HashMap::new();
        let mut late = 0;
        for (_, line) in &received {
            let Some(id) = line["message_id"].as_str() else { continue };
            got.entry(id).or_default().push(line["at"].as_u64().unwrap_or(0));
            if let (Some(created), Some(at)) = (line["created_at"].as_u64(), line["at"].as_u64())
                && at > created.saturating_add(TTL_MS)
            {
                late += 1;
            }
        }
        let lost = taken.iter().filter(|id| !got.contains_key(id.as_str())).count();
        let (doubled, redelivered) = doubles(&got, &page.delivered_at);
        [lost, doubled, late, redelivered, got.len()]
    }

    /// Tool calls (started, ok, lost, doubled, late) and queued messages (queued, lost,
    /// doubled) in the room.
    fn tool_counts(&self, contents: &HashMap<String, (String, u64)>) -> [usize; 8] {
        let shown = by_text(contents);
        let starts: HashMap<String, u64> = (self.lines("tool_start").iter())
            .filter_map(|(_, v)| Some((v["call"].as_str()?.to_owned(), v["at"].as_u64()?)))
            .collect();
        let tools_ok: Vec<String> = (self.lines("tool").iter())
            .filter(|(_, v)| v["ok"] == true)
            .filter_map(|(_, v)| v["call"].as_str().map(str::to_owned))
            .collect();
        let lost_tools =
            tools_ok.iter().filter(|c| !shown.contains_key(&format!("tool {c}"))).count();
        let (doubled_tools, late_tools) =
            doubled_and_late(starts.iter().map(|(c, at)| (shown.get(&format!("tool {c}")), *at)));
        let queued: Vec<String> = (self.lines("queued").iter())
            .filter_map(|(_, v)| v["message_id"].as_str().map(str::to_owned))
            .collect();
        let lost_queued = queued.iter().filter(|id| !contents.contains_key(*id)).count();
        let doubled_queued = (queued.iter())
            .filter(|id| shown.get(&format!("say {id}")).is_some_and(|t| t.len() > 1))
            .count();
        let (started, ok) = (starts.len(), tools_ok.len());
        [
            started,
            ok,
            lost_tools,
            doubled_tools,
            late_tools,
            queued.len(),
            lost_queued,
            doubled_queued,
        ]
    }
}
