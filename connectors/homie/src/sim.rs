//! A simulated Homie v4 device on a real MQTT broker, for tests, the docs and trying the
//! Connector without hardware: a thermostat (settable target temperature with a range, an
//! enum mode), a read-only climate sensor, and a camera that answers the snapshot extension.
//!
//! It behaves like a real device: it publishes its description retained, sets its last will
//! to `$state` = `lost`, answers `/set` by publishing the new value (values outside its own
//! `$format` are ignored, as Homie devices do), and can be stopped cleanly
//! ([`SimDevice::stop`]: `$state` = `disconnected`), killed ([`SimDevice::kill`]: the socket
//! drops, the broker publishes the last will) and started again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::{AsyncClient, Event, LastWill, Packet, QoS};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::link::MqttUrl;
use crate::model::{Datatype, Format, PropertySpec, check_id};
use crate::tree::{DEFAULT_BASE_TOPIC, SNAPSHOT_ATTRIBUTE, SNAPSHOT_EXTENSION};

/// Why the simulated device could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The device id is not a Homie id.
    #[error(transparent)]
    BadId(#[from] crate::model::BadId),
    /// The broker did not accept the connection in time.
    #[error("the MQTT broker at {0} did not accept the simulated device's connection")]
    NotConnected(String),
}

/// One property of the simulated device.
#[derive(Clone, Debug)]
struct SimProperty {
    node: &'static str,
    id: &'static str,
    name: &'static str,
    datatype: Datatype,
    format: Option<&'static str>,
    settable: bool,
    unit: Option<&'static str>,
    initial: &'static str,
}

const NODES: &[(&str, &str, &str)] = &[
    ("thermostat", "Thermostat", "thermostat"),
    ("sensor", "Climate sensor", "sensor"),
    ("camera", "Hall camera", "camera"),
];

const PROPERTIES: &[SimProperty] = &[
    SimProperty {
        node: "thermostat",
        id: "target-temperature",
        name: "Target temperature",
        datatype: Datatype::Float,
        format: Some("10:30"),
        settable: true,
        unit: Some("°C"),
        initial: "21.0",
    },
    SimProperty {
        node: "thermostat",
        id: "mode",
        name: "Mode",
        datatype: Datatype::Enum,
        format: Some("off,heat,cool,auto"),
        settable: true,
        unit: None,
        initial: "heat",
    },
    SimProperty {
        node: "sensor",
        id: "temperature",
        name: "Temperature",
        datatype: Datatype::Float,
        format: None,
        settable: false,
        unit: Some("°C"),
        initial: "19.5",
    },
    SimProperty {
        node: "sensor",
        id: "humidity",
        name: "Humidity",
        datatype: Datatype::Integer,
        format: Some("0:100"),
        settable: false,
        unit: Some("%"),
        initial: "45",
    },
    SimProperty {
        node: "camera",
        id: "resolution",
        name: "Resolution",
        datatype: Datatype::String,
        format: None,
        settable: false,
        unit: None,
        initial: "64x48",
    },
];

impl SimProperty {
    fn spec(&self) -> Option<PropertySpec> {
        Some(PropertySpec {
            name: self.name.into(),
            datatype: self.datatype,
            format: Format::parse(self.datatype, self.format).ok()?,
            format_text: self.format.map(str::to_owned),
            settable: self.settable,
            retained: true,
            unit: self.unit.map(str::to_owned),
        })
    }
}

/// Settings of a simulated device.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Broker.
    pub mqtt: MqttUrl,
    /// Homie device id.
    pub device_id: String,
    /// `$name`.
    pub name: String,
    /// Base topic.
    pub base_topic: String,
}

impl SimConfig {
    /// A device `device_id` on the broker at `mqtt`, base topic `homie`.
    pub fn new(mqtt: MqttUrl, device_id: impl Into<String>) -> Self {
        Self {
            mqtt,
            device_id: device_id.into(),
            name: "Simulated thermostat".into(),
            base_topic: DEFAULT_BASE_TOPIC.into(),
        }
    }
}

#[derive(Default)]
struct Shared {
    values: Mutex<BTreeMap<(String, String), String>>,
    sets_received: AtomicUsize,
    snapshots_taken: AtomicUsize,
    ignore_sets: AtomicBool,
    log: Mutex<Vec<String>>,
}

impl Shared {
    fn note(&self, line: String) {
        if let Ok(mut log) = self.log.lock()
            && log.len() < 10_000
        {
            log.push(line);
        }
    }
}

struct Running {
    client: AsyncClient,
    task: JoinHandle<()>,
}

/// A simulated Homie device (see the module docs). State (current values, counters) survives
/// a stop or kill and a new start, like a device's memory.
pub struct SimDevice {
    config: SimConfig,
    shared: Arc<Shared>,
    running: Option<Running>,
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDevice")
            .field("device_id", &self.config.device_id)
            .field("running", &self.running.is_some())
            .finish()
    }
}

