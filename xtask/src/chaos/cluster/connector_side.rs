//! The **replica-kill** scenario (see the module above).

use super::harness::{
    Agent, Cluster, Replica, Sizes, Stop, TOOL_DEADLINE_MS, TTL_MS, cluster_health_line, now_ms,
    percentiles, tokio_util_stop,
};
use super::page::{
    Call, Ledger, Page, Visitor, by_text, doubled_and_late, doubles, room_contents, watch_page,
};
use crate::bench_support::temp_dir;
use crate::chaos::harness::Rng;
use anyhow::{Result, anyhow};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use xagent_protocol_types::{ChatMessage, ConnectorChannelId};
use xagent_testkit::postgres::TestPostgres;

/// The traffic's workers; each sends `Sizes::messages / WORKERS` (rounded up).
const WORKERS: usize = 8;

/// One kill: "holder" or "other", the replica's index, when (ms).
type Kill = (&'static str, usize, u64);

pub(crate) async fn connector_side(
    bin: &Path,
    pg: &TestPostgres,
    sizes: &Sizes,
    rng: &mut Rng,
) -> Result<Value> {
    let dir = temp_dir("chaos-cluster-replicas")?;
    let started = Instant::now();
    let database = pg.fresh_database().await;
    let mut cluster = Cluster::start(bin, &dir, database.expose(), 3).await?;
    let mut findings = Vec::new();
    if cluster.health_path != "/ready" {
        findings.push(format!(
            "the replicas have no GET /ready (404) and /health needs the API key: HAProxy \
             checks {} instead",
            cluster.health_path
        ));
    }
    let run = Arc::new(Shared::open(&cluster, sizes, rng, &mut findings).await?);
    let stop = tokio_util_stop();
    // Pages: each room's event stream on a random replica; reconnect through HAProxy.
    let (pages, page_tasks): (Vec<_>, Vec<_>) = (run.visitors.iter())
        .map(|visitor| {
            let first = run.replica_urls[rng.below(3) as usize].clone();
            watch_page(visitor.clone(), first, run.page_url.clone(), stop.clone())
        })
        .collect();
    let clock = Traffic::new(sizes);
    let traffic: Vec<_> = (0..WORKERS)
        .map(|worker| tokio::spawn(run.clone().traffic(worker, clock, Rng::new(rng.next()))))
        .collect();
    let probe_stop = tokio_util_stop();
    let prober = tokio::spawn(run.clone().probe(probe_stop.clone()));
    let kills = kill_in_turn(&mut cluster, &run.ledger, sizes, clock, rng, &mut findings).await?;
    for task in traffic {
        task.await?;
    }
    run.drain().await;
    // The prober's last call ends, then the pages get a moment to see it.
    probe_stop.stop();
    prober.await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let histories = run.histories_after(stop, page_tasks).await;
    let outbox_pending = run.agent.plane.outbox_stats().await.pending;
    run.agent.plane.close().await;
    let seconds = started.elapsed().as_secs_f64();
    let logs: String = (cluster.replicas.iter())
        .map(|r| std::fs::read_to_string(r.dir.join("replica.log")).unwrap_or_default())
        .collect();
    let panics = logs.matches("panicked").count();
    cluster.stop().await;
    let mut tally = Tally::count(&run, &histories, &pages, &kills, clock.total)?;
    tally.panics = panics;
    tally.find(sizes, &mut findings);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(tally.report(sizes, &kills, &findings, outbox_pending, seconds))
}

/// What the traffic, the prober and the checks share.
struct Shared {
    agent: Agent,
    channels: Vec<ConnectorChannelId>,
    visitors: Vec<Visitor>,
    replica_urls: Vec<String>,
    page_url: String,
    ledger: Mutex<Ledger>,
}

/// The traffic's size and time limit.
#[derive(Clone, Copy)]
struct Traffic {
    started: Instant,
    max_seconds: u64,
    per_worker: usize,
    total: usize,
}

impl Traffic {
    fn new(sizes: &Sizes) -> Traffic {
        let per_worker = sizes.messages.div_ceil(WORKERS);
        let (started, max_seconds) = (Instant::now(), sizes.max_traffic_seconds);
        Traffic { started, max_seconds, per_worker, total: per_worker * WORKERS }
    }

    fn over(&self) -> bool {
        self.started.elapsed().as_secs() >= self.max_seconds
    }
}

impl Shared {
    /// xAgent's rooms, and a visitor in each.
    async fn open(
        cluster: &Cluster,
        sizes: &Sizes,
        rng: &mut Rng,
        findings: &mut Vec<String>,
    ) -> Result<Shared> {
        let agent = Agent::connect(&cluster.agent_proxy.url()).await?;
        let rooms: Vec<String> = (0..sizes.channels).map(|n| format!("chaosroom{n}")).collect();
        let mut channels = Vec::new();
        for room in &rooms {
            channels.push(agent.open_room(room).await?);
        }
        let replica_urls: Vec<String> = cluster.replicas.iter().map(Replica::url).collect();
        let visitors = join_visitors(&replica_urls, &rooms, rng, findings).await?;
        let (page_url, ledger) = (cluster.page_proxy.url(), Mutex::new(Ledger::default()));
        Ok(Shared { agent, channels, visitors, replica_urls, page_url, ledger })
    }

    /// One worker: visitor posts (half), Tool calls and IM messages (a quarter each).
    async fn traffic(self: Arc<Self>, worker: usize, clock: Traffic, mut rng: Rng) {
        for n in 0..clock.per_worker {
            if clock.over() {
                break;
            }
            let room = rng.below(self.visitors.len() as u64) as usize;
            let id = format!("w{worker}n{n}");
            match rng.below(4) {
                0 | 1 => self.post(room, &id, rng.below(4) as usize).await,
                2 => self.tool_until_ok(room, &id).await,
                _ => self.queue(room, &id).await,
            }
            if let Ok(mut l) = self.ledger.lock() {
                l.sent += 1;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A visitor post directly to replica `pick` or through HAProxy (`pick` 3); a refused or
    /// failed post is repeated (same client_id) through HAProxy.
    async fn post(&self, room: usize, id: &str, pick: usize) {
        let mut base = self.replica_urls.get(pick).unwrap_or(&self.page_url);
        let mut last = String::new();
        for _ in 0..20 {
            match self.visitors[room].post(base, &format!("visitor {id}"), id).await {
                Ok(entry) => {
                    let message_id = entry["message_id"].as_str().unwrap_or_default();
                    let status = entry["status"].as_str().unwrap_or_default();
                    if let Ok(mut l) = self.ledger.lock() {
                        l.posts.push((room, message_id.into(), status.into()));
                    }
                    return;
                }
                Err(e) => last = e.to_string(),
            }
            base = &self.page_url;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if let Ok(mut l) = self.ledger.lock() {
            l.post_failures.push(last);
        }
    }

    /// The same tool_call_id until it succeeds: the Connector's key.
    async fn tool_until_ok(&self, room: usize, id: &str) {
        let started = now_ms();
        let mut ok = false;
        while now_ms() < started + TOOL_DEADLINE_MS {
            if self.agent.tool(&self.channels[room], id).await.is_ok() {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.record(Call { id: id.into(), room, started, ended: now_ms(), ok });
    }

    fn record(&self, call: Call) {
        if let Ok(mut l) = self.ledger.lock() {
            l.calls.push(call);
        }
    }

    /// An IM message into the outbox, on the room's current channel.
    async fn queue(&self, room: usize, id: &str) {
        let message = ChatMessage::text(id, format!("say {id}")).created_at(now_ms());
        let plane = &self.agent.plane;
        let channel = (plane.current_channel(&self.channels[room]).await)
            .unwrap_or_else(|| self.channels[room].clone());
        let queued = plane.send_chat_message(&channel, message).await;
        if let Ok(mut l) = self.ledger.lock() {
            match queued {
                Ok(_) => l.queued.push((room, id.into())),
                Err(e) => l.queue_failures.push(e.to_string()),
            }
        }
    }

    /// One Tool call every 100 ms on the first room, for the failover time.
    async fn probe(self: Arc<Self>, stop: Stop) {
        let mut n = 0u64;
        while !stop.stopped() {
            n += 1;
            let id = format!("probe{n}");
            let started = now_ms();
            let ok = self.agent.tool(&self.channels[0], &id).await.is_ok();
            self.record(Call { id, room: 0, started, ended: now_ms(), ok });
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Until the outbox is empty and every visitor message the Connector took reached
    /// xAgent, or 60 s.
    async fn drain(&self) {
        let drain_by = Instant::now() + Duration::from_secs(60);
        loop {
            let pending = self.agent.plane.outbox_stats().await.pending;
            let wanted: Vec<String> = (self.ledger.lock())
                .map(|l| {
                    l.posts.iter().filter(|p| p.2 != "rejected").map(|p| p.1.clone()).collect()
                })
                .unwrap_or_default();
            let got: HashSet<String> = (self.agent.inbound.lock())
                .map(|i| i.iter().map(|m| m.0.clone()).collect())
                .unwrap_or_default();
            if (pending == 0 && wanted.iter().all(|id| got.contains(id)))
                || Instant::now() > drain_by
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the pages, then reads every room's history on whichever replica serves it. A
    /// delivery state the last kill left behind is set by the holder's sweep within its window
    /// (5 s plus a 2 s pass): the histories are read again until none shows `sending` or that
    /// window has passed.
    async fn histories_after(&self, stop: Stop, pages: Vec<JoinHandle<()>>) -> Vec<Vec<Value>> {
        stop.stop();
        for task in pages {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        let settle_until = Instant::now() + Duration::from_secs(8);
        loop {
            let mut histories = Vec::new();
            for visitor in &self.visitors {
                let mut history = None;
                for base in std::iter::once(&self.page_url).chain(&self.replica_urls) {
                    if let Ok(h) = visitor.history(base).await {
                        history = Some(h);
                        break;
                    }
                }
                histories.push(history.unwrap_or_default());
            }
            let sending = histories.iter().flatten().any(|e: &Value| e["status"] == "sending");
            if !sending || Instant::now() >= settle_until {
                return histories;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Every room's visitor joins on a random replica (the others in turn if that one refuses:
/// before the rooms live in the shared database only one replica knows them).
async fn join_visitors(
    replica_urls: &[String],
    rooms: &[String],
    rng: &mut Rng,
    findings: &mut Vec<String>,
) -> Result<Vec<Visitor>> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let mut visitors = Vec::new();
    let mut refused_joins = 0;
    for room in rooms {
        let first = rng.below(3) as usize;
        let mut joined = None;
        for step in 0..3 {
            match Visitor::join(&http, &replica_urls[(first + step) % 3], room).await {
                Ok(visitor) => {
                    joined = Some(visitor);
                    break;
                }
                Err(_) => refused_joins += 1,
            }
        }
        visitors.push(joined.ok_or_else(|| anyhow!("no replica let a visitor join {room}"))?);
    }
    if refused_joins > 0 {
        findings.push(format!(
            "{refused_joins} visitor joins were refused by a replica that does not know the room \
             (rooms are not in the shared database yet)"
        ));
    }
    Ok(visitors)
}

/// The holder and another replica in turn, each killed at a random point of the traffic and
/// restarted 2 to 4 s later.
async fn kill_in_turn(
    cluster: &mut Cluster,
    ledger: &Mutex<Ledger>,
    sizes: &Sizes,
    clock: Traffic,
    rng: &mut Rng,
    findings: &mut Vec<String>,
) -> Result<Vec<Kill>> {
    let total = clock.total;
    let mut kills = Vec::new();
    let plan: Vec<&'static str> = (0..sizes.kills).flat_map(|_| ["holder", "other"]).collect();
    for (k, kind) in plan.iter().enumerate() {
        let at = total * (k + 1) / (plan.len() + 1)
            + rng.below((total / (plan.len() * 4)).max(1) as u64) as usize;
        while ledger.lock().map(|l| l.sent).unwrap_or(total) < at.min(total.saturating_sub(1))
            && !clock.over()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let Some(holder) = wait_holder(cluster).await else {
            findings.push("HAProxy showed no replica holding xAgent's socket within 10 s".into());
            continue;
        };
        let victim = if *kind == "holder" {
            holder
        } else {
            let others: Vec<usize> = (0..3).filter(|i| *i != holder).collect();
            others[rng.below(others.len() as u64) as usize]
        };
        cluster.replicas[victim].kill().await;
        kills.push((*kind, victim, now_ms()));
        tokio::time::sleep(Duration::from_millis(2_000 + rng.below(2_000))).await;
        cluster.replicas[victim].restart().await?;
    }
    Ok(kills)
}

/// The replica HAProxy shows holding xAgent's socket, asked for up to 10 s.
async fn wait_holder(cluster: &Cluster) -> Option<usize> {
    let by = Instant::now() + Duration::from_secs(10);
    while Instant::now() < by {
        if let Some(holder) = cluster.holder().await {
            return Some(holder);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Failover: from each holder kill to the next Tool call started after it that succeeded; the
/// same after the other kills; and how many holder kills there were.
fn failovers(calls: &[Call], kills: &[Kill]) -> (Vec<u64>, Vec<u64>, usize) {
    let next_ok = |killed: u64| {
        calls.iter().filter(|c| c.ok && c.started >= killed).map(|c| c.ended - killed).min()
    };
    let after = |kind: &str| -> Vec<u64> {
        kills.iter().filter(|k| k.0 == kind).filter_map(|k| next_ok(k.2)).collect()
    };
    let holder_kills = kills.iter().filter(|k| k.0 == "holder").count();
    (after("holder"), after("other"), holder_kills)
}

/// The error of a lock a panicked task poisoned.
fn panicked<T>(_: T) -> anyhow::Error {
    anyhow!("a task panicked")
}

/// What the rooms' pages and final histories show.
#[derive(Default)]
struct Rooms {
    /// Each room's entries by text, with their creation times.
    texts: HashMap<(usize, String), Vec<u64>>,
    /// Each room's entry ids.
    entries: Vec<HashSet<String>>,
    missed: usize,
    missed_examples: Vec<String>,
    reconnects: u64,
    failed_reconnects: u64,
    delivered_at: HashMap<String, u64>,
    still_sending: usize,
}

impl Rooms {
    /// The rooms' contents (pages and final histories): a Tool call's or a queued message's
    /// side effect is one entry.
    fn read(histories: &[Vec<Value>], pages: &[Arc<Mutex<Page>>]) -> Result<Rooms> {
        let mut rooms = Rooms::default();
        for (room, history) in histories.iter().enumerate() {
            let page = pages[room].lock().map_err(|_| anyhow!("a page task panicked"))?;
            let contents = room_contents(&page, history);
            for (text, created) in by_text(&contents) {
                rooms.texts.insert((room, text), created);
            }
            rooms.entries.push(contents.keys().cloned().collect());
            // Pages: everything in the room's final history must be among what its page saw.
            for entry in history {
                let Some(id) = entry["message_id"].as_str() else { continue };
                if !page.seen.contains_key(id) {
                    rooms.missed += 1;
                    if rooms.missed_examples.len() < 5 {
                        rooms.missed_examples.push(entry.to_string());
                    }
                }
            }
            rooms.still_sending += history.iter().filter(|e| e["status"] == "sending").count();
            rooms.reconnects += page.reconnects;
            rooms.failed_reconnects += page.failed_reconnects;
            rooms.delivered_at.extend(page.delivered_at.iter().map(|(k, v)| (k.clone(), *v)));
        }
        Ok(rooms)
    }

    /// How many of `calls` (ok) left no entry, came twice, or came after their deadline.
    fn tools(&self, calls: &[Call]) -> (usize, usize, usize) {
        let key = |c: &Call| (c.room, format!("tool {}", c.id));
        let lost = calls.iter().filter(|c| c.ok && !self.texts.contains_key(&key(c))).count();
        let (doubled, late) =
            doubled_and_late(calls.iter().map(|c| (self.texts.get(&key(c)), c.started)));
        (lost, doubled, late)
    }
}

/// The scenario's counts, over its ledger.
struct Tally<'a> {
    ledger: MutexGuard<'a, Ledger>,
    rooms: Rooms,
    total: usize,
    rejected_posts: usize,
    unacked_queued: usize,
    rejected_queued: usize,
    lost: [usize; 3],
    doubled: [usize; 3],
    after_expiry: usize,
    redelivered: usize,
    failovers: Vec<u64>,
    other_next: Vec<u64>,
    holder_kills: usize,
    panics: usize,
}

impl<'a> Tally<'a> {
    /// Counts `run`'s ledger and xAgent's side against the rooms; `total` messages were due.
    fn count(
        run: &'a Shared,
        histories: &[Vec<Value>],
        pages: &[Arc<Mutex<Page>>],
        kills: &[Kill],
        total: usize,
    ) -> Result<Tally<'a>> {
        let ledger = run.ledger.lock().map_err(panicked)?;
        let inbound = run.agent.inbound.lock().map_err(panicked)?.clone();
        let acked = run.agent.acked.lock().map_err(panicked)?.clone();
        let rooms = Rooms::read(histories, pages)?;
        let mut got: HashMap<&str, Vec<u64>> = HashMap::new();
        let mut late = 0;
        for (id, created, received) in &inbound {
            got.entry(id.as_str()).or_default().push(*received);
            if *created > 0 && *received > created + TTL_MS {
                late += 1;
            }
        }
        let taken = ledger.posts.iter().filter(|p| p.2 != "rejected");
        let lost_visitor = taken.clone().filter(|p| !got.contains_key(p.1.as_str())).count();
        let (lost_tools, doubled_tools, late_tools) = rooms.tools(&ledger.calls);
        let refused = |id: &String| acked.get(id).is_some_and(|s| s == "rejected");
        let queued = &ledger.queued;
        let lost_queued =
            queued.iter().filter(|(r, id)| !rooms.entries[*r].contains(id) && !refused(id)).count();
        let doubled_queued = (queued.iter())
            .filter(|(r, id)| {
                rooms.texts.get(&(*r, format!("say {id}"))).is_some_and(|t| t.len() > 1)
            })
            .count();
        let (doubled_visitor, redelivered) = doubles(&got, &rooms.delivered_at);
        let (failovers, other_next, holder_kills) = failovers(&ledger.calls, kills);
        Ok(Tally {
            rejected_posts: ledger.posts.len() - taken.count(),
            unacked_queued: (queued.iter())
                .filter(|(_, id)| {
                    !acked.get(id).is_some_and(|s| s == "accepted" || s == "duplicate")
                })
                .count(),
            rejected_queued: queued.iter().filter(|(_, id)| refused(id)).count(),
            total,
            lost: [lost_visitor, lost_tools, lost_queued],
            doubled: [doubled_visitor, doubled_tools, doubled_queued],
            after_expiry: late + late_tools,
            redelivered,
            failovers,
            other_next,
            holder_kills,
            panics: 0,
            rooms,
            ledger,
        })
    }

    /// The findings the counts show.
    fn find(&self, sizes: &Sizes, findings: &mut Vec<String>) {
        let holder_kills = self.holder_kills;
        if self.failovers.len() < holder_kills {
            findings.push(format!(
                "{} of {holder_kills} holder kills were never followed by a successful tool.invoke",
                holder_kills - self.failovers.len()
            ));
        }
        if self.rejected_posts > 0 {
            findings.push(format!(
                "{} visitor posts were answered `rejected` at once",
                self.rejected_posts
            ));
        }
        if let Some(first) = self.ledger.post_failures.first() {
            let n = self.ledger.post_failures.len();
            findings.push(format!("{n} visitor posts failed 20 tries, e.g. {first}"));
        }
        // A probe is one attempt: the one in flight when its socket died fails, as it should.
        let (tools_failed, probes_failed) = (self.failed(""), self.failed("probe"));
        if tools_failed > probes_failed {
            findings.push(format!(
                "{} Tool calls did not succeed within their 10 s deadline (retried with their \
                 tool_call_id)",
                tools_failed - probes_failed
            ));
        }
        let Rooms { still_sending, missed, .. } = self.rooms;
        if still_sending > 0 {
            findings.push(format!(
                "{still_sending} visitor messages xAgent took still show `sending` in their room"
            ));
        }
        if missed > 0 {
            let examples = &self.rooms.missed_examples;
            findings.push(format!("pages missed {missed} messages, e.g. {examples:?}"));
        }
        if self.rejected_queued > 0 {
            let n = self.rejected_queued;
            findings.push(format!("{n} IM messages were rejected by the Connector"));
        }
        if self.cut_short() {
            findings.push(format!(
                "the traffic was cut short after {} s with {} of {} messages sent",
                sizes.max_traffic_seconds, self.ledger.sent, self.total
            ));
        }
        if let Some(first) = self.ledger.queue_failures.first() {
            let n = self.ledger.queue_failures.len();
            findings.push(format!("{n} IM messages were refused by the outbox, e.g. {first}"));
        }
        if self.panics > 0 {
            findings.push(format!("{} panics in the replicas' logs", self.panics));
        }
    }

    /// The traffic stopped at its time limit before all its messages were sent.
    fn cut_short(&self) -> bool {
        self.ledger.sent < self.total
    }

    /// Tool calls that did not succeed, those whose id starts with `prefix`.
    fn failed(&self, prefix: &str) -> usize {
        (self.ledger.calls.iter()).filter(|c| !c.ok && c.id.starts_with(prefix)).count()
    }

    /// The scenario's report, with its verdict.
    fn report(
        &self,
        sizes: &Sizes,
        kills: &[Kill],
        findings: &[String],
        outbox_pending: usize,
        seconds: f64,
    ) -> Value {
        let (lost, doubled) = (self.lost.iter().sum::<usize>(), self.doubled.iter().sum::<usize>());
        let (rooms, ledger) = (&self.rooms, &self.ledger);
        let calls_ok = ledger.calls.iter().filter(|c| c.ok).count();
        let p99 = percentiles(&self.failovers)["p99"].as_u64();
        let pass = lost == 0
            && doubled == 0
            && self.after_expiry == 0
            && rooms.missed == 0
            && self.panics == 0
            && self.failovers.len() == self.holder_kills
            && self.holder_kills == sizes.kills
            && p99.is_some_and(|p| p <= 5_000)
            && !self.cut_short()
            && self.rejected_queued == 0;
        let (
            [lost_visitor, lost_tools, lost_queued],
            [doubled_visitor, doubled_tools, doubled_queued],
        ) = (self.lost, self.doubled);
        json!({
            "channels": sizes.channels,
            "replicas": 3,
            "health_check": cluster_health_line(findings),
            "visitor_messages": ledger.posts.len(),
            "visitor_messages_rejected": self.rejected_posts,
            "visitor_posts_failed": ledger.post_failures.len(),
            "agent_messages": calls_ok + ledger.queued.len(),
            "tool_calls": ledger.calls.len(),
            "tool_calls_ok": calls_ok,
            "im_messages_queued": ledger.queued.len(),
            "im_messages_unacked": self.unacked_queued,
            "im_messages_rejected": self.rejected_queued,
            "traffic_cut_short": self.cut_short(),
            "outbox_pending_at_end": outbox_pending,
            "visitor_entries_still_sending": rooms.still_sending,
            "holder_kills": self.holder_kills,
            "other_kills": kills.len() - self.holder_kills,
            "kills": kills.iter().map(|k| json!({"kind": k.0, "replica": k.1})).collect::<Vec<_>>(),
            "lost": {"total": lost, "visitor_messages": lost_visitor, "tool_calls": lost_tools, "im_messages": lost_queued},
            "doubled": {"total": doubled, "visitor_messages": doubled_visitor, "tool_calls": doubled_tools, "im_messages": doubled_queued},
            "after_expiry": self.after_expiry,
            "redelivered_unacknowledged": self.redelivered,
            "probes_failed": self.failed("probe"),
            "pages": {"missed": rooms.missed, "reconnects": rooms.reconnects, "failed_reconnects": rooms.failed_reconnects},
            "failover_ms": percentiles(&self.failovers),
            "failovers_ms": self.failovers,
            "other_kill_next_ok_ms": self.other_next,
            "findings": findings,
            "seconds": seconds,
            "pass": pass,
        })
    }
}
