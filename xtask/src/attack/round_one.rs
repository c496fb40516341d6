//! Round one: the findings of the first attack run on im.webchat (issue 14), H1 to I5.

#[allow(unused_imports)]
use super::*;

/// Round one (issue 14): every finding of the first im.webchat attack run.
pub(super) async fn run(bin: &Path, sizes: &Sizes) -> Result<Vec<Outcome>> {
    let mut outcomes = vec![m5(bin, sizes).await?];
    let target = start(bin).await?;
    let plane = xagent(&target).await?;
    let http = reqwest::Client::new();
    sign_in(&plane, None, "attack", "attack-code-1234").await?;
    let token = join(&http, &target, "attack", "attack-code-1234").await?;
    outcomes.push(h1(&http, &target, &token).await?);
    outcomes.push(h3(&http, &target, &token).await?);
    outcomes.push(h4(&http, &target, &plane).await?);
    outcomes.push(h5(&http, &target, &plane, sizes).await?);
    outcomes.push(m1(&target).await?);
    outcomes.push(m2(&http, &target, &plane, sizes).await?);
    outcomes.push(m6(&target));
    outcomes.push(m8(&http, &target).await?);
    outcomes.push(l1(&target));
    outcomes.push(l5(&http, &target, &token).await?);
    outcomes.push(l6(&http, &target).await?);
    outcomes.push(i1(&target).await?);
    outcomes.push(m9(&plane).await?);
    outcomes.push(m7(&target, sizes).await?);
    if sizes.full {
        outcomes.push(l3(&target).await?);
    }
    // Last: the guessing locks this address out of every room for a while.
    outcomes.push(h2(&http, &target, &plane, sizes).await?);
    tokio::time::sleep(Duration::from_secs(1)).await;
    outcomes.push(l2(&target));
    plane.close().await;
    let mut target = target;
    let _ = target.child.kill().await;
    let _ = std::fs::remove_dir_all(&target.dir);
    Ok(outcomes)
}

/// Report order: as the issue lists the findings.
pub(super) fn order(id: &str) -> usize {
    IDS.iter().position(|known| *known == id).unwrap_or(IDS.len())
}

/// How many findings round one has.
pub(super) const ROUND_ONE_LEN: usize = IDS.len();

/// Round one's finding ids, in the order issue 14 lists them.
const IDS: [&str; 22] = [
    "H1", "H2", "H3", "H4", "H5", "M1", "M2", "M3", "M4", "M5", "M6", "M7", "M8", "M9", "L1", "L2",
    "L3", "L4", "L5", "L6", "I1", "I5",
];

/// M5: pending visitor messages after a restart drain at once, not on the 30 s maintenance tick.
async fn m5(bin: &Path, sizes: &Sizes) -> Result<Outcome> {
    let mut target = start(bin).await?;
    let plane = xagent(&target).await?;
    let http = reqwest::Client::new();
    let channel = sign_in(&plane, None, "drain", "drain-code-1234").await?;
    let token = join(&http, &target, "drain", "drain-code-1234").await?;
    plane.close().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in 0..sizes.drain_messages {
        let response = http
            .post(target.url("/chat/api/rooms/drain/messages"))
            .bearer_auth(&token)
            .json(&json!({"text": format!("pending {n}"), "client_id": format!("d{n}")}))
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("queueing message {n} answered {}", response.status());
        }
    }
    let addr = target.addr.clone();
    let dir = target.dir.clone();
    target.terminate().await?;
    let mut target = start_in(bin, dir, &addr).await?;
    let base = BaseUrl::parse(&target.url("")).map_err(|e| anyhow!("{e}"))?;
    let config = ClientConfig::new(base, CARD_ID, vec![PROFILE_IM_V2.into()])
        .with_api_key(Secret::new(API_KEY));
    let (plane, mut events) = DataPlane::connect(config).await?;
    tokio::time::timeout(Duration::from_secs(15), plane.connected())
        .await
        .context("xAgent could not reconnect")?
        .map_err(|e| anyhow!("{e}"))?;
    let started = Instant::now();
    plane.open_channel(Some(&channel)).await.map_err(|e| anyhow!("{e}"))?;
    plane.remember_channel(channel.clone()).await;
    let mut seen = std::collections::HashSet::new();
    let limit = Duration::from_secs(120);
    while seen.len() < sizes.drain_messages && started.elapsed() < limit {
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Some(xagent_client_runtime::ClientEvent::ChatMessage(inbound))) => {
                seen.insert(inbound.message.message_id.to_string());
                inbound.accept();
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    plane.close().await;
    let _ = target.terminate().await;
    let _ = std::fs::remove_dir_all(&target.dir);
    let all = seen.len() == sizes.drain_messages;
    Ok(Outcome::new(
        "M5",
        "pending messages after a restart wait for the maintenance tick",
        all && seconds < 25.0,
        format!(
            "{} of {} pending messages delivered {seconds:.1} s after xAgent reopened its channel",
            seen.len(),
            sizes.drain_messages
        ),
    )
    .with(json!({"messages": sizes.drain_messages, "delivered": seen.len(), "seconds": seconds})))
}

