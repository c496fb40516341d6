//! The Connection Descriptor, alone, against a Card, and nested in a packet.

use serde_json::{Map, Value};
use xagent_protocol_types::{
    ConnectionStatus, DESCRIPTOR_SCHEMA as DESCRIPTOR_SCHEMA_ID, DESCRIPTOR_SCHEMA_V1,
    PermissionState, TargetType, ToolStatus,
};

use super::json::*;
use super::validator::Validator;
use crate::catalog;
use crate::facts::*;
use crate::report::{Report, Sink, child, index};
use crate::rules::*;

impl Validator {
    /// Validates a Connection Descriptor (v2, or v1 which is normalised with a warning).
    pub fn descriptor(&self, descriptor: &Value, context: DescriptorContext<'_>) -> Report {
        let mut sink = Sink::default();
        self.descriptor_at(&mut sink, descriptor, "", context);
        sink.finish()
    }

    pub(super) fn descriptor_at(
        &self,
        sink: &mut Sink,
        descriptor: &Value,
        base: &str,
        context: DescriptorContext<'_>,
    ) {
        let Some(root) = descriptor.as_object() else {
            sink.push(&DOCUMENT_NOT_OBJECT, base, "a Connection Descriptor must be a JSON object");
            return;
        };
        let schema = root.get("schema").and_then(Value::as_str);
        let legacy = schema == Some(DESCRIPTOR_SCHEMA_V1);
        if legacy {
            sink.push(
                &DESCRIPTOR_SCHEMA_LEGACY,
                child(base, "schema"),
                format!("a {DESCRIPTOR_SCHEMA_V1} Descriptor is read as {DESCRIPTOR_SCHEMA_ID}; emit {DESCRIPTOR_SCHEMA_ID}"),
            );
        } else if schema != Some(DESCRIPTOR_SCHEMA_ID) {
            sink.push(
                &DESCRIPTOR_SCHEMA,
                child(base, "schema"),
                format!("schema must be \"{DESCRIPTOR_SCHEMA_ID}\""),
            );
        }
        let cp = child(base, "connection");
        match obj(root.get("connection")) {
            None => sink.push(&DESCRIPTOR_CONNECTION, &cp, "connection must be an object"),
            Some(connection) => {
                if let Some(id) = require_str(
                    sink,
                    &DESCRIPTOR_CONNECTOR_CARD_ID,
                    connection,
                    "connector_card_id",
                    &cp,
                ) && let Some(card_id) = context.card.and_then(|c| c.card_id.as_deref())
                    && id != card_id
                {
                    sink.push(
                        &DESCRIPTOR_CARD_MISMATCH,
                        child(&cp, "connector_card_id"),
                        format!("connector_card_id must be the Card's {card_id:?}"),
                    );
                }
                require_str(sink, &DESCRIPTOR_CONNECTOR_ID, connection, "connector_id", &cp);
                if let Some(channel) = require_str(
                    sink,
                    &DESCRIPTOR_CONNECTOR_CHANNEL_ID,
                    connection,
                    "connector_channel_id",
                    &cp,
                ) && context.channel.is_some_and(|c| c != channel)
                {
                    sink.push(
                        &DESCRIPTOR_CHANNEL_MISMATCH,
                        child(&cp, "connector_channel_id"),
                        "connector_channel_id must equal the channel this Descriptor describes",
                    );
                }
                let target_type = connection.get("target_type").and_then(Value::as_str);
                if !target_type.is_some_and(|t| TargetType::parse(t).is_known()) {
                    sink.push(
                        &DESCRIPTOR_TARGET_TYPE,
                        child(&cp, "target_type"),
                        format!("target_type must be one of {}", TargetType::KNOWN.join(", ")),
                    );
                }
                let legacy_profile = if legacy {
                    connection.get("profile").map(|p| Value::Array(vec![p.clone()]))
                } else {
                    None
                };
                let profiles_value = connection.get("profiles").or(legacy_profile.as_ref());
                self.descriptor_profiles(sink, profiles_value, &cp, target_type, context.card);
                if !connection
                    .get("status")
                    .and_then(Value::as_str)
                    .is_some_and(|s| ConnectionStatus::parse(s).is_known())
                {
                    sink.push(
                        &DESCRIPTOR_STATUS,
                        child(&cp, "status"),
                        format!("status must be one of {}", ConnectionStatus::KNOWN.join(", ")),
                    );
                }
            }
        }
        let tp = child(base, "target");
        match obj(root.get("target")) {
            None => sink.push(&DESCRIPTOR_TARGET, &tp, "target must be an object with provider"),
            Some(target) => {
                require_str(sink, &DESCRIPTOR_TARGET, target, "provider", &tp);
                if !target.get("display_name").is_some_and(Value::is_string) {
                    sink.push(
                        &DESCRIPTOR_TARGET_DISPLAY_NAME,
                        child(&tp, "display_name"),
                        "target.display_name is required",
                    );
                }
            }
        }
        if let Some(tools) = root.get("tools") {
            let tools_path = child(base, "tools");
            let Some(items) = tools.as_array() else {
                sink.push(&DESCRIPTOR_TOOL_ID, &tools_path, "tools must be an array");
                return self.scan(
                    sink,
                    &DESCRIPTOR_SECRET_LEAK,
                    descriptor,
                    base,
                    "the Descriptor",
                );
            };
            let mut seen: Vec<&str> = Vec::new();
            let empty = Map::new();
            for (i, item) in items.iter().enumerate() {
                let p = index(&tools_path, i);
                let tool = item.as_object().unwrap_or(&empty);
                if let Some(id) = require_str(sink, &DESCRIPTOR_TOOL_ID, tool, "tool_id", &p) {
                    if context.card.is_some_and(|c| !c.tool_ids.iter().any(|t| t == id)) {
                        sink.push(
                            &DESCRIPTOR_TOOL_NOT_IN_CARD,
                            child(&p, "tool_id"),
                            format!("Tool {id:?} is not declared in the Card"),
                        );
                    }
                    if seen.contains(&id) {
                        sink.push(
                            &DESCRIPTOR_TOOL_ID_UNIQUE,
                            child(&p, "tool_id"),
                            format!(
                                "Tool {id:?} appears twice; list each Tool once with its state"
                            ),
                        );
                    }
                    seen.push(id);
                }
                if !tool
                    .get("status")
                    .and_then(Value::as_str)
                    .is_some_and(|s| ToolStatus::parse(s).is_known())
                {
                    sink.push(
                        &DESCRIPTOR_TOOL_STATUS,
                        child(&p, "status"),
                        format!("status is required, one of {}", ToolStatus::KNOWN.join(", ")),
                    );
                }
                if let Some(state) = tool.get("target_permission_state")
                    && !state.as_str().is_some_and(|s| PermissionState::parse(s).is_known())
                {
                    sink.push(
                        &DESCRIPTOR_TOOL_PERMISSION_STATE,
                        child(&p, "target_permission_state"),
                        format!(
                            "target_permission_state must be one of {}",
                            PermissionState::KNOWN.join(", ")
                        ),
                    );
                }
            }
        }
        self.scan(sink, &DESCRIPTOR_SECRET_LEAK, descriptor, base, "the Descriptor");
    }

