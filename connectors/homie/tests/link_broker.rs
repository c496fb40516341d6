//! The broker link against a real Mosquitto (started by the test on a free port) and the
//! simulated device speaking real MQTT: discovery, reads, confirmed sets, refusals before
//! anything is published, snapshots, the last will, timeouts and a broker restart.

use std::time::Duration;

use serde_json::json;
use xagent_connector_homie::HomieError;
use xagent_connector_homie::link::MqttUrl;
use xagent_connector_homie::link::{Availability, DeviceEvent, HomieLink, LinkConfig};
use xagent_connector_homie::pin::Pinned;
use xagent_connector_homie::sim::{SimConfig, SimDevice};
use xagent_connector_homie::testing::Mosquitto;
use xagent_protocol_types::ErrorCode;
use xagent_protocol_types::Secret;

const WAIT: Duration = Duration::from_secs(10);

struct Setup {
    broker: Mosquitto,
    link: HomieLink,
    sim: SimDevice,
    pin: Pinned,
}

async fn setup(device: &str) -> Setup {
    let broker = Mosquitto::start().expect("mosquitto starts (apt-get install mosquitto)");
    let config = LinkConfig {
        set_timeout: Duration::from_millis(700),
        snapshot_timeout: Duration::from_secs(3),
        lost_grace: Duration::from_millis(500),
        ..LinkConfig::default()
    };
    let (link, _task) = HomieLink::start(&broker.mqtt_url(), config);
    let mut sim = SimDevice::new(SimConfig::new(broker.mqtt_url(), device)).unwrap();
    sim.start().await.unwrap();
    link.watch(device).unwrap();
    link.wait_online(device, WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", broker.log()));
    let pin = link.pin(device).unwrap();
    Setup { broker, link, sim, pin }
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
    let d = s.link.describe("thermo-read", &s.pin).unwrap();
    assert_eq!(d["state"], "ready");
    let nodes: Vec<&str> =
        d["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["thermostat", "sensor", "camera"]);
    assert_eq!(d["nodes"][0]["properties"][0]["format"], json!({"min": 10.0, "max": 30.0}));
    assert_eq!(d["nodes"][2]["snapshot"], true);
    let r = s.link.read("thermo-read", &s.pin, "sensor", "humidity").unwrap();
    assert_eq!((r["value"].clone(), r["unit"].clone()), (json!(45), json!("%")));
    s.sim.set_temperature_reading(23.25).await;
    tokio::time::timeout(WAIT, async {
        while s.link.read("thermo-read", &s.pin, "sensor", "temperature").unwrap()["value"]
            != json!(23.2)
            && s.link.read("thermo-read", &s.pin, "sensor", "temperature").unwrap()["value"]
                != json!(23.3)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the new reading arrives");
    let err = s.link.read("thermo-read", &s.pin, "sensor", "nope").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments);
}

#[tokio::test]
async fn rule_set_is_checked_published_once_and_confirmed_by_the_device() {
    let s = setup("thermo-set").await;
    let ok = s
        .link
        .set("thermo-set", &s.pin, "thermostat", "target-temperature", &json!(22.5))
        .await
        .unwrap();
    assert_eq!(ok["value"], json!(22.5));
    assert_eq!(ok["confirmed"], true);
    assert_eq!(s.sim.value("thermostat", "target-temperature").as_deref(), Some("22.5"));
    assert_eq!(s.sim.sets_received(), 1);
    let mode =
        s.link.set("thermo-set", &s.pin, "thermostat", "mode", &json!("cool")).await.unwrap();
    assert_eq!(mode["value"], "cool");
    // Out of range, wrong enum value, read-only: refused before anything is published.
    for (node, property, value) in [
        ("thermostat", "target-temperature", json!(31)),
        ("thermostat", "mode", json!("boost")),
        ("sensor", "temperature", json!(20)),
    ] {
        let err = s.link.set("thermo-set", &s.pin, node, property, &value).await.unwrap_err();
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
        .set("thermo-slow", &s.pin, "thermostat", "target-temperature", &json!(25))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::CommandTimeout, "{err}");
    assert!(err.to_string().contains("25.0"), "{err}");
    assert_eq!(s.sim.sets_received(), 1);
}

#[tokio::test]
async fn snapshot_returns_the_cameras_picture() {
    let s = setup("cam-1").await;
    let (bytes, mime) = s.link.snapshot("cam-1", &s.pin, "camera").await.unwrap();
    assert_eq!(mime, "image/png");
    assert_eq!(&bytes[1..4], b"PNG");
    let err = s.link.snapshot("cam-1", &s.pin, "thermostat").await.unwrap_err();
    assert!(matches!(err, HomieError::NoSnapshot(_)), "{err}");
}

#[tokio::test]
async fn rule_killed_device_goes_offline_by_its_last_will_and_comes_back() {
    let mut s = setup("thermo-kill").await;
    let mut events = s.link.subscribe();
    s.sim.kill();
    let offline = next_offline(&mut events).await;
    assert!(offline.contains("lost"), "{offline}");
    let err =
        s.link.set("thermo-kill", &s.pin, "thermostat", "mode", &json!("off")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::DeviceOffline);
    s.sim.start().await.unwrap();
    s.link.wait_online("thermo-kill", WAIT).await.unwrap();
    s.link.set("thermo-kill", &s.pin, "thermostat", "mode", &json!("off")).await.unwrap();
    // A clean stop is `disconnected`, also offline (past the online report's debounce window,
    // so it is reported at once).
    tokio::time::sleep(s.link.config().availability_debounce).await;
    let mut events = s.link.subscribe();
    s.sim.stop().await;
    let offline = next_offline(&mut events).await;
    assert!(offline.contains("disconnected"), "{offline}");
}

#[tokio::test]
async fn broker_restart_takes_devices_offline_then_back() {
    let mut s = setup("thermo-broker").await;
    // Past the debounce window of the first report, so the loss is reported at once.
    tokio::time::sleep(s.link.config().availability_debounce).await;
    let mut events = s.link.subscribe();
    s.broker.restart().unwrap();
    let e = tokio::time::timeout(WAIT, events.recv()).await.unwrap().unwrap();
    assert!(matches!(e.availability, Availability::Offline(_)), "{e:?}");
    // Retained messages were lost with the broker (no persistence); the device republishes its
    // description when it reconnects, and the link resubscribes.
    s.link.wait_online("thermo-broker", Duration::from_secs(20)).await.unwrap();
    s.link
        .set("thermo-broker", &s.pin, "thermostat", "target-temperature", &json!(18))
        .await
        .unwrap();
}

/// Someone else on the broker (any client that may publish under the device's topics).
async fn attacker(broker: &Mosquitto) -> rumqttc::AsyncClient {
    let mut options = rumqttc::MqttOptions::new(
        format!("attacker-{}", rand_suffix()),
        "127.0.0.1",
        broker.port(),
    );
    options.set_max_packet_size(4 * 1024 * 1024, 4 * 1024 * 1024);
    let (client, mut eventloop) = rumqttc::AsyncClient::new(options, 64);
    tokio::spawn(async move {
        while eventloop.poll().await.is_ok() || !eventloop.pending.is_empty() {}
    });
    client
}

fn rand_suffix() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    )
}

async fn retain(attacker: &rumqttc::AsyncClient, topic: &str, payload: impl Into<Vec<u8>>) {
    attacker.publish(topic, rumqttc::QoS::AtLeastOnce, true, payload.into()).await.unwrap();
}

/// Waits until the broker delivered the change to the link (`check` on the live description).
async fn until_live(
    link: &HomieLink,
    device: &str,
    check: impl Fn(&xagent_connector_homie::tree::Description) -> bool,
) {
    tokio::time::timeout(WAIT, async {
        loop {
            if link.live_description(device).is_ok_and(|d| check(&d)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the broker delivers the change");
}

fn spec_of<'d>(
    d: &'d xagent_connector_homie::tree::Description,
    node: &str,
    property: &str,
) -> &'d xagent_connector_homie::model::PropertySpec {
    let p = d.node(node).unwrap().properties.iter().find(|p| p.id == property).unwrap();
    p.spec.as_ref().unwrap()
}

#[tokio::test]
async fn oversized_retained_message_does_not_drop_the_link() {
    let broker = Mosquitto::start().expect("mosquitto starts (apt-get install mosquitto)");
    // A small packet limit (64 KiB pictures + overhead), and a retained message four times it.
    let config = LinkConfig { max_snapshot_bytes: 64 * 1024, ..LinkConfig::default() };
    let limit = config.max_packet_bytes() as usize;
    let (link, _task) = HomieLink::start(&broker.mqtt_url(), config);
    let mut sim = SimDevice::new(SimConfig::new(broker.mqtt_url(), "thermo-big")).unwrap();
    sim.start().await.unwrap();
    let evil = attacker(&broker).await;
    retain(&evil, "homie/thermo-big/thermostat/junk", vec![b'x'; 4 * limit]).await;
    link.watch("thermo-big").unwrap();
    link.wait_online("thermo-big", WAIT).await.unwrap();
    let pin = link.pin("thermo-big").unwrap();
    // Resubscribing (a new watch after the last one ended) gets the retained message again.
    for _ in 0..3 {
        link.unwatch("thermo-big");
        link.watch("thermo-big").unwrap();
        link.wait_online("thermo-big", WAIT).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stats = link.stats();
    assert_eq!(stats.losses, 0, "the link never dropped: {stats:?}\n{}", broker.log());
    assert_eq!(stats.connects, 1, "{stats:?}");
    link.set("thermo-big", &pin, "thermostat", "mode", &json!("cool")).await.unwrap();
}

#[tokio::test]
async fn settable_change_after_binding_is_not_applied() {
    let s = setup("thermo-ro").await;
    let evil = attacker(&s.broker).await;
    retain(&evil, "homie/thermo-ro/sensor/temperature/$settable", "true").await;
    until_live(&s.link, "thermo-ro", |d| spec_of(d, "sensor", "temperature").settable).await;
    let err =
        s.link.set("thermo-ro", &s.pin, "sensor", "temperature", &json!(20)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments, "{err}");
    assert!(err.to_string().contains("read-only"), "{err}");
    // A property that was not there at bind time is not settable either.
    retain(&evil, "homie/thermo-ro/sensor/$properties", "temperature,humidity,valve").await;
    retain(&evil, "homie/thermo-ro/sensor/valve/$datatype", "boolean").await;
    retain(&evil, "homie/thermo-ro/sensor/valve/$settable", "true").await;
    until_live(&s.link, "thermo-ro", |d| d.node("sensor").unwrap().properties.len() == 3).await;
    let err = s.link.set("thermo-ro", &s.pin, "sensor", "valve", &json!(true)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments, "{err}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.sim.sets_received(), 0, "nothing was published to the device");
}

#[tokio::test]
async fn range_widened_on_the_broker_is_not_trusted() {
    let s = setup("thermo-wide").await;
    let evil = attacker(&s.broker).await;
    retain(&evil, "homie/thermo-wide/thermostat/target-temperature/$format", "0:200").await;
    until_live(&s.link, "thermo-wide", |d| {
        spec_of(d, "thermostat", "target-temperature").format_text.as_deref() == Some("0:200")
    })
    .await;
    let err = s
        .link
        .set("thermo-wide", &s.pin, "thermostat", "target-temperature", &json!(150))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments, "{err}");
    assert_eq!(s.sim.sets_received(), 0);
    let d = s.link.describe("thermo-wide", &s.pin).unwrap();
    assert_eq!(d["description_changed"], true, "{d}");
    assert_eq!(d["nodes"][0]["properties"][0]["format"], json!({"min": 10.0, "max": 30.0}));
    // In range by the pinned description: still works.
    s.link
        .set("thermo-wide", &s.pin, "thermostat", "target-temperature", &json!(20))
        .await
        .unwrap();
}

#[tokio::test]
async fn retained_lost_state_does_not_offline_a_live_device() {
    let s = setup("thermo-live").await;
    let evil = attacker(&s.broker).await;
    let mut events = s.link.subscribe();
    retain(&evil, "homie/thermo-live/$state", "lost").await;
    // The device keeps publishing readings.
    let started = std::time::Instant::now();
    let mut reading = 20.0;
    while started.elapsed() < Duration::from_secs(2) {
        s.sim.set_temperature_reading(reading).await;
        reading += 0.1;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(s.link.availability("thermo-live"), Availability::Online);
    }
    assert!(events.try_recv().is_err(), "no offline report");
    s.link.set("thermo-live", &s.pin, "thermostat", "mode", &json!("heat")).await.unwrap();
    // A Connector that starts now reads the retained `lost` first, then the live readings.
    let (fresh, _task) = HomieLink::start(
        &s.broker.mqtt_url(),
        LinkConfig { lost_grace: Duration::from_millis(500), ..LinkConfig::default() },
    );
    fresh.watch("thermo-live").unwrap();
    let feeding = async {
        for i in 0..20 {
            s.sim.set_temperature_reading(21.0 + f64::from(i) / 10.0).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let (online, ()) = tokio::join!(fresh.wait_online("thermo-live", WAIT), feeding);
    online.unwrap();
}

#[tokio::test]
async fn snapshot_of_a_non_image_type_is_refused() {
    let broker = Mosquitto::start().expect("mosquitto starts (apt-get install mosquitto)");
    let (link, _task) = HomieLink::start(&broker.mqtt_url(), LinkConfig::default());
    let mut sim = SimDevice::new(SimConfig::new(broker.mqtt_url(), "cam-html")).unwrap();
    sim.start().await.unwrap();
    link.watch("cam-html").unwrap();
    link.wait_online("cam-html", WAIT).await.unwrap();
    // Only once the device's own description arrived (it ends with `$state ready`), so the
    // attacker's retained value is the last one and is not overwritten by the device's.
    let evil = attacker(&broker).await;
    retain(&evil, "homie/cam-html/camera/$snapshot", "text/html").await;
    until_live(&link, "cam-html", |d| {
        d.node("camera").unwrap().snapshot.as_deref() == Some("text/html")
    })
    .await;
    let pin = link.pin("cam-html").unwrap();
    let err = link.snapshot("cam-html", &pin, "camera").await.unwrap_err();
    assert!(matches!(err, HomieError::BadSnapshot(_)), "{err}");
    assert!(err.to_string().contains("image/png"), "{err}");
    assert_eq!(sim.snapshots_taken(), 0, "nothing was asked of the device");
    let d = link.describe("cam-html", &pin).unwrap();
    assert_eq!(d["nodes"][2]["snapshot"], false, "{d}");
}

#[tokio::test]
async fn documented_acl_keeps_others_out_of_a_device_tree() {
    let acl = include_str!("../assets/mosquitto.acl");
    let users = [
        ("xagent-homie", "pw-connector-1"),
        ("thermo-acl", "pw-device-1"),
        ("other", "pw-other-1"),
    ];
    let broker = Mosquitto::start_secured(&users, Some(acl)).expect("mosquitto starts");
    let url = |user: &str, password: &str| {
        MqttUrl::parse(&format!("mqtt://{user}@127.0.0.1:{}", broker.port()))
            .unwrap()
            .with_password(Secret::new(password))
    };
    let (link, _task) =
        HomieLink::start(&url("xagent-homie", "pw-connector-1"), LinkConfig::default());
    let mut sim =
        SimDevice::new(SimConfig::new(url("thermo-acl", "pw-device-1"), "thermo-acl")).unwrap();
    sim.start().await.unwrap();
    link.watch("thermo-acl").unwrap();
    link.wait_online("thermo-acl", WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", broker.log()));
    let pin = link.pin("thermo-acl").unwrap();
    // Another client of the broker tries to rewrite the device's tree.
    let mut options = rumqttc::MqttOptions::new("other-client", "127.0.0.1", broker.port());
    options.set_credentials("other", "pw-other-1");
    let (other, mut eventloop) = rumqttc::AsyncClient::new(options, 16);
    tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
    retain(&other, "homie/thermo-acl/$state", "lost").await;
    retain(&other, "homie/thermo-acl/thermostat/target-temperature/$format", "0:200").await;
    tokio::time::timeout(WAIT, async {
        while broker.log().matches("Denied PUBLISH from other-client").count() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the broker refused both:\n{}", broker.log()));
    let live = link.live_description("thermo-acl").unwrap();
    assert_eq!(live.state, xagent_connector_homie::model::DeviceState::Ready);
    assert_eq!(
        spec_of(&live, "thermostat", "target-temperature").format_text.as_deref(),
        Some("10:30")
    );
    // The Connector's own commands still get through.
    link.set("thermo-acl", &pin, "thermostat", "mode", &json!("auto")).await.unwrap();
}

#[tokio::test]
async fn availability_flaps_on_the_broker_are_debounced() {
    let s = setup("thermo-flap").await;
    // Past the debounce window of the first report.
    tokio::time::sleep(s.link.config().availability_debounce).await;
    let mut events = s.link.subscribe();
    let evil = attacker(&s.broker).await;
    for i in 0..2_000 {
        let state = if i % 2 == 0 { "disconnected" } else { "ready" };
        evil.publish("homie/thermo-flap/$state", rumqttc::QoS::AtMostOnce, true, state)
            .await
            .unwrap();
    }
    // Let every flip arrive and the window close.
    tokio::time::sleep(s.link.config().availability_debounce * 2).await;
    let mut reports = Vec::new();
    while let Ok(e) = events.try_recv() {
        reports.push(e.availability);
    }
    // The first change at once, then at most one per window while flips still arrive.
    assert!(reports.len() <= 3, "{} reports: {reports:?}", reports.len());
    assert_eq!(s.link.availability("thermo-flap"), Availability::Online);
}
