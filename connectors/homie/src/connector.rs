//! The `device.homie` Connector on the runtime: the Card (target `device`, Profile
//! `xagent.device.v1`), the `homie_bind` form flow, the device target (restore check and
//! availability reports from the broker link), and the four device Tools.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use xagent_profile_device::MediaResult;
use xagent_protocol_types::{
    ConnectorChannelId, DescriptorTarget, ErrorCode, FileType, PROFILE_DEVICE_V1, Secret, Security,
    TargetDeclaration, TargetType, TrustLevel,
};
use xagent_server_runtime::ops::ServeLimits;
use xagent_server_runtime::{
    AuthContext, AuthError, AuthStep, Binding, ChannelContext, Connector, ConnectorHandle,
    ConnectorServer, DeviceConfig, DeviceStatus, DeviceTarget, FlowSpec, RiskLevel, RuntimeConfig,
    ServerError, ToolCategory, ToolContext, ToolError, ToolSpec,
};

use crate::HomieError;
use crate::handover::{HANDOVER_LIMIT, HandedOver, Handovers};
use crate::link::{Availability, HomieLink, LinkConfig, MqttUrl};
use crate::model::check_id;
use crate::pairing::PairingCodes;
use crate::pin::{Pinned, snapshot_extension};

/// The Card id.
pub const CARD_ID: &str = "device.homie";
/// The provider named in the Card and the Descriptor.
pub const PROVIDER: &str = "homie";
/// The form flow that binds a device to a channel.
pub const BIND_FLOW: &str = "homie_bind";
/// Describe the bound device.
pub const TOOL_DESCRIBE: &str = "homie_device_describe";
/// Read a property.
pub const TOOL_READ: &str = "homie_property_read";
/// Set a settable property.
pub const TOOL_SET: &str = "homie_property_set";
/// Take a camera snapshot (returned as a `file_ref`).
pub const TOOL_SNAPSHOT: &str = "homie_camera_snapshot";
/// The primary Skill.
pub const SKILL: &str = include_str!("../assets/skill.md");
/// How long binding waits for the device to answer.
pub const DEFAULT_BIND_TIMEOUT: Duration = Duration::from_secs(5);

/// The binding's private entry naming the device (never shown to xAgent).
const DEVICE_SECRET: &str = "homie_device_id";
/// The binding's private entry holding the device's description pinned at bind time.
const PINNED_SECRET: &str = "homie_pinned_description";

/// What `homie_bind` asks the device owner.
#[derive(Deserialize, JsonSchema)]
pub struct BindForm {
    /// Device id
    ///
    /// The Homie device id (lower-case letters, digits and '-'), as the device's operator gave it.
    pub device_id: String,
    /// Pairing code
    ///
    /// The pairing code the operator gave you for this device.
    pub pairing_code: Secret,
}

/// No arguments.
#[derive(Deserialize, JsonSchema)]
pub struct DescribeArgs {}

/// A property of the bound device.
#[derive(Deserialize, JsonSchema)]
pub struct ReadArgs {
    /// The node id, as listed by homie_device_describe (e.g. "thermostat").
    #[schemars(length(min = 1, max = 64))]
    pub node: String,
    /// The property id within that node (e.g. "target-temperature").
    #[schemars(length(min = 1, max = 64))]
    pub property: String,
}

/// A new value for a settable property.
#[derive(Deserialize, JsonSchema)]
pub struct SetArgs {
    /// The node id, as listed by homie_device_describe.
    #[schemars(length(min = 1, max = 64))]
    pub node: String,
    /// The property id within that node; its `settable` must be true.
    #[schemars(length(min = 1, max = 64))]
    pub property: String,
    /// The new value: a number for integer/float (inside the listed range), true/false for
    /// boolean, one of the listed values for enum, "r,g,b" or "h,s,v" for color, else a string.
    pub value: Value,
}

/// Which camera node to ask.
#[derive(Deserialize, JsonSchema)]
pub struct SnapshotArgs {
    /// The camera node id (default: the first node whose description says snapshot: true).
    #[schemars(length(min = 1, max = 64))]
    pub node: Option<String>,
}