/// H1: an SVG declared `image/svg+xml;charset=utf-8` must not be served inline.
async fn h1(http: &reqwest::Client, target: &Target, token: &str) -> Result<Outcome> {
    let svg =
        br#"<svg xmlns="http://www.w3.org/2000/svg"><script>alert(document.domain)</script></svg>"#
            .to_vec();
    let response = http
        .post(target.url("/chat/api/rooms/attack/uploads"))
        .bearer_auth(token)
        .multipart(form("x.svg", "image/svg+xml;charset=utf-8", svg, None)?)
        .send()
        .await?;
    let entry: Value = response.json().await?;
    let file_ref = entry["files"][0]["file_ref"].as_str().unwrap_or_default().to_owned();
    let served = http
        .get(target.url(&format!("/chat/api/rooms/attack/files/{file_ref}")))
        .bearer_auth(token)
        .send()
        .await?;
    let header = |name: &str| {
        served.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
    };
    let (kind, disposition, csp) =
        (header("content-type"), header("content-disposition"), header("content-security-policy"));
    let defended = !kind.to_ascii_lowercase().contains("svg")
        && disposition.starts_with("attachment")
        && csp.contains("sandbox")
        && header("x-content-type-options") == "nosniff";
    Ok(Outcome::new(
        "H1",
        "stored XSS through an SVG upload",
        defended,
        format!("served as {kind:?}, {disposition:?}, CSP {csp:?}"),
    ))
}

