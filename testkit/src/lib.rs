//! # xagent-testkit (unpublished)
//!
//! Test support for the workspace: an "echo" IM v2 Connector built on the public author API
//! of `xagent-server-runtime` (a typed form flow with a secret `token` field, two Tools:
//! `echo_send`, and the read-only `echo_noop` for benchmarks), a running [`EchoServer`],
//! inbound-message injection, a small WebSocket client speaking the packet envelope,
//! private temporary state directories made with `tempfile`, and helpers for tests that run
//! the real binaries (their printed address, SIGTERM) or read a page's event stream. Used by
//! `server-runtime`'s integration tests, `client-runtime`, the cli, `im.webchat`'s tests and
//! xtask. [`module_layers`] is the one module-layer checker of the crates that keep their
//! modules layered. [`postgres`] gives tests a real PostgreSQL (one server per test process,
//! a fresh database per test), [`haproxy`] a real load balancer in front of test servers,
//! [`synapse`] a real Matrix homeserver.

pub mod haproxy;
pub mod module_layers;
pub mod postgres;
pub mod synapse;
mod watchdog;
mod ws_client;

pub use ws_client::{Received, WsClient, has_error, is_error_packet, payload_json};

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use xagent_profile_im::{ActivityAction, ActivityCapability};
use xagent_protocol_types::{
    ChatMessage, ConnectorChannelId, DescriptorTarget, ErrorCode, MessageId, PROFILE_IM_V2, Secret,
    Security, TargetDeclaration, TargetType, TrustLevel,
};
use xagent_server_runtime::{
    AuthContext, AuthError, AuthStep, Binding, BoundReason, ChannelContext, Connector,
    ConnectorHandle, DeliveryError, FinalDelivery, FlowSpec, HandleError, ImTarget, ToolContext,
    ToolError, ToolSpec,
};

/// Card id of the echo connector.
pub const ECHO_CARD_ID: &str = "im.echo";
/// Its form flow.
pub const ECHO_FLOW: &str = "echo_token";
/// The token the echo auth flow refuses (to test failures).
pub const ECHO_BAD_TOKEN: &str = "bad-token";
/// Message text the echo target refuses temporarily (`channel_busy`, retryable).
pub const ECHO_FAIL_TEMPORARY: &str = "fail-temporary";
/// Message text the echo target refuses for good (`target_delivery_failed`).
pub const ECHO_FAIL_PERMANENT: &str = "fail-permanent";

/// What happened inside the echo target system, for assertions.
#[derive(Clone, Debug, Default)]
pub struct EchoLog {
    /// Final messages delivered to the target, per channel.
    pub delivered: Vec<(ConnectorChannelId, ChatMessage, FinalDelivery)>,
    /// Texts sent by the `echo_send` tool.
    pub sent: Vec<(ConnectorChannelId, String)>,
    /// Activity indicator actions received.
    pub activities: Vec<(ConnectorChannelId, ActivityAction)>,
    /// Signed-out channels (logout or unregister).
    pub signed_out: Vec<ConnectorChannelId>,
    /// Restored channels at startup.
    pub restored: Vec<ConnectorChannelId>,
    /// Tokens seen by the target system, to prove they reach the author only as secrets.
    pub tokens_used: usize,
    /// Shared poller starts and stops.
    pub poller_starts: usize,
    /// Shared poller stops.
    pub poller_stops: usize,
    /// How long the target takes per delivery on a channel (none: at once); a slow target
    /// for isolation tests and benchmarks.
    pub delivery_delays: std::collections::HashMap<ConnectorChannelId, std::time::Duration>,
}

/// Shared view of the echo target's log.
#[derive(Clone, Debug, Default)]
pub struct EchoState(Arc<Mutex<EchoLog>>);

impl EchoState {
    /// The log.
    pub fn log(&self) -> MutexGuard<'_, EchoLog> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes every delivery on `channel` take `delay` (`None`: at once again).
    pub fn set_delivery_delay(
        &self,
        channel: &ConnectorChannelId,
        delay: Option<std::time::Duration>,
    ) {
        let mut log = self.log();
        match delay {
            Some(delay) => log.delivery_delays.insert(channel.clone(), delay),
            None => log.delivery_delays.remove(channel),
        };
    }
}

