//! Device Profile v1 in the runtime, over a real WebSocket with a simulated clock: the device
//! author trait (restore check, status reports correcting the Descriptor), confirmation of a
//! high-risk Tool, result checks, device facts refused at build time, and the Descriptor's
//! `target_type` for a Card declaring both `im` and `device`.

use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use xagent_protocol_types::{
    AuthInput, AuthStart, ChannelOpen, ConnectorChannelId, ConnectorHello, DescriptorGet,
    ErrorCode, ManualClock, PROFILE_DEVICE_V1, PROFILE_IM_V1, Packet, ProfileId, Secret,
    TargetDeclaration, TargetType, ToolId, ToolInvoke, ToolInvokeContext,
};
use xagent_server_runtime::{
    AuthStep, Binding, ChannelContext, Connector, ConnectorHandle, ConnectorServer,
    DefinitionError, DeviceConfig, DeviceStatus, DeviceTarget, FlowSpec, RiskLevel, ToolCategory,
    ToolError, ToolSpec,
};
use xagent_testkit::{WsClient, payload_json};

const KEY: &str = "device-test-key";
const T0: u64 = 1_790_000_000_000;

#[derive(Clone, Default)]
struct Lab {
    /// What `check` answers after a restart.
    status: Arc<Mutex<Option<DeviceStatus>>>,
    /// Side effects that reached the "device".
    actions: Arc<Mutex<Vec<String>>>,
}

impl DeviceTarget for Lab {
    fn device_key(&self, binding: &Binding) -> Option<String> {
        binding.secret("device").map(|s| s.expose().to_owned())
    }

    async fn check(&self, _ctx: ChannelContext) -> DeviceStatus {
        self.status.lock().unwrap().clone().unwrap_or(DeviceStatus::Offline)
    }
}

#[derive(Deserialize, JsonSchema)]
struct BindForm {
    /// Device
    device: String,
}

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

#[derive(Deserialize, JsonSchema)]
struct LevelArgs {
    /// 0 to 10.
    #[schemars(range(min = 0, max = 10))]
    level: i64,
}

#[derive(Deserialize, JsonSchema)]
struct SerialArgs {
    /// Lets the model pick a device: refused at build time.
    serial: String,
}

fn builder(lab: &Lab, card_id: &str) -> xagent_server_runtime::ConnectorBuilder {
    let (set_lab, wipe_lab) = (lab.clone(), lab.clone());
    Connector::builder(card_id, "Device lab", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Device, "lab", "Lab device"))
        .profile(PROFILE_DEVICE_V1)
        .form_flow(
            FlowSpec::new("lab_bind", "Bind a lab device"),
            |_ctx, form: BindForm| async move {
                let target = xagent_protocol_types::DescriptorTarget::new("lab", "Lab device");
                Ok(AuthStep::Authenticated(
                    Binding::new(target).with_secret("device", Secret::new(form.device)),
                ))
            },
        )
        .device_target(lab.clone(), DeviceConfig::default())
        .device_tool(
            ToolSpec::new("lab_read", "Read\nReads the lab device."),
            ToolCategory::Observation,
            RiskLevel::Low,
            |_ctx, _args: NoArgs| async { Ok::<_, ToolError>(json!({"level": 3})) },
        )
        .device_tool(
            ToolSpec::new("lab_set", "Set\nSets the level."),
            ToolCategory::Control,
            RiskLevel::Medium,
            move |_ctx, args: LevelArgs| {
                let lab = set_lab.clone();
                async move {
                    lab.actions.lock().unwrap().push(format!("set {}", args.level));
                    Ok::<_, ToolError>(json!({"level": args.level}))
                }
            },
        )
        .device_tool(
            ToolSpec::new("lab_wipe", "Wipe\nErases the device."),
            ToolCategory::Control,
            RiskLevel::High,
            move |_ctx, _args: NoArgs| {
                let lab = wipe_lab.clone();
                async move {
                    lab.actions.lock().unwrap().push("wipe".into());
                    Ok::<_, ToolError>(json!({"wiped": true}))
                }
            },
        )
        .device_tool(
            ToolSpec::new("lab_leak", "Leak\nReturns a picture's bytes (refused)."),
            ToolCategory::Media,
            RiskLevel::Low,
            |_ctx, _args: NoArgs| async {
                Ok::<_, ToolError>(json!({"picture": {"base64": "iVBORw0KGgo="}}))
            },
        )
}

