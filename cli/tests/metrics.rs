//! `--metrics-listen` scraped by a real Prometheus (Debian's `prometheus`, started here on a
//! free port in a temporary directory; `XAGENT_PROMETHEUS` names another binary): after a
//! conformance run against `xagent-connector webchat`, the series are read back through
//! Prometheus's HTTP API. Also: `/readyz`, and no label carries a channel id or the API key.
//! Skipped, with the reason printed, when no Prometheus is installed, unless
//! `XAGENT_REQUIRE_PROMETHEUS` is set (`.ci/run` installs it and sets it).

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

const API_KEY: &str = "sk-cli-metrics-4c1d9e";

fn prometheus() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("XAGENT_PROMETHEUS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/usr/bin/prometheus".into());
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("XAGENT_REQUIRE_PROMETHEUS").is_none(),
        "XAGENT_REQUIRE_PROMETHEUS is set but {} is missing (apt-get install prometheus)",
        path.display()
    );
    println!("SKIPPED: no Prometheus at {} (apt-get install prometheus)", path.display());
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_the_metrics_listener_and_reads_the_series_back() {
    let Some(prometheus) = prometheus() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let mut connector = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .env("RUST_LOG", "warn")
        .args(["webchat", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starts");
    let mut lines = BufReader::new(connector.stdout.take().expect("stdout")).lines();
    let (mut metrics, mut base) = (None, None);
    while metrics.is_none() || base.is_none() {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the Connector starts")
            .expect("stdout")
            .expect("a line");
        if let Some(rest) = line.strip_prefix("metrics listening on http://") {
            metrics = rest.strip_suffix("/metrics").map(str::to_owned);
        } else if let Some(rest) = line.strip_prefix("im.webchat listening on ") {
            base = rest.split_whitespace().next().map(str::to_owned);
        }
    }
    let (metrics, base) = (metrics.expect("metrics"), base.expect("base"));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let http = reqwest::Client::new();
    let ready = http.get(format!("http://{metrics}/readyz")).send().await.expect("readyz");
    assert_eq!(ready.status(), 200, "ready once it accepts connections");

    // Traffic: hello, channels, refused Tool calls, errors.
    let conformance = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .args(["conformance", "--base-url", &base])
        .output()
        .await
        .expect("conformance runs");
    assert!(conformance.status.success(), "{}", String::from_utf8_lossy(&conformance.stdout));

    let scraped = http.get(format!("http://{metrics}/metrics")).send().await.expect("scrape");
    let content_type = scraped.headers()["content-type"].to_str().unwrap_or_default().to_owned();
    assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
    let text = scraped.text().await.expect("text");
    for series in [
        "xagent_connector_packets_received_total{packet_type=\"connector.hello\"}",
        "xagent_connector_packets_sent_total{packet_type=\"connector.hello.ack\"}",
        "xagent_connector_errors_sent_total{code=",
        "xagent_connector_tool_calls_total{",
        "xagent_connector_tool_call_seconds_bucket{",
        "xagent_connector_storage_commit_seconds_bucket{",
        "xagent_connector_outbox_depth ",
        "xagent_connector_data_plane_connections ",
        "xagent_connector_channels{status=",
        "xagent_connector_webchat_visitor_streams ",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
    assert!(!text.contains("cch_"), "a channel id in a label:\n{text}");
    assert!(!text.contains(API_KEY), "the API key in the metrics");

    // A real Prometheus scrapes it; the series come back through its query API.
    let port = free_port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: xagent\n    static_configs:\n      - targets: ['{metrics}']\n"
        ),
    )
    .expect("config");
    let mut server = tokio::process::Command::new(&prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus starts");
    let query = |q: &str| {
        let url = format!("http://127.0.0.1:{port}/api/v1/query");
        let url = reqwest::Url::parse_with_params(&url, &[("query", q)]).expect("url");
        let request = http.get(url);
        async move {
            let answer = request.send().await.ok()?;
            let body: serde_json::Value = answer.json().await.ok()?;
            body["data"]["result"].as_array().cloned()
        }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let hello = loop {
        let got = query("xagent_connector_packets_received_total{packet_type=\"connector.hello\"}")
            .await
            .unwrap_or_default();
        if let Some(series) = got.first() {
            break series.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "Prometheus never had the series");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let value: f64 = hello["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    assert!(value >= 1.0, "{hello}");
    assert_eq!(hello["metric"]["job"], "xagent");
    let up = query("up{job=\"xagent\"}").await.unwrap_or_default();
    assert_eq!(up.first().map(|s| s["value"][1].clone()), Some(serde_json::json!("1")), "{up:?}");
    let _ = server.kill().await;
    let _ = connector.kill().await;
}
