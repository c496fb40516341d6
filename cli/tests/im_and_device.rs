//! One target type per channel (issue 22, item 7), both ends over real sockets: a Card
//! declaring `im` and `device` with an xAgent supporting both Profiles. The flow a channel signs
//! in with decides its `target_type`, the channel enables only the negotiated Profiles allowed
//! for it, every Descriptor passes the validator, and `client-runtime` resolves a Tool on each
//! kind of channel.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use xagent_client_runtime::{BaseUrl, ClientConfig, ControlPlane, DataPlane, admit};
use xagent_protocol_types::{
    AuthInput, AuthStart, AuthStartAck, AuthStatus, ConnectionDescriptor, ConnectorChannelId,
    DescriptorTarget, PROFILE_DEVICE_V1, PROFILE_IM_V2, ProfileId, Secret, TargetDeclaration,
    TargetType, ToolStatus, UserChannelMode,
};
use xagent_protocol_validate::{
    AdmissionWindow, CardFacts, DescriptorContext, validate_descriptor,
};
use xagent_server_runtime::{
    AuthStep, Binding, ChannelContext, Connector, ConnectorServer, DeviceConfig, DeviceStatus,
    DeviceTarget, FlowSpec, RiskLevel, ToolCategory, ToolError, ToolSpec,
};
use xagent_testkit::{Serving, bind_local};

const KEY: &str = "sk-im-and-device-5c1e";
const CARD: &str = "lab.mixed";

/// The lab's device: always answers.
struct Lab;

impl DeviceTarget for Lab {
    fn device_key(&self, binding: &Binding) -> Option<String> {
        binding.secret("device").map(|s| s.expose().to_owned())
    }

    async fn check(&self, _ctx: ChannelContext) -> DeviceStatus {
        DeviceStatus::Online
    }
}

#[derive(Deserialize, JsonSchema)]
struct ChatForm {
    /// Room
    room: String,
}

#[derive(Deserialize, JsonSchema)]
struct DeviceForm {
    /// Device
    device: String,
}

#[derive(Deserialize, JsonSchema)]
struct Text {
    /// The text.
    text: String,
}

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

fn connector() -> Connector {
    Connector::builder(CARD, "Lab chat and device", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "lab", "Lab chat"))
        .target(TargetDeclaration::new(TargetType::Device, "lab", "Lab device"))
        .profile(PROFILE_IM_V2)
        .profile(PROFILE_DEVICE_V1)
        .user_channel_mode(UserChannelMode::Multiple)
        .on_message(|_, _| async {})
        .form_flow(
            FlowSpec::new("lab_chat", "Join a lab room").target_type(TargetType::Im),
            |_ctx, form: ChatForm| async move {
                Ok(AuthStep::Authenticated(Binding::new(DescriptorTarget::new("lab", form.room))))
            },
        )
        .form_flow(
            FlowSpec::new("lab_bind", "Bind a lab device").target_type(TargetType::Device),
            |_ctx, form: DeviceForm| async move {
                let target = DescriptorTarget::new("lab", "Lab device");
                Ok(AuthStep::Authenticated(
                    Binding::new(target).with_secret("device", Secret::new(form.device)),
                ))
            },
        )
        .device_target(Lab, DeviceConfig::default())
        .tool(
            ToolSpec::new("lab_chat_echo", "Echo\nReturns its text."),
            |_ctx, a: Text| async move { Ok::<_, ToolError>(json!({ "text": a.text })) },
        )
        .device_tool(
            ToolSpec::new("lab_read", "Read\nReads the lab device."),
            ToolCategory::Observation,
            RiskLevel::Low,
            |_ctx, _args: NoArgs| async { Ok::<_, ToolError>(json!({ "level": 3 })) },
        )
        .build()
        .expect("a Card with im and device builds")
}

