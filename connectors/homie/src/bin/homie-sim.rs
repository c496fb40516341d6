//! A simulated Homie v4 device (thermostat, climate sensor, camera) on a real MQTT broker.
//!
//! ```text
//! cargo run -p xagent-connector-homie --bin homie-sim -- \
//!     --mqtt-url mqtt://127.0.0.1:1883 --device-id thermostat-1 [--name NAME] [--ignore-sets]
//! ```
//!
//! Ctrl-C (or SIGTERM) stops it cleanly (`$state` = `disconnected`); `kill -9` drops the
//! connection, so the broker publishes its last will (`$state` = `lost`); running it again
//! brings the device back. `--ignore-sets` makes it ignore `/set` (to see `command_timeout`).

use std::process::ExitCode;

use xagent_connector_homie::link::MqttUrl;
use xagent_connector_homie::sim::{SimConfig, SimDevice};

fn usage(problem: &str) -> ExitCode {
    eprintln!("{problem}");
    eprintln!(
        "usage: homie-sim --mqtt-url mqtt://HOST:PORT --device-id ID [--name NAME] [--ignore-sets]"
    );
    ExitCode::from(2)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut url = None;
    let mut device = None;
    let mut name = None;
    let mut ignore_sets = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--mqtt-url" => url = args.next(),
            "--device-id" => device = args.next(),
            "--name" => name = args.next(),
            "--ignore-sets" => ignore_sets = true,
            other => return usage(&format!("unknown argument {other}")),
        }
    }
    let (Some(url), Some(device)) = (url, device) else {
        return usage("--mqtt-url and --device-id are required");
    };
    let url = match MqttUrl::parse(&url) {
        Ok(u) => u,
        Err(e) => return usage(&e.to_string()),
    };
    let mut config = SimConfig::new(url.clone(), device);
    if let Some(name) = name {
        config.name = name;
    }
    let mut sim = match SimDevice::new(config) {
        Ok(s) => s,
        Err(e) => return usage(&e.to_string()),
    };
    sim.ignore_sets(ignore_sets);
    if let Err(e) = sim.start().await {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    println!("homie device {} ready on {url}", sim.device_id());
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot listen for SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    sim.stop().await;
    println!("homie device {} disconnected", sim.device_id());
    ExitCode::SUCCESS
}
