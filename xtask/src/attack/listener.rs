//! Round two, the shared listener (issue 23 F1): one address holding more connections than the
//! listener's global cap must not shut everyone else out.

#[allow(unused_imports)]
use super::*;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The address the attacker connects from (all of 127/8 is loopback on Linux).
const ATTACKER: [u8; 4] = [127, 0, 0, 2];

/// The listener's scenarios.
pub(super) async fn run(bin: &Path, sizes: &Sizes) -> Result<Vec<Outcome>> {
    let mut target = start(bin).await?;
    let outcome = f1(&target, sizes).await;
    let _ = target.child.kill().await;
    let _ = std::fs::remove_dir_all(&target.dir);
    Ok(vec![outcome?])
}

/// F1: one address holds about 1,100 half-sent or idle connections and re-opens each one as
/// the server closes it, while probes from another address fetch the chat page and do a
/// `/ws` hello on fresh connections.
async fn f1(target: &Target, sizes: &Sizes) -> Result<Outcome> {
    let held_target = 1_100usize;
    let window = Duration::from_secs(if sizes.full { 40 } else { 10 });
    let probe_every = Duration::from_millis(if sizes.full { 500 } else { 250 });
    let addr: SocketAddr = target.addr.parse().context("the target's address")?;
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(AtomicU64::new(0));
    let opened = Arc::new(AtomicU64::new(0));
    let mut holders = Vec::new();
    for n in 0..held_target {
        let (stop, held, opened) = (Arc::clone(&stop), Arc::clone(&held), Arc::clone(&opened));
        holders.push(tokio::spawn(async move {
            hold(addr, n % 2 == 0, &stop, &held, &opened).await;
        }));
    }
    // Let the flood take its places first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held_at_start = held.load(Ordering::Relaxed);
    let page_url = target.url("/chat/");
    // A fresh connection per probe: a pooled one would slip past the accept loop.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()?;
    let (mut page_ok, mut ws_ok, mut probes) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    while started.elapsed() < window {
        let tick = Instant::now();
        probes += 1;
        let page = http.get(&page_url).send().await.map(|r| r.status().as_u16());
        if matches!(page, Ok(200)) {
            page_ok += 1;
        }
        if hello_probe(target).await.is_ok() {
            ws_ok += 1;
        }
        if let Some(rest) = probe_every.checked_sub(tick.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }
    let held_at_end = held.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for holder in holders {
        holder.abort();
    }
    let rate = |ok: u64| if probes == 0 { 0.0 } else { 100.0 * ok as f64 / probes as f64 };
    let (page_rate, ws_rate) = (rate(page_ok), rate(ws_ok));
    let seconds = started.elapsed().as_secs_f64();
    let defended = probes > 0 && page_rate >= 99.0 && ws_rate >= 99.0;
    Ok(Outcome::new(
        "F1",
        "one address holds the listener's connections",
        defended,
        format!(
            "127.0.0.2 tried to hold {held_target} connections ({held_at_start} held at the start, {held_at_end} at the end, as the attacker counts them; {} opened in all); from 127.0.0.1 the chat page answered {page_ok} of {probes} probes ({page_rate:.0} %), the /ws hello {ws_ok} of {probes} ({ws_rate:.0} %) over {seconds:.0} s",
            opened.load(Ordering::Relaxed)
        ),
    )
    .with(json!({
        "attacker_connections_tried": held_target,
        "attacker_connections_open_at_start": held_at_start,
        "attacker_connections_open_at_end": held_at_end,
        "attacker_connections_opened": opened.load(Ordering::Relaxed),
        "probes": probes,
        "page_answered": page_ok,
        "ws_hello_answered": ws_ok,
        "page_answer_rate_percent": page_rate,
        "ws_hello_answer_rate_percent": ws_rate,
        "seconds": seconds,
    })))
}

/// One attacking connection, re-opened each time the server closes it: half a request header
/// (`half_sent`) or nothing at all, then silence until the server hangs up.
async fn hold(
    addr: SocketAddr,
    half_sent: bool,
    stop: &AtomicBool,
    held: &AtomicU64,
    opened: &AtomicU64,
) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut socket) = connect_from(ATTACKER, addr).await else {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        if half_sent && socket.write_all(b"GET /chat/ HTTP/1.1\r\nHost: x\r\n").await.is_err() {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        let since = Instant::now();
        held.fetch_add(1, Ordering::Relaxed);
        let mut buf = [0u8; 256];
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        held.fetch_sub(1, Ordering::Relaxed);
        // Re-open at once after a timeout; after a refusal, a short pause (a bound on the
        // harness's own work, not a courtesy the listener relies on).
        if since.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// A TCP connection to `addr` from the loopback address `source`.
async fn connect_from(source: [u8; 4], addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    tokio::time::timeout(Duration::from_secs(5), socket.connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))?
}

/// A fresh data-plane WebSocket with the API key: `connector.hello` answered within 5 s.
async fn hello_probe(target: &Target) -> Result<()> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut socket = target.socket().await?;
        let hello = xagent_protocol_types::Packet::with_payload(
            xagent_protocol_types::PacketId::new("pkt_f1_hello"),
            xagent_protocol_types::ConnectorHello::new(CARD_ID, vec![PROFILE_IM_V2.into()]),
        )
        .request_id(xagent_protocol_types::RequestId::new("req_f1_hello"));
        socket.send(Message::Text(hello.to_json()?.into())).await?;
        while let Some(message) = socket.next().await {
            if let Message::Text(text) = message?
                && text.contains("connector.hello.ack")
            {
                let _ = socket.close(None).await;
                return Ok(());
            }
        }
        bail!("the socket closed before connector.hello.ack")
    })
    .await
    .map_err(|_| anyhow!("no connector.hello.ack within 5 s"))?
}