impl SimDevice {
    /// A stopped device with its initial values.
    pub fn new(config: SimConfig) -> Result<Self, SimError> {
        check_id(&config.device_id)?;
        let shared = Shared::default();
        if let Ok(mut values) = shared.values.lock() {
            for p in PROPERTIES {
                values.insert((p.node.into(), p.id.into()), p.initial.into());
            }
        }
        Ok(Self { config, shared: Arc::new(shared), running: None })
    }

    /// The device id.
    pub fn device_id(&self) -> &str {
        &self.config.device_id
    }

    fn topic(&self, rest: &str) -> String {
        format!("{}/{}/{rest}", self.config.base_topic, self.config.device_id)
    }

    /// Connects and publishes the description, then `$state` = `ready`. Returns once the
    /// broker accepted the connection and everything is queued.
    pub async fn start(&mut self) -> Result<(), SimError> {
        if self.running.is_some() {
            return Ok(());
        }
        let client_id = format!(
            "homie-sim-{}-{}",
            self.config.device_id,
            hex::encode(rand::random::<[u8; 4]>())
        );
        let mut options = self.config.mqtt.options(&client_id);
        options.set_keep_alive(Duration::from_secs(5));
        options.set_max_packet_size(64 * 1024, 4 * 1024 * 1024);
        options.set_last_will(LastWill::new(self.topic("$state"), "lost", QoS::AtLeastOnce, true));
        let (client, mut eventloop) = AsyncClient::new(options, 512);
        let (ready_tx, ready_rx) = oneshot::channel();
        let mut ready_tx = Some(ready_tx);
        let me = Publisher {
            client: client.clone(),
            shared: Arc::clone(&self.shared),
            base: format!("{}/{}", self.config.base_topic, self.config.device_id),
            name: self.config.name.clone(),
        };
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        me.announce();
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => me.on_message(&p.topic, &p.payload),
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => break,
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
        match tokio::time::timeout(Duration::from_secs(10), ready_rx).await {
            Ok(Ok(())) => {
                self.running = Some(Running { client, task });
                Ok(())
            }
            _ => {
                task.abort();
                Err(SimError::NotConnected(self.config.mqtt.to_string()))
            }
        }
    }

    /// Stops cleanly: `$state` = `disconnected` (retained), then an MQTT disconnect.
    pub async fn stop(&mut self) {
        let Some(running) = self.running.take() else { return };
        let _ = running
            .client
            .publish(self.topic("$state"), QoS::AtLeastOnce, true, "disconnected")
            .await;
        let _ = running.client.disconnect().await;
        if tokio::time::timeout(Duration::from_secs(5), running.task).await.is_err() {
            tracing::warn!("simulated device did not stop in time");
        }
    }

    /// Dies without a goodbye: the connection is dropped without an MQTT disconnect, so the
    /// broker publishes the last will (`$state` = `lost`).
    pub fn kill(&mut self) {
        if let Some(running) = self.running.take() {
            running.task.abort();
        }
    }

    /// True while connected (between `start` and `stop`/`kill`).
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Stops confirming sets (they are still counted): for command-timeout tests and demos.
    pub fn ignore_sets(&self, ignore: bool) {
        self.shared.ignore_sets.store(ignore, Ordering::SeqCst);
    }

    /// `/set` messages received so far (accepted or not).
    pub fn sets_received(&self) -> usize {
        self.shared.sets_received.load(Ordering::SeqCst)
    }

    /// Snapshots sent so far.
    pub fn snapshots_taken(&self) -> usize {
        self.shared.snapshots_taken.load(Ordering::SeqCst)
    }

    /// What the device did, in order: `set NODE/PROPERTY=PAYLOAD` for every `/set` received,
    /// `value NODE/PROPERTY=PAYLOAD` for every value it published in answer.
    pub fn log(&self) -> Vec<String> {
        self.shared.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The device's current value of a property.
    pub fn value(&self, node: &str, property: &str) -> Option<String> {
        let values = self.shared.values.lock().ok()?;
        values.get(&(node.to_owned(), property.to_owned())).cloned()
    }

    /// A new sensor reading (published when running).
    pub async fn set_temperature_reading(&self, celsius: f64) {
        let payload = format!("{celsius:.1}");
        if let Ok(mut values) = self.shared.values.lock() {
            values.insert(("sensor".into(), "temperature".into()), payload.clone());
        }
        if let Some(r) = &self.running {
            let _ = r
                .client
                .publish(self.topic("sensor/temperature"), QoS::AtLeastOnce, true, payload)
                .await;
        }
    }
}

struct Publisher {
    client: AsyncClient,
    shared: Arc<Shared>,
    base: String,
    name: String,
}

impl Publisher {
    fn put(&self, rest: &str, payload: impl Into<Vec<u8>>, retain: bool) {
        let topic = format!("{}/{rest}", self.base);
        if self.client.try_publish(topic, QoS::AtLeastOnce, retain, payload).is_err() {
            tracing::warn!("simulated device: publish queue full");
        }
    }

