//! How a running Connector logs: text for a person (colour codes only at a terminal) or one
//! JSON object a line for a log collector. One home for both, used by
//! [`crate::ConnectorServer::serve_from_env`], the `xagent-connector` command and the tests
//! that scan the logs for secrets. Each inbound packet is handled inside a `packet` span
//! carrying its type, `request_id` and `connector_channel_id`, so JSON lines name them.

use std::io::IsTerminal;
use std::str::FromStr;

use tracing_subscriber::Layer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// The environment variable [`crate::ConnectorServer::serve_from_env`] reads the format from.
pub const ENV_LOG_FORMAT: &str = "XAGENT_CONNECTOR_LOG_FORMAT";

/// The shape of log lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target`, the event's fields
    /// (`message` among them) and `span`, the packet being handled, when there is one.
    Json,
}

impl LogFormat {
    /// The format's name, as `--log-format` and [`ENV_LOG_FORMAT`] take it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
        }
    }
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        [Self::Text, Self::Json]
            .into_iter()
            .find(|format| format.as_str() == text)
            .ok_or_else(|| format!("the log format is text or json, not {text:?}"))
    }
}

/// The filter [`crate::ConnectorServer::serve_from_env`] logs at when `RUST_LOG` is not set.
pub const DEFAULT_LOG_FILTER: &str = "info";

/// The log filter of every binary: `RUST_LOG` when set, else `default`, with the database
/// driver held at `info` whatever is asked (tokio-postgres logs statement parameters, which
/// hold bindings' private material, at `debug`).
pub fn log_filter(default: &str) -> tracing_subscriber::EnvFilter {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    match "tokio_postgres=info".parse() {
        Ok(cap) => filter.add_directive(cap),
        Err(_) => filter,
    }
}

/// A formatting layer writing `format` to `writer`; `ansi` only applies to text.
pub fn log_layer<S, W>(format: LogFormat, writer: W, ansi: bool) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    match format {
        LogFormat::Text => {
            tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(ansi).boxed()
        }
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(writer)
            .boxed(),
    }
}

/// The runtime's logger: [`log_filter`] of `default_filter`, then a [`log_layer`] writing
/// `format` to `writer`. [`init_logging`] installs it on stderr; a benchmark, on a sink.
pub fn logger<W>(
    default_filter: &str,
    format: LogFormat,
    writer: W,
    ansi: bool,
) -> impl tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::registry()
        .with(log_filter(default_filter))
        .with(log_layer(format, writer, ansi))
}

/// Installs the process's logger on stderr, filtered by `RUST_LOG` (else `default_filter`,
/// see [`log_filter`]), in `format`. Does nothing when a logger is installed already.
pub fn init_logging(default_filter: &str, format: LogFormat) {
    let ansi = format == LogFormat::Text && std::io::stderr().is_terminal();
    let _ = logger(default_filter, format, std::io::stderr, ansi).try_init();
}

/// The span one inbound packet is handled in.
pub(crate) fn packet_span(packet: &xagent_protocol_types::Packet) -> tracing::Span {
    // Every field is given at creation (an absent one is simply left out): each later
    // `record` would make the formatting layer format the span's fields again.
    tracing::info_span!(
        "packet",
        packet_type = %packet.packet_type(),
        request_id = packet.request_id.as_ref().map(|id| id.as_str()),
        connector_channel_id = packet.connector_channel_id.as_ref().map(|channel| channel.as_str()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_driver_never_logs_below_info() {
        let filter = log_filter("debug").to_string();
        assert!(filter.contains("tokio_postgres=info"), "{filter}");
    }

    #[test]
    fn the_format_is_text_or_json() {
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert!("yaml".parse::<LogFormat>().unwrap_err().contains("text or json"));
        for format in [LogFormat::Text, LogFormat::Json] {
            assert_eq!(format.as_str().parse::<LogFormat>(), Ok(format));
        }
    }
}
