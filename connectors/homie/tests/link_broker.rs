//! The broker link against a real Mosquitto (started by the test on a free port) and the
//! simulated device speaking real MQTT: discovery, reads, confirmed sets, refusals before
//! anything is published, snapshots, the last will, timeouts and a broker restart.

use std::time::Duration;

use serde_json::json;
use xagent_connector_homie::HomieError;
use xagent_connector_homie::link::{Availability, DeviceEvent, HomieLink, LinkConfig};
use xagent_connector_homie::sim::{SimConfig, SimDevice};
use xagent_connector_homie::testing::Mosquitto;
use xagent_protocol_types::ErrorCode;

const WAIT: Duration = Duration::from_secs(10);

struct Setup {
    broker: Mosquitto,
    link: HomieLink,
    sim: SimDevice,
}

async fn setup(device: &str) -> Setup {
    let broker = Mosquitto::start().expect("mosquitto starts (apt-get install mosquitto)");
    let config = LinkConfig {
        set_timeout: Duration::from_millis(700),
        snapshot_timeout: Duration::from_secs(3),
        ..LinkConfig::default()
    };
    let (link, _task) = HomieLink::start(&broker.mqtt_url(), config);
    let mut sim = SimDevice::new(SimConfig::new(broker.mqtt_url(), device)).unwrap();
    sim.start().await.unwrap();
    link.watch(device).unwrap();
    link.wait_online(device, WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", broker.log()));
    Setup { broker, link, sim }
}

async fn next_offline(events: &mut tokio::sync::broadcast::Receiver<DeviceEvent>) -> String {
    tokio::time::timeout(WAIT, async {
        loop {
            let e = events.recv().await.unwrap();
            if let Availability::Offline(why) = e.availability {
                return why;
            }
        }
    })
    .await
    .expect("the device goes offline")
}

#[tokio::test]
async fn describe_and_read_follow_what_the_device_published() {
    let s = setup("thermo-read").await;
    let d = s.link.describe("thermo-read").unwrap().to_json();
    assert_eq!(d["state"], "ready");
    let nodes: Vec<&str> =
        d["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["thermostat", "sensor", "camera"]);
    assert_eq!(d["nodes"][0]["properties"][0]["format"], json!({"min": 10.0, "max": 30.0}));
    assert_eq!(d["nodes"][2]["snapshot"], true);
    let r = s.link.read("thermo-read", "sensor", "humidity").unwrap();
    assert_eq!((r["value"].clone(), r["unit"].clone()), (json!(45), json!("%")));
    s.sim.set_temperature_reading(23.25).await;
    tokio::time::timeout(WAIT, async {
        while s.link.read("thermo-read", "sensor", "temperature").unwrap()["value"] != json!(23.2)
            && s.link.read("thermo-read", "sensor", "temperature").unwrap()["value"] != json!(23.3)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the new reading arrives");
    let err = s.link.read("thermo-read", "sensor", "nope").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments);
}

#[tokio::test]
async fn rule_set_is_checked_published_once_and_confirmed_by_the_device() {
    let s = setup("thermo-set").await;
    let ok =
        s.link.set("thermo-set", "thermostat", "target-temperature", &json!(22.5)).await.unwrap();
    assert_eq!(ok["value"], json!(22.5));
    assert_eq!(ok["confirmed"], true);
    assert_eq!(s.sim.value("thermostat", "target-temperature").as_deref(), Some("22.5"));
    assert_eq!(s.sim.sets_received(), 1);
    let mode = s.link.set("thermo-set", "thermostat", "mode", &json!("cool")).await.unwrap();
    assert_eq!(mode["value"], "cool");
    // Out of range, wrong enum value, read-only: refused before anything is published.
    for (node, property, value) in [
        ("thermostat", "target-temperature", json!(31)),
        ("thermostat", "mode", json!("boost")),
        ("sensor", "temperature", json!(20)),
    ] {
        let err = s.link.set("thermo-set", node, property, &value).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArguments, "{property} {value}: {err}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.sim.sets_received(), 2, "refused sets never reach the broker");
}

#[tokio::test]
async fn rule_unconfirmed_set_ends_in_command_timeout() {
    let s = setup("thermo-slow").await;
    s.sim.ignore_sets(true);
    let err = s
        .link
        .set("thermo-slow", "thermostat", "target-temperature", &json!(25))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::CommandTimeout, "{err}");
    assert!(err.to_string().contains("25.0"), "{err}");
    assert_eq!(s.sim.sets_received(), 1);
}

#[tokio::test]
async fn snapshot_returns_the_cameras_picture() {
    let s = setup("cam-1").await;
    let (bytes, mime) = s.link.snapshot("cam-1", "camera").await.unwrap();
    assert_eq!(mime, "image/png");
    assert_eq!(&bytes[1..4], b"PNG");
    let err = s.link.snapshot("cam-1", "thermostat").await.unwrap_err();
    assert!(matches!(err, HomieError::NoSnapshot(_)), "{err}");
}

#[tokio::test]
async fn rule_killed_device_goes_offline_by_its_last_will_and_comes_back() {
    let mut s = setup("thermo-kill").await;
    let mut events = s.link.subscribe();
    s.sim.kill();
    let offline = next_offline(&mut events).await;
    assert!(offline.contains("lost"), "{offline}");
    let err = s.link.set("thermo-kill", "thermostat", "mode", &json!("off")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::DeviceOffline);
    s.sim.start().await.unwrap();
    s.link.wait_online("thermo-kill", WAIT).await.unwrap();
    s.link.set("thermo-kill", "thermostat", "mode", &json!("off")).await.unwrap();
    // A clean stop is `disconnected`, also offline.
    let mut events = s.link.subscribe();
    s.sim.stop().await;
    let offline = next_offline(&mut events).await;
    assert!(offline.contains("disconnected"), "{offline}");
}

#[tokio::test]
async fn broker_restart_takes_devices_offline_then_back() {
    let mut s = setup("thermo-broker").await;
    let mut events = s.link.subscribe();
    s.broker.restart().unwrap();
    let e = tokio::time::timeout(WAIT, events.recv()).await.unwrap().unwrap();
    assert!(matches!(e.availability, Availability::Offline(_)), "{e:?}");
    // Retained messages were lost with the broker (no persistence); the device republishes its
    // description when it reconnects, and the link resubscribes.
    s.link.wait_online("thermo-broker", Duration::from_secs(20)).await.unwrap();
    s.link.set("thermo-broker", "thermostat", "target-temperature", &json!(18)).await.unwrap();
}
