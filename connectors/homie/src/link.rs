//! The Connector's link to the MQTT broker: one `rumqttc` connection that watches the bound
//! devices' topics, keeps each device's [`DeviceTree`], reports availability changes, and
//! performs reads, confirmed sets and snapshots.
//!
//! The link reconnects on its own (capped backoff). While the broker is unreachable every
//! watched device is offline; after a reconnect the device trees are rebuilt from the retained
//! messages the broker delivers again. Publishes queued before a connection loss are dropped,
//! not sent late: a set the Connector already answered with an error must not reach the device
//! afterwards.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};
use serde_json::Value;
use tokio::sync::{broadcast, oneshot, watch};

use crate::error::{BadMqttUrl, HomieError};
use crate::model::{DeviceState, PropertySpec, check_id};
use crate::pending::{PendingSet, PendingSets, SetId};
use crate::tree::{DEFAULT_BASE_TOPIC, Description, DeviceTree, Ingested, split_topic};

/// Default time a set waits for the device to publish the new value.
pub const DEFAULT_SET_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time a snapshot request waits for the picture.
pub const DEFAULT_SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default largest snapshot accepted (bytes).
pub const DEFAULT_MAX_SNAPSHOT_BYTES: usize = 8 * 1024 * 1024;
/// Most sets and snapshots waiting at once on one link.
pub const MAX_WAITING: usize = 256;
/// Longest pause between reconnection attempts.
pub const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);

/// Where the broker is: `mqtt://[user:password@]HOST[:PORT]` (plain TCP).
#[derive(Clone, PartialEq, Eq)]
pub struct MqttUrl {
    /// Host name or address.
    pub host: String,
    /// TCP port (1883 by default).
    pub port: u16,
    credentials: Option<(String, xagent_protocol_types::Secret)>,
}

impl std::fmt::Debug for MqttUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mqtt://{}:{}", self.host, self.port)
    }
}

impl std::fmt::Display for MqttUrl {
    /// The URL without credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mqtt://{}:{}", self.host, self.port)
    }
}

impl MqttUrl {
    /// A broker at `host:port`, without credentials.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self { host: host.into(), port, credentials: None }
    }

    /// Parses `mqtt://HOST:PORT`, with optional `user:password@` (the password is kept as a
    /// secret and never shown).
    pub fn parse(text: &str) -> Result<Self, BadMqttUrl> {
        let url = url::Url::parse(text).map_err(|e| BadMqttUrl(format!("not a URL ({e})")))?;
        if url.scheme() != "mqtt" && url.scheme() != "tcp" {
            return Err(BadMqttUrl(format!("scheme {} is not supported", url.scheme())));
        }
        let host =
            url.host_str().filter(|h| !h.is_empty()).ok_or_else(|| BadMqttUrl("no host".into()))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        if url.path() != "" && url.path() != "/" {
            return Err(BadMqttUrl("a path is not allowed".into()));
        }
        let credentials = if url.username().is_empty() {
            None
        } else {
            let user = url.username().to_owned();
            let password = url.password().unwrap_or("").to_owned();
            Some((user, xagent_protocol_types::Secret::new(password)))
        };
        Ok(Self { host, port: url.port().unwrap_or(1883), credentials })
    }

    /// Options for a client with this id, credentials applied.
    pub(crate) fn options(&self, client_id: &str) -> MqttOptions {
        let mut o = MqttOptions::new(client_id, self.host.clone(), self.port);
        if let Some((user, password)) = &self.credentials {
            o.set_credentials(user.clone(), password.expose().to_owned());
        }
        o
    }
}

/// Settings of a link.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    /// Base topic (`homie`).
    pub base_topic: String,
    /// MQTT client id of the Connector.
    pub client_id: String,
    /// Keep-alive towards the broker.
    pub keep_alive: Duration,
    /// How long a set waits for confirmation.
    pub set_timeout: Duration,
    /// How long a snapshot waits for the picture.
    pub snapshot_timeout: Duration,
    /// Largest snapshot accepted.
    pub max_snapshot_bytes: usize,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            base_topic: DEFAULT_BASE_TOPIC.into(),
            client_id: format!("xagent-homie-{}", hex::encode(rand::random::<[u8; 6]>())),
            keep_alive: Duration::from_secs(30),
            set_timeout: DEFAULT_SET_TIMEOUT,
            snapshot_timeout: DEFAULT_SNAPSHOT_TIMEOUT,
            max_snapshot_bytes: DEFAULT_MAX_SNAPSHOT_BYTES,
        }
    }
}

