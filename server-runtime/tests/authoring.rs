//! The author API (issue 12): typed Tools and form flows, Connectors without auth flows, hooks,
//! the author's routes and tasks, containment of author code, and generic internal errors.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use xagent_protocol_types::{
    AuthInput, AuthStart, ChatMessage, ConnectorChannelId, ConnectorHello, ErrorCode,
    PROFILE_IM_V2, Packet, Ping, Secret, Security, ToolInvoke, TrustLevel,
};
use xagent_server_runtime::prelude::*;
use xagent_server_runtime::{ConnectorBuilder, DefinitionError, RuntimeConfig, ServerError};
use xagent_testkit::{WsClient, has_error, payload_json};

const CARD: &str = "im.authoring";
const FLOW: &str = "authoring_token";

#[derive(Serialize, Deserialize, JsonSchema)]
struct Text {
    /// The text.
    text: String,
}

#[derive(Deserialize, JsonSchema)]
struct TokenForm {
    /// Access token
    /// Any non-empty value signs in.
    token: Secret,
    /// Display name
    #[schemars(example = &"Ada")]
    name: Option<String>,
}

fn base() -> ConnectorBuilder {
    Connector::builder(CARD, "Authoring", "4.5.6")
        .target(TargetDeclaration::new(TargetType::Im, "authoring", "Authoring"))
        .profile(PROFILE_IM_V2)
        .on_message(|_, _| async {})
        .tool(ToolSpec::new("authoring_echo", "Echo\n\nReturns its text."), |_, a: Text| async {
            Ok(a)
        })
}

fn with_form_flow(builder: ConnectorBuilder) -> ConnectorBuilder {
    builder.form_flow(FlowSpec::new(FLOW, "Sign in"), |_, form: TokenForm| async move {
        let name = form.name.unwrap_or_else(|| "Authoring account".into());
        let target = DescriptorTarget::new("authoring", name);
        Ok(AuthStep::Authenticated(Binding::new(target).with_secret("token", form.token)))
    })
}

async fn hello(client: &mut WsClient) -> Packet {
    let packet = client.request(ConnectorHello::new(CARD, vec![PROFILE_IM_V2.into()]), None);
    client.call(packet).await
}

async fn open(client: &mut WsClient) -> (ConnectorChannelId, Packet) {
    let ack = hello(client).await;
    assert!(ack.error.is_none(), "{ack:?}");
    client.open_channel(None).await
}

async fn sign_in(client: &mut WsClient, channel: &ConnectorChannelId) -> Packet {
    let start = AuthStart::new(FLOW).with_input(AuthInput::default().with("token", "t0k3n"));
    let packet = client.request(start, Some(channel));
    client.call(packet).await
}

async fn invoke(client: &mut WsClient, channel: &ConnectorChannelId, tool: &str) -> Packet {
    let arguments = json!({ "text": "hi", "connector_channel_id": channel });
    let invoke = ToolInvoke::new(tool, arguments.as_object().cloned().unwrap_or_default());
    let packet = client.request(invoke, Some(channel));
    client.call(packet).await
}

