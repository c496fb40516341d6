//! Round two, device.homie (issue 23): F2, F10, F15 to F19 and X2, with an attacker on a real
//! Mosquitto.
//!
//! The xtask starts Mosquitto (Debian's package, as the crate's tests do) on a free port,
//! simulated Homie devices on it (`xagent_connector_homie::sim`, real MQTT clients), and the
//! real `xagent-connector homie` binary against it, paired with those devices; xAgent's side is
//! client-runtime's `DataPlane` over the real data plane. The attacker is one more MQTT client
//! that may publish anywhere under the devices' topics (the broker is not locked down).
//! `XTASK_ATTACK_BIN` points the scenarios at another build of `xagent-connector` (how the
//! "before" figures were measured against main's binary).

use std::sync::{Arc, Mutex};

use rumqttc::{AsyncClient as MqttClient, MqttOptions, QoS};
use xagent_connector_homie::link::MqttUrl;
use xagent_connector_homie::sim::{SimConfig, SimDevice};
use xagent_connector_homie::testing::Mosquitto;
use xagent_protocol_types::{PROFILE_DEVICE_V1, ToolInvoke};

#[allow(unused_imports)]
use super::*;

const HOMIE_CARD: &str = "device.homie";
const BIND_FLOW: &str = "homie_bind";
const BROKER_USER: &str = "homie";
const BROKER_PASSWORD: &str = "broker-pw-attack-2c7f";

/// The devices of the run and their pairing codes.
const DEVICES: [(&str, &str); 6] = [
    ("f10-dev", "pair-f10-code-1"),
    ("f15-dev", "pair-f15-code-1"),
    ("f16-dev", "pair-f16-code-1"),
    ("f17-dev", "pair-f17-code-1"),
    ("f18-cam", "pair-f18-code-1"),
    ("f2-dev", "pair-f2-code-11"),
];

fn code_of(device: &str) -> &'static str {
    DEVICES.iter().find(|(d, _)| *d == device).map_or("", |(_, c)| c)
}

/// device.homie's scenarios, in the order they run (F2 last: on an unfixed build it keeps the
/// broker link down until the oversized message is removed).
pub(super) async fn run(bin: &Path, sizes: &Sizes) -> Result<Vec<Outcome>> {
    let bin = std::env::var_os("XTASK_ATTACK_BIN").map_or_else(|| bin.to_path_buf(), PathBuf::from);
    let broker = Mosquitto::start().context("starting mosquitto (apt-get install mosquitto)")?;
    let mut sims = Vec::new();
    for (device, _) in DEVICES {
        let mut sim =
            SimDevice::new(SimConfig::new(MqttUrl::new("127.0.0.1", broker.port()), device))
                .map_err(|e| anyhow!("{e}"))?;
        sim.start().await.map_err(|e| anyhow!("{e}"))?;
        sims.push(sim);
    }
    let sim = |device: &str| sims.iter().find(|s| s.device_id() == device);
    let mut target = start_homie(&bin, &broker).await?;
    let xagent = HomieXagent::connect(&target).await?;
    let attacker = Attacker::connect(broker.port()).await?;
    let mut outcomes = Vec::new();
    let f10 = sim("f10-dev").ok_or_else(|| anyhow!("no f10 device"))?;
    outcomes.push(f10_scenario(&xagent, &attacker, f10).await?);
    let f15 = sim("f15-dev").ok_or_else(|| anyhow!("no f15 device"))?;
    outcomes.push(f15_scenario(&xagent, &attacker, f15, sizes).await?);
    outcomes.push(f16_scenario(&xagent, &attacker).await?);
    outcomes.push(f17_scenario(&xagent, &attacker).await?);
    outcomes.push(f18_scenario(&xagent, &attacker).await?);
    outcomes.push(f2_scenario(&xagent, &attacker, &broker, sizes).await?);
    xagent.plane.close().await;
    let _ = target.child.kill().await;
    let _ = std::fs::remove_dir_all(&target.dir);
    outcomes.push(f19_scenario(&bin).await?);
    outcomes.push(x2_scenario().await?);
    for mut s in sims {
        s.stop().await;
    }
    Ok(outcomes)
}

