//! The suite itself: control plane, data plane, authenticated checks, Tools, IM v2, files.

mod control;
mod data_plane;
mod exchange;
mod signed_in;

use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use xagent_protocol_types::{
    AckStatus, AuthInput, AuthProgress, AuthStart, AuthStatus, AuthStatusRequest, ChannelClose,
    ChannelOpen, ChannelOpenAck, ChatMessage, ChatMessageAck, ConnectionDescriptor, ConnectorCard,
    ConnectorChannelId, ConnectorHello, ErrorCode, FlowId, Packet, PacketBody, Payload, Ping,
    ProfileId, Secret, ToolInvoke, ToolStatus,
};
use xagent_protocol_validate::AdmissionWindow;

use xagent_client_runtime::{BaseUrl, ClientError, ControlPlane, SkillDocument, TlsTrust};

use crate::probe::{Probe, ProbeOptions, Received, Upgrade};
use crate::{device, ids};

/// The checks that need a signed-in channel (after `auth.flow`), in the order they run.
const SIGNED_IN_CHECKS: [&str; 8] = [
    "descriptor.tool_not_in_card",
    "descriptor.tools_declared",
    "im.message_accepted",
    "im.duplicate",
    "im.conflict",
    "transfer.upload",
    "transfer.download",
    "auth.logout",
];

/// What to run the suite against.
#[derive(Debug, Clone)]
pub struct ConformanceOptions {
    /// The Connector's Base URL.
    pub base_url: BaseUrl,
    /// The system API key, when the Connector requires one.
    pub api_key: Option<Secret>,
    /// An authentication flow to run (enables the authenticated checks).
    pub flow: Option<FlowId>,
    /// The flow's form inputs.
    pub inputs: AuthInput,
    /// How long to wait for each answer.
    pub timeout: Duration,
    /// Card Tools to exercise, with the arguments of a successful call: each gets a success
    /// call, an invalid-arguments call and a repeated call.
    pub tools: Vec<(String, serde_json::Map<String, Value>)>,
    /// How long a QR sign-in may take (the link is shown through `show_link`).
    pub qr_wait: Duration,
    /// Shows a sign-in link (the QR flow's text) to the person running the suite.
    pub show_link: Option<fn(&str)>,
    /// Shows what a pending sign-in asks the person to do (its prompt message: a pairing
    /// code to post, a device to confirm on), each new one once.
    pub show_prompt: Option<fn(&str)>,
    /// The certificate authorities trusted for an `https` Base URL (default: the system's).
    pub tls: TlsTrust,
}

impl ConformanceOptions {
    /// Options with defaults (5 s per answer, no flow).
    pub fn new(base_url: BaseUrl) -> Self {
        Self {
            base_url,
            api_key: None,
            flow: None,
            inputs: AuthInput::default(),
            timeout: Duration::from_secs(5),
            tools: Vec::new(),
            qr_wait: Duration::from_secs(120),
            show_link: None,
            show_prompt: None,
            tls: TlsTrust::system(),
        }
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The Connector behaves as the protocol says.
    Pass,
    /// It does not.
    Fail,
    /// Not applicable or not reachable with the given options.
    Skipped,
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Stable check id (e.g. `ws.subprotocol_required`).
    pub id: String,
    /// Where the rule comes from.
    pub rule: &'static str,
    /// Pass, fail or skipped.
    pub status: Status,
    /// What was observed.
    pub detail: String,
    /// What was sent, on failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent: Option<String>,
    /// What came back, on failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received: Option<String>,
}

/// All results.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConformanceReport {
    /// Checks in the order they ran.
    pub checks: Vec<Check>,
}

