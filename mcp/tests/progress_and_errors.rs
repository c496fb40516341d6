//! The official Rust MCP SDK's client (rmcp, a peer this repository did not write) drives the
//! bridge over an in-memory pipe, and the bridge drives a real `server-runtime` Connector over
//! WebSocket on 127.0.0.1: a Tool's `tool.progress.push`es arrive as MCP progress notifications
//! of that call, a Tool's error arrives as an MCP tool error carrying the Connector's wire code,
//! and a `subscriptions/listen` subscription (protocol 2026-07-28) hears of a stored inbound
//! message and of a Tool the Connector turned off.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ProgressNotificationParam, ProtocolVersion, ServerNotification,
    SubscriptionFilter,
};
use rmcp::service::{NotificationContext, RoleClient, ServiceExt};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt};
use serde_json::{Map, Value, json};
use xagent_mcp::annotations::AnnotationOverrides;
use xagent_mcp::{BridgeConfig, LinkConfig, McpBridge};
use xagent_protocol_types::{AuthInput, DescriptorTool, ToolStatus};
use xagent_server_runtime::prelude::{
    AuthStep, Binding, ChatMessage, Connector, ConnectorServer, DescriptorTarget, Deserialize,
    ErrorCode, FlowSpec, JsonSchema, PROFILE_IM_V1, PROFILE_IM_V2, Secret, TargetDeclaration,
    TargetType, ToolContext, ToolError, ToolSpec,
};

const API_KEY: &str = "sk-mcp-progress-test-7d1e";
const FLOW: &str = "work_token";

#[derive(Deserialize, JsonSchema)]
struct TokenForm {
    /// Token
    token: Secret,
}

/// No arguments.
#[derive(Debug, Deserialize, JsonSchema)]
struct NoArgs {}

/// Arguments of `work_run`.
#[derive(Debug, Deserialize, JsonSchema)]
struct RunArgs {
    /// How many steps.
    steps: u32,
}

fn connector() -> Connector {
    versioned_connector("1.0.0", false)
}

/// The test Connector at `version`, with a second Tool `work_report` when `report`.
fn versioned_connector(version: &str, report: bool) -> Connector {
    let builder = Connector::builder("im.work", "Work", version)
        .target(TargetDeclaration::new(TargetType::Im, "work", "Work queue"))
        .profile(PROFILE_IM_V2)
        .form_flow(FlowSpec::new(FLOW, "Token"), |_, form: TokenForm| async move {
            let account = Binding::new(DescriptorTarget::new("work", "Work queue"));
            Ok(AuthStep::Authenticated(account.with_secret("token", form.token)))
        })
        .on_message(|_, _message| async {})
        .tool(
            ToolSpec::new(
                "work_run",
                "Run a job\nRuns a job in steps and reports progress; more than 5 steps is refused.",
            ),
            |ctx: ToolContext, args: RunArgs| async move {
                if args.steps > 5 {
                    return Err(ToolError::new(
                        ErrorCode::InvalidArguments,
                        "at most 5 steps, please",
                    ));
                }
                for step in 1..=args.steps {
                    let fraction = f64::from(step) / f64::from(args.steps);
                    ctx.progress(format!("step {step}"), Some(fraction)).await;
                }
                Ok(json!({ "done": args.steps }))
            },
        );
    let builder = if report {
        builder
            .skill("---\nname: connector-im-work\ndescription: How to run jobs.\n---\n# Work\nCall work_report before work_run.\n")
            .tool(
            ToolSpec::new("work_report", "Report\nReports the queue's state.").read_only(),
            |_ctx: ToolContext, _args: NoArgs| async move { Ok(json!({ "queued": 0 })) },
        )
    } else {
        builder
    };
    match builder.build() {
        Ok(connector) => connector,
        Err(error) => panic!("the test Connector is valid: {error}"),
    }
}

#[derive(Clone, Default)]
struct Client {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    prompts_changed: Arc<std::sync::atomic::AtomicUsize>,
    tools_changed: Arc<std::sync::atomic::AtomicUsize>,
}

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.tools_changed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.prompts_changed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(params);
    }
}