/// H2: guess a room's access code as fast as possible.
async fn h2(
    http: &reqwest::Client,
    target: &Target,
    plane: &DataPlane,
    sizes: &Sizes,
) -> Result<Outcome> {
    sign_in(plane, None, "attack-h2", "h2-real-code-9876").await?;
    let started = Instant::now();
    let window = Duration::from_secs_f64(sizes.guess_seconds);
    let mut workers = Vec::new();
    for worker in 0..4 {
        let http = http.clone();
        let url = target.url("/chat/api/rooms/attack-h2/join");
        workers.push(tokio::spawn(async move {
            let (mut wrong, mut throttled, mut other) = (0u64, 0u64, 0u64);
            let mut n = 0u64;
            while started.elapsed() < window {
                n += 1;
                let guess = format!("{worker}-{n:04}");
                match http
                    .post(&url)
                    .json(&json!({"access_code": guess}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                {
                    Ok(403) => wrong += 1,
                    Ok(429) => throttled += 1,
                    _ => other += 1,
                }
            }
            (wrong, throttled, other)
        }));
    }
    let (mut wrong, mut throttled, mut other) = (0, 0, 0);
    for worker in workers {
        let (w, t, o) = worker.await?;
        wrong += w;
        throttled += t;
        other += o;
    }
    let seconds = started.elapsed().as_secs_f64();
    let rate = wrong as f64 / seconds;
    let defended = wrong <= 12 && other == 0;
    Ok(Outcome::new(
        "H2",
        "brute-forcing an access code",
        defended,
        format!("{wrong} codes checked in {seconds:.1} s ({rate:.1}/s), {throttled} requests refused with 429"),
    )
    .with(json!({"checked": wrong, "refused": throttled, "seconds": seconds, "guesses_per_second": rate})))
}

/// H3: an upload's text longer than the message limit.
async fn h3(http: &reqwest::Client, target: &Target, token: &str) -> Result<Outcome> {
    let text = "x".repeat(1_100_000);
    let response = http
        .post(target.url("/chat/api/rooms/attack/uploads"))
        .bearer_auth(token)
        .multipart(form("a.txt", "text/plain", b"a".to_vec(), Some(text))?)
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok(Outcome::new(
        "H3",
        "a 1.1 MB text through the upload route",
        status == 400 || status == 413,
        format!("answered {status}"),
    ))
}

/// H4: one channel signed in to two rooms.
async fn h4(http: &reqwest::Client, target: &Target, plane: &DataPlane) -> Result<Outcome> {
    let channel = sign_in(plane, None, "attack-h4-one", "h4-code-one-1").await?;
    sign_in(plane, Some(&channel), "attack-h4-two", "h4-code-two-2").await?;
    let token = join(http, target, "attack-h4-one", "h4-code-one-1").await?;
    let sent = http
        .post(target.url("/chat/api/rooms/attack-h4-one/messages"))
        .bearer_auth(&token)
        .json(&json!({"text": "who reads this?", "client_id": "h4"}))
        .send()
        .await?;
    let status = sent.status().as_u16();
    Ok(Outcome::new(
        "H4",
        "a channel signed in to a second room keeps the first",
        status == 409,
        format!("a visitor of the first room got {status} (409: no agent, the channel moved)"),
    ))
}

/// Opens an event stream on a raw socket and never reads past the status line.
async fn idle_stream(addr: &str, room: &str, token: &str) -> Result<(TcpStream, u16)> {
    let mut socket = TcpStream::connect(addr).await?;
    let request = format!(
        "GET /chat/api/rooms/{room}/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await?;
    let mut head = [0u8; 12];
    socket.read_exact(&mut head).await?;
    let status = String::from_utf8_lossy(&head[9..12]).parse().unwrap_or(0);
    Ok((socket, status))
}

/// H5: many event streams that never read, on a room with a long history.
async fn h5(
    http: &reqwest::Client,
    target: &Target,
    plane: &DataPlane,
    sizes: &Sizes,
) -> Result<Outcome> {
    sign_in(plane, None, "attack-h5", "h5-code-12345").await?;
    let token = join(http, target, "attack-h5", "h5-code-12345").await?;
    let text = "z".repeat(15_990);
    for n in 0..sizes.history_messages {
        let _ = http
            .post(target.url("/chat/api/rooms/attack-h5/messages"))
            .bearer_auth(&token)
            .json(&json!({"text": format!("{n} {text}"), "client_id": format!("h5-{n}")}))
            .send()
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = target.rss_mib();
    let mut held = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    let mut per_token_refused = false;
    let mut tokens = vec![token.clone()];
    for attempt in 0..sizes.stream_attempts {
        // Four streams per token: a new visitor session every four attempts, until the
        // Connector refuses a stream (a cap is reached: more sessions change nothing, and
        // joins per address are limited since issue 23).
        if attempt > 0 && attempt % 4 == 0 && refused == 0 {
            tokens.push(join(http, target, "attack-h5", "h5-code-12345").await?);
        }
        let token = tokens.last().cloned().unwrap_or_default();
        let (socket, status) = idle_stream(&target.addr, "attack-h5", &token).await?;
        if status == 200 {
            accepted += 1
        } else {
            refused += 1
        }
        held.push(socket);
    }
    // A fifth stream of one token.
    let (socket, status) = idle_stream(&target.addr, "attack-h5", &token).await?;
    if status == 429 {
        per_token_refused = true;
    }
    held.push(socket);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = target.rss_mib();
    drop(held);
    let growth = after - before;
    let defended = per_token_refused && growth < 96.0;
    Ok(Outcome::new(
        "H5",
        "memory exhaustion through non-reading event streams",
        defended,
        format!(
            "{accepted} streams open, {refused} refused; a 5th stream of one token {}; RSS {before:.0} -> {after:.0} MiB",
            if per_token_refused { "refused" } else { "ACCEPTED" }
        ),
    )
    .with(json!({"streams_open": accepted, "streams_refused": refused, "rss_before_mib": before, "rss_after_mib": after, "history_messages": sizes.history_messages})))
}

/// M1: a request header sent halfway, then silence.
async fn m1(target: &Target) -> Result<Outcome> {
    let mut socket = TcpStream::connect(&target.addr).await?;
    socket.write_all(b"GET /chat/ HTTP/1.1\r\nHost: x\r\n").await?;
    let started = Instant::now();
    let mut buf = [0u8; 512];
    let closed = tokio::time::timeout(Duration::from_secs(25), async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok();
    let waited = started.elapsed().as_secs_f64();
    Ok(Outcome::new(
        "M1",
        "a half-sent request header holds a connection",
        closed && waited < 20.0,
        if closed {
            format!("closed by the server after {waited:.1} s")
        } else {
            "still open after 25 s".into()
        },
    )
    .with(json!({"closed_after_seconds": waited})))
}

/// M2: concurrent page uploads held whole in memory.
async fn m2(
    http: &reqwest::Client,
    target: &Target,
    plane: &DataPlane,
    sizes: &Sizes,
) -> Result<Outcome> {
    // Two uploads a room: a room's daily share of the visitors' quota (F13, 5 % of 2 GiB by
    // default) is not what this scenario measures.
    let rooms: Vec<String> =
        (0..sizes.uploads.div_ceil(2)).map(|r| format!("attack-m2-{r}")).collect();
    for room in &rooms {
        sign_in(plane, None, room, "m2-code-12345").await?;
    }
    let mut uploads = Vec::new();
    let peak_before = target.peak_mib();
    let rss_before = target.rss_mib();
    for n in 0..sizes.uploads {
        let room = &rooms[n / 2];
        let token = join(http, target, room, "m2-code-12345").await?;
        let http = http.clone();
        let url = target.url(&format!("/chat/api/rooms/{room}/uploads"));
        let bytes = vec![n as u8; sizes.upload_mib * 1024 * 1024];
        uploads.push(tokio::spawn(async move {
            let form = form(&format!("f{n}.bin"), "application/octet-stream", bytes, None)?;
            let response = http.post(url).bearer_auth(token).multipart(form).send().await?;
            Ok::<u16, anyhow::Error>(response.status().as_u16())
        }));
    }
    let mut statuses = Vec::new();
    for upload in uploads {
        statuses.push(upload.await??);
    }
    let peak_after = target.peak_mib();
    let growth = peak_after - peak_before.max(rss_before);
    let total = (sizes.uploads * sizes.upload_mib) as f64;
    let defended = statuses.iter().all(|s| *s == 200) && growth < 64.0;
    Ok(Outcome::new(
        "M2",
        "page uploads held whole in memory",
        defended,
        format!("{} uploads of {} MiB ({total:.0} MiB): peak RSS grew by {growth:.0} MiB; statuses {statuses:?}", sizes.uploads, sizes.upload_mib),
    )
    .with(json!({"uploads": sizes.uploads, "upload_mib": sizes.upload_mib, "peak_growth_mib": growth})))
}

fn mode(path: &Path) -> u32 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).map_or(0, |m| m.permissions().mode() & 0o777)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        0o600
    }
}

/// M6: state readable by other local users.
fn m6(target: &Target) -> Outcome {
    let state = target.dir.join("state");
    let mut open = Vec::new();
    if mode(&state) & 0o077 != 0 {
        open.push(format!("state dir {:o}", mode(&state)));
    }
    for dir in [state.clone(), state.join("files")] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if mode(&path) & 0o077 != 0 {
                let name = path.strip_prefix(&state).unwrap_or(&path).display().to_string();
                open.push(format!("{name} {:o}", mode(&path)));
            }
        }
    }
    Outcome::new(
        "M6",
        "state (signing secret, messages) readable by other local users",
        open.is_empty(),
        if open.is_empty() {
            "state dir 0700, every file 0600".to_owned()
        } else {
            format!("readable by others: {}", open.join(", "))
        },
    )
}

