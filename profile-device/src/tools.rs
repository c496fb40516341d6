//! Device Tool declarations: a category, a risk level, whether the Tool has side effects, and
//! bounded parameters that are checked before anything reaches the device.

use serde_json::{Map, Value, json};
use xagent_protocol_types::ToolId;
use xagent_protocol_validate::{argument_name_in, find_properties, with_connector_channel_id};

use crate::DeviceError;

/// The reserved routing argument every Tool schema carries; it is never a device selector.
pub use xagent_protocol_types::CHANNEL_ARGUMENT;

/// Parameter names that would let the model pick or address a device itself, or hand the
/// Connector a platform credential. The Connector owns these facts through the channel binding,
/// so a declaration using them is refused when the Connector is built. Names are compared
/// without case, `_` and `-` (`deviceId`, `device-id` and `DEVICE_ID` are all refused).
pub const FORBIDDEN_PARAMETER_NAMES: &[&str] = &[
    "serial",
    "serial_number",
    "device_serial",
    "adb_serial",
    "udid",
    "imei",
    "device_id",
    "device",
    "address",
    "device_address",
    "ip",
    "ip_address",
    "mac",
    "mac_address",
    "host",
    "hostname",
    "port",
    "account",
    "account_id",
    "platform_account",
    "username",
    "password",
    "token",
    "access_token",
    "api_key",
    "device_key",
    "secret",
];

/// True when `name` is one of the [`FORBIDDEN_PARAMETER_NAMES`] (ignoring case, `_` and `-`).
pub fn is_device_fact_name(name: &str) -> bool {
    argument_name_in(name, FORBIDDEN_PARAMETER_NAMES)
}

/// Refuses an input schema (as published in the Card) that lets the model supply a device
/// fact: any property at any depth (`properties`, `items`, `anyOf`/`oneOf`/`allOf`, `$defs`)
/// named like one of the [`FORBIDDEN_PARAMETER_NAMES`]. Used at build time for Tools whose
/// schema is generated from a type rather than declared with [`ParamRule`]s. The walk is the
/// validator's ([`find_properties`]), the one the IM Tool argument rule uses too.
pub fn check_input_schema(
    tool_id: &ToolId,
    schema: &Map<String, Value>,
) -> Result<(), DeviceError> {
    match find_properties(schema, is_device_fact_name).into_iter().next() {
        None => Ok(()),
        Some((path, _)) => Err(DeviceError::InvalidDeclaration(format!(
            "{tool_id}: parameter {path} would let the model supply a device fact \
             (serial, address, account); the channel binding decides the device"
        ))),
    }
}

/// What a Tool does to the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolCategory {
    /// Reads state: status, screenshots, sensors, accessible UI.
    Observation,
    /// Acts: taps, text input, app launch, device commands.
    Control,
    /// Moves files or media (screenshots, recordings, uploads) through the Transfer Plane.
    Media,
}

/// How much harm a wrong call can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RiskLevel {
    /// Harmless (reads, cosmetic actions).
    Low,
    /// Visible but reversible actions.
    Medium,
    /// Privacy, payment, accounts, security settings, destructive commands.
    High,
}

/// How the executor schedules a Tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effect {
    /// No side effect: may run concurrently with other observations.
    Observe,
    /// Side effect: runs alone on the channel, and a retry never repeats it.
    SideEffect,
}

/// The accepted values of one parameter.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ParamKind {
    /// An integer in `min..=max`.
    Integer {
        /// Smallest allowed value.
        min: i64,
        /// Largest allowed value.
        max: i64,
    },
    /// A number in `min..=max`.
    Number {
        /// Smallest allowed value.
        min: f64,
        /// Largest allowed value.
        max: f64,
    },
    /// A string of at most `max_len` characters, optionally from a fixed set.
    String {
        /// Maximum length in characters (always bounded: no unconstrained commands).
        max_len: usize,
        /// Allowed values, if the parameter is an enumeration.
        one_of: Option<Vec<String>>,
    },
    /// A Boolean.
    Boolean,
    /// A single scalar whose type the device decides at call time (a string of at most
    /// `max_len` characters, a finite number or a Boolean); the Connector checks it against
    /// the device's own description before anything is sent.
    Scalar {
        /// Maximum length of a string value in characters.
        max_len: usize,
    },
}

