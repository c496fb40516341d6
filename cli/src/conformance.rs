//! `xagent-connector conformance`: the black-box protocol 3.0 suite against any Connector
//! Server. Exit status 0 only when no check failed; 2 for usage errors.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use xagent_client_runtime::BaseUrl;
use xagent_conformance::{ConformanceOptions, run};
use xagent_protocol_types::Secret;

/// Options of `conformance`.
#[derive(Debug, Args)]
pub struct ConformanceArgs {
    /// The Connector's Base URL (http or https, optional path prefix).
    #[arg(long)]
    base_url: String,
    /// The system API key (also read from XAGENT_CONNECTOR_API_KEY).
    #[arg(long, env = "XAGENT_CONNECTOR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The sign-in (--flow, --input).
    #[command(flatten)]
    sign_in: crate::common_args::FlowArgs,
    /// Seconds to wait for each answer.
    #[arg(long, default_value_t = 5)]
    timeout: u64,
    /// A Card Tool to exercise (repeatable; pairs with --args): a successful call, a call with
    /// invalid arguments and a repeated call.
    #[arg(long = "tool", value_name = "TOOL_ID", requires = "flow")]
    tools: Vec<String>,
    /// The JSON arguments of a successful call of the matching --tool (default `{}`).
    #[arg(long = "args", value_name = "JSON")]
    tool_args: Vec<String>,
    /// Seconds a QR sign-in may take (the link is printed to scan or open).
    #[arg(long, default_value_t = 120)]
    qr_wait: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Certificate authorities for an https Base URL.
    #[command(flatten)]
    tls: crate::tls_args::TlsArgs,
}

/// Report format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// One line per check.
    Text,
    /// One JSON object.
    Json,
}

/// Runs the suite.
pub fn run_command(args: ConformanceArgs) -> ExitCode {
    let base = match BaseUrl::parse(&args.base_url) {
        Ok(base) => base,
        Err(error) => return crate::usage("conformance", error),
    };
    let inputs = match args.sign_in.inputs() {
        Ok(inputs) => inputs,
        Err(message) => return crate::usage("conformance", message),
    };
    let tools = match crate::tool_calls(&args.tools, &args.tool_args) {
        Ok(tools) => tools,
        Err(message) => return crate::usage("conformance", message),
    };
    let mut options = ConformanceOptions::new(base);
    options.tls = match args.tls.trust() {
        Ok(tls) => tls,
        Err(message) => return crate::usage("conformance", message),
    };
    options.tools = tools;
    options.qr_wait = Duration::from_secs(args.qr_wait.max(1));
    options.show_link = Some(|link| eprintln!("sign in: open or scan {link}"));
    options.show_prompt = Some(|message| eprintln!("sign in: {message}"));
    options.api_key = args.api_key.filter(|k| !k.is_empty()).map(Secret::new);
    options.flow = args.sign_in.flow.map(Into::into);
    options.inputs = inputs;
    options.timeout = Duration::from_secs(args.timeout.max(1));
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            return crate::usage("conformance", format!("cannot start the async runtime: {error}"));
        }
    };
    let report = runtime.block_on(run(options));
    match args.format {
        Format::Json => println!("{}", report.to_json()),
        Format::Text => print!("{}", report.to_text(std::io::stdout().is_terminal())),
    }
    if report.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
