//! `docs/AUTHORING.md` shows a unit test of a Tool (section "3. Testing"); the same code is the
//! doctest of `ToolContext::for_test` (`src/author/for_test.md`), which `cargo test --doc`
//! compiles and runs. This checks the guide shows exactly that code, so what a reader copies
//! is what runs.

use std::path::Path;

/// The first ```` ```rust ```` block after `after` in `text`, each line's `indent` removed.
fn rust_block(text: &str, after: &str, indent: &str) -> String {
    let (_, rest) = text.split_once(after).unwrap_or_else(|| panic!("no {after:?}"));
    let fence = format!("{indent}```rust\n");
    let (_, rest) =
        rest.split_once(&fence).unwrap_or_else(|| panic!("no rust block after {after:?}"));
    let (block, _) =
        rest.split_once(&format!("{indent}```\n")).unwrap_or_else(|| panic!("unclosed block"));
    block
        .lines()
        .map(|line| line.strip_prefix(indent).unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_guides_tool_test_is_the_doctest_that_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &Path| {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let guide = read(&root.join("../docs/AUTHORING.md"));
    let doctest = read(&root.join("src/author/for_test.md"));
    let shown = rust_block(&guide, "## 3. Testing", "  ");
    let run = rust_block(&doctest, "\n", "");
    assert!(shown.contains("ToolContext::for_test"), "{shown}");
    assert_eq!(shown, run, "docs/AUTHORING.md and src/author/for_test.md differ");
}