fn arguments(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// A running test Connector, a bridge signed in to it, and rmcp's client connected to the
/// bridge over an in-memory pipe.
struct Setup {
    _dir: tempfile::TempDir,
    server: ConnectorServer,
    link: std::sync::Arc<xagent_mcp::Link>,
    client: rmcp::service::RunningService<RoleClient, Client>,
    handler: Client,
}

/// `lifecycle`: the legacy `initialize` handshake, or the 2026-07-28 `server/discover`.
async fn setup(lifecycle: ClientLifecycleMode) -> Setup {
    match setup_with(lifecycle, connector(), AnnotationOverrides::default()).await {
        Ok(setup) => setup,
        Err(error) => panic!("the bridge connects: {error}"),
    }
}

/// [`setup`] with a given Connector and the operator's tool annotations.
async fn setup_with(
    lifecycle: ClientLifecycleMode,
    connector: Connector,
    tool_annotations: AnnotationOverrides,
) -> Result<Setup, xagent_mcp::LinkError> {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let server = ConnectorServer::builder(connector)
        .state_dir(dir.path().join("connector"))
        .unwrap_or_else(|e| panic!("state dir: {e}"))
        .api_key(Secret::new(API_KEY))
        .build()
        .await
        .unwrap_or_else(|e| panic!("server: {e}"));
    let addr = xagent_testkit::serve_on_loopback(&server).await;

    let link = xagent_mcp::connect(BridgeConfig {
        link: LinkConfig {
            api_key: Some(Secret::new(API_KEY)),
            flow: Some(FLOW.into()),
            inputs: AuthInput::default().with("token", "t-123"),
            tool_annotations,
            ..LinkConfig::new(format!("http://{addr}"))
        },
        state_dir: dir.path().join("bridge"),
    })
    .await?;

    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let (server_read, server_write) = tokio::io::split(server_io);
    let (client_read, client_write) = tokio::io::split(client_io);
    let served = link.clone();
    tokio::spawn(async move {
        if let Ok(service) = McpBridge::new(served).serve((server_read, server_write)).await {
            let _ = service.waiting().await;
        }
    });
    let handler = Client::default();
    let client = handler
        .clone()
        .serve_with_lifecycle((client_read, client_write), lifecycle)
        .await
        .unwrap_or_else(|e| panic!("the MCP client connects: {e}"));

    Ok(Setup { _dir: dir, server, link, client, handler })
}

#[tokio::test]
async fn tools_list_carries_annotations_derived_from_the_card_and_overridden_by_the_operator() {
    let overrides = AnnotationOverrides::parse(
        r#"{"work_run": {"destructiveHint": false, "title": "Run a job now"},
            "connector_message_wait": {"openWorldHint": false}}"#,
    )
    .unwrap_or_else(|e| panic!("parses: {e}"));
    let setup =
        setup_with(ClientLifecycleMode::Initialize, versioned_connector("1.0.0", true), overrides)
            .await
            .unwrap_or_else(|e| panic!("the bridge connects: {e}"));
    let tools = setup.client.list_all_tools().await.unwrap_or_else(|e| panic!("tools/list: {e}"));
    let annotations = |name: &str| {
        let tool = tools.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name} listed"));
        serde_json::to_value(tool.annotations.clone()).unwrap_or_default()
    };
    // Read-only in the Connector's code, so in the Card, so for the host.
    assert_eq!(
        annotations("work_report"),
        json!({"title": "Report", "readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": true})
    );
    // A Tool with side effects, with the operator's title and destructiveHint over the derived.
    assert_eq!(
        annotations("work_run"),
        json!({"title": "Run a job now", "readOnlyHint": false, "destructiveHint": false, "idempotentHint": false, "openWorldHint": true})
    );
    assert_eq!(annotations("connector_message_wait")["readOnlyHint"], json!(true));
    assert_eq!(annotations("connector_message_wait")["openWorldHint"], json!(false));
    assert_eq!(annotations("connector_message_send")["readOnlyHint"], json!(false));
    assert_eq!(annotations("connector_channels_list")["readOnlyHint"], json!(true));
    setup.server.shutdown();
}

