//! The C functions for Rust callers (the all-judges test of the workspace): each calls the C
//! function itself with pointers to borrowed slices and copies the report out.

use std::ffi::c_char;

use crate::{
    xagent_packet_is_valid, xagent_packet_validator_free, xagent_packet_validator_new,
    xagent_validate_card, xagent_validate_free, xagent_validate_packet_from, xagent_validate_skill,
};

/// The pointer and length of an optional slice; NULL and 0 for none.
fn parts(slice: Option<&[u8]>) -> (*const u8, usize) {
    slice.map_or((std::ptr::null(), 0), |s| (s.as_ptr(), s.len()))
}

/// Copies a report the library returned and releases it.
fn take_report(report: *mut c_char) -> String {
    // SAFETY: the library returns a NUL-terminated string, never NULL.
    let text = unsafe { std::ffi::CStr::from_ptr(report) }.to_string_lossy().into_owned();
    // SAFETY: `report` came from the library and is released once.
    unsafe { xagent_validate_free(report) };
    text
}

/// The report `xagent_validate_packet_from` returns for `json` (against `card` when given) sent
/// by `sender` (`XAGENT_SENDER_*`), for Rust callers: the C function itself, called with
/// pointers to the slices, its string copied and released. What the all-judges test of the
/// workspace compares with the other judges.
pub fn packet_report_from(json: &[u8], card: Option<&[u8]>, sender: i32) -> String {
    let (card_ptr, card_len) = parts(card);
    // SAFETY: the pointers and lengths describe the borrowed slices, valid for the call.
    let report = unsafe {
        xagent_validate_packet_from(json.as_ptr(), json.len(), card_ptr, card_len, sender)
    };
    take_report(report)
}

/// The report `xagent_validate_card` returns for `json`, for Rust callers: the C function
/// itself, called with a pointer to the slice, its string copied and released. What the
/// all-judges test compares with `xagent-connector check card` and xAgent's admission.
pub fn card_report(json: &[u8]) -> String {
    // SAFETY: the pointer and length describe the borrowed slice, valid for the call.
    let report = unsafe { xagent_validate_card(json.as_ptr(), json.len()) };
    take_report(report)
}

/// The report `xagent_validate_skill` returns for `skill` against `card`, for Rust callers: the
/// C function itself, called with pointers to the slices, its string copied and released. What
/// the all-judges test compares with `xagent-connector check skill` and xAgent's admission.
pub fn skill_report(skill: &[u8], card: &[u8]) -> String {
    // SAFETY: each pointer and length describe a borrowed slice, valid for the call.
    let report =
        unsafe { xagent_validate_skill(skill.as_ptr(), skill.len(), card.as_ptr(), card.len()) };
    take_report(report)
}

/// The verdict `xagent_packet_is_valid` gives `json` sent by `sender`, on a validator made by
/// `xagent_packet_validator_new` with `card` (or none), for Rust callers; `None` when the
/// library refused the Card.
pub fn packet_is_valid_from(json: &[u8], card: Option<&[u8]>, sender: i32) -> Option<bool> {
    let (card_ptr, card_len) = parts(card);
    // SAFETY: the pointer and length describe the borrowed Card slice, valid for the call.
    let validator = unsafe { xagent_packet_validator_new(card_ptr, card_len) };
    if card.is_some() && validator.is_null() {
        return None;
    }
    // SAFETY: `validator` is NULL or live; the pointer and length describe `json`.
    let verdict = unsafe { xagent_packet_is_valid(validator, json.as_ptr(), json.len(), sender) };
    // SAFETY: `validator` came from `xagent_packet_validator_new` (or is NULL) and is freed once.
    unsafe { xagent_packet_validator_free(validator) };
    Some(verdict == 1)
}
