//! `xagent-connector matrix`: runs the IM Connector `im.matrix` (see the
//! `xagent-connector-matrix` crate) for one bot account on a Matrix homeserver until Ctrl-C or
//! SIGTERM.
//!
//! The bot's secret never goes on the command line (every local user sees it in `ps`): its
//! password comes from `XAGENT_MATRIX_PASSWORD` or its access token from
//! `XAGENT_MATRIX_ACCESS_TOKEN`; the API key as for the other subcommands.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use xagent_connector_matrix::{Credentials, Matrix, MatrixOptions};
use xagent_protocol_types::Secret;

/// Options of `matrix`.
#[derive(Debug, Args)]
pub struct MatrixArgs {
    /// Directory for the database, the files, and the bot's session and crypto store
    /// (created if missing, readable only by its owner). With --database-url the database and
    /// the files are in PostgreSQL and this directory keeps the bot's stores and the lock.
    /// Keep it: it holds the bot's keys.
    #[arg(long)]
    state_dir: PathBuf,
    /// The homeserver's client API, e.g. https://matrix.example.org.
    #[arg(long, value_name = "URL")]
    homeserver: String,
    /// The bot's user id, e.g. @agent:example.org. Its password comes from
    /// XAGENT_MATRIX_PASSWORD or its access token from XAGENT_MATRIX_ACCESS_TOKEN.
    #[arg(long, value_name = "@USER:SERVER")]
    user: String,
    /// The least time between two edits of a streamed reply, milliseconds (the homeserver
    /// rate-limits messages; edits count).
    #[arg(long, value_name = "MS", default_value_t = 1_000)]
    edit_interval_ms: u64,
    /// The largest file taken from or posted to a room, bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 25 * 1024 * 1024)]
    max_file_bytes: u64,
    /// Rooms the bot stays in without a channel; invites beyond it are declined.
    #[arg(long, value_name = "N", default_value_t = 20)]
    max_unbound_rooms: usize,
    /// Messages taken from one room per minute; more are dropped with a note in the room.
    #[arg(long, value_name = "N", default_value_t = 60)]
    room_messages_per_minute: u32,
    /// How long the homeserver may be unreachable before channels show offline, seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    offline_after_secs: u64,
    /// The flags of every server subcommand; with --database-url the bot's stores stay in
    /// --state-dir.
    #[command(flatten)]
    server: crate::common_args::ServerArgs,
}

fn usage(message: impl std::fmt::Display) -> ExitCode {
    crate::usage("matrix", message)
}

/// The bot's credentials from the environment (never the command line).
fn credentials() -> Result<Credentials, String> {
    /// The variables holding the bot's password and its access token.
    const PASSWORD_ENV: &str = "XAGENT_MATRIX_PASSWORD";
    const ACCESS_TOKEN_ENV: &str = "XAGENT_MATRIX_ACCESS_TOKEN";
    let read = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    match (read(PASSWORD_ENV), read(ACCESS_TOKEN_ENV)) {
        (Some(_), Some(_)) => Err(format!("set {PASSWORD_ENV} or {ACCESS_TOKEN_ENV}, not both")),
        (Some(password), None) => Ok(Credentials::Password(Secret::new(password))),
        (None, Some(token)) => Ok(Credentials::AccessToken(Secret::new(token))),
        (None, None) => Err(format!(
            "the bot needs its password in {PASSWORD_ENV} or an access token in {ACCESS_TOKEN_ENV} (a session kept in --state-dir is used first)"
        )),
    }
}

/// Runs the Connector.
pub fn run_command(args: MatrixArgs) -> ExitCode {
    let (api_key, limits) = match args.server.key_and_limits("matrix") {
        Ok(started) => started,
        Err(message) => return usage(message),
    };
    let credentials = match credentials() {
        Ok(credentials) => credentials,
        Err(message) => return usage(message),
    };
    if !(args.homeserver.starts_with("https://") || args.homeserver.starts_with("http://")) {
        return usage("--homeserver must be an http:// or https:// URL");
    }
    // The SDK warns on every room key it cannot back up (the bot keeps no key backup); its
    // HTTP client logs every failed request as an ERROR, also those the SDK expects (a 404 for
    // account data a new account does not have), and hands each failure to its caller, where
    // the Connector reports what matters; a new device's first key query warns that the
    // device "might have been deleted" before its keys are uploaded.
    args.server.start_logs(
        "info,tower_http=warn,matrix_sdk=warn,matrix_sdk_crypto=warn,matrix_sdk_base=warn,\
         matrix_sdk_crypto::backups=error,matrix_sdk::http_client=off,\
         matrix_sdk_crypto::identities::manager=error",
    );
    crate::common_args::block_on("matrix", async move {
        let (listener, local_url) = match args.server.bind().await {
            Ok(bound) => bound,
            Err(message) => return usage(message),
        };
        let mut options =
            MatrixOptions::new(&args.homeserver, &args.user, credentials, &args.state_dir);
        options.api_key = Some(Secret::new(api_key));
        options.runtime = options.runtime.with_listener(limits);
        options.edit_interval = Duration::from_millis(args.edit_interval_ms);
        options.max_file_bytes = args.max_file_bytes;
        options.max_unbound_rooms = args.max_unbound_rooms;
        options.room_messages_per_minute = args.room_messages_per_minute;
        options.offline_after = Duration::from_secs(args.offline_after_secs);
        options.database_url = args.server.database.database_url.clone();
        let matrix = match Matrix::open(options).await {
            Ok(matrix) => matrix,
            Err(error) => return crate::common_args::failed("matrix", error),
        };
        if let Err(message) = args.server.listener.start_metrics(matrix.server()).await {
            return usage(message);
        }
        println!(
            "im.matrix listening on {local_url} (Base URL for xAgent; bot {} on {})",
            args.user, args.homeserver
        );
        let stop = xagent_server_runtime::ops::stop_signal();
        crate::common_args::served("matrix", matrix.serve(listener, stop).await)
    })
}