/// Waits (bounded) until the runtime has seen the socket go: no live socket, lease running.
async fn wait_offline(handle: &ConnectorHandle) {
    for _ in 0..500 {
        if !handle.is_online() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the connection never detached");
}

#[test]
fn a_typed_tool_declares_its_output_schema_and_a_form_struct_becomes_form_fields() {
    let connector = with_form_flow(base()).build().unwrap();
    let card = connector.card();
    let tool = &card.tools[0];
    assert_eq!(tool.title.as_deref(), Some("Echo"));
    assert_eq!(tool.description.as_deref(), Some("Returns its text."));
    let output = tool.output_schema.as_ref().expect("typed result has an output schema");
    assert_eq!(output["properties"]["text"]["type"], "string");
    assert!(tool.input_schema["properties"]["connector_channel_id"].is_object());
    let flow = card.auth_flow(FLOW).unwrap();
    let token = flow.fields.iter().find(|f| f.name == "token").unwrap();
    assert!(token.is_secret() && token.is_required());
    assert_eq!(token.label, "Access token");
    assert_eq!(token.help_text.as_deref(), Some("Any non-empty value signs in."));
    let name = flow.fields.iter().find(|f| f.name == "name").unwrap();
    assert!(!name.is_secret() && !name.is_required());
    assert_eq!(name.placeholder.as_deref(), Some("Ada"));
}

#[test]
fn an_author_connector_reports_its_own_version_and_a_ten_digit_build_time() {
    let connector = base().build().unwrap();
    let build = &connector.card().build;
    assert_eq!(build.version.as_deref(), Some("4.5.6"));
    assert_eq!(build.build_time.len(), 10);
    assert!(build.build_time.chars().all(|c| c.is_ascii_digit()));
}

#[tokio::test]
async fn a_card_requiring_an_api_key_is_refused_without_one() {
    let connector = base().security(Security::new(TrustLevel::Local, true)).build().unwrap();
    let result = ConnectorServer::builder(connector).build().await;
    match result {
        Err(ServerError::Definition(DefinitionError::ApiKeyMissing)) => {}
        Err(other) => panic!("expected ApiKeyMissing, got {other}"),
        Ok(_) => panic!("a Card saying api_key_required was served without a key"),
    }
    let connector = base().security(Security::new(TrustLevel::Local, true)).build().unwrap();
    let keyed = ConnectorServer::builder(connector).api_key(Secret::new("k-123456")).build().await;
    assert!(keyed.is_ok());
}

#[tokio::test]
async fn a_connector_with_no_auth_flows_serves_tools() {
    let bound = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&bound);
    let connector = base()
        .on_bound(move |_, reason| {
            assert_eq!(reason, BoundReason::Opened);
            seen.fetch_add(1, Ordering::SeqCst);
            async {}
        })
        .build()
        .unwrap();
    assert!(connector.card().auth_flows.is_empty());
    let server = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let mut client = server.client().await;
    let (channel, ack) = open(&mut client).await;
    let status = &payload_json(&ack)["connection_descriptor"]["connection"]["status"];
    assert_eq!(status, "connected");
    let reply = invoke(&mut client, &channel, "authoring_echo").await;
    assert!(reply.error.is_none(), "{reply:?}");
    assert_eq!(payload_json(&reply)["result"], json!({ "text": "hi" }));
    assert_eq!(bound.load(Ordering::SeqCst), 1);
    client.close().await;
    server.stop().await;
}

