//! Uploads 1 GiB through `POST /files/uploads` and measures the process's resident memory.
//! Run with `cargo test -p xagent-server-runtime --release --test upload_memory -- --ignored
//! --nocapture` (ignored by default: it writes 1 GiB to disk).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use xagent_file_transfer::StoreConfig;
use xagent_protocol_types::{ManualClock, Secret};
use xagent_server_runtime::{ConnectorServer, FilesConfig};
use xagent_testkit::{WsClient, echo_connector};

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes 1 GiB; run explicitly"]
async fn upload_of_one_gib_stays_within_64_mib_of_resident_memory() {
    const GIB: u64 = 1024 * 1024 * 1024;
    const CHUNK: usize = 256 * 1024;
    let dir = support::temp_dir("upload");
    let (connector, _) = echo_connector();
    let files = FilesConfig::new(dir.join("files"))
        .with_max_upload_bytes(2 * GIB)
        .with_store(StoreConfig::default().with_max_file_bytes(2 * GIB));
    let server = ConnectorServer::builder(connector)
        .state_dir(&dir)
        .unwrap()
        .files(files)
        .clock(ManualClock::new(support::START))
        .api_key(Secret::new(support::API_KEY))
        .build()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let running = server.clone();
    tokio::spawn(async move { running.serve(listener, std::future::pending()).await });
    let mut c =
        WsClient::connect(&format!("ws://{addr}/ws"), Some(support::API_KEY)).await.unwrap();
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;

    let at_rest = rss_kib();
    let peak = Arc::new(AtomicU64::new(at_rest));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(), Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        })
    };
    let chunk = Bytes::from(vec![0x5a_u8; CHUNK]);
    let chunks = (GIB / CHUNK as u64) as usize;
    let body = futures_util::stream::iter(
        (0..chunks).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
    );
    let part = reqwest::multipart::Part::stream_with_length(reqwest::Body::wrap_stream(body), GIB)
        .file_name("big.bin")
        .mime_str("application/octet-stream")
        .unwrap();
    let form = reqwest::multipart::Form::new().part("file", part);
    let started = std::time::Instant::now();
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/files/uploads"))
        .bearer_auth(support::API_KEY)
        .header("X-XAgent-Connector-Channel-ID", channel.as_str())
        .multipart(form)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: serde_json::Value = response.json().await.unwrap();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    let growth_mib = (peak.saturating_sub(at_rest)) as f64 / 1024.0;
    println!(
        "upload of 1 GiB: status {status}, {:.1} s, RSS at rest {:.1} MiB, peak {:.1} MiB, growth {growth_mib:.1} MiB",
        started.elapsed().as_secs_f64(),
        at_rest as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["byte_size"], GIB);
    assert!(growth_mib < 64.0, "resident memory grew by {growth_mib:.1} MiB");
    let _ = std::fs::remove_dir_all(dir);
}