/// Whether a watched device can take commands now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// Nothing conclusive yet (just watched, the device is starting, or its description is
    /// still arriving): the previous conclusion stands.
    Unknown(String),
    /// `ready` (or `alert`) and fully described: it answered.
    Online,
    /// Lost, disconnected, sleeping, starting, removed, or the broker is unreachable.
    Offline(String),
}

/// A watched device's availability changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceEvent {
    /// Device id.
    pub device: String,
    /// The new availability.
    pub availability: Availability,
}

struct Watched {
    tree: DeviceTree,
    availability: Availability,
    watchers: usize,
}

type SetWaiter = oneshot::Sender<Result<String, HomieError>>;
type SnapWaiter = oneshot::Sender<Vec<u8>>;

struct State {
    connected: bool,
    devices: BTreeMap<String, Watched>,
    sets: PendingSets,
    set_waiters: HashMap<SetId, SetWaiter>,
    snapshots: HashMap<(String, String, String), SnapWaiter>,
}

struct Inner {
    client: AsyncClient,
    config: LinkConfig,
    state: Mutex<State>,
    events: broadcast::Sender<DeviceEvent>,
    shutdown: watch::Sender<bool>,
}

/// A handle on the broker link (cheap to clone).
#[derive(Clone)]
pub struct HomieLink {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HomieLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HomieLink").field("base_topic", &self.inner.config.base_topic).finish()
    }
}

fn availability(connected: bool, tree: &DeviceTree) -> Availability {
    if !connected {
        return Availability::Offline("the MQTT broker is unreachable".into());
    }
    match tree.state() {
        None => Availability::Unknown("the device has not published $state".into()),
        Some(state) if state.is_operational() => match tree.description() {
            Ok(_) => Availability::Online,
            Err(e) => Availability::Unknown(e.to_string()),
        },
        Some(DeviceState::Lost) => Availability::Offline("the device's connection was lost".into()),
        // Starting: it will say `ready` when its description is out; no flapping meanwhile.
        Some(DeviceState::Init) => {
            Availability::Unknown("the device is starting ($state init)".into())
        }
        Some(state) => Availability::Offline(format!("the device reports $state {state}")),
    }
}

impl HomieLink {
    /// Starts the link: connects in the background (and keeps reconnecting) and returns at
    /// once. The task ends after [`HomieLink::shutdown`].
    pub fn start(url: &MqttUrl, config: LinkConfig) -> (Self, tokio::task::JoinHandle<()>) {
        let mut options = url.options(&config.client_id);
        options.set_keep_alive(config.keep_alive.max(Duration::from_secs(1)));
        options.set_clean_session(true);
        // Snapshot pictures come in one publish; leave room for topic and header.
        options.set_max_packet_size(config.max_snapshot_bytes + 64 * 1024, 256 * 1024);
        let (client, eventloop) = AsyncClient::new(options, 256);
        let (events, _) = broadcast::channel(256);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let inner = Arc::new(Inner {
            client,
            config,
            state: Mutex::new(State {
                connected: false,
                devices: BTreeMap::new(),
                sets: PendingSets::new(),
                set_waiters: HashMap::new(),
                snapshots: HashMap::new(),
            }),
            events,
            shutdown,
        });
        let task = tokio::spawn(run(Arc::clone(&inner), eventloop, shutdown_rx));
        (Self { inner }, task)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The settings in force.
    pub fn config(&self) -> &LinkConfig {
        &self.inner.config
    }

    /// Availability changes of watched devices, from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<DeviceEvent> {
        self.inner.events.subscribe()
    }

    /// True while the broker connection is up.
    pub fn is_connected(&self) -> bool {
        self.state().connected
    }

    /// Starts following a device (counted: each `watch` needs one `unwatch`).
    pub fn watch(&self, device: &str) -> Result<(), HomieError> {
        check_id(device).map_err(|e| HomieError::Offline(e.to_string()))?;
        let subscribe = {
            let mut st = self.state();
            let connected = st.connected;
            let w = st.devices.entry(device.to_owned()).or_insert_with(|| Watched {
                tree: DeviceTree::new(),
                availability: if connected {
                    Availability::Unknown("waiting for the device's retained topics".into())
                } else {
                    Availability::Offline("the MQTT broker is unreachable".into())
                },
                watchers: 0,
            });
            w.watchers += 1;
            w.watchers == 1 && connected
        };
        if subscribe {
            self.inner
                .client
                .try_subscribe(self.device_filter(device), QoS::AtLeastOnce)
                .map_err(|_| HomieError::Busy(MAX_WAITING))?;
        }
        Ok(())
    }

