//! `xagent-connector webchat`: runs the reference IM Connector `im.webchat` (see the
//! `xagent-connector-webchat` crate) until Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use xagent_connector_webchat::{Webchat, WebchatOptions};
use xagent_protocol_types::Secret;

use crate::EXIT_USAGE;

/// Options of `webchat`.
#[derive(Debug, Args)]
pub struct WebchatArgs {
    /// Address to listen on (host:port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// The system API key xAgent must present. Prefer the environment variable
    /// XAGENT_CONNECTOR_API_KEY or --api-key-file: a key given as --api-key is visible to every
    /// local user in the process list.
    #[arg(long, env = "XAGENT_CONNECTOR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Read the system API key from this file (first line; keep the file mode 0600). Takes
    /// precedence over XAGENT_CONNECTOR_API_KEY and --api-key.
    #[arg(long, value_name = "PATH")]
    api_key_file: Option<PathBuf>,
    /// Directory for the databases and files (created if missing).
    #[arg(long)]
    state_dir: PathBuf,
    /// The URL visitors reach this Connector at (pairing links start with it); default
    /// http://<listen address>.
    #[arg(long)]
    public_url: Option<String>,
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

/// Logs to stderr; `RUST_LOG` overrides the default level.
pub(crate) fn init_logs(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// The API key from `--api-key-file`, else from the variable or `--api-key`.
fn api_key(args: &WebchatArgs) -> Result<String, String> {
    crate::secrets::api_key(args.api_key_file.as_deref(), args.api_key.as_deref(), "webchat")
}

/// Runs the Connector.
pub fn run_command(args: WebchatArgs) -> ExitCode {
    let api_key = match api_key(&args) {
        Ok(key) => key,
        Err(message) => return crate::usage("webchat", message),
    };
    init_logs("info,tower_http=warn");
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            return crate::usage("webchat", format!("cannot start the async runtime: {error}"));
        }
    };
    runtime.block_on(async move {
        let (listener, local_url) = match bind(&args.listen).await {
            Ok(bound) => bound,
            Err(error) => {
                eprintln!("xagent-connector webchat: cannot listen on {}: {error}", args.listen);
                return ExitCode::from(EXIT_USAGE);
            }
        };
        let public_url = args.public_url.unwrap_or_else(|| local_url.clone());
        let options = WebchatOptions::new(&args.state_dir, public_url.clone())
            .with_api_key(Secret::new(api_key));
        let webchat = match Webchat::open(options).await {
            Ok(webchat) => webchat,
            Err(error) => {
                eprintln!("xagent-connector webchat: {error}");
                return ExitCode::FAILURE;
            }
        };
        println!("im.webchat listening on {local_url} (Base URL for xAgent; chat page at {public_url}/chat/)");
        let stop = xagent_server_runtime::stop_signal();
        match webchat.serve(listener, stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("xagent-connector webchat: {error}");
                ExitCode::FAILURE
            }
        }
    })
}
