//! Test harness: runs the echo connector on 127.0.0.1:0 with a manual clock.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use xagent_protocol_types::{ManualClock, Secret};
use xagent_server_runtime::testing::{EchoState, WsClient, echo_connector};
use xagent_server_runtime::{ConnectorServer, RuntimeConfig};

pub const API_KEY: &str = "sk-test-4f9c2a7d81e3b6";
pub const START: u64 = 1_790_000_000_000;

pub struct Harness {
    pub server: ConnectorServer,
    pub addr: SocketAddr,
    pub clock: ManualClock,
    pub echo: EchoState,
    pub dir: PathBuf,
    pub base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<tokio::task::JoinHandle<()>>,
}

pub fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("xsr-{name}-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000_007
}

pub async fn start(dir: PathBuf, clock: ManualClock, config: RuntimeConfig) -> Harness {
    let (connector, echo) = echo_connector();
    let base = config.base_path.clone();
    let server = ConnectorServer::builder(connector)
        .config(config)
        .state_dir(&dir)
        .unwrap()
        .clock(clock.clone())
        .api_key(Secret::new(API_KEY))
        .build()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = server.clone();
    let join = tokio::spawn(async move {
        running
            .serve(listener, async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Harness { server, addr, clock, echo, dir, base, stop: Some(stop), join: Some(join) }
}

pub async fn start_default() -> Harness {
    start(temp_dir("rt"), ManualClock::new(START), RuntimeConfig::default()).await
}

impl Harness {
    pub fn http(&self, path: &str) -> String {
        format!("http://{}{}{}", self.addr, self.base, path)
    }

    pub fn ws_url(&self) -> String {
        format!("ws://{}{}/ws", self.addr, self.base)
    }

    pub async fn client(&self) -> WsClient {
        WsClient::connect(&self.ws_url(), Some(API_KEY)).await.unwrap()
    }

    pub async fn stop(mut self) -> (PathBuf, ManualClock) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(join) = self.join.take() {
            let _ = join.await;
        }
        (self.dir.clone(), self.clock.clone())
    }
}