/// Settings of a `device.homie` Connector.
#[derive(Debug)]
pub struct HomieOptions {
    /// The broker.
    pub mqtt: MqttUrl,
    /// Broker link settings (base topic, timeouts, snapshot size).
    pub link: LinkConfig,
    /// The operator's pairing codes.
    pub pairing: PairingCodes,
    /// Where the runtime keeps its database and files.
    pub state_dir: PathBuf,
    /// The system API key xAgent must present.
    pub api_key: Option<Secret>,
    /// Device policies (serialisation, timeouts, high-risk Tools).
    pub device: DeviceConfig,
    /// How long binding waits for the device to answer.
    pub bind_timeout: Duration,
    /// The HTTP listener's connection limits (per-address caps and rates, the data plane's
    /// reserved slots, trusted proxies; SECURITY.md, "The listener").
    pub listener: ServeLimits,
    /// The runtime's state in this PostgreSQL database instead of SQLite in the state
    /// directory (feature `postgres`); the files stay in the state directory.
    #[cfg(feature = "postgres")]
    pub database_url: Option<xagent_server_runtime::ops::DatabaseUrl>,
}

impl HomieOptions {
    /// Options with the defaults for everything but the broker, codes and state directory.
    pub fn new(mqtt: MqttUrl, pairing: PairingCodes, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            mqtt,
            link: LinkConfig::default(),
            pairing,
            state_dir: state_dir.into(),
            api_key: None,
            device: DeviceConfig::default(),
            bind_timeout: DEFAULT_BIND_TIMEOUT,
            listener: ServeLimits::default(),
            #[cfg(feature = "postgres")]
            database_url: None,
        }
    }
}

#[derive(Clone)]
struct App {
    link: HomieLink,
    pairing: Arc<Mutex<PairingCodes>>,
    bind_timeout: Duration,
    /// Binds' broker watches until their channel's own watch runs here (crate::handover).
    handovers: Arc<Mutex<Handovers>>,
}

/// The key of a device's broker watch among the runtime's shared consumers: the first channel
/// that follows the device starts the watch, the runtime stops it when the last one signs out
/// or is unregistered, and `on_unbound` lets go of it when a binding ends otherwise.
fn watch_key(device: &str) -> String {
    format!("homie-watch:{device}")
}

fn device_of(binding: &Binding) -> Option<String> {
    binding.secret(DEVICE_SECRET).map(|s| s.expose().to_owned())
}

/// The hand-over bookkeeping (a poisoned lock is taken as it is: its counts stay whole).
fn lock(handovers: &Mutex<Handovers>) -> std::sync::MutexGuard<'_, Handovers> {
    handovers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn tool_error(e: &HomieError) -> ToolError {
    ToolError::new(e.code(), e.to_string())
}

fn bound_device(ctx: &ToolContext<App>) -> Result<String, ToolError> {
    device_of(&ctx.binding).ok_or_else(|| {
        ToolError::new(ErrorCode::ConnectionNotFound, "no device is bound to this channel")
    })
}

/// The bound device and the description the channel pinned when it bound it.
fn bound(ctx: &ToolContext<App>) -> Result<(String, Pinned), ToolError> {
    let device = bound_device(ctx)?;
    let pinned = ctx
        .binding
        .secret(PINNED_SECRET)
        .ok_or_else(|| HomieError::NotPinned("bound before descriptions were pinned".into()))
        .and_then(|text| Pinned::from_text(text.expose()))
        .map_err(|e| tool_error(&e))?;
    Ok((device, pinned))
}

impl App {
    /// Follows `device` for `channel` (once per channel) as a consumer of the runtime that
    /// runs beside xAgent's data plane (the device Tools read what it keeps): alone, at once;
    /// on replicas, on the one holding the data plane, moving with it. Err when the
    /// subscription could not be asked for here.
    fn watch(
        &self,
        handle: &ConnectorHandle,
        channel: &ConnectorChannelId,
        device: &str,
    ) -> Result<(), HomieError> {
        let refused = std::sync::Arc::new(std::sync::Mutex::new(None));
        let (link, name, seen) = (self.link.clone(), device.to_owned(), refused.clone());
        let handovers = Arc::clone(&self.handovers);
        handle.attach_data_plane_consumer(&watch_key(device), channel, move || {
            if let Err(e) = link.watch(&name) {
                tracing::warn!(device = %name, "could not follow the device: {e}");
                if let Ok(mut seen) = seen.lock() {
                    *seen = Some(e);
                }
            }
            // The binds' watches waiting for this one end now: it follows the device on.
            let taken_over = lock(&handovers).started(&name);
            for _ in 0..taken_over {
                link.unwatch(&name);
            }
            let (link, name, handovers) = (link.clone(), name.clone(), Arc::clone(&handovers));
            Box::new(move || {
                lock(&handovers).stopped(&name);
                link.unwatch(&name);
            })
        });
        let refused = refused.lock().ok().and_then(|mut seen| seen.take());
        refused.map_or(Ok(()), Err)
    }

