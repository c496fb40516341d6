//! The **replica-kill** scenario (see the module above).

use super::harness::{
    Agent, Cluster, Replica, Sizes, TOOL_DEADLINE_MS, TTL_MS, cluster_health_line, now_ms,
    percentiles, tokio_util_stop,
};
use super::page::{Call, Ledger, Visitor, by_text, doubles, room_contents, watch_page};
use crate::bench_support::temp_dir;
use crate::chaos::harness::Rng;
use anyhow::{Result, anyhow};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xagent_protocol_types::ChatMessage;
use xagent_testkit::postgres::TestPostgres;

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
    let agent = Arc::new(Agent::connect(&cluster.agent_proxy.url()).await?);
    let rooms: Vec<String> = (0..sizes.channels).map(|n| format!("chaosroom{n}")).collect();
    let mut channels = Vec::new();
    for room in &rooms {
        channels.push(agent.open_room(room).await?);
    }
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let replica_urls: Vec<String> = cluster.replicas.iter().map(Replica::url).collect();
    let page_url = cluster.page_proxy.url();
    // Every room's visitor joins on a random replica (the others in turn if that one
    // refuses: before the rooms live in the shared database only one replica knows them).
    let mut visitors = Vec::new();
    let mut refused_joins = 0;
    for room in &rooms {
        let first = rng.below(3) as usize;
        let mut joined = None;
        for step in 0..3 {
            let base = &replica_urls[(first + step) % 3];
            match Visitor::join(&http, base, room).await {
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
    let stop = tokio_util_stop();
    // Pages: each room's event stream on a random replica; reconnect through HAProxy.
    let mut pages = Vec::new();
    let mut page_tasks = Vec::new();
    for visitor in &visitors {
        let first = replica_urls[rng.below(3) as usize].clone();
        let (page, task) = watch_page(visitor.clone(), first, page_url.clone(), stop.clone());
        pages.push(page);
        page_tasks.push(task);
    }
    // Traffic: visitor posts (half), Tool calls and IM messages (a quarter each).
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let workers = 8usize;
    let per_worker = sizes.messages.div_ceil(workers);
    let (traffic_started, max_traffic) = (Instant::now(), sizes.max_traffic_seconds);
    let mut traffic = Vec::new();
    for worker in 0..workers {
        let (agent, ledger) = (agent.clone(), ledger.clone());
        let (visitors, channels) = (visitors.clone(), channels.clone());
        let (replica_urls, proxy) = (replica_urls.clone(), page_url.clone());
        let mut rng = Rng::new(rng.next());
        traffic.push(tokio::spawn(async move {
            for n in 0..per_worker {
                if traffic_started.elapsed().as_secs() >= max_traffic {
                    break;
                }
                let room = rng.below(visitors.len() as u64) as usize;
                let id = format!("w{worker}n{n}");
                match rng.below(4) {
                    0 | 1 => {
                        // Directly to a random replica or through HAProxy; a refused or
                        // failed post is repeated (same client_id) through HAProxy.
                        let pick = rng.below(4) as usize;
                        let mut base = replica_urls.get(pick).cloned().unwrap_or(proxy.clone());
                        let mut last = String::new();
                        let mut done = false;
                        for _ in 0..20 {
                            match visitors[room].post(&base, &format!("visitor {id}"), &id).await {
                                Ok(entry) => {
                                    let message_id =
                                        entry["message_id"].as_str().unwrap_or_default();
                                    let status = entry["status"].as_str().unwrap_or_default();
                                    if let Ok(mut l) = ledger.lock() {
                                        l.posts.push((room, message_id.into(), status.into()));
                                    }
                                    done = true;
                                    break;
                                }
                                Err(e) => last = e.to_string(),
                            }
                            base = proxy.clone();
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                        if !done && let Ok(mut l) = ledger.lock() {
                            l.post_failures.push(last);
                        }
                    }
                    2 => {
                        // The same tool_call_id until it succeeds: the Connector's key.
                        let started = now_ms();
                        let mut ok = false;
                        while now_ms() < started + TOOL_DEADLINE_MS {
                            if agent.tool(&channels[room], &id).await.is_ok() {
                                ok = true;
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        let call = Call { id: id.clone(), room, started, ended: now_ms(), ok };
                        if let Ok(mut l) = ledger.lock() {
                            l.calls.push(call);
                        }
                    }
                    _ => {
                        let message = ChatMessage::text(id.as_str(), format!("say {id}"))
                            .created_at(now_ms());
                        let channel = agent
                            .plane
                            .current_channel(&channels[room])
                            .await
                            .unwrap_or_else(|| channels[room].clone());
                        let queued = agent.plane.send_chat_message(&channel, message).await;
                        if let Ok(mut l) = ledger.lock() {
                            match queued {
                                Ok(_) => l.queued.push((room, id.clone())),
                                Err(e) => l.queue_failures.push(e.to_string()),
                            }
                        }
                    }
                }
                if let Ok(mut l) = ledger.lock() {
                    l.sent += 1;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    // A prober: one Tool call every 100 ms on the first room, for the failover time.
    let probe_stop = tokio_util_stop();
    let prober = {
        let (agent, ledger, stop, channel) =
            (agent.clone(), ledger.clone(), probe_stop.clone(), channels[0].clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.stopped() {
                n += 1;
                let id = format!("probe{n}");
                let started = now_ms();
                let ok = agent.tool(&channel, &id).await.is_ok();
                let call = Call { id, room: 0, started, ended: now_ms(), ok };
                if let Ok(mut l) = ledger.lock() {
                    l.calls.push(call);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // Kills: the holder and another replica in turn, each at a random point of the traffic.
    let total = per_worker * workers;
    let mut kills: Vec<(&'static str, usize, u64)> = Vec::new();
    let plan: Vec<&'static str> = (0..sizes.kills).flat_map(|_| ["holder", "other"]).collect();
    for (k, kind) in plan.iter().enumerate() {
        let at = total * (k + 1) / (plan.len() + 1)
            + rng.below((total / (plan.len() * 4)).max(1) as u64) as usize;
        while ledger.lock().map(|l| l.sent).unwrap_or(total) < at.min(total.saturating_sub(1))
            && traffic_started.elapsed().as_secs() < max_traffic
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut holder = None;
        let by = Instant::now() + Duration::from_secs(10);
        while holder.is_none() && Instant::now() < by {
            holder = cluster.holder().await;
            if holder.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let Some(holder) = holder else {
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
        kills.push((kind, victim, now_ms()));
        tokio::time::sleep(Duration::from_millis(2_000 + rng.below(2_000))).await;
        cluster.replicas[victim].restart().await?;
    }
    for task in traffic {
        task.await?;
    }
    // Drain: the outbox empties and every visitor message the Connector took reaches xAgent.
    let drain_by = Instant::now() + Duration::from_secs(60);
    loop {
        let pending = agent.plane.outbox_stats().await.pending;
        let wanted: Vec<String> = ledger
            .lock()
            .map(|l| l.posts.iter().filter(|p| p.2 != "rejected").map(|p| p.1.clone()).collect())
            .unwrap_or_default();
        let got: HashSet<String> = agent
            .inbound
            .lock()
            .map(|i| i.iter().map(|m| m.0.clone()).collect())
            .unwrap_or_default();
        if (pending == 0 && wanted.iter().all(|id| got.contains(id))) || Instant::now() > drain_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The prober's last call ends, then the pages get a moment to see it.
    probe_stop.stop();
    prober.await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.stop();
    for task in page_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    // Every room's history, read on whichever replica serves it. A delivery state the last
    // kill left behind is set by the holder's sweep within its window (5 s plus a 2 s pass):
    // the histories are read again until none shows `sending` or that window has passed.
    let settle_until = Instant::now() + Duration::from_secs(8);
    let histories = loop {
        let mut histories = Vec::new();
        for visitor in &visitors {
            let mut history = None;
            for base in std::iter::once(&page_url).chain(&replica_urls) {
                if let Ok(h) = visitor.history(base).await {
                    history = Some(h);
                    break;
                }
            }
            histories.push(history.unwrap_or_default());
        }
        let sending = histories.iter().flatten().any(|e: &Value| e["status"] == "sending");
        if !sending || Instant::now() >= settle_until {
            break histories;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let outbox_pending = agent.plane.outbox_stats().await.pending;
    agent.plane.close().await;
    let seconds = started.elapsed().as_secs_f64();
    let logs: String = cluster
        .replicas
        .iter()
        .map(|r| std::fs::read_to_string(r.dir.join("replica.log")).unwrap_or_default())
        .collect();
    let panics = logs.matches("panicked").count();
    cluster.stop().await;

    let ledger = ledger.lock().map_err(|_| anyhow!("a task panicked"))?;
    let inbound = agent.inbound.lock().map_err(|_| anyhow!("a task panicked"))?.clone();
    let acked = agent.acked.lock().map_err(|_| anyhow!("a task panicked"))?.clone();
    let mut got: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut late = 0;
    for (id, created, received) in &inbound {
        got.entry(id.as_str()).or_default().push(*received);
        if *created > 0 && *received > created + TTL_MS {
            late += 1;
        }
    }
    let taken: Vec<&(usize, String, String)> =
        ledger.posts.iter().filter(|p| p.2 != "rejected").collect();
    let rejected_posts = ledger.posts.len() - taken.len();
    let lost_visitor = taken.iter().filter(|p| !got.contains_key(p.1.as_str())).count();
    // The rooms' contents (pages and final histories): a Tool call's or a queued message's
    // side effect is one entry.
    let mut texts: HashMap<(usize, String), Vec<u64>> = HashMap::new();
    let mut entries: Vec<HashSet<String>> = Vec::new();
    let (mut missed, mut reconnects, mut failed_reconnects) = (0, 0, 0);
    let mut missed_examples = Vec::new();
    let mut delivered_at: HashMap<String, u64> = HashMap::new();
    let mut still_sending = 0;
    for (room, history) in histories.iter().enumerate() {
        let page = pages[room].lock().map_err(|_| anyhow!("a page task panicked"))?;
        let contents = room_contents(&page, history);
        for (text, created) in by_text(&contents) {
            texts.insert((room, text), created);
        }
        entries.push(contents.keys().cloned().collect());
        // Pages: everything in the room's final history must be among what its page saw.
        for entry in history {
            let Some(id) = entry["message_id"].as_str() else { continue };
            if !page.seen.contains_key(id) {
                missed += 1;
                if missed_examples.len() < 5 {
                    missed_examples.push(entry.to_string());
                }
            }
        }
        still_sending += history.iter().filter(|e| e["status"] == "sending").count();
        reconnects += page.reconnects;
        failed_reconnects += page.failed_reconnects;
        delivered_at.extend(page.delivered_at.iter().map(|(k, v)| (k.clone(), *v)));
    }
    let calls_ok: Vec<&Call> = ledger.calls.iter().filter(|c| c.ok).collect();
    let lost_tools = calls_ok
        .iter()
        .filter(|c| !texts.contains_key(&(c.room, format!("tool {}", c.id))))
        .count();
    let mut doubled_tools = 0;
    let mut late_tools = 0;
    for call in &ledger.calls {
        let Some(times) = texts.get(&(call.room, format!("tool {}", call.id))) else { continue };
        if times.len() > 1 {
            doubled_tools += 1;
        }
        if times.iter().any(|t| *t > call.started + TOOL_DEADLINE_MS) {
            late_tools += 1;
        }
    }
    let refused = |id: &String| acked.get(id).is_some_and(|s| s == "rejected");
    let lost_queued = ledger
        .queued
        .iter()
        .filter(|(room, id)| !entries[*room].contains(id) && !refused(id))
        .count();
    let rejected_queued = ledger.queued.iter().filter(|(_, id)| refused(id)).count();
    let doubled_queued = ledger
        .queued
        .iter()
        .filter(|(room, id)| texts.get(&(*room, format!("say {id}"))).is_some_and(|t| t.len() > 1))
        .count();
    let unacked_queued = ledger
        .queued
        .iter()
        .filter(|(_, id)| !acked.get(id).is_some_and(|s| s == "accepted" || s == "duplicate"))
        .count();
    // Failover: from each kill to the next Tool call started after it that succeeded.
    let next_ok = |killed: u64| {
        ledger.calls.iter().filter(|c| c.ok && c.started >= killed).map(|c| c.ended - killed).min()
    };
    let failovers: Vec<u64> =
        kills.iter().filter(|k| k.0 == "holder").filter_map(|k| next_ok(k.2)).collect();
    let other_next: Vec<u64> =
        kills.iter().filter(|k| k.0 == "other").filter_map(|k| next_ok(k.2)).collect();
    let holder_kills = kills.iter().filter(|k| k.0 == "holder").count();
    let tools_failed = ledger.calls.iter().filter(|c| !c.ok).count();
    let probes_failed = ledger.calls.iter().filter(|c| !c.ok && c.id.starts_with("probe")).count();
    let cut_short = ledger.sent < total;
    if failovers.len() < holder_kills {
        findings.push(format!(
            "{} of {holder_kills} holder kills were never followed by a successful tool.invoke",
            holder_kills - failovers.len()
        ));
    }
    if rejected_posts > 0 {
        findings.push(format!("{rejected_posts} visitor posts were answered `rejected` at once"));
    }
    if !ledger.post_failures.is_empty() {
        findings.push(format!(
            "{} visitor posts failed 20 tries, e.g. {}",
            ledger.post_failures.len(),
            ledger.post_failures[0]
        ));
    }
    // A probe is one attempt: the one in flight when its socket died fails, as it should.
    if tools_failed > probes_failed {
        findings.push(format!(
            "{} Tool calls did not succeed within their 10 s deadline (retried with their \
             tool_call_id)",
            tools_failed - probes_failed
        ));
    }
    if still_sending > 0 {
        findings.push(format!(
            "{still_sending} visitor messages xAgent took still show `sending` in their room"
        ));
    }
    if missed > 0 {
        findings.push(format!("pages missed {missed} messages, e.g. {missed_examples:?}"));
    }
    if rejected_queued > 0 {
        findings.push(format!("{rejected_queued} IM messages were rejected by the Connector"));
    }
    if cut_short {
        findings.push(format!(
            "the traffic was cut short after {} s with {} of {total} messages sent",
            sizes.max_traffic_seconds, ledger.sent
        ));
    }
    if !ledger.queue_failures.is_empty() {
        findings.push(format!(
            "{} IM messages were refused by the outbox, e.g. {}",
            ledger.queue_failures.len(),
            ledger.queue_failures[0]
        ));
    }
    if panics > 0 {
        findings.push(format!("{panics} panics in the replicas' logs"));
    }
    let (doubled_visitor, redelivered) = doubles(&got, &delivered_at);
    let lost = lost_visitor + lost_tools + lost_queued;
    let doubled = doubled_visitor + doubled_tools + doubled_queued;
    let after_expiry = late + late_tools;
    let p99 = percentiles(&failovers)["p99"].as_u64();
    let pass = lost == 0
        && doubled == 0
        && after_expiry == 0
        && missed == 0
        && panics == 0
        && failovers.len() == holder_kills
        && holder_kills == sizes.kills
        && p99.is_some_and(|p| p <= 5_000)
        && !cut_short
        && rejected_queued == 0;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({
        "channels": rooms.len(),
        "replicas": 3,
        "health_check": cluster_health_line(&findings),
        "visitor_messages": ledger.posts.len(),
        "visitor_messages_rejected": rejected_posts,
        "visitor_posts_failed": ledger.post_failures.len(),
        "agent_messages": calls_ok.len() + ledger.queued.len(),
        "tool_calls": ledger.calls.len(),
        "tool_calls_ok": calls_ok.len(),
        "im_messages_queued": ledger.queued.len(),
        "im_messages_unacked": unacked_queued,
        "im_messages_rejected": rejected_queued,
        "traffic_cut_short": cut_short,
        "outbox_pending_at_end": outbox_pending,
        "visitor_entries_still_sending": still_sending,
        "holder_kills": holder_kills,
        "other_kills": kills.len() - holder_kills,
        "kills": kills.iter().map(|k| json!({"kind": k.0, "replica": k.1})).collect::<Vec<_>>(),
        "lost": {"total": lost, "visitor_messages": lost_visitor, "tool_calls": lost_tools, "im_messages": lost_queued},
        "doubled": {"total": doubled, "visitor_messages": doubled_visitor, "tool_calls": doubled_tools, "im_messages": doubled_queued},
        "after_expiry": after_expiry,
        "redelivered_unacknowledged": redelivered,
        "probes_failed": probes_failed,
        "pages": {"missed": missed, "reconnects": reconnects, "failed_reconnects": failed_reconnects},
        "failover_ms": percentiles(&failovers),
        "failovers_ms": failovers,
        "other_kill_next_ok_ms": other_next,
        "findings": findings,
        "seconds": seconds,
        "pass": pass,
    }))
}
