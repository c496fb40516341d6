//! `cargo xtask bench-ws`: `tool.invoke` round trips per second through `server-runtime` (the
//! echo Connector's no-op Tool `echo_noop`), against a bare tokio-tungstenite echo server that
//! sends every frame straight back, driven by the same client in the same run.
//!
//! Both servers run on their own 2-worker tokio runtime; the client on another thread. Each
//! round measures, for both servers: closed-loop throughput with 1 and 64 requests in flight,
//! then an open loop at half of that server's 64-in-flight peak for p50/p99 latency (measured
//! from each request's scheduled send time, so queueing behind a slow reply counts). The
//! client encodes the same `tool.invoke` frame and decodes every reply as a packet in both
//! cases, so only the server side differs. Figures are medians over the rounds.
//!
//! Durable Tools: the same closed loops (1 and 64 in flight) against the echo Connector's
//! side-effecting Tool `echo_send`, whose result the runtime commits to SQLite before it
//! answers (repeated calls, SPEC-NOTES idempotency), next to raw single-row SQLite commits with
//! the same settings in the same round (`durable_tool_ratio_vs_sqlite`, 64 in flight;
//! `durable_tool_ratio_vs_sqlite_inflight_1`). `--synchronous full|normal` picks the SQLite
//! durability of both sides (default `full`, the runtime's default).
//!
//! `--postgres` puts the runtime's state on PostgreSQL (testkit's server, or the one
//! `XAGENT_TEST_DATABASE_URL` names) and compares the durable Tool with raw single-row
//! PostgreSQL commits on the same server, through the same driver and pool settings, in each
//! round (`durable_tool_ratio_vs_postgres`; `--synchronous` does not apply).
//!
//! `--log text|json` installs the runtime's logger at its default `info` filter, writing to a
//! sink, as a deployed Connector logs: each inbound packet then opens its `packet` span (type,
//! `request_id`, channel) and the formatter runs. Without it no logger is installed and spans
//! cost only their disabled check, so the two runs side by side give the logging's price.
//!
//! `--quick` is one round of 2 s phases (under a minute); `--json` prints one JSON object whose
//! `ratio_vs_echo` is the 64-in-flight ratio; `--rounds N` and `--seconds S` override.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use xagent_protocol_types::Packet;
use xagent_server_runtime::ops::{DEFAULT_LOG_FILTER, LogFormat, logger};

use crate::bench_support::{
    API_KEY, Flags, PacketSocket, ServerSide, bench_database, machine, median, print_table,
    quantile, raw_postgres_commits, warn_if_debug,
};

/// Which server a phase drives.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    Echo,
    Connector,
    /// The Connector's side-effecting Tool (a durable record per call).
    DurableTool,
}

#[derive(Clone, Debug)]
struct Endpoint {
    echo_url: String,
    connector_url: String,
}

