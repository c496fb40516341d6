//! The Homie v4 device model: identifiers, device states, property datatypes and formats, and
//! the checks that turn a model-supplied JSON value into a payload the device accepts (or
//! refuse it before anything is published).
//!
//! Everything here reads what a device published about itself; nothing is specific to the
//! simulated device.

use std::fmt;

use serde_json::{Value, json};

/// Longest Homie id (device, node or property) this Connector accepts. The convention sets no
/// limit; topics built from ids must stay bounded.
pub const MAX_ID_LEN: usize = 64;

/// Longest string value the Connector sends to a device in one `/set`.
pub const MAX_SET_STRING_LEN: usize = 1024;

/// Why a Homie id is not acceptable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a Homie id: use 1 to 64 characters a-z, 0-9 and '-', not starting with '-'")]
pub struct BadId(pub String);

/// Checks a Homie id (device, node or property): lower-case ASCII letters, digits and hyphens,
/// not starting with a hyphen, at most [`MAX_ID_LEN`] characters. Ids become MQTT topic levels,
/// so this also keeps `/`, `+`, `#` and `$` out of every topic the Connector builds.
pub fn check_id(id: &str) -> Result<(), BadId> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && !id.starts_with('-')
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok { Ok(()) } else { Err(BadId(id.chars().take(MAX_ID_LEN + 1).collect())) }
}

/// A device's `$state`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DeviceState {
    /// Connected, publishing its description, not ready yet.
    Init,
    /// Connected and operational.
    Ready,
    /// Cleanly disconnected.
    Disconnected,
    /// Asleep; does not process commands.
    Sleeping,
    /// Gone without a clean disconnect (the broker published the device's last will).
    Lost,
    /// Connected but asks for human attention; still takes commands.
    Alert,
    /// A value the convention does not define (kept as sent).
    Other(String),
}

impl DeviceState {
    /// Reads a `$state` payload.
    pub fn parse(payload: &str) -> Self {
        match payload {
            "init" => Self::Init,
            "ready" => Self::Ready,
            "disconnected" => Self::Disconnected,
            "sleeping" => Self::Sleeping,
            "lost" => Self::Lost,
            "alert" => Self::Alert,
            other => Self::Other(other.chars().take(32).collect()),
        }
    }

    /// The payload.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Init => "init",
            Self::Ready => "ready",
            Self::Disconnected => "disconnected",
            Self::Sleeping => "sleeping",
            Self::Lost => "lost",
            Self::Alert => "alert",
            Self::Other(s) => s,
        }
    }

    /// True when the device takes commands (`ready`, or `alert`, which is still connected).
    pub fn is_operational(&self) -> bool {
        matches!(self, Self::Ready | Self::Alert)
    }
}

impl fmt::Display for DeviceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A property's `$datatype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Datatype {
    /// 64-bit signed integer.
    Integer,
    /// 64-bit float.
    Float,
    /// `true` / `false`.
    Boolean,
    /// UTF-8 text.
    String,
    /// One of the values listed in `$format`.
    Enum,
    /// `r,g,b` or `h,s,v` as `$format` says.
    Color,
    /// ISO 8601 date and time.
    Datetime,
    /// ISO 8601 duration.
    Duration,
}

impl Datatype {
    /// Reads a `$datatype` payload; `None` for an unknown datatype.
    pub fn parse(payload: &str) -> Option<Self> {
        Some(match payload {
            "integer" => Self::Integer,
            "float" => Self::Float,
            "boolean" => Self::Boolean,
            "string" => Self::String,
            "enum" => Self::Enum,
            "color" => Self::Color,
            "datetime" => Self::Datetime,
            "duration" => Self::Duration,
            _ => return None,
        })
    }

    /// The payload.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Integer => "integer",
            Self::Float => "float",
            Self::Boolean => "boolean",
            Self::String => "string",
            Self::Enum => "enum",
            Self::Color => "color",
            Self::Datetime => "datetime",
            Self::Duration => "duration",
        }
    }
}

/// The colour model of a `color` property.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColorModel {
    /// Red, green, blue, each 0-255.
    Rgb,
    /// Hue 0-360, saturation and value 0-100.
    Hsv,
}

