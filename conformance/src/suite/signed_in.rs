//! The checks on a signed-in channel: the sign-in flow, the Descriptor it returns, and logout.

use super::*;

impl Run {
    /// The checks on a signed-in channel: sign in with `--flow`, then the Descriptor, IM v2, the
    /// Transfer Plane, the Tools and logout.
    pub(super) async fn authenticated(&mut self, probe: &mut Probe, channel: &ConnectorChannelId) {
        let Some(descriptor) = self.sign_in(probe, channel).await else { return };
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
        self.descriptor_tools(&descriptor);
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
        self.logout(probe, channel).await;
    }

    /// `auth.flow`: `auth.start`, polled with `auth.status` while pending, reaches
    /// `authenticated` with a valid Descriptor. Without one, every signed-in check is skipped
    /// with the Connector's own reason.
    async fn sign_in(
        &mut self,
        probe: &mut Probe,
        channel: &ConnectorChannelId,
    ) -> Option<ConnectionDescriptor> {
        let flow = self.options.flow.clone()?;
        let mut start = AuthStart::new(flow.clone());
        if !self.options.inputs.0.is_empty() {
            start = start.with_input(self.options.inputs.clone());
        }
        let start = Packet::with_payload(pkt(), start).request_id(req()).channel(channel.clone());
        let (sent, answer) = self.request(probe, start).await;
        let (progress, answer) = self.poll_sign_in(probe, channel, flow, answer).await;
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
                let failed = "authentication did not complete with a Descriptor";
                (
                    Err(sign_in_failure(other.as_ref(), &answer)),
                    fail_with(failed, Some(&sent), &answer),
                )
            }
        };
        self.report.record(
            (
                "auth.flow",
                "§8.7-§8.10 auth.start/auth.status reach authenticated with a Descriptor",
            ),
            outcome,
        );
        descriptor.map_err(|reason| self.skip_signed_in(&reason)).ok()
    }

    /// Polls `auth.status` while the sign-in is pending or scanned, showing a QR flow's link
    /// and the Connector's prompts; a QR flow may take its configured time. Returns the last
    /// progress read (`None` when an answer carried none) and the last answer.
    async fn poll_sign_in(
        &self,
        probe: &mut Probe,
        channel: &ConnectorChannelId,
        flow: FlowId,
        mut answer: Received,
    ) -> (Option<AuthProgress>, Received) {
        let mut shown = Shown::default();
        let mut deadline = tokio::time::Instant::now() + self.wait() * 4;
        loop {
            let Some(progress) = progress_of(&answer) else { return (None, answer) };
            if shown.show(&progress, &self.options) {
                deadline = tokio::time::Instant::now() + self.options.qr_wait;
            }
            let waiting = matches!(progress.status, AuthStatus::Pending | AuthStatus::Scanned);
            if !waiting || tokio::time::Instant::now() > deadline {
                return (Some(progress), answer);
            }
            let Some(session) = progress.auth_session_id.clone() else {
                return (Some(progress), answer);
            };
            tokio::time::sleep(Duration::from_millis(
                progress.poll_interval_millis.unwrap_or(500).min(2_000),
            ))
            .await;
            let poll = AuthStatusRequest::new(session).with_flow_id(flow.clone());
            let poll = Packet::with_payload(pkt(), poll).request_id(req()).channel(channel.clone());
            answer = self.request(probe, poll).await.1;
        }
    }

    /// Tools: the Descriptor's are all in the Card, and every Card Tool is accounted for.
    fn descriptor_tools(&mut self, descriptor: &ConnectionDescriptor) {
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
        let available = card_tools
            .iter()
            .filter(|t| descriptor.tool(t).is_some_and(|d| d.status == ToolStatus::Available))
            .count();
        let outcome = if missing.is_empty() {
            pass(format!("{available} of {} available", card_tools.len()))
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
    }

    /// `auth.logout`: logout gets its ack.
    async fn logout(&mut self, probe: &mut Probe, channel: &ConnectorChannelId) {
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
    pub(super) fn skip_signed_in(&mut self, reason: &str) {
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
    pub(super) fn device_descriptor(
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
}

/// The sign-in progress an answer carries (`auth.start.ack` or `auth.status.ack`), if any.
fn progress_of(answer: &Received) -> Option<AuthProgress> {
    match answer {
        Received::Packet(packet, _) if packet.error.is_none() => match &packet.body {
            PacketBody::AuthStartAck(Some(ack)) => Some(ack.0.clone()),
            PacketBody::AuthStatusAck(Some(ack)) => Some(ack.0.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// Why a sign-in ended without a Descriptor, in the Connector's own words.
fn sign_in_failure(progress: Option<&AuthProgress>, answer: &Received) -> String {
    match (progress, answer) {
        (Some(progress), _) => format!(
            "sign-in ended {}: {}",
            progress.status,
            progress.message.clone().unwrap_or_else(|| "no reason given".into())
        ),
        (None, Received::Packet(packet, _)) => match &packet.error {
            Some(error) => format!("sign-in refused: {} ({})", error.message(), error.code),
            None => format!("sign-in answered {}", packet.type_str()),
        },
        (None, received) => format!("sign-in got {}", describe(received)),
    }
}

/// What a sign-in has shown the user so far: each QR link and prompt once.
#[derive(Default)]
struct Shown {
    link: Option<String>,
    prompt: Option<String>,
}

impl Shown {
    /// Shows a new link or a new prompt of a pending sign-in; true when the first link was
    /// shown (the QR wait starts then).
    fn show(&mut self, progress: &AuthProgress, options: &ConformanceOptions) -> bool {
        let mut first_link = false;
        if let Some(link) =
            progress.qr_code_text.as_ref().filter(|l| self.link.as_ref() != Some(*l))
        {
            if let Some(show) = options.show_link {
                show(link);
            }
            first_link = self.link.is_none();
            self.link = Some(link.clone());
        }
        if let Some(message) =
            progress.message.as_ref().filter(|m| self.prompt.as_ref() != Some(*m))
            && matches!(progress.status, AuthStatus::Pending | AuthStatus::Scanned)
        {
            if let Some(show) = options.show_prompt {
                show(message);
            }
            self.prompt = Some(message.clone());
        }
        first_link
    }
}