    /// Stops following a device.
    pub fn unwatch(&self, device: &str) {
        let unsubscribe = {
            let mut st = self.state();
            match st.devices.get_mut(device) {
                Some(w) if w.watchers > 1 => {
                    w.watchers -= 1;
                    false
                }
                Some(_) => {
                    st.devices.remove(device);
                    st.connected
                }
                None => false,
            }
        };
        if unsubscribe {
            let _ = self.inner.client.try_unsubscribe(self.device_filter(device));
        }
    }

    fn device_filter(&self, device: &str) -> String {
        format!("{}/{device}/#", self.inner.config.base_topic)
    }

    /// A watched device's availability.
    pub fn availability(&self, device: &str) -> Availability {
        self.state()
            .devices
            .get(device)
            .map_or_else(|| Availability::Unknown("not watched".into()), |w| w.availability.clone())
    }

    /// Waits until a watched device is online or known offline, at most `timeout`; returns the
    /// availability then.
    pub async fn settle(&self, device: &str, timeout: Duration) -> Availability {
        self.wait_until(device, timeout, |now| !matches!(now, Availability::Unknown(_))).await
    }

    /// Waits until a watched device is online, at most `timeout`.
    pub async fn wait_online(&self, device: &str, timeout: Duration) -> Result<(), HomieError> {
        match self.wait_until(device, timeout, |now| *now == Availability::Online).await {
            Availability::Online => Ok(()),
            Availability::Unknown(why) | Availability::Offline(why) => {
                Err(HomieError::Offline(why))
            }
        }
    }