    fn unwatch(&self, handle: &ConnectorHandle, channel: &ConnectorChannelId, device: &str) {
        handle.detach_consumer(&watch_key(device), channel);
        let waiting = lock(&self.handovers).unbound(device);
        for _ in 0..waiting {
            self.link.unwatch(device);
        }
    }

    /// Hands the watch a bind took for its wait over to the channel's own watch: let go now
    /// when that one runs here, else when it starts (or the binding ends, or after
    /// [`HANDOVER_LIMIT`]), so the device is followed without a gap (crate::handover).
    fn hand_over(&self, device: &str) {
        let handed = lock(&self.handovers).hand_over(device);
        match handed {
            HandedOver::ReleaseNow => self.link.unwatch(device),
            HandedOver::Waiting(token) => {
                let (link, handovers, device) =
                    (self.link.clone(), Arc::clone(&self.handovers), device.to_owned());
                tokio::spawn(async move {
                    tokio::time::sleep(HANDOVER_LIMIT).await;
                    if lock(&handovers).give_up(&device, token) {
                        tracing::info!(%device, "the channel's device watch did not start here; the bind's ends");
                        link.unwatch(&device);
                    }
                });
            }
        }
    }
}

/// `homie_bind`: checks the pairing code, waits for the device, pins its description.
async fn bind(ctx: AuthContext<App>, form: BindForm) -> Result<AuthStep, AuthError> {
    let app = ctx.state();
    let device = form.device_id.trim().to_owned();
    if let Err(e) = check_id(&device) {
        return Ok(AuthStep::Failed(e.to_string()));
    }
    let verdict = match app.pairing.lock() {
        Ok(mut codes) => codes.verify(&device, &form.pairing_code, ctx.handle.now_millis()),
        Err(_) => return Err(AuthError::internal("pairing codes lock poisoned")),
    };
    if let Err(e) = verdict {
        tracing::info!(channel = %ctx.channel, "homie bind refused: {e}");
        return Ok(AuthStep::Failed(e.to_string()));
    }
    if let Err(e) = app.link.watch(&device) {
        return Ok(AuthStep::Failed(e.to_string()));
    }
    match app.link.wait_online(&device, app.bind_timeout).await {
        Ok(()) => {
            // What the device describes now is what this channel's calls are judged by
            // until it binds again.
            let pinned = match app.link.pin(&device).and_then(|p| Ok((p.to_text()?, p))) {
                Ok(pinned) => pinned,
                Err(e) => {
                    app.link.unwatch(&device);
                    return Ok(AuthStep::Failed(e.to_string()));
                }
            };
            let (pinned_text, pinned) = pinned;
            let name = pinned.name.clone();
            let display = if name.trim().is_empty() { device.clone() } else { name };
            // The channel's own watch (joined when it already follows the device), then
            // the one taken for the wait is handed over to it: the subscription stays up
            // throughout, also on replicas where the channel's starts a moment later.
            let _ = app.watch(&ctx.handle, &ctx.channel, &device);
            app.hand_over(&device);
            let target = DescriptorTarget::new(PROVIDER, display).with_label("Homie device");
            Ok(AuthStep::Authenticated(
                Binding::new(target)
                    .with_secret(DEVICE_SECRET, Secret::new(device))
                    .with_secret(PINNED_SECRET, Secret::new(pinned_text)),
            ))
        }
        Err(e) => {
            app.link.unwatch(&device);
            Ok(AuthStep::Failed(format!(
                "the device did not answer: {e}; check it is switched on and connected to the broker"
            )))
        }
    }
}

