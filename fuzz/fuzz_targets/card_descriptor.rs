//! The Card and Descriptor validators: any JSON document gets a report (every violation with a
//! rule id and a pointer), never a panic; a document that decodes as a typed Card feeds the
//! Descriptor-against-Card check; the text entry point (`check_text`) takes any bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use xagent_protocol_types::{ConnectionDescriptor, ConnectorCard};
use xagent_protocol_validate::{
    CardFacts, DescriptorContext, DocumentKind, check_text, validate_card, validate_descriptor,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = check_text(DocumentKind::Card, text, None);
        let _ = check_text(DocumentKind::Descriptor, text, None);
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let card_report = validate_card(&value);
    for violation in &card_report.violations {
        assert!(!violation.rule.is_empty());
    }
    let _ = validate_descriptor(&value, DescriptorContext::default());
    let facts = CardFacts::from_value(&value);
    let _ = validate_descriptor(&value, DescriptorContext::with_card(&facts));
    if let Ok(card) = serde_json::from_value::<ConnectorCard>(value.clone()) {
        let typed = CardFacts::from_card(&card);
        let _ = validate_descriptor(&value, DescriptorContext::with_card(&typed));
        let _ = serde_json::to_value(&card).expect("a decoded card serialises");
    }
    if let Ok(descriptor) = serde_json::from_value::<ConnectionDescriptor>(value) {
        let _ = serde_json::to_value(&descriptor).expect("a decoded descriptor serialises");
    }
});