/// Starts `xagent-connector homie` against `broker` with every device's pairing code (in a
/// 0600 file) and the API key in the environment: flags every build has.
async fn start_homie(bin: &Path, broker: &Mosquitto) -> Result<Target> {
    let dir = fresh_dir()?;
    let codes: String = DEVICES.iter().map(|(d, c)| format!("{d}={c}\n")).collect();
    let pairing = secret_file(&dir, "pairing-codes", &codes)?;
    let log = dir.join("connector.log");
    let mut command = tokio::process::Command::new(bin);
    command
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .env("RUST_LOG", "info")
        .args(["homie", "--listen", "127.0.0.1:0", "--mqtt-url", &broker.url()])
        .arg("--pairing-file")
        .arg(&pairing)
        .arg("--state-dir")
        .arg(dir.join("state"));
    let (child, addr) = spawn_homie(command, &log).await?;
    let pid = child.id().ok_or_else(|| anyhow!("no pid"))?;
    Ok(Target { child, pid, addr, dir, log })
}

/// Spawns a homie command and reads its Base URL from the first line.
async fn spawn_homie(
    mut command: tokio::process::Command,
    log: &Path,
) -> Result<(tokio::process::Child, String)> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(std::fs::OpenOptions::new().create(true).append(true).open(log)?)
        .kill_on_drop(true)
        .spawn()
        .context("starting xagent-connector homie")?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("homie did not start in 30 s")??
        .ok_or_else(|| {
            anyhow!("homie exited at start: {}", std::fs::read_to_string(log).unwrap_or_default())
        })?;
    let addr = line
        .strip_prefix("device.homie listening on http://")
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or_else(|| anyhow!("unexpected first line {line:?}"))?
        .to_owned();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, addr))
}

fn secret_file(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(path)
}

/// xAgent's side for device.homie: a data plane, with every Descriptor push recorded.
struct HomieXagent {
    plane: DataPlane,
    pushes: Arc<Mutex<Vec<(ConnectorChannelId, String)>>>,
}

