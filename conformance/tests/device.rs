//! The Device Profile checks over real sockets: every one passes against `device.homie` with
//! the simulated Homie device on a real Mosquitto (started here on a free port), and the
//! result check fails, naming the Tool and the field, against a device Connector whose Tool
//! returns base64.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use xagent_client_runtime::BaseUrl;
use xagent_conformance::{ConformanceOptions, ConformanceReport, Status, run};
use xagent_connector_homie::connector::{BIND_FLOW, TOOL_READ, TOOL_SET};
use xagent_connector_homie::pairing::PairingCodes;
use xagent_connector_homie::sim::{SimConfig, SimDevice};
use xagent_connector_homie::testing::Mosquitto;
use xagent_connector_homie::{Homie, HomieOptions};
use xagent_protocol_types::{
    AuthInput, DescriptorTarget, PROFILE_DEVICE_V1, Secret, TargetDeclaration, TargetType,
};
use xagent_server_runtime::{
    AuthStep, Binding, ChannelContext, Connector, ConnectorServer, DeviceConfig, DeviceStatus,
    DeviceTarget, FlowSpec, RiskLevel, ToolCategory, ToolContext, ToolError, ToolSpec,
};
use xagent_testkit::{Serving, bind_local};

const KEY: &str = "sk-conformance-device-7f31";
const PAIRING: &str = "conformance-pairing-1234";

fn options(base: &str, flow: &str, inputs: AuthInput) -> ConformanceOptions {
    let mut options = ConformanceOptions::new(BaseUrl::parse(base).expect("base"));
    options.api_key = Some(Secret::new(KEY));
    options.timeout = Duration::from_secs(5);
    options.flow = Some(flow.into());
    options.inputs = inputs;
    options
}

fn tool(id: &str, arguments: Value) -> (String, serde_json::Map<String, Value>) {
    (id.to_owned(), arguments.as_object().cloned().unwrap_or_default())
}

