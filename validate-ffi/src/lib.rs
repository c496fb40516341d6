//! # xagent-validate-ffi
//!
//! The validators of `xagent-protocol-validate` behind a small, stable C ABI, so a backend or a
//! Connector written in C, Python (`ctypes`), Go (cgo), Node (N-API/ffi) or anything else that
//! can call C can embed exactly the checks `xagent-connector check` runs. Built as a `cdylib`
//! (`libxagent_validate_ffi.so` / `.dylib` / `xagent_validate_ffi.dll`) and a `staticlib`; the C
//! header is `include/xagent_validate.h` (generated with cbindgen, committed, and checked for
//! drift by `tests/header.rs`).
//!
//! Every validating function takes UTF-8 bytes as a pointer and a length and returns a newly
//! allocated, NUL-terminated UTF-8 string holding the JSON report of
//! `xagent-connector check --format json`:
//!
//! ```json
//! {"valid": false, "violations": [{"rule": "card.protocol_version", "severity": "error",
//!   "path": "/protocol_version", "message": "..."}]}
//! ```
//!
//! The caller releases it with [`xagent_validate_free`]. The functions never return NULL and
//! never unwind into the caller: bad input, including bytes that are not UTF-8 and NULL
//! pointers, yields a report with a violation, and an internal panic is caught and reported.
//! They keep no state, so any thread may call them at any time.
//!
//! ```
//! use std::ffi::CStr;
//! use xagent_validate_ffi::{xagent_validate_card, xagent_validate_free};
//!
//! let card = br#"{"schema": "xagent.connector/v1", "protocol_version": "2.0"}"#;
//! // SAFETY: the pointer and length describe `card`, which outlives the call.
//! let report = unsafe { xagent_validate_card(card.as_ptr(), card.len()) };
//! // SAFETY: `report` is a NUL-terminated string returned by the library.
//! let text = unsafe { CStr::from_ptr(report) }.to_str()?.to_owned();
//! // SAFETY: `report` came from the library and is freed exactly once.
//! unsafe { xagent_validate_free(report) };
//! let json: serde_json::Value = serde_json::from_str(&text)?;
//! assert_eq!(json["valid"], false);
//! assert!(json["violations"].as_array().map_or(0, Vec::len) > 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Decisions where the issue is silent
//!
//! - Input that is not UTF-8 is reported as `document.not_json` (JSON text is UTF-8), with the
//!   byte offset of the first bad sequence; a NULL document pointer with a non-zero length is
//!   reported the same way. A NULL pointer with length 0 is the empty document.
//! - A reference Card (for a Descriptor, a packet or a Skill) that is not UTF-8, not JSON or not
//!   an object is not silently ignored: the report carries one `document.not_json` /
//!   `document.not_object` violation at the path `/card` (the CLI exits with a usage error
//!   instead; a library has no usage errors). For Descriptors and packets a NULL Card pointer
//!   means "no Card"; a Skill always needs its Card.
//! - A caught panic is reported as the rule `ffi.internal_error` (severity `error`).
//! - Reports are NUL-terminated strings (the JSON never contains a NUL byte) rather than
//!   pointer + length pairs, so C and `ctypes` can read them without a struct.
//! - [`xagent_validate_version`] returns a static string; it must not be freed.
//! - The hot path ([`xagent_packet_is_valid`] on a [`XagentPacketValidator`]) answers only
//!   valid / not valid, so a backend pays for a report only for the packets it refuses; a
//!   validator holds the parsed Card so it is not parsed again per packet. Adding these
//!   functions left the existing ones unchanged, so the ABI version stays 1.
//! - [`xagent_validate_packet_from`] is `xagent_validate_packet` with a sender (the
//!   `XAGENT_SENDER_*` values of the hot path); added beside it, so the ABI version stays 1. A
//!   violation that holds for one sender only carries a `sender` member in the report.

// The crate exists to be called through a C ABI: raw pointers cross the boundary, so
// `unsafe` is unavoidable here (and only here). Each unsafe block is a single pointer
// operation with a SAFETY comment.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use xagent_protocol_types::Side;
use xagent_protocol_validate::{CardFacts, DocumentKind};