impl ConformanceReport {
    /// Number of checks with a status.
    pub fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }

    /// True when nothing failed.
    pub fn passed(&self) -> bool {
        self.count(Status::Fail) == 0
    }

    /// The result of a check by id.
    pub fn check(&self, id: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.id == id)
    }

    /// One line per check, with what was sent and received under failures.
    pub fn to_text(&self, color: bool) -> String {
        let paint = |code: &str, text: &str| {
            if color { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
        };
        let mut out = String::new();
        for check in &self.checks {
            let label = match check.status {
                Status::Pass => paint("32", "pass"),
                Status::Fail => paint("31", "FAIL"),
                Status::Skipped => paint("33", "skip"),
            };
            out.push_str(&format!("{label} {:<40} {} — {}\n", check.id, check.rule, check.detail));
            if check.status == Status::Fail {
                if let Some(sent) = &check.sent {
                    out.push_str(&format!("       sent:     {sent}\n"));
                }
                if let Some(received) = &check.received {
                    out.push_str(&format!("       received: {received}\n"));
                }
            }
        }
        out.push_str(&format!(
            "{} passed, {} failed, {} skipped\n",
            self.count(Status::Pass),
            self.count(Status::Fail),
            self.count(Status::Skipped)
        ));
        out
    }

    /// The report as JSON: `{"passed", "summary", "checks": [...]}`.
    pub fn to_json(&self) -> Value {
        json!({
            "passed": self.passed(),
            "summary": {
                "pass": self.count(Status::Pass),
                "fail": self.count(Status::Fail),
                "skipped": self.count(Status::Skipped),
            },
            "checks": self.checks,
        })
    }

    fn record(&mut self, (id, rule): (impl Into<String>, &'static str), outcome: Outcome) {
        let id = id.into();
        let (status, detail, sent, received) = match outcome {
            Outcome::Pass(detail) => (Status::Pass, detail, None, None),
            Outcome::Skip(detail) => (Status::Skipped, detail, None, None),
            Outcome::Fail { detail, sent, received } => (Status::Fail, detail, sent, received),
        };
        self.checks.push(Check { id, rule, status, detail, sent, received });
    }
}

enum Outcome {
    Pass(String),
    Skip(String),
    Fail { detail: String, sent: Option<String>, received: Option<String> },
}

fn pass(detail: impl Into<String>) -> Outcome {
    Outcome::Pass(detail.into())
}

fn skip(detail: impl Into<String>) -> Outcome {
    Outcome::Skip(detail.into())
}

fn fail(detail: impl Into<String>) -> Outcome {
    Outcome::Fail { detail: detail.into(), sent: None, received: None }
}

fn fail_with(detail: impl Into<String>, sent: Option<&str>, received: &Received) -> Outcome {
    Outcome::Fail {
        detail: detail.into(),
        sent: sent.map(str::to_owned),
        received: Some(describe(received)),
    }
}

/// Pass with `detail` when nothing is wrong, else fail naming every problem.
fn verdict(problems: Vec<String>, detail: impl Into<String>) -> Outcome {
    if problems.is_empty() { pass(detail) } else { fail(problems.join("; ")) }
}

/// Pass when `answer` is an error packet carrying `code`; otherwise fail with what was `sent`
/// and what came back. `texts` are the pass detail and the failure's first words, by default
/// the code itself and "expected <code>".
fn expect_code(
    answer: &Received,
    code: ErrorCode,
    sent: &str,
    texts: Option<[&str; 2]>,
) -> Outcome {
    let [detail, expected] = match texts {
        Some(texts) => texts.map(str::to_owned),
        None => [code.to_string(), format!("expected {code}")],
    };
    if error_code(answer) == Some(code) {
        pass(detail)
    } else {
        fail_with(expected, Some(sent), answer)
    }
}

fn describe(received: &Received) -> String {
    match received {
        Received::Packet(_, text) => text.clone(),
        Received::Invalid(text) => format!("(not a packet) {text}"),
        Received::Closed(Some(code)) => format!("(socket closed with code {code})"),
        Received::Closed(None) => "(socket closed)".into(),
        Received::Silent => "(nothing)".into(),
    }
}

fn pkt() -> String {
    ids::mint("pkt_")
}

fn req() -> String {
    ids::mint("req_")
}

/// The error code a packet answers with: an `error` packet's, or an ack's `error`.
fn error_code(received: &Received) -> Option<ErrorCode> {
    match received {
        Received::Packet(packet, _) => packet.error.as_ref().map(|e| e.code.clone()),
        _ => None,
    }
}

/// State carried between checks.
struct Run {
    options: ConformanceOptions,
    control: ControlPlane,
    card: Option<ConnectorCard>,
    card_json: Option<Value>,
    report: ConformanceReport,
}

/// Runs the whole suite.
pub async fn run(options: ConformanceOptions) -> ConformanceReport {
    let control =
        ControlPlane::new(options.base_url.clone(), options.api_key.clone()).with_tls(&options.tls);
    let mut run =
        Run { options, control, card: None, card_json: None, report: ConformanceReport::default() };
    run.control_plane().await;
    run.data_plane().await;
    run.report
}

impl Run {
    fn wait(&self) -> Duration {
        self.options.timeout
    }

    fn facts(&self) -> xagent_protocol_validate::CardFacts {
        match &self.card_json {
            Some(card) => xagent_protocol_validate::CardFacts::from_value(card),
            None => xagent_protocol_validate::CardFacts::default(),
        }
    }

    fn card_id(&self) -> String {
        self.card.as_ref().map(|c| c.connector_card_id.to_string()).unwrap_or_default()
    }

    /// True when the Card declares the Device Profile (the `device` checks run).
    fn device_applies(&self) -> bool {
        self.card.as_ref().is_some_and(device::applies)
    }

    /// The device checks that need a signed-in channel, reported skipped with `reason`.
    fn skip_device_signed_in(&mut self, rule: &'static str, reason: &str) {
        if self.device_applies() {
            for id in [device::DESCRIPTOR_DECLARES, device::RESULT_NO_BYTES] {
                self.report.record((id, rule), skip(reason.to_owned()));
            }
        }
    }

    fn supported_profiles(&self) -> Vec<ProfileId> {
        self.card.as_ref().map(|c| c.supports.profiles.clone()).unwrap_or_default()
    }
}
