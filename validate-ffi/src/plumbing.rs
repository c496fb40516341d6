//! What every C function shares: reading a pointer and a length as UTF-8, the reference Card,
//! one validation that never panics, and the report as an owned C string.

use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use serde_json::Value;
use xagent_protocol_types::Side;
use xagent_protocol_validate::rules::{DOCUMENT_NOT_JSON, DOCUMENT_NOT_OBJECT};
use xagent_protocol_validate::{
    CardFacts, DocumentKind, Report, Severity, Violation, check_text_from,
};

use crate::FFI_INTERNAL_ERROR;

/// Where the document comes from, for messages.
#[derive(Clone, Copy)]
pub(crate) enum Input {
    Document,
    Card,
}

impl Input {
    fn path(self) -> &'static str {
        match self {
            Self::Document => "",
            Self::Card => "/card",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Self::Document => "the document",
            Self::Card => "the reference Card",
        }
    }
}

/// Reads `len` bytes at `ptr` as UTF-8 text, or returns the report that says why it cannot.
///
/// # Safety
/// `ptr` must be NULL or point to `len` readable bytes that stay valid for the call.
pub(crate) unsafe fn text_from<'a>(
    ptr: *const u8,
    len: usize,
    input: Input,
) -> Result<&'a str, Report> {
    let bytes: &[u8] = if ptr.is_null() {
        if len != 0 {
            return Err(not_json(
                input,
                format!("{} is a NULL pointer with length {len}", input.what()),
            ));
        }
        &[]
    } else {
        if len > isize::MAX as usize {
            return Err(not_json(
                input,
                format!("{} has an impossible length {len}", input.what()),
            ));
        }
        // SAFETY: the caller guarantees `ptr` points to `len` readable bytes valid for the call;
        // it is non-NULL, `u8` has no alignment requirement, and `len` fits in `isize`.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    };
    std::str::from_utf8(bytes).map_err(|error| {
        not_json(
            input,
            format!(
                "{} is not UTF-8 (invalid bytes at offset {}); JSON text must be UTF-8",
                input.what(),
                error.valid_up_to()
            ),
        )
    })
}

fn not_json(input: Input, message: String) -> Report {
    Report::new(vec![DOCUMENT_NOT_JSON.at(input.path(), message)])
}

/// The facts of a reference Card, or the report that says why it cannot be used.
pub(crate) fn card_facts(text: &str) -> Result<CardFacts, Report> {
    let value: Value = serde_json::from_str(text).map_err(|error| {
        not_json(
            Input::Card,
            format!(
                "the reference Card is not JSON (line {}, column {}); validate it with \
                 xagent_validate_card first",
                error.line(),
                error.column()
            ),
        )
    })?;
    if !value.is_object() {
        return Err(Report::new(vec![DOCUMENT_NOT_OBJECT.at(
            Input::Card.path(),
            "the reference Card is not a JSON object; validate it with xagent_validate_card first",
        )]));
    }
    Ok(CardFacts::from_value(&value))
}

/// Validates one document of `kind`, with an optional reference Card, never panicking.
///
/// # Safety
/// Each pointer must be NULL or point to its length in readable bytes valid for the call.
pub(crate) unsafe fn validate(
    kind: DocumentKind,
    document: (*const u8, usize),
    card: Option<(*const u8, usize)>,
    sender: Option<Side>,
) -> Report {
    // SAFETY: forwarded from the caller's contract on `document`.
    let text = match unsafe { text_from(document.0, document.1, Input::Document) } {
        Ok(text) => text,
        Err(report) => return report,
    };
    let facts = match card {
        None => None,
        Some((ptr, len)) => {
            // SAFETY: forwarded from the caller's contract on `card`.
            let card_text = match unsafe { text_from(ptr, len, Input::Card) } {
                Ok(text) => text,
                Err(report) => return report,
            };
            match card_facts(card_text) {
                Ok(facts) => Some(facts),
                Err(report) => return report,
            }
        }
    };
    check_text_from(kind, text, facts.as_ref(), sender)
}

fn internal_error() -> Report {
    Report::new(vec![Violation {
        rule: FFI_INTERNAL_ERROR.to_owned(),
        severity: Severity::Error,
        path: String::new(),
        message: "the validator failed internally; please report this input to the toolkit's \
                  maintainers"
            .to_owned(),
        sender: None,
    }])
}

/// Runs `work` with panics caught and turns its report into an owned C string.
pub(crate) fn guarded(work: impl FnOnce() -> Report) -> *mut c_char {
    let report = catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|_| internal_error());
    into_c_string(&report.to_json())
}

fn into_c_string(json: &str) -> *mut c_char {
    // serde_json escapes U+0000, so a report never holds a NUL byte; the fallback is for safety.
    let text = CString::new(json).unwrap_or_else(|_| {
        CString::from(c"{\"valid\":false,\"violations\":[{\"rule\":\"ffi.internal_error\",\"severity\":\"error\",\"path\":\"\",\"message\":\"the report could not be encoded\"}]}")
    });
    text.into_raw()
}

/// Treats a NULL Card pointer as "no Card".
pub(crate) fn optional_card(ptr: *const u8, len: usize) -> Option<(*const u8, usize)> {
    if ptr.is_null() { None } else { Some((ptr, len)) }
}

/// The body of every validating function that takes a document and an optional Card: a NULL
/// `card` means none, panics are caught, the report is an owned C string.
///
/// # Safety
/// `json` and `card` must each be NULL or point to their length in readable bytes that stay
/// valid for the call.
pub(crate) unsafe fn validate_with_card(
    kind: DocumentKind,
    (json, json_len): (*const u8, usize),
    (card, card_len): (*const u8, usize),
    sender: Option<Side>,
) -> *mut c_char {
    let card = optional_card(card, card_len);
    // SAFETY: forwarded from the caller's contract on both pointers.
    guarded(|| unsafe { validate(kind, (json, json_len), card, sender) })
}
