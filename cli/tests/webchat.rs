//! `xagent-connector webchat` as a process: the API key from a file, never on the command
//! line (L1), and SIGTERM as a graceful shutdown (L4) — issue 14.

mod support;

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
#[cfg(unix)]
use xagent_testkit::terminate;

const API_KEY: &str = "sk-cli-webchat-file-7f3a";

fn temp_dir(name: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir =
        std::env::temp_dir().join(format!("cli-webchat-{name}-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// One HTTP/1.1 GET over a plain socket; returns the status line.
async fn get(addr: &str, path: &str, key: &str) -> String {
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    let _ = socket.read_to_string(&mut answer).await;
    answer.lines().next().unwrap_or("").to_owned()
}

/// `xagent-connector webchat` started with the key in a 0600 file; returns the process and
/// its address.
async fn start(dir: &std::path::Path) -> (tokio::process::Child, String) {
    let key_file = dir.join("api-key");
    std::fs::write(&key_file, format!("{API_KEY}\n")).expect("key file");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env_remove("XAGENT_CONNECTOR_API_KEY")
        .env("RUST_LOG", "warn")
        .args(["webchat", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir.join("state"))
        .arg("--api-key-file")
        .arg(&key_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starts");
    let stdout = child.stdout.take().expect("stdout");
    let url = support::webchat_addr(BufReader::new(stdout).lines()).await;
    (child, url)
}

#[tokio::test(flavor = "multi_thread")]
async fn l1_the_api_key_comes_from_a_file_and_never_appears_in_the_process_list() {
    let dir = temp_dir("l1");
    let (child, url) = start(&dir).await;
    assert!(get(&url, "/health", API_KEY).await.contains(" 200"), "the key from the file works");
    assert!(get(&url, "/health", "wrong").await.contains(" 401"));
    #[cfg(target_os = "linux")]
    {
        let pid = child.id().expect("pid");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        assert!(!String::from_utf8_lossy(&cmdline).contains(API_KEY), "the key is not in ps");
    }
    drop(child);
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn l4_sigterm_shuts_the_connector_down_gracefully() {
    let dir = temp_dir("l4");
    let (mut child, url) = start(&dir).await;
    assert!(get(&url, "/health", API_KEY).await.contains(" 200"));
    let status = terminate(&mut child).await;
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean shutdown, not a kill: {status:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_process_on_a_state_directory_in_use_refuses_to_start_naming_the_first() {
    let dir = temp_dir("lock");
    let (first, url) = start(&dir).await;
    let pid = first.id().expect("pid");
    let second = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .env("RUST_LOG", "warn")
        .args(["webchat", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir.join("state"))
        .output();
    let second = tokio::time::timeout(std::time::Duration::from_secs(30), second)
        .await
        .expect("the second process ends by itself")
        .expect("runs");
    assert!(!second.status.success(), "the second process must not run beside the first");
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(said.contains(&format!("in use by process {pid}")), "{said}");
    assert!(get(&url, "/health", API_KEY).await.contains(" 200"), "the first one is untouched");
    // kill -9 leaves no stale lock: the directory is free for the next start.
    drop(first);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (again, url) = start(&dir).await;
    assert!(get(&url, "/health", API_KEY).await.contains(" 200"));
    drop(again);
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 26's "must show": the example configuration starts the Connector as it is (the API
/// key from the environment), and a flag wins over the file.
#[tokio::test(flavor = "multi_thread")]
async fn the_example_configuration_starts_webchat_and_a_flag_wins_over_the_file() {
    let dir = temp_dir("config");
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/webchat.example.toml");
    // The example's listen address is the default 127.0.0.1:8080; a flag moves it to a free
    // port, and a file that names an unusable address loses to the flag the same way.
    let spawn = |config: &std::path::Path| {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
            .current_dir(&dir)
            .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
            .env("RUST_LOG", "info")
            .arg("webchat")
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starts");
        let stdout = child.stdout.take().expect("stdout");
        (child, BufReader::new(stdout).lines())
    };
    let (child, lines) = spawn(&example);
    let url = support::webchat_addr(lines).await;
    assert!(get(&url, "/health", API_KEY).await.contains(" 200"));
    assert!(dir.join("webchat-state").is_dir(), "the example's relative state-dir, from the cwd");
    drop(child);

    let custom = dir.join("custom.toml");
    std::fs::write(&custom, "listen = \"127.0.0.1:1\"\nstate-dir = \"custom-state\"\n").unwrap();
    let (child, lines) = spawn(&custom);
    let url = support::webchat_addr(lines).await;
    assert!(get(&url, "/health", API_KEY).await.contains(" 200"), "--listen won over the file");
    assert!(dir.join("custom-state").is_dir());
    drop(child);

    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "state-dir = \"x\"\nmax-upload-bytes = \"lots\"\n").unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .current_dir(&dir)
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .arg("webchat")
        .arg("--config")
        .arg(&broken)
        .output()
        .await
        .expect("runs");
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("broken.toml") && said.contains("key `max-upload-bytes`"), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--log-format json`: every stderr line is one JSON object, the lines of a packet's handling
/// name its type, request_id and channel, and the API key is in none of them (the secret scan
/// in the JSON format, at `debug`, over a whole conformance run).
#[tokio::test(flavor = "multi_thread")]
async fn json_logs_are_one_object_a_line_name_the_packet_and_hold_no_secret() {
    let dir = temp_dir("json-logs");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .env("RUST_LOG", "debug")
        .args(["webchat", "--log-format", "json", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir.join("state"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starts");
    let stdout = child.stdout.take().expect("stdout");
    // Read while it runs: a full pipe would stall the Connector.
    let mut stderr = child.stderr.take().expect("stderr");
    let reader = tokio::spawn(async move {
        let mut logs = String::new();
        let _ = stderr.read_to_string(&mut logs).await;
        logs
    });
    let url = support::webchat_addr(BufReader::new(stdout).lines()).await;
    let conformance = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .args(["conformance", "--base-url", &format!("http://{url}")])
        .output()
        .await
        .expect("conformance runs");
    assert!(
        conformance.status.success(),
        "{}{}",
        String::from_utf8_lossy(&conformance.stdout),
        String::from_utf8_lossy(&conformance.stderr)
    );
    #[cfg(unix)]
    terminate(&mut child).await;
    #[cfg(not(unix))]
    let _ = child.kill().await;
    let logs = reader.await.expect("the reader");
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(lines.len() > 20, "{logs}");
    let packet = lines
        .iter()
        .find(|l| l["span"]["name"] == "packet" && l["span"]["connector_channel_id"].is_string())
        .unwrap_or_else(|| panic!("no line inside a channel packet's span: {logs}"));
    assert!(packet["span"]["packet_type"].is_string() && packet["span"]["request_id"].is_string());
    assert!(lines.iter().all(|l| l["level"].is_string() && l["timestamp"].is_string()));
    assert!(!logs.contains(API_KEY), "the API key is in a log line");
    let _ = std::fs::remove_dir_all(dir);
}
