//! The **throughput** scenario (see the module above).

use super::harness::{Agent, Cluster, CpuMeter, Sizes, postmaster_pid};
use super::page::Visitor;
use crate::bench_support::temp_dir;
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
