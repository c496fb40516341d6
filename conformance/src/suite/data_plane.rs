//! The data plane before sign-in: the upgrade, hello, malformed and unknown packets, and the
//! channel lifecycle.

use super::*;

impl Run {
    /// Sends `text` and returns the next thing that comes back (or the silence).
    pub(super) async fn answer(&self, probe: &mut Probe, text: &str) -> Received {
        let _ = probe.send_text(text.to_owned()).await;
        probe.next(self.wait()).await
    }

    /// Sends `text` and records `check`: passed when the Connector refuses it with an error
    /// packet carrying `code` (see [`expect_code`] for `texts`).
    pub(super) async fn refused(
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
    pub(super) fn key_refused(&self, status: u16) -> String {
        match &self.options.api_key {
            None => format!(
                "the upgrade was refused with {status}: no --api-key was given and this Connector requires one; run again with --api-key"
            ),
            Some(_) => format!(
                "the upgrade was refused with {status}: the Connector did not accept the --api-key given"
            ),
        }
    }

    pub(super) fn options(&self, subprotocol: bool, key: bool) -> ProbeOptions {
        ProbeOptions {
            subprotocol,
            api_key: if key { self.options.api_key.clone() } else { None },
            tls: self.options.tls.clone(),
        }
    }

    pub(super) async fn open_probe(&self) -> Option<Probe> {
        match Probe::connect(&self.options.base_url, &self.options(true, true)).await {
            Upgrade::Open(probe, _) => Some(*probe),
            _ => None,
        }
    }

    pub(super) fn hello_text(&self, mutate: impl FnOnce(&mut Value)) -> String {
        let hello = ConnectorHello::new(self.card_id(), self.supported_profiles());
        let mut packet =
            Packet::with_payload(pkt(), hello).request_id(req()).to_value().unwrap_or_default();
        mutate(&mut packet);
        packet.to_string()
    }

    /// The data-plane checks, in report order; each stage returns early when what the next
    /// needs (an open socket, an established connection, a channel) is missing.
    pub(super) async fn data_plane(&mut self) {
        self.api_key_enforced().await;
        self.subprotocol_required().await;
        let Some(mut probe) = self.subprotocol_echoed().await else { return };
        self.before_hello(&mut probe).await;
        // The server may close after a bad hello; use fresh sockets from here.
        probe.close().await;
        self.hello_refusals().await;
        let Some(mut probe) = self.good_hello().await else { return };
        self.after_hello(&mut probe).await;
        let Some(channel) = self.channel_open(&mut probe).await else { return };
        self.tool_before_sign_in(&mut probe, &channel).await;
        if self.options.flow.is_some() {
            self.authenticated(&mut probe, &channel).await;
        } else {
            let reason = "give --flow and --input to run the authenticated checks";
            for id in std::iter::once("auth.flow").chain(SIGNED_IN_CHECKS) {
                self.report.record((id, "needs --flow"), skip(reason));
            }
            self.skip_device_signed_in("needs --flow", reason);
        }
        self.channel_close(&mut probe, channel).await;
        probe.close().await;
    }

    /// `ws.api_key_enforced`: an upgrade without the key is refused when one is configured.
    async fn api_key_enforced(&mut self) {
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
    }

    /// `ws.subprotocol_required`. A 401/403 says nothing about the subprotocol: the key decided
    /// first.
    async fn subprotocol_required(&mut self) {
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
    }

    /// `ws.subprotocol_echoed`; the socket of a successful upgrade.
    async fn subprotocol_echoed(&mut self) -> Option<Probe> {
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
        probe.map(|probe| *probe)
    }

    /// Before hello: a channel packet, invalid JSON, a binary frame, a hello for another Card.
    async fn before_hello(&mut self, probe: &mut Probe) {
        let early_channel = Packet::with_payload(pkt(), ChannelOpen::default())
            .request_id(req())
            .to_json()
            .unwrap_or_default();
        let check = ("ws.hello_required_first", "§6 the first packet must be connector.hello");
        let texts = [
            "channel.open before hello got hello_required",
            "expected an error packet with hello_required",
        ];
        self.refused(probe, check, &early_channel, ErrorCode::HelloRequired, Some(texts)).await;

        // Invalid JSON keeps the connection.
        let check = ("ws.invalid_json", "§7/§8.23 invalid JSON gets invalid_packet");
        let texts =
            ["invalid_packet, socket kept open", "expected an error packet with invalid_packet"];
        self.refused(probe, check, "{not json", ErrorCode::InvalidPacket, Some(texts)).await;
        let _ = probe.send_binary(vec![1, 2, 3]).await;
        let answer = probe.next(self.wait()).await;
        let texts =
            ["binary frame got invalid_packet", "expected invalid_packet for a binary frame"];
        let outcome = expect_code(&answer, ErrorCode::InvalidPacket, "(binary frame)", Some(texts));
        self.report.record(("ws.binary_frame", "§6 text frames only"), outcome);

        let wrong_card = self
            .hello_text(|p| p["payload"]["connector_card_id"] = json!("conformance.not-this-card"));
        let check = ("hello.card_id", "§8.1 connector_card_id must match the Card");
        self.refused(probe, check, &wrong_card, ErrorCode::ConnectorCardIdMismatch, None).await;
    }

    /// Hellos refused on fresh sockets: no `supported_profiles`, no version, version 2.0.
    async fn hello_refusals(&mut self) {
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
            self.version_refused(id, version).await;
        }
    }