struct Lane {
    server: ConnectorServer,
    base: String,
    stop: tokio::sync::oneshot::Sender<()>,
}

async fn serve(connector: Connector, dir: &std::path::Path, clock: &ManualClock) -> Lane {
    let server = ConnectorServer::builder(connector)
        .state_dir(dir)
        .unwrap()
        .api_key(Secret::new(KEY))
        .clock(clock.clone())
        .build()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = server.clone();
    tokio::spawn(async move {
        let _ = running
            .serve(listener, async move {
                let _ = stopped.await;
            })
            .await;
    });
    Lane { server, base, stop }
}

async fn client(base: &str, card: &str, profiles: &[&str]) -> WsClient {
    let ws = format!("{}/ws", base.replacen("http", "ws", 1));
    let mut c = WsClient::connect(&ws, Some(KEY)).await.unwrap();
    let profiles: Vec<ProfileId> = profiles.iter().map(|p| ProfileId::new(*p)).collect();
    let hello = c.request(ConnectorHello::new(card, profiles), None);
    let ack = c.call(hello).await;
    assert!(ack.error.is_none(), "{ack:?}");
    c
}

async fn open_and_bind(c: &mut WsClient, device: &str) -> (ConnectorChannelId, Value) {
    let open = c.request(ChannelOpen::default(), None);
    let channel = c.call(open).await.connector_channel_id.clone().unwrap();
    let start = c.request(
        AuthStart::new("lab_bind").with_input(AuthInput::default().with("device", device)),
        Some(&channel),
    );
    let ack = payload_json(&c.call(start).await);
    (channel, ack)
}

async fn invoke(
    c: &mut WsClient,
    channel: &ConnectorChannelId,
    tool: &str,
    args: Value,
    call: &str,
) -> Packet {
    let mut arguments = args.as_object().cloned().unwrap_or_default();
    arguments.insert("connector_channel_id".into(), json!(channel.as_str()));
    let invoke =
        ToolInvoke::new(tool, arguments).with_context(ToolInvokeContext::with_call_id(call));
    let packet = c.request(invoke, Some(channel));
    c.call(packet).await
}

fn code(p: &Packet) -> Option<ErrorCode> {
    p.error.as_ref().map(|e| e.code.clone())
}

async fn descriptor(c: &mut WsClient, channel: &ConnectorChannelId) -> Value {
    let get = c.request(DescriptorGet::default(), Some(channel));
    payload_json(&c.call(get).await)["connection_descriptor"].clone()
}