/// The echo form flow's input.
#[derive(Deserialize, JsonSchema)]
pub struct EchoForm {
    /// Echo token
    pub token: Secret,
}

async fn echo_sign_in(ctx: AuthContext<EchoState>, form: EchoForm) -> Result<AuthStep, AuthError> {
    if form.token.matches(ECHO_BAD_TOKEN) {
        return Ok(AuthStep::Failed("the echo service refused the token".into()));
    }
    ctx.state().log().tokens_used += 1;
    let hint =
        format!("echo {}***", ctx.channel.as_str().chars().skip(4).take(4).collect::<String>());
    let binding = Binding::new(
        DescriptorTarget::new("echo", format!("Echo {hint}"))
            .with_label("Echo")
            .with_account_hint(hint),
    )
    .with_secret("token", form.token);
    Ok(AuthStep::Authenticated(binding))
}

/// One shared poller for every bound channel (signed in or restored).
async fn echo_bound(ctx: ChannelContext<EchoState>, reason: BoundReason) {
    let poller = ctx.state().clone();
    ctx.handle.attach_consumer("echo-poller", &ctx.channel, move || {
        poller.log().poller_starts += 1;
        Box::new(move || poller.log().poller_stops += 1)
    });
    if reason == BoundReason::Restored {
        ctx.state().log().restored.push(ctx.channel.clone());
    }
}

/// The echo target system: its log is the Connector's state.
struct EchoTarget;

impl ImTarget<EchoState> for EchoTarget {
    async fn deliver(
        &self,
        ctx: ChannelContext<EchoState>,
        message: ChatMessage,
        how: FinalDelivery,
    ) -> Result<(), DeliveryError> {
        match message.text.as_deref() {
            Some(ECHO_FAIL_TEMPORARY) => {
                return Err(DeliveryError::temporary(
                    ErrorCode::ChannelBusy,
                    "the echo service is busy",
                ));
            }
            Some(ECHO_FAIL_PERMANENT) => {
                return Err(DeliveryError::permanent(
                    ErrorCode::TargetDeliveryFailed,
                    "the echo service refused the message",
                ));
            }
            _ => {}
        }
        let delay = ctx.state().log().delivery_delays.get(&ctx.channel).copied();
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        ctx.state().log().delivered.push((ctx.channel.clone(), message, how));
        Ok(())
    }

    const ACTIVITY: ActivityCapability = ActivityCapability::CustomStatus;

    async fn activity(&self, ctx: ChannelContext<EchoState>, action: ActivityAction) {
        ctx.state().log().activities.push((ctx.channel.clone(), action));
    }
}

/// Arguments of `echo_send`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct EchoSendArgs {
    /// Text to send to the echo contact.
    pub text: String,
}

/// Arguments of `echo_noop` (none).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct NoArgs {}

/// The primary Skill of the echo connector.
pub const ECHO_SKILL: &str = "---\nname: connector-im-echo\ndescription: Reply to Echo messages.\n---\n\nUse `echo_send` to reply on the current channel.\n";

