//! The document validators. They work on `serde_json::Value`, so one bad field never hides
//! the others, and return every violation found.

use std::ops::ControlFlow;

use serde_json::{Map, Value};
use xagent_protocol_types::{
    AuthFlowType, AuthStatus, CARD_SCHEMA as CARD_SCHEMA_ID, CHANNEL_ARGUMENT, ConnectionStatus,
    ConnectorCard, DESCRIPTOR_SCHEMA as DESCRIPTOR_SCHEMA_ID, DESCRIPTOR_SCHEMA_V1, Direction,
    InputType, PACKET_SCHEMA as PACKET_SCHEMA_ID, Packet, PacketType, PermissionState, Role,
    Routing, Side, TargetType, ToolStatus, TrustLevel, primary_skill_name,
};

use crate::catalog;
use crate::im;
use crate::model_text;
use crate::report::{Report, Rule, Severity, Sink, child, index};
use crate::rules::*;
use crate::secrets::SecretScanner;
use crate::version::{AdmissionWindow, ProtocolVersion};

/// The facts of a Card that other documents are checked against. Built from a parsed value
/// (which may itself be invalid: missing facts just skip the cross-checks that need them) or
/// from a typed Card.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct CardFacts {
    /// `connector_card_id`.
    pub card_id: Option<String>,
    /// `protocol_version`.
    pub protocol_version: Option<String>,
    /// `connector.version`.
    pub connector_version: Option<String>,
    /// `build`.
    pub build: Option<Value>,
    /// `supports.profiles`.
    pub profiles: Vec<String>,
    /// `supports.target_types`.
    pub target_types: Vec<String>,
    /// `tools[].tool_id`.
    pub tool_ids: Vec<String>,
    /// `auth_flows[].id`.
    pub flow_ids: Vec<String>,
    /// Every `tools[].related_skill_ids` entry, each once, in Card order.
    pub related_skill_ids: Vec<String>,
}

impl CardFacts {
    /// Reads what it can from a Card document.
    pub fn from_value(card: &Value) -> Self {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        let list = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|items| items.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default()
        };
        let ids = |v: Option<&Value>, key: &str| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|item| item.get(key).and_then(Value::as_str))
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        Self {
            card_id: text(card.get("connector_card_id")),
            protocol_version: text(card.get("protocol_version")),
            connector_version: text(card.pointer("/connector/version")),
            build: card.get("build").cloned(),
            profiles: list(card.pointer("/supports/profiles")),
            target_types: list(card.pointer("/supports/target_types")),
            tool_ids: ids(card.get("tools"), "tool_id"),
            flow_ids: ids(card.get("auth_flows"), "id"),
            related_skill_ids: unique(
                card.get("tools")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|tool| tool.get("related_skill_ids").and_then(Value::as_array))
                    .flatten()
                    .filter_map(Value::as_str),
            ),
        }
    }

    /// The facts of a typed Card.
    pub fn from_card(card: &ConnectorCard) -> Self {
        Self {
            card_id: Some(card.connector_card_id.as_str().to_owned()),
            protocol_version: Some(card.protocol_version.clone()),
            connector_version: Some(card.connector.version.clone()),
            build: serde_json::to_value(&card.build).ok(),
            profiles: card.supports.profiles.iter().map(|p| p.as_str().to_owned()).collect(),
            target_types: card
                .supports
                .target_types
                .iter()
                .map(|t| t.as_str().to_owned())
                .collect(),
            tool_ids: card.tools.iter().map(|t| t.tool_id.as_str().to_owned()).collect(),
            flow_ids: card.auth_flows.iter().map(|f| f.id.as_str().to_owned()).collect(),
            related_skill_ids: unique(
                card.tools.iter().flat_map(|t| t.related_skill_ids.iter()).map(|s| s.as_str()),
            ),
        }
    }
}

/// The names, each once, in first-seen order.
fn unique<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in names {
        if !out.iter().any(|n| n == name) {
            out.push(name.to_owned());
        }
    }
    out
}

/// What a Descriptor is checked against.
#[derive(Clone, Copy, Debug, Default)]
pub struct DescriptorContext<'a> {
    /// The Card of the Connector.
    pub card: Option<&'a CardFacts>,
    /// The channel the Descriptor must describe.
    pub channel: Option<&'a str>,
}

impl<'a> DescriptorContext<'a> {
    /// A context with a Card.
    pub fn with_card(card: &'a CardFacts) -> Self {
        Self { card: Some(card), channel: None }
    }
}

/// What a packet is checked against.
#[derive(Clone, Copy, Debug, Default)]
pub struct PacketContext<'a> {
    /// The Card of the Connector, for cross-checks (Profiles, Tools, flows, hello identity).
    pub card: Option<&'a CardFacts>,
    /// Who sent the packet, when known (direction-dependent rules need it).
    pub sender: Option<Side>,
}

impl<'a> PacketContext<'a> {
    /// A context with a Card.
    pub fn with_card(card: &'a CardFacts) -> Self {
        Self { card: Some(card), sender: None }
    }
}

/// The one side that may send a packet of this direction, or `None` when both may.
pub(crate) fn only_sender(direction: Direction) -> Option<Side> {
    match direction {
        Direction::XagentToConnector => Some(Side::Xagent),
        Direction::ConnectorToXagent => Some(Side::Connector),
        Direction::Both => None,
    }
}

/// Validates documents. Holds the secret scanner and the admission window it applies.
#[derive(Clone, Debug)]
pub struct Validator {
    pub(crate) scanner: SecretScanner,
    window: AdmissionWindow,
}

impl Default for Validator {
    fn default() -> Self {
        Self { scanner: SecretScanner::new(), window: AdmissionWindow::default() }
    }
}

/// Validates a Card with the default [`Validator`].
pub fn validate_card(card: &Value) -> Report {
    Validator::default().card(card)
}

/// Validates a Descriptor with the default [`Validator`].
pub fn validate_descriptor(descriptor: &Value, context: DescriptorContext<'_>) -> Report {
    Validator::default().descriptor(descriptor, context)
}

/// Validates a packet with the default [`Validator`].
pub fn validate_packet(packet: &Value, context: PacketContext<'_>) -> Report {
    Validator::default().packet(packet, context)
}

/// Validates a `SKILL.md` with the default [`Validator`].
pub fn validate_skill(skill: &str, card: &CardFacts) -> Report {
    Validator::default().skill(skill, card)
}

/// Validates a `/health` body with the default [`Validator`].
pub fn validate_health(health: &Value, card: &CardFacts) -> Report {
    Validator::default().health(health, card)
}

/// Validates a Base URL.
pub fn validate_base_url(url: &str) -> Report {
    let mut sink = Sink::default();
    base_url(&mut sink, url);
    sink.finish()
}

fn obj(value: Option<&Value>) -> Option<&Map<String, Value>> {
    value.and_then(Value::as_object)
}

fn non_empty_str(value: Option<&Value>) -> Option<&str> {
    value.and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn describe(value: Option<&Value>) -> &'static str {
    match value {
        None => "missing",
        Some(Value::Null) => "null",
        Some(Value::String(s)) if s.is_empty() => "empty",
        Some(Value::String(_)) => "a string",
        Some(Value::Bool(_)) => "a boolean",
        Some(Value::Number(_)) => "a number",
        Some(Value::Array(_)) => "an array",
        Some(Value::Object(_)) => "an object",
    }
}

