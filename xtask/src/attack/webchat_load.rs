//! Round two on im.webchat's caps and quotas (issue 23): F6 (one address holds every stream),
//! F12 (joins grow an unindexed session table), F13 (a few rooms use up everybody's daily
//! files), F14 (concurrent uploads race the quota check) and X1 (visitor files cached by the
//! browser). Each scenario runs against its own freshly started Connector, so the quotas and the
//! per-address counts of one never decide another. The attacker's own address is another
//! loopback address (`127.0.0.2`, ...), which Linux routes to the listener on 127.0.0.1.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[allow(unused_imports)]
use super::*;

/// The caps-and-quotas scenarios, in the order.
pub(super) async fn run(bin: &Path, sizes: &Sizes) -> Result<Vec<Outcome>> {
    let (f6, x1) = f6_and_x1(bin, sizes).await?;
    let f12 = f12(bin, sizes).await?;
    let f13 = f13(bin).await?;
    let f14 = f14(bin, sizes).await?;
    Ok(vec![f6, f12, f13, f14, x1])
}

/// The attacker's addresses: `127.<a>.<b>.<c>` for a scenario-chosen `a` and a counter.
fn loopback(a: u8, n: usize) -> IpAddr {
    let n = n + 1;
    IpAddr::V4(Ipv4Addr::new(127, a, ((n >> 8) & 0xff) as u8, (n & 0xff) as u8))
}

/// An HTTP client whose connections come from `address`.
fn client_from(address: IpAddr) -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .local_address(address)
        .timeout(Duration::from_secs(30))
        .build()?)
}

/// Joins `room` with the right code: the status and the token on success (429 and others are
/// answers here, not errors).
async fn try_join(
    http: &reqwest::Client,
    target: &Target,
    room: &str,
    code: &str,
) -> Result<(u16, Option<String>)> {
    let response = http
        .post(target.url(&format!("/chat/api/rooms/{room}/join")))
        .json(&json!({"access_code": code}))
        .send()
        .await?;
    let status = response.status().as_u16();
    if status != 200 {
        return Ok((status, None));
    }
    let body: Value = response.json().await?;
    Ok((status, body["token"].as_str().map(str::to_owned)))
}

/// Opens an event stream from `local` on a raw socket and reads only the status line; the
/// socket is returned so the stream stays open.
async fn stream_from(
    local: IpAddr,
    addr: &str,
    room: &str,
    token: &str,
) -> Result<(TcpStream, u16)> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(local, 0))?;
    let mut stream = socket.connect(addr.parse()?).await?;
    let request = format!(
        "GET /chat/api/rooms/{room}/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut head = [0u8; 12];
    let status =
        match tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut head)).await {
            Ok(Ok(_)) => String::from_utf8_lossy(&head[9..12]).parse().unwrap_or(0),
            _ => 0,
        };
    Ok((stream, status))
}

/// Joins up to `joins` sessions of `room` from `local` and opens every stream each may hold
/// (four a session); returns the open sockets and how many joins and streams were refused.
async fn hold_streams(
    target: &Target,
    local: IpAddr,
    room: &str,
    code: &str,
    joins: usize,
) -> Result<(Vec<TcpStream>, usize, usize)> {
    let http = client_from(local)?;
    let (mut held, mut joins_refused, mut streams_refused) = (Vec::new(), 0, 0);
    for _ in 0..joins {
        let (_, token) = try_join(&http, target, room, code).await?;
        let Some(token) = token else {
            joins_refused += 1;
            continue;
        };
        for _ in 0..4 {
            let (socket, status) = stream_from(local, &target.addr, room, &token).await?;
            if status == 200 {
                held.push(socket);
            } else {
                streams_refused += 1;
            }
        }
    }
    Ok((held, joins_refused, streams_refused))
}