#[tokio::test]
async fn rule_device_status_reports_correct_the_descriptor_and_answer_calls() {
    let lab = Lab::default();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let lane = serve(builder(&lab, "device.lab").build().unwrap(), dir.path(), &clock).await;
    let mut c = client(&lane.base, "device.lab", &[PROFILE_DEVICE_V1]).await;
    let (channel, bound) = open_and_bind(&mut c, "dev-1").await;
    assert_eq!(bound["connection_descriptor"]["connection"]["status"], "connected");
    assert_eq!(bound["connection_descriptor"]["connection"]["target_type"], "device");

    let handle: ConnectorHandle = lane.server.handle();
    assert!(handle.device_status(&channel, DeviceStatus::Offline).await.unwrap());
    let (push, _) = c.wait_for("connection.descriptor.push").await;
    let d = payload_json(&push)["connection_descriptor"].clone();
    assert_eq!(d["connection"]["status"], "offline");
    assert!(d["tools"].as_array().unwrap().iter().all(|t| t["status"] == "unavailable"), "{d}");
    let offline = invoke(&mut c, &channel, "lab_set", json!({"level": 2}), "c1").await;
    assert_eq!(code(&offline), Some(ErrorCode::DeviceOffline));

    assert!(handle.device_status(&channel, DeviceStatus::PermissionLost).await.unwrap());
    let (push, _) = c.wait_for("connection.descriptor.push").await;
    let d = payload_json(&push)["connection_descriptor"].clone();
    assert_eq!(d["tools"][0]["status"], "denied_by_target");
    assert_eq!(d["tools"][0]["target_permission_state"], "denied");
    let denied = invoke(&mut c, &channel, "lab_read", json!({}), "c2").await;
    assert_eq!(code(&denied), Some(ErrorCode::PermissionDenied));

    assert!(handle.device_status(&channel, DeviceStatus::Online).await.unwrap());
    let (push, _) = c.wait_for("connection.descriptor.push").await;
    assert_eq!(payload_json(&push)["connection_descriptor"]["connection"]["status"], "connected");
    // The call refused while offline never reached the device: its retry runs now.
    let ok = invoke(&mut c, &channel, "lab_set", json!({"level": 2}), "c1").await;
    assert_eq!(code(&ok), None, "{ok:?}");
    // A repeat of a completed control call is answered from the record, not run again.
    let again = invoke(&mut c, &channel, "lab_set", json!({"level": 2}), "c1").await;
    assert_eq!(payload_json(&again)["result"], json!({"level": 2}));
    assert_eq!(*lab.actions.lock().unwrap(), vec!["set 2".to_owned()]);
    // Reporting the same state again changes nothing.
    assert!(!handle.device_status(&channel, DeviceStatus::Online).await.unwrap());
    let _ = lane.stop.send(());
}

#[tokio::test]
async fn rule_restored_binding_is_connected_only_after_the_device_answered() {
    let lab = Lab::default();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let lane = serve(builder(&lab, "device.lab").build().unwrap(), dir.path(), &clock).await;
    let mut c = client(&lane.base, "device.lab", &[PROFILE_DEVICE_V1]).await;
    let (channel, _) = open_and_bind(&mut c, "dev-1").await;
    lane.server.shutdown();
    let _ = lane.stop.send(());
    c.close().await;

    // The device does not answer the check after the restart.
    *lab.status.lock().unwrap() = None;
    let lane = serve(builder(&lab, "device.lab").build().unwrap(), dir.path(), &clock).await;
    let mut c = client(&lane.base, "device.lab", &[PROFILE_DEVICE_V1]).await;
    let open = c.request(ChannelOpen::default(), Some(&channel));
    let _ = c.call(open).await;
    let d = descriptor(&mut c, &channel).await;
    assert_ne!(d["connection"]["status"], "connected", "{d}");
    assert!(d["tools"].as_array().unwrap().iter().all(|t| t["status"] != "available"), "{d}");
    // The device answers later: connected, Tools available.
    lane.server.handle().device_status(&channel, DeviceStatus::Online).await.unwrap();
    let d = descriptor(&mut c, &channel).await;
    assert_eq!(d["connection"]["status"], "connected");
    assert!(d["tools"].as_array().unwrap().iter().all(|t| t["status"] == "available"), "{d}");
    let _ = lane.stop.send(());
}

#[tokio::test]
async fn rule_high_risk_tool_needs_a_live_one_shot_confirmation() {
    let lab = Lab::default();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let lane = serve(builder(&lab, "device.lab").build().unwrap(), dir.path(), &clock).await;
    let mut c = client(&lane.base, "device.lab", &[PROFILE_DEVICE_V1]).await;
    let (channel, _) = open_and_bind(&mut c, "dev-1").await;
    let handle = lane.server.handle();
    let wipe = ToolId::new("lab_wipe");

    let first = invoke(&mut c, &channel, "lab_wipe", json!({}), "w1").await;
    assert_eq!(code(&first), Some(ErrorCode::ConfirmationRequired));
    // A grant that expired (simulated time) does not count.
    handle.grant_confirmation(&channel, &wipe, &serde_json::Map::new()).unwrap();
    clock.advance(5 * 60 * 1000);
    let late = invoke(&mut c, &channel, "lab_wipe", json!({}), "w1").await;
    assert_eq!(code(&late), Some(ErrorCode::ConfirmationRequired));
    handle.grant_confirmation(&channel, &wipe, &serde_json::Map::new()).unwrap();
    let ok = invoke(&mut c, &channel, "lab_wipe", json!({}), "w1").await;
    assert_eq!(code(&ok), None, "{ok:?}");
    // One shot: the next call needs a new confirmation.
    let next = invoke(&mut c, &channel, "lab_wipe", json!({}), "w2").await;
    assert_eq!(code(&next), Some(ErrorCode::ConfirmationRequired));
    assert_eq!(*lab.actions.lock().unwrap(), vec!["wipe".to_owned()]);
    let _ = lane.stop.send(());
}

