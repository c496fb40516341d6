//! Round two, the MCP bridge (issue 23): `xagent-connector mcp --http` in front of a real
//! `xagent-connector webchat`, attacked as a local process would: F8 (calling its Tools over
//! HTTP without the bearer token), F9 (swapping a name under `--allow-dir` for a symbolic link
//! while the bridge reads it) and F20 (telling outside files apart by the answer, and a hard
//! link inside the directory to an outside file).

#[allow(unused_imports)]
use super::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The room the bridge signs in to.
const BRIDGE_ROOM: &str = "bridge-attack";
/// Its access code.
const BRIDGE_CODE: &str = "bridge-attack-code-1234";
/// What the outside file holds (the attack wins when this reaches the room).
const OUTSIDE_SECRET: &[u8] = b"OUTSIDE-SECRET-bridge-attack-9f2c";
/// What the file inside the allowed directory holds.
const INSIDE_TEXT: &[u8] = b"inside the allowed directory";
/// Where the bridge keeps its generated HTTP bearer token (inside its state directory).
const TOKEN_FILE: &str = "mcp-http-token";

/// The MCP bridge's scenarios: F8, F9, F20.
pub(super) async fn run(bin: &Path, sizes: &Sizes) -> Result<Vec<Outcome>> {
    let mut target = start(bin).await?;
    let work = target.dir.join("bridge-attack");
    let allowed = work.join("allowed");
    let outside = work.join("outside");
    std::fs::create_dir_all(&allowed)?;
    std::fs::create_dir_all(&outside)?;
    std::fs::write(outside.join("secret.txt"), OUTSIDE_SECRET)?;
    let mut bridge = Bridge::start(bin, &target, &work, &allowed, "127.0.0.1:0").await?;
    let http = reqwest::Client::new();
    let visitor = join(&http, &target, BRIDGE_ROOM, BRIDGE_CODE).await?;
    let mut outcomes = vec![f8(bin, &target, &work, &bridge, &http).await?];
    outcomes.push(f9(&target, &bridge, &http, &visitor, &allowed, &outside, sizes).await?);
    outcomes.push(f20(&target, &bridge, &http, &visitor, &allowed, &outside).await?);
    bridge.stop().await;
    let _ = target.child.kill().await;
    let _ = std::fs::remove_dir_all(&target.dir);
    Ok(outcomes)
}

/// A running `xagent-connector mcp --http` signed in to [`BRIDGE_ROOM`].
struct Bridge {
    child: tokio::process::Child,
    /// `http://ADDR/mcp`.
    url: String,
    /// The bearer token the bridge generated into its state directory, if it has one.
    token: Option<String>,
    /// The bridge's stderr (its log).
    log: PathBuf,
    /// Its stdout (where a generated token is shown once).
    out: PathBuf,
}

/// How a bridge start ended.
enum Started {
    /// Listening.
    Serving(Box<Bridge>),
    /// The process exited first, with this output.
    Refused(String),
}

impl Bridge {
    async fn start(
        bin: &Path,
        target: &Target,
        work: &Path,
        allowed: &Path,
        listen: &str,
    ) -> Result<Self> {
        match Self::try_start(bin, target, work, allowed, listen, "bridge", true).await? {
            Started::Serving(bridge) => Ok(*bridge),
            Started::Refused(output) => bail!("the bridge did not start:\n{output}"),
        }
    }

