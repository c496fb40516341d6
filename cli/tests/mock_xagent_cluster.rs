//! Two `xagent-connector mock-xagent --database-url` processes of one Card sharing a real
//! PostgreSQL (testkit's) against the echo Connector on 127.0.0.1: only the holder of the
//! Card's holder lease connects; when it is killed (SIGKILL: no goodbye, no release) the
//! other takes over within the lease's lifetime and reopens the channel the first one
//! remembered in the database.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use xagent_testkit::postgres::TestPostgres;
use xagent_testkit::{ECHO_FLOW, EchoServer, temp_state_dir};

const API_KEY: &str = "sk-mock-cluster-2f7a90";

/// A running mock and the lines it prints (stdout and stderr together).
struct Mock {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Mock {
    fn start(base: &str, database_url: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
            .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
            // The URL goes through the environment, never the command line.
            .env("XAGENT_CONNECTOR_DATABASE_URL", database_url)
            .env("RUST_LOG", "warn")
            .args(["mock-xagent", "--base-url", base, "--flow", ECHO_FLOW])
            .args(["--input", "token=tok-123"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("mock-xagent starts");
        let (sender, lines) = mpsc::unbounded_channel();
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        for reader in [Box::new(out) as Box<dyn tokio::io::AsyncRead + Send + Unpin>, Box::new(err)]
        {
            let sender = sender.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(reader).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if sender.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Self { child, lines }
    }

    /// Waits up to `within` for a line containing `text`; every line seen is kept in `seen`.
    async fn wait_for(&mut self, text: &str, within: Duration, seen: &mut Vec<String>) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    let found = line.contains(text);
                    seen.push(line);
                    if found {
                        return true;
                    }
                }
                Ok(None) | Err(_) => return false,
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_rule_of_two_mock_xagents_on_one_database_one_connects_and_the_other_takes_over_a_kill()
 {
    let server = EchoServer::start(&temp_state_dir("mock-cluster"), API_KEY, None)
        .await
        .expect("echo starts");
    let url = TestPostgres::shared().await.fresh_database().await;
    let base = server.base_url();
    let (mut seen_a, mut seen_b) = (Vec::new(), Vec::new());
    let mut a = Mock::start(&base, url.expose());
    assert!(
        a.wait_for("auth authenticated", Duration::from_secs(30), &mut seen_a).await,
        "the first mock connects and signs in: {seen_a:?}"
    );
    let mut b = Mock::start(&base, url.expose());
    assert!(
        b.wait_for("holds the data plane", Duration::from_secs(15), &mut seen_b).await,
        "the second mock stands by: {seen_b:?}"
    );
    // It stays so while the holder lives (several lease lifetimes of 4 s would be long; one
    // and a half is enough to see renewals keep it).
    assert!(
        !b.wait_for("state online", Duration::from_secs(6), &mut seen_b).await,
        "only the holder connects: {seen_b:?}"
    );
    a.child.kill().await.expect("SIGKILL");
    let killed = Instant::now();
    assert!(
        b.wait_for("state online", Duration::from_secs(20), &mut seen_b).await,
        "the second mock takes over: {seen_b:?}"
    );
    let failover = killed.elapsed();
    let resumed = seen_b.iter().any(|line| line.contains("resumed"));
    assert!(
        resumed || b.wait_for("resumed", Duration::from_secs(5), &mut seen_b).await,
        "with the channel the first one remembered: {seen_b:?}"
    );
    assert!(failover < Duration::from_secs(10), "took over after {failover:?}");
    let printed = seen_a.iter().chain(&seen_b).cloned().collect::<Vec<_>>().join("\n");
    if let Some(password) = url.config().get_password() {
        let password = String::from_utf8_lossy(password);
        assert!(!printed.contains(password.as_ref()), "the database password is never printed");
    }
    drop(b);
    server.stop().await;
}