/// One declared parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamRule {
    /// Argument name.
    pub name: String,
    /// Accepted values.
    pub kind: ParamKind,
    /// Whether it must be present.
    pub required: bool,
    /// Text for the model.
    pub description: Option<String>,
}

impl ParamRule {
    /// A required parameter.
    pub fn required(name: impl Into<String>, kind: ParamKind) -> Self {
        Self { name: name.into(), kind, required: true, description: None }
    }

    /// An optional parameter.
    pub fn optional(name: impl Into<String>, kind: ParamKind) -> Self {
        Self { name: name.into(), kind, required: false, description: None }
    }

    /// Sets the description.
    #[must_use]
    pub fn describe(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }

    fn check(&self, value: &Value) -> Result<(), DeviceError> {
        let bad =
            |problem: String| DeviceError::InvalidArguments { name: self.name.clone(), problem };
        match &self.kind {
            ParamKind::Integer { min, max } => {
                let Some(v) = value.as_i64() else {
                    return Err(bad(format!("expected an integer in {min}..={max}")));
                };
                if v < *min || v > *max {
                    return Err(bad(format!("{v} is outside {min}..={max}")));
                }
            }
            ParamKind::Number { min, max } => {
                let Some(v) = value.as_f64() else {
                    return Err(bad(format!("expected a number in {min}..={max}")));
                };
                if !v.is_finite() || v < *min || v > *max {
                    return Err(bad(format!("{v} is outside {min}..={max}")));
                }
            }
            ParamKind::String { max_len, one_of } => {
                let Some(v) = value.as_str() else {
                    return Err(bad("expected a string".into()));
                };
                let len = v.chars().count();
                if len > *max_len {
                    return Err(bad(format!("{len} characters, at most {max_len} allowed")));
                }
                if let Some(allowed) = one_of
                    && !allowed.iter().any(|a| a == v)
                {
                    return Err(bad(format!("must be one of {}", allowed.join(", "))));
                }
            }
            ParamKind::Boolean => {
                if !value.is_boolean() {
                    return Err(bad("expected true or false".into()));
                }
            }
            ParamKind::Scalar { max_len } => match value {
                Value::Bool(_) => {}
                Value::Number(n) => {
                    if !n.as_f64().is_some_and(f64::is_finite) {
                        return Err(bad("expected a finite number".into()));
                    }
                }
                Value::String(v) => {
                    let len = v.chars().count();
                    if len > *max_len {
                        return Err(bad(format!("{len} characters, at most {max_len} allowed")));
                    }
                }
                _ => return Err(bad("expected a string, a number or true/false".into())),
            },
        }
        Ok(())
    }

    fn schema(&self) -> Value {
        let mut s = match &self.kind {
            ParamKind::Integer { min, max } => {
                json!({"type": "integer", "minimum": min, "maximum": max})
            }
            ParamKind::Number { min, max } => {
                json!({"type": "number", "minimum": min, "maximum": max})
            }
            ParamKind::String { max_len, one_of } => {
                let mut s = json!({"type": "string", "maxLength": max_len});
                if let Some(values) = one_of {
                    s["enum"] = json!(values);
                }
                s
            }
            ParamKind::Boolean => json!({"type": "boolean"}),
            ParamKind::Scalar { max_len } => json!({"anyOf": [
                {"type": "string", "maxLength": max_len},
                {"type": "number"},
                {"type": "boolean"},
            ]}),
        };
        if let Some(d) = &self.description {
            s["description"] = json!(d);
        }
        s
    }
}

/// A device Tool declaration.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceTool {
    /// The Tool id (as in the Card).
    pub tool_id: ToolId,
    /// Category.
    pub category: ToolCategory,
    /// Risk level.
    pub risk: RiskLevel,
    /// Scheduling class (defaults from the category: control is a side effect; observation and
    /// media retrieval are observations).
    pub effect: Effect,
    /// Parameters; anything else except `connector_channel_id` is refused.
    pub params: Vec<ParamRule>,
    /// True when the arguments are checked against the Tool's input schema by the runtime
    /// (a Tool declared from its schema, [`DeviceTool::from_schema`]); `params` is then empty
    /// and [`DeviceTool::validate_arguments`] leaves the check to the schema.
    pub schema_checked: bool,
}

