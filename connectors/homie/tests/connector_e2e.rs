//! `device.homie` end to end: xAgent's side over a real WebSocket, the Connector, a real
//! Mosquitto (started here on a free port) and the simulated Homie device over real MQTT.

use std::time::Duration;

use serde_json::{Value, json};
use xagent_connector_homie::connector::{
    BIND_FLOW, TOOL_DESCRIBE, TOOL_READ, TOOL_SET, TOOL_SNAPSHOT,
};
use xagent_connector_homie::link::{Availability, HomieLink, LinkConfig};
use xagent_connector_homie::pairing::PairingCodes;
use xagent_connector_homie::sim::{SimConfig, SimDevice};
use xagent_connector_homie::testing::Mosquitto;
use xagent_connector_homie::{CARD_ID, Homie, HomieOptions};
use xagent_protocol_types::{
    AuthInput, AuthLogout, AuthStart, ChannelOpen, ConnectionStatus, ConnectorChannelId,
    ConnectorHello, ErrorCode, PROFILE_DEVICE_V1, Packet, Secret, TargetType, ToolInvoke,
    ToolInvokeContext,
};
use xagent_testkit::{Serving, WsClient, bind_local, payload_json};

const KEY: &str = "homie-test-key";
const CODE: &str = "pair-code-1234";

struct Running {
    base: String,
    link: HomieLink,
    serving: Serving,
}

impl Running {
    async fn stop(self) {
        self.serving.stop().await;
    }
}

async fn start_connector(broker: &Mosquitto, state: &std::path::Path, device: &str) -> Running {
    let mut pairing = PairingCodes::new();
    pairing.add_entry(&format!("{device}={CODE}"), "test").unwrap();
    let mut options = HomieOptions::new(broker.mqtt_url(), pairing, state);
    options.api_key = Some(Secret::new(KEY));
    options.link = LinkConfig {
        set_timeout: Duration::from_millis(800),
        lost_grace: Duration::from_millis(500),
        ..LinkConfig::default()
    };
    let homie = Homie::open(options).await.unwrap();
    let link = homie.link().clone();
    let serving =
        Serving::spawn(bind_local(None).await.unwrap(), |listener, shutdown| async move {
            let _ = homie.serve(listener, shutdown).await;
        });
    Running { base: serving.base_url(), link, serving }
}

async fn client(base: &str) -> WsClient {
    let ws = format!("{}/ws", base.replacen("http", "ws", 1));
    let mut c = WsClient::connect(&ws, Some(KEY)).await.unwrap();
    let hello = c.request(ConnectorHello::new(CARD_ID, vec![PROFILE_DEVICE_V1.into()]), None);
    let ack = c.call(hello).await;
    assert!(ack.error.is_none(), "{ack:?}");
    c
}

async fn open(
    c: &mut WsClient,
    channel: Option<&ConnectorChannelId>,
) -> (ConnectorChannelId, Value) {
    let open = c.request(ChannelOpen::default(), channel);
    let ack = c.call(open).await;
    let id = ack.connector_channel_id.clone().unwrap();
    (id, payload_json(&ack))
}

async fn bind(c: &mut WsClient, channel: &ConnectorChannelId, device: &str, code: &str) -> Value {
    let input = AuthInput::default().with("device_id", device).with("pairing_code", code);
    let start = c.request(AuthStart::new(BIND_FLOW).with_input(input), Some(channel));
    payload_json(&c.call(start).await)
}

async fn invoke(
    c: &mut WsClient,
    channel: &ConnectorChannelId,
    tool: &str,
    args: Value,
    call_id: &str,
) -> Packet {
    let mut arguments = args.as_object().cloned().unwrap_or_default();
    arguments.insert("connector_channel_id".into(), json!(channel.as_str()));
    let invoke =
        ToolInvoke::new(tool, arguments).with_context(ToolInvokeContext::with_call_id(call_id));
    let packet = c.request(invoke, Some(channel));
    c.call(packet).await
}

fn result(ack: &Packet) -> Value {
    assert!(ack.error.is_none(), "expected a result: {:?}", ack.error);
    payload_json(ack)["result"].clone()
}

fn code(ack: &Packet) -> ErrorCode {
    ack.error
        .as_ref()
        .map(|e| e.code.clone())
        .unwrap_or_else(|| panic!("expected an error: {ack:?}"))
}