/// A property's `$format`, read for its datatype.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    /// No format (or one that does not apply to the datatype).
    None,
    /// An integer range `from:to` (either end may be open).
    IntRange {
        /// Lowest allowed value.
        min: Option<i64>,
        /// Highest allowed value.
        max: Option<i64>,
    },
    /// A float range `from:to` (either end may be open).
    FloatRange {
        /// Lowest allowed value.
        min: Option<f64>,
        /// Highest allowed value.
        max: Option<f64>,
    },
    /// The allowed values of an `enum`.
    Enum(Vec<String>),
    /// The model of a `color`.
    Color(ColorModel),
}

/// Why a `$format` could not be read for its datatype.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("$format {format:?} does not fit datatype {datatype}: {problem}")]
pub struct BadFormat {
    /// The datatype.
    pub datatype: &'static str,
    /// The format as published (shortened).
    pub format: String,
    /// What is wrong.
    pub problem: &'static str,
}

impl Format {
    /// Reads a `$format` for a datatype. `enum` and `color` need one; for numbers it is an
    /// optional range; other datatypes ignore it.
    pub fn parse(datatype: Datatype, format: Option<&str>) -> Result<Self, BadFormat> {
        let bad = |problem| BadFormat {
            datatype: datatype.as_str(),
            format: format.unwrap_or("").chars().take(64).collect(),
            problem,
        };
        match (datatype, format.map(str::trim)) {
            (Datatype::Integer, Some(f)) if !f.is_empty() => {
                let (a, b) = f.split_once(':').ok_or_else(|| bad("expected from:to"))?;
                let end = |s: &str| -> Result<Option<i64>, BadFormat> {
                    if s.is_empty() {
                        Ok(None)
                    } else {
                        s.parse().map(Some).map_err(|_| bad("not an integer"))
                    }
                };
                let (min, max) = (end(a)?, end(b)?);
                if let (Some(lo), Some(hi)) = (min, max)
                    && lo > hi
                {
                    return Err(bad("empty range"));
                }
                Ok(Self::IntRange { min, max })
            }
            (Datatype::Float, Some(f)) if !f.is_empty() => {
                let (a, b) = f.split_once(':').ok_or_else(|| bad("expected from:to"))?;
                let end = |s: &str| -> Result<Option<f64>, BadFormat> {
                    if s.is_empty() {
                        return Ok(None);
                    }
                    match s.parse::<f64>() {
                        Ok(v) if v.is_finite() => Ok(Some(v)),
                        _ => Err(bad("not a finite number")),
                    }
                };
                let (min, max) = (end(a)?, end(b)?);
                if let (Some(lo), Some(hi)) = (min, max)
                    && lo > hi
                {
                    return Err(bad("empty range"));
                }
                Ok(Self::FloatRange { min, max })
            }
            (Datatype::Enum, Some(f)) => {
                let values: Vec<String> = f
                    .split(',')
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned)
                    .collect();
                if values.is_empty() {
                    return Err(bad("an enum needs at least one value"));
                }
                Ok(Self::Enum(values))
            }
            (Datatype::Enum, None) => Err(bad("an enum needs a $format listing its values")),
            (Datatype::Color, Some("rgb")) => Ok(Self::Color(ColorModel::Rgb)),
            (Datatype::Color, Some("hsv")) => Ok(Self::Color(ColorModel::Hsv)),
            (Datatype::Color, _) => Err(bad("a color needs $format rgb or hsv")),
            _ => Ok(Self::None),
        }
    }

    /// The format as the describe Tool shows it, if any.
    pub fn to_json(&self) -> Option<Value> {
        match self {
            Self::None => None,
            Self::IntRange { min, max } => Some(json!({"min": min, "max": max})),
            Self::FloatRange { min, max } => Some(json!({"min": min, "max": max})),
            Self::Enum(values) => Some(json!({"values": values})),
            Self::Color(ColorModel::Rgb) => Some(json!({"color": "rgb"})),
            Self::Color(ColorModel::Hsv) => Some(json!({"color": "hsv"})),
        }
    }
}

