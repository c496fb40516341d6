//! What a signed-in channel exchanges: Tool calls, IM v2 messages and the Transfer Plane.

use super::*;

impl Run {
    /// `--tool ID --args JSON`: a successful call, a call with invalid arguments
    /// (`invalid_arguments` expected) and a repeat with the same `tool_call_id` (the first
    /// result expected, no second effect).
    pub(super) async fn tools(&mut self, probe: &mut Probe, channel: &ConnectorChannelId) {
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

    pub(super) async fn im_exchange(&mut self, probe: &mut Probe, channel: &ConnectorChannelId) {
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

    pub(super) async fn transfer(&mut self, channel: &ConnectorChannelId) {
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
