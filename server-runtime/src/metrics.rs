//! The runtime's Prometheus metrics, served on a listener of their own
//! ([`crate::ConnectorServer::serve_metrics`]; `--metrics-listen` on the command line) with
//! `/readyz` beside them. Every label has a bounded set of values (packet types, error
//! codes, the Card's Tool ids, channel statuses, outcomes): never a channel id, an address, a
//! message or anything secret, so a visitor cannot grow the series and nothing private leaves.
//! Counters and histograms are process-wide (one registry); the gauges of a server (its
//! connections, channels and outbox) are read from it at each scrape.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use xagent_protocol_types::{ErrorCode, Packet, PacketType};

/// The media type of the metrics listener's `/metrics` answer.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The prefix of every series name.
const PREFIX: &str = "xagent_connector";

/// Author gauges at most (a Connector's own counters, e.g. rooms or devices online).
const MAX_AUTHOR_GAUGES: usize = 64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PacketLabels {
    packet_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CodeLabels {
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ToolLabels {
    tool: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ToolOnly {
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StatusLabels {
    status: String,
}

fn seconds_buckets() -> Histogram {
    // 1 ms to about 33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Every series of the runtime.
pub(crate) struct Metrics {
    registry: Mutex<Registry>,
    packets_in: Family<PacketLabels, Counter>,
    packets_out: Family<PacketLabels, Counter>,
    errors: Family<CodeLabels, Counter>,
    tool_calls: Family<ToolLabels, Counter>,
    tool_seconds: Family<ToolOnly, Histogram, fn() -> Histogram>,
    delivery_seconds: Histogram,
    commit_batch: Histogram,
    commit_seconds: Histogram,
    pub(crate) connections: Gauge,
    pub(crate) outbox_depth: Gauge,
    pub(crate) channels: Family<StatusLabels, Gauge>,
    author: Mutex<Vec<(String, Gauge)>>,
}

/// The process's metrics.
pub(crate) fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// Registers each `name, help => series` (a clone of the series: they share their values).
macro_rules! register {
    ($registry:ident; $($name:literal, $help:literal => $series:expr;)+) => {
        $($registry.register($name, $help, $series.clone());)+
    };
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let m = Self {
            registry: Mutex::new(Registry::default()),
            packets_in: Family::default(),
            packets_out: Family::default(),
            errors: Family::default(),
            tool_calls: Family::default(),
            tool_seconds: Family::new_with_constructor(seconds_buckets),
            delivery_seconds: seconds_buckets(),
            commit_batch: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            commit_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            connections: Gauge::default(),
            outbox_depth: Gauge::default(),
            channels: Family::default(),
            author: Mutex::new(Vec::new()),
        };
        // Name, help, series: each registered under the runtime's prefix.
        register! { registry;
            "data_plane_connections", "Data-plane sockets that completed connector.hello"
                => m.connections;
            "packets_received", "Packets received, by type" => m.packets_in;
            "packets_sent", "Packets sent, by type" => m.packets_out;
            "errors_sent", "Error answers sent (error packets and acks carrying an error), by code"
                => m.errors;
            "tool_calls", "tool.invoke calls answered, by Tool and outcome (ok or the error code)"
                => m.tool_calls;
            "tool_call_seconds", "Time from a tool.invoke to its answer, by Tool" => m.tool_seconds;
            "outbox_depth", "IM messages the outbox holds for xAgent (pending or in flight)"
                => m.outbox_depth;
            "outbox_delivery_seconds", "Time from taking an IM message to its delivery to xAgent"
                => m.delivery_seconds;
            "storage_commit_batch_size",
                "Writers' jobs committed together in one group-commit transaction"
                => m.commit_batch;
            "storage_commit_seconds", "Duration of one group-commit transaction"
                => m.commit_seconds;
            "channels", "Known channels, by status" => m.channels;
        }
        *m.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = registry;
        m
    }

    /// One packet decoded from the peer.
    pub(crate) fn received(&self, packet: &Packet) {
        self.packets_in.get_or_create(&PacketLabels { packet_type: type_label(packet) }).inc();
    }

    /// One packet handed to a socket's writer.
    pub(crate) fn sent(&self, packet: &Packet) {
        self.packets_out.get_or_create(&PacketLabels { packet_type: type_label(packet) }).inc();
        if let Some(error) = &packet.error {
            self.errors.get_or_create(&CodeLabels { code: code_label(&error.code) }).inc();
        }
    }

    /// One answered Tool call; `tool` must be one of the Card's ids (else "unknown").
    pub(crate) fn tool_call(&self, tool: &str, outcome: Result<(), &ErrorCode>, took: Duration) {
        let outcome = match outcome {
            Ok(()) => "ok".to_owned(),
            Err(code) => code_label(code),
        };
        self.tool_calls.get_or_create(&ToolLabels { tool: tool.to_owned(), outcome }).inc();
        self.tool_seconds
            .get_or_create(&ToolOnly { tool: tool.to_owned() })
            .observe(took.as_secs_f64());
    }

    /// One IM message delivered to xAgent, `after_ms` after the outbox took it.
    pub(crate) fn delivered(&self, after_ms: u64) {
        self.delivery_seconds.observe(after_ms as f64 / 1000.0);
    }

    /// One group-commit transaction of `jobs` jobs.
    pub(crate) fn committed(&self, jobs: usize, took: Duration) {
        self.commit_batch.observe(jobs as f64);
        self.commit_seconds.observe(took.as_secs_f64());
    }

    /// The gauge `name` of the Connector's own (registered on first use, at most
    /// [`MAX_AUTHOR_GAUGES`]); `None` for a name that is not `[a-z_]+` or beyond the cap.
    pub(crate) fn author_gauge(&self, name: &str, help: &str) -> Option<Gauge> {
        let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
        if !valid {
            return None;
        }
        let mut author = self.author.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, gauge)) = author.iter().find(|(n, _)| n == name) {
            return Some(gauge.clone());
        }
        if author.len() >= MAX_AUTHOR_GAUGES {
            return None;
        }
        let gauge = Gauge::default();
        self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner).register(
            name.to_owned(),
            help.to_owned(),
            gauge.clone(),
        );
        author.push((name.to_owned(), gauge.clone()));
        Some(gauge)
    }

    /// The text exposition of every series.
    pub(crate) fn encode(&self) -> String {
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
            text.clear();
        }
        text
    }
}