fn status(report: &ConformanceReport, id: &str) -> Option<Status> {
    report.check(id).map(|c| c.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_checks_pass_against_device_homie_with_the_simulated_device() {
    let broker = Mosquitto::start().expect("mosquitto starts (apt-get install mosquitto)");
    let mut sim = SimDevice::new(SimConfig::new(broker.mqtt_url(), "conf-thermo")).expect("sim");
    sim.start().await.expect("the simulated device starts");
    let state = tempfile::tempdir().expect("state dir");
    let mut pairing = PairingCodes::new();
    pairing.add_entry(&format!("conf-thermo={PAIRING}"), "test").expect("pairing code");
    let mut homie_options = HomieOptions::new(broker.mqtt_url(), pairing, state.path());
    homie_options.api_key = Some(Secret::new(KEY));
    let homie = Homie::open(homie_options).await.expect("device.homie starts");
    let serving =
        Serving::spawn(bind_local(None).await.expect("bind"), |listener, shutdown| async move {
            let _ = homie.serve(listener, shutdown).await;
        });
    let base = serving.base_url();

    let inputs =
        AuthInput::default().with("device_id", "conf-thermo").with("pairing_code", PAIRING);
    let mut options = options(&base, BIND_FLOW, inputs);
    options.tools = vec![
        tool(
            TOOL_SET,
            json!({"node": "thermostat", "property": "target-temperature", "value": 22}),
        ),
        tool(TOOL_READ, json!({"node": "sensor", "property": "humidity"})),
    ];
    let report = run(options).await;
    let text = report.to_text(false);
    assert!(report.passed(), "{text}");
    for id in [
        "card.profile_target_type",
        "descriptor.profile_target_type",
        "device.result_no_bytes",
        "descriptor.tool_not_in_card",
        "descriptor.tools_declared",
        "tool.homie_property_set.success",
        "tool.homie_property_set.invalid_arguments",
        "tool.homie_property_set.repeat",
        "tool.homie_property_read.success",
        "tool.homie_property_read.invalid_arguments",
        "tool.homie_property_read.repeat",
    ] {
        assert_eq!(status(&report, id), Some(Status::Pass), "{id}:\n{text}");
    }
    // The invalid call published nothing and the repeat was answered from the first call's
    // record: the device saw one set.
    assert_eq!(sim.sets_received(), 1, "{text}");
    assert_eq!(
        sim.value("thermostat", "target-temperature").as_deref().map(str::parse::<f64>),
        Some(Ok(22.0))
    );

    serving.stop().await;
    sim.stop().await;
}

/// A lab device that is always online.
#[derive(Clone)]
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

/// A device Connector with a Tool that breaks Profile §6 where the runtime cannot see it: a
/// plain (not device-declared) Tool returns a picture's base64.
fn broken_lab() -> Connector {
    let built = Connector::builder("device.lab", "Device lab", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Device, "lab", "Lab device"))
        .profile(PROFILE_DEVICE_V1)
        .form_flow(
            FlowSpec::new("lab_bind", "Bind a lab device"),
            |_ctx, form: BindForm| async move {
                let target = DescriptorTarget::new("lab", "Lab device");
                Ok(AuthStep::Authenticated(
                    Binding::new(target).with_secret("device", Secret::new(form.device)),
                ))
            },
        )
        .device_target(Lab, DeviceConfig::default())
        .device_tool(
            ToolSpec::new("lab_set", "Set\nSets the level."),
            ToolCategory::Control,
            RiskLevel::Low,
            |_ctx, args: LevelArgs| async move { Ok::<_, ToolError>(json!({"level": args.level})) },
        )
        .tool(
            ToolSpec::new("lab_picture", "Picture\nReturns a picture's bytes (breaks §6)."),
            |_ctx: ToolContext, _args: NoArgs| async {
                Ok(json!({"picture": {"base64": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="}}))
            },
        )
        .build();
    match built {
        Ok(connector) => connector,
        Err(error) => panic!("the lab connector definition is valid: {error}"),
    }
}

/// [`broken_lab`] served on 127.0.0.1, with its state directory (kept while it runs).
async fn serve_broken_lab() -> (tempfile::TempDir, Serving) {
    let dir = tempfile::tempdir().expect("state dir");
    let server = ConnectorServer::builder(broken_lab())
        .state_dir(dir.path())
        .expect("state dir")
        .api_key(Secret::new(KEY))
        .build()
        .await
        .expect("server");
    let serving =
        Serving::spawn(bind_local(None).await.expect("bind"), |listener, shutdown| async move {
            let _ = server.serve(listener, shutdown).await;
        });
    (dir, serving)
}

/// A Tool of a device Connector that returns media bytes: since every Tool result of a device
/// Connector goes through the runtime's media check (not only `device_tool`s), the bytes never
/// reach xAgent. The call fails with the runtime's refusal naming the field, the suite reports
/// that Tool as failing, and `device.result_no_bytes` (whose failing branch the unit tests in
/// `conformance/src/device.rs` cover) finds no bytes in what did arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_result_no_bytes_rule_the_runtime_withholds_a_base64_result_naming_the_field() {
    let (_dir, serving) = serve_broken_lab().await;
    let base = serving.base_url();

    let mut options = options(&base, "lab_bind", AuthInput::default().with("device", "lab-1"));
    options.tools = vec![tool("lab_set", json!({"level": 4})), tool("lab_picture", json!({}))];
    let report = run(options).await;
    let text = report.to_text(false);
    // The declarations are right: those checks pass.
    for id in ["card.profile_target_type", "descriptor.profile_target_type", "tool.lab_set.repeat"]
    {
        assert_eq!(status(&report, id), Some(Status::Pass), "{id}:\n{text}");
    }
    let picture = report.check("tool.lab_picture.success").expect("reported");
    assert_eq!(picture.status, Status::Fail, "{text}");
    let received = picture.received.as_deref().unwrap_or_default();
    assert!(received.contains("/picture/base64"), "{received}");
    assert!(received.contains("media bytes"), "{received}");
    assert!(!received.contains("iVBORw0KGgo"), "the bytes never leave: {received}");
    assert_eq!(status(&report, "device.result_no_bytes"), Some(Status::Pass), "{text}");
    assert!(!report.passed());

    serving.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_checks_needing_a_sign_in_are_skipped_with_the_connectors_reason() {
    let (_dir, serving) = serve_broken_lab().await;
    let base = serving.base_url();
    // A form without its required field: the sign-in is refused.
    let report = run(options(&base, "lab_bind", AuthInput::default())).await;
    let text = report.to_text(false);
    assert_eq!(status(&report, "card.profile_target_type"), Some(Status::Pass), "{text}");
    for id in ["descriptor.profile_target_type", "device.result_no_bytes"] {
        let check = report.check(id).unwrap_or_else(|| panic!("{id} reported:\n{text}"));
        assert_eq!(check.status, Status::Skipped, "{id}:\n{text}");
        assert!(check.detail.starts_with("sign-in"), "{id}: {}", check.detail);
    }
    serving.stop().await;
}
