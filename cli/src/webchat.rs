//! `xagent-connector webchat`: runs the reference IM Connector `im.webchat` (see the
//! `xagent-connector-webchat` crate) until Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use clap::builder::TypedValueParser as _;
use xagent_connector_webchat::{GuessPolicy, VisitorLimits, Webchat, WebchatOptions};
use xagent_protocol_types::Secret;
use xagent_server_runtime::RuntimeConfig;

/// Options of `webchat`.
#[derive(Debug, Args)]
pub struct WebchatArgs {
    /// Directory for the database (rooms, visitors, history, channels) and the Transfer Plane's
    /// files (created if missing, readable only by its owner). With --database-url all of that
    /// is in PostgreSQL and this directory keeps only the lock that keeps a second process off.
    #[arg(long)]
    state_dir: PathBuf,
    /// The URL visitors reach this Connector at (pairing links start with it); default
    /// http://<listen address>.
    #[arg(long)]
    public_url: Option<String>,
    /// Wrong access codes one room takes at once from all visitors' addresses together (F5);
    /// then it refuses joins until the budget refills. One address alone never reaches it.
    #[arg(long, value_name = "N", default_value_t = JOIN.room_burst)]
    join_room_burst: u32,
    /// The room's join budget refills by one wrong code per this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = JOIN.room_interval_millis / 1_000)]
    join_room_interval_secs: u64,
    /// Wrong access or owner codes one room takes at once through auth.start, from all
    /// channels together (F21); each channel also backs off on its own.
    #[arg(long, value_name = "N", default_value_t = SIGN_IN.room_burst)]
    sign_in_room_burst: u32,
    /// The room's sign-in budget refills by one wrong code per this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = SIGN_IN.room_interval_millis / 1_000)]
    sign_in_room_interval_secs: u64,
    /// The flags of every server subcommand.
    #[command(flatten)]
    server: crate::common_args::ServerArgs,
    /// What one visitor address or room may take (streams, joins, uploads).
    #[command(flatten)]
    caps: CapArgs,
}

const JOIN: GuessPolicy = GuessPolicy::join();
const SIGN_IN: GuessPolicy = GuessPolicy::sign_in();

/// The guessing limits of the command line: joins per room (F5), sign-ins per room (F21).
fn guess_limits(args: &WebchatArgs) -> (VisitorLimits, GuessPolicy) {
    let mut visitors = args.caps.limits();
    visitors.join_room_burst = args.join_room_burst.max(1);
    visitors.join_room_interval_millis = args.join_room_interval_secs.saturating_mul(1_000);
    let mut sign_in = GuessPolicy::sign_in();
    sign_in.room_burst = args.sign_in_room_burst.max(1);
    sign_in.room_interval_millis = args.sign_in_room_interval_secs.saturating_mul(1_000);
    (visitors, sign_in)
}

/// The visitor caps and quotas of `webchat` (issue 23; SECURITY.md lists them with the rest).
/// Each flag sets the `VisitorLimits` field of the same name; the defaults are its defaults.
#[derive(Debug, Args)]
#[command(next_help_heading = "Visitor caps and quotas")]
pub struct CapArgs {
    /// Live event streams (open chat pages) one visitor session may hold.
    #[arg(long, value_name = "N", default_value_t = VisitorLimits::default().streams_per_token,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    streams_per_token: usize,
    /// Live event streams one visitor address (IPv6: one /64) may hold over all its sessions
    /// and rooms.
    #[arg(long, value_name = "N", default_value_t = VisitorLimits::default().streams_per_address,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    streams_per_address: usize,
    /// Live event streams per room.
    #[arg(long, value_name = "N", default_value_t = VisitorLimits::default().streams_per_room,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    streams_per_room: usize,
    /// Live event streams over the whole Connector.
    #[arg(long, value_name = "N", default_value_t = VisitorLimits::default().streams_total,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    streams_total: usize,
    /// Visitor sessions one address may start at once (then --joins-per-address-per-minute).
    #[arg(long, value_name = "N", default_value_t = VisitorLimits::default().joins_per_address_burst,
          value_parser = clap::value_parser!(u32).range(1..))]
    joins_per_address_burst: u32,
    /// Visitor sessions one address may start per minute after its burst (0: no limit).
    #[arg(long, value_name = "N",
          default_value_t = VisitorLimits::default().joins_per_address_per_minute)]
    joins_per_address_per_minute: u32,
    /// Largest file a visitor may upload, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = VisitorLimits::default().max_upload_bytes)]
    max_upload_bytes: u64,
    /// Visitor uploads written at once over the whole Connector (more wait their turn).
    #[arg(long, value_name = "N", default_value_t = VisitorLimits::default().concurrent_uploads,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    concurrent_uploads: usize,
    /// Bytes one room's visitors may upload per day (the room's share may be smaller).
    #[arg(long, value_name = "BYTES",
          default_value_t = VisitorLimits::default().room_upload_bytes_per_day)]
    room_upload_bytes_per_day: u64,
    /// Files one room's visitors may upload per day (the room's share may be smaller).
    #[arg(long, value_name = "N", default_value_t = VisitorLimits::default().room_upload_files_per_day)]
    room_upload_files_per_day: u64,
    /// Bytes all visitors together may upload per day.
    #[arg(long, value_name = "BYTES",
          default_value_t = VisitorLimits::default().visitor_upload_bytes_per_day)]
    visitor_upload_bytes_per_day: u64,
    /// Files all visitors together may upload per day.
    #[arg(long, value_name = "N",
          default_value_t = VisitorLimits::default().visitor_upload_files_per_day)]
    visitor_upload_files_per_day: u64,
    /// The most one room may use of the two all-visitor quotas above, in percent (1-100).
    #[arg(long, value_name = "PERCENT",
          default_value_t = VisitorLimits::default().room_upload_share_percent,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    room_upload_share_percent: u8,
}

