//! The suite itself: control plane, data plane, authenticated checks, Tools, IM v2, files.

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

    async fn control_plane(&mut self) {
        // Card.
        let card_json = self.control.card_json().await;
        let outcome = match &card_json {
            Ok(value) if value.is_object() => pass("200 with a JSON object, no API key sent"),
            Ok(other) => fail(format!("not a JSON object: {other}")),
            Err(e) => fail(e.to_string()),
        };
        self.report.record(
            ("control.card.public", "§4.1 GET /connector-card.json is public and a JSON object"),
            outcome,
        );
        if let Ok(value) = card_json
            && value.is_object()
        {
            self.card_document(value);
        }

        // Skill.
        let outcome = match (self.control.skill().await, &self.card) {
            (Ok(SkillDocument::Absent), _) => skip("no primary Skill (204/404)"),
            (Ok(SkillDocument::Present(markdown)), Some(card)) => {
                let expected = card.primary_skill_name();
                match xagent_client_runtime::admission::skill_name(&markdown) {
                    Some(name) if name == expected => pass(format!("name {name}")),
                    Some(name) => fail(format!("name {name}, expected {expected}")),
                    None => fail("no `name:` in the front matter"),
                }
            }
            (Ok(SkillDocument::Present(_)), None) => skip("no valid Card to compare with"),
            (Err(e), _) => fail(e.to_string()),
        };
        self.report.record(("skill.name_card", "§4.2 Skill name is connector-<card id>"), outcome);

        // API key on /health.
        let outcome = if self.options.api_key.is_some() {
            let anonymous =
                ControlPlane::new(self.options.base_url.clone(), None).with_tls(&self.options.tls);
            let wrong = ControlPlane::new(
                self.options.base_url.clone(),
                Some(Secret::new("xagent-conformance-wrong-key")),
            )
            .with_tls(&self.options.tls);
            let none = anonymous.health().await;
            let bad = wrong.health().await;
            let refused =
                |r: &Result<_, ClientError>| matches!(r, Err(ClientError::Unauthorized { .. }));
            if refused(&none) && refused(&bad) {
                pass("401/403 without a key and with a wrong key")
            } else {
                fail(format!(
                    "without key: {}, wrong key: {}",
                    none.as_ref().map(|_| "2xx".to_owned()).unwrap_or_else(|e| e.to_string()),
                    bad.as_ref().map(|_| "2xx".to_owned()).unwrap_or_else(|e| e.to_string())
                ))
            }
        } else {
            skip("no --api-key given")
        };
        self.report.record(
            (
                "control.health.api_key_enforced",
                "§3 /health requires the system API key when configured",
            ),
            outcome,
        );

        // Health matches the Card.
        let outcome = match (self.control.health().await, &self.card) {
            (Ok(health), Some(card)) => {
                let mut problems = Vec::new();
                if let Some(id) = &health.connector_card_id
                    && id != &card.connector_card_id
                {
                    problems
                        .push(format!("connector_card_id {id} != Card {}", card.connector_card_id));
                }
                if health.protocol_version != card.protocol_version {
                    problems.push(format!(
                        "protocol_version {} != Card {}",
                        health.protocol_version, card.protocol_version
                    ));
                }
                if health.build != card.build {
                    problems.push("build differs from the Card's".into());
                }
                if let Some(version) = &health.connector_card_version
                    && version != &card.connector.version
                {
                    problems.push(format!(
                        "connector_card_version {version} != Card {}",
                        card.connector.version
                    ));
                }
                verdict(problems, "card id, versions and build match")
            }
            (Ok(_), None) => skip("no valid Card"),
            (Err(e), _) => fail(e.to_string()),
        };
        self.report
            .record(("control.health.matches_card", "§4.3 /health matches the Card"), outcome);
    }

    /// The checks of a Card document that is a JSON object: valid, in the admission window,
    /// and (for a device Card) declaring the device target type.
    fn card_document(&mut self, value: Value) {
        let report = xagent_protocol_validate::validate_card(&value);
        let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
        let warnings = format!("{} warning(s)", report.warnings().count());
        self.report.record(
            ("control.card.valid", "§4.1 Card schema and hard validation"),
            verdict(errors, warnings),
        );
        let outcome = match serde_json::from_value::<ConnectorCard>(value.clone()) {
            Ok(card) => {
                let outcome = match AdmissionWindow::default().admit(Some(&card.protocol_version)) {
                    Ok(_) => pass(format!("protocol_version {}", card.protocol_version)),
                    Err(e) => fail(e.to_string()),
                };
                self.card = Some(card);
                outcome
            }
            Err(e) => fail(format!("the Card does not parse: {e}")),
        };
        self.report.record(("card.protocol_version", "§12 admission window [3.0, 3.0]"), outcome);
        if let Some(card) = self.card.as_ref().filter(|card| device::applies(card)) {
            let outcome = match device::card_declares(card) {
                Ok(detail) => pass(detail),
                Err(detail) => fail(detail),
            };
            self.report.record((device::CARD_DECLARES, device::CARD_RULE), outcome);
        }
        self.card_json = Some(value);
    }

    /// Sends `text` and returns the next thing that comes back (or the silence).
    async fn answer(&self, probe: &mut Probe, text: &str) -> Received {
        let _ = probe.send_text(text.to_owned()).await;
        probe.next(self.wait()).await
    }

    /// Sends `text` and records `check`: passed when the Connector refuses it with an error
    /// packet carrying `code` (see [`expect_code`] for `texts`).
    async fn refused(
        &mut self,
        probe: &mut Probe,
        check: (&'static str, &'static str),
        text: &str,
        code: ErrorCode,
        texts: Option<[&str; 2]>,
    ) {
        let answer = self.answer(probe, text).await;
        self.report.record(check, expect_code(&answer, code, text, texts));
    }

    /// Why an upgrade was refused with 401/403, naming a missing `--api-key` as the cause.
    fn key_refused(&self, status: u16) -> String {
        match &self.options.api_key {
            None => format!(
                "the upgrade was refused with {status}: no --api-key was given and this Connector requires one; run again with --api-key"
            ),
            Some(_) => format!(
                "the upgrade was refused with {status}: the Connector did not accept the --api-key given"
            ),
        }
    }

    fn options(&self, subprotocol: bool, key: bool) -> ProbeOptions {
        ProbeOptions {
            subprotocol,
            api_key: if key { self.options.api_key.clone() } else { None },
            tls: self.options.tls.clone(),
        }
    }

    async fn open_probe(&self) -> Option<Probe> {
        match Probe::connect(&self.options.base_url, &self.options(true, true)).await {
            Upgrade::Open(probe, _) => Some(*probe),
            _ => None,
        }
    }

    fn hello_text(&self, mutate: impl FnOnce(&mut Value)) -> String {
        let hello = ConnectorHello::new(self.card_id(), self.supported_profiles());
        let mut packet =
            Packet::with_payload(pkt(), hello).request_id(req()).to_value().unwrap_or_default();
        mutate(&mut packet);
        packet.to_string()
    }

    async fn data_plane(&mut self) {
        // API key on /ws.
        let outcome = if self.options.api_key.is_some() {
            match Probe::connect(&self.options.base_url, &self.options(true, false)).await {
                Upgrade::Refused(status) if status == 401 || status == 403 => {
                    pass(format!("upgrade refused with {status}"))
                }
                Upgrade::Refused(status) => {
                    fail(format!("upgrade refused with {status}, expected 401"))
                }
                Upgrade::Open(probe, _) => {
                    probe.close().await;
                    fail("the upgrade succeeded without the API key")
                }
                Upgrade::Failed(e) => fail(e),
            }
        } else {
            skip("no --api-key given")
        };
        self.report.record(
            ("ws.api_key_enforced", "§3/§6 /ws requires the system API key when configured"),
            outcome,
        );
        // Subprotocol. A 401/403 says nothing about the subprotocol: the key decided first.
        let outcome = match Probe::connect(&self.options.base_url, &self.options(false, true)).await
        {
            Upgrade::Refused(status @ (401 | 403)) => skip(self.key_refused(status)),
            Upgrade::Refused(status) => {
                pass(format!("upgrade without the subprotocol refused with {status}"))
            }
            Upgrade::Open(probe, _) => {
                probe.close().await;
                fail("the upgrade succeeded without offering the subprotocol")
            }
            Upgrade::Failed(e) => fail(e),
        };
        self.report.record(
            ("ws.subprotocol_required", "§6 the upgrade must offer xagent.connector.packet.v1"),
            outcome,
        );
        let (probe, outcome) =
            match Probe::connect(&self.options.base_url, &self.options(true, true)).await {
                Upgrade::Open(probe, Some(echoed))
                    if echoed == xagent_protocol_types::SUBPROTOCOL =>
                {
                    (Some(probe), pass("subprotocol echoed"))
                }
                Upgrade::Open(probe, echoed) => (Some(probe), fail(format!("echoed {echoed:?}"))),
                Upgrade::Refused(status @ (401 | 403)) => (None, fail(self.key_refused(status))),
                Upgrade::Refused(status) => (None, fail(format!("upgrade refused with {status}"))),
                Upgrade::Failed(e) => (None, fail(e)),
            };
        self.report
            .record(("ws.subprotocol_echoed", "§6 the server selects the subprotocol"), outcome);
        let Some(mut probe) = probe else { return };

        // Before hello.
        let early_channel = Packet::with_payload(pkt(), ChannelOpen::default())
            .request_id(req())
            .to_json()
            .unwrap_or_default();
        let check = ("ws.hello_required_first", "§6 the first packet must be connector.hello");
        self.refused(
            &mut probe,
            check,
            &early_channel,
            ErrorCode::HelloRequired,
            Some([
                "channel.open before hello got hello_required",
                "expected an error packet with hello_required",
            ]),
        )
        .await;

        // Invalid JSON keeps the connection.
        let check = ("ws.invalid_json", "§7/§8.23 invalid JSON gets invalid_packet");
        self.refused(
            &mut probe,
            check,
            "{not json",
            ErrorCode::InvalidPacket,
            Some([
                "invalid_packet, socket kept open",
                "expected an error packet with invalid_packet",
            ]),
        )
        .await;
        let _ = probe.send_binary(vec![1, 2, 3]).await;
        let answer = probe.next(self.wait()).await;
        let texts =
            ["binary frame got invalid_packet", "expected invalid_packet for a binary frame"];
        let outcome = expect_code(&answer, ErrorCode::InvalidPacket, "(binary frame)", Some(texts));
        self.report.record(("ws.binary_frame", "§6 text frames only"), outcome);

        // Hello validation.
        let wrong_card = self
            .hello_text(|p| p["payload"]["connector_card_id"] = json!("conformance.not-this-card"));
        let check = ("hello.card_id", "§8.1 connector_card_id must match the Card");
        self.refused(&mut probe, check, &wrong_card, ErrorCode::ConnectorCardIdMismatch, None)
            .await;
        // The server may close after a bad hello; use fresh sockets from here.
        probe.close().await;

        if let Some(mut probe) = self.open_probe().await {
            let text = self.hello_text(|p| {
                if let Some(payload) = p["payload"].as_object_mut() {
                    payload.remove("supported_profiles");
                }
            });
            let check = (
                "hello.supported_profiles",
                "§8.1 a current Connector requires supported_profiles",
            );
            self.refused(&mut probe, check, &text, ErrorCode::InvalidPacket, None).await;
            probe.close().await;
        }

        for (id, version) in
            [("ws.hello.version_missing", None), ("hello.protocol_version", Some("2.0"))]
        {
            let Some(mut probe) = self.open_probe().await else { continue };
            let text = self.hello_text(|p| match version {
                Some(v) => p["payload"]["protocol_version"] = json!(v),
                None => {
                    if let Some(payload) = p["payload"].as_object_mut() {
                        payload.remove("protocol_version");
                    }
                }
            });
            let answer = self.answer(&mut probe, &text).await;
            let code = error_code(&answer);
            let closed = matches!(probe.next(self.wait()).await, Received::Closed(_));
            let outcome = match code {
                Some(ErrorCode::ProtocolVersionUnsupported) if closed => {
                    pass("protocol_version_unsupported, then the socket closed")
                }
                Some(code) if closed => pass(format!("rejected with {code} and closed")),
                _ => fail_with(
                    "expected an error (protocol_version_unsupported) and a close",
                    Some(&text),
                    &answer,
                ),
            };
            self.report
                .record((id, "§8.1/§12 reject a hello without a version or below 3.0"), outcome);
        }

        // A good hello.
        const HELLO_ACK: (&str, &str) =
            ("ws.hello.ack_valid", "§8.2 hello.ack: card id, connector_id, protocol 3.0");
        let Some(mut probe) = self.open_probe().await else { return };
        let hello = self.hello_text(|_| {});
        let answer = self.answer(&mut probe, &hello).await;
        let packet = match &answer {
            Received::Packet(packet, _) if packet.error.is_none() => packet,
            _ => {
                self.report.record(HELLO_ACK, fail_with("no hello.ack", Some(&hello), &answer));
                return;
            }
        };
        let facts = self.facts();
        let mut context = xagent_protocol_validate::PacketContext::with_card(&facts);
        context.sender = Some(xagent_protocol_types::Side::Connector);
        let report = xagent_protocol_validate::validate_packet(
            &packet.to_value().unwrap_or_default(),
            context,
        );
        let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
        let outcome = match packet.payload::<xagent_protocol_types::ConnectorHelloAck>() {
            Some(ack)
                if errors.is_empty()
                    && ack.connector_card_id.as_str() == self.card_id()
                    && ack.protocol_version.as_deref() == Some("3.0") =>
            {
                pass(format!("connector_id {}", ack.connector_id))
            }
            _ => {
                fail_with(format!("invalid hello.ack {}", errors.join("; ")), Some(&hello), &answer)
            }
        };
        self.report.record(HELLO_ACK, outcome);

        // After hello: invalid JSON, unknown types, ping.
        let check = (
            "ws.invalid_packet_after_hello",
            "§7 invalid JSON gets invalid_packet; the connection stays",
        );
        self.refused(&mut probe, check, "[1,2", ErrorCode::InvalidPacket, None).await;
        let unknown = json!({"schema": "xagent.connector.packet/v1", "packet_id": pkt(), "request_id": req(), "type": "conformance.unknown"}).to_string();
        let check = ("packet.type_unknown", "§8.23 unknown packet types get unsupported_packet");
        self.refused(&mut probe, check, &unknown, ErrorCode::UnsupportedPacket, None).await;
        let ping_request = req();
        let ping = Packet::with_payload(pkt(), Ping::default())
            .request_id(ping_request.clone())
            .to_json()
            .unwrap_or_default();
        let answer = self.answer(&mut probe, &ping).await;
        let outcome = match &answer {
            Received::Packet(packet, _)
                if packet.type_str() == "pong"
                    && packet.request_id.as_ref().map(|r| r.as_str())
                        == Some(ping_request.as_str()) =>
            {
                pass("pong")
            }
            _ => fail_with("expected pong with the same request_id", Some(&ping), &answer),
        };
        self.report
            .record(("ws.ping_pong", "§8.22 ping gets pong with the same request_id"), outcome);

        // Channel-scoped packets without a channel or on an unopened channel.
        let no_channel =
            Packet::with_payload(pkt(), xagent_protocol_types::DescriptorGet::default())
                .request_id(req())
                .to_json()
                .unwrap_or_default();
        let check =
            ("packet.channel_required", "§8.23 user-level packets need connector_channel_id");
        self.refused(&mut probe, check, &no_channel, ErrorCode::ConnectorChannelIdRequired, None)
            .await;
        let unopened = Packet::with_payload(pkt(), AuthStart::new("any"))
            .request_id(req())
            .channel("cch_conformance_never_opened")
            .to_json()
            .unwrap_or_default();
        let check =
            ("ws.channel_not_open", "§8.7/§8.23 channel-scoped packets need an open channel");
        self.refused(&mut probe, check, &unopened, ErrorCode::ChannelNotOpen, None).await;

        // channel.open.
        let (open, answer) = self
            .request(
                &mut probe,
                Packet::with_payload(pkt(), ChannelOpen::default()).request_id(req()),
            )
            .await;
        let (channel, outcome) = match &answer {
            Received::Packet(packet, _) => {
                match (packet.payload::<ChannelOpenAck>(), &packet.connector_channel_id) {
                    (Some(ack), Some(envelope_channel))
                        if &ack.connector_channel_id == envelope_channel =>
                    {
                        let problems =
                            self.descriptor_problems(&ack.connection_descriptor, envelope_channel);
                        let outcome = if problems.is_empty() {
                            pass(format!(
                                "channel {envelope_channel}, status {}",
                                ack.connection_descriptor.connection.status
                            ))
                        } else {
                            fail_with(problems.join("; "), Some(&open), &answer)
                        };
                        (Some(envelope_channel.clone()), outcome)
                    }
                    _ => (
                        None,
                        fail_with(
                            "expected channel.open.ack with the channel in envelope and payload",
                            Some(&open),
                            &answer,
                        ),
                    ),
                }
            }
            _ => (None, fail_with("no channel.open.ack", Some(&open), &answer)),
        };
        self.report.record(
            (
                "ws.channel_open",
                "§8.4 channel.open.ack: channel id in envelope and payload, valid Descriptor",
            ),
            outcome,
        );
        let Some(channel) = channel else { return };

        // tool.invoke before authentication.
        let outcome =
            match self.card.as_ref().and_then(|c| c.tools.first()).map(|t| t.tool_id.clone()) {
                Some(tool_id) => {
                    let mut arguments = serde_json::Map::new();
                    arguments.insert("connector_channel_id".into(), json!(channel.as_str()));
                    let invoke = Packet::with_payload(pkt(), ToolInvoke::new(tool_id, arguments))
                        .request_id(req())
                        .channel(channel.clone());
                    let (invoke, answer) = self.request(&mut probe, invoke).await;
                    match error_code(&answer) {
                        Some(code) => pass(format!("refused with {code}")),
                        None => fail_with(
                            "the Tool ran on a channel that never authenticated",
                            Some(&invoke),
                            &answer,
                        ),
                    }
                }
                None => skip("the Card declares no Tools"),
            };
        self.report.record(
            (
                "ws.tool_invoke_unauthenticated",
                "§3/§8.18 a Tool on an unauthenticated channel is refused",
            ),
            outcome,
        );

        if self.options.flow.is_some() {
            self.authenticated(&mut probe, &channel).await;
        } else {
            let reason = "give --flow and --input to run the authenticated checks";
            for id in std::iter::once("auth.flow").chain(SIGNED_IN_CHECKS) {
                self.report.record((id, "needs --flow"), skip(reason));
            }
            self.skip_device_signed_in("needs --flow", reason);
        }

        let close =
            Packet::with_payload(pkt(), ChannelClose::default()).request_id(req()).channel(channel);
        let (close, answer) = self.request(&mut probe, close).await;
        let outcome = match &answer {
            Received::Packet(packet, _)
                if packet.type_str() == "channel.close.ack" && packet.error.is_none() =>
            {
                pass("ok")
            }
            _ => fail_with("expected channel.close.ack", Some(&close), &answer),
        };
        self.report
            .record(("ws.channel_close", "§8.5 channel.close gets channel.close.ack"), outcome);
        probe.close().await;
    }

    fn descriptor_problems(
        &self,
        descriptor: &ConnectionDescriptor,
        channel: &ConnectorChannelId,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        let value = serde_json::to_value(descriptor).unwrap_or_default();
        let facts = self.facts();
        let mut context = xagent_protocol_validate::DescriptorContext::with_card(&facts);
        context.channel = Some(channel.as_str());
        let report = xagent_protocol_validate::validate_descriptor(&value, context);
        problems.extend(report.errors().map(ToString::to_string));
        if &descriptor.connection.connector_channel_id != channel {
            problems.push(format!(
                "the Descriptor names channel {}, not {channel}",
                descriptor.connection.connector_channel_id
            ));
        }
        problems
    }

    async fn request(&self, probe: &mut Probe, packet: Packet) -> (String, Received) {
        let request_id = packet.request_id.clone();
        let text = packet.to_json().unwrap_or_default();
        let _ = probe.send_text(text.clone()).await;
        let answer = probe
            .next_matching(self.wait(), |p| p.request_id.is_some() && p.request_id == request_id)
            .await;
        (text, answer)
    }

    async fn authenticated(&mut self, probe: &mut Probe, channel: &ConnectorChannelId) {
        let Some(flow) = self.options.flow.clone() else { return };
        let mut start = AuthStart::new(flow.clone());
        if !self.options.inputs.0.is_empty() {
            start = start.with_input(self.options.inputs.clone());
        }
        let (sent, mut answer) = self
            .request(
                probe,
                Packet::with_payload(pkt(), start).request_id(req()).channel(channel.clone()),
            )
            .await;
        // Poll while pending; a QR flow's link is shown and may take its configured time.
        let mut shown: Option<String> = None;
        let mut prompted: Option<String> = None;
        let mut deadline = tokio::time::Instant::now() + self.wait() * 4;
        let progress = loop {
            let progress = match &answer {
                Received::Packet(packet, _) if packet.error.is_none() => match &packet.body {
                    PacketBody::AuthStartAck(Some(ack)) => Some(ack.0.clone()),
                    PacketBody::AuthStatusAck(Some(ack)) => Some(ack.0.clone()),
                    _ => None,
                },
                _ => None,
            };
            let Some(progress) = progress else { break None };
            if let Some(link) =
                progress.qr_code_text.as_ref().filter(|l| shown.as_ref() != Some(*l))
            {
                if let Some(show) = self.options.show_link {
                    show(link);
                }
                if shown.is_none() {
                    deadline = tokio::time::Instant::now() + self.options.qr_wait;
                }
                shown = Some(link.clone());
            }
            if let Some(message) =
                progress.message.as_ref().filter(|m| prompted.as_ref() != Some(*m))
                && matches!(progress.status, AuthStatus::Pending | AuthStatus::Scanned)
            {
                if let Some(show) = self.options.show_prompt {
                    show(message);
                }
                prompted = Some(message.clone());
            }
            if progress.status != AuthStatus::Pending && progress.status != AuthStatus::Scanned {
                break Some(progress);
            }
            if tokio::time::Instant::now() > deadline {
                break Some(progress);
            }
            let Some(session) = progress.auth_session_id.clone() else { break Some(progress) };
            tokio::time::sleep(Duration::from_millis(
                progress.poll_interval_millis.unwrap_or(500).min(2_000),
            ))
            .await;
            let poll = AuthStatusRequest::new(session).with_flow_id(flow.clone());
            answer = self
                .request(
                    probe,
                    Packet::with_payload(pkt(), poll).request_id(req()).channel(channel.clone()),
                )
                .await
                .1;
        };
        let (descriptor, outcome) = match progress {
            Some(AuthProgress {
                status: AuthStatus::Authenticated,
                connection_descriptor: Some(descriptor),
                ..
            }) => {
                let problems = self.descriptor_problems(&descriptor, channel);
                let outcome = if problems.is_empty() {
                    pass(format!("authenticated, status {}", descriptor.connection.status))
                } else {
                    fail_with(problems.join("; "), Some(&sent), &answer)
                };
                (Ok(descriptor), outcome)
            }
            other => {
                // Everything that needs a signed-in channel is skipped, with the Connector's
                // own reason.
                let reason = match (&other, &answer) {
                    (Some(progress), _) => format!(
                        "sign-in ended {}: {}",
                        progress.status,
                        progress.message.clone().unwrap_or_else(|| "no reason given".into())
                    ),
                    (None, Received::Packet(packet, _)) => match &packet.error {
                        Some(error) => {
                            format!("sign-in refused: {} ({})", error.message(), error.code)
                        }
                        None => format!("sign-in answered {}", packet.type_str()),
                    },
                    (None, received) => format!("sign-in got {}", describe(received)),
                };
                let failed = "authentication did not complete with a Descriptor";
                (Err(reason), fail_with(failed, Some(&sent), &answer))
            }
        };
        self.report.record(
            (
                "auth.flow",
                "§8.7-§8.10 auth.start/auth.status reach authenticated with a Descriptor",
            ),
            outcome,
        );
        let descriptor = match descriptor {
            Ok(descriptor) => descriptor,
            Err(reason) => {
                self.skip_signed_in(&reason);
                return;
            }
        };
        let (get_sent, got) = self
            .request(
                probe,
                Packet::with_payload(pkt(), xagent_protocol_types::DescriptorGet::default())
                    .request_id(req())
                    .channel(channel.clone()),
            )
            .await;
        let fetched = match &got {
            Received::Packet(packet, _) => packet
                .payload::<xagent_protocol_types::DescriptorGetAck>()
                .map(|a| a.connection_descriptor.clone()),
            _ => None,
        };
        if self.device_applies() {
            self.device_descriptor(&descriptor, fetched.as_ref(), channel, &get_sent, &got);
        }
        let descriptor = fetched.unwrap_or(descriptor);

        // Tools: Descriptor ⊆ Card, and every Card Tool accounted for.
        let card_tools: Vec<String> = self
            .card
            .as_ref()
            .map(|c| c.tools.iter().map(|t| t.tool_id.to_string()).collect())
            .unwrap_or_default();
        let extra: Vec<String> = descriptor
            .tools
            .iter()
            .map(|t| t.tool_id.to_string())
            .filter(|t| !card_tools.contains(t))
            .collect();
        let outcome = if extra.is_empty() {
            pass(format!("{} Tool(s), all in the Card", descriptor.tools.len()))
        } else {
            fail(format!("not in the Card: {}", extra.join(", ")))
        };
        self.report.record(
            (
                "descriptor.tool_not_in_card",
                "§9 a Tool absent from the Card cannot appear in the Descriptor",
            ),
            outcome,
        );
        let missing: Vec<&String> =
            card_tools.iter().filter(|t| descriptor.tool(t).is_none()).collect();
        let available: Vec<&String> = card_tools
            .iter()
            .filter(|t| descriptor.tool(t).is_some_and(|d| d.status == ToolStatus::Available))
            .collect();
        let outcome = if missing.is_empty() {
            pass(format!("{} of {} available", available.len(), card_tools.len()))
        } else {
            fail(format!(
                "missing from the Descriptor: {}",
                missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ))
        };
        self.report.record(
            ("descriptor.tools_declared", "§14.8 every Card Tool is declared in the Descriptor"),
            outcome,
        );

        // IM v2 exchange.
        if descriptor
            .connection
            .profiles
            .iter()
            .any(|p| p.as_str() == xagent_protocol_types::PROFILE_IM_V2)
        {
            self.im_exchange(probe, channel).await;
        } else {
            for id in ["im.message_accepted", "im.duplicate", "im.conflict"] {
                self.report
                    .record((id, "IM v2 §5/§7"), skip("the channel does not enable xagent.im.v2"));
            }
        }

        self.transfer(channel).await;
        self.tools(probe, channel).await;

        let (sent, answer) = self
            .request(
                probe,
                Packet::with_payload(pkt(), xagent_protocol_types::AuthLogout::default())
                    .request_id(req())
                    .channel(channel.clone()),
            )
            .await;
        let outcome = match &answer {
            Received::Packet(packet, _)
                if packet.type_str() == "auth.logout.ack" && packet.error.is_none() =>
            {
                pass("ok")
            }
            _ => fail_with("expected auth.logout.ack", Some(&sent), &answer),
        };
        self.report.record(("auth.logout", "§8.13 auth.logout gets auth.logout.ack"), outcome);
    }

    /// The checks that need a signed-in channel, reported skipped with `reason`.
    fn skip_signed_in(&mut self, reason: &str) {
        for id in SIGNED_IN_CHECKS {
            self.report.record((id, "needs a signed-in channel"), skip(reason));
        }
        self.skip_device_signed_in("needs a signed-in channel", reason);
        let tools: Vec<String> = self.options.tools.iter().map(|(id, _)| id.clone()).collect();
        for tool in tools {
            for kind in ["success", "invalid_arguments", "repeat"] {
                self.report.record(
                    (format!("tool.{tool}.{kind}"), "needs a signed-in channel"),
                    skip(reason.to_owned()),
                );
            }
        }
    }

    /// The Device Profile's Descriptor declarations, on the Descriptor of the authenticated
    /// sign-in answer and on the one `connection.descriptor.get` returns (validated as well).
    fn device_descriptor(
        &mut self,
        signed_in: &ConnectionDescriptor,
        fetched: Option<&ConnectionDescriptor>,
        channel: &ConnectorChannelId,
        get_sent: &str,
        got: &Received,
    ) {
        let Some(card) = self.card.clone() else { return };
        let outcome = match fetched {
            None => fail_with(
                "connection.descriptor.get did not answer with a Descriptor",
                Some(get_sent),
                got,
            ),
            Some(fetched) => {
                let mut problems: Vec<String> = self
                    .descriptor_problems(fetched, channel)
                    .into_iter()
                    .map(|p| format!("connection.descriptor.get: {p}"))
                    .collect();
                for (descriptor, where_) in
                    [(signed_in, "sign-in answer"), (fetched, "connection.descriptor.get")]
                {
                    if let Err(problem) = device::descriptor_declares(&card, descriptor, where_) {
                        problems.push(problem);
                    }
                }
                if problems.is_empty() {
                    pass(format!(
                        "target_type {} with {} in both Descriptors",
                        fetched.connection.target_type.as_str(),
                        xagent_protocol_types::PROFILE_DEVICE_V1
                    ))
                } else {
                    fail_with(problems.join("; "), Some(get_sent), got)
                }
            }
        };
        self.report.record((device::DESCRIPTOR_DECLARES, device::DESCRIPTOR_RULE), outcome);
    }

    /// `--tool ID --args JSON`: a successful call, a call with invalid arguments
    /// (`invalid_arguments` expected) and a repeat with the same `tool_call_id` (the first
    /// result expected, no second effect).
    async fn tools(&mut self, probe: &mut Probe, channel: &ConnectorChannelId) {
        const TOOL: &str = "§8.18 tool.invoke gets tool.invoke.ack; §8.19 invalid arguments";
        let calls = self.options.tools.clone();
        let mut results: Vec<(String, Value)> = Vec::new();
        for (tool, mut arguments) in calls {
            // The reserved argument every Card Tool requires, as a model would pass it.
            arguments.entry("connector_channel_id").or_insert_with(|| json!(channel.as_str()));
            let call_id = format!("call_{}", ids::mint(""));
            let invoke = |arguments: serde_json::Map<String, Value>, call_id: &str| {
                let body = ToolInvoke::new(tool.as_str(), arguments)
                    .with_context(xagent_protocol_types::ToolInvokeContext::with_call_id(call_id));
                Packet::with_payload(pkt(), body).request_id(req()).channel(channel.clone())
            };
            let (sent, first) = self.request(probe, invoke(arguments.clone(), &call_id)).await;
            let (first_result, outcome) = match &first {
                Received::Packet(packet, _)
                    if packet.type_str() == "tool.invoke.ack" && packet.error.is_none() =>
                {
                    let result = packet
                        .payload::<xagent_protocol_types::ToolInvokeAck>()
                        .and_then(|a| a.result.clone());
                    (result, pass("tool.invoke.ack with a result"))
                }
                _ => {
                    (None, fail_with("expected tool.invoke.ack without error", Some(&sent), &first))
                }
            };
            self.report.record((format!("tool.{tool}.success"), TOOL), outcome);
            // Invalid: every argument replaced by a value of a type no schema property takes.
            let mut invalid: serde_json::Map<String, Value> = arguments
                .keys()
                .map(|k| (k.clone(), json!({"not": ["a", "valid", "value"]})))
                .collect();
            invalid.insert("connector_channel_id".into(), json!(channel.as_str()));
            let (sent, answer) =
                self.request(probe, invoke(invalid, &format!("{call_id}_invalid"))).await;
            let texts = ["invalid_arguments", "expected an invalid_arguments error"];
            let outcome = expect_code(&answer, ErrorCode::InvalidArguments, &sent, Some(texts));
            self.report.record((format!("tool.{tool}.invalid_arguments"), TOOL), outcome);
            let (sent, again) = self.request(probe, invoke(arguments.clone(), &call_id)).await;
            let again_result = match &again {
                Received::Packet(packet, _) if packet.error.is_none() => packet
                    .payload::<xagent_protocol_types::ToolInvokeAck>()
                    .and_then(|a| a.result.clone()),
                _ => None,
            };
            if let Some(result) = &first_result {
                results.push((tool.clone(), result.clone()));
            }
            let outcome = if first_result.is_some() && again_result == first_result {
                pass("the same result")
            } else {
                fail_with("expected the first call's result again", Some(&sent), &again)
            };
            let repeat = "§8.18 a repeated tool_call_id returns the first result";
            self.report.record((format!("tool.{tool}.repeat"), repeat), outcome);
        }
        if self.device_applies() {
            let outcome = if self.options.tools.is_empty() {
                skip("give --tool ID --args JSON to scan Tool results")
            } else if results.is_empty() {
                skip("no --tool call succeeded, no result to scan")
            } else {
                match device::results_carry_no_bytes(&results) {
                    Ok(detail) => pass(detail),
                    Err(detail) => fail(detail),
                }
            };
            self.report.record((device::RESULT_NO_BYTES, device::RESULT_RULE), outcome);
        }
    }

    async fn im_exchange(&mut self, probe: &mut Probe, channel: &ConnectorChannelId) {
        let message_id = ids::mint("msg_conformance_");
        let status_of = |answer: &Received| match answer {
            Received::Packet(packet, _) => packet.payload::<ChatMessageAck>().cloned(),
            _ => None,
        };
        let (wire, answer) =
            send_chat(probe, channel, &message_id, "conformance check: hello").await;
        let outcome = match status_of(&answer) {
            Some(ack)
                if ack.status == AckStatus::Accepted && ack.message_id.as_str() == message_id =>
            {
                pass("accepted")
            }
            _ => fail_with("expected accepted", Some(&wire), &answer),
        };
        self.report.record(
            (
                "im.message_accepted",
                "IM v2 §5/§7 chat.message gets chat.message.ack accepted with reply_to",
            ),
            outcome,
        );
        let (wire, answer) =
            send_chat(probe, channel, &message_id, "conformance check: hello").await;
        let outcome = match status_of(&answer) {
            Some(ack) if ack.status == AckStatus::Duplicate => pass("duplicate"),
            _ => fail_with("expected duplicate", Some(&wire), &answer),
        };
        self.report.record(
            ("im.duplicate", "IM v2 §7 a repeat of an accepted message gets duplicate"),
            outcome,
        );
        let (wire, answer) =
            send_chat(probe, channel, &message_id, "conformance check: different text, same id")
                .await;
        let outcome = match status_of(&answer) {
            Some(ack) if ack.status == AckStatus::Rejected && ack.retryable == Some(false) => pass(
                format!("rejected with {}", ack.code.map(|c| c.to_string()).unwrap_or_default()),
            ),
            _ => fail_with("expected rejected with retryable false", Some(&wire), &answer),
        };
        self.report.record(
            (
                "im.conflict",
                "IM v2 §9 same message_id with different content is rejected, not retryable",
            ),
            outcome,
        );
    }

    async fn transfer(&mut self, channel: &ConnectorChannelId) {
        const DOWNLOAD: (&str, &str) =
            ("transfer.download", "§5.2 GET /files/refs/{file_ref} returns the raw bytes");
        let bytes = b"xagent conformance upload\n".to_vec();
        let upload = self.control.upload(channel, "conformance.txt", "text/plain", bytes.clone());
        let (upload, outcome) = match upload.await {
            Ok(upload) => {
                let detail = format!("{} ({} bytes)", upload.file_ref, upload.byte_size);
                (Some(upload), pass(detail))
            }
            Err(ClientError::Http { status: 404, .. }) => {
                (None, skip("no upload endpoint (the Connector may not take files from xAgent)"))
            }
            Err(e) => (None, fail(e.to_string())),
        };
        self.report.record(
            ("transfer.upload", "§5.1 POST /files/uploads returns a file_ref bound to the channel"),
            outcome,
        );
        let Some(upload) = upload else {
            self.report.record(DOWNLOAD, skip("nothing uploaded"));
            return;
        };
        // Relative, so it resolves under the Base URL path (a Connector behind a prefix).
        let url = format!("files/refs/{}", upload.file_ref);
        let download = self
            .control
            .http()
            .get(self.options.base_url.resolve(&url).unwrap_or_default())
            .bearer_auth(self.options.api_key.as_ref().map(|k| k.expose()).unwrap_or_default())
            .send()
            .await;
        let outcome = match download {
            Ok(response) if response.status().is_success() => {
                let body = response.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
                if body == bytes {
                    pass("bytes match")
                } else {
                    fail("the bytes differ from the upload")
                }
            }
            Ok(response) => skip(format!(
                "download with the API key answered {} (the Connector may serve only signed URLs)",
                response.status()
            )),
            Err(e) => fail(e.to_string()),
        };
        self.report.record(DOWNLOAD, outcome);
    }
}

async fn send_chat(
    probe: &mut Probe,
    channel: &ConnectorChannelId,
    message_id: &str,
    text: &str,
) -> (String, Received) {
    let packet =
        Packet::with_payload(pkt(), ChatMessage::text(message_id, text)).channel(channel.clone());
    let packet_id = packet.packet_id.clone();
    let wire = packet.to_json().unwrap_or_default();
    let _ = probe.send_text(wire.clone()).await;
    let answer = probe
        .next_matching(Duration::from_secs(10), |p| {
            p.type_str() == ChatMessageAck::TYPE && p.reply_to.as_ref() == Some(&packet_id)
        })
        .await;
    (wire, answer)
}
