//! The **throughput** scenario (see the module above).

use super::harness::{Agent, Cluster, Sizes};
use super::page::Visitor;
use crate::bench_support::{cpu_ticks, cpu_ticks_with_children, machine_ticks, temp_dir};
use anyhow::{Result, anyhow};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use xagent_testkit::postgres::TestPostgres;

/// With `replica_cpu`, each replica runs under a CPU quota of that many cores (see
/// [`crate::cpu_limit`]), as if on a small host of its own, so the figure shows what adding
/// replicas buys when they, not the shared machine, are the limit.
pub(crate) async fn throughput(
    bin: &Path,
    pg: &TestPostgres,
    sizes: &Sizes,
    replica_cpu: Option<f64>,
) -> Result<Value> {
    let postmaster = postmaster_pid(pg).await;
    let mut figures = Vec::new();
    let mut findings = Vec::new();
    for count in [1usize, 3] {
        let dir = temp_dir("chaos-cluster-throughput")?;
        let database = pg.fresh_database().await;
        let cluster = Cluster::start(bin, &dir, database.expose(), count).await?;
        let mut limits = Vec::new();
        if let Some(cores) = replica_cpu {
            for pid in cluster.replicas.iter().filter_map(|r| r.child.as_ref()?.id()) {
                limits.push(crate::cpu_limit::CpuLimit::apply(
                    &format!("xagent-chaos-replica-{pid}"),
                    pid,
                    cores,
                )?);
            }
        }
        let agent = Agent::connect(&cluster.agent_proxy.url()).await?;
        let rooms = sizes.senders.div_ceil(4);
        for n in 0..rooms {
            agent.open_room(&format!("tproom{n}")).await?;
        }
        let proxy = cluster.page_proxy.url();
        let http = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
        let mut visitors = Vec::new();
        let mut refused = 0;
        for n in 0..sizes.senders {
            let room = format!("tproom{}", n % rooms);
            let mut joined = None;
            for _ in 0..6 {
                match Visitor::join(&http, &proxy, &room).await {
                    Ok(v) => {
                        joined = Some(v);
                        break;
                    }
                    Err(_) => refused += 1,
                }
            }
            visitors.push(
                joined.ok_or_else(|| anyhow!("no visitor could join {room} through HAProxy"))?,
            );
        }
        let cpu = CpuMeter::new(&cluster, postmaster);
        let deadline = Instant::now() + Duration::from_secs(sizes.seconds);
        let mut tasks = Vec::new();
        for (n, visitor) in visitors.into_iter().enumerate() {
            let proxy = proxy.clone();
            tasks.push(tokio::spawn(async move {
                let (mut ok, mut failed, mut i) = (0u64, 0u64, 0u64);
                while Instant::now() < deadline {
                    i += 1;
                    match visitor.post(&proxy, "hello", &format!("t{n}x{i}")).await {
                        Ok(entry) if entry["status"] != "rejected" => ok += 1,
                        _ => failed += 1,
                    }
                }
                (ok, failed)
            }));
        }
        let (mut ok, mut failed) = (0, 0);
        for task in tasks {
            let (o, f) = task.await?;
            ok += o;
            failed += f;
        }
        let cost = cpu.per_message(&cluster, postmaster, ok);
        agent.plane.close().await;
        cluster.stop().await;
        drop(limits);
        let _ = std::fs::remove_dir_all(&dir);
        if refused > 0 || failed > 0 {
            findings.push(format!(
                "{count} replica(s): {refused} joins and {failed} posts through HAProxy refused"
            ));
        }
        figures.push((ok as f64 / sizes.seconds as f64, failed, cost));
    }
    let (one, three) = (figures[0].0, figures[1].0);
    let ratio = if one > 0.0 { three / one } else { 0.0 };
    Ok(json!({
        "senders": sizes.senders,
        "seconds": sizes.seconds,
        "replica_cpu_cores": replica_cpu,
        "one_replica_per_sec": one.round(),
        "three_replicas_per_sec": three.round(),
        "ratio": (ratio * 100.0).round() / 100.0,
        "target_met": ratio >= 2.0,
        "failed_posts": figures.iter().map(|f| f.1).sum::<u64>(),
        "cpu_one_replica": figures[0].2,
        "cpu_three_replicas": figures[1].2,
        "findings": findings,
        "pass": figures.iter().all(|f| f.1 == 0),
    }))
}

