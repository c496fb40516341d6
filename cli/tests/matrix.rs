//! `xagent-connector matrix` as the real binary against a real Synapse: the conformance suite
//! passes through its `matrix_room` flow (a person posts the code the suite shows) and its
//! `matrix_message_send` Tool; the bot's password and access token reach neither the
//! process list nor any log line (debug level), and its session is readable by its owner
//! only.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use xagent_connector_matrix::testing::{Account, Human, body_of};
use xagent_testkit::synapse::TestSynapse;
use xagent_testkit::{line_containing, temp_state_dir, terminate};

const API_KEY: &str = "sk-matrix-cli-4b8d1e";

/// Copies every line of `from` into `log` (and hands the lines on when asked).
fn collect<R: AsyncRead + Unpin + Send + 'static>(
    from: R,
    log: Arc<Mutex<String>>,
) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = BufReader::new(from).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            log.lock().unwrap().push_str(&line);
            log.lock().unwrap().push('\n');
            let _ = tx.send(line);
        }
    });
    rx
}

async fn line_with(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, needle: &str) -> String {
    let found = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(line) = rx.recv().await {
            if line.contains(needle) {
                return Some(line);
            }
        }
        None
    })
    .await;
    found.ok().flatten().unwrap_or_else(|| panic!("no line containing {needle:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_passes_through_a_room_paired_by_a_person_and_no_secret_is_logged() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("clibot").await;
    let user = synapse.register("cliuser").await;
    let human = Human::login(
        &synapse.url(),
        Account { user_id: user.user_id, localpart: user.localpart, password: user.password },
    )
    .await;
    let state = temp_state_dir("cli-matrix");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .arg("matrix")
        .args(["--listen", "127.0.0.1:0", "--homeserver", &synapse.url(), "--user", &bot.user_id])
        .arg("--state-dir")
        .arg(&state)
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .env("XAGENT_MATRIX_PASSWORD", &bot.password)
        .env_remove("XAGENT_MATRIX_ACCESS_TOKEN")
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starts");
    let pid = child.id().expect("pid");
    let log = Arc::new(Mutex::new(String::new()));
    let _stderr = collect(child.stderr.take().expect("stderr"), Arc::clone(&log));
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = line_containing(&mut stdout, "im.matrix listening on").await;
    let base = line.split_whitespace().nth(3).expect("the base url").to_owned();
    let _stdout = collect(stdout.into_inner(), Arc::clone(&log));

    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(!cmdline.contains(&bot.password) && !cmdline.contains(API_KEY), "{cmdline}");

    // The person's room, with the bot in it.
    let room = human.create_room("Conformance room", true, &[&bot.user_id]).await;
    human.wait_joined(&room, &bot.user_id).await;

    let mut suite = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .args(["conformance", "--base-url", &base, "--api-key", API_KEY])
        .args(["--flow", "matrix_room", "--qr-wait", "60"])
        .args(["--tool", "matrix_message_send", "--args", r#"{"text":"conformance says hi"}"#])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the suite starts");
    let suite_log = Arc::new(Mutex::new(String::new()));
    let mut prompts = collect(suite.stderr.take().expect("stderr"), Arc::clone(&suite_log));
    let _report = collect(suite.stdout.take().expect("stdout"), Arc::clone(&suite_log));
    let prompt = line_with(&mut prompts, "pairing code in the room:").await;
    let code = prompt.rsplit(' ').next().expect("a code").to_owned();
    human.say(&room, &code).await;
    let status = tokio::time::timeout(std::time::Duration::from_secs(180), suite.wait())
        .await
        .expect("the suite ends")
        .expect("status");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let report = suite_log.lock().unwrap().clone();
    assert!(status.success(), "the suite failed:\n{report}");
    human.wait_message(&room, &bot.user_id, |e| body_of(e) == "conformance says hi").await;

    let exit = terminate(&mut child).await;
    assert!(exit.success(), "{exit:?}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    // The bot's session: private, and its token never printed.
    let matrix_dir = state.join("matrix");
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
    assert_eq!(mode(&matrix_dir), 0o700);
    assert_eq!(mode(&matrix_dir.join("session.json")), 0o600);
    let session: serde_json::Value =
        serde_json::from_slice(&std::fs::read(matrix_dir.join("session.json")).expect("session"))
            .expect("json");
    let token = session["access_token"].as_str().expect("a token").to_owned();
    let logged = log.lock().unwrap().clone();
    assert!(logged.contains("DEBUG") || logged.contains("debug"), "debug logs were captured");
    assert!(!logged.contains('\u{1b}'), "no colour codes in a log that is not a terminal");
    for secret in [bot.password.as_str(), token.as_str(), API_KEY] {
        assert!(!logged.contains(secret), "a secret reached the log");
        assert!(!report.contains(secret), "a secret reached the suite's output");
    }
}