    async fn try_start(
        bin: &Path,
        target: &Target,
        work: &Path,
        allowed: &Path,
        listen: &str,
        name: &str,
        sign_in: bool,
    ) -> Result<Started> {
        let state = work.join(format!("{name}-state"));
        let log = work.join(format!("{name}.log"));
        let out = work.join(format!("{name}.out"));
        let mut command = tokio::process::Command::new(bin);
        command
            .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
            .env("RUST_LOG", "debug,hyper=info,h2=info,rustls=info,reqwest=info")
            .args(["mcp", "--base-url", &target.url(""), "--http", listen, "--state-dir"])
            .arg(&state)
            .arg("--allow-dir")
            .arg(allowed);
        if sign_in {
            command
                .args(["--flow", ROOM_FLOW, "--input"])
                .arg(format!("room_name={BRIDGE_ROOM}"))
                .arg("--input")
                .arg(format!("access_code={BRIDGE_CODE}"))
                .args(["--input", "owner_code=bridge-owner-code-5678"]);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} mcp", bin.display()))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = format!("{}{}", read_lossy(&log), read_lossy(&out));
            if let Some(url) = text
                .lines()
                .find_map(|l| l.split("MCP over streamable HTTP at ").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
            {
                let token = std::fs::read_to_string(state.join(TOKEN_FILE))
                    .ok()
                    .map(|t| t.trim().to_owned())
                    .filter(|t| !t.is_empty());
                return Ok(Started::Serving(Box::new(Self {
                    child,
                    url: url.to_owned(),
                    token,
                    log,
                    out,
                })));
            }
            if child.try_wait()?.is_some() {
                return Ok(Started::Refused(text));
            }
            if Instant::now() > deadline {
                let _ = child.kill().await;
                bail!("the bridge did not listen within 30 s:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }

    /// One stateless MCP `tools/call` (protocol 2026-07-28, no session) with the bridge's
    /// own token.
    async fn call(&self, http: &reqwest::Client, tool: &str, arguments: Value) -> Result<Called> {
        stateless_call(http, &self.url, self.token.as_deref(), None, tool, arguments).await
    }
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// What a stateless Tools call got.
struct Called {
    status: u16,
    /// The JSON-RPC `result` (a Tool result), when the call got one.
    result: Option<Value>,
}

impl Called {
    /// The Tool ran and succeeded.
    fn succeeded(&self) -> bool {
        self.status == 200
            && self.result.as_ref().is_some_and(|r| r["isError"] != Value::Bool(true))
    }

    /// The Tool's error message, if the call reached the Tool and it failed.
    fn tool_error(&self) -> Option<String> {
        let result = self.result.as_ref()?;
        (result["isError"] == Value::Bool(true))
            .then(|| result["structuredContent"]["error"]["message"].as_str().map(str::to_owned))
            .flatten()
    }
}

/// One `tools/call` as a stateless MCP request: the way any local process reaches the Tools
/// with a single POST.
async fn stateless_call(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    host: Option<&str>,
    tool: &str,
    arguments: Value,
) -> Result<Called> {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "name": tool, "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "attack", "version": "1"}
            }
        }
    });
    let mut request = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .timeout(Duration::from_secs(30))
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(host) = host {
        request = request.header("host", host);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    let result = text
        .lines()
        .map(|l| l.strip_prefix("data:").unwrap_or(l).trim())
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| v.get("result").cloned());
    Ok(Called { status, result })
}

/// F8: the HTTP transport's Tools without the token (none, a wrong one, `Host: localhost`),
/// and `--http` on a non-loopback address.
async fn f8(
    bin: &Path,
    target: &Target,
    work: &Path,
    bridge: &Bridge,
    http: &reqwest::Client,
) -> Result<Outcome> {
    let tool = "connector_channels_list";
    let owner = bridge.call(http, tool, json!({})).await?;
    if !owner.succeeded() {
        bail!("F8: the bridge's own client could not call {tool} (HTTP {})", owner.status);
    }
    let port = bridge.url.rsplit(':').next().unwrap_or_default().trim_end_matches("/mcp");
    let localhost = format!("localhost:{port}");
    let attempts = [
        ("no token", None, None),
        ("a wrong token", Some("not-the-token-0123456789abcdef"), None),
        ("Host: localhost, no token", None, Some(localhost.as_str())),
    ];
    let mut succeeded = Vec::new();
    let mut answers = Vec::new();
    for (what, token, host) in attempts {
        let called = stateless_call(http, &bridge.url, token, host, tool, json!({})).await?;
        answers.push(format!("{what}: HTTP {}", called.status));
        if called.succeeded() {
            succeeded.push(what);
        }
    }
    // A bridge asked to listen on every interface, without TLS (not signed in: the room has
    // its channel already).
    let allowed = work.join("allowed");
    let wide = Bridge::try_start(bin, target, work, &allowed, "0.0.0.0:0", "wide", false).await?;
    let non_loopback_served = match wide {
        Started::Serving(mut wide) => {
            wide.stop().await;
            true
        }
        Started::Refused(_) => false,
    };
    // The token never appears in the bridge's log (stderr).
    let token_logged =
        bridge.token.as_deref().is_some_and(|token| read_lossy(&bridge.log).contains(token));
    let shown_once = bridge.token.as_deref().is_some_and(|t| read_lossy(&bridge.out).contains(t));
    let defended = succeeded.is_empty() && !non_loopback_served && !token_logged;
    Ok(Outcome::new(
        "F8",
        "the MCP bridge's HTTP Tools answer any local process",
        defended,
        format!(
            "{} of {} unauthenticated Tools calls succeeded ({}); --http 0.0.0.0 {}; token in the log: {token_logged}",
            succeeded.len(),
            attempts.len(),
            answers.join(", "),
            if non_loopback_served { "served without TLS" } else { "refused" },
        ),
    )
    .with(json!({
        "unauthenticated_calls": attempts.len(),
        "unauthenticated_succeeded": succeeded.len(),
        "non_loopback_served": non_loopback_served,
        "token_in_log": token_logged,
        "token_shown_on_stdout": shown_once,
    })))
}

/// F9: a name under `--allow-dir` swapped for a symbolic link to an outside file (and back)
/// by a racing thread while the bridge uploads it, N times.
async fn f9(
    target: &Target,
    bridge: &Bridge,
    http: &reqwest::Client,
    visitor: &str,
    allowed: &Path,
    outside: &Path,
    sizes: &Sizes,
) -> Result<Outcome> {
    let calls = if sizes.full { 150 } else { 40 };
    let name = allowed.join("race.txt");
    std::fs::write(&name, INSIDE_TEXT)?;
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let secret = outside.join("secret.txt");
        let link = allowed.join(".race-link");
        let file = allowed.join(".race-file");
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::remove_file(&link);
                #[cfg(unix)]
                let _ = std::os::unix::fs::symlink(&secret, &link);
                let _ = std::fs::rename(&link, &name);
                std::thread::yield_now();
                let _ = std::fs::write(&file, INSIDE_TEXT);
                let _ = std::fs::rename(&file, &name);
                std::thread::yield_now();
            }
        })
    };
    let mut sent = Vec::new();
    let mut refused = 0;
    for _ in 0..calls {
        let called = bridge.call(http, "webchat_file_send", json!({"file_ref": "race.txt"})).await;
        match called {
            Ok(called) if called.succeeded() => {
                let file_ref = called
                    .result
                    .as_ref()
                    .and_then(|r| r["structuredContent"]["file_ref"].as_str().map(str::to_owned));
                if let Some(file_ref) = file_ref {
                    sent.push(file_ref);
                }
            }
            _ => refused += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = swapper.join();
    let mut escaped = 0;
    for file_ref in &sent {
        let bytes = http
            .get(target.url(&format!("/chat/api/rooms/{BRIDGE_ROOM}/files/{file_ref}")))
            .bearer_auth(visitor)
            .send()
            .await?
            .bytes()
            .await?;
        if bytes.as_ref() == OUTSIDE_SECRET {
            escaped += 1;
        }
    }
    Ok(Outcome::new(
        "F9",
        "--allow-dir: a symlink swapped in while the bridge reads escapes the directory",
        escaped == 0 && !sent.is_empty(),
        format!(
            "{escaped} of {calls} uploads carried the outside file ({} sent, {refused} refused)",
            sent.len()
        ),
    )
    .with(json!({"calls": calls, "escaped": escaped, "sent": sent.len(), "refused": refused})))
}

/// F20: `..` paths to an outside file that exists and to one that does not get the same
/// answer; a hard link inside the directory to an outside file is not uploaded.
async fn f20(
    target: &Target,
    bridge: &Bridge,
    http: &reqwest::Client,
    visitor: &str,
    allowed: &Path,
    outside: &Path,
) -> Result<Outcome> {
    let answer = |reference: &'static str| async move {
        let called = bridge.call(http, "webchat_file_send", json!({"file_ref": reference})).await?;
        let message = called.tool_error().unwrap_or_else(|| {
            if called.succeeded() { "uploaded".into() } else { format!("HTTP {}", called.status) }
        });
        // The reference itself is echoed: compare the answers without it.
        anyhow::Ok(message.replace(reference, "REF"))
    };
    let existing = answer("../outside/secret.txt").await?;
    let absent = answer("../outside/absent.txt").await?;
    let alike = existing == absent && existing != "uploaded";
    let link = allowed.join("hard.txt");
    let _ = std::fs::remove_file(&link);
    std::fs::hard_link(outside.join("secret.txt"), &link)?;
    let called = bridge.call(http, "webchat_file_send", json!({"file_ref": "hard.txt"})).await?;
    let mut hard_link_uploaded = false;
    if called.succeeded()
        && let Some(file_ref) =
            called.result.as_ref().and_then(|r| r["structuredContent"]["file_ref"].as_str())
    {
        let bytes = http
            .get(target.url(&format!("/chat/api/rooms/{BRIDGE_ROOM}/files/{file_ref}")))
            .bearer_auth(visitor)
            .send()
            .await?
            .bytes()
            .await?;
        hard_link_uploaded = bytes.as_ref() == OUTSIDE_SECRET;
    }
    Ok(Outcome::new(
        "F20",
        "--allow-dir tells outside files apart; a hard link uploads an outside file",
        alike && !hard_link_uploaded,
        format!(
            "{}; hard link to an outside file {}",
            if alike {
                format!("outside-existing and outside-absent both answered {existing:?}")
            } else {
                format!("outside-existing answered {existing:?}, outside-absent {absent:?}")
            },
            if hard_link_uploaded { "uploaded" } else { "refused" }
        ),
    )
    .with(json!({
        "outside_existing_and_absent_alike": alike,
        "hard_link_uploaded": hard_link_uploaded,
    })))
}