#[tokio::test]
async fn a_legacy_im_v1_connector_is_refused_at_start_saying_its_messages_would_be_lost() {
    let legacy = Connector::builder("im.legacy", "Legacy", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "legacy", "Legacy chat"))
        .profile(PROFILE_IM_V1)
        .form_flow(FlowSpec::new(FLOW, "Token"), |_, form: TokenForm| async move {
            let account = Binding::new(DescriptorTarget::new("legacy", "Legacy chat"));
            Ok(AuthStep::Authenticated(account.with_secret("token", form.token)))
        })
        .on_message(|_, _message| async {})
        .build()
        .unwrap_or_else(|e| panic!("the legacy Connector is valid: {e}"));
    let started = tokio::time::Instant::now();
    let refused =
        setup_with(ClientLifecycleMode::Initialize, legacy, AnnotationOverrides::default()).await;
    let Err(error) = refused else {
        panic!("a bridge that would lose every message does not start")
    };
    let text = error.to_string();
    assert!(text.contains("xagent.im.v1") && text.contains("not handed to the agent"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(20), "refused at admission, not after a wait");
}

#[tokio::test]
async fn tool_annotations_naming_a_tool_the_connector_lacks_stop_the_bridge_with_its_name() {
    let overrides = AnnotationOverrides::parse(r#"{"work_rnu": {"readOnlyHint": true}}"#)
        .unwrap_or_else(|e| panic!("parses: {e}"));
    let refused = setup_with(ClientLifecycleMode::Initialize, connector(), overrides).await;
    let Err(error) = refused else { panic!("a misspelt Tool name is refused") };
    let text = error.to_string();
    assert!(text.contains("work_rnu") && text.contains("work_run"), "{text}");
}

#[tokio::test]
async fn progress_pushes_become_mcp_progress_and_tool_errors_keep_the_wire_code() {
    let Setup { _dir, server, client, handler, .. } = setup(ClientLifecycleMode::Initialize).await;
    let tools = client.list_all_tools().await.unwrap_or_else(|e| panic!("tools/list: {e}"));
    assert!(tools.iter().any(|t| t.name == "work_run"), "work_run is listed");

    // Progress: three pushes, three notifications with the call's progress token (rmcp's
    // client puts one on every request), growing.
    let call =
        CallToolRequestParams::new("work_run").with_arguments(arguments(json!({"steps": 3})));
    let result = client.call_tool(call).await.unwrap_or_else(|e| panic!("tools/call: {e}"));
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(result.structured_content, Some(json!({"done": 3})));
    // Notifications may trail the result by a moment.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let progress = loop {
        let seen =
            handler.progress.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if seen.len() >= 3 || tokio::time::Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(progress.len(), 3, "{progress:?}");
    let call_token = &progress[0].progress_token;
    assert!(progress.iter().all(|p| &p.progress_token == call_token), "{progress:?}");
    let values: Vec<f64> = progress.iter().map(|p| p.progress).collect();
    assert!(values.windows(2).all(|w| w[0] < w[1]), "progress grows: {values:?}");
    assert_eq!(progress.last().map(|p| (p.progress, p.total)), Some((1.0, Some(1.0))));
    assert_eq!(progress[0].message.as_deref(), Some("step 1"));

    // A Tool error: an MCP tool error (not a protocol error) with the Connector's code.
    let refused = client
        .call_tool(
            CallToolRequestParams::new("work_run").with_arguments(arguments(json!({"steps": 9}))),
        )
        .await
        .unwrap_or_else(|e| panic!("tools/call: {e}"));
    assert_eq!(refused.is_error, Some(true));
    let error = refused.structured_content.unwrap_or_default();
    assert_eq!(error["error"]["code"], "invalid_arguments");
    assert_eq!(error["error"]["message"], "at most 5 steps, please");

    let _ = client.cancel().await;
    server.shutdown();
}

#[tokio::test]
async fn listen_subscriptions_get_tool_list_and_resource_updates() {
    let modern =
        ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
    let Setup { _dir, server, link, client, .. } = setup(modern).await;
    let channel = link.channel_id().unwrap_or_else(|| panic!("the bridge has a channel"));
    let uri = xagent_mcp::server::channel_uri(channel.as_str());
    // The 2026-07-28 way: one subscriptions/listen request for list changes and a resource.
    let filter = SubscriptionFilter::builder()
        .tools_list_changed()
        .resource_subscription(uri.clone())
        .build();
    let mut subscription =
        client.listen(filter).await.unwrap_or_else(|e| panic!("subscriptions/listen: {e}"));

    // A message from the target: stored, then announced on the subscription.
    let handle = server.handle();
    handle
        .send_message(&channel, ChatMessage::text("msg_target_1", "from the target"))
        .await
        .unwrap_or_else(|e| panic!("send_message: {e}"));
    match next(&mut subscription).await {
        ServerNotification::ResourceUpdatedNotification(updated) => {
            assert_eq!(updated.params.uri, uri);
        }
        other => panic!("expected resources/updated, got {other:?}"),
    }
    assert_eq!(link.inbox().pending(None).await.ok(), Some(1), "stored before the notification");

    // The Connector turns work_run off: the list changes and work_run is gone.
    handle
        .set_tool_status(
            &channel,
            DescriptorTool::new("work_run", ToolStatus::Unavailable).with_reason("maintenance"),
        )
        .await
        .unwrap_or_else(|e| panic!("set_tool_status: {e}"));
    match next(&mut subscription).await {
        ServerNotification::ToolListChangedNotification(_) => {}
        other => panic!("expected tools/list_changed, got {other:?}"),
    }
    let tools = client.list_all_tools().await.unwrap_or_else(|e| panic!("tools/list: {e}"));
    assert!(!tools.iter().any(|t| t.name == "work_run"), "work_run is gone");
    assert!(tools.iter().any(|t| t.name == "connector_message_wait"), "the built-ins stay");

    let _ = client.cancel().await;
    server.shutdown();
}

async fn next(subscription: &mut rmcp::service::Subscription) -> ServerNotification {
    match tokio::time::timeout(Duration::from_secs(10), subscription.next()).await {
        Ok(Ok(Some(notification))) => notification,
        other => panic!("no notification: {other:?}"),
    }
}

/// Serves `connector` with state in `dir` on `addr` (retrying the bind while a stopped server
/// releases it); returns the server and its serving task.
async fn serve_at(
    connector: Connector,
    dir: &std::path::Path,
    addr: std::net::SocketAddr,
) -> (ConnectorServer, tokio::task::JoinHandle<()>) {
    let server = ConnectorServer::builder(connector)
        .state_dir(dir)
        .unwrap_or_else(|e| panic!("state dir: {e}"))
        .api_key(Secret::new(API_KEY))
        .build()
        .await
        .unwrap_or_else(|e| panic!("server: {e}"));
    let mut attempts = 0;
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => break listener,
            Err(_) if attempts < 100 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("bind {addr}: {error}"),
        }
    };
    let running = server.clone();
    let stop = server.handle().shutdown_signal();
    let task = tokio::spawn(async move {
        let _ = running.serve(listener, async move { stop.cancelled_owned().await }).await;
    });
    (server, task)
}

