//! The Connector's link to the MQTT broker: one MQTT 5 `rumqttc` connection that watches the
//! bound devices' topics, keeps each device's [`DeviceTree`], reports availability changes, and
//! performs reads, confirmed sets and snapshots.
//!
//! The link reconnects on its own (capped backoff). While the broker is unreachable every
//! watched device is offline; after a reconnect the device trees are rebuilt from the retained
//! messages the broker delivers again. Publishes queued before a connection loss are dropped,
//! not sent late: a set the Connector already answered with an error must not reach the device
//! afterwards.
//!
//! The link speaks MQTT 5 so it can tell the broker its largest acceptable packet (CONNECT's
//! Maximum Packet Size): the broker then drops a larger message for this client instead of
//! sending it, so one oversized retained message under a device's topics cannot break the
//! connection (and break it again at every resubscription). A broker that sends one anyway
//! costs a reconnect, counted in [`LinkStats::oversized`] and logged at a bounded rate.
//!
//! Reads, sets and snapshots are judged against the description the channel pinned when it
//! bound the device ([`Pinned`]), never against what is retained on the broker now.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, StateError};
use serde_json::Value;
use tokio::sync::{broadcast, oneshot, watch};
use tokio::time::Instant;

use crate::error::{BadMqttUrl, HomieError};
use crate::model::{DeviceState, check_id};
use crate::pending::{PendingSet, PendingSets, SetId};
use crate::pin::{Pinned, check_picture, snapshot_mime};
use crate::presence::{LostVerdict, Presence};
use crate::tree::{DEFAULT_BASE_TOPIC, Description, DeviceTree, Ingested, split_topic};

/// Default time a set waits for the device to publish the new value.
pub const DEFAULT_SET_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time a snapshot request waits for the picture.
pub const DEFAULT_SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default largest snapshot accepted (bytes).
pub const DEFAULT_MAX_SNAPSHOT_BYTES: usize = 8 * 1024 * 1024;
/// Default shortest time between two availability reports of one device.
pub const DEFAULT_AVAILABILITY_DEBOUNCE: Duration = Duration::from_secs(2);
/// Default time a `$state lost` must go without live traffic before it counts.
pub const DEFAULT_LOST_GRACE: Duration = Duration::from_secs(5);
/// Default time a device's description must go without a new attribute before a device that
/// was not online counts as described (the broker's retained burst has no end marker).
pub const DEFAULT_DESCRIPTION_QUIET: Duration = Duration::from_millis(500);
/// Most sets and snapshots waiting at once on one link.
pub const MAX_WAITING: usize = 256;
/// Longest pause between reconnection attempts.
pub const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);
/// Room left beside a snapshot's bytes in the largest packet (topic, properties, header).
pub const PACKET_OVERHEAD: usize = 64 * 1024;
/// How often timed availability rules (lost grace, debounce windows) are re-checked.
const TICK: Duration = Duration::from_millis(100);
/// Shortest time between two warnings about oversized packets.
const OVERSIZE_LOG_EVERY: Duration = Duration::from_secs(10);

