//! The Connector Card: identity, `supports`, targets and auth flows.

use serde_json::{Map, Value};
use xagent_protocol_types::{
    AuthFlowType, CARD_SCHEMA as CARD_SCHEMA_ID, InputType, TargetType, TrustLevel,
};

use super::json::*;
use super::validator::Validator;
use crate::catalog;
use crate::report::{Report, Sink, child, index};
use crate::rules::*;
use crate::version::ProtocolVersion;

impl Validator {
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

    pub(super) fn target_types<'v>(
        &self,
        sink: &mut Sink,
        supports: &'v Map<String, Value>,
    ) -> Vec<&'v str> {
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

    pub(super) fn card_profiles<'v>(
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

    pub(super) fn targets(&self, sink: &mut Sink, supports: &Map<String, Value>) {
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

    pub(super) fn auth_flows(
        &self,
        sink: &mut Sink,
        root: &Map<String, Value>,
        target_types: &[&str],
    ) {
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
}