impl HomieXagent {
    async fn connect(target: &Target) -> Result<Self> {
        let base = BaseUrl::parse(&target.url("")).map_err(|e| anyhow!("{e}"))?;
        let config = ClientConfig::new(base, HOMIE_CARD, vec![PROFILE_DEVICE_V1.into()])
            .with_api_key(Secret::new(API_KEY));
        let (plane, mut events) = DataPlane::connect(config).await?;
        let pushes = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&pushes);
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                if let xagent_client_runtime::ClientEvent::DescriptorPushed { channel, descriptor } =
                    event
                    && let Ok(mut seen) = seen.lock()
                {
                    seen.push((channel, descriptor.connection.status.as_str().to_owned()));
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(15), plane.connected())
            .await
            .context("xAgent could not connect to homie")?
            .map_err(|e| anyhow!("{e}"))?;
        Ok(Self { plane, pushes })
    }

    /// Opens a channel and binds `device` with its pairing code.
    async fn bind(&self, device: &str) -> Result<ConnectorChannelId> {
        let channel =
            self.plane.open_channel(None).await.map_err(|e| anyhow!("{e}"))?.connector_channel_id;
        let input =
            AuthInput::default().with("device_id", device).with("pairing_code", code_of(device));
        let ack = self
            .plane
            .request(Some(&channel), AuthStart::new(BIND_FLOW).with_input(input))
            .await
            .map_err(|e| anyhow!("{e}"))?;
        if ack.0.status != AuthStatus::Authenticated {
            bail!("binding {device} failed: {:?}", ack.0.message);
        }
        self.plane.remember_channel(channel.clone()).await;
        Ok(channel)
    }

    /// Invokes a device Tool: its result, or the error's text.
    async fn invoke(
        &self,
        channel: &ConnectorChannelId,
        tool: &str,
        args: Value,
    ) -> std::result::Result<Value, String> {
        let mut arguments = args.as_object().cloned().unwrap_or_default();
        arguments.insert("connector_channel_id".into(), json!(channel.as_str()));
        match self.plane.request(Some(channel), ToolInvoke::new(tool, arguments)).await {
            Ok(ack) => Ok(ack.result.unwrap_or(Value::Null)),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Descriptor pushes for `channel` so far: (total, how many were not `connected`).
    fn pushes(&self, channel: &ConnectorChannelId) -> (usize, usize) {
        let seen = self.pushes.lock().map(|s| s.clone()).unwrap_or_default();
        let mine: Vec<&String> =
            seen.iter().filter(|(c, _)| c == channel).map(|(_, s)| s).collect();
        (mine.len(), mine.iter().filter(|s| s.as_str() != "connected").count())
    }
}

/// Anyone on the broker: publishes (retained or not) under any device's topics.
struct Attacker {
    client: MqttClient,
    sets_seen: Arc<Mutex<Vec<String>>>,
}

impl Attacker {
    async fn connect(port: u16) -> Result<Self> {
        let mut options = MqttOptions::new("attacker-on-the-broker", "127.0.0.1", port);
        options.set_max_packet_size(16 * 1024 * 1024, 16 * 1024 * 1024);
        options.set_keep_alive(Duration::from_secs(30));
        let (client, mut eventloop) = MqttClient::new(options, 4096);
        let sets_seen = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&sets_seen);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let mut ready_tx = Some(ready_tx);
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                        if let Ok(mut seen) = seen.lock() {
                            seen.push(format!(
                                "{}={}",
                                p.topic,
                                String::from_utf8_lossy(&p.payload)
                            ));
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), ready_rx)
            .await
            .context("the attacker could not connect to the broker")??;
        // It watches every set the Connector publishes.
        client.subscribe("homie/+/+/+/set", QoS::AtLeastOnce).await?;
        Ok(Self { client, sets_seen })
    }

    async fn retain(&self, topic: &str, payload: impl Into<Vec<u8>>) -> Result<()> {
        self.client.publish(topic, QoS::AtLeastOnce, true, payload.into()).await?;
        Ok(())
    }

    fn sets_for(&self, device: &str) -> Vec<String> {
        let prefix = format!("homie/{device}/");
        self.sets_seen
            .lock()
            .map(|s| s.iter().filter(|t| t.starts_with(&prefix)).cloned().collect())
            .unwrap_or_default()
    }
}

/// F10: ranges and `$settable` rewritten on the broker after binding; a fake property that
/// the attacker answers itself.
async fn f10_scenario(x: &HomieXagent, evil: &Attacker, device: &SimDevice) -> Result<Outcome> {
    let channel = x.bind("f10-dev").await?;
    evil.retain("homie/f10-dev/thermostat/target-temperature/$format", "0:200").await?;
    evil.retain("homie/f10-dev/sensor/temperature/$settable", "true").await?;
    evil.retain("homie/f10-dev/sensor/$properties", "temperature,humidity,door").await?;
    evil.retain("homie/f10-dev/sensor/door/$datatype", "boolean").await?;
    evil.retain("homie/f10-dev/sensor/door/$settable", "true").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = device.sets_received();
    // Their answers do not matter: what counts is whether a set reached the broker.
    let _ = x
        .invoke(
            &channel,
            "homie_property_set",
            json!({"node": "thermostat", "property": "target-temperature", "value": 150}),
        )
        .await;
    let _ = x
        .invoke(
            &channel,
            "homie_property_set",
            json!({"node": "sensor", "property": "temperature", "value": 20}),
        )
        .await;
    // The attacker answers sets on its own property, as a device would.
    let answer = {
        let client = evil.client.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let _ =
                client.publish("homie/f10-dev/sensor/door", QoS::AtLeastOnce, true, "true").await;
        })
    };
    let fake = x
        .invoke(
            &channel,
            "homie_property_set",
            json!({"node": "sensor", "property": "door", "value": true}),
        )
        .await;
    let _ = answer.await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let published = evil.sets_for("f10-dev");
    let sent = |topic: &str| {
        published.iter().any(|p| p.starts_with(&format!("homie/f10-dev/{topic}/set=")))
    };
    let (wide_sent, read_only_sent, fake_sent) =
        (sent("thermostat/target-temperature"), sent("sensor/temperature"), sent("sensor/door"));
    let device_sets = device.sets_received() - before;
    let confirmed = |r: &std::result::Result<Value, String>| {
        r.as_ref().is_ok_and(|v| v["confirmed"] == json!(true))
    };
    let fake_confirmed = confirmed(&fake);
    let defended = published.is_empty() && device_sets == 0 && !fake_confirmed;
    // Put the device's own description back for whoever binds it next.
    evil.retain("homie/f10-dev/thermostat/target-temperature/$format", "10:30").await?;
    evil.retain("homie/f10-dev/sensor/temperature/$settable", "false").await?;
    evil.retain("homie/f10-dev/sensor/$properties", "temperature,humidity").await?;
    Ok(Outcome::new(
        "F10",
        "ranges and $settable taken from what is retained on the broker",
        defended,
        format!(
            "{} of 3 sets published after the broker's description was rewritten (150 for a 10:30 range: {wide_sent}; to a read-only sensor: {read_only_sent}; to a property the attacker added: {fake_sent}, confirmed: {fake_confirmed})",
            published.len(),
        ),
    )
    .with(json!({
        "sets_published": published.len(),
        "device_sets": device_sets,
        "out_of_range_published": wide_sent,
        "read_only_published": read_only_sent,
        "fake_property_published": fake_sent,
        "fake_property_confirmed": fake_confirmed,
    })))
}

