//! `xagent-connector`: the command-line tool of the xAgent Connector toolkit.
//!
//! The binary is a thin `main` over [`run`], which takes the command line; a program may embed
//! the whole tool the same way:
//!
//! ```no_run
//! let status = xagent_cli::run(["xagent-connector", "check", "card", "connector-card.json"]);
//! # let _ = status;
//! ```
//!
//! im.matrix is the `matrix` cargo feature (off by default: it compiles matrix-sdk and its
//! crypto stack); a build without it answers `xagent-connector matrix` with the command that
//! installs it.
//!
//! One subcommand per module; `check` validates Cards, Descriptors, packets and Skills with
//! the rules of `xagent-protocol-validate`. Exit status: 0 when no `error` violation was found,
//! 1 when one was (including input that is not JSON or not a JSON object), 2 for usage and I/O
//! errors.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod backup;
mod check;
mod common_args;
mod config_file;
mod conformance;
mod database_args;
mod demo;
mod homie;
mod listen_args;
#[cfg(feature = "matrix")]
mod matrix;
mod mcp;
mod migrate_state;
mod mock_xagent;
mod secrets;
mod tls_args;
mod webchat;

/// Command-line tool of the xAgent Connector Protocol 3.0 toolkit.
#[derive(Debug, Parser)]
#[command(name = "xagent-connector", version, about, propagate_version = true)]
struct Cli {
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a Card, Descriptor, packet or Skill against every protocol rule.
    Check(check::CheckArgs),
    /// Run the protocol 3.0 conformance suite against a running Connector Server.
    Conformance(conformance::ConformanceArgs),
    /// Connect to a Connector as xAgent would and print every packet.
    MockXagent(mock_xagent::MockXagentArgs),
    /// Run the reference IM Connector im.webchat (chat page + protocol 3.0 server).
    Webchat(webchat::WebchatArgs),
    /// Run the reference Device Connector device.homie (Homie v4 devices on an MQTT broker).
    Homie(homie::HomieArgs),
    /// Run the IM Connector im.matrix: an agent in Matrix rooms (end-to-end encrypted too).
    #[cfg(feature = "matrix")]
    Matrix(matrix::MatrixArgs),
    /// im.matrix is not in this build (the `matrix` feature); says how to get it.
    #[cfg(not(feature = "matrix"))]
    #[command(hide = true, disable_help_flag = true)]
    Matrix(NotBuilt),
    /// Run im.webchat with an xAgent stand-in in one process and print the URL to open.
    Demo(demo::DemoArgs),
    /// Put a Connector in front of an MCP client (stdio, or streamable HTTP with --http).
    Mcp(mcp::McpArgs),
    /// Move a SQLite state directory into an empty PostgreSQL database (--database-url).
    MigrateState(migrate_state::MigrateStateArgs),
    /// Back up a state directory into one archive, safely while its Connector runs.
    Backup(backup::BackupArgs),
}

/// Any arguments of a subcommand left out of this build.
#[cfg(not(feature = "matrix"))]
#[derive(Debug, clap::Args)]
struct NotBuilt {
    /// Ignored.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    _args: Vec<std::ffi::OsString>,
}

/// What `xagent-connector matrix` says in a build without the `matrix` feature.
#[cfg(not(feature = "matrix"))]
pub(crate) const MATRIX_NOT_BUILT: &str = "im.matrix is not in this build: it is the `matrix` \
     feature (it compiles matrix-sdk, which takes a while). From the repository: \
     cargo install --locked --path cli --features matrix (or cargo run -p xagent-cli --features matrix -- matrix ...)";

/// How to run this tool again the way it was started, for commands it prints: through cargo
/// when `cargo run` started it in a checkout (where `xagent-connector` is not on the PATH),
/// else by its name.
pub(crate) fn self_command() -> &'static str {
    // `cargo run` gives the program its package's name; an installed binary has none.
    if std::env::var_os("CARGO_PKG_NAME").is_some_and(|name| name == env!("CARGO_PKG_NAME")) {
        "cargo run -q -p xagent-cli --"
    } else {
        "xagent-connector"
    }
}

/// Exit status for usage and I/O errors.
pub(crate) const EXIT_USAGE: u8 = 2;

/// Reports a usage error of `command` (a bad flag, an unusable input) on stderr and returns
/// [`EXIT_USAGE`].
pub(crate) fn usage(command: &str, message: impl std::fmt::Display) -> ExitCode {
    eprintln!("xagent-connector {command}: {message}");
    ExitCode::from(EXIT_USAGE)
}

/// The download policy of the binaries that build a client config (`mcp`, `mock-xagent`):
/// the default (the Connector's own origin only) plus every `--allow-download-origin`.
pub(crate) fn download_policy(
    origins: &[String],
) -> Result<xagent_client_runtime::DownloadPolicy, xagent_client_runtime::download::OriginError> {
    origins.iter().try_fold(xagent_client_runtime::DownloadPolicy::default(), |policy, origin| {
        policy.allow_origin(origin)
    })
}

/// Reads repeated `--input NAME=VALUE` flags into authentication form values.
pub(crate) fn parse_inputs(pairs: &[String]) -> Result<xagent_protocol_types::AuthInput, String> {
    pairs.iter().try_fold(xagent_protocol_types::AuthInput::default(), |inputs, pair| {
        match pair.split_once('=') {
            Some((name, value)) if !name.is_empty() => Ok(inputs.with(name, value)),
            _ => Err(format!("--input wants NAME=VALUE, got {pair:?}")),
        }
    })
}

/// One `--tool` with its `--args`.
pub(crate) type ToolCall = (String, serde_json::Map<String, serde_json::Value>);

/// Pairs each --tool with its --args (missing ones are `{}`), as JSON objects.
pub(crate) fn tool_calls(tools: &[String], args: &[String]) -> Result<Vec<ToolCall>, String> {
    if args.len() > tools.len() {
        return Err("each --args needs a --tool before it".into());
    }
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let text = args.get(i).map(String::as_str).unwrap_or("{}");
            match serde_json::from_str::<serde_json::Value>(text) {
                Ok(serde_json::Value::Object(map)) => Ok((tool.clone(), map)),
                Ok(_) => Err(format!("--args of {tool} must be a JSON object")),
                Err(error) => Err(format!("--args of {tool} is not JSON: {error}")),
            }
        })
        .collect()
}

/// Runs `xagent-connector` with `args` (the program's name first, as `std::env::args_os`
/// gives them) and returns its exit status.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString>,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    database_args::warn_if_password_on_command_line(&args);
    let args = match config_file::expand(args, &Cli::command()) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("xagent-connector: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let cli = Cli::parse_from(args);
    match cli.command {
        Command::Check(args) => check::run(args),
        Command::Conformance(args) => conformance::run_command(args),
        Command::MockXagent(args) => mock_xagent::run_command(args),
        Command::Webchat(args) => webchat::run_command(args),
        Command::Homie(args) => homie::run_command(args),
        #[cfg(feature = "matrix")]
        Command::Matrix(args) => matrix::run_command(args),
        #[cfg(not(feature = "matrix"))]
        Command::Matrix(_) => usage("matrix", MATRIX_NOT_BUILT),
        Command::Demo(args) => demo::run_command(args),
        Command::Mcp(args) => mcp::run_command(args),
        Command::MigrateState(args) => migrate_state::run_command(args),
        Command::Backup(args) => backup::run_command(args),
    }
}
