//! Test harness: runs the echo connector on 127.0.0.1:0 with a manual clock.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use xagent_protocol_types::{ManualClock, Secret};
use xagent_server_runtime::{ConnectorServer, RuntimeConfig, ServerBuilder, ToolSpec};
use xagent_testkit::{EchoState, WsClient, echo_connector};

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
    xagent_testkit::temp_state_dir(&format!("xsr-{name}"))
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
    let (addr, stop, join) = spawn_serving(&server, None).await;
    Harness { server, addr, clock, echo, dir, base, stop: Some(stop), join: Some(join) }
}

/// Serves `server` on `listener` (a fresh port of 127.0.0.1 when `None`) in a spawned task;
/// returns the address, the signal that stops it and the task.
pub async fn spawn_serving(
    server: &ConnectorServer,
    listener: Option<tokio::net::TcpListener>,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = match listener {
        Some(listener) => listener,
        None => tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    };
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
    (addr, stop, join)
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

// ---------------------------------------------------------------- custom connectors

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use xagent_protocol_types::{
    AuthField, AuthFlow, ChatMessage, DescriptorTarget, PROFILE_IM_V2, TargetDeclaration,
    TargetType,
};
use xagent_server_runtime::{
    AuthContext, AuthError, AuthStep, AuthValues, Binding, ChannelContext, Connector,
    ConnectorBuilder, DeliveryError, FinalDelivery, FlowHandler, ImTarget, ToolContext,
};
use xagent_testkit::{ECHO_CARD_ID, ECHO_FLOW};

/// Signs in at once with the echo form flow's `token` field (so `WsClient::sign_in` works).
pub struct InstantAuth;

impl FlowHandler for InstantAuth {
    async fn start(&self, _ctx: AuthContext, input: AuthValues) -> Result<AuthStep, AuthError> {
        let token = input.get("token").map(|t| t.expose().to_owned()).unwrap_or_default();
        Ok(AuthStep::Authenticated(
            Binding::new(DescriptorTarget::new("echo", "Echo account").with_label("Echo"))
                .with_secret("token", Secret::new(token)),
        ))
    }
}

/// An IM target that takes every message.
pub struct AcceptAll;

impl ImTarget for AcceptAll {
    async fn deliver(
        &self,
        _ctx: ChannelContext,
        _message: ChatMessage,
        _how: FinalDelivery,
    ) -> Result<(), DeliveryError> {
        Ok(())
    }
}

/// A Tool that blocks until the test releases it, counting its runs.
#[derive(Clone)]
pub struct Gate {
    pub runs: Arc<AtomicUsize>,
    pub started: Arc<tokio::sync::Notify>,
    pub release: Arc<tokio::sync::Semaphore>,
}

impl Gate {
    pub fn new() -> Self {
        Self {
            runs: Arc::new(AtomicUsize::new(0)),
            started: Arc::new(tokio::sync::Notify::new()),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }

    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Lets `n` waiting (or future) runs finish.
    pub fn open(&self, n: usize) {
        self.release.add_permits(n);
    }
}

/// Arguments of the gated Tool.
#[derive(Deserialize, JsonSchema)]
pub struct GateArgs {
    /// Echoed back in the result.
    pub text: String,
}

/// The echo Card identity (so `WsClient::hello` and `sign_in` work) with a gated `slow_work`
/// Tool and an instant form flow.
pub fn gated_connector(gate: &Gate) -> ConnectorBuilder {
    let gate = gate.clone();
    Connector::builder(ECHO_CARD_ID, "Gated", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "echo", "Echo"))
        .profile(PROFILE_IM_V2)
        .im_target(AcceptAll)
        .auth_flow_with(
            AuthFlow::form(
                ECHO_FLOW,
                TargetType::Im,
                "Sign in",
                vec![AuthField::password("token", "Token").required()],
            ),
            InstantAuth,
        )
        .tool::<GateArgs, _, _, _>(
            ToolSpec::new(
                "slow_work",
                concat!("Slow work", "\n", "Runs until the test releases it."),
            ),
            move |_ctx: ToolContext, args: GateArgs| {
                let gate = gate.clone();
                async move {
                    let run = gate.runs.fetch_add(1, Ordering::SeqCst) + 1;
                    gate.started.notify_one();
                    if let Ok(permit) = gate.release.acquire().await {
                        permit.forget();
                    }
                    Ok(json!({ "text": args.text, "run": run }))
                }
            },
        )
}

/// A server for any Connector on 127.0.0.1:0 (no API key), with a manual clock.
pub struct Custom {
    pub server: ConnectorServer,
    pub addr: SocketAddr,
    pub clock: ManualClock,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<tokio::task::JoinHandle<()>>,
}

pub async fn serve_custom(
    connector: Connector,
    config: RuntimeConfig,
    listener: Option<tokio::net::TcpListener>,
) -> Custom {
    serve_built(ConnectorServer::builder(connector).config(config), listener).await
}

/// A server for `connector` keeping its state in `dir` (serving it again over the same
/// directory is a restart), default config, no API key, a manual clock.
pub async fn serve_custom_in(connector: Connector, dir: &std::path::Path) -> Custom {
    serve_built(ConnectorServer::builder(connector).state_dir(dir).unwrap(), None).await
}

async fn serve_built(builder: ServerBuilder, listener: Option<tokio::net::TcpListener>) -> Custom {
    let clock = ManualClock::new(START);
    let server = builder.clock(clock.clone()).build().await.unwrap();
    let (addr, stop, join) = spawn_serving(&server, listener).await;
    Custom { server, addr, clock, stop: Some(stop), join: Some(join) }
}

impl Custom {
    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    pub async fn client(&self) -> WsClient {
        WsClient::connect(&self.ws_url(), None).await.unwrap()
    }

    /// Asks the server to stop (without waiting).
    pub fn signal_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    pub async fn stop(mut self) {
        self.signal_stop();
        if let Some(join) = self.join.take() {
            let _ = join.await;
        }
    }
}

// ---------------------------------------------------------------- the storage contract

/// Where a storage backend keeps its data: opening it again is a restart.
pub enum Place {
    /// SQLite in a temporary directory.
    Sqlite(tempfile::TempDir),
    /// A fresh database of testkit's PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(Box<xagent_server_runtime::ops::DatabaseUrl>),
}

impl Place {
    /// A SQLite place in a new temporary directory.
    pub fn sqlite() -> Self {
        Self::Sqlite(tempfile::tempdir().expect("a temporary directory"))
    }

    /// A PostgreSQL place: a fresh database of testkit's shared server.
    #[cfg(feature = "postgres")]
    pub async fn postgres() -> Self {
        let url = xagent_testkit::postgres::TestPostgres::shared().await.fresh_database().await;
        Self::Postgres(Box::new(url))
    }

    /// Opens (or reopens) the backend over this place.
    pub async fn open(&self) -> Arc<dyn xagent_server_runtime::storage::Storage> {
        match self {
            Self::Sqlite(dir) => Arc::new(
                xagent_server_runtime::storage::SqliteStorage::open(dir.path()).expect("opens"),
            ),
            #[cfg(feature = "postgres")]
            Self::Postgres(url) => Arc::new(
                xagent_server_runtime::storage::PostgresStorage::connect(url, Default::default())
                    .await
                    .expect("connects"),
            ),
        }
    }
}

/// Runs every case of the calling file's `cases` module (each an `async fn(&Place)`) on
/// SQLite and, with feature `postgres`, on PostgreSQL; `Place` must be in scope there.
#[allow(unused_macros)]
macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::cases::$case(&super::Place::sqlite()).await;
                }
            )*
        }

        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::cases::$case(&super::Place::postgres().await).await;
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use contract;
