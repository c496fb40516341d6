//! `Content-Disposition` with a file name (RFC 6266, with the RFC 8187 `filename*` form).

/// `attachment; filename="<ASCII fallback>"; filename*=UTF-8''<percent-encoded>`.
///
/// The quoted fallback replaces every character that is not printable ASCII, and `"`, `\`,
/// `%`, with `_`, so old clients get a safe name; the `filename*` form carries the exact UTF-8
/// name. The result is always a valid header value.
pub(crate) fn attachment(filename: &str) -> String {
    let fallback: String = filename
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && !matches!(c, '"' | '\\' | '%') || c == ' ' { c } else { '_' }
        })
        .collect();
    let mut encoded = String::with_capacity(filename.len() * 3);
    for byte in filename.bytes() {
        if byte.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    format!("attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_ascii_name() {
        assert_eq!(
            attachment("report.pdf"),
            "attachment; filename=\"report.pdf\"; filename*=UTF-8''report.pdf"
        );
    }

    #[test]
    fn quotes_backslashes_and_unicode_are_escaped() {
        let value = attachment("a \"b\"\\c 照片.jpg");
        assert_eq!(
            value,
            "attachment; filename=\"a _b__c __.jpg\"; filename*=UTF-8''a%20%22b%22%5Cc%20%E7%85%A7%E7%89%87.jpg"
        );
        assert!(axum::http::HeaderValue::from_str(&value).is_ok());
    }

    #[test]
    fn control_characters_never_reach_the_header() {
        let value = attachment("x\r\nSet-Cookie: a=b");
        assert!(!value.contains('\r') && !value.contains('\n'));
        assert!(axum::http::HeaderValue::from_str(&value).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn any_file_name_gives_a_valid_header_value(name in "\\PC{0,80}|[\\x00-\\x7f]{0,40}") {
            let value = attachment(&name);
            proptest::prop_assert!(axum::http::HeaderValue::from_str(&value).is_ok(), "{}", value);
        }
    }
}