/// M8: a visitor token that cannot be revoked.
async fn m8(http: &reqwest::Client, target: &Target) -> Result<Outcome> {
    let token = join(http, target, "attack", "attack-code-1234").await?;
    let left = http
        .delete(target.url("/chat/api/rooms/attack/session"))
        .bearer_auth(&token)
        .send()
        .await?;
    let after =
        http.get(target.url("/chat/api/rooms/attack/session")).bearer_auth(&token).send().await?;
    let joined = http
        .post(target.url("/chat/api/rooms/attack/join"))
        .json(&json!({"access_code": "attack-code-1234"}))
        .send()
        .await?;
    let body: Value = joined.json().await.unwrap_or(Value::Null);
    let has_expiry = body["expires_at"].as_u64().is_some();
    let defended = left.status().as_u16() == 204 && after.status().as_u16() == 403 && has_expiry;
    Ok(Outcome::new(
        "M8",
        "visitor tokens never expire and cannot be revoked",
        defended,
        format!(
            "leave {}, then the token gets {}; new tokens carry expires_at: {has_expiry}",
            left.status().as_u16(),
            after.status().as_u16()
        ),
    ))
}

/// L1: the API key in the process list.
fn l1(target: &Target) -> Outcome {
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", target.pid)).unwrap_or_default();
    let visible = String::from_utf8_lossy(&cmdline).contains(API_KEY);
    Outcome::new(
        "L1",
        "the API key visible in ps",
        !visible,
        if visible {
            "the key is on the command line".to_owned()
        } else {
            "started with --api-key-file; the key is not in the command line".to_owned()
        },
    )
}