#[tokio::test]
async fn rule_media_bytes_in_a_result_are_refused_not_sent() {
    let lab = Lab::default();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let lane = serve(builder(&lab, "device.lab").build().unwrap(), dir.path(), &clock).await;
    let mut c = client(&lane.base, "device.lab", &[PROFILE_DEVICE_V1]).await;
    let (channel, _) = open_and_bind(&mut c, "dev-1").await;
    let leak = invoke(&mut c, &channel, "lab_leak", json!({}), "l1").await;
    assert_eq!(code(&leak), Some(ErrorCode::ToolInvokeFailed));
    assert!(!serde_json::to_string(&leak).unwrap().contains("iVBORw0KGgo"));
    let _ = lane.stop.send(());
}

#[test]
fn rule_device_facts_as_model_arguments_are_refused_at_build_time() {
    let lab = Lab::default();
    let result =
        builder(&lab, "device.lab")
            .device_tool(
                ToolSpec::new("lab_pick", "Pick\nPicks a device by serial."),
                ToolCategory::Observation,
                RiskLevel::Low,
                |_ctx, args: SerialArgs| async move {
                    Ok::<_, ToolError>(json!({"serial": args.serial}))
                },
            )
            .build();
    let error = result.expect_err("a serial argument is refused");
    assert!(matches!(error, DefinitionError::Device(_)), "{error}");
    assert!(error.to_string().contains("serial"), "{error}");
}

#[tokio::test]
async fn rule_target_type_follows_the_enabled_profiles_for_an_im_and_device_card() {
    let lab = Lab::default();
    let connector = builder(&lab, "device.mixed")
        .target(TargetDeclaration::new(TargetType::Im, "lab", "Lab chat"))
        .profile(PROFILE_IM_V1)
        .build()
        .unwrap();
    assert_eq!(connector.card().supports.target_types[0], TargetType::Device);
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let lane = serve(connector, dir.path(), &clock).await;
    for (profile, want) in [(PROFILE_DEVICE_V1, "device"), (PROFILE_IM_V1, "im")] {
        let mut c = client(&lane.base, "device.mixed", &[profile]).await;
        let open = c.request(ChannelOpen::default(), None);
        let channel = c.call(open).await.connector_channel_id.clone().unwrap();
        let d = descriptor(&mut c, &channel).await;
        assert_eq!(d["connection"]["target_type"], want, "{profile}: {d}");
        assert_eq!(d["connection"]["profiles"], json!([profile]));
        let card = serde_json::to_value(lane.server.card()).unwrap();
        let facts = xagent_protocol_validate::CardFacts::from_value(&card);
        let context = xagent_protocol_validate::DescriptorContext::with_card(&facts);
        let report = xagent_protocol_validate::validate_descriptor(&d, context);
        assert!(
            report.errors().next().is_none(),
            "{profile}: {:?}",
            report.errors().collect::<Vec<_>>()
        );
        c.close().await;
    }
    let _ = lane.stop.send(());
}

