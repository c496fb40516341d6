//! Violations, reports, and the table of rules.

use serde::{Deserialize, Serialize};

/// How bad a violation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// A hard validation failure, a forbidden item, a missing required field or a broken Must.
    Error,
    /// A broken recommendation (Should).
    Warning,
}

impl Severity {
    /// `error` or `warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warning => "warning",
        }
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rule: a stable id, its severity and where the texts state it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Rule {
    /// Stable id, e.g. `card.tool_id_format`.
    pub id: &'static str,
    /// Severity of every violation of the rule.
    pub severity: Severity,
    /// The section of the texts the rule comes from.
    pub section: &'static str,
    /// One line saying what the rule requires.
    pub summary: &'static str,
}

impl Rule {
    /// A violation of this rule at `path` (a JSON pointer).
    pub fn at(&self, path: impl Into<String>, message: impl Into<String>) -> Violation {
        Violation {
            rule: self.id.to_owned(),
            severity: self.severity,
            path: path.into(),
            message: message.into(),
            sender: None,
        }
    }
}

/// One broken rule in one place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// The rule id.
    pub rule: String,
    /// `error` or `warning`.
    pub severity: Severity,
    /// JSON pointer to the offending value (`""` for the whole document).
    pub path: String,
    /// What is wrong and what to do; never contains a secret.
    pub message: String,
    /// For a packet judged without a sender, when the rule depends on who sends the packet:
    /// the sender it holds for (`connector` or `xagent`). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
}

/// The name of a side as a violation's `sender` and the `--sender` option spell it.
pub fn side_name(side: xagent_protocol_types::Side) -> &'static str {
    match side {
        xagent_protocol_types::Side::Connector => "connector",
        xagent_protocol_types::Side::Xagent => "xagent",
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = if self.path.is_empty() { "/" } else { self.path.as_str() };
        write!(f, "{} [{}] {}: {}", self.severity, self.rule, path, self.message)
    }
}

/// The result of a validation: every violation found. This is the JSON shape of
/// `xagent-connector check --format json`: `{"valid": bool, "violations": [...]}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// True when no violation is an error.
    pub valid: bool,
    /// Every violation, in document order of discovery.
    pub violations: Vec<Violation>,
}

impl Report {
    /// A report over a list of violations.
    pub fn new(violations: Vec<Violation>) -> Self {
        let valid = !violations.iter().any(|v| v.severity == Severity::Error);
        Self { valid, violations }
    }

    /// The violations of severity `error`.
    pub fn errors(&self) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(|v| v.severity == Severity::Error)
    }

    /// The violations of severity `warning`.
    pub fn warnings(&self) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(|v| v.severity == Severity::Warning)
    }

    /// True when some violation has this rule id.
    pub fn has(&self, rule: &str) -> bool {
        self.violations.iter().any(|v| v.rule == rule)
    }

    /// Adds the violations of another report.
    pub fn merge(&mut self, other: Report) {
        self.violations.extend(other.violations);
        self.valid = !self.violations.iter().any(|v| v.severity == Severity::Error);
    }

    /// The report as compact JSON.
    pub fn to_json(&self) -> String {
        // A Report holds only strings, booleans and enums: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{\"valid\":false}"))
    }
}

/// Collects violations while a validator walks a document.
#[derive(Debug, Default)]
pub(crate) struct Sink {
    pub(crate) violations: Vec<Violation>,
}

impl Sink {
    pub(crate) fn push(
        &mut self,
        rule: &Rule,
        path: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.violations.push(rule.at(path, message));
    }

    pub(crate) fn finish(self) -> Report {
        Report::new(self.violations)
    }
}

/// Appends a key or index to a JSON pointer, escaping `~` and `/`.
pub(crate) fn child(path: &str, key: &str) -> String {
    let mut out = String::with_capacity(path.len() + key.len() + 1);
    out.push_str(path);
    out.push('/');
    for c in key.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            other => out.push(other),
        }
    }
    out
}

/// Appends an array index to a JSON pointer.
pub(crate) fn index(path: &str, i: usize) -> String {
    format!("{path}/{i}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_escaping() {
        assert_eq!(child("", "a/b~c"), "/a~1b~0c");
        assert_eq!(index("/tools", 3), "/tools/3");
    }

    #[test]
    fn report_json_shape() {
        let rule = Rule { id: "x.y", severity: Severity::Warning, section: "s", summary: "t" };
        let report = Report::new(vec![rule.at("/a", "m")]);
        assert!(report.valid);
        assert_eq!(
            serde_json::to_value(&report).unwrap(),
            serde_json::json!({"valid": true, "violations": [
                {"rule": "x.y", "severity": "warning", "path": "/a", "message": "m"}
            ]})
        );
    }
}