/// F6: one address joins a room 16 times and holds all 64 of its streams (the full run: eight
/// rooms and all 512 of the Connector); then a visitor from another address wants a stream.
/// X1 (same Connector): a visitor's file is served with `Cache-Control: no-store`.
async fn f6_and_x1(bin: &Path, sizes: &Sizes) -> Result<(Outcome, Outcome)> {
    let mut target = start(bin).await?;
    let plane = xagent(&target).await?;
    let rooms = if sizes.full { 8 } else { 1 };
    for n in 0..rooms {
        sign_in(&plane, None, &format!("f6-{n}"), "f6-code-12345").await?;
    }
    sign_in(&plane, None, "f6-victim", "f6-victim-code-1").await?;
    let attacker = loopback(0, 1);
    let mut held = Vec::new();
    let (mut joins_refused, mut streams_refused) = (0, 0);
    let mut first_room = 0;
    for n in 0..rooms {
        let (sockets, j, s) =
            hold_streams(&target, attacker, &format!("f6-{n}"), "f6-code-12345", 16).await?;
        if n == 0 {
            first_room = sockets.len();
        }
        held.extend(sockets);
        joins_refused += j;
        streams_refused += s;
    }
    // Visitors from 127.0.0.1: one in the attacked room, one in a room of its own.
    let http = reqwest::Client::new();
    let victim = join(&http, &target, "f6-0", "f6-code-12345").await?;
    let (_same, same_status) = stream_from(localhost(), &target.addr, "f6-0", &victim).await?;
    let other = join(&http, &target, "f6-victim", "f6-victim-code-1").await?;
    let (_own, own_status) = stream_from(localhost(), &target.addr, "f6-victim", &other).await?;
    let x1 = x1(&http, &target, &other).await?;
    let held_total = held.len();
    drop(held);
    plane.close().await;
    let _ = target.child.kill().await;
    let _ = std::fs::remove_dir_all(&target.dir);
    let defended = first_room < 64 && same_status == 200 && own_status == 200;
    let f6 = Outcome::new(
        "F6",
        "one address holds every event stream of a room (and of the Connector)",
        defended,
        format!(
            "one address with {rooms} room code(s) held {first_room} of the first room's 64 streams and {held_total} in all ({streams_refused} refused, {joins_refused} joins refused); another visitor's stream in that room answered {same_status}, in a room of its own {own_status}"
        ),
    )
    .with(json!({
        "rooms": rooms,
        "attacker_streams_first_room": first_room,
        "attacker_streams_total": held_total,
        "attacker_streams_refused": streams_refused,
        "attacker_joins_refused": joins_refused,
        "victim_same_room_status": same_status,
        "victim_own_room_status": own_status,
    }));
    Ok((f6, x1))
}

fn localhost() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

/// X1: a visitor's file must not be kept in the browser's cache after the session ends.
async fn x1(http: &reqwest::Client, target: &Target, token: &str) -> Result<Outcome> {
    let response = http
        .post(target.url("/chat/api/rooms/f6-victim/uploads"))
        .bearer_auth(token)
        .multipart(form("private.txt", "text/plain", b"only for this session".to_vec(), None)?)
        .send()
        .await?;
    let entry: Value = response.json().await?;
    let file_ref = entry["files"][0]["file_ref"].as_str().unwrap_or_default().to_owned();
    let served = http
        .get(target.url(&format!("/chat/api/rooms/f6-victim/files/{file_ref}")))
        .bearer_auth(token)
        .send()
        .await?;
    let header = |name: &str| {
        served.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
    };
    let cache = header("cache-control");
    let defended = served.status().as_u16() == 200
        && cache == "no-store"
        && header("x-content-type-options") == "nosniff"
        && header("content-disposition").starts_with("attachment")
        && header("content-security-policy").contains("sandbox");
    Ok(Outcome::new(
        "X1",
        "visitor files are kept in the browser's cache",
        defended,
        format!("a visitor's file was served with Cache-Control {cache:?}"),
    )
    .with(json!({"cache_control": cache})))
}

/// Joins `room` again and again from addresses `127.<a>.x.y`, moving to the next address
/// whenever one is refused (429), until `done` says so; returns (accepted, refused, addresses).
async fn join_loop(
    url: String,
    code: &'static str,
    a: u8,
    accepted: Arc<AtomicUsize>,
    done: impl Fn(usize) -> bool,
) -> Result<(usize, usize, usize)> {
    let (mut ok, mut refused, mut address) = (0, 0, 0);
    let mut http = client_from(loopback(a, address))?;
    while !done(accepted.load(Ordering::SeqCst)) {
        let response = http.post(&url).json(&json!({"access_code": code})).send().await?;
        match response.status().as_u16() {
            200 => {
                let _ = response.bytes().await;
                ok += 1;
                accepted.fetch_add(1, Ordering::SeqCst);
            }
            429 => {
                refused += 1;
                address += 1;
                http = client_from(loopback(a, address))?;
            }
            other => bail!("a join answered {other}"),
        }
    }
    Ok((ok, refused, address + 1))
}