async fn sign_in(
    plane: &DataPlane,
    flow: &str,
    field: &str,
    value: &str,
) -> (ConnectorChannelId, ConnectionDescriptor) {
    let channel = plane.open_channel_for("alice", None).await.expect("opens").connector_channel_id;
    let start = AuthStart::new(flow).with_input(AuthInput::default().with(field, value));
    let AuthStartAck(progress) =
        plane.request(Some(&channel), start).await.expect("the sign-in is answered");
    assert_eq!(progress.status, AuthStatus::Authenticated, "{flow}: {progress:?}");
    let descriptor = progress.connection_descriptor.expect("an authenticated ack has a Descriptor");
    plane.remember_channel(channel.clone()).await;
    (channel, descriptor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_a_channel_has_the_target_type_of_its_flow_and_only_its_profiles() {
    let connector = connector();
    let flows: Vec<_> = connector.card().auth_flows.iter().map(|f| f.target_type.clone()).collect();
    assert_eq!(flows, [TargetType::Im, TargetType::Device], "each flow keeps its own target type");
    let server = ConnectorServer::builder(connector)
        .api_key(Secret::new(KEY))
        .build()
        .await
        .expect("serves");
    let listener = bind_local(None).await.expect("binds");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let running = server.clone();
    let serving = Serving::spawn(listener, |listener, shutdown| async move {
        let _ = running.serve(listener, shutdown).await;
    });

    let base_url = BaseUrl::parse(&base).expect("base");
    let control = ControlPlane::new(base_url.clone(), Some(Secret::new(KEY)));
    let admitted = admit(&control, &AdmissionWindow::default(), None).await.expect("admitted");
    let config = ClientConfig::for_card(base_url, &admitted.card).with_api_key(Secret::new(KEY));
    assert_eq!(
        config.supported_profiles,
        [ProfileId::new(PROFILE_IM_V2), ProfileId::new(PROFILE_DEVICE_V1)],
        "the xAgent supports both Profiles"
    );
    let (plane, _events) = DataPlane::connect(config).await.expect("starts");
    plane.connected().await.expect("online");

    let (chat, chat_descriptor) = sign_in(&plane, "lab_chat", "room", "Lobby").await;
    let (device, device_descriptor) = sign_in(&plane, "lab_bind", "device", "dev-1").await;

    let card = serde_json::to_value(server.card()).expect("card");
    let facts = CardFacts::from_value(&card);
    for (descriptor, target_type, profile) in [
        (&chat_descriptor, TargetType::Im, PROFILE_IM_V2),
        (&device_descriptor, TargetType::Device, PROFILE_DEVICE_V1),
    ] {
        assert_eq!(descriptor.connection.target_type, target_type, "{descriptor:?}");
        assert_eq!(descriptor.connection.profiles, [ProfileId::new(profile)], "{descriptor:?}");
        let value = serde_json::to_value(descriptor).expect("descriptor");
        let report = validate_descriptor(&value, DescriptorContext::with_card(&facts));
        let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
        assert!(errors.is_empty(), "{target_type}: {errors:?}");
    }
    // A Tool of the other kind of channel is not offered there.
    let status = |d: &ConnectionDescriptor, tool: &str| d.tool(tool).map(|t| t.status.clone());
    assert_eq!(status(&chat_descriptor, "lab_read"), Some(ToolStatus::NotSupported));
    assert_eq!(status(&device_descriptor, "lab_chat_echo"), Some(ToolStatus::NotSupported));

    // client-runtime took both Descriptors and resolves each Tool to its kind of channel.
    let directory = plane.directory();
    for channel in [&chat, &device] {
        assert!(
            directory.get(channel).and_then(|e| e.descriptor.as_ref()).is_some(),
            "client-runtime accepted the Descriptor of {channel}"
        );
    }
    assert_eq!(directory.resolve("alice", None, "lab_chat_echo").expect("resolves"), chat);
    assert_eq!(directory.resolve("alice", None, "lab_read").expect("resolves"), device);
    for (tool, arguments, channel, result) in [
        ("lab_chat_echo", json!({ "text": "hi" }), &chat, json!({ "text": "hi" })),
        ("lab_read", json!({}), &device, json!({ "level": 3 })),
    ] {
        let arguments = arguments.as_object().cloned().unwrap_or_default();
        let outcome = plane.invoke_tool("alice", None, tool, arguments).await.expect(tool);
        assert_eq!(&outcome.channel, channel, "{tool}");
        assert_eq!(outcome.ack.result, Some(result), "{tool}");
    }

    plane.close().await;
    serving.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_a_flow_for_a_target_type_without_a_negotiated_profile_is_refused() {
    let server = ConnectorServer::builder(connector())
        .api_key(Secret::new(KEY))
        .build()
        .await
        .expect("serves");
    let listener = bind_local(None).await.expect("binds");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let running = server.clone();
    let serving = Serving::spawn(listener, |listener, shutdown| async move {
        let _ = running.serve(listener, shutdown).await;
    });
    let base_url = BaseUrl::parse(&base).expect("base");
    let control = ControlPlane::new(base_url.clone(), Some(Secret::new(KEY)));
    let admitted = admit(&control, &AdmissionWindow::default(), None).await.expect("admitted");
    let mut config =
        ClientConfig::for_card(base_url, &admitted.card).with_api_key(Secret::new(KEY));
    config.supported_profiles = vec![ProfileId::new(PROFILE_IM_V2)];
    let (plane, _events) = DataPlane::connect(config).await.expect("starts");
    plane.connected().await.expect("online");
    let channel = plane.open_channel_for("alice", None).await.expect("opens");
    assert_eq!(channel.connection_descriptor.connection.target_type, TargetType::Im);
    assert_eq!(channel.connection_descriptor.connection.profiles, [ProfileId::new(PROFILE_IM_V2)]);
    let start = AuthStart::new("lab_bind").with_input(AuthInput::default().with("device", "d"));
    let refused = plane
        .request::<AuthStart>(Some(&channel.connector_channel_id), start)
        .await
        .expect_err("an IM-only xAgent cannot sign in a device channel");
    assert_eq!(refused.code().to_string(), "invalid_packet", "{refused}");
    plane.close().await;
    serving.stop().await;
}
