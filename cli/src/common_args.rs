//! The flags several subcommands share, each written once and flattened into their options:
//! [`ServerArgs`] for the server subcommands (`webchat`, `homie`, `matrix`) and [`FlowArgs`]
//! for the sign-in of the xAgent-side ones (`conformance`, `mcp`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use xagent_protocol_types::AuthInput;
use xagent_server_runtime::ops::ServeLimits;

use crate::config_file::{ConfigArgs, LogArgs};
use crate::database_args::DatabaseArgs;
use crate::listen_args::ListenArgs;

/// The common flags of a server subcommand: where it listens, its settings file and log
/// format, the system API key, the listener's limits and the runtime's database.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address to listen on (host:port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub(crate) listen: String,
    /// Settings from a TOML file (--config).
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
    /// The log format (--log-format).
    #[command(flatten)]
    pub(crate) log: LogArgs,
    /// The system API key xAgent must present. Prefer XAGENT_CONNECTOR_API_KEY or
    /// --api-key-file: a key given as --api-key is visible to every local user in `ps`.
    #[arg(long, env = "XAGENT_CONNECTOR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Read the system API key from this file (first line; keep the file mode 0600). Takes
    /// precedence over XAGENT_CONNECTOR_API_KEY and --api-key.
    #[arg(long, value_name = "PATH")]
    api_key_file: Option<PathBuf>,
    /// The listener's connection limits.
    #[command(flatten)]
    pub(crate) listener: ListenArgs,
    /// The runtime's state in PostgreSQL (--database-url).
    #[command(flatten)]
    pub(crate) database: DatabaseArgs,
}

impl ServerArgs {
    /// What every server subcommand reads before it starts: the API key (from `--api-key-file`,
    /// else the variable or `--api-key`) and the listener's limits; the message is a usage
    /// error of `command`.
    pub(crate) fn key_and_limits(&self, command: &str) -> Result<(String, ServeLimits), String> {
        let key = crate::secrets::api_key(
            self.api_key_file.as_deref(),
            self.api_key.as_deref(),
            command,
        )?;
        Ok((key, self.listener.limits()?))
    }

    /// Starts the logs (`default` unless `RUST_LOG` says otherwise) and says which settings
    /// file was read.
    pub(crate) fn start_logs(&self, default: &str) {
        self.log.init(default);
        self.config.announce();
    }

    /// Binds `--listen`: the listener and the URL a local browser reaches it at.
    pub(crate) async fn bind(&self) -> Result<(tokio::net::TcpListener, String), String> {
        bind(&self.listen)
            .await
            .map_err(|error| format!("cannot listen on {}: {error}", self.listen))
    }
}

/// The sign-in of a subcommand that connects to a Connector as xAgent.
#[derive(Debug, Args)]
pub struct FlowArgs {
    /// A sign-in flow id from the Card: the channel is signed in with it (`conformance` then
    /// runs the authenticated checks).
    #[arg(long)]
    pub(crate) flow: Option<String>,
    /// A form input of the flow, as name=value (repeatable).
    #[arg(long = "input", value_name = "NAME=VALUE", requires = "flow")]
    inputs: Vec<String>,
}

impl FlowArgs {
    /// The form inputs given with `--input`.
    pub(crate) fn inputs(&self) -> Result<AuthInput, String> {
        crate::parse_inputs(&self.inputs)
    }
}

/// Runs a server subcommand's async part on a new multi-threaded runtime; a runtime that
/// cannot start is a usage error of `command`.
pub(crate) fn block_on(command: &str, run: impl Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(run),
        Err(error) => crate::usage(command, format!("cannot start the async runtime: {error}")),
    }
}

/// A server subcommand that could not open or serve: says why and exits with 1.
pub(crate) fn failed(command: &str, error: impl std::fmt::Display) -> ExitCode {
    eprintln!("xagent-connector {command}: {error}");
    ExitCode::FAILURE
}

/// How a server subcommand ends once serving stopped.
pub(crate) fn served(command: &str, result: Result<(), impl std::fmt::Display>) -> ExitCode {
    result.map_or_else(|error| failed(command, error), |()| ExitCode::SUCCESS)
}

/// Binds `listen` and returns the listener and the URL a local browser reaches it at.
pub(crate) async fn bind(listen: &str) -> std::io::Result<(tokio::net::TcpListener, String)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let address = listener.local_addr()?;
    let host = if address.ip().is_unspecified() {
        "127.0.0.1".to_owned()
    } else if address.is_ipv6() {
        format!("[{}]", address.ip())
    } else {
        address.ip().to_string()
    };
    Ok((listener, format!("http://{host}:{}", address.port())))
}