/// What a quiet moment of the Connector looks like with the sessions it has: the median time
/// of 30 joins one after the other, and of 20 sends of another visitor while one joiner keeps
/// joining (a join that holds the database long makes the send wait).
async fn f12_probe(target: &Target, other: &str, a: u8) -> Result<(f64, f64)> {
    let http = client_from(loopback(a, 0))?;
    let mut joins = Vec::new();
    for _ in 0..30 {
        let started = Instant::now();
        let (status, _) = try_join(&http, target, "f12", "f12-code-12345").await?;
        if status == 200 {
            joins.push(started.elapsed().as_secs_f64() * 1_000.0);
        }
    }
    let stop = flag();
    let joiner = {
        let stop = Arc::clone(&stop);
        tokio::spawn(join_loop(
            target.url("/chat/api/rooms/f12/join"),
            "f12-code-12345",
            a + 1,
            Arc::new(AtomicUsize::new(0)),
            move |_| stop.load(Ordering::SeqCst),
        ))
    };
    let sends = send_latencies(&reqwest::Client::new(), target, other, 20, &format!("p{a}")).await;
    stop.store(true, Ordering::SeqCst);
    joiner.await??;
    Ok((median(&joins), median(&sends?)))
}

/// F12: (a) one address joins as fast as it can; (b) the cost of a join and another visitor's
/// send with few sessions, then again after `sessions` joins from rotating addresses.
async fn f12(bin: &Path, sizes: &Sizes) -> Result<Outcome> {
    let mut target = start(bin).await?;
    let plane = xagent(&target).await?;
    sign_in(&plane, None, "f12", "f12-code-12345").await?;
    sign_in(&plane, None, "f12-other", "f12-other-code-1").await?;
    let sessions = if sizes.full { 10_000 } else { 2_000 };
    let single_attempts = 200;

    // (a) One address.
    let single = client_from(loopback(1, 0))?;
    let (mut single_ok, mut single_refused) = (0, 0);
    for _ in 0..single_attempts {
        match try_join(&single, &target, "f12", "f12-code-12345").await?.0 {
            200 => single_ok += 1,
            429 => single_refused += 1,
            other => bail!("a join answered {other}"),
        }
    }

    // (b) Before and after the flood.
    let http = reqwest::Client::new();
    let other = join(&http, &target, "f12-other", "f12-other-code-1").await?;
    let (join_before, send_before) = f12_probe(&target, &other, 2).await?;
    let started = Instant::now();
    let accepted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for worker in 0..8u8 {
        tasks.push(tokio::spawn(join_loop(
            target.url("/chat/api/rooms/f12/join"),
            "f12-code-12345",
            10 + worker,
            Arc::clone(&accepted),
            move |n| n >= sessions,
        )));
    }
    let (mut flood_refused, mut addresses) = (0, 0);
    for task in tasks {
        let (_, refused, used) = task.await??;
        flood_refused += refused;
        addresses += used;
    }
    let seconds = started.elapsed().as_secs_f64();
    let flood_rate = accepted.load(Ordering::SeqCst) as f64 / seconds;
    let (join_after, send_after) = f12_probe(&target, &other, 4).await?;
    plane.close().await;
    let _ = target.child.kill().await;
    let _ = std::fs::remove_dir_all(&target.dir);

    let single_limited = single_ok < single_attempts;
    // Only gross growth counts (a shared, loaded machine moves these medians by a few ms):
    // three times the cost plus 10 ms. The per-address limit in (a) is the sharp check.
    let join_kept = join_after <= 3.0 * join_before + 10.0;
    let send_kept = send_after <= 3.0 * send_before + 10.0;
    let defended = single_limited && join_kept && send_kept;
    Ok(Outcome::new(
        "F12",
        "joins grow the session table without bound and slow every visitor down",
        defended,
        format!(
            "one address: {single_ok} of {single_attempts} joins accepted; {sessions} joins from {addresses} addresses ({flood_rate:.0}/s); a join took {join_before:.1} ms before and {join_after:.1} ms after them, another visitor's send (one joiner running) {send_before:.1} ms and {send_after:.1} ms"
        ),
    )
    .with(json!({
        "single_address_attempts": single_attempts,
        "single_address_accepted": single_ok,
        "single_address_refused": single_refused,
        "sessions": sessions,
        "addresses": addresses,
        "joins_refused": flood_refused,
        "flood_seconds": seconds,
        "flood_joins_per_s": flood_rate,
        "join_ms_before": join_before,
        "join_ms_after": join_after,
        "send_ms_before": send_before,
        "send_ms_after": send_after,
    })))
}

/// A stop flag shared with background tasks.
fn flag() -> Arc<std::sync::atomic::AtomicBool> {
    Arc::new(std::sync::atomic::AtomicBool::new(false))
}