/// What a property is, as the device described it.
#[derive(Clone, Debug, PartialEq)]
pub struct PropertySpec {
    /// `$name` (or the id when absent).
    pub name: String,
    /// `$datatype`.
    pub datatype: Datatype,
    /// `$format`, read for the datatype.
    pub format: Format,
    /// `$format` as the device published it (what a [`crate::pin::Pinned`] description keeps).
    pub format_text: Option<String>,
    /// `$settable` (default false).
    pub settable: bool,
    /// `$retained` (default true).
    pub retained: bool,
    /// `$unit`, if any.
    pub unit: Option<String>,
}

/// Why a value cannot be set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadValue(pub String);

fn fmt_range<T: fmt::Display>(min: &Option<T>, max: &Option<T>) -> String {
    match (min, max) {
        (Some(a), Some(b)) => format!("{a}..={b}"),
        (Some(a), None) => format!(">= {a}"),
        (None, Some(b)) => format!("<= {b}"),
        (None, None) => "any value".into(),
    }
}

fn check_color(model: ColorModel, text: &str) -> Result<[f64; 3], BadValue> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    let bounds = match model {
        ColorModel::Rgb => [255.0, 255.0, 255.0],
        ColorModel::Hsv => [360.0, 100.0, 100.0],
    };
    let want = match model {
        ColorModel::Rgb => "r,g,b with each 0-255",
        ColorModel::Hsv => "h,s,v with h 0-360, s and v 0-100",
    };
    if parts.len() != 3 {
        return Err(BadValue(format!("expected {want}")));
    }
    let mut out = [0.0; 3];
    for (i, part) in parts.iter().enumerate() {
        let v: u32 = part.parse().map_err(|_| BadValue(format!("expected {want}")))?;
        if f64::from(v) > bounds[i] {
            return Err(BadValue(format!("expected {want}")));
        }
        out[i] = f64::from(v);
    }
    Ok(out)
}

fn check_iso_text(text: &str, what: &str, duration: bool) -> Result<(), BadValue> {
    let ok = !text.is_empty()
        && text.len() <= 64
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"-:.+,".contains(&b))
        && (!duration || text.starts_with('P'));
    if ok { Ok(()) } else { Err(BadValue(format!("expected an ISO 8601 {what}"))) }
}

/// Formats a float payload so it always reads as a float (`22.0`, not `22`).
fn float_payload(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 { format!("{v:.1}") } else { format!("{v}") }
}

impl PropertySpec {
    /// Checks a model-supplied value against `$datatype` and `$format` and returns the payload
    /// to publish on the property's `/set` topic. Refuses a property that is not settable.
    pub fn payload_for(&self, value: &Value) -> Result<String, BadValue> {
        if !self.settable {
            return Err(BadValue("this property is read-only ($settable is not true)".into()));
        }
        let expected =
            |what: &str| BadValue(format!("expected {what} (datatype {})", self.datatype.as_str()));
        match self.datatype {
            Datatype::Integer => {
                let v = match value {
                    Value::Number(n) => n.as_i64().or_else(|| {
                        n.as_f64()
                            .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                            .map(|f| f as i64)
                    }),
                    _ => None,
                }
                .ok_or_else(|| expected("an integer"))?;
                if let Format::IntRange { min, max } = &self.format
                    && (min.is_some_and(|m| v < m) || max.is_some_and(|m| v > m))
                {
                    return Err(BadValue(format!("{v} is outside {}", fmt_range(min, max))));
                }
                Ok(v.to_string())
            }
            Datatype::Float => {
                let v =
                    value.as_f64().filter(|f| f.is_finite()).ok_or_else(|| expected("a number"))?;
                if let Format::FloatRange { min, max } = &self.format
                    && (min.is_some_and(|m| v < m) || max.is_some_and(|m| v > m))
                {
                    return Err(BadValue(format!("{v} is outside {}", fmt_range(min, max))));
                }
                Ok(float_payload(v))
            }
            Datatype::Boolean => {
                value.as_bool().map(|b| b.to_string()).ok_or_else(|| expected("true or false"))
            }
            Datatype::String => {
                let s = value.as_str().ok_or_else(|| expected("a string"))?;
                if s.chars().count() > MAX_SET_STRING_LEN {
                    return Err(BadValue(format!("at most {MAX_SET_STRING_LEN} characters")));
                }
                Ok(s.to_owned())
            }
            Datatype::Enum => {
                let s = value.as_str().ok_or_else(|| expected("one of the enum values"))?;
                match &self.format {
                    Format::Enum(values) if values.iter().any(|v| v == s) => Ok(s.to_owned()),
                    Format::Enum(values) => {
                        Err(BadValue(format!("must be one of: {}", values.join(", "))))
                    }
                    _ => Err(BadValue("the device did not list the enum values".into())),
                }
            }
            Datatype::Color => {
                let s = value.as_str().ok_or_else(|| expected("a colour string"))?;
                let Format::Color(model) = self.format else {
                    return Err(BadValue("the device did not say rgb or hsv".into()));
                };
                check_color(model, s)?;
                Ok(s.split(',').map(str::trim).collect::<Vec<_>>().join(","))
            }
            Datatype::Datetime => {
                let s = value.as_str().ok_or_else(|| expected("a date-time string"))?;
                check_iso_text(s, "date-time", false)?;
                Ok(s.to_owned())
            }
            Datatype::Duration => {
                let s = value.as_str().ok_or_else(|| expected("a duration string"))?;
                check_iso_text(s, "duration", true)?;
                Ok(s.to_owned())
            }
        }
    }

