//! `xagent-connector mcp`: puts one Connector in front of an MCP client (see the `xagent-mcp`
//! crate and docs/MCP.md). MCP goes over stdin/stdout by default, or over streamable HTTP at
//! `http://ADDR/mcp` with `--http ADDR` (a loopback address; every request needs the bearer
//! token, generated into the state directory or read from `--http-token-file`). Logs go to
//! stderr only: on stdio, stdout belongs to the protocol; over HTTP, stdout shows a newly
//! generated token once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use xagent_mcp::files::AllowedDirs;
use xagent_mcp::{BridgeConfig, HttpAuth, HttpSetupError, LinkConfig, TokenSource};
use xagent_protocol_types::Secret;

/// Options of `mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// The Connector's Base URL.
    #[arg(long)]
    base_url: String,
    /// Settings from a TOML file (--config).
    #[command(flatten)]
    config: crate::config_file::ConfigArgs,
    /// Certificate authorities for an https Base URL.
    #[command(flatten)]
    tls: crate::tls_args::TlsArgs,
    /// The log format (--log-format).
    #[command(flatten)]
    log: crate::config_file::LogArgs,
    /// The system API key (prefer XAGENT_CONNECTOR_API_KEY: a command line is visible to
    /// other users of the machine).
    #[arg(long, env = "XAGENT_CONNECTOR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The sign-in to run when the channel is not signed in yet (--flow, --input).
    #[command(flatten)]
    sign_in: crate::common_args::FlowArgs,
    /// Directory for the inbox, downloaded files and the remembered channel (created
    /// readable only by you; with a database, only the HTTP token); default: ~/.local/state/xagent-connector/mcp/<host-port>.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// With a database: the runtime's state (the remembered channel, outbox, idempotency),
    /// the inbox and the inbound files' bytes live there under the Card instead of the state
    /// directory, and several bridges of one Card may share it: only the holder of the Card's
    /// holder lease connects, the others wait to take over and then hand out what it accepted.
    #[command(flatten)]
    database: crate::database_args::DatabaseArgs,
    /// Serve MCP over streamable HTTP at http://ADDR/mcp instead of stdio; ADDR must be a
    /// loopback address (127.0.0.1:PORT or [::1]:PORT). Every request needs
    /// `Authorization: Bearer <token>`.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Read the HTTP bearer token from this file (first line, at least 32 characters; mode
    /// 0600 or stricter, else refused). Default: generated into STATE_DIR/mcp-http-token on
    /// the first start and shown once on stdout.
    #[arg(long, value_name = "PATH", requires = "http")]
    http_token_file: Option<PathBuf>,
    /// Requests with a wrong or missing bearer token answered 401 per minute; beyond it
    /// they get 429 (the right token always gets in).
    #[arg(long, value_name = "N", default_value_t = xagent_mcp::http::DEFAULT_AUTH_FAILURES_PER_MINUTE, requires = "http")]
    http_auth_failures_per_minute: u32,
    /// A directory the agent may send files from (repeatable); without one, only files
    /// this server offers as resources can be sent.
    #[arg(long = "allow-dir", value_name = "DIR")]
    allow_dirs: Vec<PathBuf>,
    /// An origin (https://host[:port]) other than the Connector's own that inbound files may
    /// be downloaded from (repeatable); it must resolve to public addresses.
    #[arg(long = "allow-download-origin", value_name = "ORIGIN")]
    download_origins: Vec<String>,
    /// A JSON file of MCP tool annotations by Tool name, over the ones the bridge derives
    /// (e.g. {"webchat_message_send": {"destructiveHint": false}}; keys: title, readOnlyHint,
    /// destructiveHint, idempotentHint, openWorldHint); a Tool the Connector does not have is
    /// an error naming it.
    #[arg(long, value_name = "FILE")]
    tool_annotations: Option<PathBuf>,
}

fn default_state_dir(base_url: &str) -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".local/state"))
            .unwrap_or_else(|| PathBuf::from("."))
    });
    let name: String = base_url
        .split("://")
        .nth(1)
        .unwrap_or(base_url)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' })
        .collect();
    base.join("xagent-connector/mcp").join(name.trim_matches('-'))
}