/// `count` sends of one visitor, one after the other: their latencies in ms.
async fn send_latencies(
    http: &reqwest::Client,
    target: &Target,
    token: &str,
    count: usize,
    tag: &str,
) -> Result<Vec<f64>> {
    let mut latencies = Vec::new();
    for n in 0..count {
        let sent = Instant::now();
        let response = http
            .post(target.url("/chat/api/rooms/f12-other/messages"))
            .bearer_auth(token)
            .json(&json!({"text": format!("{tag} {n}"), "client_id": format!("{tag}-{n}")}))
            .send()
            .await?;
        if response.status().is_success() {
            latencies.push(sent.elapsed().as_secs_f64() * 1_000.0);
        }
    }
    Ok(latencies)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// Uploads tiny files to `room` with `workers` at once until the room answers 507; returns
/// how many were stored.
async fn upload_until_full(
    http: &reqwest::Client,
    target: &Target,
    room: &str,
    token: &str,
    bytes: usize,
    workers: usize,
) -> Result<usize> {
    let stored = Arc::new(AtomicUsize::new(0));
    let full = flag();
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let (http, url, token) = (
            http.clone(),
            target.url(&format!("/chat/api/rooms/{room}/uploads")),
            token.to_owned(),
        );
        let (stored, full) = (Arc::clone(&stored), Arc::clone(&full));
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while !full.load(Ordering::SeqCst) {
                n += 1;
                let body = form(
                    &format!("{worker}-{n}.bin"),
                    "application/octet-stream",
                    vec![1; bytes],
                    None,
                )?;
                let status =
                    http.post(&url).bearer_auth(&token).multipart(body).send().await?.status();
                match status.as_u16() {
                    200 => {
                        stored.fetch_add(1, Ordering::SeqCst);
                    }
                    507 => full.store(true, Ordering::SeqCst),
                    other => bail!("an upload answered {other}"),
                }
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(stored.load(Ordering::SeqCst))
}

/// F13: someone with four rooms' codes uploads until each room refuses; then a visitor of a
/// fifth room uploads one file.
async fn f13(bin: &Path) -> Result<Outcome> {
    let mut target = start(bin).await?;
    let plane = xagent(&target).await?;
    let http = reqwest::Client::new();
    let mut per_room = Vec::new();
    for room in ["f13-a", "f13-b", "f13-c", "f13-d"] {
        sign_in(&plane, None, room, "f13-code-12345").await?;
        let token = join(&http, &target, room, "f13-code-12345").await?;
        per_room.push(upload_until_full(&http, &target, room, &token, 16, 8).await?);
    }
    sign_in(&plane, None, "f13-victim", "f13-victim-code").await?;
    let token = join(&http, &target, "f13-victim", "f13-victim-code").await?;
    let victim = http
        .post(target.url("/chat/api/rooms/f13-victim/uploads"))
        .bearer_auth(&token)
        .multipart(form("mine.txt", "text/plain", b"hello".to_vec(), None)?)
        .send()
        .await?
        .status()
        .as_u16();
    plane.close().await;
    let _ = target.child.kill().await;
    let _ = std::fs::remove_dir_all(&target.dir);
    let total: usize = per_room.iter().sum();
    Ok(Outcome::new(
        "F13",
        "four rooms use up the daily files of every visitor",
        victim == 200,
        format!(
            "four rooms took {total} files ({per_room:?}); a fifth room's upload then answered {victim}"
        ),
    )
    .with(json!({"files_per_room": per_room, "files_total": total, "victim_status": victim})))
}

/// An upload of `size` bytes whose first half goes now and the rest only when `go` is set, so
/// that several uploads are past the quota check together.
async fn held_upload(
    http: reqwest::Client,
    url: String,
    token: String,
    name: String,
    size: usize,
    go: tokio::sync::watch::Receiver<bool>,
) -> u16 {
    let (first, rest) = (vec![5u8; size / 2], vec![6u8; size - size / 2]);
    let body = futures_util::stream::unfold((0, go, Some(first), Some(rest)), |state| async move {
        let (step, mut go, first, rest) = state;
        match step {
            0 => first.map(|bytes| (Ok::<_, std::io::Error>(bytes), (1, go, None, rest))),
            1 => {
                let _ = go.wait_for(|ready| *ready).await;
                rest.map(|bytes| (Ok(bytes), (2, go, None, None)))
            }
            _ => None,
        }
    });
    let part = reqwest::multipart::Part::stream(reqwest::Body::wrap_stream(body)).file_name(name);
    let Ok(part) = part.mime_str("application/octet-stream") else { return 0 };
    let form = reqwest::multipart::Form::new().part("file", part);
    match http.post(url).bearer_auth(token).multipart(form).send().await {
        Ok(response) => response.status().as_u16(),
        // The Connector answered early (507) and closed: refused.
        Err(_) => 0,
    }
}

/// Uploads `count` files of `bytes` to `room`, one after the other; fails on any refusal.
async fn fill(
    http: &reqwest::Client,
    target: &Target,
    room: &str,
    token: &str,
    count: usize,
    bytes: usize,
) -> Result<()> {
    for n in 0..count {
        let body =
            form(&format!("fill-{n}.bin"), "application/octet-stream", vec![2; bytes], None)?;
        let status = http
            .post(target.url(&format!("/chat/api/rooms/{room}/uploads")))
            .bearer_auth(token)
            .multipart(body)
            .send()
            .await?
            .status();
        if !status.is_success() {
            bail!("filling {room}: upload {n} answered {status}");
        }
    }
    Ok(())
}

/// Four uploads held past the quota check together (four: the Connector's default of uploads
/// written at once), then let go: how many were stored.
async fn race(
    http: &reqwest::Client,
    target: &Target,
    room: &str,
    token: &str,
    size: usize,
) -> Result<(usize, Vec<u16>)> {
    let (go, ready) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for n in 0..4 {
        tasks.push(tokio::spawn(held_upload(
            http.clone(),
            target.url(&format!("/chat/api/rooms/{room}/uploads")),
            token.to_owned(),
            format!("race-{n}.bin"),
            size,
            ready.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    go.send_replace(true);
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await?);
    }
    Ok((statuses.iter().filter(|s| **s == 200).count(), statuses))
}

/// F14: concurrent uploads race the quota check. A probe room finds the room's daily file limit
/// (uploads until 507); a second room is filled to one below it and four uploads then pass the
/// check together. The full run does the same with bytes (24 MiB and 1 MiB files).
async fn f14(bin: &Path, sizes: &Sizes) -> Result<Outcome> {
    let mut target = start(bin).await?;
    let plane = xagent(&target).await?;
    let http = reqwest::Client::new();
    for room in ["f14-probe", "f14-race", "f14-bprobe", "f14-brace"] {
        sign_in(&plane, None, room, "f14-code-12345").await?;
    }
    let token = |room: &'static str| {
        let http = http.clone();
        let target = &target;
        async move { join(&http, target, room, "f14-code-12345").await }
    };
    // Files.
    let probe = token("f14-probe").await?;
    let file_limit = upload_until_full(&http, &target, "f14-probe", &probe, 16, 1).await?;
    let racer = token("f14-race").await?;
    fill(&http, &target, "f14-race", &racer, file_limit.saturating_sub(1), 16).await?;
    let (raced, file_statuses) = race(&http, &target, "f14-race", &racer, 256 * 1024).await?;
    let files_used = file_limit.saturating_sub(1) + raced;
    let mut figures = json!({
        "file_limit": file_limit,
        "files_used": files_used,
        "race_statuses": file_statuses,
    });
    let mut detail = format!(
        "a room's file limit is {file_limit}; four uploads at {} of them left the room at {files_used} of {file_limit}",
        file_limit.saturating_sub(1)
    );
    let mut defended = files_used <= file_limit;
    if sizes.full {
        const MIB: usize = 1024 * 1024;
        let probe = token("f14-bprobe").await?;
        let big = upload_until_full(&http, &target, "f14-bprobe", &probe, 24 * MIB, 1).await?;
        let small = upload_until_full(&http, &target, "f14-bprobe", &probe, MIB, 1).await?;
        let byte_limit = big * 24 + small; // MiB, within one
        let racer = token("f14-brace").await?;
        fill(&http, &target, "f14-brace", &racer, big, 24 * MIB).await?;
        fill(&http, &target, "f14-brace", &racer, small.saturating_sub(1), MIB).await?;
        let (raced, byte_statuses) = race(&http, &target, "f14-brace", &racer, MIB).await?;
        let bytes_used = big * 24 + small.saturating_sub(1) + raced;
        defended &= bytes_used <= byte_limit;
        detail.push_str(&format!(
            "; bytes: {bytes_used} MiB of the {byte_limit} MiB a room could take one by one"
        ));
        figures["byte_limit_mib"] = json!(byte_limit);
        figures["bytes_used_mib"] = json!(bytes_used);
        figures["byte_race_statuses"] = json!(byte_statuses);
    }
    plane.close().await;
    let _ = target.child.kill().await;
    let _ = std::fs::remove_dir_all(&target.dir);
    Ok(Outcome::new("F14", "concurrent uploads pass the room's quota", defended, detail)
        .with(figures))
}