    /// The device's availability once `done` holds for it, or when `timeout` runs out (or the
    /// link ends) first: re-read at every availability event.
    async fn wait_until(
        &self,
        device: &str,
        timeout: Duration,
        done: impl Fn(&Availability) -> bool,
    ) -> Availability {
        let mut events = self.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let now = self.availability(device);
            if done(&now) {
                return now;
            }
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Err(_) | Ok(Err(broadcast::error::RecvError::Closed)) => {
                    return self.availability(device);
                }
                Ok(_) => {}
            }
        }
    }

    fn online_description(&self, device: &str) -> Result<Description, HomieError> {
        let st = self.state();
        let w = st.devices.get(device).ok_or_else(|| HomieError::Offline("not bound".into()))?;
        match &w.availability {
            Availability::Online => {}
            Availability::Unknown(why) | Availability::Offline(why) => {
                return Err(HomieError::Offline(why.clone()));
            }
        }
        w.tree.description().map_err(|e| HomieError::Offline(e.to_string()))
    }

    /// The device as it describes itself (online devices only).
    pub fn describe(&self, device: &str) -> Result<Description, HomieError> {
        self.online_description(device)
    }

    fn property(
        &self,
        device: &str,
        node: &str,
        property: &str,
    ) -> Result<(PropertySpec, Option<String>), HomieError> {
        let d = self.online_description(device)?;
        let n =
            d.node(node).ok_or_else(|| HomieError::NoSuchNode(node.chars().take(64).collect()))?;
        let p = n.properties.iter().find(|p| p.id == property).ok_or_else(|| {
            HomieError::NoSuchProperty {
                node: node.to_owned(),
                property: property.chars().take(64).collect(),
            }
        })?;
        let spec = p.spec.clone().map_err(|problem| HomieError::Unusable {
            node: node.to_owned(),
            property: property.to_owned(),
            problem,
        })?;
        Ok((spec, p.value.clone()))
    }

    /// A property's last published value, typed by its datatype (`null` when none yet), with
    /// its unit.
    pub fn read(&self, device: &str, node: &str, property: &str) -> Result<Value, HomieError> {
        let (spec, value) = self.property(device, node, property)?;
        let mut out = serde_json::json!({
            "node": node,
            "property": property,
            "name": spec.name,
            "datatype": spec.datatype.as_str(),
            "value": value.as_deref().map(|v| spec.value_json(v)),
        });
        if let Some(unit) = &spec.unit {
            out["unit"] = Value::String(unit.clone());
        }
        Ok(out)
    }

    /// Sets a property: the value is checked against `$datatype`/`$format` (nothing is
    /// published otherwise), published on `/set`, and confirmed when the device publishes the
    /// new value; `command_timeout` when it does not within the configured time.
    pub async fn set(
        &self,
        device: &str,
        node: &str,
        property: &str,
        value: &Value,
    ) -> Result<Value, HomieError> {
        let (spec, _) = self.property(device, node, property)?;
        let payload = spec.payload_for(value).map_err(|e| HomieError::BadValue {
            node: node.to_owned(),
            property: property.to_owned(),
            problem: e.0,
        })?;
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut st = self.state();
            if st.set_waiters.len() + st.snapshots.len() >= MAX_WAITING {
                return Err(HomieError::Busy(MAX_WAITING));
            }
            let id = st.sets.add(PendingSet {
                device: device.to_owned(),
                node: node.to_owned(),
                property: property.to_owned(),
                spec: spec.clone(),
                payload: payload.clone(),
                last_seen: None,
            });
            st.set_waiters.insert(id, tx);
            id
        };
        let topic = format!("{}/{device}/{node}/{property}/set", self.inner.config.base_topic);
        if self.inner.client.publish(topic, QoS::AtLeastOnce, false, payload.clone()).await.is_err()
        {
            self.forget_set(id);
            return Err(HomieError::Offline("the MQTT link is closed".into()));
        }
        let timeout = self.inner.config.set_timeout;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(confirmed))) => Ok(serde_json::json!({
                "node": node,
                "property": property,
                "value": spec.value_json(&confirmed),
                "confirmed": true,
            })),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(HomieError::Offline("the MQTT link stopped".into())),
            Err(_) => {
                let pending = self.forget_set(id);
                let detail = match pending.and_then(|p| p.last_seen) {
                    Some(seen) => format!("; it published {seen} instead of {payload}"),
                    None => format!("; it did not publish the new value {payload}"),
                };
                Err(HomieError::Timeout { after_ms: millis(timeout), detail })
            }
        }
    }

    fn forget_set(&self, id: SetId) -> Option<PendingSet> {
        let mut st = self.state();
        st.set_waiters.remove(&id);
        st.sets.take(id)
    }

    /// Asks a camera node for a picture (snapshot extension) and returns its bytes and MIME
    /// type.
    pub async fn snapshot(
        &self,
        device: &str,
        node: &str,
    ) -> Result<(Vec<u8>, String), HomieError> {
        let d = self.online_description(device)?;
        let n =
            d.node(node).ok_or_else(|| HomieError::NoSuchNode(node.chars().take(64).collect()))?;
        let mime = n.snapshot.clone().ok_or_else(|| HomieError::NoSnapshot(node.to_owned()))?;
        let token = hex::encode(rand::random::<[u8; 12]>());
        let key = (device.to_owned(), node.to_owned(), token.clone());
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.state();
            if st.set_waiters.len() + st.snapshots.len() >= MAX_WAITING {
                return Err(HomieError::Busy(MAX_WAITING));
            }
            st.snapshots.insert(key.clone(), tx);
        }
        let topic = format!("{}/{device}/{node}/$snapshot/request", self.inner.config.base_topic);
        if self.inner.client.publish(topic, QoS::AtLeastOnce, false, token).await.is_err() {
            self.state().snapshots.remove(&key);
            return Err(HomieError::Offline("the MQTT link is closed".into()));
        }
        let timeout = self.inner.config.snapshot_timeout;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(bytes)) if bytes.len() > self.inner.config.max_snapshot_bytes => {
                Err(HomieError::SnapshotTooLarge(self.inner.config.max_snapshot_bytes))
            }
            Ok(Ok(bytes)) => Ok((bytes, mime)),
            Ok(Err(_)) => Err(HomieError::Offline("the device went offline".into())),
            Err(_) => {
                self.state().snapshots.remove(&key);
                Err(HomieError::Timeout {
                    after_ms: millis(timeout),
                    detail: "; no picture arrived".into(),
                })
            }
        }
    }

    /// Stops the link: a clean MQTT disconnect, then the task ends.
    pub async fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
        let _ = self.inner.client.try_disconnect();
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Recomputes a device's availability; returns the event to broadcast when it changed,
    /// and fails waiting calls when the device can no longer answer them.
    fn refresh(st: &mut State, device: &str) -> Option<DeviceEvent> {
        let connected = st.connected;
        let w = st.devices.get_mut(device)?;
        let now = availability(connected, &w.tree);
        if now == w.availability {
            return None;
        }
        w.availability = now.clone();
        if let Availability::Offline(why) = &now {
            for id in st.sets.of_device(device) {
                st.sets.take(id);
                if let Some(tx) = st.set_waiters.remove(&id) {
                    let _ = tx.send(Err(HomieError::Offline(format!(
                        "{why}; the set may or may not have been applied"
                    ))));
                }
            }
            st.snapshots.retain(|(d, _, _), _| d != device);
        }
        Some(DeviceEvent { device: device.to_owned(), availability: now })
    }

    fn on_connection(&self, connected: bool) -> Vec<String> {
        let mut events = Vec::new();
        let resubscribe: Vec<String> = {
            let mut st = self.state();
            st.connected = connected;
            let ids: Vec<String> = st.devices.keys().cloned().collect();
            for id in &ids {
                if let Some(w) = st.devices.get_mut(id) {
                    w.tree.clear();
                }
                if let Some(e) = Self::refresh(&mut st, id) {
                    events.push(e);
                }
            }
            ids
        };
        for e in events {
            let _ = self.events.send(e);
        }
        resubscribe
    }

    fn on_publish(&self, topic: &str, payload: &[u8]) {
        let Some((device, levels)) = split_topic(&self.config.base_topic, topic) else { return };
        let mut event = None;
        {
            let mut st = self.state();
            let Some(w) = st.devices.get_mut(device) else { return };
            match w.tree.ingest(&levels, payload) {
                Ingested::Nothing => {}
                Ingested::State(_) | Ingested::Description => {
                    event = Self::refresh(&mut st, device)
                }
                Ingested::Value { node, property, payload } => {
                    event = Self::refresh(&mut st, device);
                    for id in st.sets.on_value(device, &node, &property, &payload) {
                        if let Some(tx) = st.set_waiters.remove(&id) {
                            let _ = tx.send(Ok(payload.clone()));
                        }
                    }
                }
                Ingested::Snapshot { node, token, bytes } => {
                    if let Some(tx) = st.snapshots.remove(&(device.to_owned(), node, token)) {
                        let _ = tx.send(bytes);
                    }
                }
            }
        }
        if let Some(e) = event {
            tracing::info!(device = %e.device, availability = ?e.availability, "homie device availability changed");
            let _ = self.events.send(e);
        }
    }
}