/// The PostgreSQL server's main process, from the `postmaster.pid` in its data directory
/// (`None` for a server elsewhere: its CPU is then not counted).
async fn postmaster_pid(pg: &TestPostgres) -> Option<u32> {
    let pool = xagent_storage_postgres::connect(pg.admin_url(), Default::default()).await.ok()?;
    let client = pool.get().await.ok()?;
    let row = client.query_one("SHOW data_directory", &[]).await.ok()?;
    let dir: String = row.try_get(0).ok()?;
    let pid = std::fs::read_to_string(Path::new(&dir).join("postmaster.pid")).ok()?;
    pid.lines().next()?.trim().parse().ok()
}

/// CPU used during a throughput window, by part: the replicas, HAProxy, PostgreSQL, and this
/// process (xAgent and the visitors), plus how busy the whole machine was.
struct CpuMeter {
    pub(crate) replicas: u64,
    /// Each replica's, in the order of `Cluster::replicas`.
    pub(crate) each: Vec<u64>,
    pub(crate) haproxy: u64,
    pub(crate) postgres: u64,
    pub(crate) load: u64,
    pub(crate) machine: (u64, u64),
}

impl CpuMeter {
    pub(crate) fn sample(cluster: &Cluster, postmaster: Option<u32>) -> CpuMeter {
        let each: Vec<u64> = cluster
            .replicas
            .iter()
            .map(|r| {
                r.child.as_ref().and_then(|c| c.id()).map_or(0, |pid| cpu_ticks(&pid.to_string()))
            })
            .collect();
        let replicas = each.iter().sum();
        let haproxy = [&cluster.agent_proxy, &cluster.page_proxy]
            .iter()
            .map(|p| cpu_ticks(&p.pid().to_string()))
            .sum();
        CpuMeter {
            replicas,
            each,
            haproxy,
            postgres: postmaster.map_or(0, cpu_ticks_with_children),
            load: cpu_ticks("self"),
            machine: machine_ticks(),
        }
    }

    pub(crate) fn new(cluster: &Cluster, postmaster: Option<u32>) -> CpuMeter {
        Self::sample(cluster, postmaster)
    }

    /// CPU milliseconds per message since [`CpuMeter::new`], by part.
    pub(crate) fn per_message(
        &self,
        cluster: &Cluster,
        postmaster: Option<u32>,
        messages: u64,
    ) -> Value {
        let now = Self::sample(cluster, postmaster);
        // A clock tick is 10 ms.
        let ms = |after: u64, before: u64| {
            let per = after.saturating_sub(before) as f64 * 10.0 / messages.max(1) as f64;
            (per * 1000.0).round() / 1000.0
        };
        let (busy, total) = (
            now.machine.0.saturating_sub(self.machine.0),
            now.machine.1.saturating_sub(self.machine.1),
        );
        // The busiest first (the socket holder, which also delivers every message to xAgent).
        let mut each: Vec<f64> =
            now.each.iter().zip(&self.each).map(|(after, before)| ms(*after, *before)).collect();
        each.sort_by(|a, b| b.total_cmp(a));
        json!({
            "replicas_ms": ms(now.replicas, self.replicas),
            "each_replica_ms": each,
            "haproxy_ms": ms(now.haproxy, self.haproxy),
            "postgres_ms": ms(now.postgres, self.postgres),
            "load_generator_ms": ms(now.load, self.load),
            "machine_busy": if total > 0 { (busy as f64 / total as f64 * 100.0).round() / 100.0 } else { 0.0 },
        })
    }
}