mod plumbing;
mod rust_api;

use plumbing::{
    Input, card_facts, guarded, optional_card, text_from, validate, validate_with_card,
};
pub use rust_api::{card_report, packet_is_valid_from, packet_report_from, skill_report};

/// Version of this C ABI. It changes only when a function's signature or meaning changes.
pub const XAGENT_VALIDATE_ABI_VERSION: u32 = 1;

/// Rule id of the violation reported when the library itself failed (a caught panic).
pub const FFI_INTERNAL_ERROR: &str = "ffi.internal_error";

/// Validates a Connector Card (`connector-card.json`).
///
/// `json` points to `json_len` bytes of UTF-8 JSON. Returns the JSON report as a NUL-terminated
/// string that the caller must release with `xagent_validate_free`. Never returns NULL.
///
/// # Safety
/// `json` must be NULL or point to `json_len` readable bytes that stay valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xagent_validate_card(json: *const u8, json_len: usize) -> *mut c_char {
    // SAFETY: the caller's contract on `json` is this function's contract.
    guarded(|| unsafe { validate(DocumentKind::Card, (json, json_len), None, None) })
}

/// Validates a Connection Descriptor, against a Card when `card` is not NULL.
///
/// Both documents are UTF-8 JSON given as pointer and length. Returns the JSON report (release
/// it with `xagent_validate_free`). Never returns NULL.
///
/// # Safety
/// `json` and `card` must each be NULL or point to their length in readable bytes that stay
/// valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xagent_validate_descriptor(
    json: *const u8,
    json_len: usize,
    card: *const u8,
    card_len: usize,
) -> *mut c_char {
    // SAFETY: the caller's contract on both pointers is this function's contract.
    unsafe {
        validate_with_card(DocumentKind::Descriptor, (json, json_len), (card, card_len), None)
    }
}

/// Validates one data-plane packet, against a Card when `card` is not NULL.
///
/// Both documents are UTF-8 JSON given as pointer and length. Returns the JSON report (release
/// it with `xagent_validate_free`). Never returns NULL.
///
/// # Safety
/// `json` and `card` must each be NULL or point to their length in readable bytes that stay
/// valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xagent_validate_packet(
    json: *const u8,
    json_len: usize,
    card: *const u8,
    card_len: usize,
) -> *mut c_char {
    // SAFETY: the caller's contract on both pointers is this function's contract.
    unsafe { validate_with_card(DocumentKind::Packet, (json, json_len), (card, card_len), None) }
}

/// Validates one data-plane packet sent by `sender`, against a Card when `card` is not NULL:
/// the rules that depend on the direction are applied for that sender (e.g. a Connector-sent
/// `chat.message` file needs `download_url`). `sender` is `XAGENT_SENDER_XAGENT`,
/// `XAGENT_SENDER_CONNECTOR` or `XAGENT_SENDER_UNKNOWN` (any other value counts as unknown),
/// which judges as `xagent_validate_packet` does: a type one side sends as sent by it, a type
/// both sides send for both, each violation that holds for one sender naming it in `sender`.
/// Returns the JSON report (release it with `xagent_validate_free`). Never returns NULL.
///
/// # Safety
/// `json` and `card` must each be NULL or point to their length in readable bytes that stay
/// valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xagent_validate_packet_from(
    json: *const u8,
    json_len: usize,
    card: *const u8,
    card_len: usize,
    sender: i32,
) -> *mut c_char {
    let sender = side_of(sender);
    // SAFETY: the caller's contract on both pointers is this function's contract.
    unsafe { validate_with_card(DocumentKind::Packet, (json, json_len), (card, card_len), sender) }
}

/// The side a C `sender` value names (`XAGENT_SENDER_*`); unknown values mean no sender.
fn side_of(sender: i32) -> Option<Side> {
    match sender {
        XAGENT_SENDER_XAGENT => Some(Side::Xagent),
        XAGENT_SENDER_CONNECTOR => Some(Side::Connector),
        _ => None,
    }
}

