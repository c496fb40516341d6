//! `xagent-connector homie`: runs the reference Device Connector `device.homie` (see the
//! `xagent-connector-homie` crate) against an MQTT broker until Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use xagent_connector_homie::link::MqttUrl;
use xagent_connector_homie::pairing::PairingCodes;
use xagent_connector_homie::{Homie, HomieOptions};
use xagent_protocol_types::Secret;

use crate::webchat::{bind, init_logs};

/// Options of `homie`.
#[derive(Debug, Args)]
pub struct HomieArgs {
    /// Address to listen on (host:port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// The system API key xAgent must present (also read from XAGENT_CONNECTOR_API_KEY).
    #[arg(long, env = "XAGENT_CONNECTOR_API_KEY", hide_env_values = true)]
    api_key: String,
    /// Directory for the database and the snapshot files (created if missing).
    #[arg(long)]
    state_dir: PathBuf,
    /// The MQTT broker, mqtt://HOST:PORT (plain TCP; user:password@ allowed).
    #[arg(long)]
    mqtt_url: String,
    /// A device's pairing code, DEVICE_ID=CODE (repeatable). Codes are kept hashed.
    #[arg(long = "pairing-code", value_name = "DEVICE_ID=CODE")]
    pairing_codes: Vec<String>,
    /// A file of pairing codes: one DEVICE_ID=CODE per line, '#' comments.
    #[arg(long, value_name = "FILE")]
    pairing_file: Option<PathBuf>,
    /// The listener's connection limits.
    #[command(flatten)]
    listener: crate::listen_args::ListenArgs,
}

fn usage(message: impl std::fmt::Display) -> ExitCode {
    crate::usage("homie", message)
}

/// Runs the Connector.
pub fn run_command(args: HomieArgs) -> ExitCode {
    if args.api_key.trim().is_empty() {
        return usage("the API key must not be empty");
    }
    let limits = match args.listener.limits() {
        Ok(limits) => limits,
        Err(message) => return usage(message),
    };
    let mqtt = match MqttUrl::parse(&args.mqtt_url) {
        Ok(url) => url,
        Err(error) => return usage(error),
    };
    let mut pairing = PairingCodes::new();
    for (i, entry) in args.pairing_codes.iter().enumerate() {
        if let Err(error) = pairing.add_entry(entry, &format!("--pairing-code #{}", i + 1)) {
            return usage(error);
        }
    }
    if let Some(file) = &args.pairing_file {
        if let Err(error) = pairing.add_file(file) {
            return usage(error);
        }
        use std::os::unix::fs::PermissionsExt;
        if std::fs::metadata(file).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
            eprintln!(
                "xagent-connector homie: warning: {} is readable by other users; chmod 600 it",
                file.display()
            );
        }
    }
    if pairing.devices().next().is_none() {
        eprintln!(
            "xagent-connector homie: no pairing codes given; nobody can bind a device until you add --pairing-code DEVICE_ID=CODE"
        );
    }
    init_logs("info,tower_http=warn");
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return usage(format!("cannot start the async runtime: {error}")),
    };
    runtime.block_on(async move {
        let (listener, local_url) = match bind(&args.listen).await {
            Ok(bound) => bound,
            Err(error) => return usage(format!("cannot listen on {}: {error}", args.listen)),
        };
        let mut options = HomieOptions::new(mqtt.clone(), pairing, &args.state_dir);
        options.api_key = Some(Secret::new(args.api_key));
        options.listener = limits;
        let homie = match Homie::open(options).await {
            Ok(homie) => homie,
            Err(error) => {
                eprintln!("xagent-connector homie: {error}");
                return ExitCode::FAILURE;
            }
        };
        println!("device.homie listening on {local_url} (Base URL for xAgent; broker {mqtt})");
        match homie.serve(listener, xagent_server_runtime::stop_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("xagent-connector homie: {error}");
                ExitCode::FAILURE
            }
        }
    })
}