    /// One version check: a hello without `protocol_version` (`None`) or with `version` is
    /// answered with an error and a close.
    async fn version_refused(&mut self, id: &'static str, version: Option<&str>) {
        let Some(mut probe) = self.open_probe().await else { return };
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
        self.report.record((id, "§8.1/§12 reject a hello without a version or below 3.0"), outcome);
    }

    /// `ws.hello.ack_valid`: a good hello on a fresh socket, its ack validated; the socket
    /// when an ack came back.
    async fn good_hello(&mut self) -> Option<Probe> {
        const HELLO_ACK: (&str, &str) =
            ("ws.hello.ack_valid", "§8.2 hello.ack: card id, connector_id, protocol 3.0");
        let mut probe = self.open_probe().await?;
        let hello = self.hello_text(|_| {});
        let answer = self.answer(&mut probe, &hello).await;
        let packet = match &answer {
            Received::Packet(packet, _) if packet.error.is_none() => packet,
            _ => {
                self.report.record(HELLO_ACK, fail_with("no hello.ack", Some(&hello), &answer));
                return None;
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
        Some(probe)
    }

    /// After hello: invalid JSON, an unknown type, ping, and channel-scoped packets without a
    /// channel or on one never opened.
    async fn after_hello(&mut self, probe: &mut Probe) {
        let check = (
            "ws.invalid_packet_after_hello",
            "§7 invalid JSON gets invalid_packet; the connection stays",
        );
        self.refused(probe, check, "[1,2", ErrorCode::InvalidPacket, None).await;
        let unknown = json!({"schema": "xagent.connector.packet/v1", "packet_id": pkt(), "request_id": req(), "type": "conformance.unknown"}).to_string();
        let check = ("packet.type_unknown", "§8.23 unknown packet types get unsupported_packet");
        self.refused(probe, check, &unknown, ErrorCode::UnsupportedPacket, None).await;
        self.ping_pong(probe).await;
        let no_channel =
            Packet::with_payload(pkt(), xagent_protocol_types::DescriptorGet::default())
                .request_id(req())
                .to_json()
                .unwrap_or_default();
        let check =
            ("packet.channel_required", "§8.23 user-level packets need connector_channel_id");
        self.refused(probe, check, &no_channel, ErrorCode::ConnectorChannelIdRequired, None).await;
        let unopened = Packet::with_payload(pkt(), AuthStart::new("any"))
            .request_id(req())
            .channel("cch_conformance_never_opened")
            .to_json()
            .unwrap_or_default();
        let check =
            ("ws.channel_not_open", "§8.7/§8.23 channel-scoped packets need an open channel");
        self.refused(probe, check, &unopened, ErrorCode::ChannelNotOpen, None).await;
    }

    /// `ws.ping_pong`: ping gets pong with the same `request_id`.
    async fn ping_pong(&mut self, probe: &mut Probe) {
        let ping_request = req();
        let ping = Packet::with_payload(pkt(), Ping::default())
            .request_id(ping_request.clone())
            .to_json()
            .unwrap_or_default();
        let answer = self.answer(probe, &ping).await;
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
    }

    /// `ws.channel_open`: the ack names the channel in envelope and payload and carries a valid
    /// Descriptor; the channel when it does.
    async fn channel_open(&mut self, probe: &mut Probe) -> Option<ConnectorChannelId> {
        let request = Packet::with_payload(pkt(), ChannelOpen::default()).request_id(req());
        let (open, answer) = self.request(probe, request).await;
        let ack = match &answer {
            Received::Packet(packet, _) => packet
                .payload::<ChannelOpenAck>()
                .zip(packet.connector_channel_id.as_ref())
                .filter(|(ack, envelope)| &ack.connector_channel_id == *envelope),
            _ => None,
        };
        let (channel, outcome) = match ack {
            Some((ack, channel)) => {
                let problems = self.descriptor_problems(&ack.connection_descriptor, channel);
                let outcome = if problems.is_empty() {
                    let status = &ack.connection_descriptor.connection.status;
                    pass(format!("channel {channel}, status {status}"))
                } else {
                    fail_with(problems.join("; "), Some(&open), &answer)
                };
                (Some(channel.clone()), outcome)
            }
            None if matches!(answer, Received::Packet(..)) => {
                let expected = "expected channel.open.ack with the channel in envelope and payload";
                (None, fail_with(expected, Some(&open), &answer))
            }
            None => (None, fail_with("no channel.open.ack", Some(&open), &answer)),
        };
        self.report.record(
            (
                "ws.channel_open",
                "§8.4 channel.open.ack: channel id in envelope and payload, valid Descriptor",
            ),
            outcome,
        );
        channel
    }

    /// `ws.tool_invoke_unauthenticated`: a Tool on a channel that never signed in is refused.
    async fn tool_before_sign_in(&mut self, probe: &mut Probe, channel: &ConnectorChannelId) {
        let tool = self.card.as_ref().and_then(|c| c.tools.first()).map(|t| t.tool_id.clone());
        let outcome = match tool {
            Some(tool_id) => {
                let mut arguments = serde_json::Map::new();
                arguments.insert("connector_channel_id".into(), json!(channel.as_str()));
                let invoke = Packet::with_payload(pkt(), ToolInvoke::new(tool_id, arguments))
                    .request_id(req())
                    .channel(channel.clone());
                let (invoke, answer) = self.request(probe, invoke).await;
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
    }

    /// `ws.channel_close`: channel.close gets its ack.
    async fn channel_close(&mut self, probe: &mut Probe, channel: ConnectorChannelId) {
        let close =
            Packet::with_payload(pkt(), ChannelClose::default()).request_id(req()).channel(channel);
        let (close, answer) = self.request(probe, close).await;
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
    }

    pub(super) fn descriptor_problems(
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

    pub(super) async fn request(&self, probe: &mut Probe, packet: Packet) -> (String, Received) {
        let request_id = packet.request_id.clone();
        let text = packet.to_json().unwrap_or_default();
        let _ = probe.send_text(text.clone()).await;
        let answer = probe
            .next_matching(self.wait(), |p| p.request_id.is_some() && p.request_id == request_id)
            .await;
        (text, answer)
    }
}
