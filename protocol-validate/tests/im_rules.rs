//! The IM file-item rules have one home (`xagent_protocol_validate::im`); the generated schemas
//! state the `download_url` rule as a pattern. These tests keep the two forms in agreement.

use proptest::prelude::*;
use serde_json::json;
use xagent_protocol_types::DOWNLOAD_URL_PATTERN;
use xagent_protocol_validate::im::download_url_allowed;

fn schema() -> jsonschema::Validator {
    jsonschema::validator_for(&json!({"type": "string", "pattern": DOWNLOAD_URL_PATTERN}))
        .expect("the download_url pattern compiles")
}

const SAMPLES: &[&str] = &[
    "/files/refs/file_1?exp=2&sig=ab",
    "files/refs/file_1",
    "https://cdn.example/x.png",
    "HTTP://h/x",
    "http:",
    "?x=1",
    "a/b:c",
    ":x",
    "1abc:x",
    "abc",
    "",
    "file:///etc/passwd",
    "FILE:///etc/passwd",
    "data:image/png;base64,AAAA",
    "ftp://h/x",
    "httpx://h/x",
    "mailto:a@b",
    "C:\\x.png",
    "c:/x.png",
    "\\\\server\\share",
    "\\x",
    " file:///x",
    "/a b",
    "/a\u{7f}",
    "/a\u{85}",
    "/a\u{a0}",
    "/a\u{feff}",
    "/a\u{3000}",
    "/é/ü",
];

#[test]
fn rule_im_download_url_scheme_pattern_agrees_with_the_predicate() {
    let schema = schema();
    for url in SAMPLES {
        assert_eq!(
            schema.is_valid(&json!(url)),
            download_url_allowed(url),
            "schema and predicate disagree on {url:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn pattern_and_predicate_agree_on_generated_urls(
        url in "(|[hH][tT][tT][pP][sS]?|file|data|[a-zA-Z][a-zA-Z0-9+.-]{0,3})(:|://|/|\\\\)?[a-zA-Z0-9/:._ \\\\?\u{a0}\u{7f}\u{feff}-]{0,8}"
    ) {
        let schema = schema();
        prop_assert_eq!(schema.is_valid(&json!(url)), download_url_allowed(&url), "{:?}", url);
    }
}