/// Requires a non-empty string; returns it.
fn require_str<'v>(
    sink: &mut Sink,
    rule: &Rule,
    object: &'v Map<String, Value>,
    key: &str,
    path: &str,
) -> Option<&'v str> {
    let value = object.get(key);
    match non_empty_str(value) {
        Some(text) => Some(text),
        None => {
            sink.push(
                rule,
                child(path, key),
                format!("{key} must be a non-empty string, it is {}", describe(value)),
            );
            None
        }
    }
}

fn is_skill_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('-').all(|part| {
            !part.is_empty() && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// True when `name` is the primary Skill name of `card_id` or that plus `-<purpose>`.
pub fn skill_name_matches_card(name: &str, card_id: &str) -> bool {
    let primary = primary_skill_name(card_id);
    let primary = primary.as_str();
    name == primary
        || name
            .strip_prefix(primary)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(is_skill_name)
}

/// `[A-Za-z0-9_.-]{1,256}`.
pub fn is_valid_tool_id(tool_id: &str) -> bool {
    !tool_id.is_empty()
        && tool_id.len() <= xagent_protocol_types::TOOL_ID_MAX_LEN
        && tool_id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn has_key(value: &Value, key: &str) -> bool {
    match value {
        Value::Object(map) => map.iter().any(|(k, v)| k == key || has_key(v, key)),
        Value::Array(items) => items.iter().any(|item| has_key(item, key)),
        _ => false,
    }
}

fn find_key(value: &Value, key: &str, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let p = child(path, k);
                if k == key {
                    out.push(p.clone());
                }
                find_key(v, key, &p, out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                find_key(item, key, &index(path, i), out);
            }
        }
        _ => {}
    }
}

impl Validator {
    /// A validator with token-shape scanning and the default admission window.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses this secret scanner (e.g. one that knows the system API key).
    #[must_use]
    pub fn with_scanner(mut self, scanner: SecretScanner) -> Self {
        self.scanner = scanner;
        self
    }

    /// Uses this admission window for hello checks.
    #[must_use]
    pub fn with_window(mut self, window: AdmissionWindow) -> Self {
        self.window = window;
        self
    }

    fn scan(&self, sink: &mut Sink, rule: &Rule, value: &Value, base: &str, what: &str) {
        for leak in self.scanner.scan_value(value) {
            sink.push(
                rule,
                format!("{base}{}", leak.location),
                format!("{what} contains {}; remove it", leak.kind),
            );
        }
    }

    /// Validates a Connector Card.
    pub fn card(&self, card: &Value) -> Report {
        let mut sink = Sink::default();
        let Some(root) = card.as_object() else {
            sink.push(&DOCUMENT_NOT_OBJECT, "", "a Connector Card must be a JSON object");
            return sink.finish();
        };
        if root.get("schema").and_then(Value::as_str) != Some(CARD_SCHEMA_ID) {
            sink.push(&CARD_SCHEMA, "/schema", format!("schema must be \"{CARD_SCHEMA_ID}\""));
        }
        match root.get("protocol_version").and_then(Value::as_str).map(ProtocolVersion::parse) {
            Some(Ok(version)) if version == ProtocolVersion::CURRENT => {}
            _ => sink.push(
                &CARD_PROTOCOL_VERSION,
                "/protocol_version",
                format!(
                    "protocol_version must be declared as \"{}\"",
                    xagent_protocol_types::PROTOCOL_VERSION
                ),
            ),
        }
        match obj(root.get("build")) {
            None => sink.push(&CARD_BUILD, "/build", "build must be an object with build_time"),
            Some(build) => {
                match build.get("build_time").and_then(Value::as_str) {
                    None => sink.push(
                        &CARD_BUILD,
                        "/build/build_time",
                        "build.build_time is required (YYMMDDHHMM, UTC)",
                    ),
                    Some(time) if !is_build_time(time) => sink.push(
                        &CARD_BUILD_TIME_FORMAT,
                        "/build/build_time",
                        "build_time should be YYMMDDHHMM in UTC, e.g. 2607241200",
                    ),
                    Some(_) => {}
                }
                for key in ["version", "git_tag", "git_rev"] {
                    if build.get(key).is_some_and(|v| !v.is_string()) {
                        sink.push(
                            &CARD_BUILD,
                            child("/build", key),
                            format!("{key} must be a string"),
                        );
                    }
                }
            }
        }
        let card_id =
            require_str(&mut sink, &CARD_CONNECTOR_CARD_ID, root, "connector_card_id", "");
        let connector = obj(root.get("connector"));
        let empty = Map::new();
        let connector_or_empty = connector.unwrap_or(&empty);
        require_str(&mut sink, &CARD_CONNECTOR_NAME, connector_or_empty, "name", "/connector");
        require_str(
            &mut sink,
            &CARD_CONNECTOR_VERSION,
            connector_or_empty,
            "version",
            "/connector",
        );

        let mut profiles: Vec<&str> = Vec::new();
        let mut target_types: Vec<&str> = Vec::new();
        match obj(root.get("supports")) {
            None => sink.push(&CARD_SUPPORTS, "/supports", "supports must be an object"),
            Some(supports) => {
                target_types = self.target_types(&mut sink, supports);
                profiles = self.card_profiles(&mut sink, supports, &target_types);
                if let Some(mode) = supports.get("user_channel_mode")
                    && !matches!(mode.as_str(), Some("single" | "multiple"))
                {
                    sink.push(
                        &CARD_USER_CHANNEL_MODE,
                        "/supports/user_channel_mode",
                        "user_channel_mode must be \"single\" or \"multiple\"",
                    );
                }
                self.targets(&mut sink, supports);
            }
        }
        self.card_tools(&mut sink, root, card_id, &profiles, &target_types);
        self.auth_flows(&mut sink, root, &target_types);
        if let Some(level) = card.pointer("/security/trust_level")
            && !level.as_str().is_some_and(|l| TrustLevel::parse(l).is_known())
        {
            sink.push(
                &CARD_TRUST_LEVEL,
                "/security/trust_level",
                format!("trust_level must be one of {}", TrustLevel::KNOWN.join(", ")),
            );
        }
        let mut found = Vec::new();
        if has_key(card, "server_base_url") {
            find_key(card, "server_base_url", "", &mut found);
        }
        for path in found {
            sink.push(
                &CARD_SERVER_BASE_URL,
                path,
                "the Base URL belongs to the xAgent catalog; remove server_base_url from the Card",
            );
        }
        self.scan(&mut sink, &CARD_SECRET_LEAK, card, "", "the Card");
        sink.finish()
    }

    fn target_types<'v>(&self, sink: &mut Sink, supports: &'v Map<String, Value>) -> Vec<&'v str> {
        let mut out = Vec::new();
        let path = "/supports/target_types";
        match supports.get("target_types").and_then(Value::as_array) {
            Some(items) if !items.is_empty() => {
                for (i, item) in items.iter().enumerate() {
                    match item.as_str() {
                        Some(t) if out.contains(&t) => sink.push(
                            &CARD_TARGET_TYPES,
                            index(path, i),
                            format!("target type {t:?} is listed twice"),
                        ),
                        Some(t) => {
                            if !TargetType::parse(t).is_known() {
                                sink.push(
                                    &CARD_TARGET_TYPE_UNKNOWN,
                                    index(path, i),
                                    format!(
                                        "unknown target type {t:?}; use one of {}",
                                        TargetType::KNOWN.join(", ")
                                    ),
                                );
                            }
                            out.push(t);
                        }
                        None => sink.push(
                            &CARD_TARGET_TYPES,
                            index(path, i),
                            "target types are strings",
                        ),
                    }
                }
            }
            _ => sink.push(
                &CARD_TARGET_TYPES,
                path,
                "supports.target_types must be a non-empty array",
            ),
        }
        out
    }

    fn card_profiles<'v>(
        &self,
        sink: &mut Sink,
        supports: &'v Map<String, Value>,
        target_types: &[&str],
    ) -> Vec<&'v str> {
        let mut out = Vec::new();
        let path = "/supports/profiles";
        let Some(items) =
            supports.get("profiles").and_then(Value::as_array).filter(|a| !a.is_empty())
        else {
            sink.push(&CARD_PROFILES, path, "supports.profiles must be a non-empty array");
            return out;
        };
        for (i, item) in items.iter().enumerate() {
            let p = index(path, i);
            let Some(id) = non_empty_str(Some(item)) else {
                sink.push(&CARD_PROFILES, p, "Profile ids are non-empty strings");
                continue;
            };
            if out.contains(&id) {
                sink.push(&CARD_PROFILES, p, format!("Profile {id:?} is listed twice"));
                continue;
            }
            out.push(id);
            if catalog::is_im_profile(id)
                && out.iter().any(|o| *o != id && catalog::is_im_profile(o))
            {
                sink.push(
                    &CARD_IM_PROFILES_EXCLUSIVE,
                    p.clone(),
                    "declare one IM Profile: xagent.im.v2 for a current Connector, xagent.im.v1 for a legacy one, not both",
                );
            }
            match catalog::profile(id) {
                None => sink.push(
                    &CARD_PROFILE_UNKNOWN,
                    p,
                    format!("Profile {id:?} is not a standard Profile; xAgent may not support it"),
                ),
                Some(spec) => {
                    if !target_types.is_empty()
                        && !spec.target_types.iter().any(|t| target_types.contains(&t.as_str()))
                    {
                        let allowed: Vec<&str> =
                            spec.target_types.iter().map(|t| t.as_str()).collect();
                        sink.push(
                            &CARD_PROFILE_TARGET_TYPE,
                            p,
                            format!(
                                "Profile {id} is for target types {}; add one to supports.target_types or drop the Profile",
                                allowed.join(", ")
                            ),
                        );
                    }
                }
            }
        }
        out
    }

    fn targets(&self, sink: &mut Sink, supports: &Map<String, Value>) {
        let Some(targets) = supports.get("targets") else { return };
        let Some(items) = targets.as_array() else {
            sink.push(&CARD_TARGET_DECLARATION, "/supports/targets", "targets should be an array");
            return;
        };
        for (i, item) in items.iter().enumerate() {
            let p = index("/supports/targets", i);
            let empty = Map::new();
            let target = item.as_object().unwrap_or(&empty);
            for key in ["target_type", "provider", "label"] {
                if non_empty_str(target.get(key)).is_none() {
                    sink.push(
                        &CARD_TARGET_DECLARATION,
                        child(&p, key),
                        format!("a target should declare {key}"),
                    );
                }
            }
            if let Some(t) = target.get("target_type").and_then(Value::as_str)
                && !t.is_empty()
                && !TargetType::parse(t).is_known()
            {
                sink.push(
                    &CARD_TARGET_TYPE_UNKNOWN,
                    child(&p, "target_type"),
                    format!("unknown target type {t:?}"),
                );
            }
        }
    }

    fn card_tools(
        &self,
        sink: &mut Sink,
        root: &Map<String, Value>,
        card_id: Option<&str>,
        profiles: &[&str],
        target_types: &[&str],
    ) {
        let Some(tools) = root.get("tools") else { return };
        let Some(items) = tools.as_array() else {
            sink.push(&CARD_TOOL_ID, "/tools", "tools must be an array of Tool declarations");
            return;
        };
        let mut seen: Vec<&str> = Vec::new();
        let empty = Map::new();
        for (i, item) in items.iter().enumerate() {
            let p = index("/tools", i);
            let tool = item.as_object().unwrap_or(&empty);
            if let Some(id) = require_str(sink, &CARD_TOOL_ID, tool, "tool_id", &p) {
                if !is_valid_tool_id(id) {
                    sink.push(
                        &CARD_TOOL_ID_FORMAT,
                        child(&p, "tool_id"),
                        "tool_id is a model function name: at most 256 ASCII letters, digits, _, - or .",
                    );
                }
                if seen.contains(&id) {
                    sink.push(
                        &CARD_TOOL_ID_UNIQUE,
                        child(&p, "tool_id"),
                        format!("tool_id {id:?} is declared twice"),
                    );
                }
                seen.push(id);
            }
            if let Some(profile) = tool.get("profile") {
                match profile.as_str() {
                    Some(pr) if profiles.contains(&pr) => {}
                    _ => sink.push(
                        &CARD_TOOL_PROFILE,
                        child(&p, "profile"),
                        "the Tool's profile must be one of supports.profiles",
                    ),
                }
            }
            self.input_schema(sink, tool.get("input_schema"), &child(&p, "input_schema"));
            tool_texts(sink, tool, &p);
            let im_tool = match tool.get("profile").and_then(Value::as_str) {
                Some(profile) => catalog::is_im_profile(profile),
                None => !target_types.is_empty() && target_types.iter().all(|t| *t == "im"),
            };
            if im_tool && let Some(schema) = obj(tool.get("input_schema")) {
                for (at, name) in
                    crate::tool_schema::find_properties(schema, im::is_forbidden_tool_argument)
                {
                    let pointer =
                        at.split('/').skip(1).fold(child(&p, "input_schema"), |path, part| {
                            child(&child(&path, "properties"), part)
                        });
                    sink.push(
                        &CARD_IM_TOOL_TARGET_ARGUMENT,
                        pointer,
                        format!(
                            "argument {name:?} would let the model choose where the message goes or pass a platform credential; the channel routes the message (use an opaque reply_ref to answer one message)"
                        ),
                    );
                }
            }
            if let (Some(card_id), Some(related)) = (card_id, tool.get("related_skill_ids")) {
                let list = related.as_array().map(Vec::as_slice).unwrap_or_default();
                if !related.is_array() {
                    sink.push(
                        &CARD_TOOL_RELATED_SKILL,
                        child(&p, "related_skill_ids"),
                        "related_skill_ids must be an array of Skill names",
                    );
                }
                for (j, name) in list.iter().enumerate() {
                    if !name.as_str().is_some_and(|n| skill_name_matches_card(n, card_id)) {
                        sink.push(
                            &CARD_TOOL_RELATED_SKILL,
                            index(&child(&p, "related_skill_ids"), j),
                            format!(
                                "related Skill must be {} or {}-<purpose>",
                                primary_skill_name(card_id),
                                primary_skill_name(card_id)
                            ),
                        );
                    }
                }
            }
        }
    }

    fn input_schema(&self, sink: &mut Sink, schema: Option<&Value>, path: &str) {
        let Some(schema) =
            obj(schema).filter(|s| s.get("type").and_then(Value::as_str) == Some("object"))
        else {
            sink.push(
                &CARD_TOOL_INPUT_SCHEMA,
                path,
                "input_schema must be an object schema with \"type\": \"object\"; build it with the helper",
            );
            return;
        };
        let properties = obj(schema.get("properties"));
        let channel_ok = properties
            .and_then(|p| obj(p.get(CHANNEL_ARGUMENT)))
            .is_some_and(|c| c.get("type").and_then(Value::as_str) == Some("string"));
        if !channel_ok {
            sink.push(
                &CARD_TOOL_CHANNEL_ARGUMENT,
                child(&child(path, "properties"), CHANNEL_ARGUMENT),
                "input_schema must declare connector_channel_id with type string",
            );
        }
        let required = schema.get("required").and_then(Value::as_array);
        if !required.is_some_and(|r| r.iter().any(|v| v.as_str() == Some(CHANNEL_ARGUMENT))) {
            sink.push(
                &CARD_TOOL_CHANNEL_REQUIRED,
                child(path, "required"),
                "input_schema.required must contain connector_channel_id",
            );
        }
        if properties.is_some_and(|p| p.contains_key("connector_card_id")) {
            sink.push(
                &CARD_TOOL_CARD_ID_ARGUMENT,
                child(&child(path, "properties"), "connector_card_id"),
                "remove the connector_card_id argument: the Card is resolved from the channel",
            );
        } else if required
            .is_some_and(|r| r.iter().any(|v| v.as_str() == Some("connector_card_id")))
        {
            sink.push(
                &CARD_TOOL_CARD_ID_ARGUMENT,
                child(path, "required"),
                "remove connector_card_id from required: it is not a model argument",
            );
        }
    }

    fn auth_flows(&self, sink: &mut Sink, root: &Map<String, Value>, target_types: &[&str]) {
        let Some(flows) = root.get("auth_flows") else { return };
        let Some(items) = flows.as_array() else {
            sink.push(&CARD_AUTH_FLOW_REQUIRED, "/auth_flows", "auth_flows must be an array");
            return;
        };
        let mut flow_ids: Vec<&str> = Vec::new();
        let empty = Map::new();
        for (i, item) in items.iter().enumerate() {
            let p = index("/auth_flows", i);
            let flow = item.as_object().unwrap_or(&empty);
            for key in ["id", "target_type", "type", "title"] {
                let value = require_str(sink, &CARD_AUTH_FLOW_REQUIRED, flow, key, &p);
                if key == "id"
                    && let Some(id) = value
                {
                    if flow_ids.contains(&id) {
                        sink.push(
                            &CARD_AUTH_FLOW_ID_UNIQUE,
                            child(&p, "id"),
                            format!("auth flow id {id:?} is declared twice; auth.start could not tell them apart"),
                        );
                    }
                    flow_ids.push(id);
                }
            }
            let flow_type = flow.get("type").and_then(Value::as_str);
            if let Some(t) = flow_type.filter(|t| !t.is_empty())
                && !AuthFlowType::parse(t).is_known()
            {
                sink.push(
                    &CARD_AUTH_FLOW_TYPE,
                    child(&p, "type"),
                    format!("unknown flow type {t:?}; use qr_login or form"),
                );
            }
            if let Some(t) = non_empty_str(flow.get("target_type"))
                && !target_types.is_empty()
                && !target_types.contains(&t)
            {
                sink.push(
                    &CARD_AUTH_FLOW_TARGET_TYPE,
                    child(&p, "target_type"),
                    "the flow's target_type should be one of supports.target_types",
                );
            }
            let fields = flow.get("fields").and_then(Value::as_array);
            if flow_type == Some("form") && fields.is_none_or(|f| f.is_empty()) {
                sink.push(
                    &CARD_AUTH_FORM_FIELDS,
                    child(&p, "fields"),
                    "a form flow needs at least one field",
                );
            }
            let mut names: Vec<&str> = Vec::new();
            for (j, field) in fields.map(Vec::as_slice).unwrap_or_default().iter().enumerate() {
                let fp = index(&child(&p, "fields"), j);
                let field = field.as_object().unwrap_or(&empty);
                if let Some(name) = require_str(sink, &CARD_AUTH_FIELD_REQUIRED, field, "name", &fp)
                {
                    if names.contains(&name) {
                        sink.push(
                            &CARD_AUTH_FIELD_NAME_UNIQUE,
                            child(&fp, "name"),
                            format!("field name {name:?} is used twice in this flow"),
                        );
                    }
                    names.push(name);
                }
                require_str(sink, &CARD_AUTH_FIELD_REQUIRED, field, "label", &fp);
                let input = require_str(sink, &CARD_AUTH_FIELD_REQUIRED, field, "input_type", &fp);
                if let Some(input) = input
                    && !InputType::parse(input).is_known()
                {
                    sink.push(
                        &CARD_AUTH_FIELD_INPUT_TYPE,
                        child(&fp, "input_type"),
                        format!("unknown input_type {input:?}; use text or password"),
                    );
                }
                let secret = field.get("secret").and_then(Value::as_bool) == Some(true);
                let password = input == Some("password");
                if password && !secret {
                    sink.push(
                        &CARD_AUTH_FIELD_SECRET,
                        child(&fp, "secret"),
                        "a password field should set secret: true",
                    );
                }
                if (password || secret) && field.contains_key("default_value") {
                    sink.push(
                        &CARD_AUTH_FIELD_DEFAULT_SECRET,
                        child(&fp, "default_value"),
                        "a sensitive field must not have a default_value",
                    );
                }
            }
        }
    }

    /// Validates a Connection Descriptor (v2, or v1 which is normalised with a warning).
    pub fn descriptor(&self, descriptor: &Value, context: DescriptorContext<'_>) -> Report {
        let mut sink = Sink::default();
        self.descriptor_at(&mut sink, descriptor, "", context);
        sink.finish()
    }

    fn descriptor_at(
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

    fn descriptor_profiles(
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

    /// Validates a `SKILL.md`: its front-matter name against the Card, and a secret scan.
    /// Paths are `/front_matter/name` for the name and `/line/<n>` for body findings.
    pub fn skill(&self, skill: &str, card: &CardFacts) -> Report {
        let mut sink = Sink::default();
        if skill.starts_with(BYTE_ORDER_MARK) {
            sink.push(
                &SKILL_BYTE_ORDER_MARK,
                "/front_matter",
                "SKILL.md starts with a byte-order mark; readers skip it, but save the file as UTF-8 without one",
            );
        }
        match skill_front_matter_name(skill) {
            None => sink.push(
                &SKILL_FRONT_MATTER,
                "/front_matter",
                "SKILL.md must start with a --- front matter block containing name: <skill name>",
            ),
            Some(name) => {
                if !is_skill_name(&name) {
                    sink.push(
                        &SKILL_NAME_FORMAT,
                        "/front_matter/name",
                        "the Skill name must be lowercase hyphen-case (a-z, 0-9, single inner hyphens)",
                    );
                }
                if let Some(card_id) = &card.card_id
                    && !skill_name_matches_card(&name, card_id)
                {
                    let primary = primary_skill_name(card_id);
                    sink.push(
                        &SKILL_NAME_CARD,
                        "/front_matter/name",
                        format!("the Skill name must be {primary} or {primary}-<purpose>"),
                    );
                }
                // The Skill a Connector serves is its primary one: the Card's Tools can point
                // at no other (protocol 4.2 has no endpoint for a `-<purpose>` Skill).
                if card.card_id.as_deref().is_some_and(|id| primary_skill_name(id) == name.as_str())
                {
                    related_skills(&mut sink, card, Some(&name));
                }
            }
        }
        for found in model_text::wire_mentions(skill) {
            sink.push(
                &SKILL_WIRE_REFERENCE,
                format!("/line/{}", found.line),
                format!(
                    "the Skill names {}; the agent acts through the Connector's Tools (a file argument takes a file from the conversation), so name the Tool instead",
                    found.mention
                ),
            );
        }
        for leak in self.scanner.scan_text(skill) {
            let line = leak.location.split(':').next().unwrap_or("0").to_owned();
            sink.push(
                &SKILL_SECRET_LEAK,
                format!("/line/{line}"),
                format!("the Skill contains {}; remove it", leak.kind),
            );
        }
        sink.finish()
    }

    /// What the Card's `related_skill_ids` say when the Connector serves no Skill (`/skill.md`
    /// answers 204 or 404): each one names a Skill that cannot be fetched
    /// (`skill.related_skill_ids`). The served case is part of [`Validator::skill`].
    pub fn absent_skill(&self, card: &CardFacts) -> Report {
        let mut sink = Sink::default();
        related_skills(&mut sink, card, None);
        sink.finish()
    }

    /// Validates a `/health` body against the Card.
    pub fn health(&self, health: &Value, card: &CardFacts) -> Report {
        let mut sink = Sink::default();
        let Some(root) = health.as_object() else {
            sink.push(&DOCUMENT_NOT_OBJECT, "", "a health response must be a JSON object");
            return sink.finish();
        };
        if !root.get("status").is_some_and(Value::is_string) {
            sink.push(
                &HEALTH_STATUS,
                "/status",
                "status is a required string (\"ok\" when healthy)",
            );
        }
        if let (Some(id), Some(card_id)) = (root.get("connector_card_id"), &card.card_id)
            && id.as_str() != Some(card_id.as_str())
        {
            sink.push(
                &HEALTH_CARD_ID,
                "/connector_card_id",
                format!("connector_card_id must be {card_id:?}"),
            );
        }
        if root.get("protocol_version").and_then(Value::as_str) != card.protocol_version.as_deref()
        {
            sink.push(
                &HEALTH_PROTOCOL_VERSION,
                "/protocol_version",
                "protocol_version must equal the Card's",
            );
        }
        if root.get("build") != card.build.as_ref() {
            sink.push(&HEALTH_BUILD, "/build", "build must equal the Card's build exactly");
        }
        if let Some(version) = root.get("connector_card_version")
            && version.as_str() != card.connector_version.as_deref()
        {
            sink.push(
                    &HEALTH_CARD_VERSION,
                    "/connector_card_version",
                    "connector_card_version differs from the Card's connector.version: refetch the Card and Skill",
                );
        }
        sink.finish()
    }

    /// Validates a `connector.hello` payload against the Card (Connector-side admission).
    pub fn hello(&self, payload: &Value, card: &CardFacts) -> Report {
        let mut sink = Sink::default();
        self.hello_at(&mut sink, payload, "", Some(card));
        sink.finish()
    }

    /// Validates a `connector.hello.ack` payload against the Card and the window.
    pub fn hello_ack(&self, payload: &Value, card: &CardFacts) -> Report {
        let mut sink = Sink::default();
        self.hello_ack_at(&mut sink, payload, "", Some(card));
        sink.finish()
    }

    fn hello_at(&self, sink: &mut Sink, payload: &Value, base: &str, card: Option<&CardFacts>) {
        let Some(root) = payload.as_object() else { return };
        if let Some(id) = require_str(sink, &HELLO_CARD_ID, root, "connector_card_id", base)
            && let Some(card_id) = card.and_then(|c| c.card_id.as_deref())
            && id != card_id
        {
            sink.push(
                &HELLO_CARD_ID,
                child(base, "connector_card_id"),
                format!("connector_card_id must be {card_id:?}"),
            );
        }
        let version = root.get("protocol_version");
        if version.is_some_and(|v| !v.is_string())
            || self.window.admit_hello(version.and_then(Value::as_str)).is_err()
        {
            let shown = version.and_then(Value::as_str).unwrap_or("omitted, read as 1.0");
            sink.push(
                &HELLO_PROTOCOL_VERSION,
                child(base, "protocol_version"),
                format!("protocol_version {shown} is not admitted; send {}", self.window.current),
            );
        }
        match root.get("supported_profiles").and_then(Value::as_array) {
            Some(list) if list.iter().all(Value::is_string) => {
                if let Some(card) = card
                    && !card.profiles.is_empty()
                    && !list
                        .iter()
                        .filter_map(Value::as_str)
                        .any(|p| card.profiles.iter().any(|c| c == p))
                {
                    sink.push(
                        &HELLO_NO_SHARED_PROFILE,
                        child(base, "supported_profiles"),
                        "no supported Profile is declared by the Card: no Profile packet can flow",
                    );
                }
            }
            _ => sink.push(
                &HELLO_SUPPORTED_PROFILES,
                child(base, "supported_profiles"),
                "supported_profiles must be sent explicitly as an array of Profile ids",
            ),
        }
    }

    fn hello_ack_at(&self, sink: &mut Sink, payload: &Value, base: &str, card: Option<&CardFacts>) {
        let Some(root) = payload.as_object() else { return };
        if let Some(id) = require_str(sink, &HELLO_ACK_CARD_ID, root, "connector_card_id", base)
            && let Some(card_id) = card.and_then(|c| c.card_id.as_deref())
            && id != card_id
        {
            sink.push(
                &HELLO_ACK_CARD_ID,
                child(base, "connector_card_id"),
                format!("connector_card_id must be {card_id:?}"),
            );
        }
        require_str(sink, &HELLO_ACK_CONNECTOR_ID, root, "connector_id", base);
        let version = root.get("protocol_version").and_then(Value::as_str);
        let in_window = self.window.admit(version).is_ok();
        let equals_card = match card.and_then(|c| c.protocol_version.as_deref()) {
            Some(card_version) => version == Some(card_version),
            None => true,
        };
        if !in_window || !equals_card {
            sink.push(
                &HELLO_ACK_PROTOCOL_VERSION,
                child(base, "protocol_version"),
                format!(
                    "protocol_version must equal the Card's and lie in {}..={}",
                    self.window.minimum, self.window.current
                ),
            );
        }
    }

    /// Validates one data-plane packet: the envelope, the fields its type requires, its
    /// payload rules and a secret scan.
    pub fn packet(&self, packet: &Value, context: PacketContext<'_>) -> Report {
        let mut sink = Sink::default();
        let Some(root) = packet.as_object() else {
            sink.push(&DOCUMENT_NOT_OBJECT, "", "a packet must be a JSON object");
            return sink.finish();
        };
        if root.get("schema").and_then(Value::as_str) != Some(PACKET_SCHEMA_ID) {
            sink.push(&PACKET_SCHEMA, "/schema", format!("schema must be \"{PACKET_SCHEMA_ID}\""));
        }
        if non_empty_str(root.get("packet_id")).is_none() {
            sink.push(&PACKET_PACKET_ID, "/packet_id", "packet_id must be a non-empty string");
        }
        for key in ["request_id", "reply_to", "connector_channel_id"] {
            if root.get(key).is_some_and(|v| !v.is_string()) {
                sink.push(&PACKET_FIELD_TYPE, child("", key), format!("{key} must be a string"));
            }
        }
        match root.get("time") {
            None => sink.push(&PACKET_TIME, "/time", "time (Unix milliseconds) is recommended"),
            Some(time) if time.as_u64().is_none() => sink.push(
                &PACKET_FIELD_TYPE,
                "/time",
                "time must be a non-negative integer (Unix ms)",
            ),
            Some(_) => {}
        }
        let payload = root.get("payload").filter(|p| !p.is_null());
        if payload.is_some_and(|p| !p.is_object()) {
            sink.push(&PACKET_FIELD_TYPE, "/payload", "payload must be an object");
        }
        let error = root.get("error").filter(|e| !e.is_null());
        if let Some(error) = error {
            if non_empty_str(error.get("code")).is_none() {
                sink.push(
                    &PACKET_ERROR_CODE,
                    "/error/code",
                    "error must be an object with a non-empty string code",
                );
            }
            if error.get("message").is_some_and(|m| !m.is_string()) {
                sink.push(&PACKET_FIELD_TYPE, "/error/message", "error.message must be a string");
            }
        }
        let Some(packet_type) = non_empty_str(root.get("type")) else {
            sink.push(&PACKET_TYPE, "/type", "type must be a non-empty string");
            self.scan(&mut sink, &PACKET_SECRET_LEAK, packet, "", "the packet");
            return sink.finish();
        };
        let Some(spec) = PacketType::spec_of(packet_type) else {
            sink.push(
                &PACKET_TYPE_UNKNOWN,
                "/type",
                format!("packet type {packet_type:?} is not supported"),
            );
            self.scan(&mut sink, &PACKET_SECRET_LEAK, packet, "", "the packet");
            return sink.finish();
        };
        // A packet type only one side sends is judged as sent by that side.
        let context =
            PacketContext { sender: context.sender.or(only_sender(spec.direction)), ..context };
        let has_request_id = non_empty_str(root.get("request_id")).is_some();
        let is_request_or_ack = matches!(spec.role, Role::Request { .. } | Role::Ack { .. });
        if is_request_or_ack && spec.routing != Routing::Either && !has_request_id {
            sink.push(
                &PACKET_REQUEST_ID,
                "/request_id",
                format!("{packet_type} needs the request_id of its exchange"),
            );
        }
        if matches!(spec.role, Role::Ack { .. }) && non_empty_str(root.get("reply_to")).is_none() {
            sink.push(
                &PACKET_REPLY_TO,
                "/reply_to",
                "an ack should set reply_to to the request's packet_id",
            );
        }
        if spec.role == Role::MessageAck && non_empty_str(root.get("reply_to")).is_none() {
            sink.push(
                &CHAT_ACK_REPLY_TO,
                "/reply_to",
                "chat.message.ack must set reply_to to the message's packet_id",
            );
        }
        let channel = non_empty_str(root.get("connector_channel_id"));
        if spec.routing == Routing::Channel && channel.is_none() {
            sink.push(
                &PACKET_CHANNEL_REQUIRED,
                "/connector_channel_id",
                format!("{packet_type} is a user-level packet; set connector_channel_id"),
            );
        }
        if spec.payload_required && payload.is_none() {
            sink.push(
                &PACKET_PAYLOAD_REQUIRED,
                "/payload",
                format!("{packet_type} needs a payload object"),
            );
        }
        if packet_type == "error" && error.is_none() {
            sink.push(
                &PACKET_ERROR_REQUIRED,
                "/error",
                "an error packet carries an error object {code, message}",
            );
        }
        if let (Some(card), Some(profile)) = (context.card, catalog::owning_profile(packet_type))
            && !card.profiles.iter().any(|p| p == profile.id)
        {
            sink.push(
                &PACKET_PROFILE_NOT_DECLARED,
                "/type",
                format!(
                    "{packet_type} belongs to Profile {}, which the Card does not declare",
                    profile.id
                ),
            );
        }
        let before = sink.violations.iter().filter(|v| v.path.starts_with("/payload")).count();
        let body = payload.and_then(Value::as_object);
        let failed = error.is_some();
        if let Some(body) = body {
            self.payload_rules(&mut sink, packet_type, body, channel, context);
        } else if !failed && PacketType::ack_needs_payload_unless_error(packet_type) {
            sink.push(
                &PACKET_PAYLOAD_REQUIRED,
                "/payload",
                format!("{packet_type} without an error needs a payload"),
            );
        }
        let after = sink.violations.iter().filter(|v| v.path.starts_with("/payload")).count();
        let no_error_yet = !sink.violations.iter().any(|v| v.severity == Severity::Error);
        if after == before && no_error_yet {
            // Everything specific passed: let the typed model find what the rules do not name.
            if let Err(e) = <Packet as serde::Deserialize>::deserialize(packet) {
                sink.push(&PACKET_PAYLOAD_INVALID, "/payload", redact_quotes(&e.to_string()));
            }
        }
        // auth.start legitimately carries the user's form input: leave it out of the scan.
        if packet_type == "auth.start" {
            let mut copy = packet.clone();
            if let Some(p) = copy.get_mut("payload").and_then(Value::as_object_mut) {
                p.remove("input");
            }
            self.scan(&mut sink, &PACKET_SECRET_LEAK, &copy, "", "the packet");
        } else {
            self.scan(&mut sink, &PACKET_SECRET_LEAK, packet, "", "the packet");
        }
        sink.finish()
    }

    fn payload_rules(
        &self,
        sink: &mut Sink,
        packet_type: &str,
        body: &Map<String, Value>,
        channel: Option<&str>,
        context: PacketContext<'_>,
    ) {
        let payload = Value::Object(body.clone());
        let descriptor_context = DescriptorContext { card: context.card, channel };
        match packet_type {
            "connector.hello" => self.hello_at(sink, &payload, "/payload", context.card),
            "connector.hello.ack" => self.hello_ack_at(sink, &payload, "/payload", context.card),
            "channel.open.ack" => {
                match non_empty_str(body.get("connector_channel_id")) {
                    Some(c) if channel.is_none_or(|e| e == c) => {}
                    _ => sink.push(
                        &CHANNEL_OPEN_ACK_CHANNEL,
                        "/payload/connector_channel_id",
                        "payload.connector_channel_id is required and equals the envelope's",
                    ),
                }
                self.nested_descriptor(sink, body, true, descriptor_context);
            }
            "connection.descriptor.get.ack" | "connection.descriptor.push" => {
                self.nested_descriptor(sink, body, true, descriptor_context);
            }
            "channel.close.ack" | "auth.logout.ack" => {
                status(sink, body, &["ok"]);
                if packet_type == "auth.logout.ack" {
                    self.nested_descriptor(sink, body, false, descriptor_context);
                }
            }
            "auth.start.ack" | "auth.status.ack" => {
                let allowed: Vec<&str> = AuthStatus::KNOWN
                    .iter()
                    .copied()
                    .filter(|s| packet_type == "auth.status.ack" || *s != "unauthenticated")
                    .collect();
                status(sink, body, &allowed);
                self.nested_descriptor(sink, body, false, descriptor_context);
            }
            "auth.cancel.ack" => {
                status(sink, body, &["canceled", "ignored", "not_found"]);
                if let Some(s) = body.get("auth_status")
                    && !s.as_str().is_some_and(|s| AuthStatus::parse(s).is_known())
                {
                    sink.push(
                        &PACKET_STATUS,
                        "/payload/auth_status",
                        "auth_status must be an authentication status",
                    );
                }
                self.nested_descriptor(sink, body, false, descriptor_context);
            }
            "auth.start" => {
                if let Some(flow) = require_str(sink, &AUTH_FLOW_ID, body, "flow_id", "/payload")
                    && context.card.is_some_and(|c| !c.flow_ids.iter().any(|f| f == flow))
                {
                    sink.push(
                        &AUTH_FLOW_ID,
                        "/payload/flow_id",
                        format!("flow {flow:?} is not declared in the Card's auth_flows"),
                    );
                }
            }
            "auth.status" | "auth.cancel" => {
                require_str(sink, &AUTH_SESSION_ID, body, "auth_session_id", "/payload");
            }
            "tool.invoke" => {
                if let Some(tool) =
                    require_str(sink, &TOOL_INVOKE_TOOL_ID, body, "tool_id", "/payload")
                    && context.card.is_some_and(|c| !c.tool_ids.iter().any(|t| t == tool))
                {
                    sink.push(
                        &TOOL_INVOKE_TOOL_ID,
                        "/payload/tool_id",
                        format!("Tool {tool:?} is not declared in the Card"),
                    );
                }
                if body.get("arguments").is_some_and(|a| !a.is_object()) {
                    sink.push(
                        &TOOL_INVOKE_ARGUMENTS,
                        "/payload/arguments",
                        "arguments must be an object",
                    );
                }
            }
            "tool.progress.push" => {
                require_str(sink, &TOOL_PROGRESS_TOOL_ID, body, "tool_id", "/payload");
                if let Some(progress) = body.get("progress")
                    && !progress.as_f64().is_some_and(|p| (0.0..=1.0).contains(&p))
                {
                    sink.push(
                        &TOOL_PROGRESS_PROGRESS,
                        "/payload/progress",
                        "progress must be a number from 0 to 1",
                    );
                }
            }
            "message.push" => message_push(sink, body, context.card),
            "chat.message" => chat_message(sink, body, context.sender),
            "chat.message.delta" => walk(sink, |visit| {
                im::check_delta(
                    im::Field::of(body.get("message_id")),
                    body.get("sequence").and_then(Value::as_u64),
                    body.get("text").is_some_and(Value::is_string),
                    keys(body),
                    visit,
                )
            }),
            "chat.message.ack" => walk(sink, |visit| {
                im::check_ack(
                    im::Field::of(body.get("message_id")),
                    im::Field::of(body.get("status")),
                    im::Field::of(body.get("code")),
                    body.get("retryable").is_some_and(Value::is_boolean),
                    keys(body),
                    visit,
                )
            }),
            "chat.activity" => walk(sink, |visit| {
                im::check_activity(
                    im::Field::of(body.get("status")),
                    im::Field::of(body.get("tool_name")),
                    keys(body),
                    visit,
                )
            }),
            _ => {}
        }
    }

    fn nested_descriptor(
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

/// `card.tool_wire_reference`: the texts of one Tool the model reads (its `title` and
/// `description`, and every `title` and `description` string inside its `input_schema`), each
/// scanned by [`model_text::wire_mentions`].
fn tool_texts(sink: &mut Sink, tool: &Map<String, Value>, path: &str) {
    fn scan(sink: &mut Sink, text: &str, path: &str) {
        for found in model_text::wire_mentions(text) {
            sink.push(
                &CARD_TOOL_WIRE_REFERENCE,
                path,
                format!(
                    "the model reads this text and it names {}; describe what the Tool does for the user (a file argument is a file from the conversation), not the wire",
                    found.mention
                ),
            );
        }
    }
    fn walk(sink: &mut Sink, value: &Value, path: &str) {
        match value {
            Value::Object(map) => {
                for (key, sub) in map {
                    let here = child(path, key);
                    match sub {
                        Value::String(text) if key == "description" || key == "title" => {
                            scan(sink, text, &here)
                        }
                        _ => walk(sink, sub, &here),
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(sink, item, &index(path, i));
                }
            }
            _ => {}
        }
    }
    for key in ["title", "description"] {
        if let Some(text) = tool.get(key).and_then(Value::as_str) {
            scan(sink, text, &child(path, key));
        }
    }
    if let Some(schema) = tool.get("input_schema") {
        walk(sink, schema, &child(path, "input_schema"));
    }
}

fn status(sink: &mut Sink, body: &Map<String, Value>, allowed: &[&str]) {
    if !body.get("status").and_then(Value::as_str).is_some_and(|s| allowed.contains(&s)) {
        sink.push(
            &PACKET_STATUS,
            "/payload/status",
            format!("status must be one of {}", allowed.join(", ")),
        );
    }
}

/// `skill.related_skill_ids`: every `related_skill_ids` entry of the Card is the name of the
/// Skill the Connector serves (`served`), exactly; with none served, there is nothing to name.
fn related_skills(sink: &mut Sink, card: &CardFacts, served: Option<&str>) {
    for related in &card.related_skill_ids {
        if Some(related.as_str()) == served {
            continue;
        }
        let message = match served {
            Some(name) => format!(
                "a Card Tool relates Skill {related:?}, but the Connector serves {name:?}; name the served Skill exactly"
            ),
            None => format!(
                "a Card Tool relates Skill {related:?}, but the Connector serves no Skill; serve it at /skill.md or drop the reference"
            ),
        };
        let path = if served.is_some() { "/front_matter/name" } else { "" };
        sink.push(&SKILL_RELATED_SKILL_IDS, path, message);
    }
}

/// Records a break of one of the shared IM rules ([`im`]) as a violation with its pointer; a
/// break that holds for one sender only names it.
fn push_break(sink: &mut Sink, b: im::Break<'_>) -> ControlFlow<()> {
    let mut violation = b.rule.at(b.place.pointer(), b.hint);
    if let Some(side) = b.sender {
        violation.message.push_str(match side {
            Side::Connector => " (when the Connector sends it)",
            Side::Xagent => " (when xAgent sends it)",
        });
        violation.sender = Some(crate::report::side_name(side).to_owned());
    }
    sink.violations.push(violation);
    ControlFlow::Continue(())
}

/// Runs one of the shared IM rule walks, collecting every break.
fn walk(sink: &mut Sink, f: impl FnOnce(&mut im::Visit<'_>) -> ControlFlow<()>) {
    let mut visit = |b: im::Break<'_>| push_break(sink, b);
    let _ = f(&mut visit);
}

fn keys(body: &Map<String, Value>) -> impl Iterator<Item = &str> {
    body.keys().map(String::as_str)
}

fn message_push(sink: &mut Sink, body: &Map<String, Value>, card: Option<&CardFacts>) {
    let files = body.get("files").and_then(Value::as_array).map(Vec::as_slice);
    let member = |field: &str, key: &str| body.get(field).and_then(|f| f.get(key));
    let citations = im::PushCitations {
        reply_tool_id: im::Field::of(member("reply", "tool_id")),
        skill_name: im::Field::of(member("skill", "name")),
        skill_tool_ids: member("skill", "tool_ids")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|t| im::Field::of(Some(t))),
        activation_message: im::Field::of(body.get("activation_message")),
    };
    walk(sink, |visit| {
        im::check_push(
            |key| im::Field::of(body.get(key)),
            files,
            keys(body),
            citations,
            card,
            visit,
        )
    });
}

fn chat_message(sink: &mut Sink, body: &Map<String, Value>, sender: Option<Side>) {
    let message = im::MessageView {
        message_id: im::Field::of(body.get("message_id")),
        text: im::Field::of(body.get("text")),
        files: body.get("files").and_then(Value::as_array).map(Vec::as_slice),
        extra_keys: keys(body),
    };
    walk(sink, |visit| im::check_chat_message(message, sender, visit));
}

/// The UTF-8 byte-order mark a `SKILL.md` may start with.
const BYTE_ORDER_MARK: char = '\u{feff}';

/// The `name` of a `SKILL.md` front matter block, if there is one. The one reader of a Skill's
/// name: `xagent-connector check` and admission both call it, so they agree. A leading
/// byte-order mark is skipped (the texts say only "Markdown text"; tolerant on read, and
/// [`Validator::skill`] warns with `skill.byte_order_mark`).
pub fn skill_front_matter_name(skill: &str) -> Option<String> {
    let text = skill.strip_prefix(BYTE_ORDER_MARK).unwrap_or(skill);
    let mut lines = text.lines();
    if lines.next()?.trim_end() != "---" {
        return None;
    }
    for line in lines {
        let trimmed = line.trim_end();
        if trimmed == "---" {
            return None;
        }
        if let Some(value) = trimmed.strip_prefix("name:") {
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(value);
            return Some(value.to_owned()).filter(|v| !v.is_empty());
        }
    }
    None
}

fn is_build_time(text: &str) -> bool {
    let b = text.as_bytes();
    if b.len() != 10 || !b.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let two = |i: usize| u32::from(b[i] - b'0') * 10 + u32::from(b[i + 1] - b'0');
    (1..=12).contains(&two(2)) && (1..=31).contains(&two(4)) && two(6) < 24 && two(8) < 60
}

fn base_url(sink: &mut Sink, url: &str) {
    if url.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        sink.push(&BASE_URL_SYNTAX, "", "the Base URL must be an absolute URL without spaces");
        return;
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        sink.push(
            &BASE_URL_SYNTAX,
            "",
            "the Base URL must be absolute, e.g. https://connector.example",
        );
        return;
    };
    let scheme_ok = scheme.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        sink.push(&BASE_URL_SYNTAX, "", "the Base URL has an invalid scheme");
        return;
    }
    if !matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") {
        sink.push(&BASE_URL_SCHEME, "", "the Base URL scheme must be http or https");
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let host_port = match authority.rsplit_once('@') {
        Some((_, host)) => {
            sink.push(&BASE_URL_USERINFO, "", "the Base URL must not contain user:password@");
            host
        }
        None => authority,
    };
    let (host, port) =
        if let Some(v6) = host_port.strip_prefix('[') {
            match v6.split_once(']') {
                Some((addr, after)) => {
                    if addr.is_empty()
                        || !addr.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
                    {
                        sink.push(&BASE_URL_SYNTAX, "", "the Base URL has an invalid IPv6 host");
                    }
                    (addr, after.strip_prefix(':'))
                }
                None => {
                    sink.push(&BASE_URL_SYNTAX, "", "the Base URL has an unterminated IPv6 host");
                    return;
                }
            }
        } else {
            match host_port.rsplit_once(':') {
                Some((h, p)) => {
                    if !h.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'%')
                    }) {
                        sink.push(&BASE_URL_SYNTAX, "", "the Base URL host has invalid characters");
                    }
                    (h, Some(p))
                }
                None => {
                    if !host_port.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'%')
                    }) {
                        sink.push(&BASE_URL_SYNTAX, "", "the Base URL host has invalid characters");
                    }
                    (host_port, None)
                }
            }
        };
    if host.is_empty() {
        sink.push(&BASE_URL_HOST, "", "the Base URL must name a host");
    }
    if let Some(port) = port
        && !port.is_empty()
        && port.parse::<u16>().is_err()
    {
        sink.push(&BASE_URL_SYNTAX, "", "the Base URL port must be a number up to 65535");
    }
    if let Some(q) = tail.find('?') {
        let before_hash = tail.find('#').is_none_or(|h| q < h);
        if before_hash {
            sink.push(&BASE_URL_QUERY, "", "the Base URL must not contain a query (?...)");
        }
    }
    if tail.contains('#') {
        sink.push(&BASE_URL_FRAGMENT, "", "the Base URL must not contain a fragment (#...)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skill_names() {
        assert!(skill_name_matches_card("connector-im-wechat", "im.wechat"));
        assert!(skill_name_matches_card("connector-im-wechat-file", "im.wechat"));
        assert!(!skill_name_matches_card("connector-im-wechat-", "im.wechat"));
        assert!(!skill_name_matches_card("connector-im-wechatx", "im.wechat"));
        assert!(!skill_name_matches_card("im-connector-reply", "im.wechat"));
        assert!(skill_name_matches_card("connector-device-adb", "device.adb"));
    }

    #[test]
    fn front_matter() {
        assert_eq!(skill_front_matter_name("---\nname: a-b\n---\nbody").as_deref(), Some("a-b"));
        assert_eq!(skill_front_matter_name("---\nname: \"a\"\n---").as_deref(), Some("a"));
        assert_eq!(skill_front_matter_name("# no front matter"), None);
        assert_eq!(skill_front_matter_name("---\ntitle: x\n---\nname: y"), None);
    }

    #[test]
    fn base_urls() {
        for ok in [
            "https://connector.example",
            "http://127.0.0.1:8080/prefix/",
            "https://[::1]:9000",
            "HTTPS://Example.COM/a/b",
        ] {
            assert!(validate_base_url(ok).valid, "{ok}");
        }
    }

    #[test]
    fn build_times() {
        assert!(is_build_time("2607241200"));
        assert!(!is_build_time("2613241200"));
        assert!(!is_build_time("260724120"));
    }
}

