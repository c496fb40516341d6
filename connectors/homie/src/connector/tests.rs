//! The Connector's handlers called directly, with the runtime's test contexts
//! (`ToolContext::for_test`, `AuthContext::for_test`): no server, no xAgent. The broker URL
//! points at a closed port, so each test shows a refusal that comes before the broker is asked.

use super::*;

const DEVICE: &str = "lamp-1";
const CODE: &str = "correct-horse-battery";

fn app() -> App {
    let (link, _task) = HomieLink::start(&MqttUrl::new("127.0.0.1", 9), LinkConfig::default());
    let mut pairing = PairingCodes::new();
    pairing.add(DEVICE, &Secret::new(CODE), "test").unwrap();
    App {
        link,
        pairing: Arc::new(Mutex::new(pairing)),
        bind_timeout: Duration::from_millis(50),
        handovers: Arc::default(),
    }
}

fn unbound() -> Binding {
    Binding::new(DescriptorTarget::new(PROVIDER, "nothing bound"))
}

#[tokio::test]
async fn a_device_tool_on_a_channel_without_a_bound_device_is_refused() {
    let ctx = ToolContext::for_test(unbound(), app()).unwrap();
    let error = describe(ctx, DescribeArgs {}).await.unwrap_err();
    assert_eq!(error.code, ErrorCode::ConnectionNotFound);
    assert!(error.message.contains("no device is bound"), "{}", error.message);
}

#[tokio::test]
async fn a_device_bound_before_descriptions_were_pinned_is_refused() {
    let binding = unbound().with_secret(DEVICE_SECRET, Secret::new(DEVICE));
    let ctx = ToolContext::for_test(binding, app()).unwrap();
    let args = ReadArgs { node: "light".into(), property: "on".into() };
    let error = read(ctx, args).await.unwrap_err();
    assert!(error.message.contains("pinned"), "{}", error.message);
}

#[tokio::test]
async fn bind_refuses_a_wrong_pairing_code_before_asking_the_broker() {
    let ctx = AuthContext::for_test(BIND_FLOW, app()).unwrap();
    let form = BindForm { device_id: DEVICE.into(), pairing_code: Secret::new("wrong-code-123") };
    let step = bind(ctx, form).await.unwrap();
    let AuthStep::Failed(reason) = step else { panic!("{step:?}") };
    assert!(!reason.contains("wrong-code-123"), "the code is never echoed: {reason}");
}

#[tokio::test]
async fn bind_refuses_a_malformed_device_id() {
    let ctx = AuthContext::for_test(BIND_FLOW, app()).unwrap();
    let form = BindForm { device_id: "Lamp/1".into(), pairing_code: Secret::new(CODE) };
    let step = bind(ctx, form).await.unwrap();
    assert!(matches!(step, AuthStep::Failed(_)), "{step:?}");
}

#[tokio::test]
async fn a_restored_binding_without_a_device_is_offline() {
    let ctx = ChannelContext::for_test(unbound(), app()).unwrap();
    assert_eq!(HomieTarget.check(ctx).await, DeviceStatus::Offline);
}