/// Lets go of the device's watch when its binding ends.
async fn unbind(ctx: ChannelContext<App>) -> Result<(), AuthError> {
    if let Some(device) = device_of(&ctx.binding) {
        ctx.state().unwatch(&ctx.handle, &ctx.channel, &device);
    }
    Ok(())
}

/// The device target: a restored binding is connected once the broker shows the device
/// `ready` and fully described.
struct HomieTarget;

impl DeviceTarget<App> for HomieTarget {
    fn device_key(&self, binding: &Binding) -> Option<String> {
        device_of(binding)
    }

    async fn check(&self, ctx: ChannelContext<App>) -> DeviceStatus {
        let Some(device) = device_of(&ctx.binding) else { return DeviceStatus::Offline };
        let app = ctx.state();
        if app.watch(&ctx.handle, &ctx.channel, &device).is_err() {
            return DeviceStatus::Offline;
        }
        match app.link.settle(&device, app.bind_timeout).await {
            Availability::Online => DeviceStatus::Online,
            _ => DeviceStatus::Offline,
        }
    }
}

async fn describe(ctx: ToolContext<App>, _args: DescribeArgs) -> Result<Value, ToolError> {
    let (device, pinned) = bound(&ctx)?;
    ctx.state().link.describe(&device, &pinned).map_err(|e| tool_error(&e))
}

async fn read(ctx: ToolContext<App>, args: ReadArgs) -> Result<Value, ToolError> {
    let (device, pinned) = bound(&ctx)?;
    ctx.state().link.read(&device, &pinned, &args.node, &args.property).map_err(|e| tool_error(&e))
}

async fn set(ctx: ToolContext<App>, args: SetArgs) -> Result<Value, ToolError> {
    let (device, pinned) = bound(&ctx)?;
    ctx.state()
        .link
        .set(&device, &pinned, &args.node, &args.property, &args.value)
        .await
        .map_err(|e| tool_error(&e))
}

async fn snapshot(ctx: ToolContext<App>, args: SnapshotArgs) -> Result<Value, ToolError> {
    let (device, pinned) = bound(&ctx)?;
    let node = match args.node {
        Some(node) => node,
        None => {
            let camera = pinned.nodes.iter().find(|n| n.snapshot.is_some()).ok_or_else(|| {
                ToolError::new(ErrorCode::InvalidArguments, "this device has no camera node")
            })?;
            camera.id.clone()
        }
    };
    let (bytes, mime) =
        ctx.state().link.snapshot(&device, &pinned, &node).await.map_err(|e| tool_error(&e))?;
    let extension = snapshot_extension(&mime);
    let file = ctx
        .handle
        .register_file(&ctx.channel, &format!("snapshot.{extension}"), Some(&mime), &bytes)
        .await
        .map_err(ToolError::internal)?;
    let url = file.download_url.clone().unwrap_or_default();
    let mut media = MediaResult::new(FileType::Image, file.file_ref.clone(), url)
        .map_err(|e| ToolError::failed(e.to_string()))?;
    if let (Some(size), Some(expires)) = (file.byte_size, file.expires_at) {
        media = media.with_meta(mime, size, expires);
    }
    Ok(media.to_value())
}

/// Devices counted online at most (the broker decides how many announce themselves).
const MAX_COUNTED_DEVICES: usize = 100_000;

/// Follows the broker link's availability events and reports them for every channel bound
/// to the device.
async fn follow(
    app: App,
    handle: ConnectorHandle,
    shutdown: xagent_server_runtime::CancellationToken,
) {
    let mut events = app.link.subscribe();
    // Devices whose last availability was online, for the `homie_devices_online` gauge.
    let gauge = handle.gauge("homie_devices_online", "Devices on the broker whose $state is ready");
    let mut online: std::collections::HashSet<String> = std::collections::HashSet::new();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            e = events.recv() => e,
        };
        let event = match event {
            Ok(e) => e,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        match event.availability {
            Availability::Online if online.len() < MAX_COUNTED_DEVICES => {
                online.insert(event.device.clone());
            }
            Availability::Online => {}
            _ => {
                online.remove(&event.device);
            }
        }
        if let Some(gauge) = &gauge {
            gauge.set(i64::try_from(online.len()).unwrap_or(i64::MAX));
        }
        let status = match event.availability {
            Availability::Online => DeviceStatus::Online,
            Availability::Offline(_) => DeviceStatus::Offline,
            Availability::Unknown(_) => continue,
        };
        for channel in handle.channels() {
            let bound = handle.binding(&channel).and_then(|b| device_of(&b));
            if bound.as_deref() == Some(event.device.as_str()) {
                let _ = handle.device_status(&channel, status.clone()).await;
            }
        }
    }
}

