//! `xagent-connector homie` takes every secret from a file or the environment, so none shows
//! in the process list: the API key (`--api-key-file`), the broker password
//! (`--mqtt-password-file` / `XAGENT_HOMIE_MQTT_PASSWORD`; a password in `--mqtt-url` is
//! refused) and the pairing codes (`--pairing-file` / `XAGENT_HOMIE_PAIRING_CODES`). Run as the
//! real binary against a real Mosquitto that refuses anonymous clients.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use xagent_connector_homie::testing::Mosquitto;
use xagent_testkit::{line_containing, temp_state_dir, terminate};

const API_KEY: &str = "sk-homie-file-7d2e91";
const PASSWORD: &str = "broker-pw-5f1a77c3";
const CODE: &str = "pair-code-0b9e4d";

fn secret_file(dir: &std::path::Path, name: &str, value: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{value}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn homie() -> tokio::process::Command {
    let mut bin = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"));
    bin.arg("homie")
        .env_remove("XAGENT_CONNECTOR_API_KEY")
        .env_remove("XAGENT_HOMIE_MQTT_PASSWORD")
        .env_remove("XAGENT_HOMIE_PAIRING_CODES")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    bin
}

#[tokio::test(flavor = "multi_thread")]
async fn homie_reads_secrets_from_files() {
    let broker = Mosquitto::start_secured(&[("homie", PASSWORD)], None).expect("mosquitto");
    let dir = tempfile::tempdir().unwrap();
    let key = secret_file(dir.path(), "api-key", API_KEY);
    let password = secret_file(dir.path(), "mqtt-password", PASSWORD);
    let mut child = homie()
        .args(["--listen", "127.0.0.1:0"])
        .args(["--mqtt-url", &format!("mqtt://homie@127.0.0.1:{}", broker.port())])
        .arg("--api-key-file")
        .arg(&key)
        .arg("--mqtt-password-file")
        .arg(&password)
        .env("XAGENT_HOMIE_PAIRING_CODES", format!("thermo-1={CODE}"))
        .arg("--state-dir")
        .arg(temp_state_dir("cli-homie-secrets"))
        .spawn()
        .expect("starts");
    let pid = child.id().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = line_containing(&mut stdout, "device.homie listening on").await;
    let base = line.split_whitespace().nth(3).unwrap().to_owned();

    // Nothing secret in what `ps` shows.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    for secret in [API_KEY, PASSWORD, CODE] {
        assert!(!cmdline.contains(secret), "{secret} is on the command line: {cmdline}");
    }
    // The key from the file is the one xAgent must present.
    let http = reqwest::Client::new();
    let ok = http.get(format!("{base}/health")).bearer_auth(API_KEY).send().await.unwrap();
    assert_eq!(ok.status(), reqwest::StatusCode::OK);
    let wrong = http.get(format!("{base}/health")).bearer_auth("sk-wrong").send().await.unwrap();
    assert_ne!(wrong.status(), reqwest::StatusCode::OK);
    // The password from the file got the Connector into a broker that refuses anonymous
    // clients.
    let connected = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let log = broker.log();
            if log.contains("u'homie'") && log.contains("as xagent-homie-") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(connected.is_ok(), "the Connector did not sign in to the broker:\n{}", broker.log());
    let status = terminate(&mut child).await;
    assert_eq!(status.code(), Some(0));
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).await.unwrap();
    assert!(!stderr.contains("no pairing codes"), "the codes came from the environment: {stderr}");
    for secret in [API_KEY, PASSWORD, CODE] {
        assert!(!stderr.contains(secret), "{secret} in the log: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn homie_refuses_a_password_in_the_broker_url() {
    let dir = tempfile::tempdir().unwrap();
    let key = secret_file(dir.path(), "api-key", API_KEY);
    let out = homie()
        .args(["--mqtt-url", &format!("mqtt://homie:{PASSWORD}@127.0.0.1:1")])
        .arg("--api-key-file")
        .arg(&key)
        .arg("--state-dir")
        .arg(temp_state_dir("cli-homie-url-password"))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--mqtt-password-file"), "{stderr}");
    assert!(!stderr.contains(PASSWORD), "{stderr}");
}