impl DeviceTool {
    /// Declares a Tool. Refuses parameters that would let the model choose the device
    /// ([`FORBIDDEN_PARAMETER_NAMES`]), a parameter named `connector_channel_id`, duplicate
    /// names, empty ranges, and a high-risk Tool declared as an observation.
    pub fn new(
        tool_id: impl Into<ToolId>,
        category: ToolCategory,
        risk: RiskLevel,
        params: Vec<ParamRule>,
    ) -> Result<Self, DeviceError> {
        let tool_id = tool_id.into();
        let effect = match category {
            ToolCategory::Control => Effect::SideEffect,
            ToolCategory::Observation | ToolCategory::Media => Effect::Observe,
        };
        let mut names = std::collections::HashSet::new();
        for p in &params {
            if is_device_fact_name(&p.name) {
                return Err(DeviceError::InvalidDeclaration(format!(
                    "{tool_id}: parameter {} would let the model address a device; the channel binding decides the device",
                    p.name
                )));
            }
            if p.name == CHANNEL_ARGUMENT || !names.insert(p.name.clone()) {
                return Err(DeviceError::InvalidDeclaration(format!(
                    "{tool_id}: parameter {} is reserved or declared twice",
                    p.name
                )));
            }
            let empty = match &p.kind {
                ParamKind::Integer { min, max } => min > max,
                ParamKind::Number { min, max } => !min.is_finite() || !max.is_finite() || min > max,
                ParamKind::String { one_of: Some(v), .. } => v.is_empty(),
                _ => false,
            };
            if empty {
                return Err(DeviceError::InvalidDeclaration(format!(
                    "{tool_id}: parameter {} accepts no value",
                    p.name
                )));
            }
        }
        Ok(Self { tool_id, category, risk, effect, params, schema_checked: false })
    }

    /// Declares a Tool whose arguments are described by an input schema (generated from a
    /// type) and checked against it by the runtime. The schema is refused when it lets the
    /// model supply a device fact ([`check_input_schema`]).
    pub fn from_schema(
        tool_id: impl Into<ToolId>,
        category: ToolCategory,
        risk: RiskLevel,
        input_schema: &Map<String, Value>,
    ) -> Result<Self, DeviceError> {
        let tool_id = tool_id.into();
        check_input_schema(&tool_id, input_schema)?;
        let mut tool = Self::new(tool_id, category, risk, Vec::new())?;
        tool.schema_checked = true;
        Ok(tool)
    }

    /// Overrides the scheduling class (e.g. a media upload to the device is a side effect).
    #[must_use]
    pub fn with_effect(mut self, effect: Effect) -> Self {
        self.effect = effect;
        self
    }

    /// Checks arguments: every required parameter present, every value in range, nothing
    /// undeclared (except the reserved `connector_channel_id`, which is ignored).
    pub fn validate_arguments(&self, arguments: &Map<String, Value>) -> Result<(), DeviceError> {
        if self.schema_checked {
            return Ok(());
        }
        for (name, value) in arguments {
            if name == CHANNEL_ARGUMENT {
                continue;
            }
            let Some(rule) = self.params.iter().find(|p| &p.name == name) else {
                return Err(DeviceError::InvalidArguments {
                    name: name.clone(),
                    problem: "not a parameter of this tool".into(),
                });
            };
            rule.check(value)?;
        }
        for rule in self.params.iter().filter(|p| p.required) {
            if !arguments.contains_key(&rule.name) {
                return Err(DeviceError::InvalidArguments {
                    name: rule.name.clone(),
                    problem: "required".into(),
                });
            }
        }
        Ok(())
    }

    /// The Card `input_schema` for this Tool: an object with the declared bounds and no other
    /// properties, with the reserved `connector_channel_id` added by the validator's helper
    /// ([`with_connector_channel_id`]) like every other Tool's.
    pub fn input_schema(&self) -> Map<String, Value> {
        let mut properties = Map::new();
        let mut required = Vec::new();
        for p in &self.params {
            properties.insert(p.name.clone(), p.schema());
            if p.required {
                required.push(json!(p.name));
            }
        }
        let mut schema = Map::new();
        schema.insert("type".into(), json!("object"));
        schema.insert("properties".into(), Value::Object(properties));
        schema.insert("required".into(), Value::Array(required));
        schema.insert("additionalProperties".into(), json!(false));
        // `new` refused a parameter named like the reserved argument, so the helper accepts
        // this object; fall back to the bare schema rather than panic if that ever changes.
        with_connector_channel_id(&schema).unwrap_or(schema)
    }
}