/// Waits for a Descriptor push on `channel` whose status matches.
async fn descriptor_push(c: &mut WsClient, want: ConnectionStatus) -> Value {
    loop {
        let (push, _) = c.wait_for("connection.descriptor.push").await;
        let d = payload_json(&push)["connection_descriptor"].clone();
        if d["connection"]["status"] == json!(want.as_str()) {
            return d;
        }
    }
}

fn all_tools(d: &Value, status: &str) -> bool {
    d["tools"].as_array().is_some_and(|t| t.iter().all(|t| t["status"] == status))
}

async fn sim(broker: &Mosquitto, device: &str) -> SimDevice {
    let mut sim = SimDevice::new(SimConfig::new(broker.mqtt_url(), device)).unwrap();
    sim.start().await.unwrap();
    sim
}

/// What every test here starts with: a broker, the simulated `device` on it, the Connector
/// holding the device's pairing code, and xAgent connected with one open channel.
struct Setup {
    broker: Mosquitto,
    device: SimDevice,
    state: tempfile::TempDir,
    running: Running,
    c: WsClient,
    channel: ConnectorChannelId,
}

async fn setup(device: &str) -> Setup {
    let broker = Mosquitto::start().expect("mosquitto starts (apt-get install mosquitto)");
    let sim = sim(&broker, device).await;
    let state = tempfile::tempdir().unwrap();
    let running = start_connector(&broker, state.path(), device).await;
    let mut c = client(&running.base).await;
    let (channel, _) = open(&mut c, None).await;
    Setup { broker, device: sim, state, running, c, channel }
}

/// [`setup`], with the channel bound to the device.
async fn bound(device: &str) -> Setup {
    let mut setup = setup(device).await;
    let answer = bind(&mut setup.c, &setup.channel, device, CODE).await;
    assert_eq!(answer["status"], "authenticated");
    setup
}

#[tokio::test]
async fn rule_bind_describe_read_set_and_refusals_over_the_real_broker() {
    let Setup { broker: _broker, device, state: _state, running, mut c, channel } =
        setup("thermo-1").await;

    // A wrong pairing code binds nothing.
    let failed = bind(&mut c, &channel, "thermo-1", "wrong-code-0000").await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let bound = bind(&mut c, &channel, "thermo-1", CODE).await;
    assert_eq!(bound["status"], "authenticated", "{bound}");
    let d = &bound["connection_descriptor"];
    assert_eq!(d["connection"]["target_type"], json!(TargetType::Device.as_str()));
    assert_eq!(d["connection"]["profiles"], json!([PROFILE_DEVICE_V1]));
    assert_eq!(d["connection"]["status"], "connected");
    assert!(all_tools(d, "available"), "{d}");
    assert_eq!(d["target"]["display_name"], "Simulated thermostat", "the device's own $name");
    assert!(!bound.to_string().contains(CODE), "the pairing code never comes back");

    let described = result(&invoke(&mut c, &channel, TOOL_DESCRIBE, json!({}), "c1").await);
    assert_eq!(described["nodes"][0]["node"], "thermostat");
    let read = result(
        &invoke(
            &mut c,
            &channel,
            TOOL_READ,
            json!({"node": "sensor", "property": "humidity"}),
            "c2",
        )
        .await,
    );
    assert_eq!(read["value"], 45);

    let set_args = json!({"node": "thermostat", "property": "target-temperature", "value": 23.5});
    let set = result(&invoke(&mut c, &channel, TOOL_SET, set_args.clone(), "c3").await);
    assert_eq!((set["value"].clone(), set["confirmed"].clone()), (json!(23.5), json!(true)));
    assert_eq!(device.sets_received(), 1);
    // The same call again (a network retry): the first result, no second publish.
    let again = result(&invoke(&mut c, &channel, TOOL_SET, set_args, "c3").await);
    assert_eq!(again, set);
    // Out of range and read-only: invalid_arguments, nothing published.
    let out = invoke(
        &mut c,
        &channel,
        TOOL_SET,
        json!({"node": "thermostat", "property": "target-temperature", "value": 31}),
        "c4",
    )
    .await;
    assert_eq!(code(&out), ErrorCode::InvalidArguments);
    let ro = invoke(
        &mut c,
        &channel,
        TOOL_SET,
        json!({"node": "sensor", "property": "temperature", "value": 20}),
        "c5",
    )
    .await;
    assert_eq!(code(&ro), ErrorCode::InvalidArguments);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(device.sets_received(), 1, "refused and repeated sets never reach the device");

    // One channel per device: a second channel cannot bind it while the first holds it.
    let (other, _) = open(&mut c, None).await;
    let input = AuthInput::default().with("device_id", "thermo-1").with("pairing_code", CODE);
    let start = c.request(AuthStart::new(BIND_FLOW).with_input(input), Some(&other));
    let refused = c.call(start).await;
    assert_eq!(code(&refused), ErrorCode::PermissionDenied);
    running.stop().await;
}