async fn run(inner: Arc<Inner>, mut eventloop: EventLoop, mut shutdown: watch::Receiver<bool>) {
    let mut delay = Duration::from_millis(100);
    loop {
        if *shutdown.borrow() {
            break;
        }
        let polled = tokio::select! {
            _ = shutdown.changed() => break,
            polled = eventloop.poll() => polled,
        };
        match polled {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                delay = Duration::from_millis(100);
                tracing::info!("connected to the MQTT broker");
                for device in inner.on_connection(true) {
                    let filter = format!("{}/{device}/#", inner.config.base_topic);
                    if inner.client.try_subscribe(filter, QoS::AtLeastOnce).is_err() {
                        tracing::warn!(%device, "could not queue the subscription; reconnecting");
                    }
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => inner.on_publish(&p.topic, &p.payload),
            Ok(_) => {}
            Err(e) => {
                if inner.state().connected {
                    tracing::warn!(error = %e, "lost the MQTT broker connection");
                } else {
                    tracing::debug!(error = %e, "MQTT broker not reachable yet");
                }
                inner.on_connection(false);
                // Do not send stale commands after a reconnect.
                eventloop.pending.clear();
                tokio::select! {
                    _ = shutdown.changed() => break,
                    () = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(MAX_RECONNECT_DELAY);
            }
        }
    }
    // Drive the disconnect out if the broker is still there.
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while let Ok(ev) = eventloop.poll().await {
            if matches!(ev, Event::Outgoing(rumqttc::Outgoing::Disconnect)) {
                break;
            }
        }
    })
    .await;
    inner.on_connection(false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_urls_are_checked_and_never_show_the_password() {
        let u = MqttUrl::parse("mqtt://user:hunter2@broker.local:1884").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("broker.local", 1884));
        assert!(!format!("{u} {u:?}").contains("hunter2"));
        assert_eq!(MqttUrl::parse("mqtt://127.0.0.1").unwrap().port, 1883);
        for bad in ["http://x", "mqtts://x:8883", "mqtt://", "mqtt://h/path", "nope"] {
            assert!(MqttUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn availability_needs_the_broker_a_ready_state_and_a_full_description() {
        let mut t = DeviceTree::new();
        assert!(matches!(availability(true, &t), Availability::Unknown(_)));
        for (topic, payload) in [("$homie", "4.0.0"), ("$state", "ready"), ("$nodes", "n")] {
            let levels: Vec<&str> = topic.split('/').collect();
            t.ingest(&levels, payload.as_bytes());
        }
        assert!(
            matches!(availability(true, &t), Availability::Unknown(_)),
            "n/$properties missing"
        );
        t.ingest(&["n", "$properties"], b"p");
        t.ingest(&["n", "p", "$datatype"], b"integer");
        assert_eq!(availability(true, &t), Availability::Online);
        assert!(matches!(availability(false, &t), Availability::Offline(_)));
        t.ingest(&["$state"], b"lost");
        assert!(matches!(availability(true, &t), Availability::Offline(_)));
    }
}