    /// Publishes the whole description (after every connect), then `ready`.
    fn announce(&self) {
        let _ = self.client.try_subscribe(format!("{}/+/+/set", self.base), QoS::AtLeastOnce);
        let _ = self.client.try_subscribe(
            format!("{}/+/{SNAPSHOT_ATTRIBUTE}/request", self.base),
            QoS::AtLeastOnce,
        );
        self.put("$state", "init", true);
        self.put("$homie", "4.0.0", true);
        self.put("$name", self.name.clone(), true);
        self.put("$extensions", SNAPSHOT_EXTENSION, true);
        self.put("$implementation", "xagent-connector-homie simulated device", true);
        let nodes: Vec<&str> = NODES.iter().map(|(id, _, _)| *id).collect();
        self.put("$nodes", nodes.join(","), true);
        for (node, name, kind) in NODES {
            self.put(&format!("{node}/$name"), *name, true);
            self.put(&format!("{node}/$type"), *kind, true);
            let props: Vec<&str> =
                PROPERTIES.iter().filter(|p| p.node == *node).map(|p| p.id).collect();
            self.put(&format!("{node}/$properties"), props.join(","), true);
        }
        self.put(&format!("camera/{SNAPSHOT_ATTRIBUTE}"), "image/png", true);
        let values = self.shared.values.lock().map(|v| v.clone()).unwrap_or_default();
        for p in PROPERTIES {
            let at = format!("{}/{}", p.node, p.id);
            self.put(&format!("{at}/$name"), p.name, true);
            self.put(&format!("{at}/$datatype"), p.datatype.as_str(), true);
            if let Some(f) = p.format {
                self.put(&format!("{at}/$format"), f, true);
            }
            self.put(&format!("{at}/$settable"), if p.settable { "true" } else { "false" }, true);
            if let Some(u) = p.unit {
                self.put(&format!("{at}/$unit"), u, true);
            }
            let value =
                values.get(&(p.node.to_owned(), p.id.to_owned())).cloned().unwrap_or_default();
            self.put(&at, value, true);
        }
        self.put("$state", "ready", true);
    }

    fn on_message(&self, topic: &str, payload: &[u8]) {
        let Some(rest) = topic.strip_prefix(&self.base).and_then(|r| r.strip_prefix('/')) else {
            return;
        };
        let levels: Vec<&str> = rest.split('/').collect();
        match levels.as_slice() {
            [node, property, "set"] => self.on_set(node, property, payload),
            [node, SNAPSHOT_ATTRIBUTE, "request"] => self.on_snapshot(node, payload),
            _ => {}
        }
    }

    fn on_set(&self, node: &str, property: &str, payload: &[u8]) {
        self.shared.sets_received.fetch_add(1, Ordering::SeqCst);
        self.shared.note(format!("set {node}/{property}={}", String::from_utf8_lossy(payload)));
        if self.shared.ignore_sets.load(Ordering::SeqCst) {
            return;
        }
        let Some(p) = PROPERTIES.iter().find(|p| p.node == node && p.id == property) else {
            return;
        };
        let (Some(spec), Ok(text)) = (p.spec(), std::str::from_utf8(payload)) else { return };
        // A real device checks its own ranges: reuse the model's check on the typed value.
        let Ok(accepted) = spec.payload_for(&spec.value_json(text)) else { return };
        if let Ok(mut values) = self.shared.values.lock() {
            values.insert((node.to_owned(), property.to_owned()), accepted.clone());
        }
        self.shared.note(format!("value {node}/{property}={accepted}"));
        self.put(&format!("{node}/{property}"), accepted, true);
    }

    fn on_snapshot(&self, node: &str, token: &[u8]) {
        let Ok(token) = std::str::from_utf8(token) else { return };
        if node != "camera" || check_id(token).is_err() {
            return;
        }
        let n = self.shared.snapshots_taken.fetch_add(1, Ordering::SeqCst);
        match picture(n) {
            Ok(png) => self.put(&format!("camera/{SNAPSHOT_ATTRIBUTE}/image/{token}"), png, false),
            Err(e) => tracing::warn!(error = %e, "simulated camera could not encode a picture"),
        }
    }
}

/// A small PNG (64x48 gradient that changes with every picture).
fn picture(frame: usize) -> Result<Vec<u8>, png::EncodingError> {
    let (w, h) = (64u32, 48u32);
    let shift = u8::try_from(frame % 256).unwrap_or(0);
    let mut data = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let r = u8::try_from(x * 4).unwrap_or(255);
            let g = u8::try_from(y * 5).unwrap_or(255);
            data.extend_from_slice(&[r, g, shift]);
        }
    }
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, w, h);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header()?;
        writer.write_image_data(&data)?;
        writer.finish()?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pictures_are_png() {
        let png = picture(3).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        assert_ne!(picture(4).unwrap(), png, "every picture differs");
    }

    #[test]
    fn every_simulated_property_has_a_valid_spec() {
        for p in PROPERTIES {
            let spec = p.spec().unwrap();
            spec.value_json(p.initial);
            check_id(p.id).unwrap();
            if p.settable {
                spec.payload_for(&spec.value_json(p.initial)).unwrap();
            }
        }
    }
}