/// The broker watch of a bound device is one of the runtime's shared consumers: binding the
/// same channel again joins it, and signing the channel out stops it.
#[tokio::test]
async fn the_device_watch_is_kept_once_per_channel_and_stopped_at_sign_out() {
    let Setup { broker: _broker, device: _device, state: _state, running, mut c, channel } =
        setup("thermo-6").await;
    for _ in 0..2 {
        assert_eq!(bind(&mut c, &channel, "thermo-6", CODE).await["status"], "authenticated");
        assert_eq!(running.link.availability("thermo-6"), Availability::Online);
    }
    let logout = c.request(AuthLogout::default(), Some(&channel));
    let ack = c.call(logout).await;
    assert!(ack.error.is_none(), "{ack:?}");
    assert_eq!(
        running.link.availability("thermo-6"),
        Availability::Unknown("not watched".into()),
        "the sign-out stopped the channel's one watch"
    );
    running.stop().await;
}

#[tokio::test]
async fn rule_two_concurrent_sets_on_one_channel_run_one_after_the_other() {
    let Setup { broker: _broker, device, state: _state, running, mut c, channel } =
        bound("thermo-2").await;
    let mut sent = Vec::new();
    for (i, value) in [json!(18.0), json!(26.0)].into_iter().enumerate() {
        let mut arguments =
            json!({"node": "thermostat", "property": "target-temperature", "value": value});
        arguments["connector_channel_id"] = json!(channel.as_str());
        let invoke = ToolInvoke::new(TOOL_SET, arguments.as_object().cloned().unwrap())
            .with_context(ToolInvokeContext::with_call_id(format!("par-{i}")));
        let packet = c.request(invoke, Some(&channel));
        c.send(&packet).await;
        sent.push(packet.packet_id.clone());
    }
    let mut acks = 0;
    while acks < 2 {
        let p = c.next_packet().await;
        if p.type_str() == "tool.invoke.ack" {
            assert!(p.error.is_none(), "{p:?}");
            acks += 1;
        }
    }
    let log = device.log();
    assert_eq!(
        log,
        vec![
            "set thermostat/target-temperature=18.0",
            "value thermostat/target-temperature=18.0",
            "set thermostat/target-temperature=26.0",
            "value thermostat/target-temperature=26.0",
        ],
        "the second set reached the device only after the first was confirmed"
    );
    running.stop().await;
}

#[tokio::test]
async fn rule_killed_device_makes_tools_unavailable_then_back_and_timeouts_are_command_timeout() {
    let Setup { broker: _broker, mut device, state: _state, running, mut c, channel } =
        bound("thermo-3").await;

    device.kill();
    let d = descriptor_push(&mut c, ConnectionStatus::Offline).await;
    assert!(all_tools(&d, "unavailable"), "{d}");
    let humidity = json!({"node": "sensor", "property": "humidity"});
    let offline = invoke(&mut c, &channel, TOOL_READ, humidity.clone(), "k1").await;
    assert_eq!(code(&offline), ErrorCode::DeviceOffline);

    device.start().await.unwrap();
    let d = descriptor_push(&mut c, ConnectionStatus::Connected).await;
    assert!(all_tools(&d, "available"), "{d}");
    // The refused call may run now that the device is back (it never reached the device).
    let read = invoke(&mut c, &channel, TOOL_READ, humidity, "k1").await;
    assert_eq!(result(&read)["value"], 45);

    device.ignore_sets(true);
    let slow = invoke(
        &mut c,
        &channel,
        TOOL_SET,
        json!({"node": "thermostat", "property": "mode", "value": "cool"}),
        "k2",
    )
    .await;
    assert_eq!(code(&slow), ErrorCode::CommandTimeout);
    assert_eq!(device.sets_received(), 1);
    running.stop().await;
}

