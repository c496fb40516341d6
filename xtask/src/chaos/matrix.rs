//! `cargo xtask chaos --matrix [--quick] [--seed N] [--json]`: kill -9 of `xagent-connector
//! matrix` during a conversation in an end-to-end encrypted room on a real Synapse (started by
//! the testkit from PyPI on a free port).
//!
//! A person posts numbered messages at a steady pace while the Connector is killed with
//! SIGKILL at random moments and restarted on the same state directory and port. xAgent's
//! side (the client runtime, which stays up and reconnects) records every `chat.message` it
//! receives and accepts it. At the end every numbered message must have reached xAgent
//! exactly once: none lost (the sync position only moves after the batch is in the outbox),
//! none twice (events handed over are marked seen in the same transaction, and their message
//! ids come from the event ids).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use xagent_client_runtime::{BaseUrl, ClientConfig, ClientEvent, DataPlane};
use xagent_connector_matrix::testing::{Account, Human};
use xagent_protocol_types::{AuthStart, AuthStatus, AuthStatusRequest, PROFILE_IM_V2, Secret};
use xagent_testkit::synapse::TestSynapse;

use crate::bench_support::{Flags, print_table, temp_dir};
use crate::chaos::harness::Rng;

const KEY: &str = "sk-chaos-matrix-6e0b3a";

struct Sizes {
    messages: usize,
    kills: usize,
}

/// Runs the scenario.
pub fn run(root: &Path, args: &[String]) -> Result<std::process::ExitCode> {
    let mut flags = Flags::parse(args);
    flags.switch("--matrix");
    flags.only(&["--seed"])?;
    let seed = crate::chaos::harness::seed(&flags)?;
    let sizes = if flags.quick {
        Sizes { messages: 40, kills: 2 }
    } else {
        Sizes { messages: 200, kills: 5 }
    };
    let bin = crate::bench_support::xagent_connector(root)?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let outcome = runtime.block_on(kill_scenario(&bin, &sizes, &mut Rng::new(seed)))?;
    let failed: Vec<&str> =
        if outcome["pass"].as_bool() == Some(true) { vec![] } else { vec!["matrix-kill"] };
    let mut results = Map::new();
    results.insert("matrix-kill".into(), outcome);
    crate::chaos::harness::finish(
        "chaos_matrix",
        results,
        seed,
        flags.quick,
        &failed,
        flags.json,
        print,
    )
}

fn print(result: &Value) {
    let r = &result["chaos_matrix"]["matrix-kill"];
    let rows = vec![vec![
        "matrix-kill".to_owned(),
        r["messages"].to_string(),
        r["kills"].to_string(),
        r["lost"].to_string(),
        r["twice"].to_string(),
        if r["pass"].as_bool() == Some(true) { "pass" } else { "FAIL" }.to_owned(),
    ]];
    print_table(&["scenario", "messages", "kills", "lost", "twice", "result"], &rows);
    if r["pass"].as_bool() != Some(true) {
        println!("lost: {}; sent twice: {}", r["lost_numbers"], r["twice_numbers"]);
        println!("state and log kept in {}", r["state_dir"]);
    }
    println!("\nseed {} (replay with --seed)", result["seed"]);
}

/// One `xagent-connector matrix` process on a fixed port and state directory.
struct Bot {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    homeserver: String,
    account: Account,
    child: Option<Child>,
}