/// Where the broker is: `mqtt://[user[:password]@]HOST[:PORT]` (plain TCP).
#[derive(Clone, PartialEq, Eq)]
pub struct MqttUrl {
    /// Host name or address.
    pub host: String,
    /// TCP port (1883 by default).
    pub port: u16,
    user: Option<String>,
    password: Option<xagent_protocol_types::Secret>,
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
        Self { host: host.into(), port, user: None, password: None }
    }

    /// Parses `mqtt://HOST:PORT`, with optional `user[:password]@` (the password is kept as a
    /// secret and never shown; the command line refuses it, see [`MqttUrl::has_password`]).
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
        let user = (!url.username().is_empty()).then(|| url.username().to_owned());
        let password = url.password().map(|p| xagent_protocol_types::Secret::new(p.to_owned()));
        Ok(Self { host, port: url.port().unwrap_or(1883), user, password })
    }

    /// True when the URL itself carried a password.
    pub fn has_password(&self) -> bool {
        self.password.is_some()
    }

    /// True when the URL names a user.
    pub fn has_user(&self) -> bool {
        self.user.is_some()
    }

    /// The URL with this password (read from a file or the environment).
    #[must_use]
    pub fn with_password(mut self, password: xagent_protocol_types::Secret) -> Self {
        self.password = Some(password);
        self
    }

    fn credentials(&self) -> Option<(String, String)> {
        let user = self.user.clone()?;
        let password = self.password.as_ref().map(|p| p.expose().to_owned()).unwrap_or_default();
        Some((user, password))
    }

    /// MQTT 3.1.1 options for a client with this id, credentials applied (the simulated
    /// device's client).
    pub(crate) fn options(&self, client_id: &str) -> rumqttc::MqttOptions {
        let mut o = rumqttc::MqttOptions::new(client_id, self.host.clone(), self.port);
        if let Some((user, password)) = self.credentials() {
            o.set_credentials(user, password);
        }
        o
    }

    /// MQTT 5 options for the Connector's client, credentials applied.
    fn options_v5(&self, client_id: &str) -> MqttOptions {
        let mut o = MqttOptions::new(client_id, self.host.clone(), self.port);
        if let Some((user, password)) = self.credentials() {
            o.set_credentials(user, password);
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
    /// Largest snapshot accepted; the largest MQTT packet the link accepts is this plus
    /// [`PACKET_OVERHEAD`] (announced to the broker).
    pub max_snapshot_bytes: usize,
    /// Shortest time between two availability reports of one device (changes in between are
    /// coalesced).
    pub availability_debounce: Duration,
    /// How long a `$state lost` must go without live traffic from the device before the
    /// device counts as offline.
    pub lost_grace: Duration,
    /// How long a device's description must go without a new attribute (`$settable`, `$format`,
    /// ...) before a device that was not online counts as online: a description is complete
    /// once every property has `$datatype`, but the rest of the broker's retained burst may
    /// still be arriving, and a bind pins what it sees.
    pub description_quiet: Duration,
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
            availability_debounce: DEFAULT_AVAILABILITY_DEBOUNCE,
            lost_grace: DEFAULT_LOST_GRACE,
            description_quiet: DEFAULT_DESCRIPTION_QUIET,
        }
    }
}

impl LinkConfig {
    /// The largest MQTT packet the link accepts (announced to the broker).
    pub fn max_packet_bytes(&self) -> u32 {
        u32::try_from(self.max_snapshot_bytes.saturating_add(PACKET_OVERHEAD)).unwrap_or(u32::MAX)
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

/// A watched device's availability changed (debounced: see [`LinkConfig::availability_debounce`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceEvent {
    /// Device id.
    pub device: String,
    /// The new availability.
    pub availability: Availability,
}

/// Counters of the link, for operators and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Broker connections established.
    pub connects: u64,
    /// Broker connections lost (or refused) after they were up.
    pub losses: u64,
    /// Connections broken because the broker sent a packet larger than announced.
    pub oversized: u64,
    /// Availability reports sent to subscribers (each becomes Descriptor pushes).
    pub reports: u64,
}

#[derive(Default)]
struct Counters {
    connects: AtomicU64,
    losses: AtomicU64,
    oversized: AtomicU64,
    reports: AtomicU64,
}

struct Watched {
    tree: DeviceTree,
    /// When the latest description attribute arrived (since the watch or the reconnect).
    described_at: Option<Instant>,
    availability: Availability,
    presence: Presence<Availability>,
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
    oversize_logged: Option<Instant>,
}