/// L5: status codes of an oversized upload.
async fn l5(http: &reqwest::Client, target: &Target, token: &str) -> Result<Outcome> {
    let big = vec![7u8; 25 * 1024 * 1024 + 1];
    let response = http
        .post(target.url("/chat/api/rooms/attack/uploads"))
        .bearer_auth(token)
        .multipart(form("big.bin", "application/octet-stream", big, None)?)
        .send()
        .await?;
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let message = body["error"]["message"].as_str().unwrap_or("").to_owned();
    Ok(Outcome::new(
        "L5",
        "an oversized page upload gets a misleading status",
        status == 413 && message.contains("too large"),
        format!("answered {status}: {message:?}"),
    ))
}

/// L6: tokens in URLs.
async fn l6(http: &reqwest::Client, target: &Target) -> Result<Outcome> {
    let joined = http
        .post(target.url("/chat/api/rooms/attack/join"))
        .json(&json!({"access_code": "attack-code-1234"}))
        .send()
        .await?;
    let cookie =
        joined.headers().get("set-cookie").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let body: Value = joined.json().await?;
    let token = body["token"].as_str().unwrap_or_default();
    let in_url = http
        .get(target.url(&format!("/chat/api/rooms/attack/events?token={token}")))
        .send()
        .await?;
    let status = in_url.status().as_u16();
    let defended =
        status == 403 && cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict");
    let _ = &target.log;
    Ok(Outcome::new(
        "L6",
        "visitor tokens in URLs (history, logs, caches)",
        defended,
        format!(
            "?token= answered {status}; the session cookie is {}",
            if cookie.contains("HttpOnly") { "HttpOnly, SameSite=Strict" } else { "missing" }
        ),
    ))
}

/// L2: signed download URLs in the log, at any level (the suite runs the Connector at debug).
fn l2(target: &Target) -> Outcome {
    let log = std::fs::read_to_string(&target.log).unwrap_or_default();
    let leaks = log.lines().filter(|line| line.contains("sig=")).count();
    let downloads = log.lines().filter(|line| line.contains("/files/refs/")).count();
    Outcome::new(
        "L2",
        "signed download URLs in the log",
        leaks == 0,
        format!("{leaks} log lines carry a URL signature ({downloads} lines mention a download)"),
    )
}

/// I1: a text frame that is not UTF-8 must close the socket with 1007.
async fn i1(target: &Target) -> Result<Outcome> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    let mut socket = target.socket().await?;
    let frame = Frame::message(vec![0x7b, 0xff, 0xfe, 0x7d], OpCode::Data(Data::Text), true);
    socket.send(Message::Frame(frame)).await?;
    let mut code = None;
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(message) = socket.next().await {
            match message {
                Ok(Message::Close(frame)) => {
                    code = frame.map(|f| u16::from(f.code));
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    })
    .await;
    Ok(Outcome::new(
        "I1",
        "invalid UTF-8 in a text frame",
        code == Some(1007),
        match code {
            Some(code) => format!("closed with {code}"),
            None => "closed without a close code".to_owned(),
        },
    ))
}

/// M9: another channel that knows only the visitors' access code takes the room over.
async fn m9(plane: &DataPlane) -> Result<Outcome> {
    let owner = plane.open_channel(None).await.map_err(|e| anyhow!("{e}"))?.connector_channel_id;
    let ack = plane
        .request(
            Some(&owner),
            AuthStart::new(ROOM_FLOW).with_input(
                AuthInput::default()
                    .with("room_name", "attack-m9")
                    .with("access_code", "m9-visitors-1")
                    .with("owner_code", "m9-owner-code-2"),
            ),
        )
        .await
        .map_err(|e| anyhow!("{e}"))?;
    if ack.0.status != AuthStatus::Authenticated {
        bail!("creating the M9 room failed: {:?}", ack.0.message);
    }
    let intruder = sign_in(plane, None, "attack-m9", "m9-visitors-1").await;
    Ok(Outcome::new(
        "M9",
        "the visitors' access code takes a room over",
        intruder.is_err(),
        match intruder {
            Ok(_) => "a second channel with the access code alone took the room".to_owned(),
            Err(_) => "a second channel with the access code alone was refused".to_owned(),
        },
    ))
}