/// F15: a retained `$state lost` while the device keeps publishing.
async fn f15_scenario(
    x: &HomieXagent,
    evil: &Attacker,
    device: &SimDevice,
    sizes: &Sizes,
) -> Result<Outcome> {
    let channel = x.bind("f15-dev").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, offline_before) = x.pushes(&channel);
    evil.retain("homie/f15-dev/$state", "lost").await?;
    let watch = Duration::from_secs(if sizes.full { 10 } else { 7 });
    let started = Instant::now();
    let mut reading = 20.0;
    while started.elapsed() < watch {
        device.set_temperature_reading(reading).await;
        reading += 0.1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (_, offline_after) = x.pushes(&channel);
    let offline = offline_after - offline_before;
    let read = x
        .invoke(
            &channel,
            "homie_property_read",
            json!({"node": "sensor", "property": "temperature"}),
        )
        .await;
    evil.retain("homie/f15-dev/$state", "ready").await?;
    Ok(Outcome::new(
        "F15",
        "a retained $state lost takes a running device offline",
        offline == 0 && read.is_ok(),
        format!(
            "{offline} offline push(es) in {:.0} s while the device published every 0.5 s; a read then {}",
            watch.as_secs_f64(),
            if read.is_ok() { "worked" } else { "failed" }
        ),
    )
    .with(json!({"offline_pushes": offline, "seconds": watch.as_secs(), "read_ok": read.is_ok()})))
}