/// The label set of one channel status.
pub(crate) fn status_labels(status: String) -> StatusLabels {
    StatusLabels { status }
}

/// A gauge of the Connector's own ([`crate::ConnectorHandle::gauge`]), e.g. rooms or devices
/// online; cheap to clone, shared by every clone.
#[derive(Clone, Debug)]
pub struct AuthorGauge(Gauge);

impl AuthorGauge {
    /// Sets the value.
    pub fn set(&self, value: i64) {
        self.0.set(value);
    }
    /// Adds one.
    pub fn inc(&self) {
        self.0.inc();
    }
    /// Takes one away.
    pub fn dec(&self) {
        self.0.dec();
    }
    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.get()
    }
}

/// The author gauge `name` (see [`crate::ConnectorHandle::gauge`]).
pub(crate) fn author_gauge(name: &str, help: &str) -> Option<AuthorGauge> {
    metrics().author_gauge(name, help).map(AuthorGauge)
}

fn type_label(packet: &Packet) -> String {
    match packet.packet_type() {
        PacketType::Unknown(_) => "unknown".to_owned(),
        known => known.as_str().to_owned(),
    }
}

fn code_label(code: &ErrorCode) -> String {
    if code.is_known() { code.as_str().to_owned() } else { "other".to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_stay_within_known_values_and_author_names_are_checked() {
        let m = Metrics::new();
        assert_eq!(code_label(&ErrorCode::parse("made_up_by_a_peer")), "other");
        assert_eq!(code_label(&ErrorCode::InvalidPacket), "invalid_packet");
        assert!(m.author_gauge("rooms", "Rooms").is_some());
        assert!(m.author_gauge("Rooms; drop", "bad").is_none());
        m.tool_call("unknown", Err(&ErrorCode::ToolNotFound), Duration::from_millis(3));
        let text = m.encode();
        assert!(
            text.contains(
                "xagent_connector_tool_calls_total{tool=\"unknown\",outcome=\"tool_not_found\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("xagent_connector_rooms"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
