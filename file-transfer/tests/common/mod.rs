//! Shared test harness: a temporary store directory, a tiny channel directory and a real
//! server on 127.0.0.1:0.

#![allow(dead_code)]

pub mod memory;

use std::collections::HashSet;
use std::path::PathBuf;

use xagent_file_transfer::{ChannelDirectory, FileStore, StoreConfig, TransferState, UrlSigner};
use xagent_protocol_types::{ConnectorChannelId, ManualClock, Secret};

/// Start of the simulated clock (Unix ms).
pub const START: u64 = 1_800_000_000_000;
/// The system API key the test server expects.
pub const API_KEY: &str = "test-system-api-key";
/// Channels the test directory knows.
pub const CHANNEL_A: &str = "cch_a";
/// A second known channel.
pub const CHANNEL_B: &str = "cch_b";

/// A directory under the system temp dir, deleted on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        let mut bytes = [0u8; 8];
        rand::fill(&mut bytes[..]);
        Self(std::env::temp_dir().join(format!("xft-{label}-{}", hex::encode(bytes))))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Knows a fixed set of channels.
pub struct Channels(pub HashSet<ConnectorChannelId>);

impl ChannelDirectory for Channels {
    async fn channel_exists(&self, channel: &ConnectorChannelId) -> bool {
        self.0.contains(channel)
    }
}

/// A running Transfer Plane.
pub struct Server {
    pub base: String,
    pub store: FileStore,
    pub clock: ManualClock,
    pub client: reqwest::Client,
    pub task: tokio::task::JoinHandle<()>,
    pub dir: TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Starts a server with the API key and the given upload limit, under the prefix `/prefix`
/// (as the runtime mounts it under a Base URL path).
pub async fn start(max_upload_bytes: u64) -> Server {
    start_with(max_upload_bytes, StoreConfig::default()).await
}

/// Like [`start`] with a store configuration.
pub async fn start_with(max_upload_bytes: u64, config: StoreConfig) -> Server {
    start_full(max_upload_bytes, config, Some(API_KEY)).await
}

/// A server with the given store configuration and system API key (`None`: no key configured).
pub async fn start_full(
    max_upload_bytes: u64,
    config: StoreConfig,
    api_key: Option<&str>,
) -> Server {
    let dir = TempDir::new("http");
    let clock = ManualClock::new(START);
    let store = FileStore::open(&dir.0, config, signer(), clock.clone()).await.unwrap();
    serve(store, clock, dir, max_upload_bytes, api_key).await
}

/// The signer of the test servers (URLs under `/prefix`).
pub fn signer() -> UrlSigner {
    UrlSigner::new(Secret::new("integration-test-url-secret")).unwrap().with_base("/prefix")
}

/// Serves `store` (whose clock is `clock`) like [`start_full`].
pub async fn serve(
    store: FileStore,
    clock: ManualClock,
    dir: TempDir,
    max_upload_bytes: u64,
    api_key: Option<&str>,
) -> Server {
    let channels =
        Channels([CHANNEL_A, CHANNEL_B].into_iter().map(ConnectorChannelId::new).collect());
    let router = TransferState::new(store.clone(), channels)
        .with_api_key(api_key.map(Secret::new))
        .with_max_upload_bytes(max_upload_bytes)
        .into_router();
    let app = axum::Router::new().nest("/prefix", router);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server {
        base: format!("http://{address}"),
        store,
        clock,
        client: reqwest::Client::new(),
        task,
        dir,
    }
}

/// Resident memory of this process, in KiB (`VmRSS`), and its peak so far (`VmHWM`).
pub fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}