/// A bridge to the Connector at `addr` whose health monitor probes every 200 ms, and rmcp's
/// client on it.
async fn probing_bridge(
    addr: std::net::SocketAddr,
    dir: &std::path::Path,
) -> (Arc<xagent_mcp::Link>, rmcp::service::RunningService<RoleClient, Client>, Client) {
    let link = xagent_mcp::connect(BridgeConfig {
        link: LinkConfig {
            api_key: Some(Secret::new(API_KEY)),
            flow: Some(FLOW.into()),
            inputs: AuthInput::default().with("token", "t-123"),
            health_interval: Duration::from_millis(200),
            ..LinkConfig::new(format!("http://{addr}"))
        },
        state_dir: dir.join("bridge"),
    })
    .await
    .unwrap_or_else(|e| panic!("the bridge connects: {e}"));
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let (server_read, server_write) = tokio::io::split(server_io);
    let served = link.clone();
    tokio::spawn(async move {
        if let Ok(service) = McpBridge::new(served).serve((server_read, server_write)).await {
            let _ = service.waiting().await;
        }
    });
    let handler = Client::default();
    let (client_read, client_write) = tokio::io::split(client_io);
    let client = handler
        .clone()
        .serve_with_lifecycle((client_read, client_write), ClientLifecycleMode::Initialize)
        .await
        .unwrap_or_else(|e| panic!("the MCP client connects: {e}"));
    (link, client, handler)
}