/// A raw data-plane socket (hello done) for floods the client runtime would not send.
async fn raw_socket(
    target: &Target,
) -> Result<tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut socket = target.socket().await?;
    let hello = xagent_protocol_types::Packet::with_payload(
        xagent_protocol_types::PacketId::new("pkt_attack_hello"),
        xagent_protocol_types::ConnectorHello::new(CARD_ID, vec![PROFILE_IM_V2.into()]),
    )
    .request_id(xagent_protocol_types::RequestId::new("req_attack_hello"));
    socket.send(Message::Text(hello.to_json()?.into())).await?;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), socket.next()).await {
            Ok(Some(Ok(Message::Text(text)))) if text.contains("connector.hello.ack") => break,
            Ok(Some(Ok(_))) => {}
            _ => bail!("no connector.hello.ack"),
        }
    }
    Ok(socket)
}

/// M7: a peer that floods requests and never reads the answers.
async fn m7(target: &Target, sizes: &Sizes) -> Result<Outcome> {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let mut socket = raw_socket(target).await?;
    let before = target.rss_mib();
    let window = Duration::from_secs_f64(sizes.guess_seconds.max(3.0));
    let started = Instant::now();
    let mut sent = 0u64;
    let padding = "p".repeat(4_000);
    let flood = async {
        loop {
            sent += 1;
            let mut arguments = serde_json::Map::new();
            arguments.insert("connector_channel_id".into(), "cch_does_not_exist".into());
            arguments.insert("text".into(), padding.clone().into());
            let invoke = xagent_protocol_types::ToolInvoke::new("webchat_message_send", arguments);
            let packet = xagent_protocol_types::Packet::with_payload(
                xagent_protocol_types::PacketId::new(format!("pkt_flood_{sent}")),
                invoke,
            )
            .request_id(xagent_protocol_types::RequestId::new(format!("req_flood_{sent}")));
            if socket
                .send(Message::Text(packet.to_json().unwrap_or_default().into()))
                .await
                .is_err()
            {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(window, flood).await;
    let seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = target.rss_mib();
    drop(socket);
    let growth = after - before;
    Ok(Outcome::new(
        "M7",
        "a peer that never reads grows memory through request work",
        growth < 64.0,
        format!("{sent} tool.invoke frames written in {seconds:.1} s without reading; RSS {before:.0} -> {after:.0} MiB"),
    )
    .with(json!({"frames_written": sent, "rss_before_mib": before, "rss_after_mib": after})))
}

/// L3: channels opened without limit on one socket (full run only: 4,097 opens).
async fn l3(target: &Target) -> Result<Outcome> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut socket = raw_socket(target).await?;
    let (mut opened, mut refused) = (0u64, 0u64);
    for n in 0..4_100u64 {
        let open = xagent_protocol_types::Packet::with_payload(
            xagent_protocol_types::PacketId::new(format!("pkt_open_{n}")),
            xagent_protocol_types::ChannelOpen::default(),
        )
        .request_id(xagent_protocol_types::RequestId::new(format!("req_open_{n}")));
        socket.send(Message::Text(open.to_json()?.into())).await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), socket.next()).await {
                Ok(Some(Ok(Message::Text(text))))
                    if text.contains(&format!("\"req_open_{n}\"")) =>
                {
                    if text.contains("capacity_exceeded") {
                        refused += 1;
                    } else {
                        opened += 1;
                    }
                    break;
                }
                Ok(Some(Ok(_))) => {}
                _ => bail!("no channel.open.ack"),
            }
        }
    }
    Ok(Outcome::new(
        "L3",
        "channel.open without limit",
        refused > 0,
        format!("{opened} channels opened on one socket, {refused} refused (capacity_exceeded)"),
    )
    .with(json!({"opened": opened, "refused": refused})))
}