#[tokio::test]
async fn rule_restart_while_the_device_is_down_is_not_projected_connected() {
    let Setup { broker, mut device, state, running, c, channel } = bound("thermo-4").await;
    c.close().await;
    running.stop().await;

    device.kill();
    let running = start_connector(&broker, state.path(), "thermo-4").await;
    let mut c = client(&running.base).await;
    let (reopened, ack) = open(&mut c, Some(&channel)).await;
    assert_eq!(reopened, channel);
    let status = ack["connection_descriptor"]["connection"]["status"].clone();
    assert_ne!(status, "connected", "{ack}");
    let get = c.request(xagent_protocol_types::DescriptorGet::default(), Some(&channel));
    let d = payload_json(&c.call(get).await)["connection_descriptor"].clone();
    assert_ne!(d["connection"]["status"], "connected", "{d}");
    assert!(all_tools(&d, "unavailable"), "{d}");

    device.start().await.unwrap();
    let d = descriptor_push(&mut c, ConnectionStatus::Connected).await;
    assert!(all_tools(&d, "available"), "{d}");
    running.stop().await;
}

#[tokio::test]
async fn rule_snapshot_is_delivered_as_a_file_ref_and_downloaded() {
    let Setup { broker: _broker, device: _device, state: _state, running, mut c, channel } =
        bound("cam-1").await;
    let shot = result(&invoke(&mut c, &channel, TOOL_SNAPSHOT, json!({}), "s1").await);
    assert!(shot["file_ref"].as_str().is_some_and(|f| !f.is_empty()), "{shot}");
    assert_eq!(shot["mime_type"], "image/png");
    let text = shot.to_string();
    assert!(!text.contains("base64") && !text.contains("data:"), "{text}");
    let url = shot["download_url"].as_str().unwrap();
    let url = if url.starts_with('/') { format!("{}{url}", running.base) } else { url.to_owned() };
    let bytes = reqwest::get(&url).await.unwrap().bytes().await.unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    assert_eq!(shot["byte_size"], json!(bytes.len()));
    running.stop().await;
}

#[tokio::test]
async fn pinned_description_survives_a_restart_and_a_new_bind_takes_the_change() {
    let Setup { broker, device, state, running, c, channel } = bound("thermo-pin").await;
    c.close().await;
    running.stop().await;
    // While the Connector is down, someone widens the range on the broker.
    let mut options = rumqttc::MqttOptions::new("pin-attacker", "127.0.0.1", broker.port());
    options.set_keep_alive(Duration::from_secs(30));
    let (evil, mut eventloop) = rumqttc::AsyncClient::new(options, 16);
    tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
    let topic = "homie/thermo-pin/thermostat/target-temperature/$format";
    evil.publish(topic, rumqttc::QoS::AtLeastOnce, true, "0:200").await.unwrap();

    let running = start_connector(&broker, state.path(), "thermo-pin").await;
    let mut c = client(&running.base).await;
    let (reopened, _) = open(&mut c, Some(&channel)).await;
    assert_eq!(reopened, channel);
    let _ = descriptor_push(&mut c, ConnectionStatus::Connected).await;
    let wide = json!({"node": "thermostat", "property": "target-temperature", "value": 150});
    let refused = invoke(&mut c, &channel, TOOL_SET, wide, "p1").await;
    assert_eq!(code(&refused), ErrorCode::InvalidArguments, "judged by the pinned 10:30");
    assert_eq!(device.sets_received(), 0);
    let d = result(&invoke(&mut c, &channel, TOOL_DESCRIBE, json!({}), "p2").await);
    assert_eq!(d["description_changed"], true, "{d}");
    assert_eq!(d["nodes"][0]["properties"][0]["format"], json!({"min": 10.0, "max": 30.0}));
    // The device owner binds again: the new description is pinned.
    let again = bind(&mut c, &channel, "thermo-pin", CODE).await;
    assert_eq!(again["status"], "authenticated", "{again}");
    let d = result(&invoke(&mut c, &channel, TOOL_DESCRIBE, json!({}), "p3").await);
    assert_eq!(d["nodes"][0]["properties"][0]["format"], json!({"min": 0.0, "max": 200.0}));
    assert!(d.get("description_changed").is_none(), "{d}");
    running.stop().await;
}