    pub(super) fn descriptor_profiles(
        &self,
        sink: &mut Sink,
        profiles: Option<&Value>,
        cp: &str,
        target_type: Option<&str>,
        card: Option<&CardFacts>,
    ) {
        let pp = child(cp, "profiles");
        let Some(items) = profiles.and_then(Value::as_array).filter(|a| !a.is_empty()) else {
            sink.push(&DESCRIPTOR_PROFILES, pp, "connection.profiles must be a non-empty array");
            return;
        };
        let mut seen: Vec<&str> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let p = index(&pp, i);
            let Some(id) = non_empty_str(Some(item)) else {
                sink.push(&DESCRIPTOR_PROFILES, p, "Profile ids are non-empty strings");
                continue;
            };
            if seen.contains(&id) {
                sink.push(&DESCRIPTOR_PROFILES, p, format!("Profile {id:?} is listed twice"));
                continue;
            }
            seen.push(id);
            if card.is_some_and(|c| !c.profiles.iter().any(|cp| cp == id)) {
                sink.push(
                    &DESCRIPTOR_PROFILE_NOT_IN_CARD,
                    &p,
                    format!("Profile {id:?} is not in the Card's supports.profiles"),
                );
            }
            if let (Some(spec), Some(t)) = (catalog::profile(id), target_type)
                && !spec.allows_target_type(&TargetType::parse(t))
            {
                sink.push(
                    &DESCRIPTOR_PROFILE_TARGET_TYPE,
                    &p,
                    format!("Profile {id} cannot be enabled on a {t:?} channel"),
                );
            }
        }
    }

    pub(super) fn nested_descriptor(
        &self,
        sink: &mut Sink,
        body: &Map<String, Value>,
        required: bool,
        context: DescriptorContext<'_>,
    ) {
        match body.get("connection_descriptor") {
            Some(Value::Object(_)) => {
                if let Some(d) = body.get("connection_descriptor") {
                    // The packet scan covers secrets; avoid reporting them twice.
                    let mut inner = Sink::default();
                    self.descriptor_at(&mut inner, d, "/payload/connection_descriptor", context);
                    sink.violations.extend(
                        inner
                            .violations
                            .into_iter()
                            .filter(|v| v.rule != DESCRIPTOR_SECRET_LEAK.id),
                    );
                }
            }
            None if !required => {}
            _ => sink.push(
                &PACKET_DESCRIPTOR,
                "/payload/connection_descriptor",
                "connection_descriptor must be a Connection Descriptor object",
            ),
        }
    }
}