/// F16: 2,000 `$state` flips as fast as the attacker can publish them.
async fn f16_scenario(x: &HomieXagent, evil: &Attacker) -> Result<Outcome> {
    let channel = x.bind("f16-dev").await?;
    // Past the first report's window.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let (before, _) = x.pushes(&channel);
    for i in 0..2_000 {
        let state = if i % 2 == 0 { "disconnected" } else { "ready" };
        evil.client.publish("homie/f16-dev/$state", QoS::AtMostOnce, true, state).await?;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (after, _) = x.pushes(&channel);
    let pushes = after - before;
    Ok(Outcome::new(
        "F16",
        "device availability is not debounced",
        pushes <= 4,
        format!("2000 $state flips published back to back gave {pushes} Descriptor push(es)"),
    )
    .with(json!({"flips": 2_000, "pushes": pushes})))
}

/// F17: a long base64-like property value.
async fn f17_scenario(x: &HomieXagent, evil: &Attacker) -> Result<Outcome> {
    let channel = x.bind("f17-dev").await?;
    let value: String = (0..6_000u32)
        .map(|i| {
            char::from(
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
                    [(i * 7 % 64) as usize],
            )
        })
        .collect();
    evil.retain("homie/f17-dev/camera/resolution", value.clone()).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let described = x.invoke(&channel, "homie_device_describe", json!({})).await;
    let detail = match &described {
        Ok(_) => "describe answered".to_owned(),
        Err(e) => format!("describe failed: {}", e.chars().take(120).collect::<String>()),
    };
    evil.retain("homie/f17-dev/camera/resolution", "64x48").await?;
    Ok(Outcome::new(
        "F17",
        "a long property value makes describe fail as \"media bytes\"",
        described.is_ok(),
        format!("a {}-character value: {detail}", value.len()),
    )
    .with(json!({"value_chars": value.len(), "describe_ok": described.is_ok()})))
}

/// F18: the snapshot MIME type from the broker.
async fn f18_scenario(x: &HomieXagent, evil: &Attacker) -> Result<Outcome> {
    evil.retain("homie/f18-cam/camera/$snapshot", "text/html").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let channel = x.bind("f18-cam").await?;
    let snap = x.invoke(&channel, "homie_camera_snapshot", json!({"node": "camera"})).await;
    let mime = snap.as_ref().ok().and_then(|v| v["mime_type"].as_str().map(str::to_owned));
    let accepted_non_image =
        snap.is_ok() && !mime.as_deref().is_some_and(|m| m.starts_with("image/"));
    evil.retain("homie/f18-cam/camera/$snapshot", "image/png").await?;
    Ok(Outcome::new(
        "F18",
        "the snapshot's MIME type is taken unchecked from the broker",
        !accepted_non_image,
        match &snap {
            Ok(_) => format!(
                "a snapshot declared text/html was served as {}",
                mime.as_deref().unwrap_or("?")
            ),
            Err(e) => format!("refused: {}", e.chars().take(120).collect::<String>()),
        },
    )
    .with(json!({"accepted": snap.is_ok(), "mime_type": mime})))
}

/// F2: one retained message larger than the Connector's packet limit.
async fn f2_scenario(
    x: &HomieXagent,
    evil: &Attacker,
    broker: &Mosquitto,
    sizes: &Sizes,
) -> Result<Outcome> {
    let channel = x.bind("f2-dev").await?;
    let connects = || broker.log().matches("as xagent-homie-").count();
    let before = connects();
    // 9 MiB: more than the default 8 MiB snapshot limit plus room for the header.
    evil.retain("homie/f2-dev/junk/blob", vec![b'x'; 9 * 1024 * 1024]).await?;
    let window = Duration::from_secs(if sizes.full { 20 } else { 5 });
    tokio::time::sleep(window).await;
    let losses = connects() - before;
    let read = x
        .invoke(&channel, "homie_property_read", json!({"node": "sensor", "property": "humidity"}))
        .await;
    evil.retain("homie/f2-dev/junk/blob", Vec::new()).await?;
    Ok(Outcome::new(
        "F2",
        "one retained oversized MQTT message keeps device.homie offline",
        losses == 0 && read.is_ok(),
        format!(
            "{losses} broker link loss(es) in {} s after a 9 MiB retained message; a read then {}",
            window.as_secs(),
            if read.is_ok() { "worked" } else { "failed" }
        ),
    )
    .with(json!({"link_losses": losses, "seconds": window.as_secs(), "read_ok": read.is_ok()})))
}

/// F19: the secrets of `homie` started the documented way, as `ps` shows them.
async fn f19_scenario(bin: &Path) -> Result<Outcome> {
    let broker = Mosquitto::start_secured(&[(BROKER_USER, BROKER_PASSWORD)], None)
        .context("starting a mosquitto with a password")?;
    let dir = fresh_dir()?;
    let key_file = secret_file(&dir, "api-key", API_KEY)?;
    let password_file = secret_file(&dir, "mqtt-password", BROKER_PASSWORD)?;
    let pairing_file = secret_file(&dir, "pairing-codes", "f19-dev=pair-f19-code-1\n")?;
    let log = dir.join("connector.log");
    // The documented way (README, docs/DEVICE.md): every secret from a file.
    let mut documented = tokio::process::Command::new(bin);
    documented
        .env_remove("XAGENT_CONNECTOR_API_KEY")
        .args(["homie", "--listen", "127.0.0.1:0"])
        .args(["--mqtt-url", &format!("mqtt://{BROKER_USER}@127.0.0.1:{}", broker.port())])
        .arg("--api-key-file")
        .arg(&key_file)
        .arg("--mqtt-password-file")
        .arg(&password_file)
        .arg("--pairing-file")
        .arg(&pairing_file)
        .arg("--state-dir")
        .arg(dir.join("state"));
    let (way, started) = match spawn_homie(documented, &log).await {
        Ok(started) => ("files", started),
        Err(_) => {
            // A build without those flags: the way its README showed.
            let mut old = tokio::process::Command::new(bin);
            old.env_remove("XAGENT_CONNECTOR_API_KEY")
                .args(["homie", "--listen", "127.0.0.1:0", "--api-key", API_KEY])
                .args([
                    "--mqtt-url",
                    &format!("mqtt://{BROKER_USER}:{BROKER_PASSWORD}@127.0.0.1:{}", broker.port()),
                ])
                .args(["--pairing-code", "f19-dev=pair-f19-code-1"])
                .arg("--state-dir")
                .arg(dir.join("state-old"));
            ("command line", spawn_homie(old, &log).await?)
        }
    };
    let (mut child, _addr) = started;
    let pid = child.id().ok_or_else(|| anyhow!("no pid"))?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default();
    let visible: Vec<&str> = [
        ("API key", API_KEY),
        ("broker password", BROKER_PASSWORD),
        ("pairing code", "pair-f19-code-1"),
    ]
    .into_iter()
    .filter(|(_, secret)| cmdline.contains(secret))
    .map(|(what, _)| what)
    .collect();
    let _ = child.kill().await;
    // A password in the URL is refused outright.
    let refused = tokio::process::Command::new(bin)
        .env("XAGENT_CONNECTOR_API_KEY", API_KEY)
        .args(["homie", "--listen", "127.0.0.1:0"])
        .args(["--mqtt-url", &format!("mqtt://{BROKER_USER}:{BROKER_PASSWORD}@127.0.0.1:1")])
        .arg("--state-dir")
        .arg(dir.join("state-refused"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status();
    // A build that accepts it keeps running (retrying the broker); one that refuses exits 2.
    let url_password_refused = tokio::time::timeout(Duration::from_secs(5), refused)
        .await
        .ok()
        .and_then(std::result::Result::ok)
        .is_some_and(|s| s.code() == Some(2));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Outcome::new(
        "F19",
        "broker password and pairing codes on homie's command line",
        way == "files" && visible.is_empty() && url_password_refused,
        format!(
            "started with secrets from {way}; visible in /proc/PID/cmdline: {}; a password in --mqtt-url {}",
            if visible.is_empty() { "none".to_owned() } else { visible.join(", ") },
            if url_password_refused { "is refused" } else { "is accepted" }
        ),
    )
    .with(json!({"secrets_from": way, "visible_in_cmdline": visible, "url_password_refused": url_password_refused})))
}

/// X2: a Device Profile confirmation grant for one call, tried on another call of the same
/// Tool. Grants are made by a Connector's own code (`ConnectorHandle::grant_confirmation`)
/// and none of device.homie's Tools is high-risk, so this runs a small device Connector with
/// one high-risk Tool on the runtime, in this process, over a real socket.
async fn x2_scenario() -> Result<Outcome> {
    let (server, base, stop) = x2_lab::serve().await?;
    let config = ClientConfig::new(
        BaseUrl::parse(&base).map_err(|e| anyhow!("{e}"))?,
        x2_lab::CARD,
        vec![PROFILE_DEVICE_V1.into()],
    )
    .with_api_key(Secret::new(API_KEY));
    let (plane, _events) = DataPlane::connect(config).await?;
    tokio::time::timeout(Duration::from_secs(15), plane.connected())
        .await
        .context("xAgent could not connect to the lab")?
        .map_err(|e| anyhow!("{e}"))?;
    let channel = plane.open_channel(None).await.map_err(|e| anyhow!("{e}"))?.connector_channel_id;
    let ack = plane
        .request(
            Some(&channel),
            AuthStart::new(x2_lab::FLOW).with_input(AuthInput::default().with("device", "door-1")),
        )
        .await
        .map_err(|e| anyhow!("{e}"))?;
    if ack.0.status != AuthStatus::Authenticated {
        bail!("binding the lab device failed");
    }
    let invoke = |minutes: i64| {
        let mut args = serde_json::Map::new();
        args.insert("minutes".into(), json!(minutes));
        args.insert("connector_channel_id".into(), json!(channel.as_str()));
        args
    };
    // The user confirmed unlocking for one minute.
    let confirmed = {
        let mut args = serde_json::Map::new();
        args.insert("minutes".into(), json!(1));
        args.insert("connector_channel_id".into(), json!(channel.as_str()));
        args
    };
    x2_lab::grant(&server, &channel, &confirmed)?;
    let other = plane.request(Some(&channel), ToolInvoke::new(x2_lab::TOOL, invoke(600))).await;
    let same = plane.request(Some(&channel), ToolInvoke::new(x2_lab::TOOL, invoke(1))).await;
    plane.close().await;
    let _ = stop.send(());
    let other_ran = other.is_ok();
    Ok(Outcome::new(
        "X2",
        "a Device confirmation grant is keyed by channel and Tool, not by the arguments",
        !other_ran && same.is_ok(),
        format!(
            "a grant for {{minutes: 1}}: a call with {{minutes: 600}} {}; the confirmed call {}",
            if other_ran { "ran" } else { "was refused (confirmation_required)" },
            if same.is_ok() { "ran" } else { "was refused" }
        ),
    )
    .with(json!({"other_arguments_ran": other_ran, "confirmed_call_ran": same.is_ok()})))
}

/// The small device Connector of X2: one high-risk Tool.
mod x2_lab {
    use super::*;
    use schemars::JsonSchema;
    use serde::Deserialize;
    use xagent_protocol_types::{DescriptorTarget, TargetDeclaration, TargetType, ToolId};
    use xagent_server_runtime::{
        AuthStep, Binding, ChannelContext, Connector, ConnectorServer, DeviceConfig, DeviceStatus,
        DeviceTarget, FlowSpec, RiskLevel, ToolCategory, ToolError, ToolSpec,
    };

    pub(super) const CARD: &str = "device.attack-lab";
    pub(super) const FLOW: &str = "lab_bind";
    pub(super) const TOOL: &str = "lab_unlock";

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
    struct UnlockArgs {
        /// How long the door stays unlocked.
        #[schemars(range(min = 1, max = 1440))]
        minutes: i64,
    }

    pub(super) async fn serve()
    -> Result<(ConnectorServer, String, tokio::sync::oneshot::Sender<()>)> {
        let connector = Connector::builder(CARD, "Attack lab", "1.0.0")
            .target(TargetDeclaration::new(TargetType::Device, "lab", "Lab door"))
            .profile(PROFILE_DEVICE_V1)
            .form_flow(FlowSpec::new(FLOW, "Bind a lab door"), |_ctx, form: BindForm| async move {
                Ok(AuthStep::Authenticated(
                    Binding::new(DescriptorTarget::new("lab", "Lab door"))
                        .with_secret("device", Secret::new(form.device)),
                ))
            })
            .device_target(Lab, DeviceConfig::default())
            .device_tool(
                ToolSpec::new(TOOL, "Unlock\nUnlocks the door for a while."),
                ToolCategory::Control,
                RiskLevel::High,
                |_ctx, args: UnlockArgs| async move {
                    Ok::<_, ToolError>(json!({"unlocked_minutes": args.minutes}))
                },
            )
            .build()
            .map_err(|e| anyhow!("{e}"))?;
        let dir = fresh_dir()?;
        let server = ConnectorServer::builder(connector)
            .state_dir(dir.join("state"))
            .map_err(|e| anyhow!("{e}"))?
            .api_key(Secret::new(API_KEY))
            .build()
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let (addr, stop) = serve_in_process(&server).await?;
        Ok((server, format!("http://{addr}"), stop))
    }

    pub(super) fn grant(
        server: &ConnectorServer,
        channel: &ConnectorChannelId,
        arguments: &serde_json::Map<String, Value>,
    ) -> Result<()> {
        server
            .handle()
            .grant_confirmation(channel, &ToolId::new(TOOL), arguments)
            .map_err(|e| anyhow!("{e}"))
    }
}
