//! The Transfer Plane of two runtimes sharing one PostgreSQL database (feature `postgres`):
//! a file registered on one is downloaded from the other with the link the first signed, and
//! a file uploaded to the other is opened by the first. Neither has a state directory.

#![cfg(feature = "postgres")]

mod support;

use std::net::SocketAddr;

use support::{API_KEY, START};
use xagent_protocol_types::{FileRef, ManualClock, Secret};
use xagent_server_runtime::ConnectorServer;
use xagent_server_runtime::ops::DatabaseUrl;
use xagent_testkit::echo_connector;
use xagent_testkit::postgres::TestPostgres;

/// A running runtime on `url` with its address and stop signal.
struct Replica {
    server: ConnectorServer,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Replica {
    async fn start(url: &DatabaseUrl, clock: &ManualClock) -> Self {
        let (connector, _echo) = echo_connector();
        let server = ConnectorServer::builder(connector)
            .database_url(url.clone())
            .clock(clock.clone())
            .api_key(Secret::new(API_KEY))
            .build()
            .await
            .unwrap();
        let (addr, stop, _task) = support::spawn_serving(&server, None).await;
        Self { server, addr, stop: Some(stop) }
    }

    fn http(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_on_one_database_serve_each_others_files() {
    let url = TestPostgres::shared().await.fresh_database().await;
    let clock = ManualClock::new(START);
    let a = Replica::start(&url, &clock).await;
    let mut client =
        xagent_testkit::WsClient::connect(&format!("ws://{}/ws", a.addr), Some(API_KEY))
            .await
            .unwrap();
    client.hello(None).await;
    let (channel, _) = client.open_channel(None).await;
    client.sign_in(&channel, "tok-files").await;
    // B starts after the channel exists, so its channel table knows it.
    let b = Replica::start(&url, &clock).await;
    let http = reqwest::Client::new();

    let file = a
        .server
        .handle()
        .register_file(&channel, "cat.png", Some("image/png"), b"\x89PNGdata")
        .await
        .unwrap();
    let link = file.download_url.clone().unwrap();
    let got = http.get(b.http(&link)).send().await.unwrap();
    assert_eq!(got.status(), 200, "B accepts A's signature and finds A's file");
    assert_eq!(got.bytes().await.unwrap().as_ref(), b"\x89PNGdata");

    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(b"report body".to_vec()).file_name("r.txt"));
    let up = http
        .post(b.http("/files/uploads"))
        .bearer_auth(API_KEY)
        .header("X-XAgent-Connector-Channel-ID", channel.as_str())
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(up.status(), 200);
    let body: serde_json::Value = up.json().await.unwrap();
    let file_ref = FileRef::new(body["file_ref"].as_str().unwrap());
    let (record, mut reader) = a.server.handle().open_file(&channel, &file_ref).await.unwrap();
    assert_eq!(record.byte_size, 11);
    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut bytes).await.unwrap();
    assert_eq!(bytes, b"report body", "A reads what B stored: no shared disk");
}

/// PostgreSQL's group commit reports its transactions on the metrics listener as SQLite's
/// does (this binary keeps no state in SQLite, so every counted commit is PostgreSQL's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_group_commit_shows_on_the_metrics_listener() {
    let url = TestPostgres::shared().await.fresh_database().await;
    let clock = ManualClock::new(START);
    let a = Replica::start(&url, &clock).await;
    let mut client =
        xagent_testkit::WsClient::connect(&format!("ws://{}/ws", a.addr), Some(API_KEY))
            .await
            .unwrap();
    client.hello(None).await;
    let (channel, _) = client.open_channel(None).await;
    client.sign_in(&channel, "tok-metrics").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = listener.local_addr().unwrap();
    let serving = a.server.clone();
    tokio::spawn(async move { serving.serve_metrics(listener, std::future::pending()).await });
    let text =
        reqwest::get(format!("http://{metrics}/metrics")).await.unwrap().text().await.unwrap();
    let count = text
        .lines()
        .find_map(|l| l.strip_prefix("xagent_connector_storage_commit_batch_size_count "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(count > 0, "no commit counted:\n{text}");
    assert!(text.contains("xagent_connector_storage_commit_seconds_bucket"), "{text}");
}