    /// How `describe` shows this property: its id, name, datatype, settable and retained
    /// flags, format and unit when present, and `value` (typed) when one is known.
    pub fn describe(&self, property: &str, value: Option<&str>) -> Value {
        let mut v = json!({
            "property": property,
            "name": self.name,
            "datatype": self.datatype.as_str(),
            "settable": self.settable,
            "retained": self.retained,
        });
        if let Some(f) = self.format.to_json() {
            v["format"] = f;
        }
        if let Some(u) = &self.unit {
            v["unit"] = json!(u);
        }
        if let Some(value) = value {
            v["value"] = self.value_json(value);
        }
        v
    }

    /// The JSON form of a value payload the device published: numbers and Booleans typed,
    /// everything else (and anything malformed) as the text sent.
    pub fn value_json(&self, payload: &str) -> Value {
        match self.datatype {
            Datatype::Integer => {
                payload.trim().parse::<i64>().map_or_else(|_| json!(payload), |v| json!(v))
            }
            Datatype::Float => match payload.trim().parse::<f64>() {
                Ok(v) if v.is_finite() => json!(v),
                _ => json!(payload),
            },
            Datatype::Boolean => match payload {
                "true" => json!(true),
                "false" => json!(false),
                _ => json!(payload),
            },
            _ => json!(payload),
        }
    }

