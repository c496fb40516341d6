//! `device.homie` replicas on one PostgreSQL database (testkit's server) and one real
//! Mosquitto, xAgent's side over a real WebSocket to one of them: what the Descriptor says
//! about a freshly bound device is what its Tools do.
#![cfg(feature = "postgres")]

use std::time::Duration;

use serde_json::{Value, json};
use xagent_connector_homie::connector::{BIND_FLOW, TOOL_DESCRIBE, TOOL_READ, TOOL_SET};
use xagent_connector_homie::link::LinkConfig;
use xagent_connector_homie::pairing::PairingCodes;
use xagent_connector_homie::sim::{SimConfig, SimDevice};
use xagent_connector_homie::testing::Mosquitto;
use xagent_connector_homie::{CARD_ID, Homie, HomieOptions};
use xagent_protocol_types::{
    AuthInput, AuthStart, ChannelOpen, ConnectorChannelId, ConnectorHello, PROFILE_DEVICE_V1,
    Packet, Secret, ToolInvoke, ToolInvokeContext,
};
use xagent_server_runtime::ops::DatabaseUrl;
use xagent_testkit::postgres::TestPostgres;
use xagent_testkit::{Serving, WsClient, bind_local, payload_json};

const KEY: &str = "homie-replicas-key";
const CODE: &str = "pair-code-5678";

/// One replica: the Connector on the shared database, its own state directory (files).
struct Replica {
    base: String,
    serving: Serving,
    _state: tempfile::TempDir,
}

impl Replica {
    async fn start(broker: &Mosquitto, url: &DatabaseUrl, devices: &[&str]) -> Self {
        let mut pairing = PairingCodes::new();
        for device in devices {
            pairing.add_entry(&format!("{device}={CODE}"), "test").expect("a pairing entry");
        }
        let state = tempfile::tempdir().expect("a state directory");
        let mut options = HomieOptions::new(broker.mqtt_url(), pairing, state.path());
        options.api_key = Some(Secret::new(KEY));
        options.database_url = Some(url.clone());
        // Generous waits: the machine may be busy, and the rule is about the order, not speed.
        options.link = LinkConfig { set_timeout: Duration::from_secs(5), ..LinkConfig::default() };
        options.bind_timeout = Duration::from_secs(10);
        let homie = Homie::open(options).await.expect("a replica starts on the shared database");
        let serving =
            Serving::spawn(bind_local(None).await.expect("binds"), |listener, stop| async move {
                let _ = homie.serve(listener, stop).await;
            });
        Self { base: serving.base_url(), serving, _state: state }
    }

    async fn client(&self) -> WsClient {
        let ws = format!("{}/ws", self.base.replacen("http", "ws", 1));
        let mut c = WsClient::connect(&ws, Some(KEY)).await.expect("connects");
        let hello = c.request(ConnectorHello::new(CARD_ID, vec![PROFILE_DEVICE_V1.into()]), None);
        let ack = c.call(hello).await;
        assert!(ack.error.is_none(), "{ack:?}");
        c
    }
}

async fn open(c: &mut WsClient) -> ConnectorChannelId {
    let open = c.request(ChannelOpen::default(), None);
    let ack = c.call(open).await;
    ack.connector_channel_id.clone().expect("a channel id")
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

/// On replicas the channel's broker watch is a consumer that starts a moment after the bind
/// (once its lease is won): the bind's own watch is handed over to it, never let go before,
/// so the device the Descriptor shows available answers the very next calls (they were
/// refused `device_offline`, "not bound", while the device was not followed in between).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_tools_a_bind_describes_available_answer_at_once_on_replicas() {
    let devices = ["rep-thermo-1", "rep-thermo-2", "rep-thermo-3"];
    let broker = Mosquitto::start().expect("mosquitto starts (apt-get install mosquitto)");
    let mut sims = Vec::new();
    for device in devices {
        let mut sim =
            SimDevice::new(SimConfig::new(broker.mqtt_url(), device)).expect("a simulated device");
        sim.start().await.expect("the simulated device starts");
        sims.push(sim);
    }
    let url = TestPostgres::shared().await.fresh_database().await;
    let a = Replica::start(&broker, &url, &devices).await;
    let b = Replica::start(&broker, &url, &devices).await;
    let mut c = b.client().await;
    for (i, device) in devices.iter().enumerate() {
        let channel = open(&mut c).await;
        let input = AuthInput::default().with("device_id", *device).with("pairing_code", CODE);
        let start = c.request(AuthStart::new(BIND_FLOW).with_input(input), Some(&channel));
        let bound = payload_json(&c.call(start).await);
        assert_eq!(bound["status"], "authenticated", "{bound}");
        let tools = bound["connection_descriptor"]["tools"].as_array().cloned().unwrap_or_default();
        assert!(!tools.is_empty() && tools.iter().all(|t| t["status"] == "available"), "{bound}");

        // At once, as xAgent may: every call the Descriptor offers is served.
        let described = invoke(&mut c, &channel, TOOL_DESCRIBE, json!({}), &format!("d{i}")).await;
        assert!(described.error.is_none(), "{device}: {:?}", described.error);
        let humidity = json!({"node": "sensor", "property": "humidity"});
        let read = invoke(&mut c, &channel, TOOL_READ, humidity, &format!("r{i}")).await;
        assert!(read.error.is_none(), "{device}: {:?}", read.error);
        assert_eq!(payload_json(&read)["result"]["value"], 45);
        let target = json!({"node": "thermostat", "property": "target-temperature", "value": 21});
        let set = invoke(&mut c, &channel, TOOL_SET, target, &format!("s{i}")).await;
        assert!(set.error.is_none(), "{device}: {:?}", set.error);
        assert_eq!(payload_json(&set)["result"]["confirmed"], true);
    }
    assert_eq!(sims.iter().map(SimDevice::sets_received).sum::<usize>(), devices.len());
    c.close().await;
    a.serving.stop().await;
    b.serving.stop().await;
}