/// Validates a `SKILL.md` (UTF-8 Markdown) against the Card (UTF-8 JSON) whose Skill it is.
///
/// The Card is required: a NULL `card` is treated as an empty document and reported. Returns
/// the JSON report (release it with `xagent_validate_free`). Never returns NULL.
///
/// # Safety
/// `skill` and `card` must each be NULL or point to their length in readable bytes that stay
/// valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xagent_validate_skill(
    skill: *const u8,
    skill_len: usize,
    card: *const u8,
    card_len: usize,
) -> *mut c_char {
    // SAFETY: the caller's contract on both pointers is this function's contract.
    guarded(|| unsafe {
        validate(DocumentKind::Skill, (skill, skill_len), Some((card, card_len)), None)
    })
}

/// A packet validator kept across calls, bound to a Card or to none: the hot-path form of the
/// C ABI. Create it once with `xagent_packet_validator_new`, call `xagent_packet_is_valid` for
/// every inbound packet (from any thread: it is immutable), release it with
/// `xagent_packet_validator_free`. Opaque to C.
pub struct XagentPacketValidator {
    validator: xagent_protocol_validate::Validator,
    card: Option<CardFacts>,
}

/// `sender` value of `xagent_packet_is_valid` and `xagent_validate_packet_from`: the sender is
/// not known.
pub const XAGENT_SENDER_UNKNOWN: i32 = 0;
/// `sender` value of `xagent_packet_is_valid` and `xagent_validate_packet_from`: xAgent sent
/// the packet.
pub const XAGENT_SENDER_XAGENT: i32 = 1;
/// `sender` value of `xagent_packet_is_valid` and `xagent_validate_packet_from`: the Connector
/// sent the packet.
pub const XAGENT_SENDER_CONNECTOR: i32 = 2;

/// Creates a packet validator, checking packets against the Card in `card` (UTF-8 JSON), or
/// against no Card when `card` is NULL. Returns NULL when the Card is not UTF-8 JSON or not an
/// object (check it with `xagent_validate_card` to see why). Release the validator with
/// `xagent_packet_validator_free`.
///
/// # Safety
/// `card` must be NULL or point to `card_len` readable bytes that stay valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xagent_packet_validator_new(
    card: *const u8,
    card_len: usize,
) -> *mut XagentPacketValidator {
    let built = catch_unwind(AssertUnwindSafe(|| {
        let card = match optional_card(card, card_len) {
            None => None,
            Some((ptr, len)) => {
                // SAFETY: forwarded from the caller's contract on `card`.
                let text = unsafe { text_from(ptr, len, Input::Card) }.ok()?;
                Some(card_facts(text).ok()?)
            }
        };
        Some(XagentPacketValidator { validator: Default::default(), card })
    }));
    match built {
        Ok(Some(validator)) => Box::into_raw(Box::new(validator)),
        _ => std::ptr::null_mut(),
    }
}

/// Releases a validator made by `xagent_packet_validator_new`. NULL is ignored.
///
/// # Safety
/// `validator` must be NULL or a pointer returned by `xagent_packet_validator_new` that has not
/// been freed yet, and no other thread may be using it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xagent_packet_validator_free(validator: *mut XagentPacketValidator) {
    if validator.is_null() {
        return;
    }
    // SAFETY: the caller guarantees the pointer came from `Box::into_raw` in
    // `xagent_packet_validator_new` and is released once.
    drop(unsafe { Box::from_raw(validator) });
}