struct Inner {
    client: AsyncClient,
    config: LinkConfig,
    state: Mutex<State>,
    events: broadcast::Sender<DeviceEvent>,
    /// Bumped at every change of any device's availability (not debounced): what waiters in
    /// this process follow.
    changed: watch::Sender<u64>,
    counters: Counters,
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

/// A device's availability at `now`. `quiet` says whether its description went without a new
/// attribute for [`LinkConfig::description_quiet`]: a complete description makes a device that
/// was not online `Online` only then, so what a bind pins is the whole retained burst.
fn availability(
    connected: bool,
    tree: &DeviceTree,
    presence: &Presence<Availability>,
    previous: &Availability,
    now: Instant,
    quiet: bool,
) -> Availability {
    if !connected {
        return Availability::Offline("the MQTT broker is unreachable".into());
    }
    let described = || match tree.description() {
        Ok(_) if quiet || *previous == Availability::Online => Availability::Online,
        Ok(_) => Availability::Unknown("the device's description is still arriving".into()),
        Err(e) => Availability::Unknown(e.to_string()),
    };
    match tree.state() {
        None => Availability::Unknown("the device has not published $state".into()),
        Some(state) if state.is_operational() => described(),
        Some(DeviceState::Lost) => match presence.lost_verdict(true, now) {
            // Live traffic after the `lost`: the device is there, whoever wrote `lost`.
            LostVerdict::NotLost => described(),
            LostVerdict::Pending => previous.clone(),
            LostVerdict::Confirmed => {
                Availability::Offline("the device's connection was lost".into())
            }
        },
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
        let mut options = url.options_v5(&config.client_id);
        options.set_keep_alive(config.keep_alive.max(Duration::from_secs(1)));
        options.set_clean_start(true);
        // Snapshot pictures come in one publish; leave room for topic and header. Announced
        // in CONNECT, so the broker drops larger messages for this client.
        options.set_max_packet_size(Some(config.max_packet_bytes()));
        let (client, eventloop) = AsyncClient::new(options, 256);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let inner = Arc::new(Inner::new(client, config, shutdown));
        tokio::spawn(tick(Arc::clone(&inner), shutdown_rx.clone()));
        let task = tokio::spawn(run(Arc::clone(&inner), eventloop, shutdown_rx));
        (Self { inner }, task)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state()
    }

    /// The settings in force.
    pub fn config(&self) -> &LinkConfig {
        &self.inner.config
    }

    /// The link's counters so far.
    pub fn stats(&self) -> LinkStats {
        let c = &self.inner.counters;
        LinkStats {
            connects: c.connects.load(Ordering::Relaxed),
            losses: c.losses.load(Ordering::Relaxed),
            oversized: c.oversized.load(Ordering::Relaxed),
            reports: c.reports.load(Ordering::Relaxed),
        }
    }

    /// Availability changes of watched devices, from now on (debounced: at most one report
    /// per device per [`LinkConfig::availability_debounce`]).
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
            let config = &self.inner.config;
            let (grace, debounce) = (config.lost_grace, config.availability_debounce);
            let w = st.devices.entry(device.to_owned()).or_insert_with(|| Watched {
                tree: DeviceTree::new(),
                described_at: None,
                availability: if connected {
                    Availability::Unknown("waiting for the device's retained topics".into())
                } else {
                    Availability::Offline("the MQTT broker is unreachable".into())
                },
                presence: Presence::new(grace, debounce),
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

    /// A watched device's availability now (not debounced).
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
    /// link ends) first: re-read at every availability change.
    async fn wait_until(
        &self,
        device: &str,
        timeout: Duration,
        done: impl Fn(&Availability) -> bool,
    ) -> Availability {
        let mut changed = self.inner.changed.subscribe();
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.availability(device);
            if done(&now) {
                return now;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Err(_) | Ok(Err(_)) => return self.availability(device),
                Ok(Ok(())) => {}
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

    /// The device as it describes itself on the broker now (online devices only). What a
    /// channel binds; calls are judged by the [`Pinned`] copy, not by this.
    pub fn live_description(&self, device: &str) -> Result<Description, HomieError> {
        self.online_description(device)
    }

    /// Pins what an online device describes now (at bind time).
    pub fn pin(&self, device: &str) -> Result<Pinned, HomieError> {
        self.online_description(device).map(|d| Pinned::of(&d))
    }

    /// The describe Tool's answer: the pinned description with live values, and whether the
    /// device now describes itself differently.
    pub fn describe(&self, device: &str, pinned: &Pinned) -> Result<Value, HomieError> {
        let live = self.online_description(device)?;
        let out = pinned.to_json(&live);
        if out.get("description_changed").is_some() {
            tracing::warn!(%device, "the device's description on the broker differs from the one its channel pinned; calls use the pinned one");
        }
        Ok(out)
    }

    /// A property's last published value, typed by its pinned datatype (`null` when none yet),
    /// with its unit.
    pub fn read(
        &self,
        device: &str,
        pinned: &Pinned,
        node: &str,
        property: &str,
    ) -> Result<Value, HomieError> {
        let spec = pinned.spec(node, property)?;
        let live = self.online_description(device)?;
        let value = live.value(node, property);
        let mut out = serde_json::json!({
            "node": node,
            "property": property,
            "name": spec.name,
            "datatype": spec.datatype.as_str(),
            "value": value.map(|v| spec.value_json(v)),
        });
        if let Some(unit) = &spec.unit {
            out["unit"] = Value::String(unit.clone());
        }
        Ok(out)
    }

    /// Sets a property: the value is checked against the pinned `$datatype`/`$format` and
    /// `$settable` (nothing is published otherwise), published on `/set`, and confirmed when
    /// the device publishes the new value; `command_timeout` when it does not within the
    /// configured time.
    pub async fn set(
        &self,
        device: &str,
        pinned: &Pinned,
        node: &str,
        property: &str,
        value: &Value,
    ) -> Result<Value, HomieError> {
        let spec = pinned.spec(node, property)?;
        self.online_description(device)?;
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
    /// type. The node and its MIME type come from the pinned description; the type must be an
    /// allowed image type and the bytes must be of that type.
    pub async fn snapshot(
        &self,
        device: &str,
        pinned: &Pinned,
        node: &str,
    ) -> Result<(Vec<u8>, String), HomieError> {
        let n = pinned.node(node)?;
        let declared =
            n.snapshot.as_deref().ok_or_else(|| HomieError::NoSnapshot(node.to_owned()))?;
        let mime = snapshot_mime(declared)?;
        self.online_description(device)?;
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
            Ok(Ok(bytes)) => {
                check_picture(mime, &bytes)?;
                Ok((bytes, mime.to_owned()))
            }
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
    /// A link's shared part, not connected yet, without its tasks (started by
    /// [`HomieLink::start`]).
    fn new(client: AsyncClient, config: LinkConfig, shutdown: watch::Sender<bool>) -> Self {
        let (events, _) = broadcast::channel(256);
        let (changed, _) = watch::channel(0);
        Inner {
            client,
            config,
            state: Mutex::new(State {
                connected: false,
                devices: BTreeMap::new(),
                sets: PendingSets::new(),
                set_waiters: HashMap::new(),
                snapshots: HashMap::new(),
                oversize_logged: None,
            }),
            events,
            changed,
            counters: Counters::default(),
            shutdown,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Recomputes a device's availability at `now`; fails waiting calls when the device can no
    /// longer answer them, and returns the report due (debounced), if any.
    fn refresh(
        st: &mut State,
        device: &str,
        now: Instant,
        description_quiet: Duration,
    ) -> (bool, Option<DeviceEvent>) {
        let connected = st.connected;
        let Some(w) = st.devices.get_mut(device) else { return (false, None) };
        let quiet = w.described_at.is_none_or(|at| now >= at + description_quiet);
        let current = availability(connected, &w.tree, &w.presence, &w.availability, now, quiet);
        let changed = current != w.availability;
        w.availability = current.clone();
        let report = match &current {
            // Nothing conclusive is never reported: the previous report stands.
            Availability::Unknown(_) => None,
            _ => w.presence.report(&current, now),
        };
        if changed && let Availability::Offline(why) = &current {
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
        (
            changed,
            report.map(|availability| DeviceEvent { device: device.to_owned(), availability }),
        )
    }

    /// Sends what [`Inner::refresh`] found.
    fn announce(&self, changed: bool, events: Vec<DeviceEvent>) {
        if changed {
            self.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
        for e in events {
            tracing::info!(device = %e.device, availability = ?e.availability, "homie device availability changed");
            self.counters.reports.fetch_add(1, Ordering::Relaxed);
            let _ = self.events.send(e);
        }
    }

    /// Re-checks every device (timed rules: lost grace, debounce windows).
    fn on_tick(&self, now: Instant) {
        let mut events = Vec::new();
        let mut any = false;
        {
            let mut st = self.state();
            let ids: Vec<String> = st.devices.keys().cloned().collect();
            for id in &ids {
                let (changed, e) = Self::refresh(&mut st, id, now, self.config.description_quiet);
                any |= changed;
                events.extend(e);
            }
        }
        self.announce(any, events);
    }

    fn on_connection(&self, connected: bool) -> Vec<String> {
        let now = Instant::now();
        let mut events = Vec::new();
        let mut any = false;
        let resubscribe: Vec<String> = {
            let mut st = self.state();
            st.connected = connected;
            let ids: Vec<String> = st.devices.keys().cloned().collect();
            for id in &ids {
                if let Some(w) = st.devices.get_mut(id) {
                    w.tree.clear();
                    w.described_at = None;
                    w.presence.reset();
                }
                let (changed, e) = Self::refresh(&mut st, id, now, self.config.description_quiet);
                any |= changed;
                events.extend(e);
            }
            ids
        };
        self.announce(any, events);
        resubscribe
    }

    fn on_publish(&self, topic: &str, payload: &[u8], retained: bool) {
        let Some((device, levels)) = split_topic(&self.config.base_topic, topic) else { return };
        let now = Instant::now();
        let (changed, event) = {
            let mut st = self.state();
            let Some(w) = st.devices.get_mut(device) else { return };
            match w.tree.ingest(&levels, payload) {
                Ingested::Nothing => (false, None),
                Ingested::State(state) => {
                    w.presence.on_state(state == Some(DeviceState::Lost), now);
                    Self::refresh(&mut st, device, now, self.config.description_quiet)
                }
                Ingested::Description => {
                    w.described_at = Some(now);
                    Self::refresh(&mut st, device, now, self.config.description_quiet)
                }
                Ingested::Value { node, property, payload } => {
                    if !retained {
                        w.presence.on_live_traffic();
                    }
                    let refreshed =
                        Self::refresh(&mut st, device, now, self.config.description_quiet);
                    for id in st.sets.on_value(device, &node, &property, &payload) {
                        if let Some(tx) = st.set_waiters.remove(&id) {
                            let _ = tx.send(Ok(payload.clone()));
                        }
                    }
                    refreshed
                }
                Ingested::Snapshot { node, token, bytes } => {
                    if !retained {
                        w.presence.on_live_traffic();
                    }
                    if let Some(tx) = st.snapshots.remove(&(device.to_owned(), node, token)) {
                        let _ = tx.send(bytes);
                    }
                    Self::refresh(&mut st, device, now, self.config.description_quiet)
                }
            }
        };
        self.announce(changed, event.into_iter().collect());
    }

    /// The broker sent a packet larger than announced: counted, logged at a bounded rate.
    fn on_oversized(&self, error: &ConnectionError) {
        self.counters.oversized.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut st = self.state();
        if st.oversize_logged.is_none_or(|at| now >= at + OVERSIZE_LOG_EVERY) {
            st.oversize_logged = Some(now);
            tracing::warn!(
                error = %error,
                total = self.counters.oversized.load(Ordering::Relaxed),
                limit = self.config.max_packet_bytes(),
                "the MQTT broker sent a packet larger than the announced maximum (it should drop those); check the broker honours MQTT 5's Maximum Packet Size, and remove the oversized retained message"
            );
        }
    }
}

fn is_oversized(error: &ConnectionError) -> bool {
    matches!(
        error,
        ConnectionError::MqttState(
            StateError::IncomingPacketTooLarge { .. }
                | StateError::Deserialization(
                    rumqttc::v5::mqttbytes::Error::PayloadSizeLimitExceeded { .. }
                )
        )
    )
}

/// Re-checks the timed availability rules every [`TICK`] until shutdown.
async fn tick(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = interval.tick() => inner.on_tick(Instant::now()),
        }
        if *shutdown.borrow() {
            return;
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
                inner.counters.connects.fetch_add(1, Ordering::Relaxed);
                tracing::info!("connected to the MQTT broker");
                for device in inner.on_connection(true) {
                    let filter = format!("{}/{device}/#", inner.config.base_topic);
                    if inner.client.try_subscribe(filter, QoS::AtLeastOnce).is_err() {
                        tracing::warn!(%device, "could not queue the subscription; reconnecting");
                    }
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => match std::str::from_utf8(&p.topic) {
                Ok(topic) => inner.on_publish(topic, &p.payload, p.retain),
                Err(_) => tracing::debug!("ignored a publish whose topic is not UTF-8"),
            },
            Ok(_) => {}
            Err(e) => {
                if is_oversized(&e) {
                    inner.on_oversized(&e);
                }
                if inner.state().connected {
                    inner.counters.losses.fetch_add(1, Ordering::Relaxed);
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
        assert!(u.has_password() && u.has_user());
        assert!(!format!("{u} {u:?}").contains("hunter2"));
        let plain = MqttUrl::parse("mqtt://user@127.0.0.1").unwrap();
        assert_eq!(plain.port, 1883);
        assert!(!plain.has_password());
        let given = plain.with_password(xagent_protocol_types::Secret::new("from-a-file"));
        assert_eq!(given.credentials().map(|c| c.1).as_deref(), Some("from-a-file"));
        for bad in ["http://x", "mqtts://x:8883", "mqtt://", "mqtt://h/path", "nope"] {
            assert!(MqttUrl::parse(bad).is_err(), "{bad}");
        }
    }

    /// The broker's retained burst has no end marker: a description complete once every
    /// property has `$datatype` may still be followed by `$settable`. A device that was not
    /// online becomes online (and can be pinned by a bind) only once its description went
    /// quiet, so the pin holds the whole burst. On tokio's paused clock, ticks driven by hand.
    #[tokio::test(start_paused = true)]
    async fn rule_a_bind_pins_the_description_only_once_the_retained_burst_went_quiet() {
        let config = LinkConfig::default();
        let quiet = config.description_quiet;
        // Never polled: the link's tasks are not started, the test plays the broker.
        let (client, _eventloop) = AsyncClient::new(MqttOptions::new("t", "127.0.0.1", 1), 16);
        let (shutdown, _) = watch::channel(false);
        let link = HomieLink { inner: Arc::new(Inner::new(client, config, shutdown)) };
        link.inner.on_connection(true);
        link.watch("dev").unwrap();
        let publish = |topic: &str, payload: &str| {
            link.inner.on_publish(&format!("homie/dev/{topic}"), payload.as_bytes(), true);
        };
        let tick = || link.inner.on_tick(Instant::now());
        for (topic, payload) in [
            ("$homie", "4.0.0"),
            ("$state", "ready"),
            ("$nodes", "n"),
            ("n/$properties", "p"),
            ("n/p/$datatype", "integer"),
        ] {
            publish(topic, payload);
        }
        tick();
        assert!(link.inner.state().devices["dev"].tree.description().is_ok(), "complete");
        assert!(matches!(link.availability("dev"), Availability::Unknown(_)));
        assert!(link.pin("dev").is_err(), "nothing is pinned while the burst may go on");
        // Later in the burst: `$settable` restarts the quiet window.
        tokio::time::advance(quiet / 2).await;
        publish("n/p/$settable", "true");
        tokio::time::advance(quiet / 2 + Duration::from_millis(1)).await;
        tick();
        assert!(matches!(link.availability("dev"), Availability::Unknown(_)));
        tokio::time::advance(quiet / 2).await;
        tick();
        assert_eq!(link.availability("dev"), Availability::Online);
        let pinned = link.pin("dev").unwrap();
        assert!(pinned.node("n").unwrap().properties[0].settable, "{pinned:?}");
        // Once online, a later attribute does not take the device offline for a window.
        publish("n/p/$unit", "W");
        tick();
        assert_eq!(link.availability("dev"), Availability::Online);
    }

    #[tokio::test(start_paused = true)]
    async fn availability_needs_the_broker_a_ready_state_and_a_full_description() {
        let now = Instant::now();
        let p = Presence::new(DEFAULT_LOST_GRACE, DEFAULT_AVAILABILITY_DEBOUNCE);
        let unknown = Availability::Unknown("start".into());
        let mut t = DeviceTree::new();
        assert!(matches!(
            availability(true, &t, &p, &unknown, now, true),
            Availability::Unknown(_)
        ));
        for (topic, payload) in [("$homie", "4.0.0"), ("$state", "ready"), ("$nodes", "n")] {
            let levels: Vec<&str> = topic.split('/').collect();
            t.ingest(&levels, payload.as_bytes());
        }
        assert!(
            matches!(availability(true, &t, &p, &unknown, now, true), Availability::Unknown(_)),
            "n/$properties missing"
        );
        t.ingest(&["n", "$properties"], b"p");
        t.ingest(&["n", "p", "$datatype"], b"integer");
        assert_eq!(availability(true, &t, &p, &unknown, now, true), Availability::Online);
        assert!(matches!(
            availability(false, &t, &p, &unknown, now, true),
            Availability::Offline(_)
        ));
        // `lost` counts once it held for the grace period without live traffic.
        let mut p = p;
        t.ingest(&["$state"], b"lost");
        p.on_state(true, now);
        assert_eq!(
            availability(true, &t, &p, &Availability::Online, now, true),
            Availability::Online
        );
        let later = now + DEFAULT_LOST_GRACE;
        assert!(matches!(
            availability(true, &t, &p, &Availability::Online, later, true),
            Availability::Offline(_)
        ));
    }
}