/// Builds the echo connector and the shared view of its target.
pub fn echo_connector() -> (Connector, EchoState) {
    let state = EchoState::default();
    let connector = Connector::builder(ECHO_CARD_ID, "Echo Connector", "0.1.0")
        .description("Echoes IM messages; the test connector of xagent-server-runtime.")
        .vendor("xagent-connector-rs")
        .target(TargetDeclaration::new(TargetType::Im, "echo", "Echo"))
        .profile(PROFILE_IM_V2)
        .security(Security::new(TrustLevel::Local, true).with_data_class("message"))
        // The log is also returned to the test, so the state is a clone of it.
        .state(state.clone())
        .form_flow(FlowSpec::new(ECHO_FLOW, "Bind an Echo account"), echo_sign_in)
        .on_bound(echo_bound)
        .on_unbound(|ctx: ChannelContext<EchoState>| {
            ctx.state().log().signed_out.push(ctx.channel.clone());
            async { Ok(()) }
        })
        .im_target(EchoTarget)
        .skill(ECHO_SKILL)
        .tool(
            ToolSpec::new(
                "echo_send",
                "Send an Echo message\nSend text to the Echo contact bound to the current channel.",
            ),
            |ctx: ToolContext<EchoState>, args: EchoSendArgs| async move {
                if args.text.is_empty() {
                    return Err(ToolError::failed("text must not be empty"));
                }
                if ctx.binding.secret("token").is_none() {
                    return Err(ToolError::permission_denied("the channel has no token"));
                }
                ctx.progress("sending", Some(0.5)).await;
                let n = {
                    let mut log = ctx.state().log();
                    log.sent.push((ctx.channel.clone(), args.text.clone()));
                    log.sent.len()
                };
                Ok(json!({ "status": "sent", "message_id": format!("echo_{n}") }))
            },
        )
        .tool(
            ToolSpec::new("echo_noop", "Do nothing\nReturns an empty object; for benchmarks.")
                .read_only(),
            |_ctx: ToolContext<EchoState>, _args: NoArgs| async { Ok(json!({})) },
        )
        .build();
    match connector {
        Ok(connector) => (connector, state),
        Err(error) => panic!("the echo connector definition is valid: {error}"),
    }
}

/// Binds `addr` on the loopback (waiting up to 5 s for the port to be free again, as after a
/// restart) or, without one, a fresh port on 127.0.0.1.
pub async fn bind_local(
    addr: Option<std::net::SocketAddr>,
) -> Result<tokio::net::TcpListener, String> {
    let bind = addr.unwrap_or_else(|| std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let mut attempts = 0;
    loop {
        match tokio::net::TcpListener::bind(bind).await {
            Ok(listener) => return Ok(listener),
            Err(_) if addr.is_some() && attempts < 100 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => return Err(format!("binding {bind}: {error}")),
        }
    }
}

/// What a served task is told to stop with: it completes at [`Serving::stop`] or when the
/// `Serving` is dropped.
pub type Shutdown = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A server (a `ConnectorServer`, a reference Connector) serving `listener` in a spawned task,
/// the way every test outside `server-runtime` runs one.
#[derive(Debug)]
pub struct Serving {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: tokio::task::JoinHandle<()>,
}

impl Serving {
    /// Spawns `serve(listener, shutdown)`; `serve` is typically
    /// `|listener, shutdown| async move { let _ = server.serve(listener, shutdown).await; }`.
    pub fn spawn<F, Fut>(listener: tokio::net::TcpListener, serve: F) -> Serving
    where
        F: FnOnce(tokio::net::TcpListener, Shutdown) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let addr = match listener.local_addr() {
            Ok(addr) => addr,
            Err(error) => panic!("the listener has no address: {error}"),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown: Shutdown = Box::pin(async move {
            let _ = stopped.await;
        });
        let join = tokio::spawn(serve(listener, shutdown));
        Serving { addr, stop: Some(stop), join }
    }

    /// The Base URL, `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Tells the task to stop and waits (up to 10 s) until it has.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), self.join).await;
    }
}

/// A running echo connector on 127.0.0.1 with the system clock, for tests in other crates.
pub struct EchoServer {
    /// The server.
    pub server: xagent_server_runtime::ConnectorServer,
    /// The echo target's log.
    pub echo: EchoState,
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    serving: Serving,
}

impl EchoServer {
    /// Serves the echo connector with state under `dir` and the given system API key, on
    /// `addr` (see [`bind_local`]) or on a fresh port.
    pub async fn start(
        dir: &std::path::Path,
        api_key: &str,
        addr: Option<std::net::SocketAddr>,
    ) -> Result<Self, String> {
        let (connector, echo) = echo_connector();
        let server = xagent_server_runtime::ConnectorServer::builder(connector)
            .state_dir(dir)
            .map_err(|e| e.to_string())?
            .api_key(xagent_protocol_types::Secret::new(api_key))
            .build()
            .await
            .map_err(|e| e.to_string())?;
        let running = server.clone();
        let serving = Serving::spawn(bind_local(addr).await?, |listener, shutdown| async move {
            let _ = running.serve(listener, shutdown).await;
        });
        Ok(Self { server, echo, addr: serving.addr, serving })
    }