/// The hot-path verdict on one data-plane packet (UTF-8 JSON bytes) sent by `sender`: 1 when it
/// breaks no error rule, 0 when it does, when `json` is NULL, or when the library failed
/// internally. The verdict is the `valid` field of the report `xagent_validate_packet_from`
/// gives the same bytes, the same `sender` and the Card the validator was made with: the packet
/// is decoded once into typed form and checked there, and only a packet the typed form cannot
/// settle (a control packet, an explicit `null`) goes through the report form. `sender` is
/// `XAGENT_SENDER_UNKNOWN`, `XAGENT_SENDER_XAGENT` or `XAGENT_SENDER_CONNECTOR` (any other
/// value counts as unknown); with `XAGENT_SENDER_UNKNOWN` the verdict is also that of
/// `xagent_validate_packet` (a type one side sends judged as sent by it, a type both sides send
/// judged for both). A NULL `validator` means a validator with no Card. Ask
/// `xagent_validate_packet_from` with the same sender for the report when a packet is refused.
///
/// # Safety
/// `validator` must be NULL or a live pointer from `xagent_packet_validator_new`; `json` must
/// be NULL or point to `json_len` readable bytes that stay valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xagent_packet_is_valid(
    validator: *const XagentPacketValidator,
    json: *const u8,
    json_len: usize,
    sender: i32,
) -> i32 {
    let verdict = catch_unwind(AssertUnwindSafe(|| {
        // The decoder checks UTF-8 itself, so the bytes go in as they are.
        let bytes: &[u8] = if json.is_null() || json_len > isize::MAX as usize {
            return false;
        } else {
            // SAFETY: the caller guarantees `json` points to `json_len` readable bytes valid for
            // the call; it is non-NULL, `u8` has no alignment requirement, `len` fits `isize`.
            unsafe { std::slice::from_raw_parts(json, json_len) }
        };
        let sender = side_of(sender);
        let fallback;
        let validator = if validator.is_null() {
            fallback = XagentPacketValidator { validator: Default::default(), card: None };
            &fallback
        } else {
            // SAFETY: the caller guarantees a live validator from `xagent_packet_validator_new`.
            unsafe { &*validator }
        };
        let context =
            xagent_protocol_validate::PacketContext { card: validator.card.as_ref(), sender };
        validator.validator.packet_is_valid(bytes, context)
    }));
    i32::from(verdict.unwrap_or(false))
}

/// Releases a report returned by one of the `xagent_validate_*` functions. NULL is ignored.
///
/// # Safety
/// `report` must be NULL or a pointer returned by this library that has not been freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xagent_validate_free(report: *mut c_char) {
    if report.is_null() {
        return;
    }
    // SAFETY: the caller guarantees `report` came from `CString::into_raw` in this library
    // and is released once; dropping the rebuilt CString frees it with the same allocator.
    let owned = unsafe { CString::from_raw(report) };
    drop(owned);
}

/// The library, protocol and ABI versions as a static JSON string, e.g.
/// `{"library":"0.1.0","protocol":"3.0","abi":1}`. Do not free it.
#[unsafe(no_mangle)]
pub extern "C" fn xagent_validate_version() -> *const c_char {
    static VERSION: OnceLock<CString> = OnceLock::new();
    VERSION.get_or_init(|| CString::new(version_json()).unwrap_or_default()).as_ptr()
}

