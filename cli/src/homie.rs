//! `xagent-connector homie`: runs the reference Device Connector `device.homie` (see the
//! `xagent-connector-homie` crate) against an MQTT broker until Ctrl-C or SIGTERM.
//!
//! Secrets never need the command line (where every local user sees them in `ps`): the API key
//! comes from `--api-key-file` or `XAGENT_CONNECTOR_API_KEY`, the broker password from
//! `--mqtt-password-file` or `XAGENT_HOMIE_MQTT_PASSWORD` (a password inside `--mqtt-url` is
//! refused), and pairing codes from `--pairing-file` or `XAGENT_HOMIE_PAIRING_CODES`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use xagent_connector_homie::link::MqttUrl;
use xagent_connector_homie::pairing::PairingCodes;
use xagent_connector_homie::{Homie, HomieOptions};
use xagent_protocol_types::Secret;

/// The variable holding the broker password.
pub(crate) const MQTT_PASSWORD_ENV: &str = "XAGENT_HOMIE_MQTT_PASSWORD";
/// The variable holding pairing codes (`DEVICE_ID=CODE`, separated by newlines or `;`).
pub(crate) const PAIRING_CODES_ENV: &str = "XAGENT_HOMIE_PAIRING_CODES";

/// Options of `homie`.
#[derive(Debug, Args)]
pub struct HomieArgs {
    /// Directory for the database and the snapshot files (created if missing, readable only by
    /// its owner). With --database-url both are in PostgreSQL and this directory keeps only the
    /// lock that keeps a second process off.
    #[arg(long)]
    state_dir: PathBuf,
    /// The MQTT broker, mqtt://[USER@]HOST:PORT (plain TCP). A password in the URL is refused:
    /// give it with --mqtt-password-file or XAGENT_HOMIE_MQTT_PASSWORD.
    #[arg(long)]
    mqtt_url: String,
    /// Read the broker password from this file (first line; mode 0600). Takes precedence over
    /// XAGENT_HOMIE_MQTT_PASSWORD.
    #[arg(long, value_name = "PATH")]
    mqtt_password_file: Option<PathBuf>,
    /// A device's pairing code, DEVICE_ID=CODE (repeatable). Visible in `ps`: prefer
    /// --pairing-file or XAGENT_HOMIE_PAIRING_CODES. Codes are kept hashed.
    #[arg(long = "pairing-code", value_name = "DEVICE_ID=CODE")]
    pairing_codes: Vec<String>,
    /// A file of pairing codes: one DEVICE_ID=CODE per line, '#' comments.
    #[arg(long, value_name = "FILE")]
    pairing_file: Option<PathBuf>,
    /// How long a device's availability must have been reported before a new change is
    /// pushed to xAgent (changes in between are coalesced into one push), milliseconds.
    #[arg(long, value_name = "MS", default_value_t = duration_ms(xagent_connector_homie::link::DEFAULT_AVAILABILITY_DEBOUNCE))]
    availability_debounce_ms: u64,
    /// How long a `$state lost` must go without live traffic from the device before the
    /// device counts as offline, milliseconds.
    #[arg(long, value_name = "MS", default_value_t = duration_ms(xagent_connector_homie::link::DEFAULT_LOST_GRACE))]
    lost_grace_ms: u64,
    /// The flags of every server subcommand.
    #[command(flatten)]
    server: crate::common_args::ServerArgs,
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn usage(message: impl std::fmt::Display) -> ExitCode {
    crate::usage("homie", message)
}

/// The broker URL with its password from the file or the environment; a password written in
/// the URL itself is refused (it would be visible in the process list).
fn mqtt_url(args: &HomieArgs) -> Result<MqttUrl, String> {
    let url = MqttUrl::parse(&args.mqtt_url).map_err(|e| e.to_string())?;
    if url.has_password() {
        return Err(format!(
            "--mqtt-url must not carry a password (every local user sees it in ps): put it in --mqtt-password-file or {MQTT_PASSWORD_ENV}"
        ));
    }
    let password = match &args.mqtt_password_file {
        Some(path) => Some(crate::secrets::read_secret_file(path, "broker password", "homie")?),
        None => std::env::var(MQTT_PASSWORD_ENV).ok().filter(|p| !p.is_empty()),
    };
    match password {
        Some(_) if !url.has_user() => Err(format!(
            "a broker password was given but --mqtt-url names no user: use mqtt://USER@{}:{}",
            url.host, url.port
        )),
        Some(password) => Ok(url.with_password(Secret::new(password))),
        None => Ok(url),
    }
}

/// The pairing codes from the flags, the file and the environment.
fn pairing(args: &HomieArgs) -> Result<PairingCodes, String> {
    let mut pairing = PairingCodes::new();
    if !args.pairing_codes.is_empty() {
        eprintln!(
            "xagent-connector homie: warning: --pairing-code is visible to every local user in ps; prefer --pairing-file or {PAIRING_CODES_ENV}"
        );
    }
    for (i, entry) in args.pairing_codes.iter().enumerate() {
        pairing
            .add_entry(entry, &format!("--pairing-code #{}", i + 1))
            .map_err(|e| e.to_string())?;
    }
    if let Ok(text) = std::env::var(PAIRING_CODES_ENV) {
        let entries = text.split(['\n', ';']).map(str::trim).filter(|e| !e.is_empty());
        for (i, entry) in entries.enumerate() {
            pairing
                .add_entry(entry, &format!("{PAIRING_CODES_ENV} entry #{}", i + 1))
                .map_err(|e| e.to_string())?;
        }
    }
    if let Some(file) = &args.pairing_file {
        pairing.add_file(file).map_err(|e| e.to_string())?;
        crate::secrets::warn_if_shared(file, "homie");
    }
    Ok(pairing)
}

/// Runs the Connector.
pub fn run_command(args: HomieArgs) -> ExitCode {
    let (api_key, limits) = match args.server.key_and_limits("homie") {
        Ok(started) => started,
        Err(message) => return usage(message),
    };
    let mqtt = match mqtt_url(&args) {
        Ok(url) => url,
        Err(error) => return usage(error),
    };
    let pairing = match pairing(&args) {
        Ok(pairing) => pairing,
        Err(error) => return usage(error),
    };
    if pairing.devices().next().is_none() {
        eprintln!(
            "xagent-connector homie: no pairing codes given; nobody can bind a device until you add --pairing-file or {PAIRING_CODES_ENV}"
        );
    }
    args.server.start_logs("info,tower_http=warn");
    crate::common_args::block_on("homie", async move {
        let (listener, local_url) = match args.server.bind().await {
            Ok(bound) => bound,
            Err(message) => return usage(message),
        };
        let mut options = HomieOptions::new(mqtt.clone(), pairing, &args.state_dir);
        options.api_key = Some(Secret::new(api_key));
        options.link.availability_debounce = Duration::from_millis(args.availability_debounce_ms);
        options.link.lost_grace = Duration::from_millis(args.lost_grace_ms);
        options.listener = limits;
        options.database_url = args.server.database.database_url.clone();
        let homie = match Homie::open(options).await {
            Ok(homie) => homie,
            Err(error) => return crate::common_args::failed("homie", error),
        };
        if let Err(message) = args.server.listener.start_metrics(homie.server()).await {
            return crate::usage("homie", message);
        }
        println!("device.homie listening on {local_url} (Base URL for xAgent; broker {mqtt})");
        let stop = xagent_server_runtime::ops::stop_signal();
        crate::common_args::served("homie", homie.serve(listener, stop).await)
    })
}