/// The served Card, as xAgent fetches it.
async fn served_card(server: &support::Custom) -> Value {
    let url = format!("http://{}/connector-card.json", server.addr);
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

/// Protocol 4.1 and 10: a Skill a Tool names with `ToolSpec::related_skill` is served in that
/// Tool's `related_skill_ids`, and only there.
#[tokio::test]
async fn rule_card_tool_related_skill_reaches_the_served_card() {
    // A related Skill must be one the Connector serves (skill.related_skill_ids).
    let connector = base()
        .skill("---\nname: connector-im-authoring\n---\nUse authoring_reply to reply.\n")
        .tool(
            ToolSpec::new("authoring_reply", "Reply\n\nReplies on the channel.")
                .related_skill("connector-im-authoring"),
            |_, a: Text| async { Ok(a) },
        )
        .build()
        .unwrap();
    let server = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let card = served_card(&server).await;
    let tools = card["tools"].as_array().unwrap();
    let reply = tools.iter().find(|t| t["tool_id"] == "authoring_reply").unwrap();
    assert_eq!(reply["related_skill_ids"], json!(["connector-im-authoring"]), "{reply}");
    let echo = tools.iter().find(|t| t["tool_id"] == "authoring_echo").unwrap();
    assert!(echo.get("related_skill_ids").is_none_or(|r| r == &json!([])), "{echo}");
    server.stop().await;
}

/// Protocol 10: every Tool of the served Card is callable, each by its own handler (the Card's
/// `tools[]` is made from the registered handlers, not declared beside them).
#[tokio::test]
async fn rule_card_tool_callable_every_served_tool_runs_its_own_handler() {
    let calls = Arc::new(AtomicUsize::new(0));
    let connector = Connector::builder(CARD, "Authoring", "4.5.6")
        .target(TargetDeclaration::new(TargetType::Im, "authoring", "Authoring"))
        .profile(PROFILE_IM_V2)
        .state(Arc::clone(&calls))
        .on_message(|_, _| async {})
        .tool(ToolSpec::new("authoring_one", "One"), |_, _: Text| async {
            Ok(json!({ "ran": "authoring_one" }))
        })
        .tool(ToolSpec::new("authoring_two", "Two").read_only(), |_, _: Text| async {
            Ok(json!({ "ran": "authoring_two" }))
        })
        .tool(
            ToolSpec::new("authoring_three", "Three"),
            |ctx: ToolContext<Arc<AtomicUsize>>, _: Text| async move {
                ctx.state().fetch_add(1, Ordering::SeqCst);
                Ok(json!({ "ran": "authoring_three" }))
            },
        )
        .build()
        .unwrap();
    let server = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let card = served_card(&server).await;
    let ids: Vec<String> = card["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tool_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    let mut client = server.client().await;
    let (channel, _) = open(&mut client).await;
    for id in &ids {
        let reply = invoke(&mut client, &channel, id).await;
        assert!(reply.error.is_none(), "{id}: {reply:?}");
        assert_eq!(payload_json(&reply)["result"]["ran"], id.as_str(), "{id}: {reply:?}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    client.close().await;
    server.stop().await;
}

/// What each handler saw of the Connector's state.
#[derive(Clone, Default)]
struct Seen(Arc<std::sync::Mutex<Vec<&'static str>>>);

impl Seen {
    fn saw(&self, what: &'static str) {
        self.0.lock().unwrap().push(what);
    }
}

struct SeenTarget;

impl ImTarget<Seen> for SeenTarget {
    async fn deliver(
        &self,
        ctx: ChannelContext<Seen>,
        _message: ChatMessage,
        _how: FinalDelivery,
    ) -> Result<(), DeliveryError> {
        ctx.state().saw("deliver");
        Ok(())
    }
}

async fn seen_sign_in(ctx: AuthContext<Seen>, form: TokenForm) -> Result<AuthStep, AuthError> {
    ctx.state().saw("form flow");
    let target = DescriptorTarget::new("authoring", "Authoring account");
    Ok(AuthStep::Authenticated(Binding::new(target).with_secret("token", form.token)))
}

async fn seen_tool(ctx: ToolContext<Seen>, args: Text) -> Result<Text, ToolError> {
    ctx.state().saw("tool");
    Ok(args)
}

/// One state set with `.state(..)` reaches a form flow, the hooks, the IM target and a Tool,
/// each a plain `async fn` (or a unit struct), with nothing cloned by the author.
#[tokio::test]
async fn the_connector_state_reaches_every_kind_of_handler() {
    let seen = Seen::default();
    let connector = Connector::builder(CARD, "Authoring", "4.5.6")
        .target(TargetDeclaration::new(TargetType::Im, "authoring", "Authoring"))
        .profile(PROFILE_IM_V2)
        .state(seen.clone())
        .form_flow(FlowSpec::new(FLOW, "Sign in"), seen_sign_in)
        .on_bound(|ctx: ChannelContext<Seen>, _| async move { ctx.state().saw("on_bound") })
        .on_unbound(|ctx: ChannelContext<Seen>| async move {
            ctx.state().saw("on_unbound");
            Ok(())
        })
        .im_target(SeenTarget)
        .tool(ToolSpec::new("authoring_seen", "Seen"), seen_tool)
        .build()
        .unwrap();
    let server = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let mut client = server.client().await;
    let (channel, _) = open(&mut client).await;
    assert!(sign_in(&mut client, &channel).await.error.is_none());
    let tool = invoke(&mut client, &channel, "authoring_seen").await;
    assert!(tool.error.is_none(), "{tool:?}");
    let packet = Packet::with_payload(client.id("pkt"), ChatMessage::text("m1", "hello"))
        .channel(channel.clone());
    client.send(&packet).await;
    let (ack, _) = client.wait_for("chat.message.ack").await;
    assert_eq!(payload_json(&ack)["status"], "accepted", "{ack:?}");
    let logout = client.request(xagent_protocol_types::AuthLogout::default(), Some(&channel));
    let reply = client.call(logout).await;
    assert!(reply.error.is_none(), "{reply:?}");
    assert_eq!(*seen.0.lock().unwrap(), ["form flow", "on_bound", "tool", "deliver", "on_unbound"],);
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn an_internal_error_reaches_xagent_without_its_cause() {
    let connector = base()
        .tool(ToolSpec::new("authoring_db", "Fails inside"), |_, _a: Text| async {
            Err::<Value, _>(ToolError::internal("SQLITE_BUSY: database /srv/secret.db is locked"))
        })
        .build()
        .unwrap();
    let server = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let mut client = server.client().await;
    let (channel, _) = open(&mut client).await;
    let reply = invoke(&mut client, &channel, "authoring_db").await;
    assert!(has_error(&reply, &ErrorCode::InternalError), "{reply:?}");
    let message = reply.error.as_ref().unwrap().message().to_owned();
    assert!(!message.contains("SQLITE") && !message.contains("/srv"), "{message}");
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_panicking_auth_start_answers_and_leaves_the_connection_usable() {
    let connector = base()
        .form_flow(FlowSpec::new(FLOW, "Sign in"), |_, _form: TokenForm| async move {
            if true {
                panic!("the sign-in code has a bug");
            }
            Ok(AuthStep::Failed("unreachable".into()))
        })
        .build()
        .unwrap();
    let server = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let handle = server.server.handle();
    let mut client = server.client().await;
    let (channel, _) = open(&mut client).await;
    let reply = sign_in(&mut client, &channel).await;
    assert!(has_error(&reply, &ErrorCode::InternalError), "{reply:?}");
    assert!(!reply.error.as_ref().unwrap().message().contains("bug"));
    let ping = client.request(Ping::default(), None);
    let pong = client.call(ping).await;
    assert_eq!(pong.type_str(), "pong");
    client.close().await;
    wait_offline(&handle).await;
    assert!(!handle.is_routed(&channel));
    server.stop().await;
}

#[tokio::test]
async fn a_panicking_delivery_is_rejected_and_the_connection_stays_usable_then_detaches() {
    let connector = with_form_flow(
        Connector::builder(CARD, "Authoring", "4.5.6")
            .target(TargetDeclaration::new(TargetType::Im, "authoring", "Authoring"))
            .profile(PROFILE_IM_V2)
            .on_message(|_, message: ChatMessage| async move {
                if message.text.as_deref() == Some("boom") {
                    panic!("the target client crashed");
                }
            }),
    )
    .build()
    .unwrap();
    let server = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let handle = server.server.handle();
    let mut client = server.client().await;
    let (channel, _) = open(&mut client).await;
    assert!(sign_in(&mut client, &channel).await.error.is_none());
    for (id, text, accepted) in [("m1", "boom", false), ("m2", "fine", true)] {
        let id_packet = client.id("pkt");
        let packet =
            Packet::with_payload(id_packet, ChatMessage::text(id, text)).channel(channel.clone());
        client.send(&packet).await;
        let (ack, _) = client.wait_for("chat.message.ack").await;
        let status = payload_json(&ack)["status"].clone();
        if accepted {
            assert_eq!(status, "accepted", "{ack:?}");
        } else {
            assert_eq!(status, "rejected", "{ack:?}");
            assert_eq!(payload_json(&ack)["code"], "internal_error");
            assert_eq!(payload_json(&ack)["retryable"], false);
            assert!(!payload_json(&ack)["message"].to_string().contains("crashed"));
        }
    }
    client.close().await;
    wait_offline(&handle).await;
    assert!(!handle.is_routed(&channel));
    server.stop().await;
}

#[tokio::test]
async fn a_panicking_on_bound_and_consumer_start_leave_the_channel_signed_in_and_usable() {
    let connector = with_form_flow(base())
        .on_bound(|ctx, _| async move {
            ctx.handle.attach_consumer("poller", &ctx.channel, || panic!("the poller crashed"));
            panic!("the hook has a bug");
        })
        .build()
        .unwrap();
    let server = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let handle = server.server.handle();
    let mut client = server.client().await;
    let (channel, _) = open(&mut client).await;
    let reply = sign_in(&mut client, &channel).await;
    assert!(reply.error.is_none(), "{reply:?}");
    assert_eq!(payload_json(&reply)["status"], "authenticated");
    assert_eq!(handle.consumer_users("poller"), 0);
    let tool = invoke(&mut client, &channel, "authoring_echo").await;
    assert!(tool.error.is_none(), "{tool:?}");
    client.close().await;
    wait_offline(&handle).await;
    server.stop().await;
}

#[tokio::test]
async fn a_consumer_start_that_calls_the_handle_does_not_deadlock() {
    let users_seen = Arc::new(AtomicUsize::new(usize::MAX));
    let seen = Arc::clone(&users_seen);
    let connector = with_form_flow(base())
        .on_bound(move |ctx, _| {
            let seen = Arc::clone(&seen);
            async move {
                let handle = ctx.handle.clone();
                ctx.handle.attach_consumer("poller", &ctx.channel, move || {
                    // Calls back into the runtime from the start callback.
                    seen.store(
                        handle.channels().len() + handle.consumer_users("poller"),
                        Ordering::SeqCst,
                    );
                    Box::new(|| {})
                });
            }
        })
        .build()
        .unwrap();
    let server = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let handle = server.server.handle();
    let mut client = server.client().await;
    let (channel, _) = open(&mut client).await;
    let reply = tokio::time::timeout(Duration::from_secs(10), sign_in(&mut client, &channel))
        .await
        .expect("the sign-in finished: no deadlock");
    assert!(reply.error.is_none(), "{reply:?}");
    assert_eq!(users_seen.load(Ordering::SeqCst), 1);
    assert_eq!(handle.consumer_users("poller"), 1);
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn author_routes_and_tasks_get_the_handle_and_the_shutdown_signal() {
    let connector = base().build().unwrap();
    let stopped = Arc::new(AtomicUsize::new(0));
    let stopped_seen = Arc::clone(&stopped);
    let server = ConnectorServer::builder(connector)
        .routes(|handle| {
            axum::Router::new().route(
                "/extra/channels",
                axum::routing::get(move || {
                    let handle = handle.clone();
                    async move { handle.channels().len().to_string() }
                }),
            )
        })
        .task(move |_handle, shutdown| async move {
            shutdown.cancelled().await;
            stopped_seen.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let running = server.clone();
    let join = tokio::spawn(async move {
        running
            .serve(listener, async move {
                let _ = stopped_rx.await;
            })
            .await
    });
    let body = reqwest::get(format!("http://{addr}/extra/channels")).await.unwrap();
    assert_eq!(body.text().await.unwrap(), "0");
    let _ = stop.send(());
    join.await.unwrap().unwrap();
    assert_eq!(stopped.load(Ordering::SeqCst), 1);
}