/// Section 8.1: the Descriptor lists only Profiles enabled for the current connection. A
/// device channel of a Card declaring both `im` and `device`, reopened by an xAgent that
/// announced only IM, is refused (`connector_channel_unavailable`) rather than described with
/// the Card's device Profile; it stays closed there, so its device Tools cannot be called.
#[tokio::test]
async fn rule_descriptor_lists_only_profiles_the_connection_negotiated() {
    let lab = Lab::default();
    let connector = builder(&lab, "device.mixed")
        .target(TargetDeclaration::new(TargetType::Im, "lab", "Lab chat"))
        .profile(PROFILE_IM_V1)
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let lane = serve(connector, dir.path(), &clock).await;
    let mut c = client(&lane.base, "device.mixed", &[PROFILE_DEVICE_V1]).await;
    let (channel, bound) = open_and_bind(&mut c, "dev-1").await;
    assert_eq!(bound["connection_descriptor"]["connection"]["target_type"], "device", "{bound}");
    c.close().await;

    let mut c = client(&lane.base, "device.mixed", &[PROFILE_IM_V1]).await;
    let open = c.request(ChannelOpen::default(), Some(&channel));
    let refused = c.call(open).await;
    assert_eq!(code(&refused), Some(ErrorCode::ConnectorChannelUnavailable), "{refused:?}");
    assert_ne!(refused.type_str(), "channel.open.ack", "{refused:?}");
    let get = c.request(DescriptorGet::default(), Some(&channel));
    assert_eq!(code(&c.call(get).await), Some(ErrorCode::ChannelNotOpen));
    let set = invoke(&mut c, &channel, "lab_set", json!({"level": 2}), "call-im-only").await;
    assert_eq!(code(&set), Some(ErrorCode::ChannelNotOpen), "{set:?}");
    assert!(lab.actions.lock().unwrap().is_empty(), "a device Tool ran");
    // A new channel on that connection is an IM one, with the IM Profile only.
    let open = c.request(ChannelOpen::default(), None);
    let ack = payload_json(&c.call(open).await);
    let connection = &ack["connection_descriptor"]["connection"];
    assert_eq!(connection["target_type"], "im", "{ack}");
    assert_eq!(connection["profiles"], json!([PROFILE_IM_V1]), "{ack}");
    c.close().await;

    // Where the device Profile is negotiated the channel reopens as before.
    let mut c = client(&lane.base, "device.mixed", &[PROFILE_DEVICE_V1, PROFILE_IM_V1]).await;
    let open = c.request(ChannelOpen::default(), Some(&channel));
    let ack = payload_json(&c.call(open).await);
    assert_eq!(ack["connection_descriptor"]["connection"]["profiles"], json!([PROFILE_DEVICE_V1]));
    c.close().await;
    let _ = lane.stop.send(());
}

#[derive(Deserialize, JsonSchema)]
struct ExecArgs {
    /// Any shell command: refused at build unless the operator opts out.
    command: String,
}