/// Runs the bridge until the MCP client goes away (stdio), Ctrl-C or SIGTERM.
pub fn run_command(args: McpArgs) -> ExitCode {
    args.log.init("info");
    args.config.announce();
    let inputs = match args.sign_in.inputs() {
        Ok(inputs) => inputs,
        Err(message) => return crate::usage("mcp", message),
    };
    let allowed = match AllowedDirs::new(&args.allow_dirs) {
        Ok(allowed) => allowed,
        Err(error) => return crate::usage("mcp", error),
    };
    let download = match crate::download_policy(&args.download_origins) {
        Ok(policy) => policy,
        Err(error) => return crate::usage("mcp", error),
    };
    let tls = match args.tls.trust() {
        Ok(tls) => tls,
        Err(message) => return crate::usage("mcp", message),
    };
    let tool_annotations = match &args.tool_annotations {
        Some(path) => match xagent_mcp::annotations::AnnotationOverrides::load(path) {
            Ok(overrides) => overrides,
            Err(error) => return crate::usage("mcp", error),
        },
        None => xagent_mcp::annotations::AnnotationOverrides::default(),
    };
    let state_dir = args.state_dir.unwrap_or_else(|| default_state_dir(&args.base_url));
    // Everything about the HTTP transport is checked before connecting to the Connector.
    let http = match args.http {
        None => None,
        Some(addr) => match http_auth(addr, args.http_token_file, &state_dir) {
            Ok(mut auth) => {
                auth.failures_per_minute = args.http_auth_failures_per_minute;
                Some((addr, auth))
            }
            Err(error) => return crate::usage("mcp", error),
        },
    };
    let config = BridgeConfig {
        link: LinkConfig {
            base_url: args.base_url,
            api_key: args.api_key.filter(|k| !k.is_empty()).map(Secret::new),
            flow: args.sign_in.flow,
            inputs,
            allowed,
            health_interval: std::time::Duration::from_secs(30),
            download,
            tls,
            database_url: args.database.database_url,
            tool_annotations,
        },
        state_dir,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            return crate::usage("mcp", format!("cannot start the async runtime: {error}"));
        }
    };
    let code = runtime.block_on(async move {
        let link = match xagent_mcp::connect(config).await {
            Ok(link) => link,
            Err(error) => {
                eprintln!("xagent-connector mcp: {error}");
                return ExitCode::FAILURE;
            }
        };
        let held = std::sync::Arc::clone(&link);
        let served = match http {
            None => tokio::select! {
                served = xagent_mcp::serve_stdio(link) => served,
                () = xagent_server_runtime::ops::stop_signal() => Ok(()),
            },
            Some((addr, auth)) => {
                let shutdown = tokio_util::sync::CancellationToken::new();
                let stop = shutdown.clone();
                tokio::spawn(async move {
                    xagent_server_runtime::ops::stop_signal().await;
                    stop.cancel();
                });
                xagent_mcp::serve_http(link, addr, auth, shutdown, |bound| {
                    eprintln!("MCP over streamable HTTP at http://{bound}/mcp");
                })
                .await
            }
        };
        // A bridge standing by on the same database takes over at once, not after the lease
        // expired.
        held.close().await;
        match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("xagent-connector mcp: {error}");
                ExitCode::FAILURE
            }
        }
    });
    // On a signal, the stdio reader's thread is still blocked reading stdin (nothing can
    // cancel it), and dropping the runtime would wait for it forever: give the runtime's
    // other blocking work (store writes) a moment to finish and leave the reader behind.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    code
}

/// The HTTP transport's checks: a loopback address, and the bearer token (from the file given,
/// else the state directory's, generated and shown once on stdout on the first start).
fn http_auth(
    addr: SocketAddr,
    token_file: Option<PathBuf>,
    state_dir: &std::path::Path,
) -> Result<HttpAuth, HttpSetupError> {
    xagent_mcp::http::check_loopback(addr)?;
    let source = match token_file {
        Some(path) => TokenSource::File(path),
        None => TokenSource::StateDir(state_dir.to_path_buf()),
    };
    let loaded = source.load()?;
    if loaded.generated {
        // Shown once, on stdout (never in the log on stderr): the MCP client's configuration
        // needs it; later starts only name the file.
        println!(
            "MCP HTTP bearer token (generated into {}, shown this once): {}",
            loaded.path.display(),
            loaded.token.expose()
        );
    } else {
        eprintln!("MCP HTTP bearer token: the one in {}", loaded.path.display());
    }
    Ok(HttpAuth::new(loaded.token))
}

/// How long the runtime's blocking work may still run after the bridge stopped.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::default_state_dir;

    #[test]
    fn the_default_state_dir_is_per_connector() {
        let dir = default_state_dir("http://127.0.0.1:8080/im");
        assert!(dir.ends_with("xagent-connector/mcp/127.0.0.1-8080-im"), "{dir:?}");
    }
}
