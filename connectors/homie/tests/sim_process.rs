//! The `homie-sim` binary as a user runs it, against a real Mosquitto: it comes up `ready`,
//! a SIGTERM stops it cleanly (`disconnected`), a SIGKILL leaves the broker to publish its last
//! will (`lost`), and starting it again brings the device back.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::sync::broadcast::Receiver;
use xagent_connector_homie::link::{Availability, DeviceEvent, HomieLink, LinkConfig};
use xagent_connector_homie::testing::Mosquitto;

const WAIT: Duration = Duration::from_secs(15);

fn spawn(broker: &Mosquitto, device: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_homie-sim"))
        .args(["--mqtt-url", &broker.url(), "--device-id", device])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("homie-sim starts")
}

async fn next_offline(events: &mut Receiver<DeviceEvent>) -> String {
    tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(DeviceEvent { availability: Availability::Offline(why), .. }) =
                events.recv().await
            {
                return why;
            }
        }
    })
    .await
    .expect("the device goes offline")
}

#[tokio::test]
async fn simulated_device_process_can_be_stopped_killed_and_restarted() {
    let broker = Mosquitto::start().expect("mosquitto starts (apt-get install mosquitto)");
    let (link, _task) = HomieLink::start(
        &broker.mqtt_url(),
        LinkConfig { lost_grace: Duration::from_millis(500), ..LinkConfig::default() },
    );
    link.watch("sim-proc").unwrap();

    let mut child = spawn(&broker, "sim-proc");
    link.wait_online("sim-proc", WAIT).await.unwrap();
    // Past the debounce window of the online report, so the next change is reported at once
    // (not the state at the window's end).
    tokio::time::sleep(link.config().availability_debounce).await;
    let mut events = link.subscribe();
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    assert!(next_offline(&mut events).await.contains("disconnected"));
    assert!(child.wait().unwrap().success(), "a SIGTERM is a clean exit");

    let mut child = spawn(&broker, "sim-proc");
    link.wait_online("sim-proc", WAIT).await.unwrap();
    tokio::time::sleep(link.config().availability_debounce).await;
    let mut events = link.subscribe();
    child.kill().unwrap(); // SIGKILL: no MQTT disconnect
    let _ = child.wait();
    assert!(next_offline(&mut events).await.contains("lost"));

    let mut child = spawn(&broker, "sim-proc");
    link.wait_online("sim-proc", WAIT).await.unwrap();
    child.kill().unwrap();
    let _ = child.wait();
}
