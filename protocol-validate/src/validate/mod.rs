//! The document validators. They work on `serde_json::Value`, so one bad field never hides
//! the others, and return every violation found.

mod card;
mod descriptor;
mod documents;
mod json;
mod packet;
mod text;
mod tools;
mod validator;

pub use documents::{skill_front_matter_name, validate_base_url};
pub use json::{is_valid_tool_id, skill_name_matches_card};
pub use text::{DocumentKind, check_text, check_text_from, parse_document};
pub use validator::{
    Validator, validate_card, validate_descriptor, validate_health, validate_packet, validate_skill,
};