impl Bot {
    async fn start(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("connector.log"))?;
        for _ in 0..50 {
            let mut child = Command::new(&self.bin)
                .arg("matrix")
                .args(["--listen", &format!("127.0.0.1:{}", self.port)])
                .args(["--homeserver", &self.homeserver, "--user", &self.account.user_id])
                .args(["--room-messages-per-minute", "100000"])
                .arg("--state-dir")
                .arg(self.dir.join("state"))
                .env("XAGENT_CONNECTOR_API_KEY", KEY)
                .env("XAGENT_MATRIX_PASSWORD", &self.account.password)
                // Each event's path through the Connector, for a failed run's post-mortem.
                .env(
                    "RUST_LOG",
                    "warn,xagent_connector_matrix=debug,matrix_sdk_crypto::backups=error",
                )
                .stdout(Stdio::piped())
                .stderr(log.try_clone()?)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {}", self.bin.display()))?;
            let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
            let mut lines = BufReader::new(stdout).lines();
            let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
            if let Ok(Ok(Some(line))) = first
                && line.starts_with("im.matrix listening on")
            {
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                self.child = Some(child);
                return Ok(());
            }
            // The port of the killed process may not be free yet.
            let _ = child.kill().await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!(
            "xagent-connector matrix did not start; see {}",
            self.dir.join("connector.log").display()
        )
    }

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

async fn kill_scenario(bin: &Path, sizes: &Sizes, rng: &mut Rng) -> Result<Value> {
    let synapse = TestSynapse::shared().await;
    let account = |u: xagent_testkit::synapse::TestUser| Account {
        user_id: u.user_id,
        localpart: u.localpart,
        password: u.password,
    };
    let bot_account = account(synapse.register("chaosbot").await);
    let human = Human::login(&synapse.url(), account(synapse.register("chaosuser").await)).await;
    let dir = temp_dir("chaos-matrix")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut bot = Bot {
        bin: bin.to_path_buf(),
        dir: dir.clone(),
        port,
        homeserver: synapse.url(),
        account: bot_account.clone(),
        child: None,
    };
    bot.start().await?;
    let base = BaseUrl::parse(&format!("http://127.0.0.1:{port}")).map_err(|e| anyhow!("{e}"))?;
    let mut config = ClientConfig::new(base, "im.matrix", vec![PROFILE_IM_V2.into()])
        .with_api_key(Secret::new(KEY));
    config.backoff.initial = Duration::from_millis(50);
    config.backoff.max = Duration::from_millis(500);
    config.backoff.max_failures = None;
    let (plane, mut events) = DataPlane::connect(config).await?;
    plane.connected().await.map_err(|e| anyhow!("{e}"))?;

    // Pair an encrypted room.
    let opened = plane.open_channel(None).await.map_err(|e| anyhow!("{e}"))?;
    let channel = opened.connector_channel_id;
    let started = plane
        .request(Some(&channel), AuthStart::new("matrix_room"))
        .await
        .map_err(|e| anyhow!("{e}"))?
        .0;
    let code = started.message.clone().unwrap_or_default();
    let code = code.rsplit(' ').next().unwrap_or_default().to_owned();
    let room = human.create_room("Chaos room", true, &[&bot_account.user_id]).await;
    human.wait_joined(&room, &bot_account.user_id).await;
    human.say(&room, &code).await;
    let session = started.auth_session_id.clone().ok_or_else(|| anyhow!("no session"))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let poll = AuthStatusRequest::new(session.clone()).with_flow_id("matrix_room");
        let status = plane.request(Some(&channel), poll).await.map_err(|e| anyhow!("{e}"))?.0;
        if status.status == AuthStatus::Authenticated {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the room was not paired: {:?}", status.message);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Reopened by the client after each of the Connector's restarts.
    plane.remember_channel(channel.clone()).await;

    // xAgent's side: count every numbered message, accept everything.
    let counts: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let seen = Arc::clone(&counts);
    let reader = tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let ClientEvent::ChatMessage(inbound) = event {
                if let Some(text) = &inbound.message.text
                    && let Some(at) = text.find("chaos-")
                {
                    *seen
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(text[at..].to_owned())
                        .or_default() += 1;
                }
                inbound.accept();
            }
        }
    });

    // The person talks; the Connector dies and comes back meanwhile.
    let total = sizes.messages;
    let seed = rng.below(u64::MAX);
    let talker = {
        let room = room.clone();
        tokio::spawn(async move {
            for n in 0..total {
                let content =
                    matrix_sdk::ruma::events::room::message::RoomMessageEventContent::text_plain(
                        format!("chaos-{n:05}"),
                    );
                // A message the person failed to post is posted again under the same
                // transaction id (the homeserver keeps one event for it): only what reached
                // the room can be lost by the Connector.
                let txn = matrix_sdk::ruma::OwnedTransactionId::from(format!("chaos-{seed}-{n}"));
                let mut tries = 0;
                loop {
                    let send = room.send(content.clone()).with_transaction_id(txn.clone());
                    let problem = match tokio::time::timeout(Duration::from_secs(20), send).await {
                        Ok(Ok(_)) => break,
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => "no answer within 20 s".to_owned(),
                    };
                    tries += 1;
                    eprintln!("chaos --matrix: posting chaos-{n:05} failed ({problem}); again");
                    if tries == 10 {
                        return Err(anyhow!("chaos-{n:05} could not be posted: {problem}"));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            Ok(())
        })
    };
    for _ in 0..sizes.kills {
        tokio::time::sleep(Duration::from_millis(300 + rng.below(1_200))).await;
        bot.kill().await;
        tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
        bot.start().await?;
    }
    talker.await.map_err(|e| anyhow!("the talker failed: {e}"))??;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while counts.lock().unwrap_or_else(|e| e.into_inner()).len() < total
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Late duplicates would come within a few seconds of the last message.
    tokio::time::sleep(Duration::from_secs(3)).await;
    reader.abort();
    plane.close().await;
    bot.kill().await;
    let counts = counts.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let lost: Vec<usize> =
        (0..total).filter(|n| !counts.contains_key(&format!("chaos-{n:05}"))).collect();
    let mut twice: Vec<&String> = counts.iter().filter(|(_, c)| **c > 1).map(|(k, _)| k).collect();
    twice.sort();
    let pass = lost.is_empty() && twice.is_empty();
    if pass {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(json!({
        "messages": total,
        "kills": sizes.kills,
        "lost": lost.len(),
        "twice": twice.len(),
        "lost_numbers": lost,
        "twice_numbers": twice,
        "encrypted": true,
        "pass": pass,
        "state_dir": if pass { Value::Null } else { json!(dir) },
    }))
}