    /// True when a published value payload is the value a `/set` asked for (numbers compared
    /// as numbers, so `21.50` confirms `21.5`; colours by component).
    pub fn same_value(&self, published: &str, requested: &str) -> bool {
        match self.datatype {
            Datatype::Integer => {
                match (published.trim().parse::<i64>(), requested.parse::<i64>()) {
                    (Ok(a), Ok(b)) => a == b,
                    _ => false,
                }
            }
            Datatype::Float => match (published.trim().parse::<f64>(), requested.parse::<f64>()) {
                (Ok(a), Ok(b)) => (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0),
                _ => false,
            },
            Datatype::Color => match self.format {
                Format::Color(model) => {
                    matches!((check_color(model, published), check_color(model, requested)), (Ok(a), Ok(b)) if a == b)
                }
                _ => published == requested,
            },
            _ => published == requested,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(datatype: Datatype, format: Option<&str>) -> PropertySpec {
        PropertySpec {
            name: "p".into(),
            datatype,
            format: Format::parse(datatype, format).unwrap(),
            format_text: format.map(str::to_owned),
            settable: true,
            retained: true,
            unit: None,
        }
    }

    #[test]
    fn ids_keep_topic_wildcards_out() {
        for ok in ["thermostat-1", "a", "x9"] {
            check_id(ok).unwrap();
        }
        for bad in ["", "-a", "A", "a/b", "a+", "#", "$state", "a b", &"a".repeat(65)] {
            assert!(check_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_are_read_for_their_datatype() {
        assert_eq!(
            Format::parse(Datatype::Float, Some("16:30")).unwrap(),
            Format::FloatRange { min: Some(16.0), max: Some(30.0) }
        );
        assert_eq!(
            Format::parse(Datatype::Integer, Some(":10")).unwrap(),
            Format::IntRange { min: None, max: Some(10) }
        );
        assert!(Format::parse(Datatype::Integer, Some("5:1")).is_err());
        assert!(Format::parse(Datatype::Float, Some("a:b")).is_err());
        assert!(Format::parse(Datatype::Enum, None).is_err());
        assert!(Format::parse(Datatype::Color, Some("cmyk")).is_err());
        assert_eq!(
            Format::parse(Datatype::Enum, Some("off, heat,cool")).unwrap(),
            Format::Enum(vec!["off".into(), "heat".into(), "cool".into()])
        );
        assert_eq!(Format::parse(Datatype::String, Some("whatever")).unwrap(), Format::None);
    }

    #[test]
    fn rule_set_values_are_checked_against_datatype_and_format() {
        let t = spec(Datatype::Float, Some("16:30"));
        assert_eq!(t.payload_for(&json!(21.5)).unwrap(), "21.5");
        assert_eq!(t.payload_for(&json!(22)).unwrap(), "22.0");
        for bad in [json!(30.5), json!(15), json!("21"), json!(true), json!(null)] {
            assert!(t.payload_for(&bad).is_err(), "{bad}");
        }
        let i = spec(Datatype::Integer, Some("0:100"));
        assert_eq!(i.payload_for(&json!(100)).unwrap(), "100");
        assert!(i.payload_for(&json!(101)).is_err());
        assert!(i.payload_for(&json!(1.5)).is_err());
        let e = spec(Datatype::Enum, Some("off,heat,cool"));
        assert_eq!(e.payload_for(&json!("heat")).unwrap(), "heat");
        let err = e.payload_for(&json!("boost")).unwrap_err();
        assert!(err.0.contains("off, heat, cool"), "{err}");
        let b = spec(Datatype::Boolean, None);
        assert_eq!(b.payload_for(&json!(false)).unwrap(), "false");
        assert!(b.payload_for(&json!("false")).is_err());
        let c = spec(Datatype::Color, Some("rgb"));
        assert_eq!(c.payload_for(&json!("255, 0,10")).unwrap(), "255,0,10");
        assert!(c.payload_for(&json!("256,0,0")).is_err());
        assert!(c.payload_for(&json!("1,2")).is_err());
        let s = spec(Datatype::String, None);
        assert!(s.payload_for(&json!("x".repeat(MAX_SET_STRING_LEN + 1))).is_err());
        let d = spec(Datatype::Duration, None);
        d.payload_for(&json!("PT5M")).unwrap();
        assert!(d.payload_for(&json!("5 minutes")).is_err());
    }

    #[test]
    fn rule_read_only_property_is_not_settable() {
        let mut t = spec(Datatype::Float, None);
        t.settable = false;
        assert!(t.payload_for(&json!(20)).unwrap_err().0.contains("read-only"));
    }

    #[test]
    fn published_values_are_typed_and_compared_as_values() {
        let t = spec(Datatype::Float, None);
        assert_eq!(t.value_json("21.50"), json!(21.5));
        assert_eq!(t.value_json("warm"), json!("warm"));
        assert!(t.same_value("21.50", "21.5"));
        assert!(!t.same_value("21.4", "21.5"));
        let i = spec(Datatype::Integer, None);
        assert_eq!(i.value_json("7"), json!(7));
        let b = spec(Datatype::Boolean, None);
        assert_eq!(b.value_json("true"), json!(true));
        let c = spec(Datatype::Color, Some("rgb"));
        assert!(c.same_value("1, 2, 3", "1,2,3"));
    }

    #[test]
    fn states_read_and_say_whether_commands_are_taken() {
        assert!(DeviceState::parse("ready").is_operational());
        assert!(DeviceState::parse("alert").is_operational());
        for s in ["init", "lost", "disconnected", "sleeping", "weird"] {
            assert!(!DeviceState::parse(s).is_operational(), "{s}");
        }
        assert_eq!(DeviceState::parse("lost"), DeviceState::Lost);
    }
}