fn version_json() -> String {
    serde_json::json!({
        "library": env!("CARGO_PKG_VERSION"),
        "protocol": xagent_protocol_types::PROTOCOL_VERSION,
        "abi": XAGENT_VALIDATE_ABI_VERSION,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::ffi::CStr;

    fn call(f: impl FnOnce() -> *mut c_char) -> Value {
        let report = f();
        assert!(!report.is_null());
        // SAFETY: `report` is a NUL-terminated string from the library.
        let text = unsafe { CStr::from_ptr(report) }.to_str().expect("UTF-8").to_owned();
        // SAFETY: freed once.
        unsafe { xagent_validate_free(report) };
        serde_json::from_str(&text).expect("the report is JSON")
    }

    fn rules(report: &Value) -> Vec<String> {
        report["violations"]
            .as_array()
            .expect("violations")
            .iter()
            .map(|v| v["rule"].as_str().expect("rule").to_owned())
            .collect()
    }

    #[test]
    fn non_utf8_document_is_a_not_json_report() {
        let bytes = [b'{', 0xff, 0xfe, b'}'];
        // SAFETY: pointer and length describe `bytes`.
        let report = call(|| unsafe { xagent_validate_card(bytes.as_ptr(), bytes.len()) });
        assert_eq!(report["valid"], false);
        assert_eq!(rules(&report), vec!["document.not_json"]);
        assert!(report["violations"][0]["message"].as_str().expect("message").contains("offset 1"));
    }

    #[test]
    fn null_pointer_with_length_is_reported_not_dereferenced() {
        // SAFETY: a NULL pointer is part of the contract.
        let report = call(|| unsafe { xagent_validate_card(std::ptr::null(), 10) });
        assert_eq!(rules(&report), vec!["document.not_json"]);
    }

    #[test]
    fn bad_reference_card_is_reported_at_card_path() {
        let doc = br#"{"schema":"xagent.connection/v2"}"#;
        let card = b"[1, 2]";
        // SAFETY: pointers and lengths describe the arrays.
        let report = call(|| unsafe {
            xagent_validate_descriptor(doc.as_ptr(), doc.len(), card.as_ptr(), card.len())
        });
        assert_eq!(rules(&report), vec!["document.not_object"]);
        assert_eq!(report["violations"][0]["path"], "/card");
    }

    #[test]
    fn panics_become_internal_error_reports() {
        let report = guarded(|| panic!("boom"));
        // SAFETY: `report` is a NUL-terminated string from `guarded`.
        let text = unsafe { CStr::from_ptr(report) }.to_str().expect("UTF-8").to_owned();
        // SAFETY: freed once.
        unsafe { xagent_validate_free(report) };
        let value: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(rules(&value), vec![FFI_INTERNAL_ERROR]);
        assert_eq!(value["valid"], false);
    }

    #[test]
    fn version_names_library_protocol_and_abi() {
        // SAFETY: a static NUL-terminated string.
        let text = unsafe { CStr::from_ptr(xagent_validate_version()) }.to_str().expect("UTF-8");
        let value: Value = serde_json::from_str(text).expect("JSON");
        assert_eq!(value["protocol"], xagent_protocol_types::PROTOCOL_VERSION);
        assert_eq!(value["library"], env!("CARGO_PKG_VERSION"));
        assert_eq!(value["abi"], XAGENT_VALIDATE_ABI_VERSION);
    }

    /// Issue 22: the C ABI judged packets with no sender, so a Connector-sent `chat.message`
    /// file without `download_url` was reported valid. `xagent_validate_packet` now judges a
    /// two-way type for both senders (the violation names the Connector), and
    /// `xagent_validate_packet_from` applies the rules for the sender given.
    #[test]
    fn rule_chat_message_download_url_through_the_c_abi() {
        let packet = br#"{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"chat.message","connector_channel_id":"c","time":1,"payload":{"message_id":"m","files":[{"type":"image","file_ref":"f"}]}}"#;
        let (ptr, len) = (packet.as_ptr(), packet.len());
        // SAFETY: pointer and length describe `packet`; a NULL Card means none.
        let none = call(|| unsafe { xagent_validate_packet(ptr, len, std::ptr::null(), 0) });
        assert_eq!(none["valid"], false);
        assert_eq!(rules(&none), vec!["chat_message.download_url"]);
        assert_eq!(none["violations"][0]["sender"], "connector");
        for (sender, valid) in [
            (XAGENT_SENDER_CONNECTOR, false),
            (XAGENT_SENDER_XAGENT, true),
            (XAGENT_SENDER_UNKNOWN, false),
            (7, false),
        ] {
            // SAFETY: as above.
            let report = call(|| unsafe {
                xagent_validate_packet_from(ptr, len, std::ptr::null(), 0, sender)
            });
            assert_eq!(report["valid"], valid, "sender {sender}: {report}");
            // SAFETY: a NULL validator means no Card; pointer and length describe `packet`.
            let verdict = unsafe { xagent_packet_is_valid(std::ptr::null(), ptr, len, sender) };
            assert_eq!(verdict == 1, valid, "hot path, sender {sender}");
        }
    }

    #[test]
    fn free_ignores_null() {
        // SAFETY: NULL is allowed.
        unsafe { xagent_validate_free(std::ptr::null_mut()) };
    }
}