    /// The Base URL, `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Shuts the server down and waits (up to 10 s) until it has stopped.
    pub async fn stop(self) {
        self.server.shutdown();
        self.serving.stop().await;
    }
}

/// A fresh, private (mode 0700) temporary directory for a test's state, made with `tempfile`.
/// It is kept after the test (servers may still write to it while a test ends); the system's
/// temporary directory cleanup removes it.
pub fn temp_state_dir(name: &str) -> std::path::PathBuf {
    let made = tempfile::Builder::new().prefix(&format!("xagent-{name}-")).tempdir();
    match made {
        Ok(dir) => dir.keep(),
        Err(error) => panic!("cannot create a temporary state directory: {error}"),
    }
}

/// Hands an inbound echo message to xAgent (the "target system received a message" event).
pub async fn inject_message(
    handle: &ConnectorHandle,
    channel: &ConnectorChannelId,
    message_id: &str,
    text: &str,
) -> Result<(), HandleError> {
    let message =
        ChatMessage::text(MessageId::new(message_id), text).created_at(handle.now_millis());
    handle.send_message(channel, message).await
}

/// The data of the first complete server-sent event of `response` as JSON (a page's event
/// stream opens with the room's snapshot). Each chunk waits at most 5 s.
pub async fn first_sse_event(mut response: reqwest::Response) -> Value {
    let mut text = String::new();
    loop {
        let chunk = match tokio::time::timeout(Duration::from_secs(5), response.chunk()).await {
            Ok(Ok(Some(chunk))) => chunk,
            Ok(Ok(None)) => panic!("the event stream ended before a complete event: {text:?}"),
            Ok(Err(error)) => panic!("reading the event stream failed: {error}"),
            Err(_) => panic!("no event within 5 s: {text:?}"),
        };
        text.push_str(&String::from_utf8_lossy(&chunk));
        if let Some(line) = text.lines().find(|l| l.starts_with("data: "))
            && text.contains("\n\n")
        {
            match serde_json::from_str(&line["data: ".len()..]) {
                Ok(value) => return value,
                Err(error) => panic!("the event is not JSON ({error}): {line}"),
            }
        }
    }
}

/// Reads `lines` (a child process's stdout or stderr) until a line contains `needle` and
/// returns that line; the lines before it are skipped. Waits at most 30 s. Tests use it to
/// learn the address a command prints once it listens.
pub async fn line_containing<R>(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<R>>,
    needle: &str,
) -> String
where
    R: tokio::io::AsyncRead + Unpin,
{
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains(needle) {
                return Some(line);
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(line)) => line,
        Ok(None) => panic!("the output ended without a line containing {needle:?}"),
        Err(_) => panic!("no line containing {needle:?} within 30 s"),
    }
}

/// Sends SIGTERM to `child` (what service managers and `docker stop` send) and returns its
/// exit status, waiting at most 20 s: a command that handles SIGTERM exits with its own
/// status, one that does not dies of the signal (no exit code).
#[cfg(unix)]
pub async fn terminate(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    let Some(pid) = child.id() else { panic!("the process has already exited") };
    let sent = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    assert!(
        sent.as_ref().is_ok_and(|status| status.success()),
        "kill -TERM {pid} failed: {sent:?}"
    );
    match tokio::time::timeout(Duration::from_secs(20), child.wait()).await {
        Ok(Ok(status)) => status,
        Ok(Err(error)) => panic!("cannot wait for {pid}: {error}"),
        Err(_) => panic!("{pid} still runs 20 s after SIGTERM"),
    }
}

/// Serves `server` on a free port of 127.0.0.1 in the background until the test process ends;
/// returns the address.
pub async fn serve_on_loopback(
    server: &xagent_server_runtime::ConnectorServer,
) -> std::net::SocketAddr {
    let listener =
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    let running = server.clone();
    tokio::spawn(async move {
        let _ = running.serve(listener, std::future::pending::<()>()).await;
    });
    addr
}