#[derive(Deserialize, JsonSchema)]
struct UploadArgs {
    /// A picture's bytes: refused at build unless the operator opts out.
    image_base64: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Key {
    Home,
    Back,
}

#[derive(Deserialize, JsonSchema)]
struct KeyArgs {
    /// One of the keys the device offers: an enum, so allowed.
    command: Key,
}

fn exec(
    builder: xagent_server_runtime::ConnectorBuilder,
) -> xagent_server_runtime::ConnectorBuilder {
    builder.device_tool(
        ToolSpec::new("lab_exec", "Exec\nRuns a command on the device."),
        ToolCategory::Control,
        RiskLevel::High,
        |_ctx, args: ExecArgs| async move { Ok::<_, ToolError>(json!({"ran": args.command})) },
    )
}

#[test]
fn rule_device_no_unconstrained_command_is_refused_at_build() {
    let lab = Lab::default();
    let error = exec(builder(&lab, "device.lab")).build().expect_err("a free-form command");
    let DefinitionError::UnsafeDeviceArgument(finding) = &error else {
        panic!("expected UnsafeDeviceArgument, got {error}");
    };
    assert_eq!(finding.tool.as_str(), "lab_exec");
    assert_eq!(finding.property, "/command");
    assert_eq!(finding.rule.id(), "device.no_unconstrained_command");
    let text = error.to_string();
    for part in ["lab_exec", "/command", "Device v1", "allow_unconstrained_device_argument"] {
        assert!(text.contains(part), "{part}: {text}");
    }
    // A Tool of the Device Profile registered with `.tool` is a device Tool too.
    let plain = builder(&lab, "device.lab")
        .tool(
            ToolSpec::new("lab_shell", "Shell\nRuns a shell line.").profile(PROFILE_DEVICE_V1),
            |_ctx, args: ExecArgs| async move { Ok::<_, ToolError>(json!({"ran": args.command})) },
        )
        .build();
    assert!(matches!(plain, Err(DefinitionError::UnsafeDeviceArgument(_))), "{plain:?}");
    // A command narrowed to an enum is fine.
    let keys = builder(&lab, "device.lab")
        .device_tool(
            ToolSpec::new("lab_key", "Key\nPresses a key."),
            ToolCategory::Control,
            RiskLevel::Low,
            |_ctx, args: KeyArgs| async move {
                let key = match args.command {
                    Key::Home => "home",
                    Key::Back => "back",
                };
                Ok::<_, ToolError>(json!({ "pressed": key }))
            },
        )
        .build();
    assert!(keys.is_ok(), "{:?}", keys.err());
}

#[test]
fn rule_device_no_bytes_in_arguments_is_refused_at_build() {
    let lab = Lab::default();
    let error = builder(&lab, "device.lab")
        .device_tool(
            ToolSpec::new("lab_upload", "Upload\nPuts a picture on the device."),
            ToolCategory::Media,
            RiskLevel::Low,
            |_ctx, args: UploadArgs| async move {
                Ok::<_, ToolError>(json!({"stored": args.image_base64.len()}))
            },
        )
        .build()
        .expect_err("bytes in an argument");
    let DefinitionError::UnsafeDeviceArgument(finding) = &error else {
        panic!("expected UnsafeDeviceArgument, got {error}");
    };
    assert_eq!((finding.tool.as_str(), finding.property.as_str()), ("lab_upload", "/image_base64"));
    assert_eq!(finding.rule.id(), "device.no_bytes_in_arguments");
}

#[tokio::test]
async fn an_operator_may_opt_out_of_the_command_rule_for_one_tool_and_property() {
    let lab = Lab::default();
    // Opting out for another property or Tool does not help.
    let elsewhere =
        exec(builder(&lab, "device.lab")).allow_unconstrained_device_argument("lab_exec", "script");
    assert!(matches!(elsewhere.build(), Err(DefinitionError::UnsafeDeviceArgument(_))));
    let connector = exec(builder(&lab, "device.lab"))
        .allow_unconstrained_device_argument("lab_exec", "command")
        .build()
        .expect("the operator chose to allow it");
    assert!(connector.card().tools.iter().any(|t| t.tool_id.as_str() == "lab_exec"));
}

#[tokio::test]
async fn rule_media_check_covers_every_tool_result_of_a_device_connector() {
    let lab = Lab::default();
    let connector = builder(&lab, "device.lab")
        .tool(
            ToolSpec::new("lab_export", "Export\nExports the device log.")
                .profile(PROFILE_DEVICE_V1)
                .read_only(),
            |_ctx, _args: NoArgs| async {
                Ok::<_, ToolError>(json!({"log": {"base64": "iVBORw0KGgo="}}))
            },
        )
        .tool(
            ToolSpec::new("lab_note", "Note\nA plain answer.").profile(PROFILE_DEVICE_V1),
            |_ctx, _args: NoArgs| async { Ok::<_, ToolError>(json!({"note": "all good"})) },
        )
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let lane = serve(connector, dir.path(), &clock).await;
    let mut c = client(&lane.base, "device.lab", &[PROFILE_DEVICE_V1]).await;
    let (channel, _) = open_and_bind(&mut c, "dev-1").await;
    let leak = invoke(&mut c, &channel, "lab_export", json!({}), "e1").await;
    assert_eq!(code(&leak), Some(ErrorCode::ToolInvokeFailed), "{leak:?}");
    assert!(!serde_json::to_string(&leak).unwrap().contains("iVBORw0KGgo"));
    let fine = invoke(&mut c, &channel, "lab_note", json!({}), "n1").await;
    assert!(fine.error.is_none(), "{fine:?}");
    assert_eq!(payload_json(&fine)["result"], json!({"note": "all good"}));
    let _ = lane.stop.send(());
}
