//! The [`Validator`]: the secret scanner and admission window every check applies, and the
//! free functions that check with the default one.

use serde_json::Value;

use crate::facts::*;
use crate::report::{Report, Rule, Sink};
use crate::secrets::SecretScanner;
use crate::version::AdmissionWindow;

/// Validates documents. Holds the secret scanner and the admission window it applies.
#[derive(Clone, Debug)]
pub struct Validator {
    pub(crate) scanner: SecretScanner,
    pub(super) window: AdmissionWindow,
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

    pub(super) fn scan(&self, sink: &mut Sink, rule: &Rule, value: &Value, base: &str, what: &str) {
        for leak in self.scanner.scan_value(value) {
            sink.push(
                rule,
                format!("{base}{}", leak.location),
                format!("{what} contains {}; remove it", leak.kind),
            );
        }
    }
}