/// What to do with a high-risk Tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HighRiskPolicy {
    /// Run only with a confirmation (the default).
    #[default]
    RequireConfirmation,
    /// Never run.
    Refuse,
    /// Run like any other Tool.
    Allow,
}

/// Whether the user confirmed this call (how is up to the Connector: a prompt on the device,
/// an out-of-band approval, a [`crate::ConfirmationLedger`] grant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confirmation {
    /// No confirmation.
    None,
    /// Confirmed.
    Confirmed,
}

/// Checks a call against a declaration and the risk policy: arguments first, then risk.
pub fn check_call(
    tool: &DeviceTool,
    arguments: &Map<String, Value>,
    policy: HighRiskPolicy,
    confirmation: Confirmation,
) -> Result<(), DeviceError> {
    tool.validate_arguments(arguments)?;
    if tool.risk == RiskLevel::High {
        match (policy, confirmation) {
            (HighRiskPolicy::Refuse, _) => return Err(DeviceError::Refused(tool.tool_id.clone())),
            (HighRiskPolicy::RequireConfirmation, Confirmation::None) => {
                return Err(DeviceError::ConfirmationRequired(tool.tool_id.clone()));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::ErrorCode;

    fn tap() -> DeviceTool {
        DeviceTool::new(
            "device_tap",
            ToolCategory::Control,
            RiskLevel::Medium,
            vec![
                ParamRule::required("x", ParamKind::Integer { min: 0, max: 1079 }),
                ParamRule::required("y", ParamKind::Integer { min: 0, max: 2399 }),
                ParamRule::optional("long_press", ParamKind::Boolean),
            ],
        )
        .unwrap()
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn control_tool_accepts_in_range_arguments() {
        let t = tap();
        assert_eq!(t.effect, Effect::SideEffect);
        t.validate_arguments(&args(json!({"x": 0, "y": 2399, "connector_channel_id": "c"})))
            .unwrap();
    }

    #[test]
    fn rule_control_tool_validates_parameter_ranges() {
        let t = tap();
        for bad in [
            json!({"x": -1, "y": 5}),
            json!({"x": 1080, "y": 5}),
            json!({"x": 1.5, "y": 5}),
            json!({"x": "1", "y": 5}),
            json!({"x": 1}),
            json!({"x": 1, "y": 1, "long_press": "yes"}),
            json!({"x": 1, "y": 1, "command": "rm -rf /"}),
        ] {
            let err = t.validate_arguments(&args(bad.clone())).unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidArguments, "{bad}");
        }
        let text = DeviceTool::new(
            "device_type_text",
            ToolCategory::Control,
            RiskLevel::Medium,
            vec![ParamRule::required("text", ParamKind::String { max_len: 3, one_of: None })],
        )
        .unwrap();
        assert!(text.validate_arguments(&args(json!({"text": "abcd"}))).is_err());
        text.validate_arguments(&args(json!({"text": "añb"}))).unwrap();
        let key = DeviceTool::new(
            "device_key",
            ToolCategory::Control,
            RiskLevel::Low,
            vec![ParamRule::required(
                "key",
                ParamKind::String { max_len: 16, one_of: Some(vec!["home".into(), "back".into()]) },
            )],
        )
        .unwrap();
        assert!(key.validate_arguments(&args(json!({"key": "power"}))).is_err());
        let vol = DeviceTool::new(
            "device_volume",
            ToolCategory::Control,
            RiskLevel::Low,
            vec![ParamRule::required("level", ParamKind::Number { min: 0.0, max: 1.0 })],
        )
        .unwrap();
        assert!(vol.validate_arguments(&args(json!({"level": 1.01}))).is_err());
        vol.validate_arguments(&args(json!({"level": 0.5}))).unwrap();
        let set = DeviceTool::new(
            "device_set",
            ToolCategory::Control,
            RiskLevel::Low,
            vec![ParamRule::required("value", ParamKind::Scalar { max_len: 4 })],
        )
        .unwrap();
        for ok in [json!(1), json!(2.5), json!(true), json!("abcd")] {
            set.validate_arguments(&args(json!({ "value": ok }))).unwrap();
        }
        for bad in [json!("abcde"), json!(null), json!([1]), json!({"a": 1})] {
            assert!(set.validate_arguments(&args(json!({ "value": bad }))).is_err(), "{bad}");
        }
    }

    #[test]
    fn rule_model_cannot_choose_the_device() {
        for name in [
            "serial",
            "device_id",
            "IP",
            "host",
            "connector_channel_id",
            "deviceId",
            "Serial-Number",
        ] {
            let r = DeviceTool::new(
                "t",
                ToolCategory::Observation,
                RiskLevel::Low,
                vec![ParamRule::required(name, ParamKind::String { max_len: 10, one_of: None })],
            );
            assert!(matches!(r, Err(DeviceError::InvalidDeclaration(_))), "{name}");
        }
    }

    #[test]
    fn rule_device_facts_in_a_generated_schema_are_refused_at_build_time() {
        let tool = ToolId::new("t");
        let ok = json!({"type": "object", "properties": {"node": {"type": "string"}, "value": {}}});
        check_input_schema(&tool, ok.as_object().unwrap()).unwrap();
        for bad in [
            json!({"type": "object", "properties": {"serialNumber": {"type": "string"}}}),
            json!({"type": "object", "properties": {"target": {"type": "object",
                "properties": {"ip_address": {"type": "string"}}}}}),
            json!({"type": "object", "properties": {"list": {"type": "array",
                "items": {"type": "object", "properties": {"mac": {"type": "string"}}}}}}),
            json!({"type": "object", "oneOf": [{"properties": {"platform-account": {}}}]}),
            json!({"type": "object", "$defs": {"X": {"properties": {"device_key": {}}}}}),
        ] {
            let err = check_input_schema(&tool, bad.as_object().unwrap()).unwrap_err();
            assert!(matches!(err, DeviceError::InvalidDeclaration(_)), "{bad}");
        }
    }

    #[test]
    fn rule_schema_declared_tools_are_checked_for_device_facts() {
        let ok = json!({"type": "object", "properties": {"node": {"type": "string"}}});
        let t = DeviceTool::from_schema(
            "read",
            ToolCategory::Observation,
            RiskLevel::Low,
            ok.as_object().unwrap(),
        )
        .unwrap();
        assert!(t.schema_checked);
        t.validate_arguments(&args(json!({"node": "x"}))).unwrap();
        let bad = json!({"type": "object", "properties": {"serial": {"type": "string"}}});
        let err = DeviceTool::from_schema(
            "read",
            ToolCategory::Observation,
            RiskLevel::Low,
            bad.as_object().unwrap(),
        )
        .unwrap_err();
        assert!(matches!(err, DeviceError::InvalidDeclaration(_)));
    }

    #[test]
    fn rule_empty_parameter_ranges_are_refused() {
        let r = DeviceTool::new(
            "t",
            ToolCategory::Control,
            RiskLevel::Low,
            vec![ParamRule::required("x", ParamKind::Integer { min: 5, max: 1 })],
        );
        assert!(r.is_err());
    }

    #[test]
    fn rule_high_risk_needs_confirmation_or_is_refused() {
        let t = DeviceTool::new("factory_reset", ToolCategory::Control, RiskLevel::High, vec![])
            .unwrap();
        let none = Map::new();
        let err = check_call(&t, &none, HighRiskPolicy::RequireConfirmation, Confirmation::None)
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ConfirmationRequired);
        check_call(&t, &none, HighRiskPolicy::RequireConfirmation, Confirmation::Confirmed)
            .unwrap();
        let err =
            check_call(&t, &none, HighRiskPolicy::Refuse, Confirmation::Confirmed).unwrap_err();
        assert_eq!(err.code(), ErrorCode::PermissionDenied);
        check_call(&t, &none, HighRiskPolicy::Allow, Confirmation::None).unwrap();
        // Low risk never needs it.
        check_call(
            &tap(),
            &args(json!({"x": 1, "y": 1})),
            HighRiskPolicy::Refuse,
            Confirmation::None,
        )
        .unwrap();
    }

    #[test]
    fn input_schema_carries_channel_and_bounds() {
        let s = Value::Object(tap().input_schema());
        assert_eq!(s["properties"]["x"]["maximum"], 1079);
        assert_eq!(s["required"], json!(["connector_channel_id", "x", "y"]));
        assert_eq!(s["additionalProperties"], false);
    }
}