impl CapArgs {
    /// The visitor limits with these flags applied (every other field keeps its default).
    fn limits(&self) -> VisitorLimits {
        let mut limits = VisitorLimits::default();
        limits.streams_per_token = self.streams_per_token;
        limits.streams_per_address = self.streams_per_address;
        limits.streams_per_room = self.streams_per_room;
        limits.streams_total = self.streams_total;
        limits.joins_per_address_burst = self.joins_per_address_burst;
        limits.joins_per_address_per_minute = self.joins_per_address_per_minute;
        limits.max_upload_bytes = self.max_upload_bytes;
        limits.concurrent_uploads = self.concurrent_uploads;
        limits.room_upload_bytes_per_day = self.room_upload_bytes_per_day;
        limits.room_upload_files_per_day = self.room_upload_files_per_day;
        limits.visitor_upload_bytes_per_day = self.visitor_upload_bytes_per_day;
        limits.visitor_upload_files_per_day = self.visitor_upload_files_per_day;
        limits.room_upload_share_percent = self.room_upload_share_percent;
        limits
    }
}

/// Logs text to stderr (colour codes only at a terminal); `RUST_LOG` overrides the default
/// level.
pub(crate) fn init_logs(default: &str) {
    xagent_server_runtime::ops::init_logging(default, xagent_server_runtime::ops::LogFormat::Text);
}

/// Runs the Connector.
pub fn run_command(args: WebchatArgs) -> ExitCode {
    let (api_key, limits) = match args.server.key_and_limits("webchat") {
        Ok(started) => started,
        Err(message) => return crate::usage("webchat", message),
    };
    args.server.start_logs("info,tower_http=warn");
    crate::common_args::block_on("webchat", async move {
        let (listener, local_url) = match args.server.bind().await {
            Ok(bound) => bound,
            Err(message) => return crate::usage("webchat", message),
        };
        let (visitor_limits, sign_in_limits) = guess_limits(&args);
        let public_url = args.public_url.unwrap_or_else(|| local_url.clone());
        let mut options = WebchatOptions::new(&args.state_dir, public_url.clone())
            .with_api_key(Secret::new(api_key))
            .with_config(RuntimeConfig::default().with_listener(limits))
            .with_visitor_limits(visitor_limits)
            .with_sign_in_limits(sign_in_limits);
        if let Some(url) = args.server.database.database_url.clone() {
            options = options.with_database_url(url);
        }
        let webchat = match Webchat::open(options).await {
            Ok(webchat) => webchat,
            Err(error) => return crate::common_args::failed("webchat", error),
        };
        if let Err(message) = args.server.listener.start_metrics(webchat.server()).await {
            return crate::usage("webchat", message);
        }
        println!(
            "im.webchat listening on {local_url} (Base URL for xAgent; chat page at {public_url}/chat/)"
        );
        let stop = xagent_server_runtime::ops::stop_signal();
        crate::common_args::served("webchat", webchat.serve(listener, stop).await)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Caps {
        #[command(flatten)]
        caps: CapArgs,
    }

    #[test]
    fn cap_flags_default_to_the_visitor_limits_and_set_them() {
        let defaults = Caps::try_parse_from(["webchat"]).unwrap().caps.limits();
        assert_eq!(defaults, VisitorLimits::default());
        let set = Caps::try_parse_from([
            "webchat",
            "--streams-per-address",
            "3",
            "--joins-per-address-per-minute",
            "0",
            "--room-upload-share-percent",
            "50",
        ])
        .unwrap()
        .caps
        .limits();
        assert_eq!(set.streams_per_address, 3);
        assert_eq!(set.joins_per_address_per_minute, 0);
        assert_eq!(set.room_upload_share_percent, 50);
        for bad in [["--streams-per-address", "0"], ["--room-upload-share-percent", "101"]] {
            assert!(Caps::try_parse_from(["webchat", bad[0], bad[1]]).is_err(), "{bad:?}");
        }
    }
}
