//! A normal day alarms nobody: each Connector is started on fresh state, used, stopped with
//! SIGTERM, started again on what it left and stopped again, at the default log level (info),
//! and no line of either run is a WARN or an ERROR. Each stop is logged with its reason. On
//! PostgreSQL the server's notices stay out of the info log, and no line carries a path of the
//! machine that built the binary. im.matrix's start on a real Synapse is in matrix.rs.
#![cfg(unix)]

mod support;

use std::process::Stdio;

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use xagent_connector_homie::testing::Mosquitto;
use xagent_testkit::postgres::TestPostgres;
use xagent_testkit::{line_containing, temp_state_dir, terminate};

const API_KEY: &str = "sk-cli-quiet-3f8a20";

/// The lines of a text-format log whose level is WARN or ERROR.
pub fn alarms(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| matches!(line.split_whitespace().nth(1), Some("WARN" | "ERROR")))
        .collect()
}

/// No alarm, the stop and its reason logged, no build path.
fn assert_quiet(what: &str, log: &str) {
    assert!(alarms(log).is_empty(), "{what} logged alarms on a normal day:\n{log}");
    assert!(log.contains("SIGTERM received"), "{what} did not log why it stopped:\n{log}");
    assert!(log.contains("stopped"), "{what} did not log that it stopped:\n{log}");
    assert!(!log.contains(".cargo/registry"), "{what} logged a build path:\n{log}");
}

#[test]
fn the_alarm_filter_reads_the_level_column() {
    let log = "2026-12-07T10:00:00.000000Z  INFO a: fine\n\
               2026-12-07T10:00:00.000000Z  WARN a: careful\n\
               2026-12-07T10:00:00.000000Z ERROR a: broken\n\
               2026-12-07T10:00:00.000000Z  INFO a: says ERROR in its text\n";
    assert_eq!(alarms(log).len(), 2);
}

/// Starts im.webchat, signs a room in (or reopens `channel`), stops; returns the channel and
/// the log.
async fn webchat_day(
    state: &std::path::Path,
    url: Option<&xagent_storage_postgres::DatabaseUrl>,
    channel: Option<&xagent_protocol_types::ConnectorChannelId>,
) -> (xagent_protocol_types::ConnectorChannelId, String) {
    let running = support::start_webchat(state, url, API_KEY).await;
    let plane = support::connect(&running.addr, API_KEY).await;
    let channel = match channel {
        Some(channel) => {
            plane.open_channel(Some(channel)).await.expect("the room's channel reopens");
            channel.clone()
        }
        None => support::open_room(&plane).await,
    };
    plane.close().await;
    (channel, running.stop().await)
}

#[tokio::test(flavor = "multi_thread")]
async fn webchat_starts_restarts_and_stops_quietly_on_sqlite() {
    let state = temp_state_dir("cli-quiet-webchat");
    let (channel, fresh) = webchat_day(&state, None, None).await;
    assert_quiet("im.webchat on fresh state", &fresh);
    // A restart with a signed-in room: the room is restored while the runtime is built.
    let (_, again) = webchat_day(&state, None, Some(&channel)).await;
    assert_quiet("im.webchat on its own state", &again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webchat_starts_restarts_and_stops_quietly_on_postgresql() {
    let url = TestPostgres::shared().await.fresh_database().await;
    let state = temp_state_dir("cli-quiet-webchat-pg");
    let (channel, fresh) = webchat_day(&state, Some(&url), None).await;
    assert_quiet("im.webchat on a fresh database", &fresh);
    let (_, again) = webchat_day(&state, Some(&url), Some(&channel)).await;
    assert_quiet("im.webchat on its database", &again);
    // The migrations' "already exists, skipping" notices are the server's small talk.
    for log in [&fresh, &again] {
        assert!(!log.contains("NOTICE"), "a PostgreSQL notice at info:\n{log}");
    }
}

/// Runs a server subcommand until it prints `listening`, lets it work for `settle`, stops it
/// with SIGTERM (a clean exit) and returns its log, at the default level.
async fn day(mut command: tokio::process::Command, listening: &str, settle: Duration) -> String {
    let mut child = command
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starts");
    let log = tokio::spawn(support::read_all(child.stderr.take().expect("stderr")));
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    line_containing(&mut stdout, listening).await;
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    tokio::time::sleep(settle).await;
    let status = terminate(&mut child).await;
    assert_eq!(status.code(), Some(0), "a clean stop: {status:?}");
    log.await.unwrap_or_default()
}

fn xagent_connector(subcommand: &str, state: &std::path::Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"));
    command.args([subcommand, "--listen", "127.0.0.1:0", "--state-dir"]).arg(state);
    command
}

/// Runs device.homie on `state` until it listens, then stops it; returns its log.
async fn homie_day(broker: &Mosquitto, state: &std::path::Path) -> String {
    let mut homie = xagent_connector("homie", state);
    homie
        .args(["--mqtt-url", &broker.url()])
        .args(["--pairing-code", "quiet-device=quiet-code-1234"]);
    day(homie, "device.homie listening on", Duration::ZERO).await
}

#[tokio::test(flavor = "multi_thread")]
async fn homie_starts_restarts_and_stops_quietly() {
    let broker = Mosquitto::start().expect("mosquitto");
    let state = temp_state_dir("cli-quiet-homie");
    assert_quiet("device.homie on fresh state", &homie_day(&broker, &state).await);
    assert_quiet("device.homie on its own state", &homie_day(&broker, &state).await);
}

/// Runs im.matrix for `bot` on `state` until its first sync is through, then stops it;
/// returns its log.
async fn matrix_day(
    synapse: &xagent_testkit::synapse::TestSynapse,
    bot: &xagent_testkit::synapse::TestUser,
    state: &std::path::Path,
) -> String {
    let mut matrix = xagent_connector("matrix", state);
    matrix
        .args(["--homeserver", &synapse.url(), "--user", &bot.user_id])
        .env("XAGENT_MATRIX_PASSWORD", &bot.password)
        .env_remove("XAGENT_MATRIX_ACCESS_TOKEN");
    // The first sync and the crypto set-up run after the listening line.
    day(matrix, "im.matrix listening on", Duration::from_secs(3)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matrix_starts_restarts_and_stops_quietly() {
    let synapse = xagent_testkit::synapse::TestSynapse::shared().await;
    let bot = synapse.register("quietbot").await;
    let state = temp_state_dir("cli-quiet-matrix");
    assert_quiet("im.matrix on fresh state", &matrix_day(synapse, &bot, &state).await);
    assert_quiet("im.matrix on its own state", &matrix_day(synapse, &bot, &state).await);
}