fn names(tools: Vec<rmcp::model::Tool>) -> Vec<String> {
    tools.into_iter().map(|t| t.name.to_string()).collect()
}

/// Polls `client`'s tools/list until `done` holds (at most 20 s).
async fn tools_until(
    client: &rmcp::service::RunningService<RoleClient, Client>,
    what: &str,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = names(client.list_all_tools().await.unwrap_or_default());
        if done(&now) {
            return now;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: still {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_offline_connectors_tools_are_withdrawn_and_come_back_when_it_answers_again() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let state = dir.path().join("connector");
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = free.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    drop(free);
    let (server, task) = serve_at(connector(), &state, addr).await;
    let (link, client, handler) = probing_bridge(addr, dir.path()).await;
    tools_until(&client, "listed at first", |now| now.contains(&"work_run".to_owned())).await;
    let changed = || handler.tools_changed.load(std::sync::atomic::Ordering::SeqCst);
    let before = changed();

    server.shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    let gone = tools_until(&client, "withdrawn while offline", |now| {
        !now.contains(&"work_run".to_owned())
    })
    .await;
    assert!(gone.contains(&"connector_message_wait".to_owned()), "the bridge's own Tools stay");
    assert!(link.withdrawn().is_some());
    assert!(changed() > before, "the client heard tools/list_changed");
    let call =
        CallToolRequestParams::new("work_run").with_arguments(arguments(json!({"steps": 1})));
    let refused = client.call_tool(call).await.unwrap_or_else(|e| panic!("tools/call: {e}"));
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    let code = refused.structured_content.as_ref().and_then(|c| c["error"]["code"].as_str());
    assert_eq!(code, Some("connector_channel_unavailable"), "{refused:?}");

    let (back, _task) = serve_at(connector(), &state, addr).await;
    tools_until(&client, "back once it answers", |now| now.contains(&"work_run".to_owned())).await;
    assert!(link.withdrawn().is_none());
    let _ = client.cancel().await;
    back.shutdown();
}

#[tokio::test]
async fn an_upgraded_connector_is_readmitted_and_its_new_tool_announced() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let state = dir.path().join("connector");
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = free.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    drop(free);
    let (server, task) = serve_at(versioned_connector("1.0.0", false), &state, addr).await;
    let (link, client, handler) = probing_bridge(addr, dir.path()).await;
    let before = names(client.list_all_tools().await.unwrap_or_default());
    assert!(before.contains(&"work_run".to_owned()) && !before.contains(&"work_report".to_owned()));
    assert!(client.list_all_prompts().await.unwrap_or_default().is_empty(), "1.0.0 has no Skill");

    // The Connector is upgraded in place: same state, version 1.0.1 with a new Tool.
    // A graceful stop closes every connection, as a process exit would.
    server.shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    let (upgraded, _task) = serve_at(versioned_connector("1.0.1", true), &state, addr).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let version = || link.card().map(|card| card.connector.version.clone()).unwrap_or_default();
    while version() != "1.0.1"
        || handler.prompts_changed.load(std::sync::atomic::Ordering::SeqCst) == 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the upgraded Card was not re-admitted and announced (card {})",
            version()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Version 1.0.1 brought a Skill: it is the prompt the client now gets.
    let prompts: Vec<String> =
        client.list_all_prompts().await.unwrap_or_default().into_iter().map(|p| p.name).collect();
    assert_eq!(prompts, ["connector-im-work"]);
    // The re-admitted Card is what the packet rules judge by: the refreshed Descriptor naming
    // the new Tool is accepted, and the Tool joins the list beside the old one.
    let after =
        tools_until(&client, "the new Tool appears", |now| now.contains(&"work_report".to_owned()))
            .await;
    assert!(after.contains(&"work_run".to_owned()), "{after:?}");
    let _ = client.cancel().await;
    upgraded.shutdown();
}