/// Runs the benchmark with the given flags.
pub fn run(args: &[String]) -> Result<std::process::ExitCode> {
    let mut flags = Flags::parse(args);
    let postgres = flags.switch("--postgres");
    flags.only(&["--rounds", "--seconds", "--synchronous", "--log"])?;
    let log: Option<LogFormat> = flags.value("--log")?;
    if let Some(format) = log {
        tracing::subscriber::set_global_default(logger(
            DEFAULT_LOG_FILTER,
            format,
            std::io::sink,
            false,
        ))?;
    }
    if postgres && flags.value::<String>("--synchronous")?.is_some() {
        bail!("--synchronous is SQLite's; it does not apply with --postgres");
    }
    warn_if_debug();
    let synchronous = crate::bench_durable::synchronous_flag(&flags)?;
    let rounds: usize = flags.value("--rounds")?.unwrap_or(if flags.quick { 1 } else { 3 });
    let seconds: f64 = flags.value("--seconds")?.unwrap_or(if flags.quick { 2.0 } else { 5.0 });
    let phase = Duration::from_secs_f64(seconds);

    let client = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // With --postgres: the runtime's database and the raw commits' database, on one server.
    let databases = if postgres {
        Some(client.block_on(async {
            Ok::<_, anyhow::Error>((bench_database().await?, bench_database().await?))
        })?)
    } else {
        None
    };
    let servers = match &databases {
        Some((url, _)) => ServerSide::start_postgres("bench-ws-pg", url)?,
        None => ServerSide::start("bench-ws", synchronous)?,
    };
    let raw_key = if postgres { "postgres_commits_per_s" } else { "sqlite_commits_per_s" };
    let connector = &servers.connector;
    let echo_addr = servers.runtime.block_on(start_bare_echo())?;
    let endpoint =
        Endpoint { echo_url: format!("ws://{echo_addr}/"), connector_url: connector.ws_url() };

    let mut per_round: Vec<Value> = Vec::new();
    for round in 0..rounds {
        let mut figures = json!({});
        for target in [Target::Echo, Target::Connector] {
            let one = client.block_on(closed_loop(&endpoint, target, 1, phase))?;
            let many = client.block_on(closed_loop(&endpoint, target, 64, phase))?;
            let rate = (many.per_second / 2.0).max(1.0);
            let open = client.block_on(open_loop(&endpoint, target, rate, phase))?;
            let name = if target == Target::Echo { "echo" } else { "connector" };
            figures[name] = json!({
                "rps_inflight_1": one.per_second,
                "rps_inflight_64": many.per_second,
                "latency_rate_per_s": rate,
                "p50_us": open.p50_us,
                "p99_us": open.p99_us,
                "errors": one.errors + many.errors + open.errors,
            });
        }
        // Side-effecting Tool calls, then raw single-row commits on the same disk (or the
        // same PostgreSQL server) right after.
        let one = client.block_on(closed_loop(&endpoint, Target::DurableTool, 1, phase))?;
        let many = client.block_on(closed_loop(&endpoint, Target::DurableTool, 64, phase))?;
        let raw = match &databases {
            Some((_, raw_url)) => client.block_on(raw_postgres_commits(raw_url, phase))?,
            None => crate::bench_durable::raw_commits(
                &servers.dir.join(format!("commits-{round}.sqlite3")),
                phase,
                synchronous,
            )?,
        };
        figures["durable_tool"] = json!({
            "rps_inflight_1": one.per_second,
            "rps_inflight_64": many.per_second,
            "errors": one.errors + many.errors,
        });
        figures[raw_key] = json!(raw);
        if !flags.json {
            eprintln!("round {}/{rounds} done", round + 1);
        }
        per_round.push(figures);
    }
    servers.stop();

    let pick = |target: &str, field: &str| {
        let mut values: Vec<f64> =
            per_round.iter().filter_map(|r| r[target][field].as_f64()).collect();
        median(&mut values)
    };
    let summary = |target: &str| {
        json!({
            "rps_inflight_1": pick(target, "rps_inflight_1").round(),
            "rps_inflight_64": pick(target, "rps_inflight_64").round(),
            "latency_rate_per_s": pick(target, "latency_rate_per_s").round(),
            "p50_us": pick(target, "p50_us"),
            "p99_us": pick(target, "p99_us"),
        })
    };
    let errors: u64 = per_round
        .iter()
        .map(|r| {
            r["echo"]["errors"].as_u64().unwrap_or(0)
                + r["connector"]["errors"].as_u64().unwrap_or(0)
                + r["durable_tool"]["errors"].as_u64().unwrap_or(0)
        })
        .sum();
    let ratio = |field: &str| {
        let echo = pick("echo", field);
        if echo > 0.0 { (pick("connector", field) / echo * 1000.0).round() / 1000.0 } else { 0.0 }
    };
    let sqlite_commits_per_s = {
        let mut values: Vec<f64> = per_round.iter().filter_map(|r| r[raw_key].as_f64()).collect();
        median(&mut values)
    };
    let durable_ratio = |field: &str| {
        // Per round (the tool calls and the raw commits ran back to back), then the median.
        let mut values: Vec<f64> = per_round
            .iter()
            .filter_map(|r| {
                let raw = r[raw_key].as_f64()?;
                let tool = r["durable_tool"][field].as_f64()?;
                (raw > 0.0).then_some(tool / raw)
            })
            .collect();
        (median(&mut values) * 1000.0).round() / 1000.0
    };
    let backend = if postgres { "postgres" } else { "sqlite" };
    let mut result = json!({
        "bench": "ws",
        "backend": backend,
        "quick": flags.quick,
        "rounds": rounds,
        "phase_seconds": seconds,
        "echo": summary("echo"),
        "connector": summary("connector"),
        "ratio_vs_echo": ratio("rps_inflight_64"),
        "ratio_vs_echo_inflight_1": ratio("rps_inflight_1"),
        "target_ratio": 0.7,
        "synchronous": synchronous.as_str(),
        "log": log.map_or("none", LogFormat::as_str),
        "durable_tool": {
            "rps_inflight_1": pick("durable_tool", "rps_inflight_1").round(),
            "rps_inflight_64": pick("durable_tool", "rps_inflight_64").round(),
        },
        "sqlite_commits_per_s": sqlite_commits_per_s.round(),
        "sqlite_txn_per_s": sqlite_commits_per_s.round(),
        "durable_tool_ratio_vs_sqlite": durable_ratio("rps_inflight_64"),
        "durable_tool_ratio_vs_sqlite_inflight_1": durable_ratio("rps_inflight_1"),
        "durable_target_ratio": 1.0,
        "durable_target_ratio_inflight_1": 0.7,
        "errors": errors,
        "per_round": per_round,
        "machine": machine(),
    });
    if postgres {
        // The same figures under PostgreSQL's names (no SQLite setting applies).
        if let Some(object) = result.as_object_mut() {
            for key in ["synchronous", "sqlite_commits_per_s", "sqlite_txn_per_s"] {
                object.remove(key);
            }
            for (from, to) in [
                ("durable_tool_ratio_vs_sqlite", "durable_tool_ratio_vs_postgres"),
                (
                    "durable_tool_ratio_vs_sqlite_inflight_1",
                    "durable_tool_ratio_vs_postgres_inflight_1",
                ),
            ] {
                if let Some(value) = object.remove(from) {
                    object.insert(to.into(), value);
                }
            }
            object.insert("postgres_commits_per_s".into(), json!(sqlite_commits_per_s.round()));
        }
    }
    let (raw_name, ratio_key) = if postgres {
        (
            "raw single-row PostgreSQL commits/s (one connection)".to_owned(),
            "durable_tool_ratio_vs_postgres",
        )
    } else {
        (
            format!("raw single-row SQLite commits/s (synchronous={})", synchronous.as_str()),
            "durable_tool_ratio_vs_sqlite",
        )
    };
    if flags.json {
        println!("{result}");
    } else {
        let row = |name: &str, key: &str| {
            let s = &result[key];
            vec![
                name.to_string(),
                format!("{}", s["rps_inflight_1"]),
                format!("{}", s["rps_inflight_64"]),
                format!("{}", s["latency_rate_per_s"]),
                format!("{}", s["p50_us"]),
                format!("{}", s["p99_us"]),
            ]
        };
        print_table(
            &[
                "server",
                "rt/s 1 in flight",
                "rt/s 64 in flight",
                "rate for latency /s",
                "p50 µs",
                "p99 µs",
            ],
            &[
                row("bare tokio-tungstenite echo", "echo"),
                row("server-runtime echo_noop", "connector"),
            ],
        );
        println!(
            "\nratio vs echo: {} at 64 in flight (target >= 0.7), {} at 1 in flight; errors: {errors}",
            result["ratio_vs_echo"], result["ratio_vs_echo_inflight_1"]
        );
        println!(
            "durable Tool (echo_send) calls/s on {backend}: {} at 1 in flight, {} at 64; {raw_name}: {}\nratio vs raw commits: {} at 64 in flight (target >= 1.0), {} at 1 in flight (target >= 0.7)",
            result["durable_tool"]["rps_inflight_1"],
            result["durable_tool"]["rps_inflight_64"],
            result[raw_key],
            result[ratio_key],
            result[&format!("{ratio_key}_inflight_1")]
        );
    }
    if errors > 0 {
        bail!("{errors} tool.invoke calls failed");
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// A WebSocket server that sends every text frame straight back (the transport's limit).
async fn start_bare_echo() -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let Ok(mut socket) =
                    tokio_tungstenite::accept_hdr_async(stream, offer_subprotocol).await
                else {
                    return;
                };
                while let Some(Ok(message)) = socket.next().await {
                    let echo = matches!(message, Message::Text(_) | Message::Binary(_));
                    if matches!(message, Message::Close(_))
                        || (echo && socket.send(message).await.is_err())
                    {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// Accepts the protocol's subprotocol when offered, as the Connector does.
#[allow(clippy::result_large_err)] // the signature tungstenite's callback requires
fn offer_subprotocol(
    request: &tokio_tungstenite::tungstenite::handshake::server::Request,
    mut response: tokio_tungstenite::tungstenite::handshake::server::Response,
) -> Result<
    tokio_tungstenite::tungstenite::handshake::server::Response,
    tokio_tungstenite::tungstenite::handshake::server::ErrorResponse,
> {
    if request.headers().contains_key("Sec-WebSocket-Protocol") {
        response.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            tokio_tungstenite::tungstenite::http::HeaderValue::from_static(
                xagent_protocol_types::SUBPROTOCOL,
            ),
        );
    }
    Ok(response)
}

/// A connected client: for the Connector, hello + a signed-in channel.
async fn connect(endpoint: &Endpoint, target: Target) -> Result<(PacketSocket, String)> {
    match target {
        Target::Echo => {
            let socket = PacketSocket::connect(&endpoint.echo_url, None).await?;
            Ok((socket, "cch_bench".to_string()))
        }
        Target::Connector | Target::DurableTool => {
            let mut socket = PacketSocket::connect(&endpoint.connector_url, Some(API_KEY)).await?;
            let channel = socket.echo_session(true, None).await?;
            Ok((socket, channel))
        }
    }
}

/// The `tool.invoke` frame numbered `n`: the no-op Tool, or `echo_send` for durable calls.
fn invoke(target: Target, channel: &str, n: u64) -> String {
    if target == Target::DurableTool {
        return format!(
            r#"{{"schema":"xagent.connector.packet/v1","packet_id":"pkt_b{n}","request_id":"req_b{n}","connector_channel_id":"{channel}","type":"tool.invoke","payload":{{"tool_id":"echo_send","arguments":{{"connector_channel_id":"{channel}","text":"bench {n}"}}}}}}"#
        );
    }
    format!(
        r#"{{"schema":"xagent.connector.packet/v1","packet_id":"pkt_b{n}","request_id":"req_b{n}","connector_channel_id":"{channel}","type":"tool.invoke","payload":{{"tool_id":"echo_noop","arguments":{{"connector_channel_id":"{channel}"}}}}}}"#
    )
}

/// The request number of a reply, and whether it failed; `None` for other packets.
fn reply_number(target: Target, text: &str) -> Option<(u64, bool)> {
    let packet = Packet::decode_str(text).ok()?;
    let wanted = if target == Target::Echo { "tool.invoke" } else { "tool.invoke.ack" };
    if packet.type_str() != wanted {
        return None;
    }
    let n = packet.request_id.as_ref()?.as_str().strip_prefix("req_b")?.parse().ok()?;
    let failed = packet.error.is_some()
        || packet.to_value().ok().is_some_and(|v| v["payload"]["ok"] == json!(false));
    Some((n, failed))
}

struct Closed {
    per_second: f64,
    errors: u64,
}

/// `inflight` requests outstanding at all times for `phase` (after a short warm-up).
async fn closed_loop(
    endpoint: &Endpoint,
    target: Target,
    inflight: u64,
    phase: Duration,
) -> Result<Closed> {
    let (mut socket, channel) = connect(endpoint, target).await?;
    let warmup = Duration::from_millis(300);
    let mut next = 0u64;
    for _ in 0..inflight {
        socket.send_text(invoke(target, &channel, next)).await?;
        next += 1;
    }
    let started = Instant::now();
    let mut measuring: Option<Instant> = None;
    let mut done = 0u64;
    let mut errors = 0u64;
    loop {
        let Some(text) = socket.recv_text(Duration::from_secs(10)).await? else {
            bail!("{target:?} closed the socket");
        };
        let Some((_, failed)) = reply_number(target, &text) else { continue };
        let now = Instant::now();
        match measuring {
            None if now - started >= warmup => measuring = Some(now),
            Some(since) => {
                done += 1;
                errors += u64::from(failed);
                if now - since >= phase {
                    let per_second = done as f64 / (now - since).as_secs_f64();
                    let _ = socket.socket.close(None).await;
                    return Ok(Closed { per_second, errors });
                }
            }
            None => {}
        }
        socket.send_text(invoke(target, &channel, next)).await?;
        next += 1;
    }
}

struct Open {
    p50_us: u64,
    p99_us: u64,
    errors: u64,
}

/// Requests sent on a fixed schedule of `rate` per second for `phase`; latency of each from its
/// scheduled send time to its reply.
async fn open_loop(
    endpoint: &Endpoint,
    target: Target,
    rate: f64,
    phase: Duration,
) -> Result<Open> {
    let (socket, channel) = connect(endpoint, target).await?;
    let (mut sink, mut stream) = socket.socket.split();
    let total = (rate * phase.as_secs_f64()).max(1.0) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now() + Duration::from_millis(20);
    let writer = tokio::spawn(async move {
        let mut n = 0u64;
        while n < total {
            let due = start + interval.mul_f64(n as f64);
            let now = Instant::now();
            if due > now {
                tokio::time::sleep(due - now).await;
            }
            // Send everything that is due (the timer is coarser than the interval).
            let now = Instant::now();
            while n < total && start + interval.mul_f64(n as f64) <= now {
                if sink.feed(Message::Text(invoke(target, &channel, n).into())).await.is_err() {
                    return sink;
                }
                n += 1;
            }
            if sink.flush().await.is_err() {
                return sink;
            }
        }
        sink
    });
    let mut latencies = Vec::with_capacity(total as usize);
    let mut errors = 0u64;
    while (latencies.len() as u64) < total {
        let next = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
        let text = match next {
            Ok(Some(Ok(Message::Text(text)))) => text,
            Ok(Some(Ok(_))) => continue,
            Ok(_) => bail!("{target:?} closed the socket"),
            Err(_) => bail!("{target:?}: no reply within 10 s ({} of {total})", latencies.len()),
        };
        let Some((n, failed)) = reply_number(target, text.as_str()) else { continue };
        let due = start + interval.mul_f64(n as f64);
        latencies.push(Instant::now().saturating_duration_since(due).as_micros() as u64);
        errors += u64::from(failed);
    }
    let mut sink = writer.await?;
    let _ = sink.close().await;
    latencies.sort_unstable();
    Ok(Open { p50_us: quantile(&latencies, 0.5), p99_us: quantile(&latencies, 0.99), errors })
}