fn build(
    app: App,
    config: DeviceConfig,
) -> Result<Connector, xagent_server_runtime::DefinitionError> {
    Connector::builder(CARD_ID, "Homie devices", env!("CARGO_PKG_VERSION"))
        .description("Observe and control devices that follow the Homie MQTT convention v4.")
        .vendor("xagent-connector-rs")
        .target(TargetDeclaration::new(TargetType::Device, PROVIDER, "Homie device"))
        .profile(PROFILE_DEVICE_V1)
        .security(Security::new(TrustLevel::Local, true).with_data_class("device").with_data_class("file"))
        .state(app)
        .form_flow(
            FlowSpec::new(BIND_FLOW, "Pair a Homie device").description(
                "Enter the device id and the pairing code the device's operator gave you.",
            ),
            bind,
        )
        .on_unbound(unbind)
        .device_target(HomieTarget, config)
        .skill(SKILL)
        .device_tool(
            ToolSpec::new(
                TOOL_DESCRIBE,
                "Describe the device\nList the bound device's nodes and properties with datatype, range or allowed values, unit, whether they can be set, and the last known value.",
            ),
            ToolCategory::Observation,
            RiskLevel::Low,
            describe,
        )
        .device_tool(
            ToolSpec::new(
                TOOL_READ,
                "Read a device property\nThe latest value the bound device published for one property, typed by its datatype, with its unit.",
            ),
            ToolCategory::Observation,
            RiskLevel::Low,
            read,
        )
        .device_tool(
            ToolSpec::new(
                TOOL_SET,
                "Set a device property\nChange a settable property of the bound device; the value is checked against its datatype and range, and the answer comes once the device reported the new value.",
            ),
            ToolCategory::Control,
            RiskLevel::Medium,
            set,
        )
        .device_tool(
            ToolSpec::new(
                TOOL_SNAPSHOT,
                "Take a camera snapshot\nAsk a camera node of the bound device for a picture; returns a file reference with a download URL, never the picture's bytes.",
            ),
            ToolCategory::Media,
            RiskLevel::Low,
            snapshot,
        )
        .build()
}

/// A running `device.homie` Connector: its broker link and its server.
pub struct Homie {
    link: HomieLink,
    server: ConnectorServer,
}

impl std::fmt::Debug for Homie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Homie").field("link", &self.link).finish_non_exhaustive()
    }
}

impl Homie {
    /// Starts the broker link and the runtime (restored bindings are checked against the
    /// broker before they are projected `connected`).
    pub async fn open(options: HomieOptions) -> Result<Self, ServerError> {
        let (link, _task) = HomieLink::start(&options.mqtt, options.link);
        let app = App {
            link: link.clone(),
            pairing: Arc::new(Mutex::new(options.pairing)),
            bind_timeout: options.bind_timeout,
            handovers: Arc::default(),
        };
        let connector = build(app.clone(), options.device)?;
        let mut builder = ConnectorServer::builder(connector);
        #[cfg(feature = "postgres")]
        if let Some(url) = options.database_url.clone() {
            builder = builder.database_url(url);
        }
        builder = builder
            .config(RuntimeConfig::default().with_listener(options.listener))
            .state_dir(&options.state_dir)?
            .task(move |handle, shutdown| follow(app, handle, shutdown));
        if let Some(key) = options.api_key {
            builder = builder.api_key(key);
        }
        let server = builder.build().await?;
        Ok(Self { link, server })
    }

    /// The runtime (handle, Card, router).
    pub fn server(&self) -> &ConnectorServer {
        &self.server
    }

    /// The broker link.
    pub fn link(&self) -> &HomieLink {
        &self.link
    }

    /// Serves on `listener` until `shutdown` completes; then closes the broker link.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let result = self.server.serve(listener, shutdown).await;
        self.link.shutdown().await;
        result
    }
}

#[cfg(test)]
mod tests;