/// Drops quoted text from a parser message, which could quote a secret.
fn redact_quotes(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut inside = false;
    for c in message.chars() {
        if c == '"' || c == '`' {
            if !inside {
                out.push_str("\"…\"");
            }
            inside = !inside;
        } else if !inside {
            out.push(c);
        }
    }
    out
}

/// The kinds of document `xagent-connector check` validates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DocumentKind {
    /// A Connector Card.
    Card,
    /// A Connection Descriptor.
    Descriptor,
    /// One data-plane packet.
    Packet,
    /// A `SKILL.md`.
    Skill,
}

/// Parses JSON text, or returns the report of a `document.not_json` violation.
pub fn parse_document(text: &str) -> Result<Value, Report> {
    serde_json::from_str(text).map_err(|e| {
        Report::new(vec![DOCUMENT_NOT_JSON.at(
            "",
            format!(
                "the input is not JSON (line {}, column {}); fix the syntax",
                e.line(),
                e.column()
            ),
        )])
    })
}

/// Checks a document given as text, optionally against a Card: the library form of
/// `xagent-connector check`. Non-JSON input yields `document.not_json`, a non-object
/// `document.not_object`.
pub fn check_text(kind: DocumentKind, text: &str, card: Option<&CardFacts>) -> Report {
    check_text_from(kind, text, card, None)
}

/// [`check_text`] for a packet sent by `sender` (`xagent-connector check packet --sender`):
/// the direction-dependent rules are applied for that sender. With `None`, a packet type only
/// one side sends is judged as sent by it, and one both sides send is judged for both (each
/// violation of a rule that holds for one sender only names it in `sender`). Other kinds of
/// document ignore `sender`.
pub fn check_text_from(
    kind: DocumentKind,
    text: &str,
    card: Option<&CardFacts>,
    sender: Option<Side>,
) -> Report {
    let validator = Validator::default();
    if kind == DocumentKind::Skill {
        let facts = card.cloned().unwrap_or_default();
        return validator.skill(text, &facts);
    }
    let value = match parse_document(text) {
        Ok(value) => value,
        Err(report) => return report,
    };
    match kind {
        DocumentKind::Card => validator.card(&value),
        DocumentKind::Descriptor => {
            validator.descriptor(&value, DescriptorContext { card, channel: None })
        }
        DocumentKind::Packet | DocumentKind::Skill => {
            validator.packet(&value, PacketContext { card, sender })
        }
    }
}
